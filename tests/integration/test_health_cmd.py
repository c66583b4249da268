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
    redis_url: str, fresh_redis: redis.Redis, tmp_path: Path, capsys
) -> None:
    state = tmp_path / "stream.json"
    args = ["stream", "--redis-url", redis_url, "--max-age-s", "60", "--state-file", str(state)]
    code, out = _probe(capsys, *args)
    assert code == 1 and "no progress recorded yet" in out

    progress = RedisProgress(fresh_redis, "lb")
    progress.commit(Progress(batch=7, now_ms=1), {}, [], {}, [])
    code, out = _probe(capsys, *args)
    assert code == 0 and "batch 7 (new)" in out

    # The same batch, first seen two minutes ago: the job stopped making progress.
    from lbctl.health_cmd import Seen

    save_seen(state, Seen("batch 7", int(time.time() * 1000) - 120_000))
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
