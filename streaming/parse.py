"""Decode and validate load reports on the executors; bad records become dead-letter rows.

Why here and like this: decoding is the costliest per-record step (a report carries thousands of
bundles), so it runs in ``mapInPandas`` on the executors, next to the source partitions. It uses
the columnar decoder ``loadbalance.report_codec.decode_report_columns``: the samples are arrays
anyway, and checking a report's bundles column by column is several times faster than building
one ``BundleRange`` and one ``NamespaceBundleStats`` per bundle (docs/benchmarks.md). It is the
codec's one decoder (``decode_report`` builds its objects from its output), so the stream
accepts, refuses and names exactly what every other reader of a report does.
The query must never fail on bad input, so every record is handled on its own: an
``InvalidInput`` becomes a dead letter with the codec's field and reason, and ANY other exception
becomes one with reason ``internal: <type>`` (a bug in our code must not stop the cluster's
balancing either). The size limit (``maxReportBytes``) is checked before anything else.

A good report becomes one ``report`` row for its broker's key and one ``samples`` row per shard
its bundles fall into (``streaming.schema``); the executors get only the picklable
``ParseSettings``, never a client. What the codec ignored in an accepted report (a broken
reading, an unusable bundle entry, a ``BrokerLoadData`` without bundles) rides along in the
report row's document as ``reportIssues`` (kind -> count) for the driver to count, and is
logged as a warning the first time a broker shows that kind of issue in this worker.

A dead letter is JSON: the raw value as base64 (cut to ``DEAD_LETTER_MAX_VALUE_BYTES`` so an
oversized record still fits in a Kafka message, with ``valueTruncated`` and ``valueBytes`` saying
so), the record key, topic, partition, offset and timestamp, and the ``field`` and ``reason``.
"""

from __future__ import annotations

import base64
import gc
import json
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from loadbalance.errors import InvalidInput
from loadbalance.report_codec import decode_report_columns, report_to_dict
from loadbalance.report_columns import KnownBundleLists, ReportColumns
from loadbalance.view import UsageWeights
from streaming import stage_timing
from streaming.schema import (
    BROKER_PREFIX,
    DEAD,
    DEAD_KEY,
    ISSUES_FIELD,
    PARSED_FIELDS,
    REPORT,
    SAMPLES,
    SHARD_PREFIX,
    ParsedRow,
    frame,
)
from streaming.shard_state import pack_encoded_samples, samples_names, shard_of

log = logging.getLogger("streaming.parse")

DEAD_LETTER_VERSION = 1
_WARNED_MAX = 10_000
_warned: set[tuple[str, str]] = set()
DEAD_LETTER_MAX_VALUE_BYTES = 64 * 1024
DEAD_LETTER_MAX_KEY_BYTES = 1024
"""At most this much of a rejected record's key is kept (a hostile key can be megabytes)."""


@dataclass(frozen=True, slots=True)
class ParseSettings:
    """What the executors need to parse: plain values only (pickled into the tasks)."""

    max_report_bytes: int
    n_shards: int
    weights: UsageWeights
    shard_keys: tuple[str, ...] = ()
    """The state key of each shard (``streaming.state_keys.shard_keys``); empty: ``s:<n>``."""

    def __post_init__(self) -> None:
        if self.shard_keys and len(self.shard_keys) != self.n_shards:
            raise ValueError(f"{len(self.shard_keys)} shard keys for {self.n_shards} shards")

    def shard_key(self, shard: int) -> str:
        return self.shard_keys[shard] if self.shard_keys else SHARD_PREFIX + str(shard)

    def to_json(self) -> str:
        """As a reader option of the Kafka source (``streaming.kafka_source``); floats by
        ``repr``, so they come back bit for bit."""
        doc: dict[str, Any] = {
            "maxReportBytes": self.max_report_bytes,
            "shards": self.n_shards,
            "weights": [getattr(self.weights, f) for f in _WEIGHT_FIELDS],
        }
        if self.shard_keys:
            doc["shardKeys"] = list(self.shard_keys)
        return json.dumps(doc)

    @classmethod
    def from_json(cls, text: str) -> ParseSettings:
        doc = json.loads(text)
        weights = UsageWeights(**dict(zip(_WEIGHT_FIELDS, map(float, doc["weights"]), strict=True)))
        keys = tuple(str(k) for k in doc.get("shardKeys", ()))
        return cls(int(doc["maxReportBytes"]), int(doc["shards"]), weights, keys)


_WEIGHT_FIELDS = ("cpu", "memory", "direct_memory", "bandwidth_in", "bandwidth_out")


def dead_letter(
    value: bytes | None,
    key: bytes | None,
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int,
    field: str,
    reason: str,
) -> bytes:
    """The dead-letter document for one rejected record."""
    raw = value or b""
    shown = raw[:DEAD_LETTER_MAX_VALUE_BYTES]
    doc = {
        "deadLetterVersion": DEAD_LETTER_VERSION,
        "topic": topic,
        "partition": int(partition),
        "offset": int(offset),
        "timestamp": int(timestamp_ms),
        # The key is capped like the value, so a dead letter always fits in a Kafka message.
        "key": key[:DEAD_LETTER_MAX_KEY_BYTES].decode("utf-8", "replace")
        if key is not None
        else None,
        "keyBytes": len(key) if key is not None else 0,
        "value": base64.b64encode(shown).decode(),
        "valueBytes": len(raw),
        "valueTruncated": len(shown) < len(raw),
        "field": field,
        "reason": reason,
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def _broker_id(key: bytes | None) -> str | None:
    if key is None or len(key) == 0:
        return None
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput("key", "record key is not UTF-8") from None


def _rows_of(
    columns: ReportColumns,
    settings: ParseSettings,
    event_ms: int,
    partition: int,
    offset: int,
) -> list[ParsedRow]:
    """The ``report`` row and the per-shard ``samples`` rows of one decoded report, the report
    row's document not yet written: its place holds the report's head (``finish_rows`` writes
    the document, or the issues alone, with ``_with_document`` or ``_with_issues_only``)."""
    head = columns.head
    broker = head.broker
    if head.issue_counts:
        _warn_issues(head)
    rows: list[ParsedRow] = [
        ParsedRow(
            BROKER_PREFIX + broker,
            REPORT,
            broker,
            event_ms,
            partition,
            offset,
            settings.weights.weighted_max(head),
            head.msg_throughput,
            settings.weights.weighted_max_uncapped(head),
            head,
        )
    ]
    names, values, counts = columns.names, columns.values, columns.counts
    if not names:
        return rows
    for shard, block in _sample_blocks(names, values, counts, settings.n_shards):
        rows.append(
            ParsedRow(
                settings.shard_key(shard),
                SAMPLES,
                broker,
                event_ms,
                partition,
                offset,
                0.0,
                0.0,
                0.0,
                block,
            )
        )
    return rows


def _with_document(row: ParsedRow) -> ParsedRow:
    """The report row with its document: the report without ``lastStats`` (the samples rows
    carry those), plus ``reportIssues`` when the codec ignored something in it."""
    head = row.payload
    doc = report_to_dict(head)  # the head's last_stats is empty, and not part of the row
    del doc["lastStats"]
    if head.issue_counts:
        doc[ISSUES_FIELD] = dict(head.issue_counts)
    return row._replace(payload=json.dumps(doc, separators=(",", ":")).encode())


def _with_issues_only(row: ParsedRow) -> ParsedRow:
    """The report row of a report whose document is dropped: what is kept is a document of its
    ``reportIssues`` alone, which the state step sums over the broker's reports of the batch
    (``None`` when it has none, the usual case)."""
    issues = row.payload.issue_counts
    return row._replace(
        payload=json.dumps({ISSUES_FIELD: dict(issues)}).encode() if issues else None
    )


class _ShardPlans:
    """Bundle names in report order -> which rows of the report go to which shard, with each
    shard's names part of the sample block already encoded.

    Why: a broker names the same bundles in the same order in report after report, and
    hashing 2,500 names to their shards, grouping them and encoding the names of each group
    costs about ten times the digest that finds the plan again. Keyed by a SHA-256 digest of
    the names (``KnownBundleLists.key``) and the shard count; emptied when the encoded names
    reach ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self._plans: dict[bytes, list[tuple[int, np.ndarray, tuple[bytes, int]]]] = {}
        self._bytes = 0
        self._max_bytes = max_bytes

    def plan(
        self, names: list[str], n_shards: int
    ) -> list[tuple[int, np.ndarray, tuple[bytes, int]]]:
        digest = KnownBundleLists.key(names, None)
        key = None if digest is None else digest + n_shards.to_bytes(4, "little")
        found = None if key is None else self._plans.get(key)
        if found is not None:
            return found
        shards = np.array(_shards_of(names, n_shards), dtype=np.int64)
        order = np.argsort(shards, kind="stable")
        bounds = np.flatnonzero(np.diff(shards[order])) + 1
        made = []
        size = 0
        for part in np.split(order, bounds):
            encoded = samples_names([names[i] for i in part.tolist()])
            made.append((int(shards[part[0]]), part, encoded))
            size += len(encoded[0]) + part.nbytes
        if key is not None:
            if self._bytes + size > self._max_bytes:
                self._plans.clear()
                self._bytes = 0
            self._plans[key] = made
            self._bytes += size
        return made


_PLANS_MAX_BYTES = 128 * 1024 * 1024
_plans = _ShardPlans(_PLANS_MAX_BYTES)
_known_lists = KnownBundleLists()
"""Per worker process: the bundle lists already checked (``decode_report_columns``)."""


def _sample_blocks(
    names: list[str], values: np.ndarray, counts: np.ndarray, n_shards: int
) -> Iterator[tuple[int, bytes]]:
    """``(shard, sample block)`` for each shard the report's bundles fall into, by shard."""
    for shard, part, encoded in _plans.plan(names, n_shards):
        yield shard, pack_encoded_samples(encoded, values[part], counts[part])


_SHARD_CACHE_MAX = 4_000_000
_shard_cache: dict[int, dict[str, int]] = {}
"""n_shards -> bundle name -> its shard, per worker process. Why: a broker names the same
bundles in every report, and a dictionary lookup over the whole list (in C) costs a tenth of
hashing each name again; emptied when it holds ``_SHARD_CACHE_MAX`` names (about 400 MB)."""


def _shards_of(names: list[str], n_shards: int) -> list[int]:
    """``shard_of`` of each name, from the worker's cache where it has them."""
    cache = _shard_cache.setdefault(n_shards, {})
    shards = list(map(cache.get, names))
    if None in shards:
        if len(cache) + len(names) > _SHARD_CACHE_MAX:
            cache.clear()
        for i, (name, shard) in enumerate(zip(names, shards, strict=True)):
            if shard is None:
                shards[i] = cache[name] = shard_of(name, n_shards)
    return shards


def _warn_issues(head: Any) -> None:
    """One warning per broker and kind of issue in this worker (a broker repeats its fault in
    every report; the counts in the row carry every occurrence)."""
    for issue in head.issues:
        if (head.broker, issue.kind) in _warned:
            continue
        if len(_warned) < _WARNED_MAX:
            _warned.add((head.broker, issue.kind))
        total = dict(head.issue_counts).get(issue.kind, 1)
        log.warning(
            "report of %s: %s (%d in this report): %s: %s",
            head.broker,
            issue.kind,
            total,
            issue.field,
            issue.reason,
        )


def parse_record(
    value: bytes | None,
    key: bytes | None,
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int,
    settings: ParseSettings,
) -> list[ParsedRow]:
    """Rows for one Kafka record; never raises."""
    return finish_rows(_record_rows(value, key, topic, partition, offset, timestamp_ms, settings))


def _record_rows(
    value: bytes | None,
    key: bytes | None,
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int,
    settings: ParseSettings,
) -> list[ParsedRow]:
    """``parse_record`` with a report row's document not yet written (``_rows_of``)."""
    try:
        # the size limit is checked before anything is parsed
        columns = decode_report_columns(
            value, _broker_id(key), max_bytes=settings.max_report_bytes, known=_known_lists
        )
        return _rows_of(columns, settings, timestamp_ms, partition, offset)
    except InvalidInput as e:
        field, reason = e.field, e.reason
    except Exception as e:  # one bad record must never stop the query
        field, reason = "", f"internal: {type(e).__name__}"
    doc = dead_letter(value, key, topic, partition, offset, timestamp_ms, field, reason)
    return [ParsedRow(DEAD_KEY, DEAD, "", timestamp_ms, partition, offset, 0.0, 0.0, 0.0, doc)]


def parse_records(
    values: list[Any],
    keys: list[Any],
    topics: list[str],
    partitions: list[int],
    offsets: list[int],
    timestamps_ms: list[int],
    settings: ParseSettings,
) -> list[ParsedRow]:
    """Parsed rows for a run of Kafka records (columns of equal length); never raises.

    Only each broker's latest report of the run, by ``(event_ms, partition, offset)``, gets its
    document in its ``report`` row; the others carry ``None`` there. Why: the state step keeps
    every report's usage and throughput but passes on only the document of a broker's latest
    report in the batch, and the document (the broker's whole bundle list) is the largest part
    of the row, and writing it a fifth of a report's parse; during a catch-up a run holds many
    reports of each broker, whose documents would be shuffled to the state step only to be
    dropped. The latest report of a batch is the latest of the run it came in, so it always
    has its document. A run whose latest report Spark drops as late has only late reports of
    that broker (they are not newer), so none is lost. A report without its document that
    lists ``reportIssues`` gets a document of those alone, so that the issues are still
    counted."""
    return finish_rows(
        decode_records(values, keys, topics, partitions, offsets, timestamps_ms, settings)
    )


def decode_records(
    values: list[Any],
    keys: list[Any],
    topics: list[str],
    partitions: list[int],
    offsets: list[int],
    timestamps_ms: list[int],
    settings: ParseSettings,
) -> list[ParsedRow]:
    """The first half of ``parse_records``: every record decoded, the report rows' documents
    not yet written (``finish_rows`` writes them over the whole run, which may be several
    calls of this put together).

    The collector is paused over the records: the decoded documents are tens of thousands of
    short-lived objects per report, freed by reference counting, and the collections they would
    set off walk everything the worker keeps alive."""
    rows: list[ParsedRow] = []
    with _collector_paused():
        for value, key, topic, partition, offset, ts in zip(
            values, keys, topics, partitions, offsets, timestamps_ms, strict=True
        ):
            rows.extend(
                _record_rows(
                    _bytes(value), _bytes(key), topic, partition, offset, int(ts), settings
                )
            )
    return rows


def finish_rows(rows: list[ParsedRow]) -> list[ParsedRow]:
    """The second half of ``parse_records``: each broker's latest report row of ``rows`` gets
    its document, the other report rows their issues alone (in place; ``rows`` is returned)."""
    latest: dict[str, int] = {}
    for i, row in enumerate(rows):
        if row.kind == REPORT:
            j = latest.get(row.key)
            if j is None or _order(row) > _order(rows[j]):
                latest[row.key] = i
    keep = set(latest.values())
    for i, row in enumerate(rows):
        if row.kind == REPORT:
            rows[i] = _with_document(row) if i in keep else _with_issues_only(row)
    return rows


def _order(row: ParsedRow) -> tuple[int, int, int]:
    """Where a row stands in report order: ``(event_ms, partition, offset)``."""
    return row.event_ms, row.partition, row.offset


@contextmanager
def _collector_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def parsed_arrow_batch(rows: list[ParsedRow]) -> Any:
    """``rows`` (``PARSED_FIELDS``) as one Arrow record batch (the Kafka source's output when
    it parses as it reads)."""
    import pyarrow as pa

    schema = parsed_arrow_schema()
    columns = list(zip(*rows, strict=True)) if rows else [[] for _ in PARSED_FIELDS]
    arrays = [
        _binary_array(pa, c) if f.type == pa.binary() else pa.array(list(c), type=f.type)
        for c, f in zip(columns, schema, strict=True)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _binary_array(pa: Any, values: Sequence[bytes | None]) -> Any:
    """``pa.array(values, pa.binary())`` built from its buffers: the payloads are most of the
    batch's bytes (hundreds of KB per report), and one join copies them once, where the
    array builder grows its buffer step by step (about 5 times slower here)."""
    present = [v for v in values if v is not None]
    data = b"".join(present)
    if len(data) >= 2**31:
        return pa.array(list(values), type=pa.binary())  # too large for int32 offsets: chunked
    sizes = np.fromiter((len(v) if v is not None else 0 for v in values), np.int32, len(values))
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum(sizes, out=offsets[1:])
    validity = None
    nulls = len(values) - len(present)
    if nulls:
        valid = np.fromiter((v is not None for v in values), np.bool_, len(values))
        validity = pa.py_buffer(np.packbits(valid, bitorder="little").tobytes())
    buffers = [validity, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.binary(), len(values), buffers, null_count=nulls)


def parsed_arrow_schema() -> Any:
    import pyarrow as pa

    types = {
        "string": pa.string(),
        "bigint": pa.int64(),
        "int": pa.int32(),
        "double": pa.float64(),
        "binary": pa.binary(),
    }
    return pa.schema([(name, types[kind]) for name, kind in PARSED_FIELDS])


def parse_batches(
    settings: ParseSettings,
) -> Any:
    """The ``mapInPandas`` function: Kafka rows (key, value, topic, partition, offset,
    timestamp_ms) in, parsed rows (``streaming.schema.PARSED_FIELDS``) out."""
    names = [n for n, _ in PARSED_FIELDS]

    def run(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for pdf in batches:
            clock = stage_timing.Clock()
            rows = parse_records(
                pdf["value"].tolist(),
                pdf["key"].tolist(),
                pdf["topic"].tolist(),
                pdf["partition"].tolist(),
                pdf["offset"].tolist(),
                pdf["timestamp_ms"].tolist(),
                settings,
            )
            out = pd.DataFrame.from_records(rows, columns=names) if rows else None
            if out is None:
                out = frame(PARSED_FIELDS, 0)
            clock.record("parse", len(pdf))
            yield out

    return run


def _bytes(v: Any) -> bytes | None:
    if v is None:
        return None
    if isinstance(v, float):  # pandas' missing value
        return None
    return bytes(v)
