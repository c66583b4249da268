"""The string enums keep every wire format byte for byte: decisions JSON, outcome records, metric
labels, the streaming job's row kinds. Each member must render as exactly the plain word it
replaced, whichever way the shell turns it into text or bytes."""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry, Counter

from loadbalance.decisions import (
    KINDS,
    MERGE,
    SPLIT,
    TRANSFER,
    UNLOAD,
    Skip,
    decision_id,
    decode_decision,
    encode_decision,
    make_decision,
)
from loadbalance.values import DecisionKind, DecisionReason, OutcomeKind, SkipReason, StrEnum
from streaming.schema import BROKER, BROKER_GONE, DEAD, REPORT, SAMPLES, SHARD, SHARD_DELTA, RowKind

# The texts on the wire, written out: changing one of these is changing a published format.
WIRE_TEXTS: dict[type[StrEnum], tuple[str, ...]] = {
    DecisionKind: ("split", "unload", "transfer", "merge"),
    OutcomeKind: ("applied", "already_satisfied", "conflict", "rejected", "duplicate", "dry_run"),
    DecisionReason: (
        "Overloaded",
        "Underloaded",
        "Topics",
        "Sessions",
        "MsgRate",
        "Bandwidth",
        "Admin",
        "Cold",
        "Unknown",
    ),
    SkipReason: (
        "Disabled",
        "NoBrokers",
        "NoBundles",
        "NoLoadData",
        "Balanced",
        "HitCount",
        "CoolDown",
        "OutDatedData",
        "HighUsageSingleBundle",
        "BelowMinUnload",
        "BelowMinThroughput",
        "InvalidBundle",
        "UnknownBundle",
        "CannotSplit",
        "MaxSplitsPerCycle",
        "NamespaceMaximumBundles",
        "NoBoundary",
        "Hysteresis",
        "MaxMergesPerCycle",
        "NamespaceMinimumBundles",
        "NamespacePolicies",
        "AntiAffinity",
        "NoMoveHelps",
    ),
    RowKind: ("samples", "report", "dead", "shard", "shard_delta", "broker", "broker_gone"),
}

MEMBERS = [m for cls in WIRE_TEXTS for m in cls]
BUNDLE = "tenant/ns/0x00000000_0x80000000"
NEXT = "tenant/ns/0x80000000_0xffffffff"


def test_every_enum_has_exactly_its_wire_texts() -> None:
    for cls, texts in WIRE_TEXTS.items():
        assert cls.values() == texts
        assert all(type(v) is str for v in cls.values())


@pytest.mark.parametrize("member", MEMBERS, ids=lambda m: f"{type(m).__name__}.{m.name}")
def test_member_renders_as_its_plain_text_everywhere(member: StrEnum) -> None:
    text = member.value
    assert member == text and text == member
    assert hash(member) == hash(text) and {text: 1}[member] == 1 and {member: 1}[text] == 1
    assert str(member) == text
    assert f"{member}" == text and f"{member:>24}" == f"{text:>24}"
    assert format(member, "") == text and "%s" % member == text  # noqa: UP031
    assert "{}".format(member) == text  # noqa: UP032
    assert member.encode() == text.encode()
    assert json.dumps(member) == json.dumps(text)
    assert json.dumps({member: [member]}, separators=(",", ":")) == f'{{"{text}":["{text}"]}}'
    assert ",".join([member, member]) == f"{text},{text}"
    blob = pickle.dumps(member, protocol=pickle.HIGHEST_PROTOCOL)
    assert pickle.loads(blob) is member
    assert blob == pickle.dumps(type(member)(text), protocol=pickle.HIGHEST_PROTOCOL)


@pytest.mark.parametrize("member", MEMBERS, ids=lambda m: f"{type(m).__name__}.{m.name}")
def test_metric_label_is_the_plain_text(member: StrEnum) -> None:
    registry = CollectorRegistry()
    counter = Counter("c", "test", ["label"], registry=registry)
    counter.labels(label=member).inc()
    (sample,) = [s for s in next(iter(registry.collect())).samples if s.name == "c_total"]
    assert sample.labels == {"label": member.value}
    assert type(sample.labels["label"]) is str


@dataclass(frozen=True)
class _Shape:
    """What a decision of one kind needs besides its kind and reason."""

    dst: str | None = None
    bounds: tuple[int, ...] = ()
    merge: str | None = None


SHAPES = {
    "split": _Shape(bounds=(0x40000000,)),
    "unload": _Shape(),
    "transfer": _Shape(dst="b2"),
    "merge": _Shape(merge=NEXT),
}


def _plain_decision_json(kind: str, reason: str, shape: _Shape) -> bytes:
    """The bytes a decision had when kinds and reasons were plain strings, written by hand."""
    did = decision_id("c7", kind, BUNDLE, "b1", shape.dst, shape.bounds, shape.merge)
    doc = {
        "schemaVersion": 1,
        "id": did,
        "kind": kind,
        "bundle": BUNDLE,
        "sourceBroker": "b1",
        "destinationBroker": shape.dst,
        "splitBoundaries": [f"0x{b:08x}" for b in shape.bounds],
        "splitAlgorithm": None,
        "mergeBundle": shape.merge,
        "reason": reason,
        "strategy": "S",
        "inputs": {"x": 1},
        "cycle": "c7",
        "decidedAtMs": 5,
    }
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


@pytest.mark.parametrize("kind", list(DecisionKind), ids=str)
@pytest.mark.parametrize("reason", list(DecisionReason), ids=str)
def test_decision_bytes_and_id_are_those_of_the_plain_strings(
    kind: DecisionKind, reason: DecisionReason
) -> None:
    shape = SHAPES[kind.value]
    d = make_decision(
        cycle="c7",
        kind=kind,
        bundle=BUNDLE,
        source_broker="b1",
        destination_broker=shape.dst,
        split_boundaries=shape.bounds,
        merge_bundle=shape.merge,
        reason=reason,
        strategy="S",
        inputs={"x": 1},
        decided_at_ms=5,
    )
    raw = encode_decision(d)
    assert raw == _plain_decision_json(kind.value, reason.value, shape)
    back = decode_decision(raw)
    assert back == d and type(back.kind) is DecisionKind and back.kind is kind
    assert encode_decision(back) == raw
    assert d.label == f"{kind.value}:{reason.value}"


def test_plain_string_kinds_are_accepted_and_become_members() -> None:
    d = make_decision(cycle="c", kind="unload", bundle=BUNDLE, source_broker="b1")
    assert d.kind is DecisionKind.UNLOAD
    assert KINDS == (SPLIT, UNLOAD, TRANSFER, MERGE) == ("split", "unload", "transfer", "merge")


def test_outcome_record_and_skip_serialize_as_before() -> None:
    doc = {"outcome": OutcomeKind.ALREADY_SATISFIED, "reason": "", "kind": DecisionKind.MERGE}
    assert json.dumps(doc) == '{"outcome": "already_satisfied", "reason": "", "kind": "merge"}'
    skip = Skip("TransferShedder", SkipReason.COOL_DOWN, "b1")
    assert json.dumps(skip.reason) == '"CoolDown"' and f"{skip.policy}:{skip.reason}" == (
        "TransferShedder:CoolDown"
    )


def test_row_kind_names_are_the_members() -> None:
    assert tuple(RowKind) == (SAMPLES, REPORT, DEAD, SHARD, SHARD_DELTA, BROKER, BROKER_GONE)
