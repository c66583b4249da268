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
    SPLIT,
    TRANSFERRED,
    EventPublisher,
    OwnershipEvent,
    decode_event,
    encode_event,
)
from loadbalance.errors import Transient


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_events_round_trip_and_encode_to_the_same_bytes() -> None:
    e = OwnershipEvent(TRANSFERRED, "t/ns/0x00000000_0x80000000", 42, old_owner="b1",
                       new_owner="b2", old_token=3, new_token=9, decision_id="d1",
                       reason="Overloaded")  # fmt: skip
    split = OwnershipEvent(SPLIT, "t/ns/0x00000000_0x80000000", 43, children=("a", "b"))
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
