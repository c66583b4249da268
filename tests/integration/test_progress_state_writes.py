"""A batch without a policy cycle does not write the cycle state again.

Every batch commits its progress; only a cycle changes the ``CycleState``. After a cycle that
moved 16k bundles at a million bundles its text is 3-7 MB, and writing it on every batch cost
35-45 ms of ``HSET`` and as much of Redis's CPU for nothing. What must hold: the state reads back
as the last one committed, whichever commit wrote it, and a commit that carries the state Redis
already holds sends far fewer bytes than that state's text.
"""

from __future__ import annotations

from types import MappingProxyType

import redis

from loadbalance.cycle import CycleState
from metadata_store.progress import Progress, RedisProgress


def _big_state(n: int) -> CycleState:
    names = {f"t/ns{i}/0x00000000_0xffffffff": 1_000 + i for i in range(n)}
    return CycleState(last_shedding_ms=1, recently_unloaded=MappingProxyType(names))


def _sent(r: redis.Redis) -> int:
    return int(r.info("stats")["total_net_input_bytes"])


def test_a_commit_sends_the_state_only_when_it_changed(fresh_redis: redis.Redis) -> None:
    store = RedisProgress(fresh_redis, "p")
    state = _big_state(20_000)
    store.commit_cycle(Progress(1, 1_000, state))
    size = len(fresh_redis.hget("p:stream:progress", "cycle_state"))
    assert size > 500_000

    before = _sent(fresh_redis)
    store.commit(Progress(2, 2_000, state), {}, (), {}, ())  # a batch without a cycle
    assert _sent(fresh_redis) - before < size // 100
    assert store.read() == Progress(2, 2_000, state)

    other = _big_state(3)
    store.commit(Progress(3, 3_000, other), {}, (), {}, ())  # a state it does not hold yet
    assert RedisProgress(fresh_redis, "p").read() == Progress(3, 3_000, other)


def test_a_store_that_did_not_write_the_state_writes_it(fresh_redis: redis.Redis) -> None:
    """Another instance (a job that took the decider lease over) wrote its own state; this one
    read nothing yet, so its first commit writes the state it carries."""
    mine, theirs = _big_state(2), _big_state(5)
    RedisProgress(fresh_redis, "p").commit_cycle(Progress(1, 1_000, theirs))
    store = RedisProgress(fresh_redis, "p")
    store.commit(Progress(2, 2_000, mine), {}, (), {}, ())
    assert RedisProgress(fresh_redis, "p").read().cycle_state == mine
    store.forget()
    store.commit(Progress(1, 500, mine), {}, (), {}, ())
    assert RedisProgress(fresh_redis, "p").read().cycle_state == mine
