"""A broker is partitioned from Redis (or from Kafka): leases, reassignment and stale tokens.

The brokers here are the real agent's ``LeaseKeeper`` (what ``lbctl agent`` runs each check)
against the real Redis store, and the controller step is ``sweep_and_reassign`` (what the
control loop runs every few seconds). Time is an explicit ``now_ms``, so no test sleeps.
"""

from __future__ import annotations

import pytest

from controller.placement import assign, put_load_snapshot
from controller.sweep import sweep_and_reassign
from loadbalance.config import LoadBalancerConfig
from loadbalance.errors import Conflict
from loadbalance.model import LocalBrokerData, ResourceUsage
from loadbalance.report_codec import report_to_dict
from metadata_store.ownership_redis import RedisStore
from producers.agent import LeaseKeeper
from tests.reliability.invariants import check_invariants

pytestmark = pytest.mark.integration

NS = "acme/partition"
TTL_MS = 10_000
T0 = 1_000_000


def _load(name: str) -> dict:
    r = LocalBrokerData(broker=name, cpu=ResourceUsage(20, 100), msg_rate_in=10.0)
    return {"report": report_to_dict(r), "updatedAtMs": T0}


@pytest.fixture
def cluster(fresh_redis):
    store = RedisStore(fresh_redis, "part")
    store.create_namespace(NS, 4)
    keepers = {b: LeaseKeeper(store, b, TTL_MS, TTL_MS) for b in ("b1", "b2")}
    for k in keepers.values():
        k.heartbeat([], T0)
    names = store.get_namespace(NS).bundle_names
    for n in names:
        store.acquire(n, "b1", T0, TTL_MS)
    put_load_snapshot(store, {b: _load(b) for b in keepers}, {})
    return store, keepers, names


def test_broker_that_stops_renewing_loses_its_leases_and_its_stale_token_is_refused(
    cluster, fresh_redis
):
    store, keepers, names = cluster
    config = LoadBalancerConfig(loadBalancerOwnershipLeaseTtlSeconds=TTL_MS / 1000)
    old = {n: store.owner(n, T0).token for n in names}
    # b1 is cut off from Redis (its reports may still reach Kafka); b2 keeps its heartbeat
    for now in range(T0 + 2_000, T0 + TTL_MS, 2_000):
        keepers["b2"].heartbeat([], now)
        assert sweep_and_reassign(store, config, now) == [], "nothing expires within the TTL"
    now = T0 + TTL_MS + 1
    keepers["b2"].heartbeat([], now)
    events = sweep_and_reassign(store, config, now)
    expired = sorted(e.bundle for e in events if e.event == "expired")
    assigned = {e.bundle: e.new_owner for e in events if e.event == "assigned"}
    assert expired == sorted(names)
    assert assigned == dict.fromkeys(names, "b2"), "the only live broker takes them all"
    s = check_invariants(fresh_redis, "part", now)
    assert all(s.leases[n][1] > old[n] for n in names), "new owners hold newer tokens"

    # b1 comes back with the tokens it remembers: every fenced write is refused
    assert store.renew_all("b1", old, now, TTL_MS) == dict.fromkeys(sorted(names), False)
    assert not store.release(names[0], "b1", old[names[0]], now)
    with pytest.raises(Conflict):
        store.transfer(names[1], "b1", old[names[1]], "b1-other", now, TTL_MS)
    # and its agent, re-reading the store, renews nothing it no longer holds
    assert keepers["b1"].heartbeat(names, now) == {}
    after = check_invariants(fresh_redis, "part", now)
    assert {n: after.live_owner(n, now) for n in names} == dict.fromkeys(names, "b2")
    assert after.leases == s.leases


def test_broker_that_keeps_renewing_but_stops_reporting_keeps_its_bundles_gets_no_new_ones(
    cluster, fresh_redis
):
    """The reverse partition: Redis reachable, Kafka not. Ownership follows the lease (as in
    Pulsar it follows the ZooKeeper session), so b1 keeps what it serves; once the streaming job
    declares it gone, its load data leaves the snapshot and placement no longer picks it."""
    store, keepers, names = cluster
    config = LoadBalancerConfig(loadBalancerOwnershipLeaseTtlSeconds=TTL_MS / 1000)
    put_load_snapshot(store, {"b2": _load("b2")}, {})  # the job dropped b1 (no reports)
    store.release(names[3], "b1", store.owner(names[3], T0).token, T0)  # one bundle is free
    now = T0
    for _ in range(10):  # 20 s, twice the lease TTL
        now += 2_000
        for b in ("b1", "b2"):
            keepers[b].heartbeat(names, now)
        assert sweep_and_reassign(store, config, now) == []
    s = check_invariants(fresh_redis, "part", now)
    assert [s.live_owner(n, now) for n in names[:3]] == ["b1", "b1", "b1"]
    lease = assign(store, names[3], config, now)
    assert lease is not None and lease.broker == "b2", "no placement on a broker without reports"
    assert s.leases[names[0]][1] == store.owner(names[0], now).token, "tokens kept, not reissued"
