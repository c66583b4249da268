"""The fault tests' store checker (``tests.reliability.invariants``) on a real Redis.

Why: every fault test and the chaos soak trust this checker's verdict, so it must both catch a
store whose owned sets disagree with its leases and never report one that was consistent at
every instant. The second half matters because the checks run beside live writers (a
controller's sweep places expired bundles again until the brokers' registrations lapse): a
reader that takes the leases and the owned sets in two reads sees a lease moved between them
as a broken store.
"""

from __future__ import annotations

import threading
import uuid

import pytest
import redis

from metadata_store.keys import Keys
from metadata_store.ownership_redis import RedisStore
from tests.reliability.invariants import check_invariants, read_state

pytestmark = pytest.mark.integration

TTL_MS = 60_000


def _store(r: redis.Redis) -> tuple[RedisStore, str]:
    prefix = f"inv{uuid.uuid4().hex[:6]}"
    store = RedisStore(r, prefix)
    store.create_namespace("public/a", 4)
    for b in ("b0", "b1"):
        store.register_broker(b, 0, TTL_MS)
    return store, prefix


def test_a_consistent_store_passes_and_its_state_is_read_whole(fresh_redis):
    store, prefix = _store(fresh_redis)
    bundles = [b.name for b in store.get_namespace("public/a").bundles]
    for i, b in enumerate(bundles):
        store.acquire(b, f"b{i % 2}", 0, TTL_MS)
    s = check_invariants(fresh_redis, prefix, 0)
    assert sorted(s.leases) == sorted(bundles)
    assert s.owned == {"b0": set(bundles[0::2]), "b1": set(bundles[1::2])}
    assert s.fence == len(bundles)
    assert s.bundles("public/a") == bundles


def test_an_owned_entry_without_its_lease_is_caught(fresh_redis):
    store, prefix = _store(fresh_redis)
    bundle = store.get_namespace("public/a").bundles[0].name
    store.acquire(bundle, "b0", 0, TTL_MS)
    fresh_redis.delete(Keys(prefix).lease(bundle))
    with pytest.raises(AssertionError, match=r"b0 lists .* as owned but the lease says None"):
        check_invariants(fresh_redis, prefix, 0)


def test_a_lease_missing_from_its_owners_set_is_caught(fresh_redis):
    store, prefix = _store(fresh_redis)
    bundle = store.get_namespace("public/a").bundles[0].name
    store.acquire(bundle, "b0", 0, TTL_MS)
    fresh_redis.srem(Keys(prefix).owned("b0"), bundle)
    with pytest.raises(AssertionError, match="b0 not in its owned set"):
        check_invariants(fresh_redis, prefix, 0)


def test_leases_moving_while_the_checker_reads_are_never_reported(fresh_redis):
    """A writer moves leases back and forth (each move one atomic script) while the checker
    reads: every read must be one instant of the store."""
    store, prefix = _store(fresh_redis)
    bundles = [b.name for b in store.get_namespace("public/a").bundles]
    for b in bundles:
        store.acquire(b, "b0", 0, TTL_MS)
    done = threading.Event()
    moves = 0

    def mover() -> None:
        nonlocal moves
        owner = dict.fromkeys(bundles, "b0")
        while not done.is_set():
            for b in bundles:
                lease = store.owner(b, 0)
                dest = "b1" if owner[b] == "b0" else "b0"
                store.transfer(b, owner[b], lease.token, dest, 0, TTL_MS)
                owner[b] = dest
                moves += 1

    thread = threading.Thread(target=mover, daemon=True)
    thread.start()
    try:
        for _ in range(300):
            s = read_state(fresh_redis, prefix)
            check_invariants(fresh_redis, prefix, 0)
            assert sum(len(v) for v in s.owned.values()) == len(bundles)
    finally:
        done.set()
        thread.join(10)
    assert moves > 100, "the writer barely ran: the test proved nothing"
