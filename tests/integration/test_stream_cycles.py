"""Policy cycles of the streaming job: run on the batch's own thread right after its commit,
and completed after a failure between the batch's commit and the cycle's (real Kafka, Redis and
Spark).

``streaming.decide`` commits a batch's view first and runs the cycle it made due afterwards,
on the same thread, before the next batch (the order is in ``streaming.driver_view``'s
docstring). These tests check the two things that order must not break: a processing-time
trigger decides what an availableNow run does, and a cycle that never published (here: it
raised) is run again from Redis with the same ids.
"""

from __future__ import annotations

import threading
import time

import pytest

import streaming.decide as decide
from loadbalance.decisions import decode_decision
from metadata_store.progress import RedisProgress
from streaming.decide import BatchStats
from streaming.job import StreamSettings, start_query
from tests.integration.test_streaming_job import NS, _read_all, _run, overloaded_cluster


def _decisions(kafka_bootstrap, config):
    return [decode_decision(v) for _, v, _, _ in _read_all(kafka_bootstrap, config.decisions_topic)]


def _shape(decisions):
    """What a decision says, without its id (ids name the batch, which differs between runs)."""
    return sorted((d.kind, d.bundle, d.reason, d.source_broker or "") for d in decisions)


def test_a_processing_time_cycle_publishes_what_an_available_now_one_does_on_its_batch_thread(
    spark, kafka_bootstrap, redis_url, fresh_redis, unique_topic, tmp_path
):
    # the reference: the same reports with the cycle inside its batch (availableNow)
    reference = overloaded_cluster(kafka_bootstrap, fresh_redis, unique_topic)[0]
    _run(spark, kafka_bootstrap, redis_url, reference, tmp_path / "ref")
    expected = _shape(_decisions(kafka_bootstrap, reference))
    assert expected

    config = overloaded_cluster(kafka_bootstrap, fresh_redis, unique_topic)[0]
    seen: list[tuple[BatchStats, str]] = []

    def on_batch(s: BatchStats) -> None:
        seen.append((s, threading.current_thread().name))

    settings = StreamSettings(
        bootstrap_servers=kafka_bootstrap,
        checkpoint=str(tmp_path / "bg"),
        redis_url=redis_url,
        trigger_seconds=0.5,
        n_shards=4,
    )
    query = start_query(spark, settings, config, on_batch=on_batch)
    try:
        deadline = time.monotonic() + 180
        while not any(s.decisions for s, _ in seen) and time.monotonic() < deadline:
            assert query.exception() is None, query.exception()
            time.sleep(0.2)
    finally:
        query.stop()

    cycle_batches = [(s, thread) for s, thread in seen if s.decisions]
    assert len(cycle_batches) == 1
    stats, thread = cycle_batches[0]
    # the cycle ran inside its batch, on the batch's thread: its steps are in the batch's own
    # timing, and no thread of the process runs a cycle
    assert "cycle_step" in stats.phases and "cycle_publish" in stats.phases
    assert not thread.startswith("policy-cycle")
    assert not any(t.name.startswith("policy-cycle") for t in threading.enumerate())
    published = _decisions(kafka_bootstrap, config)
    assert _shape(published) == expected
    assert sorted(d.id for d in published) == sorted(stats.decision_ids)
    progress = RedisProgress(fresh_redis, config.redis_key_prefix).read()
    assert progress.batch >= stats.batch_id and not progress.cycle_pending
    assert progress.cycle_state.last_shedding_ms is not None
    assert not fresh_redis.exists(f"{config.redis_key_prefix}:stream:pending")


def test_a_cycle_that_failed_after_its_batch_committed_is_completed_on_restart_with_its_ids(
    spark, kafka_bootstrap, redis_url, fresh_redis, unique_topic, tmp_path, monkeypatch
):
    config = overloaded_cluster(kafka_bootstrap, fresh_redis, unique_topic)[0]
    real_step = decide.step

    def failing_step(*args, **kwargs):
        raise RuntimeError("injected: the cycle dies after its batch was committed")

    monkeypatch.setattr(decide, "step", failing_step)
    with pytest.raises(Exception, match="injected"):
        _run(spark, kafka_bootstrap, redis_url, config, tmp_path / "ckpt")
    store = RedisProgress(fresh_redis, config.redis_key_prefix)
    failed = store.read()
    assert failed.cycle_pending  # the batch's view is committed, its cycle is not
    assert store.pending(failed.batch) is not None
    assert _decisions(kafka_bootstrap, config) == []

    monkeypatch.setattr(decide, "step", real_step)
    stats = _run(spark, kafka_bootstrap, redis_url, config, tmp_path / "ckpt")
    published = _decisions(kafka_bootstrap, config)
    assert published and len({d.id for d in published}) == len(published)
    # the completed cycle is the failed batch's: its ids name that batch, and the batch itself
    # (replayed by Spark, which never committed it) is skipped, not run again
    assert {d.cycle for d in published} == {str(failed.batch)}
    assert [s.batch_id for s in stats if s.skipped] == [failed.batch]
    done = store.read()  # (a no-data batch may follow once the watermark moved)
    assert not done.cycle_pending and done.batch >= failed.batch
    assert done.cycle_state.last_shedding_ms == failed.now_ms  # the cycle ran at its clock
    assert not fresh_redis.exists(f"{config.redis_key_prefix}:stream:pending")

    # the same reports with nothing failing decide the same (in a fresh job)
    reference = overloaded_cluster(kafka_bootstrap, fresh_redis, unique_topic)[0]
    _run(spark, kafka_bootstrap, redis_url, reference, tmp_path / "ref")
    assert _shape(published) == _shape(_decisions(kafka_bootstrap, reference))


def test_progress_keeps_the_pending_namespaces_until_the_cycle_commits(fresh_redis):
    from loadbalance.bundles import NamespaceBundles
    from metadata_store.progress import PendingCycle, Progress

    store = RedisProgress(fresh_redis, "p")
    namespaces = {NS: NamespaceBundles.initial(NS, 4)}
    store.set_pending(7, namespaces)
    store.commit(Progress(7, 1000, cycle_pending=True), {}, (), {"s:0": b"blob"}, ())
    read = store.read()
    assert (read.batch, read.now_ms, read.cycle_pending) == (7, 1000, True)
    assert store.pending(7) == PendingCycle(namespaces, None)
    assert fresh_redis.hget("p:load:shards", "s:0") == b"blob"

    store.commit_cycle(Progress(7, 1000))
    assert not store.read().cycle_pending
    assert store.pending(7) is None

    # a batch without a cycle ends the pending record in its own commit
    store.set_pending(8, namespaces)
    store.commit(Progress(8, 2000), {}, (), {}, ())
    assert store.pending(8) is None

    # progress written before cycle_pending existed reads as no cycle pending
    fresh_redis.hdel("p:stream:progress", "cycle_pending")
    assert store.read() == Progress(8, 2000)
