"""The handover wait on the broker's side: a lease granted while the previous holder may still
serve starts only after the wait, measured conservatively on the broker's clock, and a broker
that lost a bundle acknowledges only after it stopped (fake clocks; nothing sleeps)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from loadbalance.serving import ServingRule, ServingTable
from loadbalance.serving_checker import ClockBound, check_serving
from metadata_store.leases import Lease
from producers.agent import LeaseKeeper

NS = "acme/ns"
B1 = f"{NS}/0x00000000_0x80000000"
RULE = ServingRule(ttl_s=10.0, drift_bound=0.01, stop_margin_s=0.5)


def test_serve_from_is_the_reply_plus_the_stretched_wait_plus_the_margin() -> None:
    assert RULE.serve_from(3.0, 0.0) == 3.0
    assert RULE.serve_from(3.0, 4.0) == pytest.approx(3.0 + 4.0 * 1.02 + 0.5)


def test_a_waiting_lease_serves_only_after_its_wait_and_a_later_reply_can_shorten_it() -> None:
    t = ServingTable("b", RULE)
    t.renewed(B1, 9, requested_at=1.0, replied_at=1.1, wait_s=4.0)  # from 1.1 + 4.08 + 0.5
    assert not t.serving(B1, 5.0) and t.serving(B1, 5.7)
    assert t.status(2.0)[0].serve_from == pytest.approx(5.68)
    t.renewed(B1, 9, requested_at=3.0, replied_at=3.1)  # the old holder acknowledged
    assert t.serving(B1, 3.1) and not t.serving(B1, 3.09)
    (i,) = t.intervals()
    assert (i.start, i.end) == (3.1, pytest.approx(3.0 + 9.4))


def test_lost_before_its_start_serves_nothing_and_a_wait_past_the_deadline_never_starts() -> None:
    t = ServingTable("b", RULE)
    t.renewed(B1, 9, 1.0, 1.1, wait_s=4.0)
    t.lost(B1, 2.0)
    assert t.intervals() == []
    t.renewed(B1, 11, 3.0, 3.1, wait_s=20.0)  # longer than the lease: wait for a renewal
    assert t.status(3.2)[0].serve_from is None and not t.serving(B1, 30.0)
    assert t.intervals() == []


def test_the_old_and_the_new_holder_never_overlap_when_the_new_one_waits() -> None:
    """A renewed at 0 and serves until 9.4; B's lease came with the store's wait up to A's
    expiry: whatever the rates within the bound, B starts after A stopped."""
    a, b = ServingTable("A", RULE), ServingTable("B", RULE)
    a.renewed(B1, 7, 0.0, 0.05)
    b.renewed(B1, 8, 2.0, 2.05, wait_s=10.0 - 2.0)  # store: E = 10, the script ran at 2
    bounds = {x: ClockBound.skewed(0.0, 1.0, rate_error=0.01) for x in ("A", "B")}
    assert check_serving(a.intervals() + b.intervals(), bounds) == []
    b2 = ServingTable("B", RULE)
    b2.renewed(B1, 8, 2.0, 2.05)  # without the wait: B serves while A still does
    assert check_serving(a.intervals() + b2.intervals(), bounds) != []


class MovingStore:
    """Broker "b" held B1 with token 4 until ``moved``; records acknowledgements with the
    table's state at the moment they were sent."""

    def __init__(self, table: ServingTable, now: list[float]) -> None:
        self.table, self.now = table, now
        self.moved = False
        self.acks: list[tuple[str, int, bool]] = []

    def register_broker(self, *_a: object, **_k: object) -> None:
        return None

    def owners(self, ns: str, now_ms: int) -> dict[str, Lease]:
        return {B1: Lease(B1, "other" if self.moved else "b", 5 if self.moved else 4, 0)}

    def renew_all(self, broker: str, leases: Mapping[str, int], *_a: int) -> dict[str, bool]:
        return {b: True for b in leases}

    def renew_leases(
        self, broker: str, leases: Mapping[str, int], *_a: int
    ) -> dict[str, Lease | None]:
        return {b: Lease(b, broker, t, 0) for b, t in leases.items()}

    def ack_handover(self, broker: str, bundle: str, token: int) -> bool:
        self.acks.append((bundle, token, self.table.serving(bundle, self.now[0])))
        return True


def test_the_keeper_acknowledges_a_lost_bundle_only_after_it_stopped_serving_it() -> None:
    now = [100.0]
    table = ServingTable("b", RULE)
    store = MovingStore(table, now)
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    keeper = LeaseKeeper(
        store, "b", 30_000, 10_000, serving=table, monotonic=lambda: now[0], sleep=sleep
    )
    keeper.heartbeat([B1], 0)
    assert table.serving(B1, now[0]) and store.acks == []
    store.moved = True
    keeper.heartbeat([B1], 0)  # stops at 100
    assert not table.serving(B1, now[0]) and store.acks == []
    assert keeper.send_acks() == 0  # the stop margin has not passed: the broker may be closing
    now[0] += 0.2
    keeper.defer_acks = True  # the agent: acknowledge after the serving file was rewritten
    keeper.heartbeat([B1], 0)
    assert store.acks == []
    assert keeper.send_acks(wait=True) == 1
    assert slept == [pytest.approx(0.3)] and now[0] == pytest.approx(100.5)
    assert store.acks == [(B1, 4, False)]  # its own token, sent once it no longer served
    assert keeper.send_acks() == 0
