"""The codec's JSON step: orjson where it reads exactly what ``json.loads`` reads, else json.

Every test compares the codec with orjson against the codec with it switched off (the module's
``orjson`` set to None, as on a runtime without it): same document value for value (types and
float bits included), same result, or the same rejection with the same field and reason.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadbalance import report_codec
from loadbalance.errors import InvalidReport
from loadbalance.report_codec import decode_report_columns, load_report_document

orjson = pytest.importorskip("orjson")  # a project dependency; the comparison needs both paths


BUNDLE = "public/default/0x00000000_0x40000000"
STATS_FIELDS = ("msgRateIn", "msgRateOut", "msgThroughputIn", "msgThroughputOut", "topics",
                "consumerCount", "producerCount")  # fmt: skip


def _typed(value: Any) -> list[Any]:
    """``value`` as a flat list of tokens, each leaf tagged by its type and floats by their
    bits: ``==`` on the result is identity of JSON values (1 != 1.0, 0.0 != -0.0, NaN == NaN).
    Iterative, so documents nested a thousand deep compare too."""
    out: list[Any] = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            out.append(("dict", len(v)))
            for k, item in reversed(list(v.items())):
                stack.append(item)
                stack.append(("key", k))
        elif isinstance(v, list):
            out.append(("list", len(v)))
            stack.extend(reversed(v))
        elif isinstance(v, float):
            out.append(("float", struct.pack("<d", v)))
        elif isinstance(v, tuple) and len(v) == 2 and v[0] == "key":
            out.append(v)
        else:
            out.append((type(v).__name__, v))
    return out


def _outcome(raw: bytes, *, fast: bool) -> Any:
    saved = report_codec.orjson
    if not fast:
        report_codec.orjson = None
    try:
        try:
            doc = _typed(load_report_document(raw))
        except InvalidReport as e:
            return ("refused", e.field, e.reason)
        try:
            return ("decoded", doc, decode_report_columns(raw, "b1"))
        except InvalidReport as e:
            return ("refused", e.field, e.reason)
    finally:
        report_codec.orjson = saved


def _same(raw: bytes) -> None:
    assert _outcome(raw, fast=True) == _outcome(raw, fast=False)


def _report(**fields: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "cpu": {"usage": 12.5, "limit": 100.0},
        "msgRateIn": 10.0,
        "bundles": [BUNDLE],
        "lastStats": {BUNDLE: dict(zip(STATS_FIELDS, (1.5, 2.0, 3.0, 4.0, 2, 1, 1), strict=True))},
        "lastUpdate": 1_700_000_000_000,
    }
    doc.update(fields)
    return doc


def test_the_fast_path_is_taken_for_a_plain_report() -> None:
    raw = json.dumps(_report()).encode()
    assert report_codec._fast_json(raw) == json.loads(raw)


@pytest.mark.parametrize(
    "literal",
    [
        "18446744073709551616",  # 2^64: a float in orjson, an int in json
        "-9223372036854775809",  # -2^63 - 1: the same
        "123456789012345678901234567890",
        "18446744073709551615",
        "9007199254740993",
        "1e400",  # infinite: json reads inf, orjson refuses
        "-1e400",
        "1.7976931348623159e308",
        "NaN",
        "Infinity",
        "-Infinity",
        "4.9e-324",
        "2.2250738585072011e-308",
        "0.1000000000000000055511151231257827",
        "-0.0",
        "1E5",
    ],
)
def test_numbers_orjson_and_json_read_differently_are_judged_as_json_reads_them(
    literal: str,
) -> None:
    for where in ("msgRateIn", "lastUpdate", "bundles", "stats", "unknown"):
        if where == "bundles":
            text = json.dumps(_report()).replace(
                f'"bundles": ["{BUNDLE}"]', f'"bundles": [{literal}]'
            )
        elif where == "stats":
            text = json.dumps(_report()).replace('"msgRateIn": 1.5', f'"msgRateIn": {literal}')
        elif where == "unknown":
            text = json.dumps(_report()).replace(
                '"msgRateIn": 10.0', f'"msgRateIn": 10.0, "x": {literal}'
            )
        else:
            text = json.dumps(_report()).replace(f'"{where}": ', f'"{where}": {literal}, "_": ', 1)
        assert literal in text
        _same(text.encode())


def test_a_huge_integer_in_the_bundle_list_is_named_as_an_int() -> None:
    text = json.dumps(_report()).replace(
        f'"bundles": ["{BUNDLE}"]', '"bundles": [18446744073709551616]'
    )
    outcome = _outcome(text.encode(), fast=True)
    assert outcome[0] == "decoded"
    issues = outcome[2].head.issues
    assert issues and "got int" in issues[0].reason


@pytest.mark.parametrize("depth", [3, 254, 255, 600, 1000, 1023, 1024, 1025, 5000])
def test_deep_nesting_is_accepted_or_refused_as_json_does(depth: int) -> None:
    deep = "[" * depth + "]" * depth
    _same(
        json.dumps(_report())
        .replace('"msgRateIn": 10.0', f'"msgRateIn": 10.0, "x": {deep}')
        .encode()
    )


def test_a_document_nested_1000_deep_is_refused_as_json_refuses_it() -> None:
    deep = "[" * 1000 + "]" * 1000
    raw = (
        json.dumps(_report())
        .replace('"msgRateIn": 10.0', f'"msgRateIn": 10.0, "x": {deep}')
        .encode()
    )
    assert _outcome(raw, fast=True) == ("refused", "record", "not valid JSON (RecursionError)")


@pytest.mark.parametrize(
    "raw",
    [
        b'{"webServiceUrl": "\\ud800"}',  # a lone surrogate escape: json reads it, orjson refuses
        b'{"webServiceUrl": "\\udc00\\ud800", "x": 1}',
        b'{"webServiceUrl": "\xed\xa0\x80"}',  # an encoded surrogate: not UTF-8
        b'\xef\xbb\xbf{"msgRateIn": 1}',  # a byte order mark
        b'{"msgRateIn": 1, "msgRateIn": 2, "webServiceUrl": "http://h:1"}',  # duplicate keys
        b'{"a": "\x01"}',
        b'{"a": 1,}',
        b"[]",
        b"null",
        b"",
        b"\xff\xfe",
        b'{"lastStats": {"a/b/0x00000000_0xffffffff": {"msgRateIn": NaN}}, "webServiceUrl": "x"}',
    ],
)
def test_malformed_and_odd_documents_are_refused_or_read_as_json_does(raw: bytes) -> None:
    _same(raw)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)
report_keys = st.sampled_from(
    ["cpu", "memory", "msgRateIn", "numTopics", "bundles", "lastStats", "lastUpdate",
     "webServiceUrl", "brokerVersionString", "x"]
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(report_keys, json_values, max_size=6))
def test_arbitrary_documents_decode_the_same_with_and_without_orjson(doc: dict) -> None:
    _same(json.dumps(doc, allow_nan=True).encode())


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.floats(allow_nan=False, allow_infinity=False, width=64)
        | st.integers(min_value=0, max_value=2**53),
        min_size=7,
        max_size=7,
    )
)
def test_bundle_figures_decode_to_the_same_bits_with_and_without_orjson(figures: list) -> None:
    doc = _report(lastStats={BUNDLE: dict(zip(STATS_FIELDS, figures, strict=True))})
    _same(json.dumps(doc).encode())


def test_float_literals_read_to_the_same_bits_as_json() -> None:
    """Shortest round-trip forms and long decimal forms, near the ends of the float range."""
    rng = __import__("random").Random(7)
    literals = []
    for _ in range(3000):
        x = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
        if math.isfinite(x):
            literals.append(repr(x))
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 18)))
        literals.append(f"{int(digits)}e{rng.randint(-340, 290)}")
        literals.append(f"0.{digits}")
    raw = json.dumps({"x": 0}).replace("0", "[" + ",".join(literals) + "]").encode()
    fast = report_codec._fast_json(raw)
    assert fast is not None  # no literal reaches the 19-digit guard
    assert _typed(fast) == _typed(json.loads(raw))


def test_long_fractions_take_the_fast_path_and_wide_integers_do_not() -> None:
    fraction = json.dumps(_report(msgRateIn=0.0024030278220090627)).encode()
    assert b"0.0024030278220090627" in fraction
    assert report_codec._fast_json(fraction) is not None
    for literal in (b"-9223372036854775809", b"18446744073709551616", b"[12345678901234567890]"):
        raw = (
            json.dumps(_report())
            .encode()
            .replace(b'"lastUpdate": ', b'"x": ' + literal + b', "lastUpdate": ')
        )
        assert report_codec._fast_json(raw) is None, literal


def _unguarded(raw: bytes) -> Any:
    return report_codec._unguarded_columns(raw, "b1", report_codec.DEFAULT_MAX_REPORT_BYTES, None)


def test_a_plain_report_is_decoded_without_the_raw_scans(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = json.dumps(
        _report(
            lastStats={
                f"public/ns{i}/0x00000000_0xffffffff": dict(
                    zip(STATS_FIELDS, (i + 0.5, 2.0, 3.0, 4.0, 2, 1, 1), strict=True)
                )
                for i in range(50)
            },
            bundles=[f"public/ns{i}/0x00000000_0xffffffff" for i in range(60)],
        )
    ).encode()
    expected = _outcome(raw, fast=False)

    def scanned(_raw: Any) -> Any:
        raise AssertionError("the raw bytes were scanned")

    monkeypatch.setattr(report_codec, "_fast_json", scanned)
    assert _unguarded(raw) is not None
    assert ("decoded", expected[1], decode_report_columns(raw, "b1")) == expected


@pytest.mark.parametrize(
    ("anchor", "extra"),
    [
        # what the raw scans guard against, inside a stats entry beside its seven figures
        ('"topics": 2', "18446744073709551616"),
        ('"topics": 2', "[" * 1000 + "]" * 1000),
        # and outside the bundles
        ('"msgRateIn": 10.0', '{"y": [-9223372036854775809]}'),
        ('"msgRateIn": 10.0', "[" * 1000 + "]" * 1000),
    ],
)
def test_a_document_the_raw_scans_would_stop_is_decoded_the_guarded_way(
    anchor: str, extra: str
) -> None:
    text = json.dumps(_report())
    assert anchor in text
    raw = text.replace(anchor, f'{anchor}, "x": {extra}', 1).encode()
    assert orjson.loads(raw)  # orjson reads it; the guarded decode must decide
    assert _unguarded(raw) is None
    _same(raw)


def _broker_load_data() -> dict[str, Any]:
    """The extensible manager's ``BrokerLoadData``: no bundles, so its decode always carries a
    ``no_bundle_data`` issue."""
    return {
        "cpu": {"usage": 12.5, "limit": 100.0},
        "msgThroughputIn": 10.0,
        "bundleCount": 3,
        "topics": 5,
        "updatedAt": 1_700_000_000_000,
    }


def test_a_plain_broker_load_data_is_decoded_once() -> None:
    raw = json.dumps(_broker_load_data()).encode()
    assert _unguarded(raw) is not None
    _same(raw)


@pytest.mark.parametrize("extra", ["18446744073709551616", "[" * 1000 + "]" * 1000])
def test_a_broker_load_data_the_raw_scans_would_stop_is_decoded_the_guarded_way(
    extra: str,
) -> None:
    raw = json.dumps(_broker_load_data()).replace('"topics": 5', f'"topics": 5, "x": {extra}')
    assert orjson.loads(raw.encode())
    assert _unguarded(raw.encode()) is None
    _same(raw.encode())


def test_fields_beside_the_seven_figures_must_be_plain_scalars() -> None:
    doc = _report()
    assert report_codec._plain_document(doc)
    entry = doc["lastStats"][BUNDLE]
    for plain in (1, 2.5, -(2.0**62), "x", None, True):
        entry["cacheSize"] = plain
        assert report_codec._plain_document(doc), plain
    for wide_or_nested in (2.0**63, -(2.0**64), [1], {}):
        entry["cacheSize"] = wide_or_nested
        assert not report_codec._plain_document(doc), wide_or_nested
    entry["cacheSize"] = 1
    doc["bundleStats"] = {BUNDLE: {"msgRateIn": 2.0**70}}  # not read in a LocalBrokerData
    assert not report_codec._plain_document(doc)
    doc["bundleStats"] = {BUNDLE: {"msgRateIn": 2.0**60, "cacheSize": 3}}
    assert report_codec._plain_document(doc)


@settings(max_examples=400, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["x", "y", "cpu", "lastUpdate", "numTopics"]), json_values, max_size=3
    ),
    st.dictionaries(st.sampled_from(["x", "topics", "msgRateIn"]), json_values, max_size=2),
)
def test_whatever_is_decoded_unguarded_is_what_json_loads_reads(top: dict, entry: dict) -> None:
    """The claim the unguarded decode rests on: when it answers, orjson read the same document
    as ``json.loads``."""
    doc = _report(**top)
    doc["lastStats"][BUNDLE].update(entry)
    raw = json.dumps(doc, allow_nan=True).encode()
    if _unguarded(raw) is None:
        _same(raw)
        return
    # the raw scans are cautious (any 19-digit run, even within 64 bits, goes to json.loads),
    # so what must hold is that orjson read what json.loads reads
    assert _typed(orjson.loads(raw)) == _typed(json.loads(raw))
    _same(raw)
