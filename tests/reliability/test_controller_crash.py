"""The controller (``lbctl control``, a real process) dies in the middle of applying decisions.

Each run is killed at a named fault point (``LBCTL_FAULT_POINT``, see
``controller.apply.fault_point``): after a split's Redis script but before its outcome, after a
transfer's script, and after an outcome is recorded but before the Kafka offset is committed.
After every death the store must still satisfy the invariants (ring covered, one owner per
bundle, tokens under the fence), and the restarted controller must finish every interrupted
decision with exactly one recorded outcome.
"""

from __future__ import annotations

import time
import uuid

import pytest
import redis
from confluent_kafka import Producer

from controller.apply import outcome_of
from loadbalance.decisions import (
    MERGE,
    SPLIT,
    TRANSFER,
    UNLOAD,
    encode_decision,
    make_decision,
)
from metadata_store.ownership_redis import RedisStore
from tests.reliability.invariants import check_invariants, lbctl, set_args, stop, wait_for

pytestmark = pytest.mark.integration

NS = "acme/crash"
HOUR_MS = 3_600_000


def _now_ms() -> int:
    return int(time.time() * 1000)


def _stream_ids(r: redis.Redis, prefix: str) -> list[tuple[str, str]]:
    return [
        (f[b"id"].decode(), f[b"outcome"].decode()) for _, f in r.xrange(f"{prefix}:outcome-stream")
    ]


def test_controller_killed_mid_split_mid_transfer_and_before_commit_recovers_exactly(
    kafka_bootstrap, redis_url, fresh_redis, unique_topic, tmp_path
):
    prefix = f"crash{uuid.uuid4().hex[:6]}"
    store = RedisStore(fresh_redis, prefix)
    store.create_namespace(NS, 4)
    now = _now_ms()
    for b in ("b1", "b2", "b3"):
        store.register_broker(b, now, HOUR_MS)
    names = store.get_namespace(NS).bundle_names
    for name in names:
        store.acquire(name, "b1", now, HOUR_MS)
    tokens_before = {n: store.owner(n, now).token for n in names}
    mid = 0x20000000
    split = make_decision(cycle="c1", kind=SPLIT, bundle=names[0], source_broker="b1",
                          split_boundaries=(mid,), reason="MsgRate")  # fmt: skip
    move = make_decision(cycle="c1", kind=TRANSFER, bundle=names[1], source_broker="b1",
                         destination_broker="b2", reason="Overloaded")  # fmt: skip
    unload = make_decision(cycle="c1", kind=UNLOAD, bundle=names[2], source_broker="b1")
    move2 = make_decision(cycle="c1", kind=TRANSFER, bundle=names[3], source_broker="b1",
                          destination_broker="b3", reason="Overloaded")  # fmt: skip
    decisions_topic, events_topic = unique_topic(1, "decisions"), unique_topic(1, "events")
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    for d in (split, move, unload, move2):
        p.produce(decisions_topic, key=d.bundle.encode(), value=encode_decision(d))
    assert p.flush(10) == 0
    argv = ["control", "--redis-url", redis_url, "--bootstrap-servers", kafka_bootstrap,
            "--group", "ctl-crash", *set_args({
                "redisKeyPrefix": prefix, "decisionsTopic": decisions_topic,
                "ownershipEventsTopic": events_topic,
                "loadBalancerOwnershipLeaseTtlSeconds": 3600})]  # fmt: skip
    log = tmp_path / "control.log"

    def run_until_fault(point: str) -> None:
        started = time.monotonic()
        proc = lbctl(argv, log, env={"LBCTL_FAULT_POINT": point})
        try:
            assert proc.wait(90) == 137, f"no death at {point}: see {log}"
        finally:
            stop(proc)
        print(f"figure: start to death at {point} {time.monotonic() - started:.1f} s")

    # 1. killed after the split's Redis script, before its outcome
    run_until_fault("after-split-script")
    s = check_invariants(fresh_redis, prefix, _now_ms())
    assert mid in s.boundaries[NS], "the split itself was made"
    assert outcome_of(store, split.id) is None, "but its outcome was not recorded"

    # 2. the restart finishes the split (already satisfied), then dies mid-transfer
    run_until_fault("after-transfer-script")
    s = check_invariants(fresh_redis, prefix, _now_ms())
    assert outcome_of(store, split.id).outcome == "already_satisfied"
    assert s.live_owner(names[1], _now_ms()) == "b2"
    assert outcome_of(store, move.id) is None

    # 3. the next one records the transfer's outcome and dies before committing the offset
    run_until_fault("after-outcome")
    assert outcome_of(store, move.id).outcome == "already_satisfied"

    # 4. a clean run: the transfer's record comes again (a duplicate), the rest is applied
    proc = lbctl(argv, log)
    try:
        wait_for(
            "the last two outcomes",
            lambda: outcome_of(store, unload.id) and outcome_of(store, move2.id),
            timeout_s=90,
        )
        wait_for(
            "the duplicate entry",
            lambda: (move.id, "duplicate") in _stream_ids(fresh_redis, prefix),
            timeout_s=30,
        )
    finally:
        assert stop(proc) == 0, f"see {log}"

    now = _now_ms()
    s = check_invariants(fresh_redis, prefix, now)
    assert outcome_of(store, unload.id).outcome == "applied"
    assert outcome_of(store, move2.id).outcome == "applied"
    assert s.live_owner(names[2], now) is None
    assert s.live_owner(names[3], now) == "b3"
    assert s.live_owner(names[1], now) == "b2"
    assert s.leases[names[1]][1] > tokens_before[names[1]], "a transfer takes a newer token"
    assert s.leases[names[3]][1] > tokens_before[names[3]]
    # every decision has exactly one outcome in the hash; the stream shows what happened
    outcomes = fresh_redis.hgetall(f"{prefix}:outcomes")
    assert {k.decode() for k in outcomes} == {split.id, move.id, unload.id, move2.id}
    entries = _stream_ids(fresh_redis, prefix)
    assert entries == [
        (split.id, "already_satisfied"),
        (move.id, "already_satisfied"),
        (move.id, "duplicate"),
        (unload.id, "applied"),
        (move2.id, "applied"),
    ]


class _Killed(BaseException):
    """Stands for the process dying at a fault point (the subprocess test above does it for
    real with ``os._exit``; here every decision kind is covered in-process, fast)."""


@pytest.mark.parametrize("kind", [SPLIT, MERGE, UNLOAD, TRANSFER])
def test_every_kind_interrupted_between_its_redis_script_and_its_outcome_ends_satisfied(
    fresh_redis, monkeypatch, kind
):
    import controller.apply as apply_mod

    store = RedisStore(fresh_redis, "kinds")
    store.create_namespace(NS, 4)
    for b in ("b1", "b2"):
        store.register_broker(b, 0, HOUR_MS)
    names = store.get_namespace(NS).bundle_names
    for n in names:
        store.acquire(n, "b1", 0, HOUR_MS)
    d = {
        SPLIT: make_decision(cycle="k", kind=SPLIT, bundle=names[0], source_broker="b1",
                             split_boundaries=(0x10000000,)),
        MERGE: make_decision(cycle="k", kind=MERGE, bundle=names[0], source_broker="b1",
                             merge_bundle=names[1]),
        UNLOAD: make_decision(cycle="k", kind=UNLOAD, bundle=names[0], source_broker="b1"),
        TRANSFER: make_decision(cycle="k", kind=TRANSFER, bundle=names[0], source_broker="b1",
                                destination_broker="b2"),
    }[kind]  # fmt: skip
    old_token = store.owner(names[0], 1).token

    def die_at(point: str) -> None:
        if point == f"after-{kind}-script":
            raise _Killed(point)

    monkeypatch.setattr(apply_mod, "fault_point", die_at)
    with pytest.raises(_Killed):
        apply_mod.apply_decision(store, d, now_ms=1, lease_ttl_ms=HOUR_MS)
    monkeypatch.undo()
    s = check_invariants(fresh_redis, "kinds", 2)
    assert outcome_of(store, d.id) is None, "died before the outcome"
    replay = apply_mod.apply_decision(store, d, now_ms=2, lease_ttl_ms=HOUR_MS)
    assert replay.outcome == "already_satisfied", replay
    assert check_invariants(fresh_redis, "kinds", 3).leases == s.leases, (
        "the replay changed nothing"
    )
    if kind == TRANSFER:
        assert s.leases[names[0]][0] == "b2" and s.leases[names[0]][1] > old_token
