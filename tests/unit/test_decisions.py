"""Decisions: deterministic ids, versioned JSON, validation naming the field."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadbalance.decisions import (
    SPLIT,
    TRANSFER,
    UNLOAD,
    decode_decision,
    encode_decision,
    make_decision,
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
