"""First lookup assigns a free bundle with the placement strategy over the Redis load snapshot."""

from __future__ import annotations

import redis

from controller.placement import lookup_and_assign, put_load_snapshot
from controller.redis_store import RedisStore
from loadbalance.config import LoadBalancerConfig
from loadbalance.model import LocalBrokerData, ResourceUsage
from loadbalance.report_codec import report_to_dict

NS = "acme/assign"


def _broker(name: str, rate: float, cpu: float) -> dict:
    r = LocalBrokerData(
        broker=name, cpu=ResourceUsage(cpu, 100), msg_rate_in=rate, msg_throughput_in=rate * 1000
    )
    return {"report": report_to_dict(r), "updatedAtMs": 0}


def test_lookup_assigns_by_strategy_with_preallocation_and_then_keeps_the_owner(
    fresh_redis: redis.Redis,
) -> None:
    store = RedisStore(fresh_redis, prefix="as")
    store.create_namespace(NS, 16)
    for b in ("busy", "idle1", "idle2", "gone"):
        store.register_broker(b, now_ms=0, ttl_ms=10**12 if b != "gone" else 1)
    put_load_snapshot(
        store,
        {
            "busy": _broker("busy", 5000, 95),  # above 85 %: LeastLongTermMessageRate skips it
            "idle1": _broker("idle1", 100, 10),
            "idle2": _broker("idle2", 100, 10),
            "gone": _broker("gone", 0, 0),  # not live in the registry
        },
        {},
    )
    cfg = LoadBalancerConfig(loadBalancerDistributeBundlesEvenlyEnabled=False)
    owners = []
    for i in range(12):
        topic = f"persistent://{NS}/t{i}"
        bundle, lease = lookup_and_assign(store, topic, cfg, now_ms=10)
        assert lease is not None
        owners.append(lease.broker)
        again_bundle, again = lookup_and_assign(store, topic, cfg, now_ms=11)
        assert (again_bundle, again.broker, again.token) == (bundle, lease.broker, lease.token)
    assert set(owners) <= {"idle1", "idle2"}, owners
    counts = {b: owners.count(b) for b in ("idle1", "idle2")}
    assert min(counts.values()) >= 3, f"preallocation spreads assignments: {counts}"
    assert fresh_redis.hlen("as:prealloc:idle1") + fresh_redis.hlen("as:prealloc:idle2") >= 6


def test_no_live_broker_with_load_data_means_no_owner(fresh_redis: redis.Redis) -> None:
    store = RedisStore(fresh_redis, prefix="as2")
    store.create_namespace(NS, 4)
    bundle, lease = lookup_and_assign(store, f"{NS}/t", LoadBalancerConfig(), now_ms=5)
    assert lease is None and bundle.startswith(NS)


def test_expired_leases_are_swept_and_reassigned_to_live_brokers(fresh_redis: redis.Redis) -> None:
    from controller.placement import sweep_and_reassign

    store = RedisStore(fresh_redis, prefix="sw")
    store.create_namespace(NS, 4)
    store.register_broker("dying", now_ms=0, ttl_ms=1_000)
    store.register_broker("alive", now_ms=0, ttl_ms=10**12)
    put_load_snapshot(
        store, {"alive": _broker("alive", 10, 10), "dying": _broker("dying", 1, 1)}, {}
    )
    names = store.get_namespace(NS).bundle_names
    old = [store.acquire(b, "dying", now_ms=0, ttl_ms=500) for b in names[:2]]
    store.split_bundle(names[1], [0x60000000])  # one of them is gone before the sweep
    events = sweep_and_reassign(store, LoadBalancerConfig(), now_ms=2_000)
    assert [(e["event"], e["bundle"]) for e in events] == [
        ("expired", names[0]),
        ("assigned", names[0]),
    ]
    lease = store.owner(names[0], now_ms=2_001)
    assert lease.broker == "alive" and lease.token > old[0].token
