"""The decider's term and id on the decisions wire (``loadbalance.decisions``).

Pinned: a stamped decision carries ``deciderTerm`` and ``decider`` and reads back with them; an
unstamped one (an older job, ``lbctl decide``) keeps its exact bytes and reads as term 0; the id
never depends on the term (a cycle replayed under a newer term de-duplicates); and the gate
refuses a term or id of the wrong shape, naming the field.
"""

from __future__ import annotations

import json

import pytest

from loadbalance.decisions import TRANSFER, decode_decision, encode_decision, make_decision
from loadbalance.errors import InvalidDecision

B = "acme/ns/0x00000000_0x40000000"


def _move():
    return make_decision(cycle="7", kind=TRANSFER, bundle=B, source_broker="b1",
                         destination_broker="b2", reason="Overloaded")  # fmt: skip


def test_a_stamped_decision_reads_back_with_its_term_and_decider() -> None:
    d = _move()
    raw = encode_decision(d, term=3, decider="host:42:abcd")
    doc = json.loads(raw)
    assert (doc["deciderTerm"], doc["decider"], doc["schemaVersion"]) == (3, "host:42:abcd", 1)
    back = decode_decision(raw)
    assert (back.term, back.decider, back.id) == (3, "host:42:abcd", d.id)
    assert encode_decision(back) == raw  # the decoded decision carries them on


def test_an_unstamped_decision_keeps_its_bytes_and_reads_as_term_zero() -> None:
    d = _move()
    raw = encode_decision(d)
    assert b"decider" not in raw
    back = decode_decision(raw)
    assert (back.term, back.decider) == (0, "")
    # the id is the same under any term: a replay under a newer term is a duplicate
    assert decode_decision(encode_decision(d, term=9, decider="x:1:y")).id == back.id


@pytest.mark.parametrize(
    ("field", "value"),
    [("deciderTerm", -1), ("deciderTerm", True), ("deciderTerm", "2"), ("deciderTerm", 1.5),
     ("deciderTerm", 2**63), ("decider", 7), ("decider", "a\nb"), ("decider", "x" * 257)],
)  # fmt: skip
def test_a_bad_term_or_decider_is_refused_by_name(field: str, value: object) -> None:
    doc = json.loads(encode_decision(_move(), term=1, decider="h:1:r"))
    doc[field] = value
    with pytest.raises(InvalidDecision) as e:
        decode_decision(json.dumps(doc).encode())
    assert e.value.field == field
