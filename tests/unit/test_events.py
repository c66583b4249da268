"""Ownership events: the wire format round-trips, and delivery failures surface as Transient.

No Kafka here: the publisher points at a closed loopback port, which is exactly the case where
the control loop must not commit (the Kafka-backed path is in the control-loop and assignment
integration tests).
"""

from __future__ import annotations

import json
import socket

import pytest

from controller.events import (
    EVENT_KINDS,
    MAX_TOKEN,
    SPLIT,
    TRANSFERRED,
    EventPublisher,
    InvalidEvent,
    OwnershipEvent,
    decode_event,
    encode_event,
)
from controller.recovery import MAX_TOKEN_GAP, trusted_floor
from loadbalance.errors import Transient


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_events_round_trip_and_encode_to_the_same_bytes() -> None:
    e = OwnershipEvent(TRANSFERRED, "t/ns/0x00000000_0x80000000", 42, old_owner="b1",
                       new_owner="b2", old_token=3, new_token=9, decision_id="d1",
                       reason="Overloaded")  # fmt: skip
    kids = ("t/ns/0x00000000_0x40000000", "t/ns/0x40000000_0x80000000")
    split = OwnershipEvent(SPLIT, "t/ns/0x00000000_0x80000000", 43, children=kids)
    for x in (e, split):
        assert decode_event(encode_event(x)) == x
        assert encode_event(decode_event(encode_event(x))) == encode_event(x)
    doc = json.loads(encode_event(e))
    assert doc["schemaVersion"] == 1
    assert (doc["oldOwner"], doc["newToken"], doc["event"]) == ("b1", 9, "transferred")
    assert set(EVENT_KINDS) == {"assigned", "released", "transferred", "split", "merged",
                                "expired"}  # fmt: skip


def test_undeliverable_events_raise_transient_after_the_given_attempts() -> None:
    pub = EventPublisher(f"127.0.0.1:{_closed_port()}", "events")
    e = OwnershipEvent("assigned", "t/ns/0x00000000_0xffffffff", 1, new_owner="b1", new_token=1)
    assert pub.deliver([]) == 0
    with pytest.raises(Transient, match="not delivered"):
        pub.deliver([e], attempts=2, backoff_s=0.01, flush_timeout_s=0.2)
    stops = iter([False, True])
    with pytest.raises(Transient):  # attempts=None: only should_stop ends the retries
        pub.deliver([e], attempts=None, backoff_s=0.01, flush_timeout_s=0.2,
                    should_stop=lambda: next(stops))  # fmt: skip


GOOD = json.loads(encode_event(OwnershipEvent(TRANSFERRED, "t/ns/0x00000000_0x80000000", 42,
                                              old_owner="b1", new_owner="b2", old_token=3,
                                              new_token=9)))  # fmt: skip


def _with(**changes: object) -> bytes:
    doc = {**GOOD, **changes}
    return json.dumps({k: v for k, v in doc.items() if v is not _DROP}).encode()


_DROP = object()


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b"{not json", "record"),
        (b"[1, 2]", "record"),
        (b'{"event": "assigned", "bundle": "\xff"}', "record"),
        (b"[" * 100_000 + b"]" * 100_000, "record"),
        (_with(newToken=[[[[1]]]]), "newToken"),
        (_with(event=_DROP), "event"),
        (_with(bundle=_DROP), "bundle"),
        (_with(atMs=_DROP), "atMs"),
        (_with(newToken=10**30), "newToken"),
        (_with(newToken=2**63 - 1), "newToken"),
        (_with(newToken=MAX_TOKEN + 1), "newToken"),
        (_with(oldToken=0), "oldToken"),
        (_with(newToken=True), "newToken"),
        (_with(newToken="9"), "newToken"),
        (_with(newToken=9.0), "newToken"),
        (_with(event="stolen"), "event"),
        (_with(bundle="t/ns/0xzz"), "bundle"),
        (_with(bundle=["t/ns/0x00000000_0x80000000"]), "bundle"),
        (_with(children=["t/ns/bad"]), "children"),
        (_with(children="t/ns/0x00000000_0x80000000"), "children"),
        (_with(newOwner=7), "newOwner"),
        (_with(reason=None), "reason"),
        (_with(schemaVersion=2), "schemaVersion"),
        (_with(schemaVersion=True), "schemaVersion"),
    ],
)
def test_every_malformed_event_raises_invalid_event_naming_the_field(
    raw: bytes, field: str
) -> None:
    with pytest.raises(InvalidEvent) as e:
        decode_event(raw)
    assert e.value.field == field, str(e.value)
    assert len(str(e.value)) < 300


def test_invalid_utf8_and_deep_nesting_are_refused_as_invalid_events() -> None:
    raw = encode_event(OwnershipEvent("assigned", "t/ns/0x00000000_0x80000000", 1, reason="x"))
    with pytest.raises(InvalidEvent, match="not UTF-8"):
        decode_event(raw.replace(b'"x"', b'"\xff\xfe"'))
    with pytest.raises(InvalidEvent, match="nested too deeply"):
        decode_event(b'{"newToken":' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    with pytest.raises(InvalidEvent, match="exceeds"):
        decode_event(b" " * 100, max_bytes=10)


def test_event_bundle_names_come_back_canonical() -> None:
    e = decode_event(_with(bundle="T/ns/0x0000000A_0xFFFFFFFF",
                           children=["T/ns/0x0000000A_0x8000000B"]))  # fmt: skip
    assert e.bundle == "T/ns/0x0000000a_0xffffffff"
    assert e.children == ("T/ns/0x0000000a_0x8000000b",)
    assert decode_event(_with(newToken=MAX_TOKEN)).new_token == MAX_TOKEN


def test_trusted_floor_ignores_a_token_far_above_the_others_and_keeps_dense_ones() -> None:
    assert trusted_floor([]) == (0, [])
    assert trusted_floor([5]) == (5, [])
    assert trusted_floor([3, 12, 57, 57]) == (57, [])
    assert trusted_floor([3, 12, 57, 10**12]) == (57, [10**12])
    assert trusted_floor([3, 57, 10**12, MAX_TOKEN]) == (57, [10**12, MAX_TOKEN])
    assert trusted_floor([3, 3 + MAX_TOKEN_GAP]) == (3 + MAX_TOKEN_GAP, [])
    assert trusted_floor([3, 4 + MAX_TOKEN_GAP]) == (3, [4 + MAX_TOKEN_GAP])
    # a duplicated record cannot vouch for itself: only distinct tokens count
    assert trusted_floor([40, 57, 10**12, 10**12]) == (57, [10**12])
