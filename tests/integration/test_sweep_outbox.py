"""The sweep outbox: a controller killed between the sweep script and Kafka loses neither the
``expired`` events nor the bundles' placement (real Redis, real Kafka).

The sweep script writes each lease it removes to ``P:sweep-outbox`` in the step that deletes it;
the entry is cleared only after its ``expired`` event was delivered and its bundle placed again
(or found owned, or gone). Without the outbox, the leases were gone from Redis and their events
and bundles lived only in the killed process's memory.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pytest
import redis

from controller.events import ASSIGNED, EXPIRED, EventPublisher, OwnershipEvent
from controller.placement import put_load_snapshot
from controller.reconciler import Reconciler
from controller.sweep import SweepState, sweep_and_reassign
from loadbalance.config import LoadBalancerConfig
from loadbalance.model import LocalBrokerData, ResourceUsage
from loadbalance.report_codec import report_to_dict
from metadata_store import ownership_redis
from metadata_store.ownership_memory import MemoryStore
from metadata_store.ownership_redis import RedisStore
from metadata_store.sweep_outbox import entry_field
from tests.integration.test_assignment import read_events

NS = "acme/outbox"


class Killed(BaseException):
    """The controller process dies here (nothing after it runs, nothing catches it)."""


def _load(name: str) -> dict:
    r = LocalBrokerData(broker=name, cpu=ResourceUsage(10, 100), msg_rate_in=10)
    return {"report": report_to_dict(r), "updatedAtMs": 0}


def _expiring(store: Any, n: int, *, snapshot: bool = True) -> dict[str, int]:
    """``n`` bundles whose leases (held by ``gone``) expire at 100 ms; bundle -> old token."""
    store.create_namespace(NS, n)
    store.register_broker("b1", now_ms=0, ttl_ms=10**12)
    store.register_broker("gone", now_ms=0, ttl_ms=10**12)
    if snapshot:
        put_load_snapshot(store, {"b1": _load("b1")}, {})
    names = store.get_namespace(NS).bundle_names
    return {b: store.acquire(b, "gone", now_ms=0, ttl_ms=100).token for b in names}


@pytest.mark.parametrize("kind", ["redis", "memory"])
def test_the_sweep_writes_each_removed_lease_to_the_outbox(
    kind: str, fresh_redis: redis.Redis
) -> None:
    store = RedisStore(fresh_redis, prefix="ob") if kind == "redis" else MemoryStore()
    tokens = _expiring(store, 4, snapshot=False)
    keep = sorted(tokens)[0]
    store.renew_all("gone", {keep: tokens[keep]}, now_ms=50, ttl_ms=10_000)
    gone = store.sweep_expired(now_ms=500)
    entries = store.sweep_outbox.pending()
    assert [(e.lease, e.swept_at_ms) for e in entries] == [(x, 500) for x in gone]
    assert sorted(e.field for e in entries) == sorted(
        entry_field(b, t) for b, t in tokens.items() if b != keep
    )
    assert store.sweep_expired(now_ms=600) == [] and len(store.sweep_outbox.pending()) == 3
    first = entries[0].field
    assert store.sweep_outbox.clear([first, "no|such"]) == 1
    assert first not in {e.field for e in store.sweep_outbox.pending()}


def test_a_controller_killed_after_the_sweep_script_is_made_good_by_the_next(
    fresh_redis: redis.Redis, kafka_bootstrap: str, unique_topic: Any
) -> None:
    """Kill the controller right after the sweep script ran and before any delivery; a fresh
    controller's first sweep publishes the ``expired`` events to Kafka and places the bundles."""
    store = RedisStore(fresh_redis, prefix="ob")
    tokens = _expiring(store, 4)
    config = LoadBalancerConfig()

    def dies(_events: list[OwnershipEvent]) -> None:
        raise Killed

    first = Reconciler(store, publish=dies, clock=lambda: 1_000, config=config)
    with pytest.raises(Killed):
        first.sweep()
    assert all(store.owner(b, 1_000) is None for b in tokens), "the leases were removed"

    topic = unique_topic()
    publisher = EventPublisher(kafka_bootstrap, topic)
    second = Reconciler(store, publish=publisher.deliver, clock=lambda: 2_000, config=config)
    second.sweep()
    seen = [e for _, e in read_events(kafka_bootstrap, topic)]
    expired = {(e.bundle, e.old_token) for e in seen if e.event == EXPIRED}
    assert expired == set(tokens.items()), "every expiry the killed controller made announced"
    owners = {b: store.owner(b, 2_000) for b in tokens}
    assert all(x is not None and x.broker == "b1" for x in owners.values())
    assigned = {(e.bundle, e.new_token) for e in seen if e.event == ASSIGNED}
    assert assigned == {(b, x.token) for b, x in owners.items()}
    assert store.sweep_outbox.pending() == [], "cleared once delivered and placed"
    assert second.sweep() == [], "nothing is announced twice by the same controller"


def test_an_entry_whose_bundle_cannot_be_placed_stays_until_a_later_sweep(
    fresh_redis: redis.Redis,
) -> None:
    store = RedisStore(fresh_redis, prefix="ob")
    tokens = _expiring(store, 2, snapshot=False)  # no load data: no broker fits
    state = SweepState()
    events = sweep_and_reassign(store, LoadBalancerConfig(), 1_000, state=state)
    assert {(e.event, e.bundle) for e in events} == {(EXPIRED, b) for b in tokens}
    assert len(store.sweep_outbox.pending()) == 2 and sorted(state.unplaced) == sorted(tokens)
    put_load_snapshot(store, {"b1": _load("b1")}, {})
    split = sorted(tokens)[0]
    store.split_bundle(split, [int(split.split("_")[0].rsplit("/", 1)[1], 16) + 1024])
    later = sweep_and_reassign(store, LoadBalancerConfig(), 2_000, state=state)
    assert [(e.event, e.bundle) for e in later] == [(ASSIGNED, b) for b in tokens if b != split]
    assert store.sweep_outbox.pending() == [] and state.unplaced == {}, "placed or split away"


def test_concurrent_store_sweeps_write_every_removed_lease_once(
    fresh_redis: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sweepers race over the same expired leases, in small batches: each lease is removed
    by exactly one script, and that script wrote its entry."""
    monkeypatch.setattr(ownership_redis, "SWEEP_BATCH", 3)
    tokens = _expiring(RedisStore(fresh_redis, prefix="ob"), 64, snapshot=False)
    removed: list[list[tuple[str, int]]] = [[], []]
    start = threading.Barrier(2)

    def sweeper(i: int) -> None:
        store = RedisStore(redis.Redis.from_url(redis_url), prefix="ob")
        start.wait()
        for now in range(1_000, 1_020):
            removed[i].extend((x.bundle, x.token) for x in store.sweep_expired(now))

    threads = [threading.Thread(target=sweeper, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    both = removed[0] + removed[1]
    assert sorted(both) == sorted(tokens.items()), "each lease removed exactly once"
    entries = RedisStore(fresh_redis, prefix="ob").sweep_outbox.pending()
    assert sorted((e.lease.bundle, e.lease.token) for e in entries) == sorted(both)


def test_concurrent_controllers_one_killed_lose_no_entry(
    fresh_redis: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two controllers sweep at once. One removes a batch and hangs before delivering it while
    the other sweeps everything else; then the first dies. The survivor announces the dead
    one's expiries (found in the outbox) and places every bundle; the outbox ends empty."""
    monkeypatch.setattr(ownership_redis, "SWEEP_BATCH", 4)
    tokens = _expiring(RedisStore(fresh_redis, prefix="ob"), 32)
    delivered: list[OwnershipEvent] = []
    in_flight, survivor_done = threading.Event(), threading.Event()

    def hangs_then_dies(_events: list[OwnershipEvent]) -> None:
        in_flight.set()
        survivor_done.wait(30)
        raise Killed

    def doomed() -> None:
        store = RedisStore(redis.Redis.from_url(redis_url), prefix="ob")
        with contextlib.suppress(Killed):
            sweep_and_reassign(store, LoadBalancerConfig(), 1_000, publish=hangs_then_dies)

    state = SweepState()

    def survivor() -> None:
        in_flight.wait(30)  # the other one removed a batch and has not delivered it
        store = RedisStore(redis.Redis.from_url(redis_url), prefix="ob")
        sweep_and_reassign(store, LoadBalancerConfig(), 1_000, publish=delivered.extend,
                           state=state)  # fmt: skip
        survivor_done.set()

    threads = [threading.Thread(target=doomed), threading.Thread(target=survivor)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert in_flight.is_set()
    expired = {(e.bundle, e.old_token) for e in delivered if e.event == EXPIRED}
    assert expired == set(tokens.items()), "the in-flight batch was re-delivered at once"
    store = RedisStore(fresh_redis, prefix="ob")
    sweep_and_reassign(store, LoadBalancerConfig(), 1_001, publish=delivered.extend, state=state)
    owners = {b: store.owner(b, 1_001) for b in tokens}
    assert all(x is not None and x.broker == "b1" for x in owners.values())
    assigned = {(e.bundle, e.new_token) for e in delivered if e.event == ASSIGNED}
    assert {(b, x.token) for b, x in owners.items()} <= assigned
    assert store.sweep_outbox.pending() == []
