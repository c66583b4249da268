"""Kafka security for every client: refused credentials as one clear error, and the Java
client's settings for Spark's connector, both derived from the librdkafka settings that
``LoadBalancerConfig.kafka_client_settings()`` builds from the knobs.

Why an error callback: librdkafka treats a refused login (wrong SCRAM password, an unknown
user, a certificate the broker does not trust) as a passing connection problem; it logs it and
retries forever, so a producer's flush or a metadata request just times out with "transport
failure" and a consumer waits silently. ``raise_on_auth_error`` is installed as ``error_cb`` by
``infra.topics.kafka_client_config``, the builder every confluent-kafka client goes through, so
the first refusal surfaces as ``KafkaAuthError`` from the next ``poll``/``flush``/``consume``,
and ``list_topics`` polls for it in short slices. ``KafkaAuthError`` is deliberately not a
``LoadBalancerError``: loops retry those, and retrying a refused password cannot help.
librdkafka's own messages name the mechanism and never the password.

Why a translation for the connector: Spark's ``kafka`` source runs the Java client, which
spells the same settings differently (a JAAS line instead of user and password, PEM trust and
key stores instead of file locations). Built here from the same map, the job's connector and
its confluent-kafka sinks cannot disagree.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError

__all__ = [
    "KafkaAuthError",
    "flush",
    "java_client_settings",
    "list_topics",
    "raise_on_auth_error",
]

_REFUSALS = {KafkaError._AUTHENTICATION, KafkaError._SSL}
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


class KafkaAuthError(RuntimeError):
    """Kafka refused this client's credentials or its TLS handshake: permanent for the
    process (fix the configuration), so it ends the command with one line."""


def raise_on_auth_error(err: KafkaError) -> None:
    """librdkafka ``error_cb``: raise ``KafkaAuthError`` on a refused login or handshake;
    other errors (a broker restarting) stay librdkafka's to retry."""
    if err.code() in _REFUSALS:
        raise KafkaAuthError(f"Kafka refused the connection: {err.str()}")


def list_topics(client: Any, topic: str | None = None, timeout_s: float = 10.0) -> Any:
    """``client.list_topics`` within ``timeout_s``, serving the error callback between short
    attempts so that a refused login raises ``KafkaAuthError`` at once instead of the whole
    timeout later as a transport failure."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            return client.list_topics(topic, timeout=max(0.1, min(1.0, left)))
        except Exception:
            client.poll(0)  # runs error_cb, which raises on a refusal
            if time.monotonic() >= deadline:
                raise


def flush(producer: Any, timeout_s: float) -> int:
    """``producer.flush`` within ``timeout_s`` in short slices, so that the error callback's
    ``KafkaAuthError`` ends it within one slice rather than at the end of the timeout.
    Returns the number of messages still queued."""
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = int(producer.flush(max(0.0, min(0.5, deadline - time.monotonic()))))
        if remaining == 0 or time.monotonic() >= deadline:
            return remaining


def _jaas_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def java_client_settings(settings: Mapping[str, Any]) -> dict[str, str]:
    """The Java Kafka client's settings for librdkafka ``settings`` (no ``kafka.`` prefix).

    ``sasl.username``/``sasl.password`` become ``sasl.jaas.config`` with the login module of
    ``sasl.mechanism``; ``ssl.ca.location`` a PEM trust store; a client certificate and key a
    PEM key store (read from the files: the Java client wants them in one store). Other keys
    pass unchanged. The result holds the password: hand it to a client, never to a log.
    """
    out: dict[str, str] = {}
    rest = {k: str(v) for k, v in settings.items() if not callable(v)}
    user, password = rest.pop("sasl.username", None), rest.pop("sasl.password", None)
    if user is not None or password is not None:
        mechanism = rest.get("sasl.mechanism", "PLAIN").upper()
        module = _LOGIN_MODULES.get(mechanism)
        if module is None:
            raise ValueError(f"no Java login module known for sasl.mechanism {mechanism}")
        out["sasl.jaas.config"] = (
            f"{module} required username={_jaas_quote(user or '')} "
            f"password={_jaas_quote(password or '')};"
        )
    ca = rest.pop("ssl.ca.location", None)
    if ca:
        out["ssl.truststore.type"] = "PEM"
        out["ssl.truststore.location"] = ca
    cert, key = rest.pop("ssl.certificate.location", None), rest.pop("ssl.key.location", None)
    if cert and key:
        out["ssl.keystore.type"] = "PEM"
        out["ssl.keystore.certificate.chain"] = Path(cert).read_text(encoding="ascii")
        out["ssl.keystore.key"] = Path(key).read_text(encoding="ascii")
    out.update(rest)
    return out
