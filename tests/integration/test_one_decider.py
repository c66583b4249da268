"""One decider at a time: the decider lease and its term, against a real Redis.

What is pinned: racing deciders get one term; expiry hands the lease over and the old holder
cannot renew; a restarted decider decides under a higher term; a controller refuses and records
a decision of an older term than the newest it knows (shared by every controller through
Redis); a decision stage that lost the lease publishes nothing and says so once; and
``lbctl brokers leader-broker`` shows the decider and the controllers. The regression "a second
decider cannot get a decision applied" is ``test_second_decider.py``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import pytest
import redis

from controller.apply import APPLIED, DUPLICATE, REJECTED
from controller.reconciler import Reconciler
from lbctl.main import main
from metadata_store.decider_lease import DeciderLease
from metadata_store.ownership_redis import RedisStore
from metadata_store.progress import RedisProgress
from tests.integration.test_second_decider import (
    PREFIX,
    _Batch,
    _Captured,
    _move,
    _pending_cycle,
    _published,
    _stage,
    _store,
    capture,
)


@pytest.fixture
def captured(monkeypatch: Any) -> type[_Captured]:
    return capture(monkeypatch)


# -- the lease ----------------------------------------------------------------------------------
def test_racing_deciders_get_one_term(redis_url: str, fresh_redis: redis.Redis) -> None:
    leases = [DeciderLease(redis.Redis.from_url(redis_url), PREFIX) for _ in range(6)]
    start = threading.Barrier(len(leases))
    got: list[Any] = [None] * len(leases)

    def race(i: int) -> None:
        start.wait()
        got[i] = leases[i].hold(f"host-{i}:{100 + i}:r{i}", 10_000, batch=1)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(leases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [g for g in got if g.held]
    assert len(winners) == 1 and winners[0].acquired and winners[0].term == 1
    assert {g.term for g in got} == {1}  # the losers saw the winner's term, none made its own
    assert {g.holder for g in got if not g.held} == {f"host-{got.index(winners[0])}:"
                                                      f"{100 + got.index(winners[0])}:"
                                                      f"r{got.index(winners[0])}"}  # fmt: skip
    info = leases[0].read()
    assert info is not None and info.term == 1 and info.newest_term == 1 and info.last_batch == 1


def test_expiry_hands_the_lease_over_and_the_old_holder_cannot_renew(
    fresh_redis: redis.Redis,
) -> None:
    lease = DeciderLease(fresh_redis, PREFIX, clock="caller")
    a = lease.hold("a:1:x", 1_000, now_ms=0)
    assert a.held and a.term == 1
    assert lease.hold("a:1:x", 1_000, term=1, now_ms=900).held  # renewed to 1_900
    b = lease.hold("b:2:y", 1_000, now_ms=1_800)
    assert not b.held and b.holder == "a:1:x" and b.term == 1
    # idle past the expiry, nobody took it: the holder keeps its term
    again = lease.hold("a:1:x", 1_000, term=1, now_ms=5_000)
    assert again.held and not again.acquired and again.term == 1
    b = lease.hold("b:2:y", 1_000, now_ms=6_001)
    assert b.held and b.acquired and b.term == 2
    lost = lease.hold("a:1:x", 1_000, term=1, now_ms=6_002)
    assert not lost.held and lost.holder == "b:2:y" and lost.term == 2
    assert lease.admit(1) == 2  # and its decisions are stale now


def test_a_restarted_decider_gets_a_higher_term(fresh_redis: redis.Redis) -> None:
    lease = DeciderLease(fresh_redis, PREFIX, clock="caller")
    old = lease.hold("host:10:aaaa", 15_000, now_ms=0)
    # the restarted process has a new id: it waits for the old lease, then decides above it
    assert not lease.hold("host:11:bbbb", 15_000, now_ms=10_000).held
    new = lease.hold("host:11:bbbb", 15_000, now_ms=15_000)
    assert new.held and new.term == old.term + 1
    # a clean stop releases at once
    assert lease.release("host:11:bbbb", new.term)
    third = lease.hold("host:12:cccc", 15_000, now_ms=15_001)
    assert third.held and third.term == new.term + 1


def test_a_term_a_controller_saw_above_the_counter_is_the_floor_of_the_next(
    fresh_redis: redis.Redis, redis_url: str
) -> None:
    """``seen`` is shared: what one controller admitted, another judges by; the next lease
    starts above it (a Redis that lost its counter does not hand out old terms again)."""
    one = DeciderLease(fresh_redis, PREFIX)
    two = DeciderLease(redis.Redis.from_url(redis_url), PREFIX)
    assert one.admit(0) is None  # no decider ever: an older job's decisions still apply
    assert one.admit(5) is None
    assert two.admit(4) == 5 and two.admit(0) == 5
    assert one.admit(5, record=False) is None
    assert two.hold("x:1:z", 1_000).term == 6


# -- the controller ------------------------------------------------------------------------------
def test_a_decision_of_an_older_term_is_refused_and_recorded(
    fresh_redis: redis.Redis, redis_url: str
) -> None:
    store, bundle = _store(fresh_redis)
    lease = DeciderLease(fresh_redis, PREFIX, clock="caller")
    lease.hold("a:1:x", 1_000, now_ms=0)  # term 1
    lease.hold("b:2:y", 1_000, now_ms=2_000)  # term 2 after the expiry
    rec = Reconciler(store, publish=lambda _e: None, clock=lambda: 3_000)
    # a second controller, on its own connection, judges by the same newest term
    other = Reconciler(RedisStore(redis.Redis.from_url(redis_url), prefix=PREFIX),
                       publish=lambda _e: None, clock=lambda: 3_000)  # fmt: skip

    new = _move(bundle, "b1", "b2", "20", term=2)
    assert rec.reconcile(new).outcome == APPLIED
    stale = _move(bundle, "b2", "b1", "10", term=1)
    refused = other.reconcile(stale)
    assert refused.outcome == REJECTED
    assert refused.reason == "refused: stale decider term 1 < 2"
    assert store.owner(bundle, 3_000).broker == "b2"
    assert store.outcomes.get(stale.id)["outcome"] == REJECTED
    tail = store.outcomes.tail(5)
    assert tail[0]["id"] == stale.id and tail[0]["reason"].startswith("refused: stale")
    # an older job's decision (no term) is term 0: refused too, and recorded once
    old_job = _move(bundle, "b2", "b1", "11")
    assert old_job.term == 0
    assert rec.reconcile(old_job).reason == "refused: stale decider term 0 < 2"
    assert rec.reconcile(old_job).outcome == DUPLICATE  # one outcome per decision
    assert store.owner(bundle, 3_000).broker == "b2"


def test_a_decider_that_lost_the_lease_stops_and_says_so_once(
    fresh_redis: redis.Redis, redis_url: str, monkeypatch: Any, captured: type[_Captured],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    _, bundle = _store(fresh_redis)
    first = _stage(redis_url, "host-a:1:aaaa", loadBalancerDeciderLeaseTtlMs=1_500)
    second = _stage(redis_url, "host-b:2:bbbb", loadBalancerDeciderLeaseTtlMs=1_500)
    _pending_cycle(fresh_redis, 5, monkeypatch, _move(bundle, "b1", "b2", "5"))
    first(_Batch(), 5)
    assert [d.term for d in _published(0)] == [1]
    assert [d.decider for d in _published(0)] == ["host-a:1:aaaa"]

    time.sleep(1.6)  # the first job stalls past its lease: the second takes over
    _pending_cycle(fresh_redis, 6, monkeypatch, _move(bundle, "b2", "b1", "6"))
    second(_Batch(), 6)
    assert [d.term for d in _published(1)] == [2]

    caplog.set_level(logging.WARNING, logger="streaming.decide")
    ran = _pending_cycle(fresh_redis, 7, monkeypatch, _move(bundle, "b1", "b2", "7"))
    for batch in (7, 8, 9):
        first(_Batch(), batch)
    assert _published(2) == [] and ran == []  # not even the cycle ran: it is not its to run
    lines = [r.getMessage() for r in caplog.records if "decider lease held by" in r.getMessage()]
    assert len(lines) == 1 and "host-b:2:bbbb (term 2" in lines[0]
    # the holder stays the second job, whose batches keep renewing it (a replayed one too)
    before = DeciderLease(fresh_redis, PREFIX).read()
    time.sleep(0.01)
    second(_Batch(), 6)
    info = DeciderLease(fresh_redis, PREFIX).read()
    assert before is not None and info is not None and info.holder == "host-b:2:bbbb"
    assert info.term == 2 and info.renewed_at_ms > before.renewed_at_ms


def test_a_decider_paused_past_its_lease_before_publishing_publishes_nothing(
    fresh_redis: redis.Redis, redis_url: str, monkeypatch: Any, captured: type[_Captured]
) -> None:
    """The renewal at the start of the batch is not enough: a cycle renews once more right
    before it publishes, so a job stalled past the TTL in between (a long GC, SIGSTOP)
    publishes nothing, and the cycle stays pending for the new holder."""
    _, bundle = _store(fresh_redis)
    stalled = _stage(redis_url, "host-a:1:aaaa", loadBalancerDeciderLeaseTtlMs=500)

    def stall_and_lose() -> None:
        time.sleep(0.7)
        assert DeciderLease(fresh_redis, PREFIX).hold("host-b:2:bbbb", 10_000).term == 2

    ran = _pending_cycle(fresh_redis, 5, monkeypatch, _move(bundle, "b1", "b2", "5"),
                         then=stall_and_lose)  # fmt: skip
    stalled(_Batch(), 5)
    assert ran == [5] and _published(0) == []
    assert RedisProgress(fresh_redis, PREFIX).read().cycle_pending


def test_leader_broker_shows_the_decider_and_the_live_controllers(
    fresh_redis: redis.Redis, redis_url: str, monkeypatch: Any, captured: type[_Captured],
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    store, bundle = _store(fresh_redis)
    argv = ["brokers", "leader-broker", "--redis-url", redis_url, "--set",
            f"redisKeyPrefix={PREFIX}", "--json"]  # fmt: skip
    assert main(argv) == 0
    empty = json.loads(capsys.readouterr().out)
    assert empty == {"serviceUrl": None, "brokerId": None, "decider": None, "controllers": []}

    _pending_cycle(fresh_redis, 5, monkeypatch, _move(bundle, "b1", "b2", "5"))
    _stage(redis_url, "host-a:4711:aaaa")(_Batch(), 5)
    wall = store.server_time_ms()
    store.processes.beat("control", "ctl:1", {"host": "ctl", "pid": 1, "beatAtMs": wall})
    store.processes.beat("control", "ctl:2", {"host": "ctl", "pid": 2, "beatAtMs": wall - 60_000})
    store.processes.beat("control", "ctl:3", {"host": "ctl", "pid": 3, "beatAtMs": wall,
                                              "stoppedAtMs": wall})  # fmt: skip
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["brokerId"] == "host-a:4711:aaaa" and "serviceUrl" in doc
    dec = doc["decider"]
    assert (dec["host"], dec["pid"], dec["term"], dec["live"]) == ("host-a", 4711, 1, True)
    assert dec["lastBatch"] == 5 and dec["lastBatchAtMs"] >= wall - 60_000
    assert [(c["id"], c["live"]) for c in doc["controllers"]] == [("ctl:1", True),
                                                                  ("ctl:2", False)]  # fmt: skip
    assert main(argv[:-1]) == 0  # the table
    table = capsys.readouterr().out
    assert "host-a:4711:aaaa" in table and "ctl:1" in table and "stale" in table


def test_a_real_job_stamps_its_decisions_and_the_controller_applies_them(
    spark, kafka_bootstrap, redis_url, fresh_redis, unique_topic, tmp_path
) -> None:
    """End to end on Spark, Kafka and Redis: the job's decisions carry the term it took and its
    id, its last batch renewed the lease, and the reconciler admits and applies them."""
    from loadbalance.decisions import decode_decision
    from metadata_store.decider_lease import decider_id
    from tests.integration.test_streaming_job import _read_all, _run, overloaded_cluster

    config, _ = overloaded_cluster(kafka_bootstrap, fresh_redis, unique_topic)
    stats = _run(spark, kafka_bootstrap, redis_url, config, tmp_path / "ckpt")
    records = _read_all(kafka_bootstrap, config.decisions_topic)
    decisions = [decode_decision(v) for _, v, _, _ in records]
    assert decisions and {(d.term, d.decider) for d in decisions} == {(1, decider_id())}
    info = DeciderLease(fresh_redis, config.redis_key_prefix).read()
    assert info is not None and info.holder == decider_id() and info.term == 1
    assert info.last_batch == max(s.batch_id for s in stats)
    store = RedisStore(fresh_redis, config.redis_key_prefix)
    rec = Reconciler(store, publish=lambda _e: None, clock=lambda: 10**12)
    outcomes = [rec.reconcile(d) for d in decisions]
    assert not [o for o in outcomes if o.reason.startswith("refused")]
    assert len({o.decision_id for o in outcomes}) == len(decisions)


def test_a_stopped_job_hands_the_lease_back_so_the_next_decides_at_once(
    fresh_redis: redis.Redis, redis_url: str, monkeypatch: Any, captured: type[_Captured]
) -> None:
    """``lbctl stream`` releases its decider lease when it ends (``streaming.cli``), so its
    restart decides at its first batch instead of waiting out the TTL (a minute here)."""
    from streaming.cli import _release_decider

    _, bundle = _store(fresh_redis)
    old = _stage(redis_url, "host-a:1:aaaa", loadBalancerDeciderLeaseTtlMs=60_000)
    new = _stage(redis_url, "host-a:2:bbbb", loadBalancerDeciderLeaseTtlMs=60_000)
    _pending_cycle(fresh_redis, 5, monkeypatch, _move(bundle, "b1", "b2", "5"))
    old(_Batch(), 5)
    assert [d.term for d in _published(0)] == [1]
    _release_decider([old])
    info = DeciderLease(fresh_redis, PREFIX).read()
    assert info is None or not info.holder, f"the lease is still held: {info}"
    _pending_cycle(fresh_redis, 6, monkeypatch, _move(bundle, "b2", "b1", "6"))
    new(_Batch(), 6)
    assert [d.term for d in _published(1)] == [2]
