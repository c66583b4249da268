"""Decode Pulsar load reports of all three load managers, with validation.

Field names are Pulsar's (as written under ``/loadbalance/brokers/<broker>``, printed by
``pulsar-admin broker-stats load-report`` or published on the extensible manager's
``loadbalancer-broker-load-data`` topic); unknown fields are ignored so a real broker's report is
accepted as it is. Three documents are read (``report_type_of`` tells them apart):

* ``LocalBrokerData`` (modular manager, the default): resources, rates, ``bundles`` and
  ``lastStats`` as they are.
* ``LoadReport`` (simple manager, ``"loadReportType": "LoadReport"``): resources from
  ``systemResourceUsage`` (else the top-level copies Jackson also writes), bundle stats from
  ``bundleStats``, the broker totals summed from them as ``LoadReport``'s getters do (its
  ``msgThroughputIn`` getter returns the msg *rate*, so the written field is not used),
  ``timestamp`` as the update time.
* ``BrokerLoadData`` (extensible manager): resources and rates, ``bundleCount``, ``topics``,
  ``updatedAt``. It names no bundles, so the report carries a ``no_bundle_data`` issue: bundle-
  level policies cannot act on that broker.

What is refused, what is ignored. The document as a whole must be sound: size limit (checked
before parsing), strict UTF-8 and valid Unicode, a JSON object, a usable broker id, top-level
totals finite, non-negative and below ``MAX_NUMBER`` (so sums downstream stay finite),
``lastStats``/``bundles`` of the right container types and sizes, and no two bundles of a
namespace overlapping (a broker cannot own both a bundle and a piece of it). Everything smaller
is judged per item and never sinks the rest of a report; each such item becomes a ``ReportIssue``
on the result, for the shell to count and log:

* a resource with a negative usage or a limit <= 0 is *unknown* (Pulsar's ``-1``): kept as
  given, left out of the max-usage computation, not an issue;
* a resource that is not an object, holds a non-number, a non-finite or huge value, or reads
  more than ``MAX_USAGE_OVER_LIMIT`` times its limit (a broken sensor, not an overload) is
  replaced by ``UNKNOWN_USAGE`` (``reading_ignored``);
* a bundle name that is not a valid bundle is skipped (``bundle_skipped``); a bundle whose stats
  are unusable keeps its place in ``bundles`` but loses its stats (``reading_ignored``).

At most ``MAX_LISTED_ISSUES`` issues are kept (``issue_counts`` has all of them by kind). Every
rejection raises ``InvalidReport`` whose ``field`` names the JSON path and whose ``reason`` says
what is wrong, both cut to ``MAX_REASON_CHARS`` so a dead letter built from them stays small.
``encode_report`` writes ``LocalBrokerData``, for the agent and the simulator.

One decoder, two shapes. ``decode_report_columns`` is the decoder: it yields the broker's
figures and its bundles' figures as arrays (``loadbalance.report_columns.ReportColumns``), which
is what the streaming parse stage needs; ``decode_report`` builds its ``LocalBrokerData`` from
that result, so both accept, refuse and report exactly the same. The per-bundle rules are
``_bundle`` and ``_stats``, applied one bundle at a time; ``report_columns.bundle_columns``
checks the common case (every name canonical, every figure plain) on whole columns first and
answers only when those rules would pass every bundle unchanged.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

try:  # a dependency of the project; a runtime that lacks it (an executor image) decodes with json
    import orjson
except ImportError:  # pragma: no cover - exercised only where orjson is not installed
    orjson = None

from loadbalance.bundles import BundleRange, parse_bundle
from loadbalance.errors import InvalidInput, InvalidReport
from loadbalance.model import (
    BROKER_LOAD_DATA,
    BUNDLE_SKIPPED,
    LOAD_REPORT,
    LOCAL_BROKER_DATA,
    NO_BUNDLE_DATA,
    READING_IGNORED,
    REPORT_TYPES,
    UNKNOWN_USAGE,
    LocalBrokerData,
    NamespaceBundleStats,
    ReportIssue,
    ResourceUsage,
)
from loadbalance.report_columns import (
    MAX_NUMBER,
    KnownBundleLists,
    ReportColumns,
    bundle_columns,
    columns_from_stats,
    report_from_columns,
)

DEFAULT_MAX_REPORT_BYTES = 1024 * 1024
MAX_BUNDLES_PER_REPORT = 100_000
MAX_BROKER_ID_CHARS = 256
# A reading above this multiple of its limit is a broken sensor, not an overload.
MAX_USAGE_OVER_LIMIT = 10.0
# MAX_NUMBER (2^53, from report_columns): the largest figure accepted anywhere in a report.
MAX_REASON_CHARS = 300
MAX_LISTED_ISSUES = 20

_RESOURCES = (
    ("cpu", "cpu"),
    ("memory", "memory"),
    ("directMemory", "direct_memory"),
    ("bandwidthIn", "bandwidth_in"),
    ("bandwidthOut", "bandwidth_out"),
)
_RATES = (
    ("msgThroughputIn", "msg_throughput_in"),
    ("msgThroughputOut", "msg_throughput_out"),
    ("msgRateIn", "msg_rate_in"),
    ("msgRateOut", "msg_rate_out"),
)
_COUNTS = (
    ("numTopics", "num_topics"),
    ("numBundles", "num_bundles"),
    ("numConsumers", "num_consumers"),
    ("numProducers", "num_producers"),
)
_BROKER_LOAD_DATA_COUNTS = (("topics", "num_topics"), ("bundleCount", "num_bundles"))
_STATS_RATES = (
    ("msgRateIn", "msg_rate_in"),
    ("msgRateOut", "msg_rate_out"),
    ("msgThroughputIn", "msg_throughput_in"),
    ("msgThroughputOut", "msg_throughput_out"),
)
_STATS_COUNTS = (
    ("topics", "topics"),
    ("consumerCount", "consumer_count"),
    ("producerCount", "producer_count"),
)
# Fields only the extensible manager's BrokerLoadData writes (it has no loadReportType).
_BROKER_LOAD_DATA_FIELDS = ("bundleCount", "weightedMaxEMA", "msgThroughputEMA", "reportedAt")


def _number(value: Any, path: str, *, signed: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidReport(path, f"must be a number, got {type(value).__name__}")
    try:
        v = float(value)
    except OverflowError:  # an integer literal beyond the float range
        raise InvalidReport(path, "number out of range") from None
    if not math.isfinite(v):
        raise InvalidReport(path, "must be a finite number")
    if v < 0 and not signed:
        raise InvalidReport(path, f"must not be negative, got {v:g}")
    if abs(v) > MAX_NUMBER:
        raise InvalidReport(path, f"implausibly large: {v:g} is above 2^53")
    return v


def _count(value: Any, path: str) -> int:
    v = _number(value, path)
    if v != int(v):
        raise InvalidReport(path, f"must be a whole number, got {v:g}")
    return int(v)


def _resource(doc: Any, path: str) -> ResourceUsage:
    """One reading; raises ``InvalidReport`` for a broken one (the caller ignores it).

    A negative usage or a limit <= 0 is Pulsar's "unknown" and comes back as given."""
    if not isinstance(doc, dict):
        raise InvalidReport(
            path, f"must be an object with usage and limit, got {type(doc).__name__}"
        )
    if "usage" in doc and "limit" not in doc:
        raise InvalidReport(f"{path}.limit", "usage given without limit")
    usage = _number(doc.get("usage", 0.0), f"{path}.usage", signed=True)
    limit = _number(doc.get("limit", 0.0), f"{path}.limit", signed=True)
    if limit > 0 and usage > limit * MAX_USAGE_OVER_LIMIT:
        raise InvalidReport(
            f"{path}.usage", f"{usage:g} is more than {MAX_USAGE_OVER_LIMIT:g}x its limit {limit:g}"
        )
    return ResourceUsage(usage, limit)


def _cap(text: str) -> str:
    """Cut a field path or reason so a dead letter built from it stays small."""
    if len(text) <= MAX_REASON_CHARS:
        return text
    suffix = f"...({len(text)} chars in all)"
    return text[: MAX_REASON_CHARS - len(suffix)] + suffix


def _text(value: Any, path: str) -> str:
    """A string field: must be a string of valid Unicode (no lone surrogate escapes)."""
    if not isinstance(value, str):
        raise InvalidReport(path, f"must be a string, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidReport(path, "contains a lone surrogate (not valid Unicode)") from None
    return value


def _bundle(name: Any, path: str) -> BundleRange:
    if isinstance(name, str) and not name.isprintable():
        raise InvalidReport(path, "bundle name contains unprintable characters")
    try:
        return parse_bundle(name)
    except InvalidInput as e:
        raise InvalidReport(path, e.reason) from None


def _check_no_overlap(ranges: set[BundleRange]) -> None:
    """Bundles of one namespace in one report must be disjoint ranges of the ring."""
    previous: BundleRange | None = None
    for r in sorted(ranges):
        if previous is not None and previous.namespace == r.namespace and r.lower < previous.upper:
            raise InvalidReport("bundles", f"{previous.name} and {r.name} overlap")
        previous = r


def _stats(doc: Any, path: str) -> NamespaceBundleStats:
    if not isinstance(doc, dict):
        raise InvalidReport(path, f"must be an object, got {type(doc).__name__}")
    kw: dict[str, Any] = {}
    for key, attr in _STATS_RATES:
        kw[attr] = _number(doc.get(key, 0.0), f"{path}.{key}")
    for key, attr in _STATS_COUNTS:
        kw[attr] = _count(doc.get(key, 0), f"{path}.{key}")
    return NamespaceBundleStats(**kw)


def _broker_from_url(url: str) -> str:
    rest = url.split("://", 1)[-1]
    return rest.split("/", 1)[0]


def decode_report_columns(
    raw: bytes | str,
    broker_id: str | None = None,
    *,
    max_bytes: int = DEFAULT_MAX_REPORT_BYTES,
    known: KnownBundleLists | None = None,
) -> ReportColumns:
    """Decode one report into columns; ``broker_id`` is the record key, else
    ``webServiceUrl``'s host:port. The one decoder (see the module docstring). ``known``
    remembers the bundle lists already checked, for a reader of many reports."""
    columns = _unguarded_columns(raw, broker_id, max_bytes, known)
    if columns is not None:
        return columns
    doc = load_report_document(raw, max_bytes=max_bytes)
    return columns_from_document(doc, broker_id, known)


def decode_report(
    raw: bytes | str,
    broker_id: str | None = None,
    *,
    max_bytes: int = DEFAULT_MAX_REPORT_BYTES,
) -> LocalBrokerData:
    """``decode_report_columns`` with one ``NamespaceBundleStats`` per bundle."""
    return report_from_columns(decode_report_columns(raw, broker_id, max_bytes=max_bytes))


def load_report_document(
    raw: bytes | str, *, max_bytes: int = DEFAULT_MAX_REPORT_BYTES
) -> dict[str, Any]:
    """The first steps of ``decode_report``: size limit, strict UTF-8, JSON, a JSON object."""
    if raw is None:
        raise InvalidReport("record", "empty record value")
    if len(raw) > max_bytes:
        raise InvalidReport("record", f"{len(raw)} bytes exceeds the limit of {max_bytes}")
    doc = _fast_json(raw)
    if doc is None:
        try:
            # strict UTF-8 first: json.loads(bytes) would let encoded surrogates through
            text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else raw
            doc = json.loads(text)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            raise InvalidReport("record", f"not valid JSON ({type(e).__name__})") from None
    if not isinstance(doc, dict):
        raise InvalidReport("record", f"must be a JSON object, got {type(doc).__name__}")
    return doc


# Digits mapped to "0": a run of _LONG_DIGITS in the mapped bytes that is not a fraction or a
# mantissa is possibly an integer beyond 64 bits, which orjson reads as a float (below).
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_DIGITS = b"0" * 19
_ZERO, _DOT = ord("0"), ord(".")


def _may_hold_a_wide_integer(raw: bytes | bytearray) -> bool:
    """Whether ``raw`` holds a run of 19 or more digits not preceded by "." nor followed by
    ".", "e" or "E" (so possibly an integer literal outside [-2^63, 2^64)); runs inside strings
    count too, which only costs speed."""
    mapped = raw.translate(_DIGITS_AS_ZERO)
    at = mapped.find(_LONG_DIGITS)
    while at >= 0:
        start, end = at, at + len(_LONG_DIGITS)
        while start > 0 and mapped[start - 1] == _ZERO:
            start -= 1
        while end < len(mapped) and mapped[end] == _ZERO:
            end += 1
        if (start == 0 or mapped[start - 1] != _DOT) and mapped[end : end + 1] not in (
            b".",
            b"e",
            b"E",
        ):
            return True
        at = mapped.find(_LONG_DIGITS, end)
    return False


def _fast_json(raw: bytes | bytearray | str) -> Any:
    """``json.loads`` of ``raw`` by orjson (about 4 times faster on a report), or ``None``
    where its answer could differ from ``json.loads``', which then decides.

    Why it is the same: for valid JSON both read the same values (floats correctly rounded,
    duplicate keys last-wins in first-key order) except in three places, each sent to
    ``json.loads``: integers outside [-2^63, 2^64) become floats in orjson (any integer
    literal of 19 digits or more is sent, ``_may_hold_a_wide_integer``); ``NaN``,
    ``Infinity``, a number beyond the float range and a lone surrogate escape are accepted by
    ``json.loads`` only (orjson raises); and orjson reads containers nested up to 1024 deep
    where ``json.loads`` raises ``RecursionError`` near 1000 (a document that
    ``orjson.dumps``, limited to 254 levels, refuses is sent). Invalid UTF-8 and every other
    error also go to ``json.loads``, so what is refused, and with which reason, is
    ``json.loads``' alone. A ``str`` (not a Kafka value) goes there too.
    """
    if orjson is None or not isinstance(raw, (bytes, bytearray)):
        return None
    if _may_hold_a_wide_integer(raw):
        return None
    try:
        doc = orjson.loads(raw)
        orjson.dumps(doc)  # raises beyond 254 levels of nesting
    except (orjson.JSONDecodeError, orjson.JSONEncodeError, TypeError, ValueError):
        return None
    return doc


def _unguarded_columns(
    raw: bytes | str, broker_id: str | None, max_bytes: int, known: KnownBundleLists | None
) -> ReportColumns | None:
    """The decode of ``raw`` read by orjson without ``_fast_json``'s two scans, when the parsed
    document shows it is the one those scans would pass on, else ``None`` (the caller then
    decodes the guarded way, which decides; refusals always go there).

    Why: the scans (a translate and a search for 19-digit runs over the raw bytes, and an
    ``orjson.dumps`` for the nesting) cost about 1.1 ms of the 4.4 ms a report of 2,500
    bundles takes, and what they guard against also shows in the parsed document, where the
    bundle rules have already looked at nearly all of it (``_plain_document``). When that
    holds, ``orjson.loads(raw)`` equals ``json.loads(raw)`` value for value, ``_fast_json``
    would have returned it, and so the result is the guarded decode's."""
    if orjson is None or not isinstance(raw, (bytes, bytearray)) or len(raw) > max_bytes:
        return None
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict):
        return None
    try:
        columns = columns_from_dict(doc, broker_id, known=known)
    except Exception:  # the guarded decode refuses it, with its own reason
        return None
    # NO_BUNDLE_DATA says what kind of document it is (every BrokerLoadData has it), not that a
    # value was ignored
    if any(kind != NO_BUNDLE_DATA for kind, _ in columns.head.issue_counts):
        return None
    if not _plain_document(doc):
        return None
    return columns


# The largest nesting and number of values ``_plain_document`` walks outside the bundles: a
# report has a few dozen values there, three levels deep.
_PLAIN_DEPTH = 32
_PLAIN_VALUES = 10_000
# orjson reads an integer literal outside [-2^63, 2^64) as a float, whose magnitude is then at
# least 2^63; json.loads reads it as an int.
_WIDE = 2.0**63
_STATS_FIELDS = frozenset(key for key, _ in _STATS_RATES + _STATS_COUNTS)
_PLAIN_EXTRA_FIELDS = 8
_SCALARS = frozenset((int, float, str, bool, type(None)))


def _plain_document(doc: dict[str, Any]) -> bool:
    """Whether a document orjson read, already decoded by ``columns_from_dict`` with no issue
    but ``no_bundle_data``, certainly holds no integer orjson read differently from
    ``json.loads`` and no nesting deeper than ``_PLAIN_DEPTH`` + 2 (far below the 254 levels
    ``_fast_json`` checks).

    The containers the decode read are settled by it: with no issue, every listed bundle was
    a name and every one of the seven figures of a stats entry a number within 2^53. What
    else a stats entry holds (a real broker also writes ``cacheSize``), a stats object the
    decode did not read (older ``LocalBrokerData`` also writes ``bundleStats``) and every
    other value of the document are checked here."""
    kind = report_type_of(doc)
    if kind == BROKER_LOAD_DATA:  # no bundle containers are read: everything is walked
        return _shallow(list(doc.values()))
    read = "lastStats" if kind == LOCAL_BROKER_DATA else "bundleStats"
    for key in ("lastStats", "bundleStats"):
        stats = doc.get(key)
        if stats and not _plain_stats(stats, _STATS_FIELDS if key == read else frozenset()):
            return False
    settled = ("lastStats", "bundleStats")
    if kind == LOCAL_BROKER_DATA:
        settled += ("bundles",)
    return _shallow([v for k, v in doc.items() if k not in settled])


def _plain_stats(stats: Any, read: frozenset[str]) -> bool:
    """Every entry an object, whose fields other than ``read`` hold only scalars and no float
    of magnitude ``_WIDE`` or more (``_PLAIN_EXTRA_FIELDS`` such fields at most)."""
    if not isinstance(stats, dict):
        return False
    entries = list(stats.values())
    if set(map(type, entries)) != {dict}:
        return False
    others = set().union(*entries) - read
    if len(others) > _PLAIN_EXTRA_FIELDS:
        return False
    for field in others:
        column = [entry.get(field) for entry in entries]
        kinds = set(map(type, column))
        if not kinds <= _SCALARS:
            return False
        if float in kinds and max(abs(v) for v in column if type(v) is float) >= _WIDE:
            return False
    return True


def _shallow(values: list[Any]) -> bool:
    """At most ``_PLAIN_VALUES`` values, ``_PLAIN_DEPTH`` levels deep, no float of magnitude
    ``_WIDE`` or more."""
    stack = [(v, 1) for v in values]
    seen = 0
    while stack:
        value, depth = stack.pop()
        seen += 1
        if seen > _PLAIN_VALUES:
            return False
        kind = type(value)
        if kind is float:
            if abs(value) >= _WIDE:
                return False
        elif kind is dict or kind is list:
            if depth >= _PLAIN_DEPTH:
                return False
            items = value.values() if kind is dict else value
            stack.extend((item, depth + 1) for item in items)
    return True


def columns_from_document(
    doc: dict[str, Any], broker_id: str | None = None, known: KnownBundleLists | None = None
) -> ReportColumns:
    """The last step of ``decode_report_columns``: ``columns_from_dict`` with field and reason
    capped."""
    try:
        return columns_from_dict(doc, broker_id, known=known)
    except InvalidReport as e:
        if len(e.field) <= MAX_REASON_CHARS and len(e.reason) <= MAX_REASON_CHARS:
            raise
        raise InvalidReport(_cap(e.field), _cap(e.reason)) from None


def report_from_document(doc: dict[str, Any], broker_id: str | None = None) -> LocalBrokerData:
    """``columns_from_document`` with one ``NamespaceBundleStats`` per bundle."""
    return report_from_columns(columns_from_document(doc, broker_id))


def report_type_of(doc: Mapping[str, Any]) -> str:
    """Which of Pulsar's documents ``doc`` is: ``loadReportType`` when it names one (Pulsar's
    ``LoadReportDeserializer`` reads that field), else by shape (``systemResourceUsage`` or
    ``bundleStats`` without ``lastStats``: ``LoadReport``; ``bundleCount`` and kin without
    ``lastStats``/``bundles``: ``BrokerLoadData``), else ``LocalBrokerData``."""
    declared = doc.get("loadReportType")
    if declared == LOAD_REPORT:
        return LOAD_REPORT
    if declared == LOCAL_BROKER_DATA:
        return LOCAL_BROKER_DATA
    if "lastStats" in doc or "bundles" in doc:
        return LOCAL_BROKER_DATA
    if "systemResourceUsage" in doc or "bundleStats" in doc:
        return LOAD_REPORT
    if any(k in doc for k in _BROKER_LOAD_DATA_FIELDS):
        return BROKER_LOAD_DATA
    return LOCAL_BROKER_DATA


class _Issues:
    """Collects what a decode ignored: the first few in full, all of them by kind."""

    def __init__(self) -> None:
        self.listed: list[ReportIssue] = []
        self.counts: Counter[str] = Counter()

    def add(self, kind: str, field: str, reason: str) -> None:
        self.counts[kind] += 1
        if len(self.listed) < MAX_LISTED_ISSUES:
            self.listed.append(ReportIssue(kind, _cap(field), _cap(reason)))


def _resources(source: Mapping[str, Any], prefix: str, issues: _Issues) -> dict[str, ResourceUsage]:
    kw: dict[str, ResourceUsage] = {}
    for key, attr in _RESOURCES:
        value = source.get(key)
        if value is None:
            continue
        try:
            kw[attr] = _resource(value, prefix + key)
        except InvalidReport as e:
            issues.add(READING_IGNORED, e.field, e.reason)
            kw[attr] = UNKNOWN_USAGE
    return kw


class _Bundles:
    """A report's bundles once judged: the names with stats (in document order) and their
    figures as columns, and every usable bundle name (with stats or only listed)."""

    __slots__ = ("counts", "every", "names", "values")

    def __init__(
        self, names: list[str], values: np.ndarray, counts: np.ndarray, every: frozenset[str]
    ) -> None:
        self.names, self.values, self.counts, self.every = names, values, counts, every


def _stats_container(raw_stats: Any, path: str) -> dict[Any, Any]:
    """The stats object (null, [] and other empty values: none); refuse a wrong type or size."""
    if not raw_stats:
        return {}
    if not isinstance(raw_stats, dict):
        raise InvalidReport(path, "must be an object of bundle -> stats")
    if len(raw_stats) > MAX_BUNDLES_PER_REPORT:
        raise InvalidReport(path, f"more than {MAX_BUNDLES_PER_REPORT} bundles")
    return raw_stats


def _bundles_container(raw_bundles: Any) -> list[Any] | None:
    """The ``bundles`` list, or None when absent; refuse a wrong type or size."""
    if raw_bundles is None:
        return None
    if not isinstance(raw_bundles, list):
        raise InvalidReport("bundles", "must be a list of bundle names")
    if len(raw_bundles) > MAX_BUNDLES_PER_REPORT:
        raise InvalidReport("bundles", f"more than {MAX_BUNDLES_PER_REPORT} bundles")
    return raw_bundles


def _judge_bundles(
    raw_stats: Any,
    path: str,
    raw_bundles: Any,
    issues: _Issues,
    known: KnownBundleLists | None = None,
) -> _Bundles:
    """The per-bundle rules over a report's stats object and (``LocalBrokerData`` only) its
    ``bundles`` list: containers first, then each entry, then the overlap rule."""
    stats_doc = _stats_container(raw_stats, path)
    listed_doc = _bundles_container(raw_bundles)
    fast = bundle_columns(stats_doc, listed_doc, known)
    if fast is not None:
        return _Bundles(*fast)
    return _judge_each_bundle(stats_doc, path, listed_doc, issues)


def _judge_each_bundle(
    stats_doc: dict[Any, Any], path: str, listed_doc: list[Any] | None, issues: _Issues
) -> _Bundles:
    """The per-bundle rules, one entry at a time: what ``bundle_columns`` must agree with."""
    stats, ranges, names = _bundle_stats(stats_doc, path, issues)
    for i, b in enumerate(listed_doc or ()):
        try:
            r = _bundle(b, f"bundles[{i}]")
        except InvalidReport as e:
            issues.add(BUNDLE_SKIPPED, e.field, e.reason)
            continue
        ranges.add(r)
        names.add(r.name)
    _check_no_overlap(ranges)
    values, counts = columns_from_stats(stats.values())
    return _Bundles(list(stats), values, counts, frozenset(names))


def _bundle_stats(
    raw_stats: dict[Any, Any], path: str, issues: _Issues
) -> tuple[dict[str, NamespaceBundleStats], set[BundleRange], set[str]]:
    """Stats by canonical name, the ranges of all usable names, and the usable names."""
    ranges: set[BundleRange] = set()
    names: set[str] = set()
    stats: dict[str, NamespaceBundleStats] = {}
    for name, s in raw_stats.items():
        where = f"{path}[{name!r}]"
        try:
            r = _bundle(name, where)
        except InvalidReport as e:
            issues.add(BUNDLE_SKIPPED, e.field, e.reason)
            continue
        ranges.add(r)
        names.add(r.name)
        try:
            stats[r.name] = _stats(s, where)
        except InvalidReport as e:
            issues.add(READING_IGNORED, e.field, e.reason)
    return stats, ranges, names


def _broker_id(doc: Mapping[str, Any], broker_id: str | None, web: str) -> str:
    broker = broker_id or (_broker_from_url(web) if web else "")
    if not broker:
        name = doc.get("name")  # LoadReport's broker name (host:port)
        broker = _text(name, "name") if isinstance(name, str) else ""
    if not broker:
        raise InvalidReport("key", "no broker id: the record has no key and no webServiceUrl")
    if len(broker) > MAX_BROKER_ID_CHARS or not broker.isprintable() or broker != broker.strip():
        raise InvalidReport("key", "broker id must be printable, trimmed, at most 256 characters")
    return broker


def report_from_dict(
    doc: Mapping[str, Any], broker_id: str | None = None, *, report_type: str | None = None
) -> LocalBrokerData:
    """``columns_from_dict`` with one ``NamespaceBundleStats`` per bundle."""
    return report_from_columns(columns_from_dict(doc, broker_id, report_type=report_type))


def columns_from_dict(
    doc: Mapping[str, Any],
    broker_id: str | None = None,
    *,
    report_type: str | None = None,
    known: KnownBundleLists | None = None,
) -> ReportColumns:
    """Validate an already-parsed report document of any of the three load managers.

    ``report_type`` forces the document kind (default: ``report_type_of(doc)``); ``known`` is
    ``decode_report_columns``'."""
    kind = report_type or report_type_of(doc)
    web = _text(doc.get("webServiceUrl") or "", "webServiceUrl")
    broker = _broker_id(doc, broker_id, web)
    issues = _Issues()
    kw: dict[str, Any] = {}
    if kind == LOAD_REPORT:
        system = doc.get("systemResourceUsage")
        if system is not None and not isinstance(system, dict):
            issues.add(READING_IGNORED, "systemResourceUsage", "must be an object")
            system = None
        kw.update(_resources(doc if system is None else system, "" if system is None
                             else "systemResourceUsage.", issues))  # fmt: skip
        found = _judge_bundles(doc.get("bundleStats"), "bundleStats", None, issues, known)
        tp_in, tp_out, rate_in, rate_out = found.values.T.tolist()
        topics, consumers, producers = found.counts.T.tolist()
        kw.update(
            msg_rate_in=math.fsum(rate_in),
            msg_rate_out=math.fsum(rate_out),
            msg_throughput_in=math.fsum(tp_in),
            msg_throughput_out=math.fsum(tp_out),
            num_topics=sum(topics),
            num_bundles=len(found.every),
            num_consumers=sum(consumers),
            num_producers=sum(producers),
        )
        update_key = "timestamp" if "timestamp" in doc else "lastUpdate"
    elif kind == BROKER_LOAD_DATA:
        kw.update(_resources(doc, "", issues))
        for key, attr in _RATES:
            kw[attr] = _number(doc.get(key, 0.0), key)
        for key, attr in _BROKER_LOAD_DATA_COUNTS:
            kw[attr] = _count(doc.get(key, 0), key)
        values, counts = columns_from_stats(())
        found = _Bundles([], values, counts, frozenset())
        issues.add(
            NO_BUNDLE_DATA,
            "record",
            "BrokerLoadData (extensible load manager) names no bundles: bundle-level policies "
            "cannot act on this broker",
        )
        update_key = "updatedAt" if "updatedAt" in doc else "reportedAt"
    else:
        kw.update(_resources(doc, "", issues))
        for key, attr in _RATES:
            kw[attr] = _number(doc.get(key, 0.0), key)
        for key, attr in _COUNTS:
            kw[attr] = _count(doc.get(key, 0), key)
        found = _judge_bundles(doc.get("lastStats"), "lastStats", doc.get("bundles"), issues, known)
        update_key = "lastUpdate"
        source = doc.get("sourceReportType")  # written by report_to_dict for a re-read
        if source in REPORT_TYPES:
            kind = source
    last_update = _count(doc.get(update_key, 0), update_key)
    version = _text(doc.get("brokerVersionString") or "", "brokerVersionString")
    pulsar_url = _text(doc.get("pulsarServiceUrl") or "", "pulsarServiceUrl")
    head = LocalBrokerData(
        broker=broker,
        bundles=found.every,
        last_stats=MappingProxyType({}),
        last_update_ms=last_update,
        web_service_url=web,
        pulsar_service_url=pulsar_url,
        broker_version=version,
        report_type=kind,
        issues=tuple(issues.listed),
        issue_counts=tuple(sorted(issues.counts.items())),
        **kw,
    )
    return ReportColumns(head, found.names, found.values, found.counts)


def _resource_doc(r: ResourceUsage) -> dict[str, float]:
    return {"usage": r.usage, "limit": r.limit}


def report_to_dict(r: LocalBrokerData) -> dict[str, Any]:
    """The report as Pulsar writes it (``LocalBrokerData`` JSON field names), whatever document
    it was read from; ``sourceReportType`` keeps that document's kind across a re-read."""
    return {
        "webServiceUrl": r.web_service_url,
        "pulsarServiceUrl": r.pulsar_service_url,
        "cpu": _resource_doc(r.cpu),
        "memory": _resource_doc(r.memory),
        "directMemory": _resource_doc(r.direct_memory),
        "bandwidthIn": _resource_doc(r.bandwidth_in),
        "bandwidthOut": _resource_doc(r.bandwidth_out),
        "msgThroughputIn": r.msg_throughput_in,
        "msgThroughputOut": r.msg_throughput_out,
        "msgRateIn": r.msg_rate_in,
        "msgRateOut": r.msg_rate_out,
        "numTopics": r.num_topics,
        "numBundles": r.num_bundles,
        "numConsumers": r.num_consumers,
        "numProducers": r.num_producers,
        "bundles": sorted(r.bundles),
        "lastStats": {
            name: {
                "msgRateIn": s.msg_rate_in,
                "msgRateOut": s.msg_rate_out,
                "msgThroughputIn": s.msg_throughput_in,
                "msgThroughputOut": s.msg_throughput_out,
                "topics": s.topics,
                "consumerCount": s.consumer_count,
                "producerCount": s.producer_count,
            }
            for name, s in sorted(r.last_stats.items())
        },
        "lastUpdate": r.last_update_ms,
        "brokerVersionString": r.broker_version,
        "loadReportType": LOCAL_BROKER_DATA,
    } | ({"sourceReportType": r.report_type} if r.report_type != LOCAL_BROKER_DATA else {})


def encode_report(r: LocalBrokerData) -> bytes:
    return json.dumps(report_to_dict(r), separators=(",", ":")).encode()
