"""Choose the Kafka source of the streaming job: Spark's built-in ``kafka`` or ``lbkafka``.

Why a seam: the built-in source (Spark's connector, ``spark-sql-kafka-0-10``) is the default;
``streaming.job`` puts its jars on ``spark.jars`` when it starts the JVM, and a ``spark-submit``
caller adds them with ``--jars`` or ``--packages``. The Python source (``streaming.kafka_source``)
gives the same columns from confluent-kafka for a Spark without the connector.
``source="auto"`` takes the built-in one when its classes are on the driver's classpath, the
Python one otherwise.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

from pyspark.sql import DataFrame, SparkSession

from infra.kafka_auth import java_client_settings
from loadbalance.report_codec import DEFAULT_MAX_REPORT_BYTES
from streaming.kafka_source import default_max_offsets_per_trigger, register

__all__ = ["builtin_kafka_available", "read_kafka_stream", "resolve_source"]

log = logging.getLogger(__name__)

BUILTIN_PROVIDER_CLASS = "org.apache.spark.sql.kafka010.KafkaSourceProvider"
CONNECTOR_CLIENT_DEFAULTS = MappingProxyType(
    {"request.timeout.ms": "10000", "default.api.timeout.ms": "15000", "fetch.max.wait.ms": "20"}
)
"""The connector's Java clients' settings unless the caller sets them.

* The timeouts. Spark asks each partition's leader for the latest offsets through an
  AdminClient call aimed at the leader it read from the metadata; after a leader crashes that
  call waits for the dead node until ``default.api.timeout.ms`` (Kafka's 60 s) before Spark
  retries it, stalling every batch for a minute although a new leader is elected in about
  10 s. 15 s bounds that stall (and matches the Python source's offset probe); the admin client
  wants ``request.timeout.ms`` no larger.
* ``fetch.max.wait.ms`` 20 (Kafka's 500). A task's consumer leaves a fetch for the records
  after its range in flight when it returns; the broker holds such a fetch until that long when
  no record follows, and the next batch's read on the same cached consumer waits for it before
  it can fetch its own range. At 500 ms that wait was most of a live batch: on 8 brokers and
  48 bundles (``benchmarks/bench_reaction.py``) a batch took 1.35 s and the pipeline from a
  report to the move visible to a lookup 1.78 s at p50, against 0.56 s and 0.78 s at 20 ms. A
  consumer only fetches inside its poll, so a shorter wait costs nothing while the job is idle,
  and a fetch that finds records returns at once whatever the setting."""
SourceKind = Literal["auto", "kafka", "python"]


def builtin_kafka_available(spark: SparkSession) -> bool:
    """True when ``spark-sql-kafka-0-10`` is loadable by the driver JVM (classic Spark only)."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:  # Spark Connect: no JVM handle here; the server decides
        return False
    try:
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        loader.loadClass(BUILTIN_PROVIDER_CLASS)
        return True
    except Exception:  # py4j wraps ClassNotFoundException
        return False


def resolve_source(spark: SparkSession, source: SourceKind) -> SourceKind:
    """``"kafka"`` or ``"python"``: ``"auto"`` is the built-in one when its jar is loadable."""
    if source not in ("auto", "kafka", "python"):
        raise ValueError(f"source must be 'auto', 'kafka' or 'python', got {source!r}")
    if source == "auto":
        return "kafka" if builtin_kafka_available(spark) else "python"
    return source


def read_kafka_stream(
    spark: SparkSession,
    *,
    bootstrap_servers: str,
    topic: str,
    source: SourceKind = "auto",
    starting_offsets: str = "earliest",
    client_config: Mapping[str, Any] | None = None,
    max_offsets_per_trigger: int | None = None,
    parse: str | None = None,
    max_bytes_per_trigger: int | None = None,
    max_record_bytes: int | None = None,
    max_records_per_partition: int | None = None,
) -> DataFrame:
    """A streaming DataFrame of Kafka records with the built-in source's columns.

    ``topic`` may be a comma list. ``client_config`` keys are librdkafka settings with or
    without the ``kafka.`` prefix (SASL/SSL go here, as ``kafka_client_settings()`` gives
    them); the connector gets them translated to the Java client's names
    (``infra.kafka_auth.java_client_settings``: the JAAS line, PEM stores), the Python source
    as they are. ``parse`` (the Python source
    only, ``resolve_source`` says which): ``ParseSettings`` as JSON, and the rows are the parse
    stage's (``streaming.kafka_source``).

    ``max_offsets_per_trigger`` None: each batch is still capped, at
    ``kafka_source.default_max_offsets_per_trigger``: ``max_bytes_per_trigger`` (default 1 GiB)
    of records of ``max_record_bytes`` (default: ``parse``'s ``maxReportBytes``, else the
    codec's 1 MB), for either source, so that a catch-up after a long outage runs in bounded
    batches rather than one.

    ``max_records_per_partition``: a partition's range of more records than this is read by
    several tasks (the built-in source's option of that name, which the Python source
    implements alike: ``kafka_source.divide_ranges``).
    """
    source = resolve_source(spark, source)
    if parse is not None and source != "python":
        raise ValueError("only the Python source parses as it reads")
    fmt = "kafka" if source == "kafka" else register(spark)
    log.info("reading %s from %s with the %s source", topic, bootstrap_servers, fmt)
    reader = (
        spark.readStream.format(fmt)
        .option("kafka.bootstrap.servers", bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", starting_offsets)
    )
    reader = _with_batch_limits(
        reader,
        source,
        max_offsets_per_trigger,
        max_bytes_per_trigger,
        max_record_bytes,
        max_records_per_partition,
    )
    if parse is not None:
        reader = reader.option("lb.parse", parse)
    reader = _with_client_options(reader, source, client_config)
    return reader.load()


def _with_client_options(
    reader: Any, source: SourceKind, client_config: Mapping[str, Any] | None
) -> Any:
    """``reader`` with ``read_kafka_stream``'s ``client_config`` as ``kafka.``-prefixed options.

    ``bootstrap.servers`` is skipped (the reader has it from its own argument), and so is a
    callable (a librdkafka callback such as ``error_cb``), which has no string form.
    """
    options = {k.removeprefix("kafka."): v for k, v in (client_config or {}).items()}
    if source == "kafka":  # the connector runs the Java client: its names, a JAAS line
        options = {**CONNECTOR_CLIENT_DEFAULTS, **java_client_settings(options)}
    for key, value in options.items():
        if key != "bootstrap.servers" and not callable(value):
            reader = reader.option(f"kafka.{key}", str(value))
    return reader


def _with_batch_limits(
    reader: Any,
    source: SourceKind,
    max_offsets_per_trigger: int | None,
    max_bytes_per_trigger: int | None,
    max_record_bytes: int | None,
    max_records_per_partition: int | None,
) -> Any:
    """``reader`` with ``read_kafka_stream``'s cap of records per batch and of records per
    reading task."""
    if max_offsets_per_trigger is None and (source == "kafka" or max_record_bytes is not None):
        # the Python source derives its default from the parse settings itself
        max_offsets_per_trigger = default_max_offsets_per_trigger(
            max_record_bytes or DEFAULT_MAX_REPORT_BYTES,
            *([max_bytes_per_trigger] if max_bytes_per_trigger is not None else []),
        )
    if max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(int(max_offsets_per_trigger)))
    if max_bytes_per_trigger is not None and source == "python":
        reader = reader.option("lb.maxBytesPerTrigger", str(int(max_bytes_per_trigger)))
    if max_records_per_partition is not None:
        reader = reader.option("maxRecordsPerPartition", str(int(max_records_per_partition)))
    return reader
