"""The sweep loses nothing when a fault hits after the leases were removed (real Redis).

A Redis fault between the sweep script and the placements used to lose the ``expired`` events
of leases already deleted (they were published only at the end) and the bundles' reassignment
(the next sweep no longer finds their leases). Now each batch's ``expired`` events are
delivered first and the bundles not placed stay in ``SweepState.unplaced`` for the next sweep.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import redis

from controller.events import ASSIGNED, EXPIRED, OwnershipEvent
from controller.placement import put_load_snapshot
from controller.sweep import MALFORMED_KEY, SweepState, sweep_and_reassign
from infra import metrics
from loadbalance.config import LoadBalancerConfig
from loadbalance.model import LocalBrokerData, ResourceUsage
from loadbalance.report_codec import report_to_dict
from metadata_store.leases import Lease
from metadata_store.ownership_redis import RedisStore

NS = "acme/sweepfault"


def _load(name: str) -> dict:
    r = LocalBrokerData(broker=name, cpu=ResourceUsage(10, 100), msg_rate_in=10)
    return {"report": report_to_dict(r), "updatedAtMs": 0}


class _FailsAfterSweep(RedisStore):
    """Redis becomes read-only right after the sweep script removed the leases."""

    fail = True

    def sweep_expired(self, now_ms: int, **kw: Any) -> list[Lease]:
        report = super().sweep_expired(now_ms, **kw)
        if self.fail:
            self.fail = False
            self.broken = True
        return report

    broken = False

    def get_namespace(self, ns: str) -> Any:
        if self.broken:
            raise redis.exceptions.ReadOnlyError("You can't write against a read only replica.")
        return super().get_namespace(ns)


def _store(client: redis.Redis, cls: type = RedisStore) -> tuple[RedisStore, list[str]]:
    store = cls(client, prefix="sf")
    store.create_namespace(NS, 4)
    for b in ("b1", "gone"):
        store.register_broker(b, now_ms=0, ttl_ms=10**9)
    put_load_snapshot(store, {"b1": _load("b1")}, {})
    names = store.get_namespace(NS).bundle_names
    for b in names[:3]:
        store.acquire(b, "gone", now_ms=0, ttl_ms=100)
    return store, names


def test_a_fault_after_the_sweep_script_loses_no_expiry_and_no_reassignment(
    fresh_redis: redis.Redis,
) -> None:
    store, names = _store(fresh_redis, _FailsAfterSweep)
    published: list[list[OwnershipEvent]] = []
    state = SweepState()
    with pytest.raises(redis.exceptions.ReadOnlyError):
        sweep_and_reassign(store, LoadBalancerConfig(), 1_000, publish=published.append,
                           state=state)  # fmt: skip
    assert [[(e.event, e.bundle) for e in batch] for batch in published] == [
        [(EXPIRED, b) for b in names[:3]]
    ], "the expired events were delivered before the fault"
    assert sorted(state.unplaced) == names[:3]
    store.broken = False  # the fault clears
    events = sweep_and_reassign(store, LoadBalancerConfig(), 1_001, publish=published.append,
                                state=state)  # fmt: skip
    assert [(e.event, e.bundle) for e in events] == [(ASSIGNED, b) for b in names[:3]]
    assert published[-1] == events and state.unplaced == {}
    assert all(store.owner(b, 1_001).broker == "b1" for b in names[:3])


def test_a_malformed_key_is_logged_once_and_counted_every_sweep(
    fresh_redis: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    store, names = _store(fresh_redis)
    fresh_redis.set(store.keys.lease(names[3]), "junk")
    skips = metrics.CONTROL_SWEEP_SKIPS.labels(reason=MALFORMED_KEY)
    before = skips._value.get()
    state = SweepState()
    with caplog.at_level(logging.WARNING, logger="lbctl.control"):
        first = sweep_and_reassign(store, LoadBalancerConfig(), 1_000, state=state)
        second = sweep_and_reassign(store, LoadBalancerConfig(), 1_001, state=state)
    assert [e.event for e in first] == [EXPIRED] * 3 + [ASSIGNED] * 3 and second == []
    lines = [r.getMessage() for r in caplog.records if "malformed_key" in r.getMessage()]
    assert len(lines) == 1 and store.keys.lease(names[3]) in lines[0]
    assert skips._value.get() - before == 2
    fresh_redis.delete(store.keys.lease(names[3]))
    sweep_and_reassign(store, LoadBalancerConfig(), 1_002, state=state)
    assert state.logged == set(), "a key repaired is forgotten, so a new problem is logged"
