"""Topic creation is idempotent and end offsets are right, with and without ListOffsets(latest)."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from infra.offsets import earliest_offsets, latest_offsets, partitions_for
from infra.topics import ensure_topics

pytestmark = pytest.mark.integration


def _produce(bootstrap: str, topic: str, counts: dict[int, int]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition, n in counts.items():
        for i in range(n):
            producer.produce(
                topic, key=b"k", value=f"{partition}-{i}".encode(), partition=partition
            )
    assert producer.flush(10) == 0


def test_ensure_topics_creates_once_and_accepts_existing_topics(kafka_bootstrap: str) -> None:
    name = "ensure-topics-idempotent"
    assert ensure_topics(kafka_bootstrap, {name: 3}) == [name]
    assert ensure_topics(kafka_bootstrap, {name: 3}) == []
    assert ensure_topics(kafka_bootstrap, {name: 5, f"{name}-b": 1}) == [f"{name}-b"]
    assert ensure_topics(kafka_bootstrap, {}) == []
    metadata = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10)
    assert len(metadata.topics[name].partitions) == 3  # an existing topic is left as it is
    assert partitions_for(kafka_bootstrap, name) == [0, 1, 2]


def test_latest_offsets_counts_records_per_partition(kafka_bootstrap: str, unique_topic) -> None:
    topic = unique_topic(3)
    assert latest_offsets(kafka_bootstrap, topic) == {0: 0, 1: 0, 2: 0}
    _produce(kafka_bootstrap, topic, {0: 5, 1: 7, 2: 3})
    assert latest_offsets(kafka_bootstrap, topic) == {0: 5, 1: 7, 2: 3}
    assert earliest_offsets(kafka_bootstrap, topic) == {0: 0, 1: 0, 2: 0}
    _produce(kafka_bootstrap, topic, {2: 4})
    assert latest_offsets(kafka_bootstrap, topic) == {0: 5, 1: 7, 2: 7}


def test_latest_offsets_agree_with_list_offsets_latest_on_kafka(
    kafka_bootstrap: str, unique_topic
) -> None:
    """``latest_offsets`` (high watermarks from Fetch) and ListOffsets(latest) give the same
    ends on Apache Kafka, so either source's offsets can be compared with the monitor's lag."""
    topic = unique_topic(2)
    _produce(kafka_bootstrap, topic, {0: 5})
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "offsets-probe"})
    try:
        listed = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        consumer.close()
    assert listed == (0, 5)
    assert latest_offsets(kafka_bootstrap, topic)[0] == 5


def test_the_reports_topic_is_created_to_carry_reports_over_the_product_limit(
    kafka_bootstrap: str,
) -> None:
    """Kafka refuses records over 1 MB by default, at the producer: a large broker's report
    would never reach the job. The product creates its reports topic with twice
    ``maxReportBytes``, so an oversized report arrives and is dead-lettered with its reason."""
    from confluent_kafka.admin import AdminClient, ConfigResource

    from infra.config_loading import ensure_pipeline_topics
    from loadbalance.config import LoadBalancerConfig

    suffix = uuid.uuid4().hex[:8]
    config = LoadBalancerConfig(
        loadReportsTopic=f"reports-{suffix}",
        decisionsTopic=f"decisions-{suffix}",
        deadLettersTopic=f"dead-{suffix}",
        ownershipEventsTopic=f"events-{suffix}",
        maxReportBytes=3_000_000,
    )
    ensure_pipeline_topics(kafka_bootstrap, config)
    resource = ConfigResource(ConfigResource.Type.TOPIC, config.load_reports_topic)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    described = admin.describe_configs([resource])[resource].result(timeout=10)
    assert described["max.message.bytes"].value == "6000000"
