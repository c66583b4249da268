"""The knobs that shape an applied decision, against real Redis through the controller's path
(``Reconciler.reconcile`` with the controller's configuration):
``loadBalancerAutoUnloadSplitBundlesEnabled`` and ``namespaceBundleUnloadingTimeoutMs``."""

from __future__ import annotations

import pytest
import redis

from controller.apply import APPLIED, REJECTED, UNLOAD_TIMED_OUT, outcome_of
from controller.events import ASSIGNED, SPLIT, OwnershipEvent
from controller.reconciler import Reconciler
from loadbalance.config import LoadBalancerConfig
from loadbalance.decisions import SPLIT as SPLIT_DECISION
from loadbalance.decisions import TRANSFER, UNLOAD, make_decision
from metadata_store.ownership_redis import RedisStore

NS = "acme/knobs"
TTL = 30_000
NOW = 1_000_000


def _reconciler(client: redis.Redis, config: LoadBalancerConfig) -> tuple[Reconciler, list]:
    store = RedisStore(client, prefix="k")
    store.create_namespace(NS, 2)
    for b in ("b1", "b2"):
        store.register_broker(b, now_ms=0, ttl_ms=10**9)
    for name in store.get_namespace(NS).bundle_names:
        store.acquire(name, "b1", now_ms=0, ttl_ms=10**9)
    published: list[OwnershipEvent] = []
    rec = Reconciler(
        store, publish=published.extend, clock=lambda: NOW, lease_ttl_ms=TTL, config=config
    )
    return rec, published


def _split(store: RedisStore) -> tuple:
    parent = store.get_namespace(NS).bundle_names[0]
    d = make_decision(cycle="s", kind=SPLIT_DECISION, bundle=parent, source_broker="b1",
                      split_boundaries=(0x40000000,), decided_at_ms=NOW)  # fmt: skip
    return parent, d


def test_split_children_are_left_free_by_default_as_pulsar_unloads_them(
    fresh_redis: redis.Redis,
) -> None:
    rec, published = _reconciler(fresh_redis, LoadBalancerConfig())
    _, d = _split(rec.store)
    assert rec.reconcile(d).outcome == APPLIED
    children = rec.store.get_namespace(NS).bundle_names[:2]
    assert [rec.store.owner(c, NOW) for c in children] == [None, None]
    assert [e.event for e in published] == [SPLIT]


def test_split_children_stay_with_the_parents_owner_when_auto_unload_is_off(
    fresh_redis: redis.Redis,
) -> None:
    cfg = LoadBalancerConfig(loadBalancerAutoUnloadSplitBundlesEnabled=False)
    rec, published = _reconciler(fresh_redis, cfg)
    parent, d = _split(rec.store)
    old = rec.store.owner(parent, NOW)
    out = rec.reconcile(d)
    assert out.outcome == APPLIED and "2 of 2 children kept by b1" in out.reason
    children = rec.store.get_namespace(NS).bundle_names[:2]
    leases = [rec.store.owner(c, NOW) for c in children]
    assert [x.broker if x else None for x in leases] == ["b1", "b1"]
    assert all(x.token > old.token for x in leases), "fenced: new tokens above the parent's"
    assert [e.event for e in published] == [SPLIT, ASSIGNED, ASSIGNED]
    assert {e.bundle: e.new_token for e in published[1:]} == {
        c: x.token for c, x in zip(children, leases)
    }


@pytest.mark.parametrize("kind", [UNLOAD, TRANSFER])
def test_an_unload_held_past_the_unloading_timeout_is_given_up_and_recorded(
    fresh_redis: redis.Redis, kind: str
) -> None:
    cfg = LoadBalancerConfig(namespaceBundleUnloadingTimeoutMs=60_000)
    rec, published = _reconciler(fresh_redis, cfg)
    bundle = rec.store.get_namespace(NS).bundle_names[1]
    before = rec.store.owner(bundle, NOW)
    dest = "b2" if kind == TRANSFER else None
    stale = make_decision(cycle="old", kind=kind, bundle=bundle, source_broker="b1",
                          destination_broker=dest, decided_at_ms=NOW - 60_001)  # fmt: skip
    out = rec.reconcile(stale)
    assert out.outcome == REJECTED and out.reason.startswith(UNLOAD_TIMED_OUT)
    assert outcome_of(rec.store, stale.id) == out, "the outcome is recorded"
    assert rec.store.owner(bundle, NOW) == before and published == []
    fresh = make_decision(cycle="new", kind=kind, bundle=bundle, source_broker="b1",
                          destination_broker=dest, decided_at_ms=NOW - 60_000)  # fmt: skip
    assert rec.reconcile(fresh).outcome == APPLIED
    after = rec.store.owner(bundle, NOW)
    assert (after.broker if after else None) == dest
