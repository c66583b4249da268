"""The ``OwnershipStore`` contract, run against RedisStore (real Redis) and MemoryStore alike.

Every test takes ``make_store``: a factory of handles on one shared, empty store (a new Redis
connection each call for RedisStore; the same instance for MemoryStore), so racing tests give
each thread its own handle. The last test replays one seeded random operation sequence on both
implementations and requires identical answers, which catches any semantic drift the targeted
tests miss.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

import pytest

from loadbalance.bundles import FULL_UPPER, check_boundaries, parse_bundle
from loadbalance.errors import Conflict, InvalidInput
from loadbalance.lease_checker import check_history
from loadbalance.lease_history import Claim, HistoryRecorder
from metadata_store.leases import BrokerNotAlive, Lease
from metadata_store.ownership_memory import MemoryStore
from metadata_store.ownership_redis import RedisStore
from metadata_store.protocol import OwnershipStore

NS = "acme/contract"
TTL = 30_000
FOREVER = 10**12

StoreFactory = Callable[[], OwnershipStore]


@pytest.fixture(params=["redis", "memory"])
def make_store(request: pytest.FixtureRequest) -> StoreFactory:
    if request.param == "redis":
        import redis

        request.getfixturevalue("fresh_redis")  # an empty server
        url = request.getfixturevalue("redis_url")
        return lambda: RedisStore(redis.Redis.from_url(url), prefix="contract")
    shared = MemoryStore()
    return lambda: shared


@pytest.fixture
def store(make_store: StoreFactory) -> OwnershipStore:
    s = make_store()
    s.create_namespace(NS, 4)
    for b in ("b1", "b2", "b3"):
        s.register_broker(b, now_ms=0, ttl_ms=FOREVER)
    return s


def _names(s: OwnershipStore) -> list[str]:
    return s.get_namespace(NS).bundle_names


def test_both_implementations_satisfy_the_protocol(make_store: StoreFactory) -> None:
    assert isinstance(make_store(), OwnershipStore)


# -- namespaces, splits, merges ----------------------------------------------------------------
def test_namespace_starts_at_version_zero_with_equal_partitions(make_store) -> None:
    s = make_store()
    assert s.get_namespace(NS) is None and s.list_namespaces() == []
    assert s.create_namespace(NS, 4) is True
    nb = s.get_namespace(NS)
    assert nb.boundaries == (0, 0x40000000, 0x80000000, 0xC0000000, FULL_UPPER)
    assert nb.version == 0
    with pytest.raises(InvalidInput, match="already exists"):
        s.create_namespace(NS, 8)
    assert s.create_namespace(NS, 8, exist_ok=True) is False
    assert len(s.get_namespace(NS)) == 4, "an existing namespace is left untouched"
    s.create_namespace("acme/a", 1)
    assert s.list_namespaces() == ["acme/a", NS]
    with pytest.raises(InvalidInput):
        s.create_namespace("no-slash", 2)


def test_split_bumps_the_version_ends_the_parent_lease_and_is_compare_and_set(store) -> None:
    parent = _names(store)[0]
    store.acquire(parent, "b1", now_ms=0, ttl_ms=TTL)
    new = store.split_bundle(parent, [0x20000000], expected_version=0)
    assert new.version == 1 and new == store.get_namespace(NS)
    assert new.bundle_names[:2] == [f"{NS}/0x00000000_0x20000000", f"{NS}/0x20000000_0x40000000"]
    assert store.owner(parent, now_ms=1) is None
    assert store.owners(NS, now_ms=1) == {}, "children start unowned"
    with pytest.raises(Conflict):
        store.split_bundle(new.bundle_names[0], [0x10000000], expected_version=0)
    with pytest.raises(InvalidInput):
        store.split_bundle(parent, [0x10000000])  # the parent is gone
    with pytest.raises(InvalidInput):
        store.split_bundle(new.bundle_names[0], [0x30000000])  # not inside the bundle
    with pytest.raises(InvalidInput):
        store.split_bundle(new.bundle_names[0], [])
    with pytest.raises(InvalidInput, match="unknown namespace"):
        store.split_bundle("nope/ns/0x00000000_0xffffffff", [0x10])
    assert store.get_namespace(NS) == new, "failed splits change nothing"
    with pytest.raises(InvalidInput):
        store.acquire(parent, "b1", now_ms=2, ttl_ms=TTL)
    two = store.split_bundle(new.bundle_names[-1], [0xD0000000, 0xE0000000])
    assert two.version == 2 and len(two) == 7
    check_boundaries(two.boundaries)


def test_merge_needs_adjacent_current_bundles_and_ends_both_leases(store) -> None:
    a, b, c, _ = _names(store)
    store.acquire(a, "b1", now_ms=0, ttl_ms=TTL)
    store.acquire(b, "b1", now_ms=0, ttl_ms=TTL)
    store.acquire(c, "b2", now_ms=0, ttl_ms=TTL)
    with pytest.raises(InvalidInput, match="adjacent"):
        store.merge_bundles(a, c)
    with pytest.raises(Conflict):
        store.merge_bundles(a, b, expected_version=3)
    merged = store.merge_bundles(b, a, expected_version=0)
    assert merged.version == 1
    assert merged.boundaries == (0, 0x80000000, 0xC0000000, FULL_UPPER)
    assert store.owners(NS, now_ms=1) == {c: store.owner(c, now_ms=1)}
    assert store.owner(a, now_ms=1) is None and store.owner(b, now_ms=1) is None
    with pytest.raises(InvalidInput):
        store.merge_bundles(a, b)  # both are gone


# -- leases -------------------------------------------------------------------------------------
def test_acquire_needs_a_live_broker_and_a_free_current_bundle(store) -> None:
    a, b, *_ = _names(store)
    lease = store.acquire(a, "b1", now_ms=1_000, ttl_ms=TTL)
    assert lease == Lease(a, "b1", lease.token, 1_000 + TTL)
    assert store.owner(a, now_ms=1_001) == lease
    with pytest.raises(Conflict, match="owned by b1"):
        store.acquire(a, "b2", now_ms=2_000, ttl_ms=TTL)
    with pytest.raises(Conflict):
        store.acquire(a, "b1", now_ms=2_000, ttl_ms=TTL)  # even its owner: renew instead
    with pytest.raises(BrokerNotAlive):
        store.acquire(a, "ghost", now_ms=2_000, ttl_ms=TTL)  # liveness is checked first
    store.register_broker("short", now_ms=0, ttl_ms=5)
    with pytest.raises(BrokerNotAlive):
        store.acquire(b, "short", now_ms=5, ttl_ms=TTL)
    with pytest.raises(InvalidInput):
        store.acquire(f"{NS}/0x00000000_0x10000000", "b1", now_ms=5, ttl_ms=TTL)
    with pytest.raises(InvalidInput):
        store.acquire("nope/ns/0x00000000_0xffffffff", "b1", now_ms=5, ttl_ms=TTL)
    with pytest.raises(InvalidInput):
        store.acquire("not a bundle", "b1", now_ms=5, ttl_ms=TTL)
    assert store.owner(b, now_ms=6) is None


def test_fencing_tokens_only_grow_across_bundles_and_owners(store) -> None:
    names = _names(store)
    tokens = [store.acquire(n, "b1", now_ms=0, ttl_ms=TTL).token for n in names]
    moved = store.transfer(names[0], "b1", tokens[0], "b2", now_ms=1, ttl_ms=TTL)
    assert store.release(names[1], "b1", tokens[1], now_ms=2)
    again = store.acquire(names[1], "b3", now_ms=3, ttl_ms=TTL)
    seq = [*tokens, moved.token, again.token]
    assert seq == sorted(seq) and len(set(seq)) == len(seq), seq


def test_renew_all_renews_only_what_the_broker_still_holds(store) -> None:
    a, b, c, d = _names(store)
    la = store.acquire(a, "b1", now_ms=0, ttl_ms=TTL)
    lb = store.acquire(b, "b1", now_ms=0, ttl_ms=TTL)
    lc = store.acquire(c, "b2", now_ms=0, ttl_ms=TTL)
    assert store.renew_all("b1", {}, now_ms=1, ttl_ms=TTL) == {}
    got = store.renew_all(
        "b1", {a: la.token, b: lb.token - 1, c: lc.token, d: 1}, now_ms=10_000, ttl_ms=TTL
    )
    assert got == {a: True, b: False, c: False, d: False}
    assert store.owner(a, now_ms=10_000 + TTL - 1).expires_at_ms == 10_000 + TTL
    assert store.owner(b, now_ms=TTL) is None, "the stale-token renewal did not extend it"
    assert store.owner(c, now_ms=1).broker == "b2"
    assert store.renew_all("b1", {b: lb.token}, now_ms=TTL, ttl_ms=TTL) == {b: False}


def test_release_only_by_the_live_holder_with_its_token(store) -> None:
    a = _names(store)[0]
    lease = store.acquire(a, "b1", now_ms=0, ttl_ms=TTL)
    assert not store.release(a, "b2", lease.token, now_ms=1)
    assert not store.release(a, "b1", lease.token + 1, now_ms=1)
    assert not store.release(_names(store)[1], "b1", lease.token, now_ms=1)
    assert store.release(a, "b1", lease.token, now_ms=1)
    assert store.owner(a, now_ms=1) is None
    assert not store.release(a, "b1", lease.token, now_ms=1), "twice is a no-op"
    late = store.acquire(a, "b1", now_ms=2, ttl_ms=10)
    assert not store.release(a, "b1", late.token, now_ms=12), "an expired lease is not released"


def test_transfer_moves_a_live_lease_atomically_with_a_new_token(store) -> None:
    a = _names(store)[0]
    lease = store.acquire(a, "b1", now_ms=0, ttl_ms=TTL)
    with pytest.raises(InvalidInput):
        store.transfer(a, "b1", lease.token, "b1", now_ms=1, ttl_ms=TTL)
    with pytest.raises(Conflict):  # the holder check comes before the destination check
        store.transfer(a, "b1", lease.token - 1, "ghost", now_ms=1, ttl_ms=TTL)
    with pytest.raises(BrokerNotAlive):
        store.transfer(a, "b1", lease.token, "ghost", now_ms=1, ttl_ms=TTL)
    assert store.owner(a, now_ms=1) == lease, "failed transfers change nothing"
    moved = store.transfer(a, "b1", lease.token, "b2", now_ms=10, ttl_ms=TTL)
    assert moved == Lease(a, "b2", moved.token, 10 + TTL) and moved.token > lease.token
    assert store.owner(a, now_ms=11) == moved
    with pytest.raises(Conflict):
        store.transfer(a, "b1", lease.token, "b3", now_ms=12, ttl_ms=TTL)
    assert store.renew_all("b1", {a: lease.token}, now_ms=12, ttl_ms=TTL) == {a: False}
    assert not store.release(a, "b1", lease.token, now_ms=12)
    with pytest.raises(Conflict):  # an expired lease cannot be moved
        store.transfer(a, "b2", moved.token, "b3", now_ms=10 + TTL, ttl_ms=TTL)


def test_expired_leases_are_swept_and_the_old_owner_is_fenced_out(store) -> None:
    a, b, c, _ = _names(store)
    old_a = store.acquire(a, "b1", now_ms=0, ttl_ms=100)
    old_b = store.acquire(b, "b1", now_ms=0, ttl_ms=100)
    live = store.acquire(c, "b2", now_ms=0, ttl_ms=TTL)
    assert store.owner(a, now_ms=99) == old_a
    assert store.owner(a, now_ms=100) is None, "expired at its deadline"
    # re-acquiring an expired lease does not need a sweep first
    new_b = store.acquire(b, "b2", now_ms=100, ttl_ms=TTL)
    assert new_b.token > max(old_a.token, old_b.token, live.token)
    assert store.sweep_expired(now_ms=100) == [old_a]
    assert store.sweep_expired(now_ms=101) == []
    assert store.owners(NS, now_ms=101) == {b: new_b, c: live}
    assert store.renew_all("b1", {a: old_a.token, b: old_b.token}, 101, TTL) == {
        a: False,
        b: False,
    }
    assert not store.release(b, "b1", old_b.token, now_ms=101)
    assert store.owner(b, now_ms=101) == new_b


# -- lookups and brokers ----------------------------------------------------------------------
def test_lookup_and_lookup_many_agree_and_follow_splits(store) -> None:
    topics = [f"persistent://{NS}/t{i}" for i in range(40)] + [f"{NS}/short"]
    bundle, lease = store.lookup(topics[0], now_ms=0)
    assert lease is None
    assert bundle == store.get_namespace(NS).find_bundle(topics[0]).name
    held = store.acquire(bundle, "b3", now_ms=0, ttl_ms=TTL)
    assert store.lookup(topics[0], now_ms=1) == (bundle, held)
    assert store.lookup_many(topics, now_ms=1) == [store.lookup(t, now_ms=1) for t in topics]
    store.split_bundle(bundle, [parse_bundle(bundle).lower + 0x1000])
    answers = store.lookup_many(topics, now_ms=2)
    assert answers == [store.lookup(t, now_ms=2) for t in topics]
    assert bundle not in {b for b, _ in answers}, "lookups see the split at once"
    assert store.lookup_many([], now_ms=2) == []
    with pytest.raises(InvalidInput, match="unknown namespace"):
        store.lookup("persistent://nope/ns/t", now_ms=1)
    with pytest.raises(InvalidInput, match="unknown namespace"):
        store.lookup_many([topics[0], "persistent://nope/ns/t"], now_ms=1)


def test_broker_registry_is_judged_against_now(make_store) -> None:
    s = make_store()
    assert s.live_brokers(now_ms=0) == []
    s.register_broker("zeta", now_ms=0, ttl_ms=100, info={"webServiceUrl": "http://z"})
    s.register_broker("alpha", now_ms=0, ttl_ms=50)
    assert s.live_brokers(now_ms=49) == ["alpha", "zeta"]
    assert s.live_brokers(now_ms=50) == ["zeta"]
    s.heartbeat("alpha", now_ms=60, ttl_ms=100)
    assert s.live_brokers(now_ms=100) == ["alpha"]
    assert s.live_brokers(now_ms=160) == []


# -- races and differential replay ------------------------------------------------------------
def _random_op(s: OwnershipStore, rng: random.Random, me: str, held: dict, now: int) -> object:
    """One random store call; returns its answer or the class name of what it raised."""
    brokers = ["b0", "b1", "b2", "b3"]
    nb = s.get_namespace(NS)
    bundle = rng.choice(nb.bundle_names)
    op = rng.random()
    try:
        if op < 0.3:
            lease = s.acquire(bundle, me, now, ttl_ms=rng.choice([50, 400]))
            held[bundle] = lease.token
            return lease
        if op < 0.45:
            ok = s.renew_all(me, held, now, ttl_ms=400)
            for b, fine in ok.items():
                if not fine:
                    held.pop(b)
            return ok
        if op < 0.55 and held:
            b, t = rng.choice(sorted(held.items()))
            held.pop(b)
            return s.release(b, me, t, now)
        if op < 0.65 and held:
            b, t = rng.choice(sorted(held.items()))
            held.pop(b)
            return s.transfer(b, me, t, rng.choice([x for x in brokers if x != me]), now, 400)
        if op < 0.75:
            r = nb.find_bundle_by_hash(rng.randrange(FULL_UPPER))
            if r.can_split():
                return s.split_bundle(r.name, [r.lower + (r.upper - r.lower) // 2])
            return None
        if op < 0.83 and len(nb) > 2:
            i = rng.randrange(len(nb) - 1)
            return s.merge_bundles(nb.bundle_names[i], nb.bundle_names[i + 1])
        if op < 0.9:
            return s.sweep_expired(now)
        topics = [f"{NS}/t{rng.randrange(1000)}" for _ in range(5)]
        return s.lookup_many(topics, now)
    except (Conflict, InvalidInput) as e:
        return type(e).__name__


@pytest.fixture(params=["redis", "memory"])
def make_clocked_store(request: pytest.FixtureRequest) -> tuple[StoreFactory, HistoryRecorder]:
    """Handles on one empty store that judges leases by its own clock (Redis ``TIME``, or a
    counter read under the MemoryStore's lock), all reporting to one history recorder."""
    recorder = HistoryRecorder()
    if request.param == "redis":
        import redis

        request.getfixturevalue("fresh_redis")
        url = request.getfixturevalue("redis_url")
        return (
            lambda: RedisStore(
                redis.Redis.from_url(url), prefix="contract", clock="server", recorder=recorder
            ),
            recorder,
        )
    ticks = iter(range(1, 10**9))
    shared = MemoryStore(clock=lambda: next(ticks) * 3, recorder=recorder)
    return (lambda: shared), recorder


def test_racing_threads_never_double_own_reuse_a_token_or_break_the_ring(
    make_clocked_store: tuple[StoreFactory, HistoryRecorder],
) -> None:
    """Five threads call the store at random; the history every handle recorded (what the
    store's atomic steps granted and ended) must pass the independent checker, by hash interval.
    """
    make_store, recorder = make_clocked_store
    setup = make_store()
    setup.create_namespace(NS, 8)
    for b in ("b0", "b1", "b2", "b3"):
        setup.register_broker(b, now_ms=0, ttl_ms=FOREVER)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        s = make_store()
        me, held = f"b{seed % 4}", {}
        try:
            for _ in range(150):
                _random_op(s, rng, me, held, 0)
        except BaseException as e:  # surfaced in the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    history = recorder.snapshot()
    violations = check_history(history)
    assert violations == [], [v.message for v in violations[:5]]
    kinds = {getattr(e, "kind", "version") for e in history}
    assert {"acquire", "renew", "transfer", "split"} <= kinds, kinds
    grants = [e for e in history if isinstance(e, Claim) and e.kind != "renew"]
    assert len(grants) > 20 and len({g.token for g in grants}) == len(grants)
    check_boundaries(setup.get_namespace(NS).boundaries)


def test_redis_and_memory_give_identical_answers_to_the_same_operations(
    fresh_redis, redis_url: str
) -> None:
    import redis

    stores: list[OwnershipStore] = [
        RedisStore(redis.Redis.from_url(redis_url), prefix="diff"),
        MemoryStore(),
    ]
    transcripts: list[list[object]] = []
    for s in stores:
        s.create_namespace(NS, 4)
        for i, b in enumerate(("b0", "b1", "b2", "b3")):
            s.register_broker(b, now_ms=0, ttl_ms=FOREVER if i < 3 else 2_000)
        rng = random.Random(42)
        held: dict[str, dict[str, int]] = {b: {} for b in ("b0", "b1", "b2", "b3")}
        out: list[object] = []
        for step in range(600):
            me = rng.choice(sorted(held))
            out.append(_random_op(s, rng, me, held[me], now=step * 10))
        out.append(s.get_namespace(NS))
        out.append(s.owners(NS, now_ms=6_000))
        transcripts.append(out)
    redis_out, memory_out = transcripts
    for i, (x, y) in enumerate(zip(redis_out, memory_out, strict=True)):
        assert x == y, f"step {i}: redis {x!r} != memory {y!r}"
    kinds = {x if isinstance(x, str) else type(x).__name__ for x in redis_out}
    assert {"Lease", "NamespaceBundles", "Conflict", "dict", "list"} <= kinds, kinds


def test_outcome_log_first_real_outcome_wins_but_applied_replaces_already_satisfied(
    store,
) -> None:
    """Both outcome logs keep one rule: the first real outcome of an id takes the hash, a later
    one is streamed as a conflict naming it; except that ``applied`` replaces a racing
    ``already_satisfied`` (its stream entry names what it replaced)."""
    from loadbalance.decisions import TRANSFER, UNLOAD, make_decision

    log = store.outcomes
    move = make_decision(cycle="c", kind=TRANSFER, bundle=_names(store)[0], source_broker="b1",
                         destination_broker="b2")  # fmt: skip
    assert log.record(move, "dry_run", "", 1) == ""
    assert log.record(move, "already_satisfied", "", 2) == ""
    assert log.record(move, "applied", "", 3) == ""
    assert log.get(move.id)["outcome"] == "applied"
    assert log.record(move, "already_satisfied", "", 4) == "applied"
    assert log.record(move, "applied", "", 5) == "applied"  # a second applied does not replace
    unload = make_decision(cycle="c", kind=UNLOAD, bundle=_names(store)[1], source_broker="b1")
    assert log.record(unload, "rejected", "owner changed", 6) == ""
    assert log.record(unload, "applied", "", 7) == "rejected"  # only already_satisfied yields
    assert log.get(unload.id)["outcome"] == "rejected"
    tail = log.tail(10)[::-1]  # oldest first
    got = [(e["id"] == move.id, e["outcome"], e.get("race")) for e in tail]
    assert got == [
        (True, "dry_run", None),
        (True, "already_satisfied", None),
        (True, "applied", "already_satisfied"),
        (True, "conflict", "applied"),
        (True, "conflict", "applied"),
        (False, "rejected", None),
        (False, "conflict", "rejected"),
    ]
