"""The streaming job (``lbctl stream``, real processes with their own Spark JVM) under faults:
SIGKILL in the middle of a micro-batch with a restart from the checkpoint, then the Kafka
broker going away for a while (SIGSTOP of the broker's process: its sockets stay open and
nothing answers, which is what a hung or partitioned broker looks like) and coming back.

The same reports also go through a reference run that nothing disturbs. Batches are cut at a
fixed number of records (``--max-offsets-per-trigger``), so both runs see the same batches and
must publish the same decisions (compared by content: the ids carry the batch id, which
no-data batches may shift) and write the same averages, which must also equal the pure fold.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
import redis
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from infra.embedded import EmbeddedKafka
from infra.offsets import partitions_for
from infra.topics import ensure_topics
from loadbalance.config import LoadBalancerConfig
from loadbalance.decisions import UNLOAD, decode_decision, encode_decision, make_decision
from metadata_store.load_snapshot import LoadSnapshot
from metadata_store.ownership_redis import RedisStore
from tests.integration.test_streaming_job import (
    MINUTE_MS,
    T0_MS,
    _assert_matches_pure,
    _cluster_round,
    _records,
)
from tests.reliability.invariants import kill_group, lbctl, set_args, stop, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark]

NS = "acme/stream"
ROUNDS = 6
BATCH_RECORDS = 4  # one round of four brokers per micro-batch
KAFKA_AWAY_S = 12.0  # longer than the consumer session timeout (6 s) of librdkafka clients


def _read_values(bootstrap: str, topic: str) -> list[bytes]:
    """Every record of every partition (the job creates its topics with topicPartitions)."""
    partitions = partitions_for(bootstrap, topic)
    c = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "reader", "enable.partition.eof": True}
    )
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    out, left = [], set(partitions)
    while left:
        m = c.poll(5)
        if m is None:
            break
        if m.error():
            if m.error().code() == -191:  # partition EOF
                left.discard(m.partition())
            continue
        out.append(m.value())
    c.close()
    assert not left, f"{topic}: partitions {left} not read to the end"
    return out


def _content(d) -> tuple:
    return (d.kind, d.bundle, d.source_broker, d.destination_broker, d.split_boundaries,
            d.reason, d.decided_at_ms)  # fmt: skip


def _assert_nothing_lost_and_repeats_identical(reference: list, published: list) -> int:
    """Every decision of the undisturbed run is published once or more by the crashed one, a
    repeated id carries identical content each time (a replay re-sends, it never re-decides
    differently), and nothing else is published; returns how many records were repeats.

    Why a list and not a dict keyed by id: a dict keeps one record per id, so an id published
    twice with different content would pass unseen."""
    assert len({d.id for d in reference}) == len(reference), "the reference run repeats no id"
    by_id: dict[str, list] = {}
    for d in published:
        by_id.setdefault(d.id, []).append(d)
    for ident, copies in by_id.items():
        contents = {(_content(c), encode_decision(c)) for c in copies}
        assert len(contents) == 1, f"id {ident} published with different content: {copies}"
    firsts = [copies[0] for copies in by_id.values()]
    assert Counter(map(_content, firsts)) == Counter(map(_content, reference))
    return len(published) - len(by_id)


def _progress(r: redis.Redis, prefix: str) -> tuple[int, int]:
    raw = r.hmget(f"{prefix}:stream:progress", "batch", "now_ms")
    return (int(raw[0]) if raw[0] else -1, int(raw[1]) if raw[1] else 0)


def _batch_in_flight(checkpoint: Path, after: int) -> int | None:
    """A batch id above ``after`` whose offsets are logged but not yet committed."""
    offsets, commits = checkpoint / "offsets", checkpoint / "commits"
    if not offsets.is_dir():
        return None
    planned = [int(p.name) for p in offsets.iterdir() if p.name.isdigit()]
    done = (
        {int(p.name) for p in commits.iterdir() if p.name.isdigit()} if commits.is_dir() else set()
    )
    running = [b for b in planned if b > after and b not in done]
    return max(running) if running else None


def test_stream_killed_mid_batch_and_kafka_away_loses_and_repeats_nothing(
    redis_url, fresh_redis, tmp_path
):
    kafka = EmbeddedKafka(tmp_path / "kafka")
    kafka.start()
    procs = []
    try:
        bootstrap = kafka.bootstrap_servers
        reports = f"reports-{uuid.uuid4().hex[:6]}"
        ensure_topics(bootstrap, {reports: 1})
        knobs = {
            "loadBalancerLoadSheddingStrategy": "OverloadShedder",
            "loadBalancerNamespaceBundleMaxMsgRate": 1000,
            "loadBalancerSheddingGracePeriodMinutes": 0,
            "loadReportsTopic": reports,
        }
        config = LoadBalancerConfig(**knobs)
        names = []
        runs = {}
        for run in ("ref", "crash"):
            prefix = f"{run}{uuid.uuid4().hex[:6]}"
            store = RedisStore(fresh_redis, prefix)
            store.create_namespace(NS, 16)
            names = store.get_namespace(NS).bundle_names
            runs[run] = {**knobs, "redisKeyPrefix": prefix, "decisionsTopic": f"dec-{prefix}",
                         "deadLettersTopic": f"dead-{prefix}"}  # fmt: skip
        all_reports = [r for i in range(ROUNDS) for r in _cluster_round(names, i)]
        p = Producer({"bootstrap.servers": bootstrap})
        for i in range(ROUNDS):
            for key, value, ts in _records(_cluster_round(names, i), T0_MS + i * MINUTE_MS):
                p.produce(reports, key=key, value=value, timestamp=ts)
        assert p.flush(30) == 0
        last_ts = T0_MS + (ROUNDS - 1) * MINUTE_MS + 3

        def stream(run: str, *extra: str) -> list[str]:
            return ["stream", "--bootstrap-servers", bootstrap, "--redis-url", redis_url,
                    "--checkpoint", str(tmp_path / f"ckpt-{run}"), "--source", "kafka",
                    "--shards", "2", "--max-offsets-per-trigger", str(BATCH_RECORDS),
                    *extra, *set_args(runs[run])]  # fmt: skip

        ref = lbctl(stream("ref", "--available-now"), tmp_path / "ref.log")
        procs.append(ref)
        crash_log = tmp_path / "crash.log"
        first = lbctl(stream("crash", "--trigger-seconds", "0"), crash_log)
        procs.append(first)
        crash_prefix = runs["crash"]["redisKeyPrefix"]

        # 1. SIGKILL the job (Python driver and JVM) while a micro-batch runs
        ckpt = tmp_path / "ckpt-crash"
        in_flight = wait_for(
            "a micro-batch after the second one to be running",
            lambda: _batch_in_flight(ckpt, after=1) if first.poll() is None else -1,
            timeout_s=240,
            step_s=0.05,
        )
        assert in_flight != -1, f"the job exited early: see {crash_log}"
        kill_group(first)
        first.wait(10)
        killed_at = _progress(fresh_redis, crash_prefix)
        # Usually the kill falls before the batch's Redis commit (it is then re-run with the
        # same ids); in a short window after it, the replay is skipped. Both must end the same.
        where = "before" if killed_at[0] < in_flight else "after"
        print(f"figure: killed in batch {in_flight}, {where} its Redis commit")

        # 2. restart from the checkpoint; once it makes progress, Kafka goes away for a while
        second = lbctl(stream("crash", "--trigger-seconds", "0"), crash_log)
        restarted = time.monotonic()
        procs.append(second)
        wait_for(
            "the restarted job to commit a batch",
            lambda: _progress(fresh_redis, crash_prefix)[0] > killed_at[0],
            timeout_s=240,
        )
        print(f"figure: restart to first committed batch {time.monotonic() - restarted:.1f} s")
        batch_before_outage = _progress(fresh_redis, crash_prefix)[0]
        assert kafka.pid is not None
        os.kill(kafka.pid, signal.SIGSTOP)
        try:
            time.sleep(KAFKA_AWAY_S)
        finally:
            os.kill(kafka.pid, signal.SIGCONT)
        back = time.monotonic()
        wait_for(
            "a batch committed after Kafka came back",
            lambda: (
                _progress(fresh_redis, crash_prefix)[0] > batch_before_outage
                or _progress(fresh_redis, crash_prefix)[1] == last_ts
                or second.poll() is not None
            ),
            timeout_s=240,
        )
        print(f"figure: Kafka back to next committed batch {time.monotonic() - back:.1f} s")
        wait_for("the job to process every report after Kafka came back",
                 lambda: _progress(fresh_redis, crash_prefix)[1] == last_ts
                 or second.poll() is not None, timeout_s=240)  # fmt: skip
        assert second.poll() is None, f"the job died instead of waiting: see {crash_log}"
        assert ref.wait(240) == 0, f"see {tmp_path / 'ref.log'}"
        assert _progress(fresh_redis, runs["ref"]["redisKeyPrefix"])[1] == last_ts
        published = {
            run: [decode_decision(v) for v in _read_values(bootstrap, runs[run]["decisionsTopic"])]
            for run in runs
        }
    finally:
        for proc in procs:
            stop(proc)
        kafka.stop()

    # no decision lost, none new twice (a replayed batch may re-send the same ids, which the
    # controller de-duplicates), averages as if nothing had happened
    reference = published["ref"]
    assert len(reference) >= ROUNDS
    resent = _assert_nothing_lost_and_repeats_identical(reference, published["crash"])
    print(f"figure: {len(reference)} decisions; re-sent ids {resent}")
    _assert_matches_pure(_snapshot(fresh_redis, crash_prefix), all_reports, config)
    _assert_matches_pure(_snapshot(fresh_redis, runs["ref"]["redisKeyPrefix"]), all_reports, config)


def _snapshot(r: redis.Redis, prefix: str) -> dict[str, dict]:
    return LoadSnapshot(r, prefix).read().bundle_docs()


def test_the_comparison_sees_a_repeated_id_with_different_content_and_a_lost_decision() -> None:
    """The check the crash test relies on, fed records that break it (no Spark here)."""
    a = make_decision(cycle="1", kind=UNLOAD, bundle="t/ns/0x00000000_0x80000000",
                      source_broker="b1", reason="Overloaded")  # fmt: skip
    b = make_decision(cycle="1", kind=UNLOAD, bundle="t/ns/0x80000000_0xffffffff",
                      source_broker="b2", reason="Overloaded")  # fmt: skip
    assert _assert_nothing_lost_and_repeats_identical([a, b], [a, b, a]) == 1
    changed = dataclasses.replace(a, reason="Underloaded")  # same id, other content
    with pytest.raises(AssertionError, match="different content"):
        _assert_nothing_lost_and_repeats_identical([a, b], [changed, b, a])
    with pytest.raises(AssertionError):
        _assert_nothing_lost_and_repeats_identical([a, b], [a, a])  # b lost
