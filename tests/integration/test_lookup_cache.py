"""LookupCache against a real Redis: same answers as RedisStore.lookup, changes made through
another client show up within the staleness bound, expired leases are never served, and a lost
or frozen tracking connection sends lookups to Redis instead of serving stale data."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from controller.lookup_cache import LookupCache
from infra.embedded import EmbeddedRedis
from loadbalance.errors import InvalidInput
from metadata_store.leases import Lease
from metadata_store.ownership_redis import RedisStore

pytestmark = pytest.mark.integration

NS = "acme/orders"
FOREVER = 10**12
MAX_STALENESS_MS = 500


@pytest.fixture
def store(fresh_redis: redis.Redis) -> RedisStore:
    s = RedisStore(fresh_redis, prefix="lc")
    s.create_namespace(NS, 8)
    for b in ("b1", "b2", "b3"):
        s.register_broker(b, now_ms=0, ttl_ms=FOREVER)
    return s


@pytest.fixture
def writer(redis_url: str) -> Iterator[RedisStore]:
    """Another client, as another controller or broker would be."""
    client = redis.Redis.from_url(redis_url)
    yield RedisStore(client, prefix="lc")
    client.close()


@pytest.fixture
def cache(store: RedisStore) -> Iterator[LookupCache]:
    with LookupCache(store, max_staleness_ms=MAX_STALENESS_MS, heartbeat_ms=20) as c:
        assert c.fresh, "tracking should confirm freshness within start()'s wait"
        yield c


def _topic_in(store: RedisStore, bundle: str) -> str:
    """A topic name that hashes into ``bundle``."""
    for i in range(100_000):
        t = f"persistent://{NS}/topic-{i}"
        if store.lookup(t, now_ms=0)[0] == bundle:
            return t
    raise AssertionError(f"no topic found for {bundle}")


def _await(cond: Callable[[], bool], bound_s: float) -> float:
    """Poll ``cond`` until true; return the elapsed seconds, fail after ``2 * bound_s``."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > 2 * bound_s:
            raise AssertionError(f"not seen within {2 * bound_s:.2f} s")
        time.sleep(0.001)
    return time.monotonic() - t0


def _owner(cache: LookupCache, topic: str, now_ms: int) -> str | None:
    lease = cache.lookup(topic, now_ms)[1]
    return lease.broker if lease else None


def test_cached_answers_are_the_stores_answers_and_come_from_memory(store, cache) -> None:
    store.create_namespace("acme/payments", 3)
    rng = random.Random(7)
    for ns in (NS, "acme/payments"):
        for i, b in enumerate(store.get_namespace(ns).bundle_names):
            if i % 3 == 0:
                continue  # free bundle
            ttl = 5_000 if i % 3 == 1 else FOREVER  # some leases expire at 5 s
            store.acquire(b, rng.choice(["b1", "b2", "b3"]), now_ms=0, ttl_ms=ttl)
    topics = [f"persistent://{NS}/t-{i}" for i in range(150)]
    topics += [f"acme/payments/t-{i}" for i in range(100)]  # short names, as Pulsar accepts
    topics += ["non-persistent://acme/orders/np", "persistent://acme/orders/a/b"]
    for now in (1_000, 5_000, 9_000):
        expected = [store.lookup(t, now) for t in topics]
        assert [cache.lookup(t, now) for t in topics] == expected
        assert cache.lookup_many(topics, now) == expected
    misses = cache.stats.misses
    assert cache.lookup_many(topics, 2_000) == store.lookup_many(topics, 2_000)
    assert [cache.lookup(t, 2_000) for t in topics[:50]] == [
        store.lookup(t, 2_000) for t in topics[:50]
    ]
    assert cache.stats.misses == misses, "a warm cache must not read Redis"
    assert cache.stats.fallbacks == 0
    with pytest.raises(InvalidInput, match="unknown namespace"):
        cache.lookup("persistent://acme/nope/t", 0)
    with pytest.raises(InvalidInput, match="unknown namespace"):
        cache.lookup_many(["persistent://acme/nope/t"], 0)


def _transfer(w: RedisStore, bundle: str, lease: Lease) -> None:
    w.transfer(bundle, lease.broker, lease.token, "b2", now_ms=10, ttl_ms=FOREVER)


def _release(w: RedisStore, bundle: str, lease: Lease) -> None:
    assert w.release(bundle, lease.broker, lease.token, now_ms=10)


@pytest.mark.parametrize("change", [_transfer, _release], ids=["transfer", "release"])
def test_ownership_change_by_another_client_is_seen_within_the_bound(
    store, writer, cache, change
) -> None:
    bundle = store.get_namespace(NS).bundle_names[2]
    lease = store.acquire(bundle, "b1", now_ms=0, ttl_ms=FOREVER)
    topic = _topic_in(store, bundle)
    assert cache.lookup(topic, 10) == (bundle, lease)
    invalidated = cache.stats.invalidated_keys
    change(writer, bundle, lease)
    expected = store.lookup(topic, 10)
    elapsed = _await(lambda: cache.lookup(topic, 10) == expected, cache.max_staleness_s)
    assert elapsed <= cache.max_staleness_s
    assert cache.stats.invalidated_keys > invalidated, "the change came as an invalidation"


def test_split_and_merge_by_another_client_move_topics_within_the_bound(
    store, writer, cache
) -> None:
    parent = store.get_namespace(NS).bundle_names[0]  # 0x00000000_0x20000000
    lease = store.acquire(parent, "b1", now_ms=0, ttl_ms=FOREVER)
    low = _topic_in(store, parent)
    assert cache.lookup(low, 10) == (parent, lease)
    writer.split_bundle(parent, [0x10000000])
    expected = store.lookup(low, 10)
    assert expected[0] != parent and expected[1] is None, "split ends the parent's lease"
    elapsed = _await(lambda: cache.lookup(low, 10) == expected, cache.max_staleness_s)
    assert elapsed <= cache.max_staleness_s
    first, second = store.get_namespace(NS).bundle_names[:2]
    writer.merge_bundles(first, second)
    assert store.lookup(low, 10) == (parent, None)
    elapsed = _await(lambda: cache.lookup(low, 10) == (parent, None), cache.max_staleness_s)
    assert elapsed <= cache.max_staleness_s
    assert cache.lookup_many([low], 10) == [(parent, None)]


def test_expired_lease_is_never_served_and_a_new_owner_appears(store, writer, cache) -> None:
    bundle = store.get_namespace(NS).bundle_names[3]
    store.acquire(bundle, "b1", now_ms=0, ttl_ms=1_000)
    topic = _topic_in(store, bundle)
    assert _owner(cache, topic, 999) == "b1"
    invalidated = cache.stats.invalidated_keys
    # no write at all: expiry is judged against now_ms, as the store does
    assert cache.lookup(topic, 1_000) == (bundle, None)
    assert cache.lookup_many([topic], 5_000) == [(bundle, None)]
    assert cache.stats.invalidated_keys == invalidated
    assert [x.bundle for x in writer.sweep_expired(now_ms=2_000)] == [bundle]
    writer.acquire(bundle, "b3", now_ms=2_000, ttl_ms=FOREVER)
    elapsed = _await(lambda: _owner(cache, topic, 2_000) == "b3", cache.max_staleness_s)
    assert elapsed <= cache.max_staleness_s


def test_renewal_refreshes_the_cached_lease_without_a_miss(store, writer, cache) -> None:
    bundle = store.get_namespace(NS).bundle_names[4]
    lease = store.acquire(bundle, "b1", now_ms=0, ttl_ms=1_000)
    topic = _topic_in(store, bundle)
    assert _owner(cache, topic, 500) == "b1"
    misses = cache.stats.misses
    assert writer.renew_all("b1", {bundle: lease.token}, now_ms=900, ttl_ms=1_000) == {bundle: True}
    elapsed = _await(lambda: _owner(cache, topic, 1_500) == "b1", cache.max_staleness_s)
    assert elapsed <= cache.max_staleness_s
    assert cache.stats.misses == misses, "re-read by the tracking thread, not by the lookup"
    assert cache.stats.refreshed >= 1


def test_killed_tracking_connection_resyncs_and_misses_no_change(store, writer, cache) -> None:
    bundle = store.get_namespace(NS).bundle_names[5]
    lease = store.acquire(bundle, "b1", now_ms=0, ttl_ms=FOREVER)
    topic = _topic_in(store, bundle)
    assert _owner(cache, topic, 10) == "b1"
    killed = cache.tracking_client_id
    assert writer.r.execute_command("CLIENT", "KILL", "ID", killed) == 1
    # a change made while the tracking connection is gone (its invalidation is lost)
    writer.transfer(bundle, "b1", lease.token, "b3", now_ms=10, ttl_ms=FOREVER)
    elapsed = _await(lambda: _owner(cache, topic, 10) == "b3", cache.max_staleness_s)
    assert elapsed <= cache.max_staleness_s
    _await(lambda: cache.fresh and cache.tracking_client_id != killed, 2.5)
    assert cache.stats.connection_losses >= 1 and cache.stats.connects >= 2
    assert _owner(cache, topic, 10) == "b3"


def test_flushall_drops_everything(store, cache) -> None:
    topic = f"persistent://{NS}/t"
    cache.lookup(topic, 0)
    store.r.flushall()

    def gone() -> bool:
        try:
            cache.lookup(topic, 0)
        except InvalidInput:
            return True
        return False

    assert _await(gone, cache.max_staleness_s) <= cache.max_staleness_s


def test_frozen_redis_means_errors_not_stale_answers_then_recovery(tmp_path: Path) -> None:
    """A silent loss (server stopped, no RST): the missing PONG stops cached answers."""
    with EmbeddedRedis(tmp_path) as server:
        client = redis.Redis.from_url(server.url, socket_timeout=0.3, socket_connect_timeout=0.3)
        s = RedisStore(client, prefix="lc")
        s.create_namespace(NS, 2)
        s.register_broker("b1", now_ms=0, ttl_ms=FOREVER)
        bundle = s.get_namespace(NS).bundle_names[0]
        s.acquire(bundle, "b1", now_ms=0, ttl_ms=FOREVER)
        topic = _topic_in(s, bundle)
        with LookupCache(s, max_staleness_ms=300, heartbeat_ms=20) as c:
            assert _owner(c, topic, 10) == "b1"
            assert server.pid is not None
            os.kill(server.pid, signal.SIGSTOP)
            try:
                stopped = time.monotonic()
                _await(lambda: not c.fresh, c.max_staleness_s)
                assert time.monotonic() - stopped <= c.max_staleness_s + 0.2
                with pytest.raises(redis.RedisError):
                    c.lookup(topic, 10)  # goes to the frozen Redis, never to memory
                assert c.stats.fallbacks >= 1
            finally:
                os.kill(server.pid, signal.SIGCONT)
            _await(lambda: c.fresh, 5.0)
            assert _owner(c, topic, 10) == "b1"
        client.close()


def test_no_forever_stale_entry_under_concurrent_churn(store, writer, cache) -> None:
    """Fills racing invalidations: once writes stop, every answer matches Redis in the bound."""
    names = store.get_namespace(NS).bundle_names
    leases = {b: store.acquire(b, "b1", now_ms=0, ttl_ms=FOREVER) for b in names}
    topics = [f"persistent://{NS}/churn-{i}" for i in range(64)]
    stop = threading.Event()

    def churn() -> None:
        rng = random.Random(3)
        while not stop.is_set():
            b = rng.choice(names)
            cur = leases[b]
            to = rng.choice([x for x in ("b1", "b2", "b3") if x != cur.broker])
            leases[b] = writer.transfer(b, cur.broker, cur.token, to, now_ms=10, ttl_ms=FOREVER)

    t = threading.Thread(target=churn)
    t.start()
    try:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            cache.lookup_many(topics, 10)
            for topic in topics[:8]:
                cache.lookup(topic, 10)
    finally:
        stop.set()
        t.join()
    expected = store.lookup_many(topics, 10)
    elapsed = _await(lambda: cache.lookup_many(topics, 10) == expected, cache.max_staleness_s)
    assert elapsed <= cache.max_staleness_s
    assert [cache.lookup(x, 10) for x in topics] == expected


def test_drop_mode_forgets_on_invalidation_and_rereads_on_lookup(store, writer) -> None:
    bundle = store.get_namespace(NS).bundle_names[6]
    lease = store.acquire(bundle, "b1", now_ms=0, ttl_ms=FOREVER)
    topic = _topic_in(store, bundle)
    with LookupCache(store, max_staleness_ms=MAX_STALENESS_MS, refresh_on_invalidate=False) as c:
        assert _owner(c, topic, 10) == "b1"
        misses = c.stats.misses
        writer.transfer(bundle, "b1", lease.token, "b2", now_ms=10, ttl_ms=FOREVER)
        elapsed = _await(lambda: _owner(c, topic, 10) == "b2", c.max_staleness_s)
        assert elapsed <= c.max_staleness_s
        assert c.stats.misses == misses + 1 and c.stats.refreshed == 0
