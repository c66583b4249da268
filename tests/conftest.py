"""Shared pytest fixtures: one embedded Kafka, one Redis and one Spark session per test session.

Why shared: starting the servers is cheap (well under a second each) but the Spark JVM is not
(several seconds), and the suite must stay fast on a 2-core machine. Every fixture below starts
real components on free loopback ports (docs/architecture.md, Constraints); nothing assumes a
fixed port or a service left running, and everything is stopped at the end of the session (the
servers also die with the pytest process if it is killed).

Fixtures:

* ``kafka_bootstrap`` (session, ``str``): ``"127.0.0.1:PORT"`` of an embedded Apache Kafka
  broker (KRaft, one node). Create topics with ``unique_topic`` or ``infra.topics.ensure_topics``.
* ``unique_topic`` (function, factory): ``unique_topic(partitions=1, prefix="t") -> str`` creates
  a topic with a fresh name, so tests never see each other's records.
* ``redis_url`` (session, ``str``): ``"redis://127.0.0.1:PORT/0"`` of an embedded Redis (no
  persistence, no password).
* ``fresh_redis`` (function, ``redis.Redis``): a client on that server after ``FLUSHALL``; use it
  when a test needs an empty store. Responses are bytes (``decode_responses`` off).
* ``spark`` (session, ``SparkSession``): ``local[2]``, 2 shuffle partitions, no UI, RocksDB state
  store provider, UTC session time zone, Spark's Kafka connector on ``spark.jars``. Stopped at
  the end of the session. Streaming tests must stop their queries and use a ``tmp_path``
  checkpoint.
* ``infra_log_dir`` (session, ``Path``): where the embedded servers write their logs; look there
  when a test fails to connect.
"""

from __future__ import annotations

import itertools
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from infra.embedded import EmbeddedKafka, EmbeddedRedis
from infra.jars import spark_kafka_jars
from infra.topics import ensure_topics

if TYPE_CHECKING:
    import redis
    from pyspark.sql import SparkSession

_topic_counter = itertools.count()


@pytest.fixture(scope="session")
def infra_log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Folder for the embedded servers' logs (kept by pytest's tmp retention for debugging)."""
    return tmp_path_factory.mktemp("infra-logs")


@pytest.fixture(scope="session")
def kafka_bootstrap(infra_log_dir: Path) -> Iterator[str]:
    """Bootstrap servers of one embedded Kafka-protocol broker shared by the session."""
    with EmbeddedKafka(infra_log_dir) as kafka:
        yield kafka.bootstrap_servers


@pytest.fixture
def unique_topic(kafka_bootstrap: str) -> Callable[..., str]:
    """Factory: ``unique_topic(partitions=1, prefix="t")`` creates and returns a new topic."""

    def make(partitions: int = 1, prefix: str = "t") -> str:
        name = f"{prefix}-{next(_topic_counter)}-{uuid.uuid4().hex[:8]}"
        ensure_topics(kafka_bootstrap, {name: partitions})
        return name

    return make


@pytest.fixture(scope="session")
def redis_url(infra_log_dir: Path) -> Iterator[str]:
    """URL of one embedded Redis (no persistence) shared by the session."""
    with EmbeddedRedis(infra_log_dir) as redis_server:
        yield redis_server.url


@pytest.fixture
def fresh_redis(redis_url: str) -> Iterator[redis.Redis]:
    """A client on the session Redis after FLUSHALL, closed after the test."""
    import redis

    client = redis.Redis.from_url(redis_url)
    client.flushall()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """One local[2] SparkSession (one JVM) for the whole test session."""
    # executors' Python workers must run the same interpreter (and venv) as the tests
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    session = (
        SparkSession.builder.master("local[2]")
        .appName("pulsar-lb-stream-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "1g")
        .config("spark.executor.memory", "512m")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.warehouse.dir", str(warehouse))
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.jars", spark_kafka_jars())
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    try:
        yield session
    finally:
        session.stop()
