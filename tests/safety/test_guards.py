"""One test per ownership guard, through the public store API, on real Redis and the MemoryStore.

Why: each guard in ``metadata_store.ownership_redis`` (a Lua script or its Python pre-check), its
twin in ``metadata_store.ownership_memory`` and the fence floor of ``controller.recovery`` must have
a test that fails when that guard alone is removed. ``tests/safety/mutants.py`` names the mutant
each test here kills, and ``python -m tests.safety.run_mutants --guard-tests`` shows that it does.

Every store here reports to a ``HistoryRecorder``, and each test ends by running the
independent checker (``loadbalance.lease_checker.check_history``) over what the store granted:
the scenario's own assertions say what the guard must answer, the checker says the history it
left behind has no double owner, no revived lease, no sweep of a live lease and only growing
tokens. The tests run in one thread, so the recorded order is the execution order
(``ordered=True``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis

from controller.recovery import recover, trusted_floor
from loadbalance.bundles import FULL_UPPER, NamespaceBundles
from loadbalance.errors import Conflict, InvalidInput
from loadbalance.lease_checker import check_history
from loadbalance.lease_history import HistoryRecorder
from metadata_store.leases import BrokerNotAlive
from metadata_store.ownership_memory import MemoryStore
from metadata_store.ownership_redis import RedisStore
from metadata_store.protocol import OwnershipStore

NS = "acme/guards"
PREFIX = "safety"
TTL = 100
FOREVER = 10**12


@dataclass
class Env:
    """A store with two bundles of ``NS`` (``a``, ``b``), brokers b1..b3 live for ever, and
    the recorder the store reports to."""

    store: OwnershipStore
    rec: HistoryRecorder
    a: str
    b: str

    def clean(self) -> None:
        assert check_history(self.rec.snapshot(), ordered=True) == []


@pytest.fixture(params=["redis", "memory"])
def env(request: pytest.FixtureRequest) -> Iterator[Env]:
    rec = HistoryRecorder()
    if request.param == "redis":
        client = request.getfixturevalue("fresh_redis")
        store: OwnershipStore = RedisStore(client, PREFIX, recorder=rec)
    else:
        store = MemoryStore(recorder=rec)
    store.create_namespace(NS, 2)
    for broker in ("b1", "b2", "b3"):
        store.register_broker(broker, now_ms=0, ttl_ms=FOREVER)
    a, b = store.get_namespace(NS).bundle_names
    yield Env(store, rec, a, b)


# -- acquire ------------------------------------------------------------------------------------
def test_acquire_never_takes_over_a_live_lease(env: Env) -> None:
    s = env.store
    first = s.acquire(env.a, "b1", now_ms=0, ttl_ms=TTL)
    with pytest.raises(Conflict):
        s.acquire(env.a, "b2", now_ms=TTL - 1, ttl_ms=TTL)  # one millisecond before expiry
    assert s.owner(env.a, now_ms=TTL - 1) == first
    taken = s.acquire(env.a, "b2", now_ms=TTL, ttl_ms=TTL)  # expired at its deadline: free
    assert taken.broker == "b2" and taken.token > first.token
    env.clean()


def test_acquire_needs_a_live_registration(env: Env) -> None:
    s = env.store
    s.register_broker("short", now_ms=0, ttl_ms=50)
    assert "short" in s.live_brokers(now_ms=49)
    s.acquire(env.a, "short", now_ms=49, ttl_ms=TTL)
    assert "short" not in s.live_brokers(now_ms=50), "expired at its deadline"
    with pytest.raises(BrokerNotAlive):
        s.acquire(env.b, "short", now_ms=50, ttl_ms=TTL)
    with pytest.raises(BrokerNotAlive):
        s.acquire(env.b, "ghost", now_ms=50, ttl_ms=TTL)  # never registered
    assert s.owner(env.b, now_ms=50) is None
    s.heartbeat("short", now_ms=60, ttl_ms=50)
    assert s.acquire(env.b, "short", now_ms=60, ttl_ms=TTL).broker == "short"
    env.clean()


def test_a_split_parent_cannot_be_acquired_over_its_children(env: Env) -> None:
    s = env.store
    s.split_bundle(env.a, [0x40000000], now_ms=0)
    child = s.get_namespace(NS).bundle_names[0]
    s.acquire(child, "b1", now_ms=1, ttl_ms=TTL)
    with pytest.raises(InvalidInput, match="not a current bundle"):
        s.acquire(env.a, "b2", now_ms=2, ttl_ms=TTL)  # the parent covers b1's child
    assert s.owner(env.a, now_ms=2) is None
    env.clean()


# -- renew --------------------------------------------------------------------------------------
def test_a_swept_token_is_never_renewed(env: Env) -> None:
    s = env.store
    old = s.acquire(env.a, "b1", now_ms=0, ttl_ms=TTL)
    assert s.sweep_expired(now_ms=TTL) == [old]
    new = s.acquire(env.a, "b1", now_ms=TTL + 1, ttl_ms=TTL)
    # b1 still remembers the swept token; the store must not extend anything for it
    assert s.renew_all("b1", {env.a: old.token}, now_ms=TTL + 2, ttl_ms=10 * TTL) == {env.a: False}
    assert s.owner(env.a, now_ms=TTL + 2) == new
    assert s.owner(env.a, now_ms=2 * TTL + 1) is None, "the stale renewal did not extend it"
    env.clean()


def test_an_expired_lease_is_not_revived_by_renewal(env: Env) -> None:
    s = env.store
    lease = s.acquire(env.a, "b1", now_ms=0, ttl_ms=TTL)
    assert s.renew_all("b1", {env.a: lease.token}, now_ms=TTL, ttl_ms=TTL) == {env.a: False}
    assert s.owner(env.a, now_ms=TTL) is None, "a lost lease stays lost"
    assert s.acquire(env.a, "b2", now_ms=TTL, ttl_ms=TTL).broker == "b2"
    env.clean()


# -- sweep --------------------------------------------------------------------------------------
def test_the_sweep_keeps_live_and_just_renewed_leases(env: Env) -> None:
    s = env.store
    s.split_bundle(env.b, [0xC0000000], now_ms=0)
    a, b, c = s.get_namespace(NS).bundle_names
    old = s.acquire(a, "b1", now_ms=0, ttl_ms=TTL)
    renewed = s.acquire(b, "b1", now_ms=0, ttl_ms=TTL)
    live = s.acquire(c, "b2", now_ms=0, ttl_ms=10 * TTL)
    assert s.renew_all("b1", {b: renewed.token}, now_ms=TTL - 1, ttl_ms=TTL) == {b: True}
    assert s.sweep_expired(now_ms=TTL) == [old]
    assert set(s.owners(NS, now_ms=TTL)) == {b, c}
    assert s.owner(c, now_ms=TTL) == live
    env.clean()


# -- transfer -----------------------------------------------------------------------------------
def test_a_stale_token_cannot_move_a_lease(env: Env) -> None:
    s = env.store
    first = s.acquire(env.a, "b1", now_ms=0, ttl_ms=TTL)
    there = s.transfer(env.a, "b1", first.token, "b2", now_ms=1, ttl_ms=TTL)
    back = s.transfer(env.a, "b2", there.token, "b1", now_ms=2, ttl_ms=TTL)
    # b1 holds the bundle again, but with a new token; its first token is fenced out
    with pytest.raises(Conflict):
        s.transfer(env.a, "b1", first.token, "b3", now_ms=3, ttl_ms=TTL)
    assert s.owner(env.a, now_ms=3) == back
    env.clean()


def test_an_expired_lease_cannot_be_moved(env: Env) -> None:
    s = env.store
    lease = s.acquire(env.a, "b1", now_ms=0, ttl_ms=TTL)
    with pytest.raises(Conflict):
        s.transfer(env.a, "b1", lease.token, "b2", now_ms=TTL, ttl_ms=TTL)
    assert s.owner(env.a, now_ms=TTL) is None
    env.clean()


def test_a_lease_never_moves_to_an_expired_broker(env: Env) -> None:
    s = env.store
    s.register_broker("short", now_ms=0, ttl_ms=50)
    lease = s.acquire(env.a, "b1", now_ms=0, ttl_ms=TTL)
    for dead in ("short", "ghost"):
        with pytest.raises(BrokerNotAlive):
            s.transfer(env.a, "b1", lease.token, dead, now_ms=50, ttl_ms=TTL)
    assert s.owner(env.a, now_ms=50) == lease
    env.clean()


# -- release ------------------------------------------------------------------------------------
def test_release_needs_the_holder_and_its_token(env: Env) -> None:
    s = env.store
    first = s.acquire(env.a, "b1", now_ms=0, ttl_ms=TTL)
    there = s.transfer(env.a, "b1", first.token, "b2", now_ms=1, ttl_ms=TTL)
    assert not s.release(env.a, "b1", there.token, now_ms=2), "not the holder"
    assert not s.release(env.a, "b2", first.token, now_ms=2), "not the current token"
    assert not s.release(env.a, "b1", first.token, now_ms=2), "the old holder, fenced out"
    assert s.owner(env.a, now_ms=2) == there
    assert s.release(env.a, "b2", there.token, now_ms=3)
    assert s.owner(env.a, now_ms=3) is None
    env.clean()


# -- split and merge ----------------------------------------------------------------------------
def test_a_split_with_a_stale_expected_version_changes_nothing(env: Env) -> None:
    s = env.store
    now = s.split_bundle(env.a, [0x40000000], expected_version=0, now_ms=0)
    with pytest.raises(Conflict):
        s.split_bundle(env.b, [0xC0000000], expected_version=0, now_ms=1)
    with pytest.raises(Conflict):
        s.merge_bundles(*now.bundle_names[:2], expected_version=0, now_ms=1)
    assert s.get_namespace(NS) == now
    env.clean()


def test_a_split_computed_from_a_stale_version_never_overwrites_a_newer_one(
    fresh_redis: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two controllers: A reads version 0, B splits another bundle, then A's script runs.

    The only thing between A's stale boundaries and Redis is the script's compare-and-set on
    the version, so the interleaving is forced: A's namespace read performs B's split right
    after reading.
    """
    rec = HistoryRecorder()
    a = RedisStore(fresh_redis, PREFIX, recorder=rec)
    b = RedisStore(redis.Redis(connection_pool=fresh_redis.connection_pool), PREFIX, recorder=rec)
    a.create_namespace(NS, 2)
    left, right = a.get_namespace(NS).bundle_names
    read = a.get_namespace
    racing = [(right, 0xC0000000)]  # what B splits right after A's next read

    def read_then_lose_the_race(ns: str) -> NamespaceBundles | None:
        nb = read(ns)
        if racing:
            bundle, point = racing.pop()
            b.split_bundle(bundle, [point], now_ms=1)
        return nb

    monkeypatch.setattr(a, "get_namespace", read_then_lose_the_race)
    with pytest.raises(Conflict):  # a controller that named the version gives up
        a.split_bundle(left, [0x40000000], expected_version=0, now_ms=2)
    after_b = b.get_namespace(NS)
    assert (after_b.version, after_b.boundaries) == (1, (0, 0x80000000, 0xC0000000, FULL_UPPER))
    racing.append((f"{NS}/0x80000000_0xc0000000", 0xA0000000))
    out = a.split_bundle(left, [0x40000000], now_ms=3)  # one that did not re-reads and retries
    final = b.get_namespace(NS)
    assert final == out and final.version == 3
    assert final.boundaries == (0, 0x40000000, 0x80000000, 0xA0000000, 0xC0000000, FULL_UPPER)
    assert check_history(rec.snapshot(), ordered=True) == []


def test_a_split_then_merge_never_revives_the_parents_lease(env: Env) -> None:
    s = env.store
    s.acquire(env.a, "b1", now_ms=0, ttl_ms=FOREVER)
    halves = s.split_bundle(env.a, [0x40000000], now_ms=1).bundle_names[:2]
    s.acquire(halves[0], "b2", now_ms=2, ttl_ms=TTL)
    assert s.owner(env.a, now_ms=2) is None, "the parent's lease ended with the split"
    s.merge_bundles(*halves, now_ms=3)
    assert s.owner(env.a, now_ms=3) is None, "the old lease of the same range stays ended"
    assert s.owners(NS, now_ms=3) == {}
    assert s.acquire(env.a, "b3", now_ms=4, ttl_ms=TTL).broker == "b3"
    env.clean()


# -- fencing tokens -----------------------------------------------------------------------------
def test_every_grant_gets_a_larger_token(env: Env) -> None:
    s = env.store
    t1 = s.acquire(env.a, "b1", now_ms=0, ttl_ms=TTL).token
    t2 = s.acquire(env.b, "b1", now_ms=0, ttl_ms=TTL).token
    t3 = s.transfer(env.a, "b1", t1, "b2", now_ms=1, ttl_ms=TTL).token
    assert s.release(env.b, "b1", t2, now_ms=2)
    t4 = s.acquire(env.b, "b3", now_ms=3, ttl_ms=TTL).token
    t5 = s.transfer(env.b, "b3", t4, "b1", now_ms=4, ttl_ms=TTL).token
    t6 = s.acquire(env.a, "b3", now_ms=1 + TTL, ttl_ms=TTL).token  # b2's lease expired
    tokens = [t1, t2, t3, t4, t5, t6]
    assert tokens == sorted(set(tokens)), f"tokens must strictly grow: {tokens}"
    assert s.renew_all("b2", {env.a: t3}, now_ms=2 + TTL, ttl_ms=TTL) == {env.a: False}
    env.clean()


# -- one identity per bundle --------------------------------------------------------------------
def test_two_spellings_of_one_bundle_are_one_lease(env: Env) -> None:
    s = env.store
    shouted = env.b.replace("0x80000000_0xffffffff", "0x80000000_0xFFFFFFFF")
    assert shouted != env.b
    lease = s.acquire(shouted, "b1", now_ms=0, ttl_ms=TTL)
    assert lease.bundle == env.b, "answers carry the canonical name"
    assert s.owner(env.b, now_ms=1) == lease
    assert s.owners(NS, now_ms=1) == {env.b: lease}
    for spelling in (env.b, shouted):
        with pytest.raises(Conflict):
            s.acquire(spelling, "b2", now_ms=1, ttl_ms=TTL)
    assert s.renew_all("b1", {shouted: lease.token}, now_ms=2, ttl_ms=TTL) == {shouted: True}
    assert s.release(env.b, "b1", lease.token, now_ms=3)
    assert s.owner(shouted, now_ms=3) is None
    env.clean()


# -- recovery -----------------------------------------------------------------------------------
def test_recovery_grants_only_tokens_above_the_floor(fresh_redis: redis.Redis) -> None:
    """After a loss, brokers may still hold tokens up to the floor; every new one is above."""
    store = RedisStore(fresh_redis, PREFIX)
    now = 1_700_000_000_000
    for broker in ("b1", "b2"):
        store.register_broker(broker, now, FOREVER)
    left, right = f"{NS}/0x00000000_0x80000000", f"{NS}/0x80000000_0xffffffff"
    report = recover(
        store, {"b1": [left], "b2": [right]}, now_ms=now, lease_ttl_ms=TTL, token_floor=57,
        reason="test",
    )  # fmt: skip
    tokens = sorted(t for _, t in report.leases_granted.values())
    assert tokens == [58, 59], "the counter was raised to the floor, then one INCR per grant"
    assert store.owner(left, now_ms=now).token == report.leases_granted[left][1]
    # b1 may remember token 57 from before the loss: that token is fenced out
    assert store.renew_all("b1", {left: 57}, now_ms=now, ttl_ms=TTL) == {left: False}
    assert int(fresh_redis.get(f"{PREFIX}:fence")) == 59


def test_the_trusted_floor_is_the_top_of_the_dense_tokens() -> None:
    assert trusted_floor([3, 12, 57]) == (57, [])
    assert trusted_floor([3, 12, 57, 10**12]) == (57, [10**12])
