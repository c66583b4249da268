"""``lbctl health`` against what the processes really write: the stream's progress in Redis
(through ``RedisProgress``, the job's own writer) and the controller's metrics endpoint."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from infra import metrics
from lbctl.health_cmd import save_seen
from lbctl.main import main
from metadata_store.progress import Progress, RedisProgress

pytestmark = pytest.mark.integration


def _probe(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["health", *argv])
    return code, capsys.readouterr().out.strip()


def test_stream_probe_follows_the_batches_the_job_commits(
    redis_url: str, fresh_redis: redis.Redis, tmp_path: Path, capsys, monkeypatch
) -> None:
    state = tmp_path / "stream.json"
    args = ["stream", "--redis-url", redis_url, "--max-age-s", "60", "--state-file", str(state)]
    code, out = _probe(capsys, *args)
    assert code == 1 and "no progress recorded yet" in out

    progress = RedisProgress(fresh_redis, "lb")
    progress.commit(Progress(batch=7, now_ms=1), {}, [], {}, [])
    code, out = _probe(capsys, *args)
    assert code == 0 and "batch 7 committed 0 s ago" in out

    # The same batch, committed two minutes ago by the job's clock: the job stopped.
    import metadata_store.progress as progress_module

    real = time.time
    monkeypatch.setattr(progress_module.time, "time", lambda: real() - 120)
    progress.commit(Progress(batch=7, now_ms=1), {}, [], {}, [])
    monkeypatch.undo()
    code, out = _probe(capsys, *args)
    assert code == 1 and "no progress for 120 s" in out

    progress.commit(Progress(batch=8, now_ms=2), {}, [], {}, [])
    code, out = _probe(capsys, *args)
    assert code == 0 and "batch 8" in out


def test_stream_probe_reads_the_configured_key_prefix(
    redis_url: str, fresh_redis: redis.Redis, tmp_path: Path, capsys
) -> None:
    progress = RedisProgress(fresh_redis, "other")
    progress.commit(Progress(batch=3, now_ms=1), {}, [], {}, [])
    base = ["stream", "--redis-url", redis_url, "--state-file", str(tmp_path / "s.json")]
    assert _probe(capsys, *base)[0] == 1
    assert _probe(capsys, *base, "--set", "redisKeyPrefix=other")[0] == 0


def test_an_unreachable_redis_or_endpoint_is_unhealthy_with_exit_1(tmp_path: Path, capsys) -> None:
    from infra.embedded import free_port

    port = free_port()
    state = str(tmp_path / "s.json")
    code, out = _probe(capsys, "stream", "--redis-url", f"redis://:pw@127.0.0.1:{port}/0",
                       "--state-file", state)  # fmt: skip
    assert code == 1 and "unhealthy" in out and ":pw@" not in out
    code, out = _probe(capsys, "control", "--metrics-url", f"http://127.0.0.1:{port}/metrics",
                       "--state-file", state)  # fmt: skip
    assert code == 1 and "unreachable" in out


def test_control_probe_follows_the_sweep_counter_on_the_metrics_endpoint(
    tmp_path: Path, capsys
) -> None:
    port = metrics.serve(0)
    try:
        args = ["control", "--metrics-url", f"http://127.0.0.1:{port}/metrics",
                "--max-age-s", "60", "--state-file", str(tmp_path / "c.json")]  # fmt: skip
        code, out = _probe(capsys, *args)
        assert code == 0 and "lbctl_control_sweeps_total" in out
        from lbctl.health_cmd import Seen, load_seen

        seen = load_seen(tmp_path / "c.json")
        assert seen is not None
        save_seen(tmp_path / "c.json", Seen(seen.value, int(time.time() * 1000) - 61_000))
        assert _probe(capsys, *args)[0] == 1  # no sweep for 61 s
        metrics.CONTROL_SWEEPS.inc()
        assert _probe(capsys, *args)[0] == 0
    finally:
        metrics.stop_all()


def _spark_checkpoint(root: Path, topic: str, committed: dict[str, int]) -> Path:
    """A checkpoint as Spark leaves it after committing batch 5 at ``committed``."""
    import json

    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    meta = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}})
    (root / "offsets" / "5").write_text(f"v1\n{meta}\n{json.dumps({topic: committed})}")
    (root / "commits" / "5").write_text('v1\n{"nextBatchWatermarkMs":0}')
    return root


def test_with_the_checkpoint_an_idle_job_is_healthy_and_a_stuck_one_says_what_is_unread(
    redis_url: str, fresh_redis: redis.Redis, kafka_bootstrap: str, unique_topic, tmp_path: Path,
    capsys, monkeypatch,
) -> None:  # fmt: skip
    """A job with nothing to read runs no batch: with ``--checkpoint`` the probe compares the
    last committed batch's offsets with the topic's end, so an unchanged batch is idle when
    every report is read and stuck when some are not."""
    from confluent_kafka import Producer

    from lbctl.health_cmd import Seen

    topic = unique_topic(partitions=2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(5):
        producer.produce(topic, key=f"b{i}", value=b"{}", partition=i % 2)
    producer.flush(10)
    import metadata_store.progress as progress_module

    real = time.time  # the job committed batch 5 two minutes ago, by its clock
    monkeypatch.setattr(progress_module.time, "time", lambda: real() - 120)
    RedisProgress(fresh_redis, "lb").commit(Progress(batch=5, now_ms=1), {}, [], {}, [])
    monkeypatch.undo()
    state = tmp_path / "stream.json"
    base = [
        "stream", "--redis-url", redis_url, "--max-age-s", "60", "--state-file", str(state),
        "--set", f"kafkaBootstrapServers={kafka_bootstrap}", "--set", f"loadReportsTopic={topic}",
    ]  # fmt: skip
    stale = Seen("batch 5", int(time.time() * 1000) - 120_000)

    read_all = _spark_checkpoint(tmp_path / "all", topic, {"0": 3, "1": 2})
    save_seen(state, stale)
    code, out = _probe(capsys, *base, "--checkpoint", str(read_all))
    assert code == 0 and out.startswith("stream: healthy: idle: batch 5 unchanged"), out

    behind = _spark_checkpoint(tmp_path / "behind", topic, {"0": 1, "1": 2})
    save_seen(state, stale)
    code, out = _probe(capsys, *base, "--checkpoint", str(behind))
    assert code == 1 and "no progress for 120 s" in out and "2 reports unread" in out, out

    # without the checkpoint the age alone decides, as before
    save_seen(state, stale)
    assert _probe(capsys, *base)[0] == 1
