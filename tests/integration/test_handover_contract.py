"""Handover fences, the same on both stores: a lease that ends by a move keeps the next holder
waiting until the old holder acknowledges (after it stopped) or its old lease's expiry passes.

Why: ``RedisStore`` (Lua) and ``MemoryStore`` (the fast model) must agree, or the fast model's
figures would not describe the product (``metadata_store.handover``).
"""

from __future__ import annotations

import pytest

from metadata_store.ownership_memory import MemoryStore
from metadata_store.ownership_redis import RedisStore

NS = "acme/ho"
TTL = 30_000
FOREVER = 10**12
T0 = 1_000_000

Store = RedisStore | MemoryStore


@pytest.fixture(params=["redis", "memory"])
def store(request: pytest.FixtureRequest) -> Store:
    s: Store
    if request.param == "redis":
        import redis

        request.getfixturevalue("fresh_redis")
        s = RedisStore(redis.Redis.from_url(request.getfixturevalue("redis_url")), prefix="ho")
    else:
        s = MemoryStore()
    s.create_namespace(NS, 4)
    for b in ("a", "b", "c"):
        s.register_broker(b, 0, FOREVER)
    return s


def _bundle(s: Store, i: int = 0) -> str:
    nb = s.get_namespace(NS)
    assert nb is not None
    return nb.bundle_names[i]


def test_transfer_waits_for_the_old_expiry_until_acknowledged(store: Store) -> None:
    b = _bundle(store)
    old = store.acquire(b, "a", T0, TTL)
    assert old.wait_ms == 0  # nobody served it before
    new = store.transfer(b, "a", old.token, "b", T0 + 1_000, TTL)
    assert new.wait_ms == old.expires_at_ms - (T0 + 1_000)
    (fence,) = store.handover_fences(NS, T0 + 1_000)
    assert (fence.broker, fence.token, fence.expires_at_ms) == ("a", old.token, old.expires_at_ms)
    (renewed,) = store.renew_leases("b", {b: new.token}, T0 + 5_000, TTL).values()
    assert renewed is not None and renewed.wait_ms == old.expires_at_ms - (T0 + 5_000)
    # only the old holder's own acknowledgement ends the fence
    assert not store.ack_handover("b", b, old.token)
    assert not store.ack_handover("a", b, new.token)
    assert store.ack_handover("a", b, old.token)
    assert store.handover_fences(NS, T0 + 5_000) == []
    (renewed,) = store.renew_leases("b", {b: new.token}, T0 + 6_000, TTL).values()
    assert renewed is not None and renewed.wait_ms == 0


def test_the_wait_ends_when_the_old_expiry_passes(store: Store) -> None:
    b = _bundle(store)
    old = store.acquire(b, "a", T0, TTL)
    new = store.transfer(b, "a", old.token, "b", T0, TTL)
    assert new.wait_ms == TTL
    (renewed,) = store.renew_leases("b", {b: new.token}, T0 + TTL // 2, TTL).values()
    assert renewed is not None and renewed.wait_ms == TTL // 2
    (renewed,) = store.renew_leases("b", {b: new.token}, old.expires_at_ms, TTL).values()
    assert renewed is not None and renewed.wait_ms == 0
    assert store.handover_fences(NS, old.expires_at_ms) == []


def test_a_release_fences_the_next_acquire_and_an_expiry_does_not(store: Store) -> None:
    b0, b1 = _bundle(store, 0), _bundle(store, 1)
    first = store.acquire(b0, "a", T0, TTL)
    assert store.release(b0, "a", first.token, T0 + 100)
    assert store.acquire(b0, "b", T0 + 200, TTL).wait_ms == first.expires_at_ms - (T0 + 200)
    # a lease that lapsed hands over by expiry: no fence, no wait
    lapsed = store.acquire(b1, "a", T0, TTL)
    assert store.acquire(b1, "b", lapsed.expires_at_ms, TTL).wait_ms == 0


def test_a_split_fences_its_children_and_a_merge_its_bundle(store: Store) -> None:
    b0 = _bundle(store, 0)
    parent = store.acquire(b0, "a", T0, TTL)
    r = store.get_namespace(NS).bundles[0]  # type: ignore[union-attr]
    nb = store.split_bundle(b0, [(r.lower + r.upper) // 2], now_ms=T0 + 10)
    left, right = nb.bundle_names[0], nb.bundle_names[1]
    assert store.acquire(right, "b", T0 + 20, TTL).wait_ms == parent.expires_at_ms - (T0 + 20)
    # its own old range does not hold the old holder back
    assert store.acquire(left, "a", T0 + 20, TTL).wait_ms == 0
    # a bundle elsewhere in the ring is not fenced
    assert store.acquire(_bundle(store, 3), "b", T0 + 20, TTL).wait_ms == 0
    # merging two live bundles fences the merged one with the later expiry of the two
    la = store.owner(left, T0 + 30)
    ra = store.owner(right, T0 + 30)
    assert la is not None and ra is not None
    store.ack_handover("a", b0, parent.token)
    merged = store.merge_bundles(left, right, now_ms=T0 + 40).bundle_names[0]
    got = store.acquire(merged, "c", T0 + 50, TTL)
    assert got.wait_ms == max(la.expires_at_ms, ra.expires_at_ms) - (T0 + 50)
    assert {f.broker for f in store.handover_fences(NS, T0 + 50)} == {"a", "b"}
