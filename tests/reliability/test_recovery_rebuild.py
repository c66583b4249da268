"""Property: whatever brokers claim after a data loss, the rebuilt namespace covers the ring
exactly, accepted claims never overlap, and every claim is either accepted or refused."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.recovery import _rebuild_boundaries
from loadbalance.bundles import FULL_UPPER, format_range

NS = "acme/prop"


@st.composite
def claims(draw) -> list[tuple[str, str]]:
    """Random ranges (some overlapping, some duplicated) claimed by random brokers."""
    out = []
    for _ in range(draw(st.integers(0, 12))):
        lo = draw(st.integers(0, FULL_UPPER - 1))
        hi = draw(st.integers(lo + 1, FULL_UPPER))
        out.append((f"{NS}/{format_range(lo, hi)}", draw(st.sampled_from(["b1", "b2", "b3"]))))
    return out


@settings(max_examples=300, deadline=None)
@given(claims())
def test_rebuilt_boundaries_cover_the_ring_and_accepted_claims_are_disjoint_bundles(cs):
    bounds, accepted, refused = _rebuild_boundaries(cs)
    assert bounds[0] == 0 and bounds[-1] == FULL_UPPER
    assert all(a < b for a, b in itertools.pairwise(bounds))
    bundles = {f"{NS}/{format_range(a, b)}" for a, b in itertools.pairwise(bounds)}
    assert {b for b, _ in accepted} <= bundles, "every accepted claim is a bundle as claimed"
    assert sorted(accepted + [(b, o) for b, o, _ in refused]) == sorted(cs)
    names = [b for b, _ in accepted]
    assert len(names) == len(set(names)), "one owner per bundle"


def test_children_of_a_split_win_over_a_stale_report_of_their_parent():
    parent = f"{NS}/0x00000000_0x80000000"
    kids = [f"{NS}/0x00000000_0x40000000", f"{NS}/0x40000000_0x80000000"]
    bounds, accepted, refused = _rebuild_boundaries(
        [(parent, "old"), (kids[0], "b1"), (kids[1], "b2")]
    )
    assert bounds == [0, 0x40000000, 0x80000000, FULL_UPPER]
    assert sorted(accepted) == [(kids[0], "b1"), (kids[1], "b2")]
    assert [(b, o) for b, o, _ in refused] == [(parent, "old")]


def test_token_floor_is_the_largest_token_announced_on_the_ownership_events_topic(
    kafka_bootstrap, unique_topic
):
    from confluent_kafka import Producer

    from controller.events import OwnershipEvent, encode_event
    from controller.recovery import token_floor_from_events

    topic = unique_topic(2, "events")
    assert token_floor_from_events(kafka_bootstrap, topic) == 0
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    events = [
        OwnershipEvent("assigned", f"{NS}/0x00000000_0x80000000", 1, new_owner="b1", new_token=3),
        OwnershipEvent(
            "transferred",
            f"{NS}/0x00000000_0x80000000",
            2,
            old_owner="b1",
            new_owner="b2",
            old_token=3,
            new_token=57,
        ),
        OwnershipEvent("expired", f"{NS}/0x80000000_0xffffffff", 3, old_owner="b2", old_token=12),
    ]
    for i, e in enumerate(events):
        p.produce(topic, key=e.bundle.encode(), value=encode_event(e), partition=i % 2)
    p.produce(topic, value=b"{not json", partition=1)
    assert p.flush(10) == 0
    assert token_floor_from_events(kafka_bootstrap, topic) == 57
