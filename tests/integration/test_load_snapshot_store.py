"""The load snapshot in Redis (``metadata_store.load_snapshot.LoadSnapshot``): the streaming
job's commit writes the format version with the data, and a reader refuses a version it does
not know instead of misreading it."""

from __future__ import annotations

import json

import pytest

from loadbalance.bundles import NamespaceBundles
from loadbalance.errors import InvalidInput
from metadata_store.keys import Keys
from metadata_store.load_snapshot import LOAD_SNAPSHOT_VERSION, LoadSnapshot, shards_from_docs
from metadata_store.progress import Progress, RedisProgress

NAMES = NamespaceBundles.initial("t/ns", 4).bundle_names
DOCS = {n: {"shortTerm": {"msgRateIn": 1.5, "numSamples": 2}, "broker": "b1:8080"} for n in NAMES}
BROKER = {"report": {"bundles": NAMES, "lastUpdate": 5}, "historyUsage": 0.25}


def test_the_commit_writes_the_version_and_readers_get_the_view(fresh_redis):
    progress = RedisProgress(fresh_redis, "p")
    progress.commit(Progress(3, 5), {"b1:8080": json.dumps(BROKER)}, [], shards_from_docs(DOCS), [])
    assert fresh_redis.get(Keys("p").load_version()) == str(LOAD_SNAPSHOT_VERSION).encode()
    data = LoadSnapshot(fresh_redis, "p").read()
    assert data.owners() == dict.fromkeys(NAMES, "b1:8080")
    snap = data.snapshot(10)
    assert snap is not None and set(snap.view.bundle_data) == set(NAMES)
    assert snap.view.bundle(NAMES[0]).short_term.msg_rate_in == 1.5
    brokers, shards = progress.read_snapshot()
    assert json.loads(brokers["b1:8080"]) == BROKER and set(shards) == set(shards_from_docs(DOCS))


def test_an_unknown_version_is_refused(fresh_redis):
    store = LoadSnapshot(fresh_redis, "p")
    store.replace({"b1:8080": json.dumps(BROKER)}, shards_from_docs(DOCS))
    assert store.version() == LOAD_SNAPSHOT_VERSION
    fresh_redis.set(Keys("p").load_version(), "3")
    with pytest.raises(InvalidInput, match="version '3'; this reader knows only 1 and 2"):
        store.read()
    with pytest.raises(InvalidInput, match="version '3'"):
        store.broker_docs_raw()
    fresh_redis.set(Keys("p").load_version(), "1")  # version 1: the same without deltas
    assert store.version() == 1 and set(store.read().owners()) == set(NAMES)


def test_a_snapshot_without_the_version_key_reads_as_version_1(fresh_redis):
    fresh_redis.hset(Keys("p").load_shards(), mapping=shards_from_docs(DOCS))
    assert set(LoadSnapshot(fresh_redis, "p").read().owners()) == set(NAMES)


def test_the_cycle_state_is_written_out_once_per_state_and_read_back_as_committed(fresh_redis):
    """Every batch commits the ``CycleState``, which changes only when a cycle runs: the same
    state object is dumped once and its text reused, a new state (even an equal one) is dumped
    again, and what Redis holds after each commit reads back as that commit's state."""
    from types import MappingProxyType

    from loadbalance.cycle import CycleState
    from metadata_store.cycle_state import CycleStateJson

    dumps = []

    class Counting(CycleStateJson):
        def dump(self, state):
            dumps.append(state)
            return super().dump(state)

    progress = RedisProgress(fresh_redis, "p", codec=Counting())
    first = CycleState(last_shedding_ms=5, recently_unloaded=MappingProxyType({"t/ns/b": 5}))
    for batch in (1, 2, 3):
        progress.commit(Progress(batch, batch * 1000, first), {}, [], {}, [])
    assert len(dumps) == 1 and progress.read() == Progress(3, 3000, first)
    second = CycleState(last_shedding_ms=9, recently_unloaded=MappingProxyType({"t/ns/c": 9}))
    progress.commit_cycle(Progress(4, 4000, second))
    assert progress.read() == Progress(4, 4000, second)
    equal = CycleState(last_shedding_ms=9, recently_unloaded=MappingProxyType({"t/ns/c": 9}))
    progress.commit(Progress(5, 5000, equal), {}, [], {}, [])
    assert progress.read() == Progress(5, 5000, second)
