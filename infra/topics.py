"""Create Kafka topics through the admin API, idempotently.

Why: topics are created through CreateTopics with the partitions the product wants rather than
by a broker's auto-creation, and the job, the producers and the tests all want "make sure these
exist" rather than "create", so a topic that already exists is success, not an error;
``client_config`` carries SASL/SSL settings to the admin client.

``kafka_client_config`` is the one builder of confluent-kafka client settings: besides the
address and the caller's settings it gives every client the product's logger (librdkafka's
lines through logging, de-duplicated: ``infra.client_logging``) and its error callback.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from infra.client_logging import KafkaErrorReporter, client_logger
from infra.kafka_auth import list_topics

__all__ = ["ensure_topics", "kafka_client_config"]


def kafka_client_config(bootstrap_servers: str, client_config: Mapping[str, Any] | None) -> dict:
    """librdkafka config: ``bootstrap.servers`` plus the caller's pass-through settings.

    A ``kafka.`` prefix (Spark's option style) is stripped, so the same map can feed Spark's
    built-in source and confluent-kafka. Unless the caller set them, ``logger`` (librdkafka's
    lines through the product's de-duplicating logger, never raw on the terminal) and
    ``error_cb`` (a refused login raises ``KafkaAuthError``; all brokers down is one product
    warning naming ``bootstrap_servers``) are added.
    """
    config: dict[str, Any] = {}
    for key, value in (client_config or {}).items():
        name = key[len("kafka.") :] if key.startswith("kafka.") else key
        config[name] = value
    config["bootstrap.servers"] = bootstrap_servers
    config.setdefault("error_cb", KafkaErrorReporter(bootstrap_servers))
    config.setdefault("logger", client_logger())
    return config


def ensure_topics(
    bootstrap_servers: str,
    topics: Mapping[str, int],
    client_config: Mapping[str, Any] | None = None,
    replication_factor: int = -1,
    timeout_s: float = 30.0,
    topic_configs: Mapping[str, Mapping[str, str]] | None = None,
) -> list[str]:
    """Create each ``topic -> partitions`` that does not exist yet; return the names created.

    Existing topics are left as they are (their partition count and settings are not
    changed). ``topic_configs``: topic -> settings a new topic is created with (e.g.
    ``max.message.bytes``).
    ``replication_factor`` -1 takes the brokers' ``default.replication.factor``, so topics the
    product creates on a real cluster are replicated as the operator configured it (a fixed 1
    would leave them on one broker).
    """

    if not topics:
        return []
    admin = AdminClient(kafka_client_config(bootstrap_servers, client_config))
    existing = set(list_topics(admin, timeout_s=timeout_s).topics)
    wanted = [
        NewTopic(
            name,
            num_partitions=int(partitions),
            replication_factor=replication_factor,
            config=dict((topic_configs or {}).get(name, {})),
        )
        for name, partitions in topics.items()
        if name not in existing
    ]
    if not wanted:
        return []
    created: list[str] = []
    futures = admin.create_topics(wanted, operation_timeout=timeout_s, request_timeout=timeout_s)
    for name, future in futures.items():
        try:
            future.result(timeout=timeout_s)
            created.append(name)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if getattr(error, "code", lambda: None)() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue  # created concurrently by someone else: that is what we wanted
            raise
    return created
