"""Two controllers run at once by mistake: the result stays correct, the overlap is reported.

Two ``lbctl control`` processes in different consumer groups both consume the whole decisions
topic, so every decision is seen twice, sometimes at the same moment. Compare-and-set on the
namespace version, fencing tokens on leases, and a first-outcome-wins record keep the store
equal to what one controller makes; every second sighting shows in the outcome stream as a
``duplicate`` or, when the two raced, a ``conflict`` naming the outcome that won.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter

import pytest
from confluent_kafka import Producer

from controller.apply import _apply, _record, apply_decision, outcome_of
from loadbalance.decisions import SPLIT, TRANSFER, UNLOAD, encode_decision, make_decision
from metadata_store.ownership_redis import RedisStore
from tests.reliability.invariants import check_invariants, lbctl, set_args, stop, wait_for

pytestmark = pytest.mark.integration

NS = "acme/twin"
HOUR_MS = 3_600_000
REAL = {"applied", "already_satisfied", "rejected", "conflict"}


def _setup(store: RedisStore, now: int) -> list[str]:
    store.create_namespace(NS, 8)
    for b in ("b1", "b2", "b3"):
        store.register_broker(b, now, HOUR_MS)
    names = store.get_namespace(NS).bundle_names
    for n in names:
        store.acquire(n, "b1", now, HOUR_MS)
    return names


def _decisions(names: list[str]) -> list:
    out = []
    for i, n in enumerate(names[2:], start=2):
        out.append(make_decision(cycle="c", kind=TRANSFER, bundle=n, source_broker="b1",
                                 destination_broker="b2" if i % 2 else "b3"))  # fmt: skip
    # contradicting hints: the second move of names[2] and the second split of names[0] lose
    out.append(make_decision(cycle="c", kind=TRANSFER, bundle=names[2], source_broker="b1",
                             destination_broker="b2"))  # fmt: skip
    lo = int(names[0].rsplit("/", 1)[1].split("_")[0], 16)
    for cut in (lo + 0x08000000, lo + 0x10000000):
        out.append(make_decision(cycle="c", kind=SPLIT, bundle=names[0], source_broker="b1",
                                 split_boundaries=(cut,)))  # fmt: skip
    out.append(make_decision(cycle="c", kind=UNLOAD, bundle=names[1], source_broker="b1"))
    return out


def _ownership(store: RedisStore, now: int) -> tuple:
    nb = store.get_namespace(NS)
    owners = store.owners(NS, now)
    return nb.boundaries, {b: (owners[b].broker if b in owners else None) for b in nb.bundle_names}


def test_two_controllers_on_one_decision_stream_give_the_one_controller_result(
    kafka_bootstrap, redis_url, fresh_redis, unique_topic, tmp_path
):
    now = int(time.time() * 1000)
    reference = RedisStore(fresh_redis, "ref")
    names = _setup(reference, now)
    decisions = _decisions(names)
    for d in decisions:
        apply_decision(reference, d, now_ms=now, lease_ttl_ms=HOUR_MS)
    expected = _ownership(reference, now)

    prefix = f"twin{uuid.uuid4().hex[:6]}"
    store = RedisStore(fresh_redis, prefix)
    _setup(store, now)
    topic, events = unique_topic(1, "decisions"), unique_topic(1, "events")
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    for d in decisions:
        p.produce(topic, key=d.bundle.encode(), value=encode_decision(d))
    assert p.flush(10) == 0
    knobs = set_args({"redisKeyPrefix": prefix, "decisionsTopic": topic,
                      "ownershipEventsTopic": events,
                      "loadBalancerOwnershipLeaseTtlSeconds": 3600})  # fmt: skip
    procs = [
        lbctl(
            [
                "control",
                "--redis-url",
                redis_url,
                "--bootstrap-servers",
                kafka_bootstrap,
                "--group",
                f"ctl-{i}",
                *knobs,
            ],
            tmp_path / f"control-{i}.log",
        )
        for i in range(2)
    ]
    stream = f"{prefix}:outcome-stream"
    try:
        wait_for("both controllers to see every decision",
                 lambda: fresh_redis.xlen(stream) >= 2 * len(decisions), timeout_s=90)  # fmt: skip
    finally:
        codes = [stop(proc) for proc in procs]
    assert codes == [0, 0]

    now = int(time.time() * 1000)
    check_invariants(fresh_redis, prefix, now)
    assert _ownership(store, now) == expected, "two controllers made what one makes"
    entries = [
        (f[b"id"].decode(), f[b"outcome"].decode(), f.get(b"race")) for _, f in
        fresh_redis.xrange(stream)
    ]  # fmt: skip
    per_id = Counter(i for i, _, _ in entries)
    assert per_id == dict.fromkeys((d.id for d in decisions), 2), "each seen once by each"
    for d in decisions:
        kinds = sorted(o for i, o, _ in entries if i == d.id)
        first = outcome_of(store, d.id).outcome
        assert first == outcome_of(reference, d.id).outcome
        # one real outcome (the hash's), and the other controller's sighting, reported: as a
        # duplicate, a conflict, or an applied that names the already_satisfied it replaced
        raced = [r for i, _, r in entries if i == d.id and r is not None]
        assert first in kinds and ("duplicate" in kinds or "conflict" in kinds or raced), (
            d.kind, kinds)  # fmt: skip


def test_a_controller_that_raced_past_the_dedup_check_reports_a_conflict_and_changes_nothing(
    fresh_redis,
):
    """The exact interleaving two controllers can hit: both read "no outcome yet", A applies
    and records, then B applies (CAS: already satisfied) and records; B must not overwrite A's
    outcome, and must say it raced."""
    store_a, store_b = RedisStore(fresh_redis, "race"), RedisStore(fresh_redis, "race")
    names = _setup(store_a, 0)
    split = make_decision(cycle="c", kind=SPLIT, bundle=names[0], source_broker="b1",
                          split_boundaries=(0x08000000,))  # fmt: skip
    move = make_decision(cycle="c", kind=TRANSFER, bundle=names[1], source_broker="b1",
                         destination_broker="b2")  # fmt: skip
    for d in (split, move):
        assert outcome_of(store_b, d.id) is None  # B's dedup check passes
        assert apply_decision(store_a, d, now_ms=1, lease_ttl_ms=HOUR_MS).outcome == "applied"
        before = check_invariants(fresh_redis, "race", 2)
        late = _apply(store_b, d, 2, HOUR_MS, False)  # B re-reads: already satisfied
        assert late.outcome == "already_satisfied"
        reported = _record(store_b, d, late, 2)
        assert reported.outcome == "conflict" and "recorded applied" in reported.reason
        assert outcome_of(store_a, d.id).outcome == "applied", "the winner's outcome stays"
        after = check_invariants(fresh_redis, "race", 2)
        assert (after.boundaries, after.leases) == (before.boundaries, before.leases)
    races = [f for _, f in fresh_redis.xrange("race:outcome-stream") if b"race" in f]
    assert [(f[b"outcome"], f[b"race"]) for f in races] == [(b"conflict", b"applied")] * 2


def test_a_losers_conflict_recorded_first_does_not_hide_the_winners_applied(fresh_redis):
    """The other interleaving (seen in CI): B's compare-and-set loses against A's change while A
    is still between its script and its record, so B records ``conflict`` first. A conflict
    changed nothing, so A's ``applied`` must still win the hash; the stream keeps both."""
    from controller.apply import Outcome

    store_a, store_b = RedisStore(fresh_redis, "race2"), RedisStore(fresh_redis, "race2")
    names = _setup(store_a, 0)
    move = make_decision(cycle="c", kind=TRANSFER, bundle=names[1], source_broker="b1",
                         destination_broker="b2")  # fmt: skip
    lost = _record(store_b, move, Outcome(move.id, "conflict", "lease changed"), 1)
    assert lost.outcome == "conflict"
    done = _apply(store_a, move, 1, HOUR_MS, False)
    assert done.outcome == "applied"
    assert _record(store_a, move, done, 2).outcome == "applied"
    assert outcome_of(store_b, move.id).outcome == "applied", "a conflict never wins the hash"
    kinds = [f[b"outcome"] for _, f in fresh_redis.xrange("race2:outcome-stream")]
    assert kinds == [b"conflict", b"applied"]
    # a replay now finds the real outcome and reports a duplicate
    assert apply_decision(store_b, move, now_ms=3, lease_ttl_ms=HOUR_MS).outcome == "duplicate"


def test_an_applied_recorded_after_a_racing_already_satisfied_takes_the_hash(fresh_redis):
    """The interleaving seen in a suite run: A's script changes Redis, B (past its dedup check)
    finds the change made and records ``already_satisfied``, then A records ``applied``. The
    hash must say ``applied``, as with one controller, and A's stream entry names the outcome
    it replaced; a replay then finds ``applied`` and reports a duplicate."""
    store_a, store_b = RedisStore(fresh_redis, "race3"), RedisStore(fresh_redis, "race3")
    names = _setup(store_a, 0)
    move = make_decision(cycle="c", kind=TRANSFER, bundle=names[1], source_broker="b1",
                         destination_broker="b2")  # fmt: skip
    done = _apply(store_a, move, 1, HOUR_MS, False)
    assert done.outcome == "applied"
    seen = _apply(store_b, move, 1, HOUR_MS, False)
    assert seen.outcome == "already_satisfied"
    assert _record(store_b, move, seen, 1).outcome == "already_satisfied"
    assert _record(store_a, move, done, 2).outcome == "applied"
    assert outcome_of(store_b, move.id).outcome == "applied", "the change made names the hash"
    stream = fresh_redis.xrange("race3:outcome-stream")
    entries = [(f[b"outcome"], f.get(b"race")) for _, f in stream]
    assert entries == [(b"already_satisfied", None), (b"applied", b"already_satisfied")]
    # the other order keeps first-wins: an already_satisfied after applied is the conflict
    late = _record(store_b, move, seen, 3)
    assert late.outcome == "conflict" and "recorded applied" in late.reason
    assert outcome_of(store_a, move.id).outcome == "applied"
    assert apply_decision(store_b, move, now_ms=4, lease_ttl_ms=HOUR_MS).outcome == "duplicate"
