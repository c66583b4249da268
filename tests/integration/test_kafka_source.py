"""Both Kafka sources (Spark's connector and the Python data source) read every record exactly
once and replay exactly.

Real Apache Kafka, real Spark: records are produced to known partitions, read with
``trigger(availableNow=True)``, and the query is restarted from its checkpoint. The tests that
use the ``source`` fixture run once per source.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from pyspark.errors import StreamingQueryException

from loadbalance.view import UsageWeights
from streaming.kafka_source import KafkaSourceConfig
from streaming.source import builtin_kafka_available, read_kafka_stream

pytestmark = [pytest.mark.integration, pytest.mark.spark]

BUILTIN_KAFKA_SCHEMA = (
    "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
    "timestamp:timestamp,timestampType:int>"
)

Record = tuple[int, int, bytes, bytes]  # partition, offset, key, value


def _produce(bootstrap: str, topic: str, partition_values: list[tuple[int, str]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition, value in partition_values:
        producer.produce(
            topic, key=f"k-{value}".encode(), value=value.encode(), partition=partition
        )
    assert producer.flush(10) == 0


@pytest.fixture(params=["kafka", "python"])
def source(request: pytest.FixtureRequest) -> str:
    """The source under test: Spark's connector (``kafka``) or the Python data source."""
    return str(request.param)


def _run_available_now(
    spark,
    bootstrap: str,
    topic: str,
    checkpoint: Path,
    tasks: list[int] | None = None,
    *,
    source: str,
    **kwargs,
) -> list:
    """Run one availableNow query; return (batch id, rows) per non-empty micro-batch. ``tasks``
    gets each batch's number of reading tasks."""
    batches: list[tuple[int, list]] = []

    def collect(batch_df, batch_id: int) -> None:
        if tasks is not None:
            tasks.append(batch_df.rdd.getNumPartitions())
        rows = batch_df.selectExpr("*", "unix_millis(timestamp) AS ts_ms").collect()
        if rows:
            batches.append((batch_id, rows))

    df = read_kafka_stream(spark, bootstrap_servers=bootstrap, topic=topic, source=source, **kwargs)
    query = (
        df.writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120), "availableNow query did not finish"
    finally:
        query.stop()
    assert query.exception() is None
    return batches


def _records(batches: list) -> list[Record]:
    return [
        (r.partition, r.offset, bytes(r.key), bytes(r.value)) for _, rows in batches for r in rows
    ]


def test_every_record_exactly_once_then_only_new_records_after_restart(
    spark, kafka_bootstrap: str, unique_topic, tmp_path: Path, source: str
) -> None:
    topic = unique_topic(2)
    checkpoint = tmp_path / "checkpoint"
    first = [(i % 2, f"a{i}") for i in range(10)]
    produced_at_ms = int(time.time() * 1000)
    _produce(kafka_bootstrap, topic, first)

    batches = _run_available_now(spark, kafka_bootstrap, topic, checkpoint, source=source)
    rows = [r for _, rs in batches for r in rs]
    assert all(r.topic == topic and r.timestampType == 0 for r in rows)
    assert all(abs(r.ts_ms - produced_at_ms) < 60_000 for r in rows)
    expected_first = sorted(
        [(0, i, f"k-a{2 * i}".encode(), f"a{2 * i}".encode()) for i in range(5)]
        + [(1, i, f"k-a{2 * i + 1}".encode(), f"a{2 * i + 1}".encode()) for i in range(5)]
    )
    assert sorted(_records(batches)) == expected_first
    assert len(_records(batches)) == 10  # no duplicates

    _produce(kafka_bootstrap, topic, [(0, "b0"), (0, "b1"), (1, "b2"), (0, "b3")])
    batches = _run_available_now(spark, kafka_bootstrap, topic, checkpoint, source=source)
    assert sorted(_records(batches)) == [
        (0, 5, b"k-b0", b"b0"),
        (0, 6, b"k-b1", b"b1"),
        (0, 7, b"k-b3", b"b3"),
        (1, 5, b"k-b2", b"b2"),
    ]

    assert _run_available_now(spark, kafka_bootstrap, topic, checkpoint, source=source) == []


def test_max_offsets_per_trigger_splits_the_backlog_into_capped_batches(
    spark, kafka_bootstrap: str, unique_topic, tmp_path: Path, source: str
) -> None:
    topic = unique_topic(2)
    _produce(kafka_bootstrap, topic, [(i % 2, f"c{i}") for i in range(12)])
    batches = _run_available_now(
        spark, kafka_bootstrap, topic, tmp_path / "ck", max_offsets_per_trigger=5, source=source
    )
    assert len(batches) >= 3
    assert all(len(rows) <= 5 for _, rows in batches)
    records = _records(batches)
    assert sorted((p, o) for p, o, _, _ in records) == [(p, o) for p in (0, 1) for o in range(6)]


def test_max_records_per_partition_reads_a_large_range_in_several_tasks_each_record_once(
    spark, kafka_bootstrap: str, unique_topic, tmp_path: Path, source: str
) -> None:
    topic = unique_topic(2)
    _produce(kafka_bootstrap, topic, [(0, f"d{i}") for i in range(11)] + [(1, "e0"), (1, "e1")])
    tasks: list[int] = []
    batches = _run_available_now(
        spark,
        kafka_bootstrap,
        topic,
        tmp_path / "ck",
        tasks,
        max_records_per_partition=4,
        source=source,
    )
    # partition 0's 11 records in 3 tasks (3, 4, 4), partition 1's 2 in one
    assert tasks == [4]
    records = _records(batches)
    assert len(records) == 13
    assert sorted((p, o) for p, o, _, _ in records) == [(0, o) for o in range(11)] + [
        (1, 0),
        (1, 1),
    ]


def test_starting_offsets_latest_skips_what_was_there_before(
    spark, kafka_bootstrap: str, unique_topic, tmp_path: Path, source: str
) -> None:
    topic = unique_topic(2)
    _produce(kafka_bootstrap, topic, [(0, "old0"), (1, "old1"), (1, "old2")])
    checkpoint = tmp_path / "ck"
    kwargs = {"starting_offsets": "latest"}
    assert (
        _run_available_now(spark, kafka_bootstrap, topic, checkpoint, **kwargs, source=source) == []
    )
    _produce(kafka_bootstrap, topic, [(1, "new0")])
    batches = _run_available_now(spark, kafka_bootstrap, topic, checkpoint, **kwargs, source=source)
    assert _records(batches) == [(1, 2, b"k-new0", b"new0")]


def test_auto_picks_the_connector_and_both_sources_have_its_schema(
    spark, kafka_bootstrap: str, unique_topic
) -> None:
    assert builtin_kafka_available(spark)  # the session fixture puts the connector on spark.jars
    topic = unique_topic(1)
    for source in ("auto", "kafka", "python"):
        df = read_kafka_stream(spark, bootstrap_servers=kafka_bootstrap, topic=topic, source=source)
        assert df.isStreaming
        assert df.schema.simpleString() == BUILTIN_KAFKA_SCHEMA


def test_options_pass_kafka_settings_through_and_reject_missing_ones() -> None:
    config = KafkaSourceConfig.from_options(
        {
            "kafka.bootstrap.servers": "h:9092",
            "subscribe": "a, b",
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "PLAIN",
            "maxOffsetsPerTrigger": "100",
            "startingOffsets": "latest",
        }
    )
    assert config.topics == ("a", "b")
    assert config.client_config == {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}
    assert config.max_offsets_per_trigger == 100
    assert config.starting_offsets == "latest"
    with pytest.raises(ValueError, match="bootstrap"):
        KafkaSourceConfig.from_options({"subscribe": "a"})
    with pytest.raises(ValueError, match="subscribe"):
        KafkaSourceConfig.from_options({"kafka.bootstrap.servers": "h:9092"})


def test_without_a_cap_a_batch_reads_at_most_a_gib_of_the_largest_accepted_reports() -> None:
    from streaming.kafka_source import (
        DEFAULT_MAX_BYTES_PER_TRIGGER,
        default_max_offsets_per_trigger,
    )
    from streaming.parse import ParseSettings

    base = {"kafka.bootstrap.servers": "h:9092", "subscribe": "a"}
    assert DEFAULT_MAX_BYTES_PER_TRIGGER == 1024**3
    # without parse settings: the codec's default report limit, 1 MB
    assert KafkaSourceConfig.from_options(base).max_offsets_per_trigger == 1024
    settings = ParseSettings(4 * 1024 * 1024, 32, UsageWeights())
    parsed = KafkaSourceConfig.from_options(base | {"lb.parse": settings.to_json()})
    assert parsed.max_offsets_per_trigger == 256
    budget = KafkaSourceConfig.from_options(base | {"lb.maxBytesPerTrigger": str(2**20)})
    assert budget.max_offsets_per_trigger == 1
    assert default_max_offsets_per_trigger(2**30, 2**20) == 1  # never below one record
    given = KafkaSourceConfig.from_options(base | {"maxOffsetsPerTrigger": "5000"})
    assert given.max_offsets_per_trigger == 5000  # the operator's cap wins
    with pytest.raises(ValueError, match="maxBytesPerTrigger"):
        KafkaSourceConfig.from_options(base | {"lb.maxBytesPerTrigger": "0"})


def _start_beyond_the_end(spark, bootstrap: str, topic: str, checkpoint: Path, fail: bool):
    from streaming.kafka_source import register

    reader = (
        spark.readStream.format(register(spark))
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", json.dumps({topic: {"0": 10}}))
        .option("failOnDataLoss", str(fail).lower())
    )
    rows: list = []
    query = (
        reader.load()
        .writeStream.foreachBatch(lambda df, _: rows.extend(df.collect()))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    return query, rows


def test_offsets_that_went_backwards_fail_the_query_or_reread_from_earliest(
    spark, kafka_bootstrap: str, unique_topic, tmp_path: Path
) -> None:
    """A log that ends before the checkpoint (e.g. the in-memory broker restarted) is not
    silently waited out: it fails by default, and is re-read from earliest when allowed."""
    topic = unique_topic(1)
    _produce(kafka_bootstrap, topic, [(0, "x0"), (0, "x1"), (0, "x2")])

    query, _ = _start_beyond_the_end(spark, kafka_bootstrap, topic, tmp_path / "a", fail=True)
    with pytest.raises(StreamingQueryException, match="went backwards"):
        query.awaitTermination(120)

    query, rows = _start_beyond_the_end(spark, kafka_bootstrap, topic, tmp_path / "b", fail=False)
    try:
        assert query.awaitTermination(120)
    finally:
        query.stop()
    assert sorted((r.partition, r.offset) for r in rows) == [(0, 0), (0, 1), (0, 2)]
