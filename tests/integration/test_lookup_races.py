"""A lookup survives the races the sweep survives (real Redis): the chosen broker's registration
lapses between the view and the acquire, or the bundle is split between the namespace read and
the acquire. One retry over a fresh lookup and view places it; a race lost twice is
``Transient``; a lease key that holds no lease is ``MalformedLease`` naming the key."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from controller.placement import lookup_assign_event, put_load_snapshot
from loadbalance.config import LoadBalancerConfig
from loadbalance.errors import Conflict, Transient
from loadbalance.model import LocalBrokerData, ResourceUsage
from loadbalance.report_codec import report_to_dict
from metadata_store.ownership_redis import MalformedLease, RedisStore

NS = "acme/lookrace"
TOPIC = f"persistent://{NS}/t1"
FOREVER = 10**12


def _store(client: redis.Redis, brokers: tuple[str, ...] = ("b1", "b2")) -> RedisStore:
    store = RedisStore(client, prefix="lr")
    store.create_namespace(NS, 2)
    loads = {}
    for i, b in enumerate(brokers):
        store.register_broker(b, now_ms=0, ttl_ms=FOREVER)
        r = LocalBrokerData(broker=b, cpu=ResourceUsage(10 + 40 * i, 100), msg_rate_in=10)
        loads[b] = {"report": report_to_dict(r), "updatedAtMs": 0}
    put_load_snapshot(store, loads, {})
    return store


def _before_acquire(store: RedisStore, race: Any, times: int = 1) -> list[str]:
    """Run ``race(bundle, broker)`` right before the first ``times`` placement acquires."""
    real = store.acquire_placed
    seen: list[str] = []

    def acquire(b: str, dest: str, *args: Any, **kwargs: Any) -> Any:
        if len(seen) < times:
            seen.append(dest)
            race(b, dest)
        return real(b, dest, *args, **kwargs)

    store.acquire_placed = acquire  # type: ignore[method-assign]
    return seen


def test_a_destination_that_lapses_before_the_acquire_is_retried_once(
    fresh_redis: redis.Redis,
) -> None:
    store = _store(fresh_redis)
    lapse = lambda _b, dest: store.register_broker(dest, now_ms=0, ttl_ms=1)  # noqa: E731
    chosen = _before_acquire(store, lapse)
    bundle, lease, event = lookup_assign_event(store, TOPIC, LoadBalancerConfig(), 1_000)
    assert lease is not None and event is not None and lease.broker != chosen[0]
    assert store.owner(bundle, 1_000) == lease


def test_a_race_lost_twice_is_transient_with_one_line(fresh_redis: redis.Redis) -> None:
    store = _store(fresh_redis)
    lapse = lambda _b, dest: store.register_broker(dest, now_ms=0, ttl_ms=1)  # noqa: E731
    _before_acquire(store, lapse, times=2)
    with pytest.raises(Transient) as e:
        lookup_assign_event(store, TOPIC, LoadBalancerConfig(), 1_000)
    assert "\n" not in str(e.value) and "look it up again" in str(e.value)


def test_a_bundle_split_before_the_acquire_is_looked_up_again(fresh_redis: redis.Redis) -> None:
    store = _store(fresh_redis)
    parent, _ = store.lookup(TOPIC, 0)

    def split(b: str, _dest: str) -> None:
        r = store.get_namespace(NS).find_bundle(TOPIC)
        store.split_bundle(b, [r.lower + (r.upper - r.lower) // 2])

    _before_acquire(store, split)
    bundle, lease, event = lookup_assign_event(store, TOPIC, LoadBalancerConfig(), 1_000)
    assert bundle != parent and store.get_namespace(NS).find_bundle(TOPIC).name == bundle
    assert lease is not None and event is not None and event.bundle == bundle


@pytest.mark.parametrize("junk", ["string", "no_expires"])
def test_a_malformed_lease_key_fails_that_lookup_only(fresh_redis: redis.Redis, junk: str) -> None:
    store = _store(fresh_redis)
    bundle, _ = store.lookup(TOPIC, 0)
    key = store.keys.lease(bundle)
    if junk == "string":
        fresh_redis.set(key, "junk")
    else:
        fresh_redis.hset(key, mapping={"broker": "b1", "token": 3})
    assert store.owner(bundle, 1_000) is None
    with pytest.raises(MalformedLease) as e:
        lookup_assign_event(store, TOPIC, LoadBalancerConfig(), 1_000)
    assert isinstance(e.value, Conflict) and key in str(e.value) and "\n" not in str(e.value)
    assert fresh_redis.type(key) == (b"string" if junk == "string" else b"hash"), "left alone"
    other = next(b for b in store.get_namespace(NS).bundle_names if b != bundle)
    topic = next(f"{NS}/t{i}" for i in range(100) if store.lookup(f"{NS}/t{i}", 0)[0] == other)
    assert lookup_assign_event(store, topic, LoadBalancerConfig(), 1_000)[1] is not None
