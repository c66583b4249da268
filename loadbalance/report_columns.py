"""Decode a load report straight into columns: the per-bundle figures as NumPy arrays.

Why: decoding is the costliest per-record step of the streaming job. ``decode_report`` validates
a report one bundle at a time, building a ``BundleRange`` and a ``NamespaceBundleStats`` per
bundle, and the parse stage would turn those objects back into arrays anyway.
``decode_report_columns`` checks the same rules on whole columns with one regular-expression
pass and a few NumPy operations, several times faster for a report of thousands of bundles
(figures in docs/benchmarks.md), and hands the parse stage the arrays it needs.

The codec stays the single definition of a valid report. The fast path here accepts only the
common case, each of whose rules is a plain restatement of the codec's: a ``LocalBrokerData``
document (``report_type_of``; the simple and extensible managers' documents take the codec),
every bundle name (the ``lastStats`` keys and the ``bundles`` entries) already in canonical form
(``parse_bundle(n).name == n``: ``tenant/ns``, or a v1 heartbeat / SLA-monitor namespace),
lower bound below upper, no two ranges of a namespace overlapping, every stats value an object
whose fields are absent or an ``int``/``float`` (never a ``bool``) that is finite, non-negative,
at most 2^53 and, for counts, whole; the rest of the report (everything but ``lastStats`` and
``bundles``) goes through ``report_from_dict`` itself. A report with a bundle entry the codec
would skip or a stats entry it would ignore is therefore off the fast path, and the codec's
result, issues included, is the answer.
On any doubt, a failed check, an unusual type or any exception, the already parsed document goes
through the codec (``report_from_document``) and is converted with ``columns_from_report``, so
every rejection is the codec's own ``InvalidReport`` and nothing the codec refuses is accepted.
The contract, checked by differential tests: for every input, ``decode_report_columns`` raises
what ``decode_report`` raises, or returns exactly
``columns_from_report(decode_report(raw, broker_id, max_bytes=max_bytes))``.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from loadbalance.model import LOCAL_BROKER_DATA, LocalBrokerData
from loadbalance.report_codec import (
    DEFAULT_MAX_REPORT_BYTES,
    MAX_BUNDLES_PER_REPORT,
    MAX_NUMBER,
    load_report_document,
    report_from_dict,
    report_from_document,
    report_type_of,
)

# Stats fields in column order: STAT_COLUMNS of ``streaming.shard_state`` (the argument order of
# ``TimeAverageMessageData.update_values``), then the three counts.
VALUE_FIELDS = ("msgThroughputIn", "msgThroughputOut", "msgRateIn", "msgRateOut")
COUNT_FIELDS = ("topics", "consumerCount", "producerCount")

# One canonical bundle name per line, each line ending in "\n". The character class is
# ``bundles._NAMESPACE_PART_RE``'s (printable ASCII, no "/" and no newline); the range is
# lowercase, as ``format_range`` prints it, so a matching name is its own canonical name. The
# three-part namespaces are ``bundles``' v1 heartbeat and SLA-monitor patterns restricted to
# that class (``[^:]+:\d+`` becomes host-without-colon ":" digits).
_PART = r"[A-Za-z0-9_.=:\-]+"
_HOST_PORT = r"[A-Za-z0-9_.=\-]+:[0-9]+"
_NAMESPACE = rf"(?:{_PART}/{_PART}|pulsar/{_PART}/{_HOST_PORT}|sla-monitor/{_PART}/{_HOST_PORT})"
_CANONICAL_LINES = re.compile(rf"(?:{_NAMESPACE}/0x[0-9a-f]{{8}}_0x[0-9a-f]{{8}}\n)*")
# "ns/0xLLLLLLLL_0xUUUUUUUU\n": offsets from the newline of the hex digits of each bound.
_LOWER_AT = np.arange(-19, -11)
_UPPER_AT = np.arange(-8, 0)
_SUFFIX_CHARS = len("/0x00000000_0x00000000")
_NIBBLE = np.zeros(256, dtype=np.int64)
_NIBBLE[np.frombuffer(b"0123456789abcdef", dtype=np.uint8)] = np.arange(16)
_SHIFTS = np.arange(28, -1, -4, dtype=np.int64)
_MAX_INT = 2**53


@dataclass(frozen=True, slots=True)
class ReportColumns:
    """One decoded report: the broker's figures, and its bundles' figures as columns.

    ``head`` is the report with ``last_stats`` empty (``bundles`` is kept); ``names`` are the
    bundles of ``lastStats`` in the order the codec gives them; ``values`` is float64 ``[m, 4]``
    (msg_throughput_in, msg_throughput_out, msg_rate_in, msg_rate_out) and ``counts`` int64
    ``[m, 3]`` (topics, consumer_count, producer_count). Two values are equal only if their
    arrays are equal bit for bit (same dtype, shape and bytes).
    """

    head: LocalBrokerData
    names: list[str]
    values: np.ndarray
    counts: np.ndarray

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ReportColumns):
            return NotImplemented
        return (
            self.head == other.head
            and self.names == other.names
            and _same_array(self.values, other.values)
            and _same_array(self.counts, other.counts)
        )


def _same_array(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def columns_from_report(report: LocalBrokerData) -> ReportColumns:
    """The columns of a report already decoded into objects (the slow path's conversion)."""
    stats = report.last_stats
    m = len(stats)
    values = np.array(
        [
            (s.msg_throughput_in, s.msg_throughput_out, s.msg_rate_in, s.msg_rate_out)
            for s in stats.values()
        ],
        dtype=np.float64,
    ).reshape(m, 4)
    counts = np.array(
        [(s.topics, s.consumer_count, s.producer_count) for s in stats.values()], dtype=np.int64
    ).reshape(m, 3)
    head = dataclasses.replace(report, last_stats=MappingProxyType({}))
    return ReportColumns(head, list(stats), values, counts)


def decode_report_columns(
    raw: bytes | str,
    broker_id: str | None = None,
    *,
    max_bytes: int = DEFAULT_MAX_REPORT_BYTES,
) -> ReportColumns:
    """``columns_from_report(decode_report(raw, broker_id, max_bytes=max_bytes))``, faster.

    Raises exactly what ``decode_report`` raises.
    """
    doc = load_report_document(raw, max_bytes=max_bytes)
    try:
        fast = _fast_columns(doc, broker_id)
    except Exception:  # any doubt: the codec decides, and names the problem
        fast = None
    if fast is not None:
        return fast
    return columns_from_report(report_from_document(doc, broker_id))


def _fast_columns(doc: dict[str, Any], broker_id: str | None) -> ReportColumns | None:
    """The common case's columns, or ``None`` when the codec must look at the document."""
    if report_type_of(doc) != LOCAL_BROKER_DATA:
        return None
    raw_stats = doc.get("lastStats")
    if raw_stats is None:
        raw_stats = {}
    raw_bundles = doc.get("bundles")
    if type(raw_stats) is not dict or not (raw_bundles is None or type(raw_bundles) is list):
        return None
    if len(raw_stats) > MAX_BUNDLES_PER_REPORT:
        return None
    names = list(raw_stats)
    if raw_bundles is None:
        every = set(names)
    else:
        if len(raw_bundles) > MAX_BUNDLES_PER_REPORT:
            return None
        every = set(names).union(raw_bundles)  # a list or dict entry raises: the codec decides
    if not _ranges_ok(list(every)):
        return None
    columns = _stats_columns(list(raw_stats.values()))
    if columns is None:
        return None
    values, counts = columns
    head_doc = dict(doc)
    head_doc.pop("lastStats", None)
    head_doc.pop("bundles", None)
    # raises on a bad head: the codec decides
    head = report_from_dict(head_doc, broker_id, report_type=LOCAL_BROKER_DATA)
    head = dataclasses.replace(head, bundles=frozenset(every))
    return ReportColumns(head, names, values, counts)


def _ranges_ok(unique: list[str]) -> bool:
    """Every name canonical with lower < upper, and no two ranges of a namespace overlapping."""
    if not unique:
        return True
    joined = "\n".join(unique) + "\n"  # a non-string entry raises TypeError
    if joined.count("\n") != len(unique):  # a newline inside a name would fake two lines
        return False
    if _CANONICAL_LINES.fullmatch(joined) is None:
        return False
    buf = np.frombuffer(joined.encode("ascii"), dtype=np.uint8)
    ends = np.flatnonzero(buf == 0x0A)
    lower = _NIBBLE[buf[ends[:, None] + _LOWER_AT]] << _SHIFTS
    upper = _NIBBLE[buf[ends[:, None] + _UPPER_AT]] << _SHIFTS
    lower, upper = lower.sum(axis=1), upper.sum(axis=1)
    if not bool(np.all(lower < upper)):
        return False
    # _check_no_overlap on the de-duplicated ranges: sorted by (namespace, lower, upper), a range
    # must not start before the previous one of its namespace ends.
    spaces = [n[:-_SUFFIX_CHARS] for n in unique]
    code = {ns: i for i, ns in enumerate(sorted(set(spaces)))}
    ns = np.fromiter(map(code.__getitem__, spaces), dtype=np.int64, count=len(spaces))
    order = np.lexsort((upper, lower, ns))
    ns, lower, upper = ns[order], lower[order], upper[order]
    overlap = (ns[1:] == ns[:-1]) & (lower[1:] < upper[:-1])
    return not bool(overlap.any())


def _stats_columns(stats: list[Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """``values`` float64 [m, 4] and ``counts`` int64 [m, 3], or ``None`` on any doubt."""
    m = len(stats)
    if m == 0:
        return np.zeros((0, 4), dtype=np.float64), np.zeros((0, 3), dtype=np.int64)
    if set(map(type, stats)) != {dict}:
        return None
    values = np.empty((m, 4), dtype=np.float64)
    for j, key in enumerate(VALUE_FIELDS):
        col = _number_column([s.get(key, 0.0) for s in stats])
        if col is None:
            return None
        values[:, j] = col
    counts = np.empty((m, 3), dtype=np.int64)
    for j, key in enumerate(COUNT_FIELDS):
        col = _number_column([s.get(key, 0) for s in stats])
        if col is None or not bool(np.all(col == np.floor(col))):
            return None
        counts[:, j] = col.astype(np.int64)
    return values, counts


def _number_column(items: list[Any]) -> np.ndarray | None:
    """``float(v)`` of each item as the codec's ``_number`` would accept it, or ``None``."""
    types = set(map(type, items))
    if int in types:
        if not types <= {int, float}:
            return None
        ints = items if len(types) == 1 else [v for v in items if type(v) is int]
        # Integers in [0, 2^53] convert exactly whichever way; any other goes to the codec
        # (float() of a huge one overflows, and 2^53 + 1 rounds down to 2^53 there).
        if min(ints) < 0 or max(ints) > _MAX_INT:
            return None
    elif types != {float}:
        return None
    col = np.array(items, dtype=np.float64)
    # NaN fails both comparisons, and infinities one of them
    if not bool(np.all((col >= 0.0) & (col <= MAX_NUMBER))):
        return None
    return col
