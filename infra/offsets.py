"""Per-partition first and next offsets of a topic, and a consumer group's committed offsets.

Every reader here uses ``assign()`` only (a group-less probe consumer): nothing joins a group or
commits, so asking leaves no trace on the broker. End offsets are ListOffsets(latest), the high
watermark (the last stable offset under librdkafka's default ``isolation.level=read_committed``,
which is what a reader can actually see).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from infra.kafka_auth import list_topics
from infra.topics import kafka_client_config

__all__ = [
    "GroupOffsets",
    "earliest_offsets",
    "latest_offsets",
    "partitions_for",
    "probe_consumer_config",
]

_PROBE_OVERRIDES: dict[str, Any] = {
    "enable.auto.commit": False,
    "enable.partition.eof": True,
    "fetch.wait.max.ms": 10,
    "max.partition.fetch.bytes": 4096,  # we only want the watermark, not the data
    "auto.offset.reset": "earliest",
}


def probe_consumer_config(
    bootstrap_servers: str, client_config: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Config of a consumer used only with ``assign()``: no group join, no commits.

    librdkafka insists on a ``group.id`` even for assign-only consumers; a random one is never
    joined or committed to, so it leaves no trace on the broker.
    """
    config = kafka_client_config(bootstrap_servers, client_config)
    config.setdefault("group.id", f"lb-probe-{uuid.uuid4().hex[:12]}")
    config.update(_PROBE_OVERRIDES)
    return config


def partitions_for(
    bootstrap_servers: str,
    topic: str,
    client_config: Mapping[str, Any] | None = None,
    timeout_s: float = 10.0,
) -> list[int]:
    """Partition ids of ``topic`` from a metadata request (raises if the topic is unknown)."""

    admin = AdminClient(kafka_client_config(bootstrap_servers, client_config))
    metadata = list_topics(admin, topic, timeout_s).topics.get(topic)  # a refusal raises
    if metadata is None or metadata.error is not None:
        raise KafkaException(metadata.error if metadata else f"unknown topic {topic}")
    return sorted(metadata.partitions)


def _watermarks(
    bootstrap_servers: str,
    topic: str,
    client_config: Mapping[str, Any] | None,
    timeout_s: float,
    which: int,
) -> dict[int, int]:
    """partition -> its low (``which=0``) or high (``which=1``) watermark, from ListOffsets."""
    partitions = partitions_for(bootstrap_servers, topic, client_config, timeout_s)
    consumer = Consumer(probe_consumer_config(bootstrap_servers, client_config))
    try:
        return {
            p: int(
                consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)[which]
            )
            for p in partitions
        }
    finally:
        consumer.close()


def earliest_offsets(
    bootstrap_servers: str,
    topic: str,
    client_config: Mapping[str, Any] | None = None,
    timeout_s: float = 10.0,
) -> dict[int, int]:
    """partition -> first offset still in the log (ListOffsets(earliest))."""
    return _watermarks(bootstrap_servers, topic, client_config, timeout_s, 0)


def latest_offsets(
    bootstrap_servers: str,
    topic: str,
    client_config: Mapping[str, Any] | None = None,
    *,
    timeout_s: float = 15.0,
) -> dict[int, int]:
    """partition -> next offset to be written (ListOffsets(latest), the high watermark)."""
    return _watermarks(bootstrap_servers, topic, client_config, timeout_s, 1)


class GroupOffsets:
    """A consumer group's committed offsets on one topic, read repeatedly through one client.

    Why a class: asking every few milliseconds (the live scoreboard waits for the controller to
    commit what the job published) would otherwise open a connection per question. The client
    never subscribes, so it never joins the group or disturbs its members; OffsetFetch is
    answered by any broker in the cluster.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        group_id: str,
        topic: str,
        client_config: Mapping[str, Any] | None = None,
    ) -> None:
        config = kafka_client_config(bootstrap_servers, client_config)
        config.update({"group.id": group_id, "enable.auto.commit": False})
        self.topic = topic
        self._consumer = Consumer(config)

    def committed(self, partitions: list[int], timeout_s: float = 10.0) -> dict[int, int]:
        """partition -> committed offset (the next record the group reads); partitions the group
        never committed are absent."""
        tps = self._consumer.committed(
            [TopicPartition(self.topic, p) for p in partitions], timeout=timeout_s
        )
        return {tp.partition: int(tp.offset) for tp in tps if tp.offset >= 0}

    def close(self) -> None:
        self._consumer.close()
