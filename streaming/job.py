"""The streaming job: load reports in, stateful averages, decisions out (one Spark query).

    source (Kafka: built-in or Python data source) -> parse (mapInPandas; dead letters as rows;
      the Python source parses in its own reading task instead)
      -> groupBy(key).transformWithStateInPandas(LoadStateProcessor)  [RocksDB state]
      -> foreachBatch(DecisionStage)  -> Kafka [decisions, dead letters] + Redis [view, progress]

Why one query: reading the reports once and carrying dead letters through the stateful step
(under their own key, with no state) costs less than a second query over the same topic, and
keeps one checkpoint and one batch id for everything a batch produced.

Run it with ``lbctl stream ...``, ``python -m streaming.submit ...`` or
``spark-submit streaming/submit.py ...`` (same options; see ``streaming.cli``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.listener import (
    JStreamingQueryListener,
    QueryProgressEvent,
    StreamingQueryProgress,
)

from infra import metrics
from infra.jars import spark_kafka_jars
from infra.offsets import earliest_offsets
from loadbalance.config import LoadBalancerConfig
from loadbalance.cycle import weights_from_config
from streaming.checkpoint_settings import DEFAULT_SHARDS, check_shards, has_batches
from streaming.decide import BatchStats, DecisionStage
from streaming.parse import ParseSettings, parse_batches
from streaming.schema import OUTPUT_FIELDS, PARSED_FIELDS, ddl
from streaming.source import read_kafka_stream, resolve_source
from streaming.state import LoadStateProcessor
from streaming.state_keys import shard_keys

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


log = logging.getLogger(__name__)
Offsets = Mapping[str, Mapping[str, int]]  # topic -> partition (as text) -> offset


@dataclass(frozen=True)
class StreamSettings:
    """How to run the query (the policy knobs are in ``LoadBalancerConfig``)."""

    bootstrap_servers: str
    checkpoint: str
    redis_url: str | None = None
    trigger_seconds: float = 5.0
    available_now: bool = False
    source: str = "auto"
    starting_offsets: str = "earliest"
    n_shards: int = DEFAULT_SHARDS
    bundle_ttl_seconds: float | None = None  # None: loadBalancerBrokerLoadDataTTLInSeconds
    max_offsets_per_trigger: int | None = None
    # without max_offsets_per_trigger: record bytes per batch (None: the source's 1 GiB),
    # counted as records of config.max_report_bytes each (streaming.kafka_source)
    max_bytes_per_trigger: int | None = None
    # a partition's range of more reports than this is read by several tasks (None: one task
    # per partition, which costs less CPU per report on two cores shared with the broker:
    # docs/design-decisions.md)
    max_records_per_partition: int | None = None
    watermark_delay_seconds: float = 60.0
    client_config: Mapping[str, Any] = field(default_factory=dict)
    query_name: str = "pulsar-lb-stream"
    seed: int = 0


def spark_session(
    master: str | None = "local[2]", shuffle_partitions: int = 2, driver_memory: str | None = None
) -> Any:
    """A session with what the job needs: RocksDB state store and Arrow for pandas.

    ``driver_memory`` (``spark.driver.memory``, e.g. ``3g``) sizes the driver JVM's heap when
    this process starts the JVM (Spark's default is 1 GB): the decision stage collects each
    batch's state output there, which at a million bundles is hundreds of MB. A driver that
    spark-submit already started keeps the heap spark-submit gave it.

    Spark's Kafka connector (``spark-sql-kafka-0-10`` of this PySpark's version, fetched once
    by ``infra.jars``) goes on ``spark.jars``, so the built-in ``kafka`` source is available.

    ``master=None`` keeps the master of ``spark-submit --master`` when spark-submit launched
    this process, and is ``local[2]`` otherwise: a master set here would win over
    spark-submit's, so a job submitted to a cluster would run on its driver alone without a
    word.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder
    if master is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        master = "local[2]"  # not launched by spark-submit (which sets that variable)
    if master is not None:
        builder = builder.master(master)
    if driver_memory:
        builder = builder.config("spark.driver.memory", driver_memory)
    if not _launcher_brings_connector():
        builder = builder.config("spark.jars", spark_kafka_jars())
    return (
        builder.appName("pulsar-lb-stream")
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
        # Commit a changelog of the keys a batch wrote instead of uploading a RocksDB snapshot
        # every batch (snapshots are then made in the background every few batches): the
        # commit is on every batch's critical path, and the latency target is seconds.
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")  # progress bars garble logs and tables
        .getOrCreate()
    )


def _launcher_brings_connector() -> bool:
    """True when the JVM's launcher already has Spark's Kafka connector: spark-submit started
    this process (its caller passes ``--jars`` or ``--packages``, see docs/deploy.md), or
    ``PYSPARK_SUBMIT_ARGS`` names the connector (the compose stack's ``--packages``). Otherwise
    this process launches the JVM and puts the cached jars on ``spark.jars``."""
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        return True
    return "spark-sql-kafka" in os.environ.get("PYSPARK_SUBMIT_ARGS", "")


def build_stream(
    spark: Any,
    settings: StreamSettings,
    config: LoadBalancerConfig,
    state_key_partitions: int | None = None,
) -> Any:
    """The state step's output as a streaming DataFrame (before the decision stage), the shards'
    state keys balanced over ``state_key_partitions`` (None: plain keys; ``state_keys``)."""
    parse = ParseSettings(
        config.max_report_bytes,
        settings.n_shards,
        weights_from_config(config),
        shard_keys(settings.n_shards, state_key_partitions),
    )
    source = resolve_source(spark, settings.source)
    raw = read_kafka_stream(
        spark,
        bootstrap_servers=settings.bootstrap_servers,
        topic=config.load_reports_topic,
        source=source,
        starting_offsets=settings.starting_offsets,
        client_config=dict(settings.client_config) or None,
        max_offsets_per_trigger=settings.max_offsets_per_trigger,
        max_bytes_per_trigger=settings.max_bytes_per_trigger,
        max_record_bytes=config.max_report_bytes,
        max_records_per_partition=settings.max_records_per_partition,
        # the Python source decodes as it reads: the reports' bytes cross to the JVM once
        parse=parse.to_json() if source == "python" else None,
    )
    if source == "python":
        rows = raw
    else:
        records = raw.select(
            "key",
            "value",
            "topic",
            "partition",
            "offset",
            F.unix_millis("timestamp").alias("timestamp_ms"),
        )
        rows = records.mapInPandas(parse_batches(parse), ddl(PARSED_FIELDS))
    parsed = rows.withColumn("event_time", F.timestamp_millis("event_ms")).withWatermark(
        "event_time", f"{int(settings.watermark_delay_seconds * 1000)} milliseconds"
    )
    ttl_s = settings.bundle_ttl_seconds
    if ttl_s is None:
        ttl_s = config.load_balancer_broker_load_data_ttl_in_seconds
    processor = LoadStateProcessor(
        history_percentage=config.load_balancer_history_resource_percentage,
        report_timeout_ms=int(config.load_balancer_broker_report_timeout_seconds * 1000),
        bundle_ttl_ms=int(ttl_s * 1000),
        records_dir=local_records_dir(settings.checkpoint),
    )
    return parsed.groupBy("key").transformWithStateInPandas(
        statefulProcessor=processor,
        outputStructType=ddl(OUTPUT_FIELDS),
        outputMode="Update",
        timeMode="EventTime",
    )


def local_records_dir(checkpoint: str) -> str:
    """The local folder of the state step's whole shard records (``streaming.shard_records``)
    for ``checkpoint``: under the host's temporary folder, one per checkpoint (a restart of the
    job finds the files it wrote; another job's never mix in)."""
    digest = hashlib.sha256(checkpoint.encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), "lbctl-shard-records", digest)


def start_query(
    spark: Any,
    settings: StreamSettings,
    config: LoadBalancerConfig,
    on_batch: Callable[[BatchStats], None] | None = None,
    stages: list[DecisionStage] | None = None,
) -> Any:
    """Start the whole query; returns the ``StreamingQuery``. The query's decision stage is
    appended to ``stages`` when given (the caller releases its decider lease at the end).

    Raises ``CheckpointMismatch`` when the checkpoint was started with another shard count."""
    # a new checkpoint's state partitions: what Spark records with its first batch
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    key_partitions = check_shards(settings.checkpoint, settings.n_shards, partitions)
    stage = DecisionStage(
        config=config,
        bootstrap_servers=settings.bootstrap_servers,
        redis_url=settings.redis_url,
        client_config=dict(settings.client_config) or None,
        seed=settings.seed,
        on_batch=on_batch,
    )
    if stages is not None:
        stages.append(stage)
    writer = (
        build_stream(spark, settings, config, key_partitions)
        .writeStream.queryName(settings.query_name)
        .option("checkpointLocation", settings.checkpoint)
        .foreachBatch(stage)
    )
    if settings.available_now:
        writer = writer.trigger(availableNow=True)
    elif settings.trigger_seconds > 0:
        writer = writer.trigger(processingTime=f"{settings.trigger_seconds} seconds")
    use_file_system_api_on_local_disk(spark, settings.checkpoint)
    listener = progress_listener(spark)
    first_start = _first_batch_start(settings, config)
    query = writer.start()
    listener.watch(str(query.id), resolve_source(spark, settings.source) != "python", first_start)
    return query


CHECKPOINT_FILE_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"
FILE_SYSTEM_BASED = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)


def use_file_system_api_on_local_disk(spark: Any, checkpoint: str) -> bool:
    """Write a local checkpoint through Hadoop's ``FileSystem`` API rather than Spark's default
    ``FileContext`` one; True when set. Why: on the local file system ``FileContext.rename``
    asks for the link status of its paths, which Hadoop answers by running ``readlink`` in a new
    process; every offset, commit and state changelog file is written as a temporary file and
    renamed, about 24 processes a second for a job with a 1 s trigger (JFR's
    ``jdk.ProcessStart``), a fifth of the JVM's CPU on a small cluster. ``FileSystem.rename`` on
    a local disk is ``rename(2)``, atomic as the checkpoint needs. A distributed checkpoint
    (``hdfs:``, ``s3a:``...) and a class the operator chose are left as they are."""
    scheme = checkpoint.split(":", 1)[0].lower() if ":" in checkpoint else ""
    if scheme not in ("", "file"):
        return False
    if spark.conf.get(CHECKPOINT_FILE_MANAGER, None) or not _loadable(spark, FILE_SYSTEM_BASED):
        return False
    spark.conf.set(CHECKPOINT_FILE_MANAGER, FILE_SYSTEM_BASED)
    return True


def _loadable(spark: Any, class_name: str) -> bool:
    """Whether the driver's JVM has ``class_name`` (another Spark version may name it
    differently); True when there is no JVM to ask."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        return True
    try:
        return bool(jvm.org.apache.spark.util.Utils.classIsLoadable(class_name))
    except Exception:
        return False


def _first_batch_start(settings: StreamSettings, config: LoadBalancerConfig) -> Offsets | None:
    """Where a new checkpoint's first batch starts reading, for counting its records: Spark's
    progress gives no start offsets for that batch. Known for ``earliest`` (the log's first
    offsets, read now, as the source reads them when it starts); None when the checkpoint
    already has batches (their progress has both ends) or the start is another spec."""
    if has_batches(Path(settings.checkpoint)):
        return None
    if settings.starting_offsets.strip().lower() != "earliest":
        return None
    topic = config.load_reports_topic
    try:
        low = earliest_offsets(settings.bootstrap_servers, topic, settings.client_config or None)
    except Exception as e:  # a metric only: never a reason not to start
        log.warning("cannot read where %s starts (first batch not counted): %s", topic, e)
        return None
    return {topic: {str(p): o for p, o in low.items()}}


_LISTENER_ATTR = "_lb_input_rows_listener"
"""The attribute of a Spark session that holds its input-rows listener (``progress_listener``)."""


class _JsonProgress(JStreamingQueryListener):
    """PySpark's bridge from the JVM's listener bus to a Python listener, with each progress
    event read as one JSON text instead of field by field.

    Why: PySpark's ``QueryProgressEvent.fromJObject`` reads every field of the progress with its
    own Py4J call, and a reflective lookup among them makes the JVM search every jar of its
    class path: 75-101 ms per event (0.3-0.4 ms as JSON) and a seventh of the JVM's sampled
    frames at a million bundles, on the cores the batches need (docs/design-decisions.md, "Whole
    records spread over batches, and the query listener"). The JSON is Spark's own
    ``StreamingQueryProgress.json``, parsed by PySpark's ``fromJson``; should that ever fail,
    the event is read the slow way rather than lost."""

    def onQueryProgress(self, jevent: Any) -> None:
        try:
            progress = StreamingQueryProgress.fromJson(json.loads(jevent.progress().json()))
            event = QueryProgressEvent(progress=progress)
        except Exception:
            log.warning("progress event not readable as JSON; read field by field", exc_info=True)
            event = QueryProgressEvent.fromJObject(jevent)
        self.pylistener.onQueryProgress(event)


def progress_listener(spark: Any) -> Any:
    """The session's query listener that counts input rows (one per session, made on demand).

    Why a listener: Spark counts the rows each micro-batch read from the source
    (``numInputRows``); the decision stage sees only the state step's output, which has one row
    per touched bundle or broker, not per report. Progress events arrive once per batch on
    Spark's listener bus, off the batch's own thread, so counting costs the batch nothing.
    Only queries started by ``start_query`` are counted. The listener is kept on the session it
    listens to, so it lives and goes with that session.
    """
    found = getattr(spark, _LISTENER_ATTR, None)
    if found is not None:
        return found

    class InputRowsListener(StreamingQueryListener):
        @property
        def _jlistener(self) -> Any:
            # PySpark's own bridge object, with progress events read as JSON (_JsonProgress)
            if not hasattr(self, "_jlistenerobj"):
                jvm = spark.sparkContext._jvm
                self._jlistenerobj = jvm.PythonStreamingQueryListenerWrapper(_JsonProgress(self))
            return self._jlistenerobj

        def __init__(self) -> None:
            self.queries: dict[str, bool] = {}  # query id -> whether its input rows are records
            self.first_starts: dict[str, Offsets] = {}  # query id -> a new checkpoint's start

        def watch(
            self, query_id: str, rows_are_records: bool, first_start: Offsets | None = None
        ) -> None:
            self.queries[query_id] = rows_are_records
            if first_start is not None:
                self.first_starts[query_id] = first_start

        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            progress = event.progress
            qid = str(progress.id)
            if qid in self.queries:
                records = records_read(progress.sources)
                if records is None and qid in self.first_starts:
                    # the first batch of a new checkpoint: Spark does not say where it started
                    records = records_read(progress.sources, self.first_starts.pop(qid))
                if records is None and self.queries[qid]:
                    records = int(progress.numInputRows or 0)  # its rows are the records
                metrics.STREAM_INPUT_ROWS.inc(max(0, records or 0))

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            self.queries.pop(str(event.id), None)

    listener = InputRowsListener()
    spark.streams.addListener(listener)
    setattr(spark, _LISTENER_ATTR, listener)
    return listener


def _offsets(value: Any) -> Any:
    """A progress offset: JSON text or already parsed. A first batch's start is null, or the
    text ``None`` (the Python data source's progress writes it so)."""
    if isinstance(value, str):
        return None if value.strip() in ("", "None", "null") else json.loads(value)
    return value


def records_read(sources: Any, unknown_start: int | Offsets | None = None) -> int | None:
    """Kafka records a batch read, from its sources' start and end offsets (``{"topic":
    {"partition": offset}}``, both Kafka sources' form). Spark gives no start offsets for the
    first batch of a new checkpoint: then each partition is taken to start at
    ``unknown_start`` (one offset for all, or per topic and partition), and with None the
    answer is None.

    Why not ``numInputRows``: the Python source parses as it reads, so its rows are parse
    rows (a report's row and one per state shard it touches), not records."""
    total = 0
    for source in sources or ():
        get = source.get if isinstance(source, dict) else lambda k, s=source: getattr(s, k)
        try:
            start, end = (_offsets(get("startOffset")), _offsets(get("endOffset")))
            if end is None or (start is None and unknown_start is None):
                return None
            start = start or {}
            for topic, ends in end.items():
                begins = start.get(topic, {})
                for partition, stop in ends.items():
                    if isinstance(unknown_start, Mapping):
                        first = unknown_start.get(topic, {}).get(partition, stop)
                    else:
                        first = stop if unknown_start is None else unknown_start
                    total += int(stop) - int(begins.get(partition, first))
        except (ValueError, AttributeError, TypeError):
            return None
    return total
