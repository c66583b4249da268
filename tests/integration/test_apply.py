"""Applying decisions to real Redis: each kind, idempotency, stale decisions, replay; and the
same applier over ``MemoryStore`` (the fast simulator's store) giving the same outcomes."""

from __future__ import annotations

import pytest
import redis

from controller.apply import (
    ALREADY_SATISFIED,
    APPLIED,
    DRY_RUN,
    DUPLICATE,
    REJECTED,
    apply_decision,
    outcome_of,
)
from loadbalance.decisions import MERGE, SPLIT, TRANSFER, UNLOAD, make_decision
from metadata_store.ownership_memory import MemoryStore
from metadata_store.ownership_redis import RedisStore
from metadata_store.protocol import DecisionStore

NS = "acme/pay"
TTL = 30_000


@pytest.fixture
def store(fresh_redis: redis.Redis) -> RedisStore:
    return _seed(RedisStore(fresh_redis, prefix="a"))


def _seed(s: DecisionStore) -> DecisionStore:
    s.create_namespace(NS, 4)
    for b in ("b1", "b2"):
        s.register_broker(b, now_ms=0, ttl_ms=10**9)
    for i, name in enumerate(s.get_namespace(NS).bundle_names):
        s.acquire(name, "b1" if i < 3 else "b2", now_ms=0, ttl_ms=10**9)
    return s


def _state(s: DecisionStore) -> tuple:
    nb = s.get_namespace(NS)
    return nb.boundaries, nb.version, {b: x.broker for b, x in s.owners(NS, now_ms=50).items()}


def _dump(client: redis.Redis) -> dict:
    out = {}
    for key in sorted(client.scan_iter(match="a:*")):
        if b"outcome" in key:
            continue
        t = client.type(key)
        if t == b"hash":
            out[key] = client.hgetall(key)
        elif t == b"set":
            out[key] = client.smembers(key)
        else:
            out[key] = client.get(key)
    return out


def _b(store: RedisStore, i: int) -> str:
    return store.get_namespace(NS).bundle_names[i]


def test_transfer_then_same_decision_again_changes_nothing(store, fresh_redis) -> None:
    d = make_decision(cycle="1", kind=TRANSFER, bundle=_b(store, 0), source_broker="b1",
                      destination_broker="b2", reason="Overloaded")  # fmt: skip
    assert apply_decision(store, d, now_ms=10, lease_ttl_ms=TTL).outcome == APPLIED
    assert store.owner(d.bundle, now_ms=11).broker == "b2"
    before = _dump(fresh_redis)
    again = apply_decision(store, d, now_ms=12, lease_ttl_ms=TTL)
    assert again.outcome == DUPLICATE
    assert _dump(fresh_redis) == before
    assert outcome_of(store, d.id).outcome == APPLIED


def test_unload_split_and_merge_and_their_already_satisfied_forms(store) -> None:
    b0 = _b(store, 0)
    unload = make_decision(cycle="1", kind=UNLOAD, bundle=b0, source_broker="b1")
    assert apply_decision(store, unload, now_ms=1, lease_ttl_ms=TTL).outcome == APPLIED
    assert store.owner(b0, now_ms=2) is None
    unload2 = make_decision(cycle="2", kind=UNLOAD, bundle=b0, source_broker="b1")
    assert apply_decision(store, unload2, now_ms=2, lease_ttl_ms=TTL).outcome == ALREADY_SATISFIED
    split = make_decision(cycle="3", kind=SPLIT, bundle=b0, source_broker="b1",
                          split_boundaries=(0x20000000,))  # fmt: skip
    assert apply_decision(store, split, now_ms=3, lease_ttl_ms=TTL).outcome == APPLIED
    assert len(store.get_namespace(NS)) == 5
    split_again = make_decision(cycle="4", kind=SPLIT, bundle=b0, source_broker="b1",
                                split_boundaries=(0x20000000,))  # fmt: skip
    res = apply_decision(store, split_again, now_ms=4, lease_ttl_ms=TTL)
    assert res.outcome == ALREADY_SATISFIED
    left, right = _b(store, 0), _b(store, 1)
    merge = make_decision(cycle="5", kind=MERGE, bundle=left, merge_bundle=right,
                          source_broker=None)  # fmt: skip
    assert apply_decision(store, merge, now_ms=5, lease_ttl_ms=TTL).outcome == APPLIED
    assert len(store.get_namespace(NS)) == 4


def test_stale_decisions_are_rejected_with_a_reason(store) -> None:
    b3 = _b(store, 3)  # owned by b2
    wrong_owner = make_decision(cycle="1", kind=UNLOAD, bundle=b3, source_broker="b1")
    res = apply_decision(store, wrong_owner, now_ms=1, lease_ttl_ms=TTL)
    assert res.outcome == REJECTED and "owner changed" in res.reason
    ghost = make_decision(cycle="1", kind=TRANSFER, bundle=b3, source_broker="b2",
                          destination_broker="ghost")  # fmt: skip
    res = apply_decision(store, ghost, now_ms=1, lease_ttl_ms=TTL)
    assert res.outcome == REJECTED and "broker gone" in res.reason
    store.split_bundle(b3, [0xE0000000])
    gone = make_decision(cycle="2", kind=TRANSFER, bundle=b3, source_broker="b2",
                         destination_broker="b1")  # fmt: skip
    res = apply_decision(store, gone, now_ms=2, lease_ttl_ms=TTL)
    assert res.outcome == REJECTED and "bundle gone" in res.reason


def test_dry_run_records_without_changing_ownership(store, fresh_redis) -> None:
    d = make_decision(cycle="1", kind=TRANSFER, bundle=_b(store, 1), source_broker="b1",
                      destination_broker="b2")  # fmt: skip
    before = _dump(fresh_redis)
    res = apply_decision(store, d, now_ms=1, lease_ttl_ms=TTL, dry_run=True)
    assert res.outcome == DRY_RUN and "would move" in res.reason
    assert _dump(fresh_redis) == before
    assert apply_decision(store, d, now_ms=2, lease_ttl_ms=TTL).outcome == APPLIED


def test_replaying_a_decision_stream_twice_gives_the_same_state(store, fresh_redis) -> None:
    b = [_b(store, i) for i in range(4)]
    stream = [
        make_decision(cycle="1", kind=TRANSFER, bundle=b[0], source_broker="b1",
                      destination_broker="b2"),
        make_decision(cycle="1", kind=SPLIT, bundle=b[1], source_broker="b1",
                      split_boundaries=(0x60000000,)),
        make_decision(cycle="2", kind=UNLOAD, bundle=b[3], source_broker="b2"),
        make_decision(cycle="2", kind=TRANSFER, bundle=b[2], source_broker="b1",
                      destination_broker="b2"),
        make_decision(cycle="3", kind=TRANSFER, bundle=b[0], source_broker="b2",
                      destination_broker="b1"),
    ]  # fmt: skip
    for i, d in enumerate(stream):
        apply_decision(store, d, now_ms=10 + i, lease_ttl_ms=10**9)
    once = _dump(fresh_redis)
    for i, d in enumerate(stream):
        assert apply_decision(store, d, now_ms=20 + i, lease_ttl_ms=10**9).outcome == DUPLICATE
    assert _dump(fresh_redis) == once


def test_memory_store_gives_the_same_outcomes_and_ownership_as_redis(store) -> None:
    """The fast simulator applies with this applier over ``MemoryStore``: every outcome, reason
    and the resulting ownership must be the product's, including a merge of differently owned
    bundles (rejected), the merged bundle starting unowned, replays and a dry run."""
    memory = _seed(MemoryStore())
    b = [_b(store, i) for i in range(4)]
    merged = f"{NS}/0x00000000_0x80000000"
    stream = [
        make_decision(cycle="1", kind=MERGE, bundle=b[2], merge_bundle=b[3], source_broker=None),
        make_decision(cycle="1", kind=MERGE, bundle=b[0], merge_bundle=b[1], source_broker=None),
        make_decision(cycle="2", kind=TRANSFER, bundle=merged, source_broker="b1",
                      destination_broker="b2"),
        make_decision(cycle="2", kind=TRANSFER, bundle=b[2], source_broker="b1",
                      destination_broker="b2"),
        make_decision(cycle="3", kind=SPLIT, bundle=b[3], source_broker="b2",
                      split_boundaries=(0xE0000000,)),
        make_decision(cycle="3", kind=UNLOAD, bundle=b[2], source_broker="b1"),
        make_decision(cycle="4", kind=MERGE, bundle=b[0], merge_bundle=b[1], source_broker=None),
    ]  # fmt: skip
    runs = []
    for s in (store, memory):
        dry = apply_decision(s, stream[3], now_ms=9, lease_ttl_ms=TTL, dry_run=True)
        got = [(dry.outcome, dry.reason)]
        for i, d in enumerate([*stream, *stream[:3]]):
            res = apply_decision(s, d, now_ms=10 + i, lease_ttl_ms=TTL)
            got.append((res.outcome, res.reason))
            if i == 1:
                got.append(("merged owner", s.owner(merged, now_ms=10 + i)))
        runs.append((got, _state(s), [outcome_of(s, d.id) for d in stream]))
    assert runs[0] == runs[1]
    outcomes = [o for o, _ in runs[1][0]]
    assert outcomes == [DRY_RUN, REJECTED, APPLIED, "merged owner", APPLIED, APPLIED, APPLIED,
                        REJECTED, ALREADY_SATISFIED, DUPLICATE, DUPLICATE, DUPLICATE]  # fmt: skip
    assert runs[1][0][3] == ("merged owner", None), "a merged bundle starts unowned"
    assert runs[1][1][2][merged] == "b2", "a transfer of an unowned bundle acquires it"
