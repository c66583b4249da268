"""The column checks agree with the per-bundle rules, and the one decoder's answers.

``loadbalance.report_codec`` is the one decoder; ``decode_report`` is built from
``decode_report_columns``' result. Its per-bundle rules run one bundle at a time
(``_judge_each_bundle``) unless ``report_columns.bundle_columns`` answers first for the common
case, so the one thing that must be checked by comparison is that accelerator: whenever it
answers, the per-bundle rules accept every entry with nothing to report and give the same
names, values (bit for bit), counts and bundle set. ``same`` checks that on every document
these tests decode: generated valid reports and their variants, hostile reports (each also
checked for the codec's answer: ignored and named, or refused), the fuzz corpus and
hypothesis-made documents. The fast path must also really be taken for the common case, or the
decoder's speed would be lost silently.
"""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadbalance.bundles import NamespaceBundles
from loadbalance.errors import InvalidReport
from loadbalance.model import (
    BROKER_LOAD_DATA,
    BUNDLE_SKIPPED,
    LOAD_REPORT,
    READING_IGNORED,
    LocalBrokerData,
    NamespaceBundleStats,
    ResourceUsage,
)
from loadbalance.report_codec import (
    DEFAULT_MAX_REPORT_BYTES,
    MAX_BUNDLES_PER_REPORT,
    _bundles_container,
    _Issues,
    _judge_each_bundle,
    _stats_container,
    decode_report,
    decode_report_columns,
    encode_report,
    load_report_document,
    report_type_of,
)
from loadbalance.report_columns import (
    KnownBundleLists,
    ReportColumns,
    _ranges_ok,
    bundle_columns,
    columns_from_report,
)
from streaming.shard_state import STAT_COLUMNS
from tests.fuzz.corpus import report_cases

KEY = "broker-1:8080"
KNOWN = KnownBundleLists()
"""One memory of checked bundle lists for every document these tests decode, as a streaming
worker keeps one for every report it reads."""
NS = "acme/orders"
B0, B1, B2 = (
    f"{NS}/0x{a:08x}_0x{b:08x}" for a, b in ((0, 2**30), (2**30, 2**31), (2**31, 2**32 - 1))
)


# -- the check --------------------------------------------------------------------------------


def _outcome(fn: Any, *args: Any, **kw: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args, **kw)
    except Exception as e:  # compared by class and content below
        return "raised", e


def _same_array(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def columns_answer(doc: Any) -> bool:
    """Whether ``bundle_columns`` answered for ``doc``'s bundles; when it did, assert the
    per-bundle rules give exactly its answer, accepting every entry with nothing to report."""
    if not isinstance(doc, dict):
        return False
    kind = report_type_of(doc)
    if kind == BROKER_LOAD_DATA:
        return False
    path, raw_bundles = ("bundleStats", None) if kind == LOAD_REPORT else ("lastStats", "bundles")
    try:
        stats = _stats_container(doc.get(path), path)
        listed = _bundles_container(doc.get(raw_bundles) if raw_bundles else None)
    except InvalidReport:
        return False
    fast = bundle_columns(stats, listed)
    if fast is None:
        return False
    issues = _Issues()
    slow = _judge_each_bundle(stats, path, listed, issues)  # must not raise
    assert not issues.counts, issues.listed
    names, values, counts, every = fast
    assert names == slow.names and every == slow.every
    assert _same_array(values, slow.values) and _same_array(counts, slow.counts)
    return True


def same(raw: Any, key: str | None = KEY, max_bytes: int = DEFAULT_MAX_REPORT_BYTES) -> Any:
    """Decode ``raw`` both ways and check the column checks (above); return the columns, or
    the decoder's exception."""
    kind, got = _outcome(decode_report_columns, raw, key, max_bytes=max_bytes)
    obj_kind, obj = _outcome(decode_report, raw, key, max_bytes=max_bytes)
    assert kind == obj_kind, (got, obj)
    doc_kind, doc = _outcome(load_report_document, raw, max_bytes=max_bytes)
    if doc_kind == "ok":
        columns_answer(doc)
    for _ in range(2):  # with the memory of checked lists: filled, then (maybe) used
        known_kind, known = _outcome(decode_report_columns, raw, key, max_bytes=max_bytes,
                                     known=KNOWN)  # fmt: skip
        assert known_kind == kind, (got, known)
        if kind == "raised":
            assert (type(known), known.field, known.reason) == (type(got), got.field, got.reason)
        else:
            assert known == got
    if kind == "raised":
        assert isinstance(got, InvalidReport), got
        assert (type(obj), obj.field, obj.reason) == (type(got), got.field, got.reason)
        return got
    assert columns_from_report(obj) == got and list(obj.last_stats) == got.names
    assert got.values.dtype == np.float64 and got.values.shape == (len(got.names), 4)
    assert got.counts.dtype == np.int64 and got.counts.shape == (len(got.names), 3)
    return got


def fast_taken(raw: bytes, key: str | None = KEY) -> bool:
    return columns_answer(load_report_document(raw))


def ignored(raw: Any, kind: str, field: str, words: str = "", key: str | None = KEY) -> None:
    """The decoder accepts ``raw`` with the item at ``field`` ignored and named; a skipped
    bundle entry or ignored stats entry is never on the column checks' path."""
    got = same(raw, key)
    assert isinstance(got, ReportColumns), got
    matching = [i for i in got.head.issues if i.field == field]
    assert matching, (field, got.head.issues)
    assert matching[0].kind == kind and words in matching[0].reason, matching[0]
    assert dict(got.head.issue_counts)[kind] >= 1
    if field.startswith(("lastStats[", "bundles[")):
        assert not fast_taken(raw, key)


def rejected(
    raw: Any,
    field: str,
    words: str = "",
    key: str | None = KEY,
    max_bytes: int = DEFAULT_MAX_REPORT_BYTES,
) -> None:
    e = same(raw, key, max_bytes=max_bytes)
    assert isinstance(e, InvalidReport), e
    assert e.field == field, (e.field, e.reason)
    assert words in e.reason, e.reason


# -- valid reports ----------------------------------------------------------------------------


def _ranges(rng: random.Random, ns: str, k: int) -> list[tuple[str, int, int]]:
    """``k`` disjoint ranges of ``ns`` (not necessarily adjacent or covering the ring)."""
    cuts = sorted(rng.sample(range(1, 2**32 - 1), 2 * k))
    return [(ns, cuts[2 * i], cuts[2 * i + 1]) for i in range(k)]


def _number(rng: random.Random) -> float:
    return rng.choice((0.0, 1.0, 0.5, rng.uniform(0, 1e4), rng.uniform(0, 1e12), 2.0**53, 1e-300))


def random_report(rng: random.Random, n: int) -> LocalBrokerData:
    spaces = [f"t{i}/ns{j}" for i in range(3) for j in range(2)] + ["a/b", "a/b.c", "a-b/c"]
    stats = {}
    for ns in rng.sample(spaces, rng.randint(1, len(spaces))):
        for _, lo, hi in _ranges(rng, ns, rng.randint(0, max(1, n // 3))):
            stats[f"{ns}/0x{lo:08x}_0x{hi:08x}"] = NamespaceBundleStats(
                _number(rng),
                _number(rng),
                _number(rng),
                _number(rng),
                rng.randint(0, 1000),
                rng.choice((0, 7, 2**53)),
                rng.randint(0, 50),
            )
    return LocalBrokerData(
        broker=KEY,
        cpu=ResourceUsage(rng.uniform(0, 90), 100.0),
        memory=ResourceUsage(100.0, 8000.0),
        bandwidth_in=ResourceUsage(rng.uniform(0, 900), 1000.0),
        msg_rate_in=min(sum(s.msg_rate_in for s in stats.values()), 1e15),
        msg_throughput_out=rng.uniform(0, 1e9),
        num_topics=rng.randint(0, 100),
        num_bundles=len(stats),
        bundles=frozenset(stats),
        last_stats=stats,
        last_update_ms=1_700_000_000_000,
        web_service_url="http://broker-1:8080",
        broker_version="4.0.1",
    )


def _doc(rng: random.Random, n: int = 30) -> dict[str, Any]:
    """A valid report document with at least three bundles."""
    while True:
        doc = json.loads(encode_report(random_report(rng, n)))
        if len(doc["lastStats"]) >= 3:
            return doc


def _raw(doc: Any) -> bytes:
    return json.dumps(doc, allow_nan=True).encode()


@pytest.mark.parametrize("seed", range(40))
def test_encoded_reports_take_the_fast_path_and_agree(seed: int) -> None:
    raw = encode_report(random_report(random.Random(seed), 30))
    same(raw)
    same(raw, key=None)  # the broker id from webServiceUrl
    assert fast_taken(raw)


def _upper(name: str) -> str:
    """``ns/0xABCDEF01_0x...``: the same bundle with uppercase hex digits."""
    return f"{name[:-19]}{name[-19:-11].upper()}_0x{name[-8:].upper()}"


def _variant(rng: random.Random, doc: dict[str, Any], kind: str) -> dict[str, Any]:
    stats = doc["lastStats"]
    names = list(stats)
    if kind == "shuffled":  # lastStats order is kept as given, not sorted
        doc["lastStats"] = dict(rng.sample(list(stats.items()), len(stats)))
    elif kind == "uppercase":  # accepted by the codec, whose canonical name differs
        n = rng.choice([k for k in names if _upper(k) != k])
        doc["lastStats"] = {(_upper(k) if k == n else k): v for k, v in stats.items()}
    elif kind == "uppercase_twice":  # both spellings: one bundle, the later value wins
        n = rng.choice([k for k in names if _upper(k) != k])
        stats[_upper(n)] = {"msgRateIn": 99.0}
    elif kind == "bundles_only":
        extra = [f"only/here/0x{lo:08x}_0x{hi:08x}" for _, lo, hi in _ranges(rng, "x", 5)]
        doc["bundles"] = doc["bundles"] + extra
    elif kind == "repeated":
        doc["bundles"] = doc["bundles"] * 3 + names[:2]
    elif kind == "empty_stats":
        doc["lastStats"] = {}
    elif kind == "no_stats":
        del doc["lastStats"]
    elif kind == "null_stats":
        doc["lastStats"] = None
    elif kind == "list_stats":  # falsy, so the codec reads it as no stats at all
        doc["lastStats"] = []
    elif kind == "no_bundles":
        del doc["bundles"]
    elif kind == "null_bundles":
        doc["bundles"] = None
    elif kind == "empty_bundles":
        doc["bundles"] = []
    elif kind == "missing_fields":
        for k in rng.sample(sorted(doc), rng.randint(0, len(doc))):
            if k != "webServiceUrl":
                del doc[k]
        for s in doc.get("lastStats", {}).values():
            for f in rng.sample(sorted(s), rng.randint(0, len(s))):
                del s[f]
    elif kind == "ints":  # whole numbers written as JSON integers, as Java would
        for s in stats.values():
            for f in ("msgRateIn", "msgThroughputOut", "topics"):
                if float(s[f]).is_integer():
                    s[f] = int(s[f])
    elif kind == "whole_floats":  # counts written as 3.0
        for s in stats.values():
            s["consumerCount"] = float(s["consumerCount"])
    elif kind == "negative_zero":
        for s in stats.values():
            s["msgRateOut"] = -0.0
            s["producerCount"] = -0.0
    elif kind == "extremes":
        for s in stats.values():
            s["msgRateIn"], s["topics"], s["msgRateOut"] = 2**53, 2**53, 2.0**53
    elif kind == "just_above":  # float(2**53 + 1) == 2**53, so the codec accepts it
        for s in stats.values():
            s["msgThroughputIn"] = 2**53 + 1
    elif kind == "unknown_fields":
        for s in stats.values():
            s["cacheSize"], s["weird"] = 0, {"x": [True, None]}
        doc["protocols"], doc["numBundles"] = {"kafka": []}, 7
    elif kind == "no_key":
        pass
    return doc


VARIANTS = (
    "shuffled",
    "uppercase",
    "uppercase_twice",
    "bundles_only",
    "repeated",
    "empty_stats",
    "no_stats",
    "null_stats",
    "list_stats",
    "no_bundles",
    "null_bundles",
    "empty_bundles",
    "missing_fields",
    "ints",
    "whole_floats",
    "negative_zero",
    "extremes",
    "just_above",
    "unknown_fields",
    "no_key",
)
FAST_VARIANTS = {  # all but a non-canonical spelling, which the per-bundle rules rename
    "list_stats",
    "shuffled",
    "bundles_only",
    "repeated",
    "empty_stats",
    "no_stats",
    "null_stats",
    "no_bundles",
    "null_bundles",
    "empty_bundles",
    "missing_fields",
    "ints",
    "whole_floats",
    "negative_zero",
    "extremes",
    "unknown_fields",
    "no_key",
}


@pytest.mark.parametrize("kind", VARIANTS)
def test_valid_variants_agree(kind: str) -> None:
    for seed in range(8):
        rng = random.Random(f"{kind}-{seed}")
        doc = _variant(rng, _doc(rng), kind)
        raw = _raw(doc)
        key = None if kind == "no_key" else KEY
        got = same(raw, key)
        assert isinstance(got, ReportColumns), got
        assert fast_taken(raw, key) == (kind in FAST_VARIANTS)


def test_values_are_the_stat_columns_in_order() -> None:
    stats = {
        "msgThroughputIn": 1.0,
        "msgThroughputOut": 2.0,
        "msgRateIn": 3.0,
        "msgRateOut": 4.0,
        "topics": 5,
        "consumerCount": 6,
        "producerCount": 7,
    }
    doc = {"webServiceUrl": "http://b:1", "lastStats": {B1: stats, B0: {}}, "bundles": [B2]}
    got = same(_raw(doc))
    assert STAT_COLUMNS == (
        "msg_throughput_in",
        "msg_throughput_out",
        "msg_rate_in",
        "msg_rate_out",
    )
    assert got.names == [B1, B0]
    assert got.values.tolist() == [[1.0, 2.0, 3.0, 4.0], [0.0] * 4]
    assert got.counts.tolist() == [[5, 6, 7], [0, 0, 0]]
    assert got.head.bundles == frozenset({B0, B1, B2})
    assert not got.head.last_stats
    assert fast_taken(_raw(doc))


def test_negative_zero_is_kept_bit_for_bit() -> None:
    doc = {"webServiceUrl": "http://b:1", "lastStats": {B0: {"msgRateIn": -0.0}}}
    got = same(_raw(doc))
    assert np.signbit(got.values[0, 2])
    other = ReportColumns(got.head, got.names, np.abs(got.values), got.counts)
    assert other != got  # equality is bit for bit


def test_the_benchmark_report_agrees() -> None:
    per_ns = 100
    names = [
        n for i in range(25) for n in NamespaceBundles.initial(f"bench/ns{i}", per_ns).bundle_names
    ]
    rng = random.Random(0)
    stats = {}
    for n in names:
        rate = rng.uniform(1, 200)
        stats[n] = NamespaceBundleStats(rate, rate, rate * 1000, rate * 1000, 3, 2, 2)
    r = LocalBrokerData(
        broker="broker-0:8080", num_bundles=len(stats), bundles=frozenset(stats), last_stats=stats
    )
    raw = encode_report(r)
    got = same(raw, "broker-0:8080")
    assert len(got.names) == 2500
    assert fast_taken(raw, "broker-0:8080")


# -- hostile reports ----------------------------------------------------------------------


def _base() -> dict[str, Any]:
    return {
        "webServiceUrl": "http://broker-1:8080",
        "cpu": {"usage": 10.0, "limit": 100.0},
        "msgRateIn": 1.0,
        "numTopics": 2,
        "bundles": [B0, B1],
        "lastStats": {
            B0: {"msgRateIn": 1.0, "msgThroughputIn": 2.0, "topics": 1, "consumerCount": 2},
            B1: {"msgRateOut": 3.0, "producerCount": 4},
        },
        "lastUpdate": 1_700_000_000_000,
    }


def _stat(field: str, value: Any, name: str = B1) -> bytes:
    doc = _base()
    doc["lastStats"][name][field] = value
    return _raw(doc)


def _with(**fields: Any) -> bytes:
    doc = _base()
    doc.update(fields)
    return _raw(doc)


def _stats(**named: Any) -> bytes:
    doc = _base()
    doc["lastStats"].update(named)
    return _raw(doc)


S1 = f"lastStats[{B1!r}]"
HOSTILE: list[tuple[str, Any, str, str]] = [
    # (name, raw, field, words in the reason)
    ("bool rate", _stat("msgRateIn", True), f"{S1}.msgRateIn", "must be a number, got bool"),
    ("bool false", _stat("msgRateOut", False), f"{S1}.msgRateOut", "got bool"),
    ("bool count", _stat("topics", True), f"{S1}.topics", "got bool"),
    ("string rate", _stat("msgThroughputIn", "12"), f"{S1}.msgThroughputIn", "got str"),
    ("empty string", _stat("msgThroughputOut", ""), f"{S1}.msgThroughputOut", "got str"),
    ("null rate", _stat("msgRateIn", None), f"{S1}.msgRateIn", "got NoneType"),
    ("null count", _stat("producerCount", None), f"{S1}.producerCount", "got NoneType"),
    ("list rate", _stat("msgRateIn", [1]), f"{S1}.msgRateIn", "got list"),
    ("dict count", _stat("consumerCount", {"x": 1}), f"{S1}.consumerCount", "got dict"),
    ("NaN", _stat("msgRateIn", float("nan")), f"{S1}.msgRateIn", "finite"),
    ("Infinity", _stat("msgThroughputIn", float("inf")), f"{S1}.msgThroughputIn", "finite"),
    ("-Infinity", _stat("msgRateOut", float("-inf")), f"{S1}.msgRateOut", "finite"),
    ("NaN count", _stat("topics", float("nan")), f"{S1}.topics", "finite"),
    ("negative", _stat("msgRateIn", -1.0), f"{S1}.msgRateIn", "negative"),
    ("negative tiny", _stat("msgRateIn", -1e-300), f"{S1}.msgRateIn", "negative"),
    ("negative int", _stat("topics", -3), f"{S1}.topics", "negative"),
    ("2^53+2", _stat("msgRateIn", 2**53 + 2), f"{S1}.msgRateIn", "above 2^53"),
    ("2^53+2 count", _stat("consumerCount", 2**53 + 2), f"{S1}.consumerCount", "above 2^53"),
    ("2^63", _stat("topics", 2**63), f"{S1}.topics", "above 2^53"),
    ("2^64+1", _stat("msgRateIn", 2**64 + 1), f"{S1}.msgRateIn", "above 2^53"),
    ("1e300", _stat("msgThroughputOut", 1e300), f"{S1}.msgThroughputOut", "above 2^53"),
    ("10**400", _stat("msgRateIn", 10**400), f"{S1}.msgRateIn", "out of range"),
    ("-10**400", _stat("topics", -(10**400)), f"{S1}.topics", "out of range"),
    ("-2^63-1", _stat("topics", -(2**63) - 1), f"{S1}.topics", "negative"),
    ("half count", _stat("topics", 1.5), f"{S1}.topics", "whole number"),
    ("tiny count", _stat("producerCount", 1e-300), f"{S1}.producerCount", "whole number"),
    ("stats list", _stats(**{B1: []}), S1, "must be an object, got list"),
    ("stats number", _stats(**{B1: 3}), S1, "got int"),
    ("stats null", _stats(**{B1: None}), S1, "got NoneType"),
    ("stats string", _stats(**{B1: "x"}), S1, "got str"),
    ("lastStats list", _with(lastStats=[1]), "lastStats", "must be an object"),
    ("lastStats string", _with(lastStats="all"), "lastStats", "must be an object"),
    ("lastStats true", _with(lastStats=True), "lastStats", "must be an object"),
    ("bundles string", _with(bundles=B0), "bundles", "must be a list"),
    ("bundles dict", _with(bundles={"a": 1}), "bundles", "must be a list"),
    ("bundles true", _with(bundles=True), "bundles", "must be a list"),
    ("bundles entry int", _with(bundles=[B0, 3]), "bundles[1]", "expected a string, got int"),
    ("bundles entry null", _with(bundles=[None]), "bundles[0]", "got NoneType"),
    ("bundles entry list", _with(bundles=[[B0]]), "bundles[0]", "got list"),
    ("bundles entry dict", _with(bundles=[{B0: 1}]), "bundles[0]", "got dict"),
    ("newline name", _stats(**{B2 + "\n": {}}), f"lastStats[{B2 + chr(10)!r}]", "unprintable"),
    ("newline bundle", _with(bundles=[B2 + "\n"]), "bundles[0]", "unprintable"),
    ("two names in one", _with(bundles=[B2 + "\n" + B2]), "bundles[0]", "unprintable"),
    (
        "tab in ns",
        _with(bundles=["acme/or\tders/0x00000000_0x00000010"]),
        "bundles[0]",
        "unprintable",
    ),
    (
        "newline in ns",
        _with(bundles=["acme\n/ns/0x00000000_0x00000010"]),
        "bundles[0]",
        "unprintable",
    ),
    (
        "rtl override",
        _with(bundles=["t/ns\u202e/0x00000000_0x00000010"]),
        "bundles[0]",
        "unprintable",
    ),
    (
        "space in ns",
        _with(bundles=["a b/ns/0x00000000_0x00000010"]),
        "bundles[0]",
        "tenant/namespace",
    ),
    (
        "unicode letter",
        _with(bundles=["tén/ns/0x00000000_0x00000010"]),
        "bundles[0]",
        "tenant/namespace",
    ),
    (
        "empty tenant",
        _with(bundles=["/ns/0x00000000_0x00000010"]),
        "bundles[0]",
        "tenant/namespace",
    ),
    ("four parts", _with(bundles=["a/b/c/0x00000000_0x00000010"]), "bundles[0]", "tenant/ns/0x"),
    ("two parts", _with(bundles=["a/0x00000000_0x00000010"]), "bundles[0]", "tenant/ns/0x"),
    ("short hex", _with(bundles=[f"{NS}/0x1_0x2"]), "bundles[0]", "0xLLLLLLLL"),
    ("nine digits", _with(bundles=[f"{NS}/0x00000000_0x100000000"]), "bundles[0]", "0xLLLLLLLL"),
    ("0X prefix", _with(bundles=[f"{NS}/0X00000000_0x00000010"]), "bundles[0]", "0xLLLLLLLL"),
    (
        "full-width digit",
        _with(bundles=[f"{NS}/0x０0000000_0x00000010"]),
        "bundles[0]",
        "0xLLLLLLLL",
    ),
    (
        "range newline",
        _stats(**{f"{NS}/0x00000000_0x00000010\n": {}}),
        f"lastStats[{NS + '/0x00000000_0x00000010' + chr(10)!r}]",
        "unprintable",
    ),
    ("lower = upper", _with(bundles=[f"{NS}/0x40000000_0x40000000"]), "bundles[0]", "not below"),
    ("lower > upper", _with(bundles=[f"{NS}/0x80000000_0x40000000"]), "bundles[0]", "not below"),
    (
        "lower > upper key",
        _stats(**{"x/y/0x00000002_0x00000001": {}}),
        "lastStats['x/y/0x00000002_0x00000001']",
        "not below",
    ),
    (
        "overlap in bundles",
        _with(bundles=[B0, f"{NS}/0x20000000_0x60000000"]),
        "bundles",
        "overlap",
    ),
    ("overlap key and entry", _with(bundles=[f"{NS}/0x3fffffff_0x40000001"]), "bundles", "overlap"),
    ("whole ring beside", _stats(**{f"{NS}/0x00000000_0xffffffff": {}}), "bundles", "overlap"),
    (
        "nested ranges",
        _with(bundles=[f"{NS}/0x00000010_0x00000020", f"{NS}/0x00000000_0x00000030"], lastStats={}),
        "bundles",
        "overlap",
    ),
    ("overlap via uppercase", _with(bundles=[f"{NS}/0x3FFFFFFF_0x40000001"]), "bundles", "overlap"),
    ("same lower", _with(bundles=[f"{NS}/0x00000000_0x00000001"]), "bundles", "overlap"),
    (
        "prefix namespaces",
        _with(
            lastStats={
                "a/b/0x00000000_0x00000010": {},
                "a/b.c/0x00000000_0x00000010": {},
                "a/b/0x0000000f_0x00000011": {},
            },
            bundles=None,
        ),
        "bundles",
        "overlap",
    ),
    ("head bool", _with(msgRateIn=True), "msgRateIn", "got bool"),
    ("head usage over limit", _with(cpu={"usage": 1e9, "limit": 1.0}), "cpu.usage", "its limit"),
    ("head count", _with(numBundles=2.5), "numBundles", "whole number"),
    ("lastUpdate negative", _with(lastUpdate=-1), "lastUpdate", "negative"),
    ("version int", _with(brokerVersionString=4), "brokerVersionString", "must be a string"),
    ("surrogate", _with(pulsarServiceUrl="x\ud800"), "pulsarServiceUrl", "surrogate"),
    ("not UTF-8", b'{"webServiceUrl": "http://b\xff:1"}', "record", "UnicodeDecodeError"),
    (
        "encoded surrogate",
        b'{"webServiceUrl": "http://b\xed\xa0\x80:1"}',
        "record",
        "UnicodeDecodeError",
    ),
    ("not JSON", b"{not json", "record", "not valid JSON"),
    ("truncated", _with()[:-3], "record", "not valid JSON"),
    ("empty", b"", "record", "not valid JSON"),
    ("tombstone", None, "record", "empty record value"),
    ("array", b"[1, 2]", "record", "JSON object"),
    ("null", b"null", "record", "got NoneType"),
    ("deep", b"[" * 100_000 + b"]" * 100_000, "record", "RecursionError"),
    ("oversized", b'{"x": "' + b"a" * DEFAULT_MAX_REPORT_BYTES + b'"}', "record", "exceeds"),
]


@pytest.mark.parametrize(
    ("raw", "field", "words"), [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE]
)
def test_hostile_reports_get_the_codecs_answer(raw: Any, field: str, words: str) -> None:
    """A broken bundle entry or reading is ignored and named (the rest of the report stands);
    anything else refuses the report."""
    if field.startswith(S1) or field == "cpu.usage":
        ignored(raw, READING_IGNORED, field, words)
    elif field.startswith(("lastStats[", "bundles[")):
        ignored(raw, BUNDLE_SKIPPED, field, words)
    else:
        rejected(raw, field, words)


def test_too_many_stats_and_a_long_reason_are_capped() -> None:
    doc = {
        "webServiceUrl": "http://b:1",
        "lastStats": {
            f"a/b/0x{i:08x}_0x{i + 1:08x}": {} for i in range(MAX_BUNDLES_PER_REPORT + 1)
        },
    }
    rejected(_raw(doc), "lastStats", "more than", key=None, max_bytes=10**8)
    raw = _with(bundles=[B0] * (MAX_BUNDLES_PER_REPORT + 1))
    rejected(raw, "bundles", "more than", max_bytes=10**8)
    long_name = "t/" + "n" * 5000 + "/0x00000000_0x00000010"
    got = same(_with(bundles=[long_name + "\n"]))
    (issue,) = got.head.issues
    assert issue.kind == BUNDLE_SKIPPED and len(issue.field) <= 300
    got = same(_stats(**{long_name: {"topics": 0.5}}))
    (issue,) = got.head.issues
    assert issue.kind == READING_IGNORED and "chars in all" in issue.field


def test_str_input_and_max_bytes_are_honoured() -> None:
    assert isinstance(same(_with().decode(), KEY), ReportColumns)
    rejected(_with(), "record", "exceeds the limit of 10", max_bytes=10)
    rejected(_with(webServiceUrl=""), "key", "no broker id", key=None)
    assert isinstance(same(_with(webServiceUrl=""), KEY), ReportColumns)


# -- the fuzz corpus and hypothesis ----------------------------------------------------------


def test_fuzz_corpus_agrees() -> None:
    fast = valid = 0
    for case in report_cases(4_000, seed=20260101, valid_share=0.3):
        key = None
        if case.key is not None:
            try:
                key = case.key.decode("utf-8") or None
            except UnicodeDecodeError:
                continue  # parse_record refuses the key before decoding
        got = same(case.value, key)
        assert isinstance(got, ReportColumns) != case.bad, (case.cls, case.note, got)
        if case.cls == "valid":
            valid += 1
            fast += fast_taken(case.value, key)
    assert valid > 1_000
    assert fast == valid  # the corpus writes canonical names only


_name = st.sampled_from(
    [
        B0,
        B1,
        B2,
        f"{NS}/0x00000000_0xffffffff",
        f"{NS}/0x3FFFFFFF_0x40000001",
        f"{NS}/0x20000000_0x30000000",
        "a/b/0x00000000_0x00000010",
        "a/b.c/0x00000005_0x00000010",
        "a/b/0x00000010_0x00000020",
        "a/b/0x0000000f_0x00000011",
        f"{NS}/0x40000000_0x40000000",
        B0 + "\n",
        "x/y/0x1_0x2",
        "bad",
        "",
        f"{NS}/0x80000000_0x40000000",
    ]
) | st.text(max_size=8)
_number_value = (
    st.integers(min_value=-3, max_value=3)
    | st.sampled_from([2**53, 2**53 + 1, 2**53 + 2, 2**63, 2**64, 10**400, -(2**63), 0.5, -0.0])
    | st.floats(allow_nan=True)
    | st.booleans()
    | st.none()
    | st.sampled_from(["1", [], {}])
)
_stats_value = st.dictionaries(
    st.sampled_from(
        [
            "msgRateIn",
            "msgRateOut",
            "msgThroughputIn",
            "msgThroughputOut",
            "topics",
            "consumerCount",
            "producerCount",
            "other",
        ]
    ),
    _number_value,
    max_size=8,
) | st.sampled_from([None, [], 1, "x"])


@settings(max_examples=400, deadline=None)
@given(
    stats=st.none()
    | st.dictionaries(_name, _stats_value, max_size=6)
    | st.sampled_from([[], [1], 0, "x"]),
    bundles=st.none() | st.lists(_name | st.integers(), max_size=6) | st.sampled_from(["x", {}]),
    head=st.dictionaries(
        st.sampled_from(["msgRateIn", "numBundles", "cpu", "lastUpdate"]), _number_value, max_size=2
    ),
    key=st.sampled_from([KEY, None]),
)
def test_near_valid_documents_agree(stats: Any, bundles: Any, head: dict, key: str | None) -> None:
    doc: dict[str, Any] = {"webServiceUrl": "http://broker-1:8080", **head}
    if stats is not None:
        doc["lastStats"] = stats
    if bundles is not None:
        doc["bundles"] = bundles
    same(_raw(doc), key)


def test_a_name_holding_a_newline_is_never_read_as_two_names() -> None:
    assert _ranges_ok([B0, B1])
    assert not _ranges_ok([f"{B0}\n{B1}"])
    assert not _ranges_ok([f"{B0}\n{B1}", B2])


# -- the memory of checked bundle lists -----------------------------------------------------


def test_a_remembered_list_is_not_checked_again(monkeypatch) -> None:
    from loadbalance import report_columns

    calls = []
    check = report_columns._ranges_ok
    monkeypatch.setattr(report_columns, "_ranges_ok", lambda u: calls.append(1) or check(u))
    known = KnownBundleLists()
    raw = _raw(_base())
    first = decode_report_columns(raw, KEY, known=known)
    again = decode_report_columns(raw, KEY, known=known)
    assert first == again == decode_report_columns(raw, KEY)
    assert len(calls) == 2  # once with the memory (then remembered), once without it
    assert len(known) == 1


def test_a_remembered_stats_list_does_not_pass_a_different_bundles_list() -> None:
    """The same ``lastStats`` names beside a ``bundles`` list with an overlap: refused, as
    without the memory (the digest covers both lists)."""
    known = KnownBundleLists()
    good = _raw(_base())
    decode_report_columns(good, KEY, known=known)
    overlapping = _with(bundles=[B0, B1, f"{NS}/0x3fffffff_0x40000001"])
    expected = _outcome(decode_report_columns, overlapping, KEY)[1]
    assert isinstance(expected, InvalidReport) and "overlap" in expected.reason
    with pytest.raises(InvalidReport) as got:
        decode_report_columns(overlapping, KEY, known=known)
    assert (got.value.field, got.value.reason) == (expected.field, expected.reason)
    # and the bundles list given as None, or empty, is a list of its own
    assert KnownBundleLists.key([B0, B1], None) != KnownBundleLists.key([B0, B1], [])
    assert KnownBundleLists.key([B0], [B1]) != KnownBundleLists.key([B0, B1], None)


def test_a_name_with_a_newline_has_no_digest() -> None:
    """Joined by newlines, ``["a\\nb"]`` and ``["a", "b"]`` would read alike: such a list is
    never remembered (it is refused by the name check anyway)."""
    assert KnownBundleLists.key([f"{B0}\n{B1}"], None) is None
    assert KnownBundleLists.key([B0], [f"{B0}\n{B1}"]) is None
    assert KnownBundleLists.key([B0, B1], None) is not None
    known = KnownBundleLists()
    raw = _stats(**{f"{B0}\n{B1}": {}})
    assert (
        _outcome(decode_report_columns, raw, KEY, known=known)[0]
        == _outcome(decode_report_columns, raw, KEY)[0]
    )
    assert len(known) == 0


def test_the_memory_is_bounded() -> None:
    known = KnownBundleLists(max_entries=2)
    for i in range(5):
        known.add(bytes([i]) * 32)
        assert len(known) <= 2
    assert bytes([4]) * 32 in known
