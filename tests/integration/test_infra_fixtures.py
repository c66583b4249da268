"""The shared fixtures give working services (a smoke test other tests rely on)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def test_fresh_redis_starts_empty_and_answers(fresh_redis) -> None:
    assert fresh_redis.dbsize() == 0
    fresh_redis.set("k", "v")
    assert fresh_redis.get("k") == b"v"


def test_unique_topic_creates_a_topic_with_the_asked_partitions(
    kafka_bootstrap, unique_topic
) -> None:
    from confluent_kafka.admin import AdminClient

    topic = unique_topic(3)
    metadata = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(topic, timeout=10)
    assert len(metadata.topics[topic].partitions) == 3
    assert unique_topic() != topic
