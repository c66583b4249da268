"""A Spark 4 Python streaming data source over confluent-kafka, format ``"lbkafka"``.

Why: the job's default source is Spark's own connector (``spark-sql-kafka-0-10``,
``streaming.source``); this one is the alternative for a Spark without that jar, and it decodes
the reports in its reading task (``lb.parse``), which the connector cannot. It produces the
same columns with the same types (``key`` binary, ``value`` binary, ``topic`` string,
``partition`` int, ``offset`` long, ``timestamp`` timestamp, ``timestampType`` int) and keeps
*real per-partition offsets* in Spark's checkpoint, so a restarted query replays exactly the
records after its last committed batch, no more and no less.

Offsets are JSON like the built-in source's: ``{"topic": {"0": 42, "1": 17}}``, each value the
next offset to read. End offsets come from ``infra.offsets.latest_offsets`` (ListOffsets).

Options (case-insensitive):

* ``kafka.bootstrap.servers`` (required); ``subscribe``: a topic or a comma list of topics;
* ``startingOffsets``: ``earliest`` (default), ``latest``, or Spark's JSON form
  (``{"t": {"0": 5, "1": -2}}``, -2 earliest, -1 latest; unnamed partitions start earliest);
  it applies to a new query only: a restarted query continues from its checkpoint;
* ``minPartitions``, ``maxRecordsPerPartition``: cut a partition's range of a batch into several
  reading tasks, exactly as the built-in source does (``divide_ranges``): a range of more than
  ``maxRecordsPerPartition`` records into even pieces of at most that many, then, while there
  are fewer tasks than ``minPartitions``, the large ranges in proportion to their size. Why:
  one task per partition leaves cores idle when a catch-up's partitions are fewer than the
  cores, or while a task waits on a fetch, and a batch's stages run one after another. A cap
  in records cuts only the large ranges of a catch-up; a live batch of a few reports stays
  one task per partition, so it does not pay for more consumers;
* ``maxOffsetsPerTrigger``: cap of records per micro-batch, shared by partitions in proportion
  to their backlog (as the built-in source does); with ``trigger(availableNow=True)`` batches
  stay capped and together stop at the end offsets seen when the query started. Without it
  the cap is ``default_max_offsets_per_trigger``: ``lb.maxBytesPerTrigger`` (default
  ``DEFAULT_MAX_BYTES_PER_TRIGGER``, 1 GiB) over the largest report accepted (``lb.parse``'s
  ``maxReportBytes``, else the codec's default of 1 MB). Why a default: a catch-up is fastest
  in few large batches (each batch costs seconds of CPU whatever its size,
  docs/benchmarks.md), but a batch holds its records' parse output in the shuffle and a
  shard's samples in one state-step call, so with no cap a restart after an hour's outage
  would take the hour in one batch;
* ``failOnDataLoss`` (default true): fail when the log no longer holds the next offset, e.g. it
  ends before the checkpointed offsets because the in-memory broker was restarted; with
  ``false`` such partitions are re-read from earliest;
* ``kafkaConsumer.pollTimeoutMs`` (default 120000): how long a task waits for missing records;
* ``lb.parse``: ``streaming.parse.ParseSettings`` as JSON; with it the source decodes the
  reports as it reads them and yields the parse stage's rows (``streaming.schema.PARSED_FIELDS``)
  instead of Kafka's columns. Why: the reports are the largest thing the job moves (hundreds of
  KB each); decoded in the reading task, their bytes cross from Python to the JVM once, as the
  smaller parsed rows, instead of three times (to the JVM, back to a ``mapInPandas`` worker, and
  the parsed rows again), which took most of a catch-up batch's time
  (docs/design-decisions.md);
* ``kafka.*``: everything else is passed to librdkafka without the prefix, e.g.
  ``kafka.security.protocol=SASL_SSL``, ``kafka.sasl.mechanism=PLAIN``,
  ``kafka.sasl.username``/``kafka.sasl.password``, ``kafka.ssl.ca.location``. Note librdkafka's
  names, not the Java client's (no ``sasl.jaas.config``, no JKS trust stores).

Readers use ``assign()`` only: no consumer group is joined (a join costs a rebalance) and
nothing is committed to Kafka; Spark's checkpoint is the only record of progress. Executors get
the picklable ``KafkaSourceConfig`` and open their own short-lived consumer per partition range.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from infra.offsets import earliest_offsets, latest_offsets
from loadbalance.report_codec import DEFAULT_MAX_REPORT_BYTES
from streaming import kafka_reads

__all__ = [
    "DEFAULT_MAX_BYTES_PER_TRIGGER",
    "FORMAT_NAME",
    "KAFKA_SCHEMA",
    "DataLossError",
    "KafkaOffsetRange",
    "KafkaSourceConfig",
    "LbKafkaDataSource",
    "LbKafkaStreamReader",
    "default_max_offsets_per_trigger",
    "divide_ranges",
    "register",
]

FORMAT_NAME = "lbkafka"
KAFKA_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
_EARLIEST, _LATEST = -2, -1
DEFAULT_MAX_BYTES_PER_TRIGGER = 1024 * 1024 * 1024
"""Record bytes a micro-batch may read when no ``maxOffsetsPerTrigger`` is given (a bound: the
cap in records assumes every record is as large as the largest report accepted)."""

Offsets = dict[str, dict[str, int]]


def default_max_offsets_per_trigger(
    max_record_bytes: int = DEFAULT_MAX_REPORT_BYTES,
    max_bytes_per_trigger: int = DEFAULT_MAX_BYTES_PER_TRIGGER,
) -> int:
    """Records per micro-batch when the operator set no cap: ``max_bytes_per_trigger`` of
    records of ``max_record_bytes`` (at least one record). A larger record than that is a dead
    letter, whose row holds at most 64 KB of it."""
    if max_record_bytes <= 0 or max_bytes_per_trigger <= 0:
        raise ValueError("max_record_bytes and max_bytes_per_trigger must be positive")
    return max(1, max_bytes_per_trigger // max_record_bytes)


log = logging.getLogger(__name__)


class DataLossError(RuntimeError):
    """The log no longer holds offsets the checkpoint says are next; records would be missed."""


@dataclass(frozen=True)
class KafkaSourceConfig:
    """Everything the driver and the executors need; plain data, so it pickles."""

    bootstrap_servers: str
    topics: tuple[str, ...]
    client_config: dict[str, str] = field(default_factory=dict)
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    poll_timeout_s: float = 120.0
    parse: str | None = None  # ParseSettings as JSON: yield parsed rows (the module docstring)
    min_partitions: int | None = None
    max_records_per_partition: int | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> KafkaSourceConfig:
        """Parse Spark reader options (keys arrive lower-cased)."""
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        servers = opts.get("kafka.bootstrap.servers")
        if not servers:
            raise ValueError(f"{FORMAT_NAME}: option 'kafka.bootstrap.servers' is required")
        topics = tuple(t.strip() for t in opts.get("subscribe", "").split(",") if t.strip())
        if not topics:
            raise ValueError(f"{FORMAT_NAME}: option 'subscribe' (one or more topics) is required")
        client = {
            k[len("kafka.") :]: v
            for k, v in opts.items()
            if k.startswith("kafka.") and k != "kafka.bootstrap.servers"
        }
        cap, budget, min_partitions, max_records = (
            _positive_option(opts, name)
            for name in (
                "maxOffsetsPerTrigger",
                "lb.maxBytesPerTrigger",
                "minPartitions",
                "maxRecordsPerPartition",
            )
        )
        parse = opts.get("lb.parse")
        if cap is None:
            record_bytes = (
                int(json.loads(parse)["maxReportBytes"]) if parse else DEFAULT_MAX_REPORT_BYTES
            )
            cap = default_max_offsets_per_trigger(
                record_bytes, budget if budget is not None else DEFAULT_MAX_BYTES_PER_TRIGGER
            )
        return cls(
            bootstrap_servers=servers,
            topics=topics,
            client_config=client,
            starting_offsets=opts.get("startingoffsets", "earliest").strip(),
            max_offsets_per_trigger=cap,
            fail_on_data_loss=opts.get("failondataloss", "true").lower() != "false",
            poll_timeout_s=float(opts.get("kafkaconsumer.polltimeoutms", "120000")) / 1000.0,
            parse=parse,
            min_partitions=min_partitions,
            max_records_per_partition=max_records,
        )


def _positive_option(opts: Mapping[str, str], name: str) -> int | None:
    """The optional positive whole-number option ``name`` (``opts`` has lower-cased keys), or a
    ValueError that names it."""
    text = opts.get(name.lower())
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{FORMAT_NAME}: {name} must be a whole number, got {text!r}") from None
    if value <= 0:
        raise ValueError(f"{FORMAT_NAME}: {name} must be positive, got {value}")
    return value


class KafkaOffsetRange(InputPartition):
    """One Spark task: the records ``[start, end)`` of one Kafka partition."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end

    @property
    def size(self) -> int:
        """Records in the range (offsets, counting any gaps)."""
        return self.end - self.start


class LbKafkaDataSource(DataSource):
    """``spark.readStream.format("lbkafka")``: Kafka records with the built-in source's schema."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        if self.options.get("lb.parse"):
            from streaming.schema import PARSED_FIELDS, ddl

            return ddl(PARSED_FIELDS)
        return KAFKA_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return LbKafkaStreamReader(KafkaSourceConfig.from_options(self.options))


def register(spark: Any) -> str:
    """Register the source with ``spark`` (idempotent) and return its format name."""
    spark.dataSource.register(LbKafkaDataSource)
    return FORMAT_NAME


class LbKafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Driver side: offsets and planning. Holds no live client, so it stays picklable."""

    def __init__(self, config: KafkaSourceConfig) -> None:
        self.config = config
        self._target: Offsets | None = None  # end offsets fixed by trigger(availableNow=True)

    # --- offsets --------------------------------------------------------------------------
    def _earliest(self, topic: str) -> dict[str, int]:
        cfg = self.config
        offsets = earliest_offsets(cfg.bootstrap_servers, topic, cfg.client_config)
        return {str(p): o for p, o in offsets.items()}

    def _latest(self, topic: str) -> dict[str, int]:
        cfg = self.config
        offsets = latest_offsets(cfg.bootstrap_servers, topic, cfg.client_config)
        return {str(p): o for p, o in offsets.items()}

    def initialOffset(self) -> Offsets:
        spec = self.config.starting_offsets
        if spec.lower() == "earliest":
            return {t: self._earliest(t) for t in self.config.topics}
        if spec.lower() == "latest":
            return {t: self._latest(t) for t in self.config.topics}
        return self._resolve_json(json.loads(spec))

    def _resolve_json(self, spec: Mapping[str, Mapping[str, int]]) -> Offsets:
        resolved: Offsets = {}
        for topic in self.config.topics:
            given = {str(p): int(o) for p, o in spec.get(topic, {}).items()}
            earliest = self._earliest(topic)
            latest = self._latest(topic) if _LATEST in given.values() else {}
            offsets = {}
            for p in earliest:
                wanted = given.get(p, _EARLIEST)
                offsets[p] = {_EARLIEST: earliest[p], _LATEST: latest.get(p, 0)}.get(wanted, wanted)
            resolved[topic] = offsets
        return resolved

    def _filled_start(self, start: Offsets, end: Offsets) -> Offsets:
        """``start`` with partitions that appeared since (new topics/partitions) at earliest."""
        filled: Offsets = {}
        for topic, ends in end.items():
            begin = dict(start.get(topic, {}))
            if any(p not in begin for p in ends):
                earliest = self._earliest(topic)
                for p in ends:
                    begin.setdefault(p, earliest.get(p, 0))
            filled[topic] = begin
        return filled

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {t: self._latest(t) for t in self.config.topics}

    def getDefaultReadLimit(self) -> ReadLimit:
        cap = self.config.max_offsets_per_trigger
        return ReadMaxRows(cap) if cap else ReadAllAvailable()

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        start = start or {}
        if self._target is not None:
            end = {t: dict(o) for t, o in self._target.items()}
        else:
            end = {t: self._latest(t) for t in self.config.topics}
        begin = self._filled_start(start, end)
        self._check_data_loss(begin, end)
        if isinstance(limit, ReadMaxRows):
            end = _rate_limit(begin, end, limit.max_rows)
        return end

    def _check_data_loss(self, begin: Offsets, end: Offsets) -> None:
        """An end below the checkpointed start means the log was recreated or truncated.

        Typical cause: the embedded (in-memory) broker was restarted under an old checkpoint.
        Waiting until the new log passes the old offsets would silently skip records, so fail
        (``failOnDataLoss``, the default) or, when allowed, re-read the new log from earliest.
        """
        shrunk = [
            f"{t}[{p}]: checkpoint at {begin[t][p]}, log ends at {o}"
            for t, ends in end.items()
            for p, o in ends.items()
            if o < begin[t].get(p, 0)
        ]
        if not shrunk:
            return
        message = (
            "Kafka offsets went backwards (topic recreated or broker data lost): "
            + "; ".join(shrunk)
        )
        if self.config.fail_on_data_loss:
            raise DataLossError(
                message + ". Use a new checkpoint, or set failOnDataLoss=false to re-read."
            )
        log.warning("%s; re-reading those partitions from earliest", message)

    def partitions(self, start: Offsets, end: Offsets) -> list[KafkaOffsetRange]:
        begin = self._filled_start(start or {}, end)
        for topic, ends in end.items():  # a shrunk log (failOnDataLoss=false): from earliest
            if any(int(o) < int(begin[topic][p]) for p, o in ends.items()):
                earliest = self._earliest(topic)
                for p, o in ends.items():
                    if int(o) < int(begin[topic][p]):
                        begin[topic][p] = earliest.get(p, 0)
        ranges = [
            KafkaOffsetRange(topic, int(p), int(begin[topic][p]), int(stop))
            for topic, ends in sorted(end.items())
            for p, stop in sorted(ends.items(), key=lambda item: int(item[0]))
            if int(stop) > int(begin[topic][p])
        ]
        return divide_ranges(
            ranges, self.config.min_partitions, self.config.max_records_per_partition
        )

    def commit(self, end: Offsets) -> None:
        """Nothing to do: Spark's checkpoint holds the offsets; Kafka keeps no group state."""

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, KafkaOffsetRange)
        if self.config.parse:
            return kafka_reads.read_parsed_offset_range(self.config, partition)
        return kafka_reads.read_offset_range(self.config, partition)


def divide_ranges(
    ranges: list[KafkaOffsetRange],
    min_partitions: int | None = None,
    max_records_per_partition: int | None = None,
) -> list[KafkaOffsetRange]:
    """A batch's reading tasks: the built-in source's ``KafkaOffsetRangeCalculator``.

    Empty ranges are dropped. With ``max_records_per_partition``, a range of n records becomes
    ceil(n / cap) even pieces (integer division, the last piece taking the remainder). Then, if
    ``min_partitions`` asks for more tasks than that gives, each range whose share of the
    records, scaled to ``min_partitions``, rounds to 2 or more is cut into that many pieces;
    the ranges whose share rounds to 1 stay whole, and their records and count are left out of
    the others' shares. Pieces are contiguous and in order, so every offset is read once.
    """
    ranges = [r for r in ranges if r.size > 0]
    if max_records_per_partition is not None:
        cap = max_records_per_partition
        ranges = [p for r in ranges for p in _pieces(r, -(-r.size // cap))]
    if min_partitions is None or min_partitions <= len(ranges):
        return ranges
    total = sum(r.size for r in ranges)

    def share(size: int, of: int, parts: int) -> int:  # Scala's math.round: half up
        return max(math.floor(size / of * parts + 0.5), 1)

    whole = [share(r.size, total, min_partitions) == 1 for r in ranges]
    rest = total - sum(r.size for r, w in zip(ranges, whole, strict=True) if w)
    rest_parts = max(min_partitions - sum(whole), 1)
    return [
        p
        for r, w in zip(ranges, whole, strict=True)
        for p in _pieces(r, 1 if w else share(r.size, rest, rest_parts))
    ]


def _pieces(r: KafkaOffsetRange, parts: int) -> list[KafkaOffsetRange]:
    """``r`` cut into ``parts`` contiguous pieces by integer division (the last is the
    largest), without empty ones."""
    if parts <= 1:
        return [r]
    out, start, remaining = [], r.start, r.size
    for part in range(parts):
        size = remaining // (parts - part)
        remaining -= size
        if size:
            out.append(KafkaOffsetRange(r.topic, r.partition, start, start + size))
        start += size
    return out


def _rate_limit(begin: Offsets, end: Offsets, max_rows: int) -> Offsets:
    """Cap a batch at ``max_rows`` records, shared in proportion to each partition's backlog."""
    backlog = {(t, p): end[t][p] - begin[t].get(p, 0) for t in end for p in end[t] if end[t][p] > 0}
    total = sum(n for n in backlog.values() if n > 0)
    if total <= max_rows:
        return end
    capped = {t: dict(o) for t, o in end.items()}
    for (t, p), size in backlog.items():
        if size <= 0:
            continue
        share = max_rows * size / total
        step = math.ceil(share) if share < 1 else math.floor(share)
        capped[t][p] = min(end[t][p], begin[t].get(p, 0) + step)
    return capped
