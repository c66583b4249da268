"""A report's bundles as columns, and the whole-column form of the codec's per-bundle rules.

Why columns: decoding is the costliest per-record step of the streaming job, and the parse stage
wants the per-bundle figures as arrays. ``loadbalance.report_codec`` is the one decoder and the
one definition of a valid report; it produces ``ReportColumns`` (``decode_report_columns``) and
builds its ``LocalBrokerData`` from them (``decode_report``), so the two forms cannot disagree.

``bundle_columns`` is how the codec checks the common case fast: one regular-expression pass
over the names and a few NumPy operations over the stats, instead of a ``BundleRange`` and a
``NamespaceBundleStats`` per bundle (figures in docs/benchmarks.md). It is an accelerator, not a
second definition: it answers only when every bundle entry certainly passes the codec's
per-bundle rules with nothing to report, and then returns exactly what those rules would;
on any doubt it returns ``None`` and the codec applies its rules one bundle at a time (which
also names what it skipped or ignored). Each check here is a plain restatement of one codec
rule: every name (the ``lastStats`` keys and the ``bundles`` entries) already canonical
(``parse_bundle(n).name == n``: ``tenant/ns``, or a v1 heartbeat / SLA-monitor namespace),
lower bound below upper, no two ranges of a namespace overlapping, and every stats value an
object whose fields are absent or an ``int``/``float`` (never a ``bool``) that is finite,
non-negative, at most 2^53 and, for counts, whole. ``tests/unit/test_report_columns.py``
checks that it never answers differently from the per-bundle rules.
"""

from __future__ import annotations

import dataclasses
import hashlib
import operator
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from types import MappingProxyType
from typing import Any

import numpy as np

from loadbalance.model import LocalBrokerData, NamespaceBundleStats

__all__ = [
    "COUNT_FIELDS",
    "MAX_NUMBER",
    "VALUE_FIELDS",
    "KnownBundleLists",
    "ReportColumns",
    "bundle_columns",
    "columns_from_report",
    "columns_from_stats",
    "report_from_columns",
]

# Stats fields in column order: STAT_COLUMNS of ``streaming.shard_state`` (the argument order of
# ``TimeAverageMessageData.update_values``), then the three counts.
VALUE_FIELDS = ("msgThroughputIn", "msgThroughputOut", "msgRateIn", "msgRateOut")
COUNT_FIELDS = ("topics", "consumerCount", "producerCount")

# Above 2^53 a float no longer holds every integer; no real rate, count or usage gets near it,
# and the cap keeps sums of up to MAX_BUNDLES_PER_REPORT values finite.
_MAX_INT = 2**53
MAX_NUMBER = float(_MAX_INT)

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
# Every stats field of one bundle at once (a KeyError when one is absent: then field by field,
# with the codec's defaults).
_ALL_FIELDS = operator.itemgetter(*VALUE_FIELDS, *COUNT_FIELDS)
_WIDTH = len(VALUE_FIELDS) + len(COUNT_FIELDS)
# ``bool`` is a subclass of ``int`` but its own type here, so it is not among them.
_NUMBER_TYPES = frozenset((int, float))


@dataclass(frozen=True, slots=True)
class ReportColumns:
    """One decoded report: the broker's figures, and its bundles' figures as columns.

    ``head`` is the report with ``last_stats`` empty (``bundles`` is kept); ``names`` are the
    bundles with stats, in the order of the document (first spelling of each canonical name);
    ``values`` is float64 ``[m, 4]`` (msg_throughput_in, msg_throughput_out, msg_rate_in,
    msg_rate_out) and ``counts`` int64 ``[m, 3]`` (topics, consumer_count, producer_count). Two
    values are equal only if their arrays are equal bit for bit (same dtype, shape and bytes).
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


def columns_from_stats(
    stats: Iterable[NamespaceBundleStats],
) -> tuple[np.ndarray, np.ndarray]:
    """``values`` and ``counts`` of stats objects, in their order."""
    rows = list(stats)
    m = len(rows)
    values = np.array(
        [(s.msg_throughput_in, s.msg_throughput_out, s.msg_rate_in, s.msg_rate_out) for s in rows],
        dtype=np.float64,
    ).reshape(m, 4)
    counts = np.array(
        [(s.topics, s.consumer_count, s.producer_count) for s in rows], dtype=np.int64
    ).reshape(m, 3)
    return values, counts


def columns_from_report(report: LocalBrokerData) -> ReportColumns:
    """The columns of a report held as objects (a built or re-read ``LocalBrokerData``)."""
    values, counts = columns_from_stats(report.last_stats.values())
    head = dataclasses.replace(report, last_stats=MappingProxyType({}))
    return ReportColumns(head, list(report.last_stats), values, counts)


def report_from_columns(columns: ReportColumns) -> LocalBrokerData:
    """The report with one ``NamespaceBundleStats`` per row (float and int values exact)."""
    stats = {
        name: NamespaceBundleStats(
            msg_throughput_in=v[0],
            msg_throughput_out=v[1],
            msg_rate_in=v[2],
            msg_rate_out=v[3],
            topics=c[0],
            consumer_count=c[1],
            producer_count=c[2],
        )
        for name, v, c in zip(
            columns.names, columns.values.tolist(), columns.counts.tolist(), strict=True
        )
    }
    return dataclasses.replace(columns.head, last_stats=MappingProxyType(stats))


class KnownBundleLists:
    """Digests of the bundle lists ``bundle_columns`` has already found canonical and free of
    overlaps, so that the same lists are not checked again.

    Why: a broker names the same bundles, in the same order, in report after report, and the
    name check (a regular expression over every name, the bounds, a sort for overlaps) is a
    pure function of the two lists; its digest costs about a fifth of it. The digest is a
    SHA-256 of each list's length and its names joined by newlines, taken only when no
    name holds a newline (so the joined text names the list exactly). Lists that failed are
    not kept: they go to the codec's rules each time, as before. A reader keeps one instance
    (the streaming parse keeps one per worker process); it is emptied when it holds
    ``max_entries`` digests (32 bytes each).
    """

    __slots__ = ("_max_entries", "_seen")

    def __init__(self, max_entries: int = 200_000) -> None:
        self._seen: set[bytes] = set()
        self._max_entries = max_entries

    @staticmethod
    def key(names: list[str], listed: list[Any] | None) -> bytes | None:
        """The lists' digest, or ``None`` when a name holds a newline (a non-string raises
        ``TypeError``, which ``bundle_columns`` turns into "no answer")."""
        h = hashlib.sha256()  # with SHA instructions, twice as fast as BLAKE2b here
        for part in (names, listed):
            if part is None:
                h.update(b"-")
                continue
            text = "\n".join(part)
            if text.count("\n") != max(len(part) - 1, 0):
                return None
            h.update(b"%d:" % len(part))
            h.update(text.encode("utf-8", "surrogatepass"))
        return h.digest()

    def __contains__(self, key: bytes) -> bool:
        return key in self._seen

    def add(self, key: bytes) -> None:
        if len(self._seen) >= self._max_entries:
            self._seen.clear()
        self._seen.add(key)

    def __len__(self) -> int:
        return len(self._seen)


def bundle_columns(
    raw_stats: dict[Any, Any],
    raw_bundles: list[Any] | None,
    known: KnownBundleLists | None = None,
) -> tuple[list[str], np.ndarray, np.ndarray, frozenset[str]] | None:
    """``(names, values, counts, every bundle name)`` when every entry certainly passes the
    codec's per-bundle rules with nothing skipped or ignored, else ``None`` (see above).

    ``raw_stats`` is the ``lastStats`` object and ``raw_bundles`` the ``bundles`` list (or
    None), both already checked by the codec for their container type and size. ``known``
    skips the name check for lists it has passed before.
    """
    try:
        names = list(raw_stats)
        every = set(names) if raw_bundles is None else set(names).union(raw_bundles)
        if not _names_ok(names, raw_bundles, every, known):
            return None
        columns = _stats_columns(list(raw_stats.values()))
    except Exception:  # an unhashable entry, a non-string name: the codec's rules decide
        return None
    if columns is None:
        return None
    return names, columns[0], columns[1], frozenset(every)


def _names_ok(
    names: list[str], listed: list[Any] | None, every: set[str], known: KnownBundleLists | None
) -> bool:
    """``_ranges_ok`` over every name, or the memory of it in ``known``."""
    if known is None:
        return _ranges_ok(list(every))
    key = known.key(names, listed)
    if key is not None and key in known:
        return True
    if not _ranges_ok(list(every)):
        return False
    if key is not None:
        known.add(key)
    return True


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
    # The codec's overlap rule on the de-duplicated ranges: sorted by (namespace, lower, upper),
    # a range must not start before the previous one of its namespace ends.
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
    try:  # the common case, every field present: all of them in one pass over the bundles
        rows = list(map(_ALL_FIELDS, stats))
    except KeyError:
        return _stats_columns_by_field(stats)
    flat = chain.from_iterable(rows)
    if not set(map(type, flat)) <= _NUMBER_TYPES:
        return None
    try:
        table = np.fromiter(chain.from_iterable(rows), np.float64, m * _WIDTH).reshape(m, _WIDTH)
    except (OverflowError, ValueError, TypeError):  # an integer beyond the float range
        return None
    # NaN fails both comparisons, and infinities one of them
    if not bool(np.all((table >= 0.0) & (table <= MAX_NUMBER))):
        return None
    # 2^53 + 1 rounds onto 2^53 as a float: at 2^53, the number read must not be above it
    for i, j in np.argwhere(table == MAX_NUMBER).tolist():
        if rows[i][j] > _MAX_INT:
            return None
    values = np.ascontiguousarray(table[:, : len(VALUE_FIELDS)])
    whole = table[:, len(VALUE_FIELDS) :]
    if not bool(np.all(whole == np.floor(whole))):
        return None
    return values, whole.astype(np.int64)


def _stats_columns_by_field(stats: list[dict[Any, Any]]) -> tuple[np.ndarray, np.ndarray] | None:
    """``_stats_columns`` when some bundle lacks a field (the codec's defaults fill it)."""
    m = len(stats)
    fields = [[s.get(k, 0.0) for s in stats] for k in VALUE_FIELDS]
    fields += [[s.get(k, 0) for s in stats] for k in COUNT_FIELDS]
    values = np.empty((m, 4), dtype=np.float64)
    for j in range(len(VALUE_FIELDS)):
        col = _number_column(fields[j])
        if col is None:
            return None
        values[:, j] = col
    counts = np.empty((m, 3), dtype=np.int64)
    for j in range(len(COUNT_FIELDS)):
        col = _number_column(fields[len(VALUE_FIELDS) + j])
        if col is None or not bool(np.all(col == np.floor(col))):
            return None
        counts[:, j] = col.astype(np.int64)
    return values, counts


def _number_column(items: Sequence[Any]) -> np.ndarray | None:
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
