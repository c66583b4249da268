"""A seeded corpus of malformed and hostile load reports and decisions.

Why a seeded mutator rather than only hypothesis: the bad-input benchmark runs at least
100,000 cases in under two minutes, with every class of hostility present in known numbers, so
the figures can be reported per class. Each case starts from a *valid* document (built with the
product's own encoders, so the good cases really are good) and applies one mutation whose
result the codecs must refuse; ``bad`` says which outcome the case expects. Generation is lazy
(an iterator) so memory stays flat however many cases are drawn, and ``random.Random(seed)`` makes
any failing case reproducible from its seed and index.

Classes (both streams unless noted): ``valid``, ``wrong_type``, ``non_finite`` (NaN, +-Infinity,
integers beyond the float range), ``negative`` (in reports: of the broker totals, which are
structural), ``outside_ring`` (decisions: boundaries outside the 32-bit ring), ``overlap``
(overlapping bundles in a report; merges of non-adjacent bundles and split points outside the
bundle in a decision),
``gigantic`` (maps and lists past the size or count limits), ``deep_nesting``, ``invalid_utf8``
(raw bytes and lone surrogate escapes), ``not_json`` (truncated, empty, tombstone, wrong top
level), ``bad_key`` (reports: record keys that are not a usable broker id) and ``missing``
(decisions: required parts absent or contradictory).

Reports also have ``TOLERATED_REPORT_CLASSES``: hostile items the codec judges per item, so the
report is accepted with the item ignored and named in ``LocalBrokerData.issues`` (``bad`` is
False): ``usage_over_limit`` (a reading over 10x its limit), ``outside_ring`` (bundle names that
are no bundle), ``broken_reading`` (a resource of the wrong type, non-finite or huge),
``bad_bundle_stats`` (one bundle's stats unusable) and ``unknown_reading`` (Pulsar's ``-1`` or a
limit of 0: accepted with no issue at all).
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from loadbalance.decisions import MERGE, SPLIT, TRANSFER, UNLOAD, encode_decision, make_decision

REPORT_CLASSES = (
    "valid",
    "wrong_type",
    "non_finite",
    "negative",
    "overlap",
    "gigantic",
    "deep_nesting",
    "invalid_utf8",
    "not_json",
    "bad_key",
)
TOLERATED_REPORT_CLASSES = (
    "usage_over_limit",
    "outside_ring",
    "broken_reading",
    "bad_bundle_stats",
    "unknown_reading",
)
_RESOURCES = ("cpu", "memory", "directMemory", "bandwidthIn", "bandwidthOut")
DECISION_CLASSES = (
    "valid",
    "wrong_type",
    "non_finite",
    "negative",
    "outside_ring",
    "overlap",
    "gigantic",
    "deep_nesting",
    "invalid_utf8",
    "not_json",
    "missing",
)

NAMESPACES = ("acme/orders", "acme/billing", "public/default")
RING = 1 << 32


@dataclass(frozen=True, slots=True)
class Case:
    """One record: what to feed, and whether the product must refuse it."""

    cls: str
    value: bytes | None
    key: bytes | None
    bad: bool
    note: str = ""


# -- helpers -------------------------------------------------------------------------------


def _ranges(n: int) -> list[tuple[int, int]]:
    """``n`` equal, adjacent ranges covering the ring (the last one closed at 0xffffffff)."""
    step = RING // n
    bounds = [i * step for i in range(n)] + [0xFFFFFFFF]
    return list(itertools.pairwise(bounds))


def _name(ns: str, lo: int, hi: int) -> str:
    return f"{ns}/0x{lo:08x}_0x{hi:08x}"


def _dumps(doc: Any) -> bytes:
    # allow_nan: NaN and Infinity literals are exactly what a hostile producer may send
    return json.dumps(doc, separators=(",", ":"), allow_nan=True).encode()


WRONG_TYPES: tuple[Any, ...] = ("12", "", [1], {"x": 1}, True, False, [], {})
NON_FINITE: tuple[Any, ...] = (float("nan"), float("inf"), float("-inf"), 10**400, -(10**400))
INVALID_UTF8 = (
    b"\xff",
    b"\xfe\xff",
    b"\xc3\x28",
    b"\xed\xa0\x80",
    b"\xc0\xaf",
    b"\xe2\x82",
    b"\x80",
)
BAD_RANGES = (
    "0x00000000_0x100000000",  # nine hex digits: beyond the ring
    "0x80000000_0x40000000",  # lower above upper
    "0x40000000_0x40000000",  # empty range
    "0x-0000001_0x40000000",
    "0xgggggggg_0x40000000",
    "00000000_40000000",
    "0x00000000-0x40000000",
    "0x０0000000_0x40000000",  # a full-width digit
    "",
    "0x00000000_0x40000000/extra",
)
GIANT_EXCESS = (1, 2, 7, 100, 1000, 4096, 8191)
BAD_NAMESPACES = ("acme", "a b/ns", "acme/", "/ns", "acme/ns\n", "tenant/ns\u202e", "a/b/c")


# -- reports -------------------------------------------------------------------------------


def valid_report(rng: random.Random, broker: str, max_bundles: int = 12) -> dict[str, Any]:
    """A valid ``LocalBrokerData`` document with a random set of disjoint bundles."""
    ns = rng.choice(NAMESPACES)
    pieces = _ranges(rng.choice((4, 8, 16, 64)))
    chosen = rng.sample(pieces, rng.randint(0, min(len(pieces), max_bundles)))
    stats = {}
    for lo, hi in chosen:
        rate = rng.uniform(0, 5000)
        stats[_name(ns, lo, hi)] = {
            "msgRateIn": rate,
            "msgRateOut": rate * rng.uniform(0, 3),
            "msgThroughputIn": rate * 1024,
            "msgThroughputOut": rate * 2048,
            "topics": rng.randint(0, 200),
            "consumerCount": rng.randint(0, 50),
            "producerCount": rng.randint(0, 50),
        }
    limit = rng.choice((100.0, 400.0, 800.0))
    doc: dict[str, Any] = {
        "webServiceUrl": f"http://{broker}",
        "pulsarServiceUrl": f"pulsar://{broker.split(':')[0]}:6650",
        "cpu": {"usage": rng.uniform(0, limit * 1.5), "limit": limit},  # a bit over is real
        "memory": {"usage": rng.uniform(0, 4096), "limit": 4096.0},
        "directMemory": {"usage": rng.uniform(0, 2048), "limit": 2048.0},
        "bandwidthIn": {"usage": rng.uniform(0, 1e6), "limit": 1.25e6},
        "bandwidthOut": {"usage": rng.uniform(0, 1e6), "limit": 1.25e6},
        "msgRateIn": sum(s["msgRateIn"] for s in stats.values()),
        "msgRateOut": sum(s["msgRateOut"] for s in stats.values()),
        "msgThroughputIn": sum(s["msgThroughputIn"] for s in stats.values()),
        "msgThroughputOut": sum(s["msgThroughputOut"] for s in stats.values()),
        "numTopics": sum(s["topics"] for s in stats.values()),
        "numBundles": len(stats),
        "numConsumers": rng.randint(0, 500),
        "numProducers": rng.randint(0, 500),
        "bundles": sorted(stats),
        "lastStats": stats,
        "lastUpdate": 1_700_000_000_000 + rng.randint(0, 10**9),
        "brokerVersionString": "4.0.1",
    }
    if rng.random() < 0.3:  # fields we do not model must be ignored, even odd ones
        doc["protocols"] = {"kafka": {"x": [1, 2, {"y": None}]}}
        doc["lastBundleGains"] = []
        doc["loadReportType"] = "LocalBrokerData"
    if rng.random() < 0.2:
        del doc["bundles"]  # optional: the bundles of lastStats are used
    return doc


def _numeric_paths(doc: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The broker totals: a bad value here refuses the whole report."""
    paths: list[tuple[Any, ...]] = [
        ("msgRateIn",),
        ("msgRateOut",),
        ("msgThroughputIn",),
        ("msgThroughputOut",),
        ("numTopics",),
        ("numBundles",),
        ("numConsumers",),
        ("numProducers",),
        ("lastUpdate",),
    ]
    return paths


def _stats_paths(doc: dict[str, Any]) -> list[tuple[Any, ...]]:
    """One bundle's stats: a bad value here drops that bundle's stats only."""
    paths: list[tuple[Any, ...]] = []
    for name in doc["lastStats"]:
        for f in ("msgRateIn", "msgRateOut", "msgThroughputIn", "msgThroughputOut", "topics"):
            paths.append(("lastStats", name, f))
    return paths


def _set(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    target = doc
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = value


def _with_bundle(doc: dict[str, Any], name: str, stats: dict[str, Any] | None = None) -> None:
    """Add a bundle to both ``lastStats`` and ``bundles``."""
    doc["lastStats"][name] = stats or {"msgRateIn": 1.0, "topics": 1}
    if "bundles" in doc:
        doc["bundles"].append(name)


class _GiantTemplates:
    """Oversized payloads built once per size and reused, so drawing them is cheap."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, int, int], bytes] = {}

    def get(self, kind: str, min_bytes: int, excess: int) -> bytes:
        """A ``kind`` payload of exactly ``min_bytes + excess`` bytes (a cut JSON document)."""
        key = (kind, min_bytes, excess)
        if key not in self._cache:
            self._cache[key] = self._full(kind, min_bytes)[: min_bytes + excess]
        return self._cache[key]

    def _full(self, kind: str, min_bytes: int) -> bytes:
        key = (kind, min_bytes, 0)
        if key not in self._cache:
            n = min_bytes // {"map": 50, "list": 30, "fields": 8}[kind] + 1000
            if kind == "map":
                stats = {
                    _name("acme/huge", i, i + 1): {"msgRateIn": 1.0, "topics": 1} for i in range(n)
                }
                doc: Any = {"webServiceUrl": "http://huge:8080", "lastStats": stats}
            elif kind == "list":
                doc = {"webServiceUrl": "http://huge:8080", "bundles": ["x" * 30] * n}
            else:  # a map of unknown fields
                doc = {"webServiceUrl": "http://huge:8080", **{f"k{i}": i for i in range(n)}}
            raw = _dumps(doc)
            assert len(raw) > min_bytes + 8192, (kind, len(raw))
            self._cache[key] = raw
        return self._cache[key]


def bad_report(
    rng: random.Random, cls: str, max_bytes: int, giants: _GiantTemplates
) -> tuple[bytes | None, bytes | None, str]:
    """One hostile report of class ``cls``: (value, key, note)."""
    broker = f"broker-{rng.randint(1, 50)}:8080"
    key: bytes | None = broker.encode()
    doc = valid_report(rng, broker, max_bundles=3)  # one mutation needs no more; keeps it fast
    if cls == "wrong_type":
        choice = rng.random()
        if choice < 0.7:
            path = rng.choice(_numeric_paths(doc))
            _set(doc, path, rng.choice(WRONG_TYPES))
            return _dumps(doc), key, f"{path} wrong type"
        field, value = rng.choice(
            (
                ("lastStats", [1]),
                ("lastStats", "all"),
                ("bundles", "acme/orders/0x00000000_0xffffffff"),
                ("bundles", {"a": 1}),
                ("webServiceUrl", 8080),
                ("webServiceUrl", ["http://x"]),
                ("brokerVersionString", 4),
                ("pulsarServiceUrl", {"u": 1}),
            )
        )
        doc[field] = value
        if field == "lastStats":
            doc.pop("bundles", None)
        return _dumps(doc), key, f"{field} wrong type"
    if cls == "non_finite":
        path = rng.choice(_numeric_paths(doc))
        _set(doc, path, rng.choice(NON_FINITE))
        return _dumps(doc), key, f"{path} non-finite"
    if cls == "negative":
        path = rng.choice(_numeric_paths(doc))
        _set(doc, path, -rng.choice((1, 1e-9, rng.uniform(0, 1e9))))
        return _dumps(doc), key, f"{path} negative"
    if cls == "usage_over_limit":
        res = rng.choice(_RESOURCES)
        limit = doc[res]["limit"]
        doc[res]["usage"] = limit * rng.uniform(10.01, 1e6)
        return _dumps(doc), key, f"{res} usage over 10x limit"
    if cls == "broken_reading":
        res = rng.choice(_RESOURCES)
        value = rng.choice((*WRONG_TYPES, *NON_FINITE, 1e300, "__NEST__"))
        if rng.random() < 0.3:
            doc[res] = rng.choice(("90%", [1, 2], 7, True))
        else:
            doc[res][rng.choice(("usage", "limit"))] = value
        raw = _dumps(doc).replace(b'"__NEST__"', b"[" * 500 + b"1" + b"]" * 500)
        return raw, key, f"{res} broken"
    if cls == "unknown_reading":
        res = rng.choice(_RESOURCES)
        doc[res] = rng.choice(
            (
                {"usage": -1.0, "limit": -1.0},
                {"usage": -1.0, "limit": 1.25e6},
                {"usage": rng.uniform(0, 100), "limit": 0.0},
                {"usage": 5.0, "limit": -1},
            )
        )
        return _dumps(doc), key, f"{res} unknown"
    if cls == "bad_bundle_stats":
        if not doc["lastStats"]:
            _with_bundle(doc, _name("acme/orders", 0, 0x10))
        paths = _stats_paths(doc)
        path = rng.choice(paths)
        value = rng.choice((*WRONG_TYPES, *NON_FINITE, -1, -1e-9, 1e300))
        if rng.random() < 0.2:
            _set(doc, path[:2], rng.choice(([], 3, None, "x")))
        else:
            _set(doc, path, value)
        return _dumps(doc), key, f"{path} bad stats"
    if cls == "outside_ring":
        if rng.random() < 0.75:
            name = f"{rng.choice(NAMESPACES)}/{rng.choice(BAD_RANGES)}"
        else:
            name = f"{rng.choice(BAD_NAMESPACES)}/0x00000000_0x40000000"
        if rng.random() < 0.5 or "bundles" not in doc:
            doc["lastStats"][name] = {"msgRateIn": 1.0}
        else:
            doc["bundles"].append(name)
        return _dumps(doc), key, f"bundle {name!r}"
    if cls == "overlap":
        ns = rng.choice(NAMESPACES)
        lo = rng.randrange(0, 0xFFFFFFF0)
        hi = rng.randrange(lo + 2, 0xFFFFFFFF + 1)
        mid = rng.randrange(lo + 1, hi)
        first, second = _name(ns, lo, hi), _name(ns, mid, rng.randrange(mid + 1, 0xFFFFFFFF + 1))
        if rng.random() < 0.3:
            second = _name(ns, 0, 0xFFFFFFFF)  # the whole ring beside any piece of it
        for n in (first, second):
            _with_bundle(doc, n)
        return _dumps(doc), key, f"{first} overlaps {second}"
    if cls == "gigantic":
        kind = rng.choice(("map", "list", "fields"))
        raw = giants.get(kind, max_bytes, rng.choice(GIANT_EXCESS))
        return raw, key, f"{kind}, {len(raw)} bytes over a limit of {max_bytes}"
    if cls == "deep_nesting":
        depth = rng.choice((50, 500, 5000, 100_000, 300_000))
        if depth >= 100_000 and rng.random() < 0.5:
            raw = b"[" * depth + b"]" * depth
            if len(raw) > max_bytes:
                raw = b"[" * (max_bytes // 2) + b"]" * (max_bytes // 2)
            return raw, key, f"top-level nesting {depth}"
        depth = min(depth, max_bytes // 3)
        path = rng.choice(_numeric_paths(doc))
        _set(doc, path, "__NEST__")  # written by hand: json.dumps would recurse
        raw = _dumps(doc).replace(b'"__NEST__"', b"[" * depth + b"1" + b"]" * depth)
        return raw, key, f"{path} nested {depth} deep"
    if cls == "invalid_utf8":
        if rng.random() < 0.3:  # a lone surrogate escape: valid JSON, invalid Unicode
            field = rng.choice(("webServiceUrl", "brokerVersionString", "pulsarServiceUrl"))
            raw = _dumps(doc).replace(f'"{field}":"'.encode(), f'"{field}":"\\ud800'.encode(), 1)
            return raw, (None if field == "webServiceUrl" else key), f"surrogate in {field}"
        raw = _dumps(doc)
        bad = rng.choice(INVALID_UTF8)
        at = raw.find(b'"', rng.randrange(1, len(raw) - 1))
        at = at if at > 0 else raw.find(b'"')
        raw = raw[: at + 1] + bad + raw[at + 1 :]
        return raw, key, f"bytes {bad!r} at {at}"
    if cls == "not_json":
        kind = rng.choice(("truncated", "empty", "tombstone", "array", "number", "string", "null"))
        raw = _dumps(doc)
        if kind == "truncated":
            return raw[: rng.randrange(0, len(raw) - 1)], key, kind
        value = {
            "empty": b"",
            "tombstone": None,
            "array": b"[1,2,3]",
            "number": b"42",
            "string": b'"report"',
            "null": b"null",
        }[kind]
        return value, key, kind
    if cls == "bad_key":
        kind = rng.choice(("utf8", "long", "control", "padded", "none"))
        if kind == "none":
            doc["webServiceUrl"] = ""
            return _dumps(doc), rng.choice((None, b"")), "no key, no url"
        value = _dumps(doc)
        bad_key = {
            "utf8": b"broker-\xff\xfe",
            "long": b"b" * rng.randint(257, 5000),
            "control": b"broker-1\n:8080",
            "padded": b" broker-1:8080 ",
        }[kind]
        return value, bad_key, f"key {kind}"
    raise ValueError(f"unknown report class {cls}")


def report_cases(
    n: int, seed: int = 0, *, valid_share: float = 0.1, max_bytes: int = 1024 * 1024
) -> Iterator[Case]:
    """``n`` cases: a ``valid_share`` of good reports, the rest spread over the bad classes."""
    rng = random.Random(seed)
    giants = _GiantTemplates()
    bad_classes = REPORT_CLASSES[1:] + TOLERATED_REPORT_CLASSES
    for i in range(n):
        if rng.random() < valid_share:
            broker = f"broker-{rng.randint(1, 50)}:8080"
            key = broker.encode() if rng.random() < 0.9 else None
            yield Case("valid", _dumps(valid_report(rng, broker)), key, False)
            continue
        cls = bad_classes[i % len(bad_classes)]
        value, key, note = bad_report(rng, cls, max_bytes, giants)
        yield Case(cls, value, key, cls not in TOLERATED_REPORT_CLASSES, note)


# -- decisions -------------------------------------------------------------------------------


def valid_decision(rng: random.Random, ns: str | None = None, pieces: int = 4) -> dict[str, Any]:
    """A valid decision document (split, unload, transfer or merge) made by the product."""
    ns = ns or rng.choice(NAMESPACES)
    ranges = _ranges(pieces)
    i = rng.randrange(len(ranges))
    lo, hi = ranges[i]
    bundle = _name(ns, lo, hi)
    kind = rng.choice((SPLIT, UNLOAD, TRANSFER, MERGE))
    src = f"broker-{rng.randint(1, 5)}:8080"
    dst = f"broker-{rng.randint(6, 9)}:8080"
    kw: dict[str, Any] = {}
    if kind == SPLIT:
        kw["split_boundaries"] = (lo + (hi - lo) // 2,)
        kw["split_algorithm"] = "range_equally_divide"
    elif kind == TRANSFER:
        kw["destination_broker"] = dst
    elif kind == MERGE:
        j = i + 1 if i + 1 < len(ranges) else i - 1
        kw["merge_bundle"] = _name(ns, *ranges[j])
    d = make_decision(
        cycle=f"c{rng.randint(0, 10**6)}",
        kind=kind,
        bundle=bundle,
        source_broker=src,
        reason=rng.choice(("Overloaded", "Underloaded", "Topics", "MsgRate", "Admin")),
        strategy="ThresholdShedder",
        inputs={"usage": rng.random(), "threshold": 0.85, "note": "x"},
        decided_at_ms=1_700_000_000_000 + rng.randint(0, 10**9),
        **kw,
    )
    return json.loads(encode_decision(d))


def bad_decision(rng: random.Random, cls: str, max_bytes: int) -> tuple[bytes | None, str]:
    """One hostile decision record of class ``cls``: (value, note)."""
    doc = valid_decision(rng)
    kind = doc["kind"]
    if cls == "wrong_type":
        field, value = rng.choice(
            (
                ("schemaVersion", "1"),
                ("schemaVersion", True),
                ("kind", 5),
                ("kind", ["split"]),
                ("bundle", 5),
                ("bundle", {"b": 1}),
                ("splitBoundaries", "0x10"),
                ("splitBoundaries", {"a": 1}),
                ("splitBoundaries", [True]),
                ("splitBoundaries", [[1]]),
                ("inputs", [1]),
                ("inputs", {"a": {"b": 1}}),
                ("inputs", {"a": [1]}),
                ("decidedAtMs", "5"),
                ("decidedAtMs", 1.5),
                ("decidedAtMs", True),
                ("id", 12345678901),
                ("id", ["x" * 10]),
                ("sourceBroker", 5),
                ("sourceBroker", ""),
                ("destinationBroker", ["b"]),
                ("reason", 5),
                ("cycle", []),
                ("strategy", {}),
                ("splitAlgorithm", 5),
                ("mergeBundle", 7),
            )
        )
        if field == "splitBoundaries" and isinstance(value, list):
            doc["kind"] = SPLIT
            doc["mergeBundle"] = None
        doc[field] = value
        return _dumps(doc), f"{field}={value!r}"
    if cls == "non_finite":
        v = rng.choice(NON_FINITE)
        field = rng.choice(("decidedAtMs", "splitBoundaries", "schemaVersion"))
        if field == "splitBoundaries":
            doc["kind"], doc["mergeBundle"], doc["splitBoundaries"] = SPLIT, None, [v]
        else:
            doc[field] = v
        return _dumps(doc), f"{field}={v!r}"
    if cls == "negative":
        if rng.random() < 0.5:
            doc["decidedAtMs"] = -rng.randint(1, 10**12)
            return _dumps(doc), "decidedAtMs negative"
        doc["kind"], doc["mergeBundle"] = SPLIT, None
        doc["splitBoundaries"] = [-rng.randint(1, 10**6)]
        return _dumps(doc), "boundary negative"
    if cls == "outside_ring":
        choice = rng.random()
        if choice < 0.4:
            doc["bundle"] = f"{rng.choice(NAMESPACES)}/{rng.choice(BAD_RANGES)}"
        elif choice < 0.6:
            doc["bundle"] = f"{rng.choice(BAD_NAMESPACES)}/0x00000000_0x40000000"
        elif choice < 0.8:
            doc["kind"], doc["mergeBundle"] = MERGE, f"{doc['bundle']}x"
        else:
            doc["kind"], doc["mergeBundle"] = SPLIT, None
            doc["splitBoundaries"] = [rng.choice(("0x100000000", "0xfffffffff", 2**40))]
        return _dumps(doc), "outside the ring"
    if cls == "overlap":
        ns, _, rng_part = doc["bundle"].rpartition("/")
        lo, hi = (int(x, 16) for x in rng_part.split("_"))
        choice = rng.random()
        if choice < 0.35:  # a merge with a bundle that overlaps instead of touching
            doc["kind"] = MERGE
            doc["mergeBundle"] = (
                _name(ns, lo, hi) if rng.random() < 0.3 else _name(ns, 0, 0xFFFFFFFF)
            )
        elif choice < 0.55:  # a merge with a bundle of another namespace
            other = next(n for n in NAMESPACES if n != ns)
            doc["kind"], doc["mergeBundle"] = (
                MERGE,
                _name(other, hi if hi < 0xFFFFFFFF else 0, 0xFFFFFFFF),
            )
        else:  # split points on or outside the bundle's edges, or repeated
            doc["kind"], doc["mergeBundle"] = SPLIT, None
            b = rng.choice((lo, hi, max(0, lo - 1), min(0xFFFFFFFF, hi + 1), "twice"))
            mid = lo + (hi - lo) // 2
            doc["splitBoundaries"] = (
                [f"0x{mid:08x}", f"0x{mid:08x}"] if b == "twice" else [f"0x{b:08x}"]
            )
        return _dumps(doc), "overlap"
    if cls == "gigantic":
        choice = rng.random()
        if choice < 0.4:
            doc["inputs"] = {f"k{i}": i for i in range(rng.randint(257, 2000))}
        elif choice < 0.6:
            doc["kind"], doc["mergeBundle"] = SPLIT, None
            doc["splitBoundaries"] = list(range(1, rng.randint(1026, 3000)))
        elif choice < 0.8:
            doc[rng.choice(("id", "sourceBroker", "reason", "cycle"))] = "x" * rng.randint(
                1100, 20_000
            )
        else:
            doc["padding"] = {f"k{i}": "v" * 50 for i in range(max_bytes // 50)}
        return _dumps(doc), "gigantic"
    if cls == "deep_nesting":
        depth = rng.choice((50, 1000, 20_000))
        if rng.random() < 0.5:
            raw = b"[" * depth + b"]" * depth
            return raw[:max_bytes] if len(raw) > max_bytes else raw, f"top-level {depth}"
        field = rng.choice(("inputs", "splitBoundaries", "bundle", "decidedAtMs"))
        doc[field] = "__NEST__"
        raw = _dumps(doc).replace(b'"__NEST__"', b"[" * depth + b"1" + b"]" * depth)
        return raw, f"{field} nested {depth}"
    if cls == "invalid_utf8":
        if rng.random() < 0.4:
            field = rng.choice(("id", "reason", "cycle", "sourceBroker", "strategy"))
            doc[field] = "broker-\ud800-x" if field != "id" else "\udfff" * 10
            raw = json.dumps(doc, separators=(",", ":")).encode()  # ensure_ascii escapes it
            return raw, f"surrogate in {field}"
        raw = _dumps(doc)
        bad = rng.choice(INVALID_UTF8)
        at = raw.find(b'"', rng.randrange(1, len(raw) - 1))
        at = at if at > 0 else raw.find(b'"')
        return raw[: at + 1] + bad + raw[at + 1 :], f"bytes {bad!r}"
    if cls == "not_json":
        choice = rng.choice(("truncated", "empty", "array", "number", "null", "garbage"))
        raw = _dumps(doc)
        return {
            "truncated": raw[: rng.randrange(0, len(raw) - 1)],
            "empty": b"",
            "array": b"[]",
            "number": b"1",
            "null": b"null",
            "garbage": bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))) + b"\x00{",
        }[choice], choice
    if cls == "missing":
        choice = rng.choice(
            ("kind", "bundle", "id", "schemaVersion", "dest", "same", "split", "merge", "ver")
        )
        if choice in ("kind", "bundle", "id", "schemaVersion"):
            del doc[choice]
        elif choice == "dest":
            doc["kind"], doc["destinationBroker"] = TRANSFER, None
        elif choice == "same":
            doc["destinationBroker"] = doc["sourceBroker"] = "broker-1:8080"
        elif choice == "split":
            doc["kind"], doc["splitBoundaries"], doc["mergeBundle"] = SPLIT, [], None
        elif choice == "merge":
            doc["kind"], doc["mergeBundle"] = MERGE, None
        else:
            doc["schemaVersion"] = rng.choice((0, 2, 99))
        return _dumps(doc), f"{choice} ({kind})"
    raise ValueError(f"unknown decision class {cls}")


def decision_cases(
    n: int, seed: int = 0, *, valid_share: float = 0.1, max_bytes: int = 65536
) -> Iterator[Case]:
    """``n`` decision records: a ``valid_share`` of good ones, the rest over the bad classes."""
    rng = random.Random(seed)
    bad_classes = DECISION_CLASSES[1:]
    for i in range(n):
        if rng.random() < valid_share:
            yield Case("valid", _dumps(valid_decision(rng)), None, False)
            continue
        cls = bad_classes[i % len(bad_classes)]
        value, note = bad_decision(rng, cls, max_bytes)
        yield Case(cls, value, None, True, note)
