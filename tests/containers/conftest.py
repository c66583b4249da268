"""The container tier: the pipeline's pieces against Apache Kafka (KRaft) and Redis in Docker.

The default suite runs against embedded services (a Kafka-protocol broker and redis-server on
loopback ports); this tier runs selected tests of the other tiers against the real servers a
deployment uses, started by testcontainers. It overrides the two fixtures everything else is
built on, ``kafka_bootstrap`` and ``redis_url`` (``unique_topic`` and ``fresh_redis`` follow
them), so the tests are the same code and only the servers differ.

Without a Docker engine (these development machines have none) every test here is skipped for
one stated reason; the rest of the suite does not need Docker.

Run it with ``bash scripts/test.sh tests/containers``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.containers.engine import docker_engine_problem

# Apache Kafka 3.9 in KRaft mode: testcontainers' KafkaContainer drives Confluent's community
# image of Apache Kafka (cp-kafka 7.9 ships Kafka 3.9, the version docker-compose.yml runs).
KAFKA_IMAGE = "confluentinc/cp-kafka:7.9.0"
REDIS_IMAGE = "redis:7.4.1"  # as in docker-compose.yml
START_TIMEOUT_S = 180  # the first run pulls the images


@pytest.fixture(scope="session", autouse=True)
def docker_engine() -> None:
    """Every test module here also skips itself at import (``require_docker``), so the report
    names the module once; this guards a module that forgets."""
    problem = docker_engine_problem()
    if problem is not None:
        pytest.skip(f"container tier needs Docker: {problem}")


@pytest.fixture(scope="session")
def kafka_bootstrap(docker_engine: None) -> Iterator[str]:
    """Bootstrap servers of one Apache Kafka (KRaft) container shared by the session."""
    try:
        from testcontainers.community.kafka import KafkaContainer
    except ImportError:  # testcontainers < 4.14 kept its modules at the top level
        from testcontainers.kafka import KafkaContainer

    kafka = (
        KafkaContainer(KAFKA_IMAGE)
        .with_kraft()
        # Tests publish reports stamped in 2023: keep them (no time-based retention) and accept
        # the simulator's future stamps, as docker-compose.yml does.
        .with_env("KAFKA_LOG_RETENTION_MS", "-1")
        .with_env("KAFKA_LOG_MESSAGE_TIMESTAMP_AFTER_MAX_MS", "9223372036854775807")
        .with_env("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "false")  # the product creates its topics
    )
    kafka.start(timeout=START_TIMEOUT_S)
    try:
        yield kafka.get_bootstrap_server()
    finally:
        kafka.stop()


@pytest.fixture(scope="session")
def redis_url(docker_engine: None) -> Iterator[str]:
    """URL of one Redis container shared by the session (tests flush it via ``fresh_redis``)."""
    try:
        from testcontainers.community.redis import RedisContainer
    except ImportError:
        from testcontainers.redis import RedisContainer

    with RedisContainer(REDIS_IMAGE) as container:
        host = container.get_container_host_ip()
        yield f"redis://{host}:{container.get_exposed_port(6379)}/0"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/containers/" in item.nodeid:
            item.add_marker(pytest.mark.containers)
