"""Executor side of the Kafka source (``streaming.kafka_source``): one task's offset range read
into Arrow batches, as records or already parsed.

Why a module of its own: this is what runs in every reading task, on the executors, and what a
catch-up's throughput depends on (fetch sizes, how many records a poll takes, how many value
bytes a batch holds); the driver side (offsets, ranges, rate limits) changes for other reasons.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from types import MappingProxyType
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from infra.topics import kafka_client_config
from streaming import stage_timing


class ReaderConfig(Protocol):
    """What a reading task needs of the source's ``ReaderConfig`` (named here by shape,
    so the executor side does not import the driver side)."""

    @property
    def bootstrap_servers(self) -> str: ...
    @property
    def client_config(self) -> dict[str, str]: ...
    @property
    def fail_on_data_loss(self) -> bool: ...
    @property
    def poll_timeout_s(self) -> float: ...
    @property
    def parse(self) -> str | None: ...


class OffsetRange(Protocol):
    """One task's records ``[start, end)`` of one partition (``OffsetRange``)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def start(self) -> int: ...
    @property
    def end(self) -> int: ...
    @property
    def size(self) -> int: ...


__all__ = ["read_offset_range", "read_parsed_offset_range"]

_ARROW_BATCH_ROWS = 10_000
_ARROW_BATCH_BYTES = 64 * 1024 * 1024
"""A task hands its records on in batches of at most this many value bytes (or rows): reports
are hundreds of KB, so a row cap alone would hold gigabytes of a catch-up in one batch."""
_PARSE_CHUNK_BYTES = 8 * 1024 * 1024
"""The parsing reader takes records from the consumer this many value bytes at a time
(``read_parsed_offset_range``)."""
_CONSUME_ROWS = 100
_FETCH_BYTES = 64 * 1024 * 1024
"""librdkafka's per-partition and per-request fetch sizes, unless the client config sets them:
at the default 1 MB per partition a reader gets one report per round trip (a third slower)."""
# librdkafka timestamp types -> Kafka's TimestampType ids, as the built-in source reports them
_TIMESTAMP_TYPE = MappingProxyType({0: -1, 1: 0, 2: 1})


def _reader_consumer_config(config: ReaderConfig) -> dict[str, Any]:
    client = kafka_client_config(config.bootstrap_servers, config.client_config)
    client.setdefault("group.id", f"lb-reader-{uuid.uuid4().hex[:12]}")
    client.setdefault("max.partition.fetch.bytes", _FETCH_BYTES)
    client.setdefault("fetch.max.bytes", _FETCH_BYTES)
    client.update(
        {
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 100,
            "auto.offset.reset": "error" if config.fail_on_data_loss else "earliest",
        }
    )
    return client


def read_offset_range(config: ReaderConfig, part: OffsetRange) -> Iterator[Any]:
    """Executor side: yield Arrow record batches with the records ``[start, end)`` of a partition.

    Stops at the first record at or beyond ``end`` or at an end-of-partition event at or beyond
    ``end``, so gaps (transaction markers, compaction) cannot make a task wait forever.
    """
    # pyarrow: only executors reading a partition need it; the driver registers the source
    # without loading it
    import pyarrow as pa

    schema = _record_schema(pa)
    for columns in _read_columns(config, part):
        yield pa.RecordBatch.from_pydict(columns, schema=schema)


def _read_columns(
    config: ReaderConfig, part: OffsetRange, chunk_bytes: int = _ARROW_BATCH_BYTES
) -> Iterator[dict[str, list]]:
    """``read_offset_range``'s records as Python lists by column (``_record_schema``'s names;
    ``timestamp`` in microseconds or None), in runs of at most ``_ARROW_BATCH_ROWS`` records or
    ``chunk_bytes`` of values."""
    columns: dict[str, list[Any]] = {name: [] for name in _RECORD_COLUMNS}

    def flush() -> dict[str, list[Any]]:
        out = {name: list(values) for name, values in columns.items()}
        for values in columns.values():
            values.clear()
        return out

    clock = stage_timing.Clock()  # this function's own time, without the waits at its yields
    consumer = Consumer(_reader_consumer_config(config))
    try:
        consumer.assign([TopicPartition(part.topic, part.partition, part.start)])
        done = part.start >= part.end
        last_progress = time.monotonic()
        next_offset = part.start
        size = held = 0  # value bytes of the rows held, and how many rows were counted
        read_records = read_bytes = 0
        while not done:
            want = _how_many(part.end - next_offset, chunk_bytes - size, read_records, read_bytes)
            messages = consumer.consume(num_messages=want, timeout=1.0)
            if not messages and time.monotonic() - last_progress > config.poll_timeout_s:
                raise TimeoutError(
                    f"{part.topic}[{part.partition}]: no records for {config.poll_timeout_s}s "
                    f"while reading [{part.start}, {part.end})"
                )
            done, last = _take(messages, part, columns)
            if last is not None:
                next_offset = last + 1
                last_progress = time.monotonic()
            taken = sum(len(v) for v in columns["value"][held:] if v is not None)
            read_records += len(columns["offset"]) - held
            read_bytes += taken
            size += taken
            held = len(columns["offset"])
            if held >= _ARROW_BATCH_ROWS or size >= chunk_bytes:
                size = held = 0
                batch = flush()
                clock.pause()
                yield batch
                clock.resume()
        if columns["offset"]:
            batch = flush()
            clock.pause()
            yield batch
            clock.resume()
    finally:
        consumer.close()
        clock.record("source", part.size)


def _how_many(remaining: int, room: int, read_records: int, read_bytes: int) -> int:
    """How many records to ask ``consume()`` for: no more than the range still holds
    (``remaining``), since it returns only once it has that many or its timeout passed, and
    asking for a full Arrow batch made every task of a small micro-batch wait the whole second
    (the job's latency floor); at most ``_CONSUME_ROWS``, and about what fills the ``room``
    left in the chunk at the mean record size so far, so a chunk stays near its byte cap."""
    want = max(1, min(_CONSUME_ROWS, remaining))
    if read_records and read_bytes:
        want = min(want, max(1, room * read_records // read_bytes))
    return want


def read_parsed_offset_range(config: ReaderConfig, part: OffsetRange) -> Iterator[Any]:
    """``read_offset_range``, each batch decoded into the parse stage's rows (option
    ``lb.parse``): the same rows ``streaming.parse.parse_batches`` makes of the same records.

    The records go to the parse as the Python values the consumer gave (an Arrow batch of them
    would copy every value in and out again), and are taken from the consumer a few at a time
    (``_PARSE_CHUNK_BYTES``) while the rows are put out in runs as large as the unparsed
    reader's (``_ARROW_BATCH_BYTES``). Why: the consumer fetches ahead only while its queue
    has room, so taking what it holds in small pieces keeps it fetching while the reports
    are decoded (taking 64 MB at once left the task waiting on each next fetch, about a fifth
    of a catch-up batch); and a run keeps only each broker's latest report document
    (``parse_records``), so runs of 64 MB send fewer documents on."""
    from streaming.parse import ParseSettings, decode_records, finish_rows, parsed_arrow_batch

    assert config.parse is not None
    settings = ParseSettings.from_json(config.parse)
    rows: list[Any] = []
    size = records = 0
    for columns in _read_columns(config, part, chunk_bytes=_PARSE_CHUNK_BYTES):
        clock = stage_timing.Clock()
        rows += decode_records(
            columns["value"],
            columns["key"],
            columns["topic"],
            columns["partition"],
            columns["offset"],
            [t // 1000 if t is not None else 0 for t in columns["timestamp"]],
            settings,
        )
        records += len(columns["offset"])
        size += sum(len(v) for v in columns["value"] if v is not None)
        if size >= _ARROW_BATCH_BYTES or len(rows) >= _ARROW_BATCH_ROWS:
            out = parsed_arrow_batch(finish_rows(rows))
            clock.record("parse", records)
            rows, size, records = [], 0, 0
            yield out
        else:
            clock.record("parse", 0)
    if rows or records:
        clock = stage_timing.Clock()
        out = parsed_arrow_batch(finish_rows(rows))
        clock.record("parse", records)
        yield out


def _record_schema(pa: Any) -> Any:
    """The Arrow schema of the records ``read_offset_range`` yields (KAFKA_SCHEMA's columns)."""
    types = (pa.binary(), pa.binary(), pa.string(), pa.int32(), pa.int64(),
             pa.timestamp("us", tz="UTC"), pa.int32())  # fmt: skip
    return pa.schema(list(zip(_RECORD_COLUMNS, types, strict=True)))


_RECORD_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType")
"""The columns of the records the reader takes (``_read_columns``), in ``_record_schema``'s
order."""


def _take(
    messages: list[Any], part: OffsetRange, columns: dict[str, list[Any]]
) -> tuple[bool, int | None]:
    """Append the records of ``messages`` inside the range to ``columns``; whether the range is
    read to its end, and the last offset appended (None if none was)."""
    last = None
    for message in messages:
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                if message.offset() >= part.end:
                    return True, last
                continue
            raise KafkaException(error)
        offset = message.offset()
        if offset >= part.end:
            return True, last
        last = offset
        ts_type, ts_ms = message.timestamp()
        columns["key"].append(message.key())
        columns["value"].append(message.value())
        columns["topic"].append(part.topic)
        columns["partition"].append(part.partition)
        columns["offset"].append(offset)
        columns["timestamp"].append(ts_ms * 1000 if ts_type else None)
        columns["timestampType"].append(_TIMESTAMP_TYPE.get(ts_type, -1))
        if offset >= part.end - 1:
            return True, last
    return False, last
