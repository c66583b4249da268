"""Decisions: deterministic ids, versioned JSON, validation naming the field."""

from __future__ import annotations

import contextlib
import hashlib
import json
from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadbalance.bundles import parse_bundle
from loadbalance.decisions import (
    KINDS,
    SPLIT,
    TRANSFER,
    UNLOAD,
    Decision,
    decision_id,
    decision_to_dict,
    decode_decision,
    encode_decision,
    make_decision,
    transfer_of,
)
from loadbalance.errors import InvalidDecision, InvalidInput

B = "t/ns/0x00000000_0x80000000"


def _split(cycle: str = "7") -> object:
    return make_decision(
        cycle=cycle,
        kind=SPLIT,
        bundle=B,
        source_broker="b1",
        split_boundaries=(0x40000000,),
        split_algorithm="range_equally_divide",
        reason="MsgRate",
        strategy="BundleSplitterTask",
        inputs={"msgRate": 45000.0, "threshold": 30000},
        decided_at_ms=1000,
    )


def test_same_cycle_and_content_give_the_same_id() -> None:
    assert _split().id == _split().id
    assert _split("7").id != _split("8").id


def test_ids_differ_by_kind_and_destination() -> None:
    a = make_decision(cycle="1", kind=UNLOAD, bundle=B, source_broker="b1")
    b = make_decision(
        cycle="1", kind=TRANSFER, bundle=B, source_broker="b1", destination_broker="b2"
    )
    c = make_decision(
        cycle="1", kind=TRANSFER, bundle=B, source_broker="b1", destination_broker="b3"
    )
    assert len({a.id, b.id, c.id}) == 3


def test_round_trip() -> None:
    d = _split()
    raw = encode_decision(d)
    assert json.loads(raw)["schemaVersion"] == 1
    assert json.loads(raw)["splitBoundaries"] == ["0x40000000"]
    back = decode_decision(raw)
    assert back == d
    assert encode_decision(back) == raw


def test_unknown_kind_is_refused_at_construction() -> None:
    with pytest.raises(InvalidInput):
        make_decision(cycle="1", kind="teleport", bundle=B, source_broker="b1")


def _doc(**changes: object) -> bytes:
    doc = json.loads(encode_decision(_split()))
    doc.update(changes)
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b"{", "record"),
        (b"[]", "record"),
        (_doc(schemaVersion=2), "schemaVersion"),
        (_doc(kind="teleport"), "kind"),
        (_doc(bundle="nope"), "bundle"),
        (_doc(splitBoundaries=[]), "splitBoundaries"),
        (_doc(splitBoundaries=["0x1ffffffff"]), "splitBoundaries"),
        (_doc(splitBoundaries=["zz"]), "splitBoundaries"),
        (_doc(kind="transfer", destinationBroker=None), "destinationBroker"),
        (_doc(kind="transfer", destinationBroker="b1"), "destinationBroker"),
        (_doc(kind="merge", mergeBundle=None), "mergeBundle"),
        (_doc(inputs={"a": [1]}), "inputs"),
        (_doc(decidedAtMs=-1), "decidedAtMs"),
        (_doc(id="x"), "id"),
    ],
)
def test_bad_decisions_name_the_field(raw: bytes, field: str) -> None:
    with pytest.raises(InvalidDecision) as e:
        decode_decision(raw)
    assert e.value.field == field


def test_size_limit_before_parsing() -> None:
    with pytest.raises(InvalidDecision, match="exceeds"):
        decode_decision(b" " * 100, max_bytes=10)


@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_crash(raw: bytes) -> None:
    with contextlib.suppress(InvalidDecision):
        decode_decision(raw)


# Hostile JSON: arbitrary nested values (the shapes a buggy or malicious producer can write).
HOSTILE_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                  max_size=4),
    max_leaves=16,
)  # fmt: skip
# Per field, values at the edges of what it accepts: bounds, look-alike types, near-valid text.
_TEXT_EDGES = ["", "x" * 256, "x" * 257, "\ud800", 5, None]
_BROKER_EDGES = ["", "b1", "b2", "x" * 1025, "\ud800", 7]
FIELD_EDGES = {
    "schemaVersion": [0, 2, True, 1.0, "1", None],
    "kind": ["", "SPLIT", "teleport", 1, None],
    "bundle": ["t/ns/0x00000000_0x80000000\n", "T/ns/0x0000000A_0x8000000B",
               "t/ns/0x80000000_0x00000000", "t/ns/0x00000000_0x1ffffffff", "t/ns", "",
               "t/n s/0x00000000_0x80000000"],
    "id": ["", "x" * 7, "x" * 8, "x" * 128, "x" * 129, "abcdefgh\n", "\ud800abcdefgh", 12345678],
    "decidedAtMs": [-1, 0, 2**63 - 1, 2**63, 2**64, True, 1.5, "5"],
    "sourceBroker": _BROKER_EDGES,
    "destinationBroker": _BROKER_EDGES,
    "cycle": _TEXT_EDGES,
    "reason": _TEXT_EDGES,
    "strategy": _TEXT_EDGES,
    "splitAlgorithm": _TEXT_EDGES,
    "mergeBundle": ["t/ns/0x80000000_0xffffffff", "acme/prod/0x00000000_0x80000000",
                    "t/ns/0x00000000_0x80000000", "t/ns/0x00000000_0x40000000", ""],
    "splitBoundaries": [[], ["0x00000000"], ["0xffffffff"], ["0x40000000", "0x40000000"],
                        [1073741824], [True], ["zz"], "0x40000000", [2**40], [None]],
    "inputs": [{"a": [1]}, {"a": {"b": 1}}, {"\ud800": 1}, {f"k{i}": i for i in range(257)},
               [], {"a": None, "b": 1.5}],
}  # fmt: skip
NAMESPACES = ("t/ns", "acme/prod")
FIELDS = ("schemaVersion", "kind", "bundle", "id", "decidedAtMs", "sourceBroker",
          "destinationBroker", "cycle", "reason", "strategy", "splitAlgorithm", "mergeBundle",
          "splitBoundaries", "inputs")  # fmt: skip
# Fields whose every valid value is a string, an integer or null: a non-empty list or object
# there must be refused, and the error must name the field.
SCALAR_FIELDS = tuple(f for f in FIELDS if f not in ("splitBoundaries", "inputs"))
_DROP = object()


@st.composite
def valid_decision_docs(draw: st.DrawFn) -> dict:
    """A valid decision of any kind, as the JSON object the streaming job writes."""
    ns = draw(st.sampled_from(NAMESPACES))
    lo = draw(st.integers(0, 0xFFFFFFFD))
    hi = draw(st.integers(lo + 2, 0xFFFFFFFF))
    bundle = f"{ns}/0x{lo:08x}_0x{hi:08x}"
    kind = draw(st.sampled_from((SPLIT, UNLOAD, TRANSFER, "merge")))
    extra: dict = {}
    if kind == SPLIT:
        extra["split_boundaries"] = (draw(st.integers(lo + 1, hi - 1)),)
        extra["split_algorithm"] = "range_equally_divide"
    if kind == TRANSFER:
        extra["destination_broker"] = "b2"
    if kind == "merge":
        if hi == 0xFFFFFFFF:  # the neighbour below (lo > 0) or, for the full ring, none
            if lo == 0:
                kind = UNLOAD
            else:
                extra["merge_bundle"] = f"{ns}/0x{0:08x}_0x{lo:08x}"
        else:
            extra["merge_bundle"] = f"{ns}/0x{hi:08x}_0xffffffff"
    d = make_decision(cycle=draw(st.text(max_size=8)), kind=kind, bundle=bundle,
                      source_broker="b1", reason="MsgRate", decided_at_ms=draw(
                          st.integers(0, 2**63 - 1)), **extra)  # fmt: skip
    return json.loads(encode_decision(d))


def _check_decoded(d: object) -> None:
    """What any decision the decoder lets through must be, checked without the decoder."""
    assert isinstance(d, Decision)
    assert d.kind in KINDS
    r = parse_bundle(d.bundle)
    assert r.name == d.bundle, "canonical spelling"
    assert isinstance(d.id, str) and 8 <= len(d.id) <= 128 and d.id.isprintable()
    assert type(d.decided_at_ms) is int and 0 <= d.decided_at_ms <= 2**63 - 1
    assert list(d.split_boundaries) == sorted(set(d.split_boundaries))
    assert all(type(b) is int and r.lower < b < r.upper for b in d.split_boundaries)
    assert (d.kind != SPLIT) or d.split_boundaries
    for v in (d.source_broker, d.destination_broker, d.merge_bundle):
        assert v is None or (isinstance(v, str) and v)
    assert d.split_algorithm is None or isinstance(d.split_algorithm, str)
    if d.kind == TRANSFER:
        assert d.destination_broker is not None and d.destination_broker != d.source_broker
    if d.merge_bundle is not None:
        m = parse_bundle(d.merge_bundle)
        assert m.namespace == r.namespace and (m.lower == r.upper or m.upper == r.lower)
    for v in (d.cycle, d.reason, d.strategy):
        assert isinstance(v, str) and len(v) <= 256
    assert all(isinstance(k, str) for k in d.inputs)
    assert all(v is None or isinstance(v, (str, int, float, bool)) for v in d.inputs.values())


@settings(max_examples=400, deadline=None)
@given(valid_decision_docs())
def test_valid_decisions_of_every_kind_decode(doc: dict) -> None:
    _check_decoded(decode_decision(json.dumps(doc).encode()))


@settings(max_examples=1500, deadline=None)
@given(
    valid_decision_docs(),
    st.lists(
        st.sampled_from(FIELDS).flatmap(
            lambda f: st.tuples(
                st.just(f), st.just(_DROP) | st.sampled_from(FIELD_EDGES[f]) | HOSTILE_JSON
            )
        ),
        min_size=1,
        max_size=3,
    ),
)
def test_mutated_decisions_are_refused_naming_a_field_or_decode_to_valid_decisions(
    doc: dict, mutations: list
) -> None:
    for key, value in mutations:
        if value is _DROP:
            doc.pop(key, None)
        else:
            doc[key] = value
    raw = json.dumps(doc).encode()
    try:
        d = decode_decision(raw)
    except InvalidDecision as e:
        assert e.field in (*FIELDS, "record", "namespace"), e
        assert e.reason
        return
    _check_decoded(d)


@settings(max_examples=600, deadline=None)
@given(
    valid_decision_docs(),
    st.sampled_from(SCALAR_FIELDS),
    st.lists(HOSTILE_JSON, min_size=1, max_size=3)
    | st.dictionaries(st.text(max_size=6), HOSTILE_JSON, min_size=1, max_size=3),
)
def test_a_list_or_object_in_a_scalar_field_is_refused_naming_that_field(
    doc: dict, key: str, container: object
) -> None:
    doc[key] = container
    with pytest.raises(InvalidDecision) as e:
        decode_decision(json.dumps(doc).encode())
    assert e.value.field == key, (key, str(e.value))


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), _text,
                    st.floats(allow_nan=True, allow_infinity=True))  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(
    lower=st.integers(0, 0xFFFFFFFE),
    width=st.integers(1, 0xFFFFFFFF),
    namespace=st.sampled_from(["t/ns", "pulsar/system", "a-b/c_d.e=f:g"]),
    cycle=_text,
    source=st.one_of(st.none(), _text),
    dest=_text,
    reason=_text,
    inputs=st.dictionaries(_text, _scalar, max_size=4),
    at=st.integers(0, 2**62),
)
def test_a_transfer_of_an_unload_is_the_transfer_make_decision_gives(
    lower, width, namespace, cycle, source, dest, reason, inputs, at
):
    bundle = f"{namespace}/0x{lower:08x}_0x{min(lower + width, 0xFFFFFFFF):08x}"
    unload = make_decision(cycle=cycle, kind=UNLOAD, bundle=bundle, source_broker=source,
                           reason=reason, strategy="ThresholdShedder", inputs={"x": 1.0},
                           decided_at_ms=at)  # fmt: skip
    want = make_decision(cycle=cycle, kind=TRANSFER, bundle=unload.bundle, source_broker=source,
                         destination_broker=dest, reason=reason, strategy="ThresholdShedder",
                         inputs=inputs, decided_at_ms=at)  # fmt: skip
    got = transfer_of(unload, cycle=cycle, destination=dest, inputs=inputs)
    assert got == want
    assert encode_decision(got) == encode_decision(want)


def test_ids_and_documents_are_the_json_module_defaults_text():
    """The kept encoders give what ``json.dumps`` gives with the same arguments (ids and
    documents are compared across versions)."""
    d = _split()
    key = ["7", "split", B, "b1", None, [0x40000000], None]
    text = json.dumps(key, separators=(",", ":"))
    assert (
        decision_id("7", SPLIT, B, "b1", None, (0x40000000,))
        == (hashlib.sha256(text.encode()).hexdigest()[:32])
    )
    want = json.dumps(decision_to_dict(d), separators=(",", ":"), sort_keys=True).encode()
    assert encode_decision(d) == want


def _json_id(*parts) -> str:
    """The id as its definition states it: SHA-256 of the compact JSON array."""
    cycle, kind, bundle, source, destination, bounds, merge = parts
    key = json.dumps(
        [cycle, kind, bundle, source, destination, list(bounds), merge], separators=(",", ":")
    )
    return hashlib.sha256(key.encode()).hexdigest()[:32]


_ID_TEXT = st.one_of(
    st.text(max_size=12),
    st.text(alphabet='ab"\\\x00\x1f\x7f~ é/:', max_size=6),
    st.sampled_from(["broker-1:8080", "t/ns/0x00000000_0xffffffff", "", '"', "\\"]),
)


@settings(max_examples=500, deadline=None)
@given(
    cycle=_ID_TEXT,
    kind=st.sampled_from([UNLOAD, TRANSFER, SPLIT, "unload"]),
    bundle=_ID_TEXT,
    source=st.one_of(st.none(), _ID_TEXT),
    destination=st.one_of(st.none(), _ID_TEXT),
)
def test_decision_id_is_the_hash_of_the_json_array(cycle, kind, bundle, source, destination):
    """Unload and transfer ids are put together without the JSON encoder when no string
    needs escaping; any string (quotes, backslashes, control characters, non-ASCII, DEL)
    must still give the hash of exactly the text ``json.dumps`` writes."""
    got = decision_id(cycle, kind, bundle, source, destination)
    assert got == _json_id(cycle, kind, bundle, source, destination, (), None)


def test_decision_id_examples_of_each_path() -> None:
    """Fixed examples of the property above, one per branch of the shortcut."""
    b = "t/ns/0x00000000_0xffffffff"
    for args in (
        ("1", TRANSFER, b, "a:1", "b:2"),
        ("1", UNLOAD, b, "a:1", None),
        ("1", UNLOAD, b, 'a"1', None),
        ("1", UNLOAD, b, "a\\1", "x"),
        ("1", UNLOAD, b, "a:1", "é"),
        ("1", UNLOAD, b, None, "b"),
    ):
        assert decision_id(*args) == _json_id(*args, (), None), args
    assert decision_id("1", SPLIT, b, "a", None, (5,)) == _json_id(
        "1", SPLIT, b, "a", None, (5,), None
    )


def test_decisions_made_slot_by_slot_are_ordinary_decisions() -> None:
    """``make_decision`` and ``transfer_of`` set a decision's slots directly instead of
    calling the dataclass constructor; what they give must equal, print and
    ``replace`` like the same decision built with ``Decision(...)``, field by field."""
    import dataclasses

    made = make_decision(cycle="c9", kind=SPLIT, bundle=B, source_broker="b1",
                         destination_broker=None, split_boundaries=(0x40000000,),
                         split_algorithm="range_equally_divide", reason="Topics",
                         strategy="BundleSplitterTask", inputs={"topics": 3},
                         decided_at_ms=77)  # fmt: skip
    built = Decision(**{f.name: getattr(made, f.name) for f in dataclasses.fields(Decision)})
    assert [getattr(made, f.name) for f in dataclasses.fields(Decision)] == [
        made.id, SPLIT, B, "b1", None, (0x40000000,), "range_equally_divide", None, "Topics",
        "BundleSplitterTask", {"topics": 3}, "c9", 77, built.schema_version, 0, "",
    ]  # fmt: skip
    assert made == built and repr(made) == repr(built)
    assert dataclasses.replace(made, reason="x") == dataclasses.replace(built, reason="x")
    unload = make_decision(cycle="c9", kind=UNLOAD, bundle=B, source_broker="b1",
                           reason="Overloaded", strategy="ThresholdShedder",
                           decided_at_ms=5)  # fmt: skip
    moved = transfer_of(unload, cycle="c9", destination="b2", inputs={"k": 1.5})
    want = Decision(id=moved.id, kind=TRANSFER, bundle=B, source_broker="b1",
                    destination_broker="b2", reason="Overloaded", strategy="ThresholdShedder",
                    inputs=MappingProxyType({"k": 1.5}), cycle="c9",
                    decided_at_ms=5)  # fmt: skip
    assert moved == want and repr(moved) == repr(want)
    with pytest.raises(dataclasses.FrozenInstanceError):
        moved.reason = "y"  # type: ignore[misc]
