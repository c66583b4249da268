"""The expiry sweep never half-applies: keys that hold no lease are named and left alone, and
every lease it removes is reported (and handed to ``on_expired`` before the next batch).

Why: Redis does not undo a Lua script that fails part-way. A sweep script that met a plain
string (``WRONGTYPE``) or a hash without ``expires`` (a Lua error) after deleting some expired
leases left those leases deleted with no report, so no ``expired`` event and no reassignment,
and failed again on every later sweep.
"""

from __future__ import annotations

import pytest
import redis

from metadata_store import ownership_redis
from metadata_store.ownership_memory import MemoryStore
from metadata_store.ownership_redis import RedisStore

NS = "acme/sweep"


def _expired_store(store, n: int = 8) -> list[str]:
    store.create_namespace(NS, n)
    store.register_broker("b1", 0, 10**9)
    names = store.get_namespace(NS).bundle_names
    for b in names:
        store.acquire(b, "b1", now_ms=0, ttl_ms=100)
    return names


MALFORMED = {
    "string": lambda r, key: r.set(key, "not a lease"),
    "no_expires": lambda r, key: r.hset(key, mapping={"broker": "b1", "token": 7}),
    "no_broker": lambda r, key: r.hset(key, mapping={"token": 7, "expires": 5}),
    "text_expires": lambda r, key: r.hset(
        key, mapping={"broker": "b1", "token": 7, "expires": "soon"}
    ),
    "list": lambda r, key: r.rpush(key, "x"),
}


@pytest.mark.parametrize("how", list(MALFORMED))
def test_a_malformed_lease_key_is_reported_and_every_expired_lease_still_swept(
    fresh_redis: redis.Redis, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RedisStore(fresh_redis, prefix="sw")
    names = _expired_store(store)
    bad = names[3]
    store.release(bad, "b1", store.owner(bad, 0).token, 0)
    MALFORMED[how](fresh_redis, store.keys.lease(bad))
    monkeypatch.setattr(ownership_redis, "SWEEP_BATCH", 3)  # several scripts, each judged whole
    batches: list[list[str]] = []
    malformed: list[list[str]] = []
    expired = store.sweep_expired(
        1_000,
        on_expired=lambda ls: batches.append([x.bundle for x in ls]),
        on_malformed=malformed.append,
    )
    swept = [x.bundle for x in expired]
    assert swept == sorted(set(names) - {bad}), "every expired lease is reported"
    assert sorted(b for batch in batches for b in batch) == swept and len(batches) >= 3
    assert malformed == [[bad]]
    assert fresh_redis.exists(store.keys.lease(bad)), "left for the operator"
    assert not any(fresh_redis.exists(store.keys.lease(b)) for b in swept)
    assert fresh_redis.smembers(store.keys.owned("b1")) == set()
    assert store.sweep_expired(2_000, on_malformed=malformed.append) == []
    assert malformed[-1] == [bad], "the key blocks no later sweep"


def test_a_key_named_after_no_canonical_bundle_is_reported_not_judged(
    fresh_redis: redis.Redis,
) -> None:
    store = RedisStore(fresh_redis, prefix="sw")
    names = _expired_store(store, 2)
    upper = f"{store.keys.lease_prefix()}{NS}/0x00000000_0x7FFFFFFF"
    fresh_redis.hset(upper, mapping={"broker": "b1", "token": 1, "expires": 1})
    fresh_redis.set(f"{store.keys.lease_prefix()}junk", "x")
    malformed: list[list[str]] = []
    assert [x.bundle for x in store.sweep_expired(1_000, on_malformed=malformed.append)] == names
    assert malformed == [[f"{NS}/0x00000000_0x7FFFFFFF", "junk"]]
    assert fresh_redis.exists(upper)


def test_a_broken_owned_set_keeps_its_lease_and_the_sweep_goes_on(
    fresh_redis: redis.Redis,
) -> None:
    store = RedisStore(fresh_redis, prefix="sw")
    names = _expired_store(store, 2)
    store.register_broker("b2", 0, 10**9)
    other = store.owner(names[1], 0)
    store.transfer(names[1], "b1", other.token, "b2", 0, 100)
    fresh_redis.delete(store.keys.owned("b2"))
    fresh_redis.set(store.keys.owned("b2"), "not a set")
    malformed: list[list[str]] = []
    swept = store.sweep_expired(1_000, on_malformed=malformed.append)
    assert [x.bundle for x in swept] == [names[0]], "the other expired lease is still removed"
    assert malformed == [[names[1]]]


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_both_stores_hand_each_removed_lease_to_on_expired_once(kind: str, redis_url: str) -> None:
    if kind == "memory":
        store = MemoryStore()
    else:
        client = redis.Redis.from_url(redis_url)
        client.flushall()
        store = RedisStore(client, prefix="sw")
    names = _expired_store(store, 4)
    seen: list[str] = []
    malformed: list[list[str]] = []
    expired = store.sweep_expired(
        1_000,
        on_expired=lambda ls: seen.extend(x.bundle for x in ls),
        on_malformed=malformed.append,
    )
    assert seen == [x.bundle for x in expired] == names
    assert malformed == [[]]
    assert store.sweep_expired(1_001) == []
