"""Redis's clock, as the store uses it, measured against Redis's own ``TIME`` on real Redis.

Why: a broker's serve-until rule (docs/ownership.md, "The clock") rests on one promise: a lease
granted or renewed by a request sent at ``t0`` is valid until at least ``t0 + ttl``. Caller-
clock tests inject ``now`` and never run the server clock, so a ``clock()`` that drops the
milliseconds of ``TIME`` (every lease up to 999 ms short in real time) or a read that judges
with a truncated time passes all of them. These tests read ``TIME`` around each grant and read,
so each fails when the clock arithmetic in ``metadata_store/ownership_redis.py`` is broken
(``tests/safety/mutants_agent.py`` names the mutants).
"""

from __future__ import annotations

import time

import redis

from metadata_store.ownership_redis import RedisStore

NS = "acme/clock"
TTL = 5_000
FOREVER = 10**9
TRIALS = 5


def _redis_ms(client: redis.Redis) -> int:
    """Redis's ``TIME`` in whole milliseconds (what a script's ``clock()`` must give)."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _server_store(client: redis.Redis) -> tuple[RedisStore, list[str]]:
    store = RedisStore(client, "clk", clock="server")
    store.create_namespace(NS, 2 * TRIALS)
    store.register_broker("b1", now_ms=0, ttl_ms=FOREVER)
    return store, store.get_namespace(NS).bundle_names


def test_a_server_clock_grant_lasts_its_ttl_from_the_redis_time_it_was_sent(
    fresh_redis: redis.Redis,
) -> None:
    """For acquire, renewal and registration: ``TIME`` before the request + ttl <= expiry <=
    ``TIME`` after the reply + ttl. Several trials, so a grant that happens to run in the first
    millisecond of a second cannot hide a clock that drops the milliseconds."""
    store, names = _server_store(fresh_redis)
    for name in names[:TRIALS]:
        t0 = _redis_ms(fresh_redis)
        lease = store.acquire(name, "b1", now_ms=0, ttl_ms=TTL)
        t1 = _redis_ms(fresh_redis)
        assert t0 + TTL <= lease.expires_at_ms <= t1 + TTL, (t0, lease, t1)
        time.sleep(0.0037)  # spread the trials over the millisecond digits
        t0 = _redis_ms(fresh_redis)
        renewed = store.renew_leases("b1", {name: lease.token}, now_ms=0, ttl_ms=TTL)[name]
        t1 = _redis_ms(fresh_redis)
        assert renewed is not None and t0 + TTL <= renewed.expires_at_ms <= t1 + TTL
        t0 = _redis_ms(fresh_redis)
        store.register_broker("short", now_ms=0, ttl_ms=TTL)
        t1 = _redis_ms(fresh_redis)
        expires = int(fresh_redis.hget(store.keys.broker("short"), "expires"))
        assert t0 + TTL <= expires <= t1 + TTL, (t0, expires, t1)


def test_a_server_clock_read_sees_a_lease_expire_at_its_expiry(fresh_redis: redis.Redis) -> None:
    """Once ``TIME`` has reached a lease's expiry, every read says it is gone: a read judging
    with an older time would show an owner that may already have stopped serving."""
    store, names = _server_store(fresh_redis)
    for name in names[:TRIALS]:
        lease = store.acquire(name, "b1", now_ms=0, ttl_ms=20)
        while _redis_ms(fresh_redis) < lease.expires_at_ms:
            time.sleep(0.001)
        assert store.owner(name, now_ms=0) is None, lease
        assert name not in store.owners(NS, now_ms=0)
        time.sleep(0.0071)


def test_every_grant_expires_exactly_its_ttl_after_the_script_ran(
    fresh_redis: redis.Redis,
) -> None:
    """Acquire, transfer, renewal and registration: expiry = the script's now + ttl, and a
    lease or registration is gone at that instant (caller clock, so the instants are exact)."""
    store = RedisStore(fresh_redis, "clk")
    store.create_namespace(NS, 2)
    for b in ("b1", "b2"):
        store.register_broker(b, now_ms=0, ttl_ms=FOREVER)
    a = store.get_namespace(NS).bundle_names[0]
    assert store.acquire(a, "b1", now_ms=0, ttl_ms=100).expires_at_ms == 100
    moved = store.transfer(a, "b1", store.owner(a, 1).token, "b2", now_ms=10, ttl_ms=100)
    assert moved.expires_at_ms == 110
    assert store.owner(a, now_ms=109) == moved and store.owner(a, now_ms=110) is None
    renewed = store.renew_leases("b2", {a: moved.token}, now_ms=20, ttl_ms=100)[a]
    assert renewed is not None and renewed.expires_at_ms == 120
    store.register_broker("short", now_ms=30, ttl_ms=50)
    assert "short" in store.live_brokers(now_ms=79)
    assert "short" not in store.live_brokers(now_ms=80)
