"""A dead Kafka, a dead Redis and a dead streaming job show at the next refresh of
``lbctl monitor --once --json``, in ``lbctl health --json`` and in the run summary's outages.

Each test starts its own services (and a real ``lbctl control``), stops one of them, and reads
what the operator would read. The streaming job is played by its own progress writer
(``RedisProgress.commit``, what the Spark job calls per batch), so a "dead job" is one that
stopped committing, without the cost of a JVM.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from infra.embedded import EmbeddedKafka, EmbeddedRedis
from lbctl.main import main
from lbctl.monitor_cmd import build_monitor, record
from lbctl.plots import UsageHistory
from lbctl.run_cmd import _summary_text
from lbctl.supervisor import lbctl_argv
from loadbalance.config import LoadBalancerConfig
from metadata_store.progress import Progress, RedisProgress

pytestmark = pytest.mark.integration


def _monitor_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code = main(["monitor", "--once", "--json", *argv])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0 and len(out) == 1, out
    return json.loads(out[0])


def _health_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code = main(["health", *argv, "--json"])
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1, out  # one JSON document, nothing else
    return code, json.loads(out[0])


def _service(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in doc["services"] if s["name"] == name)


def _wait(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


@pytest.fixture
def own_services(tmp_path: Path) -> Iterator[tuple[EmbeddedKafka, EmbeddedRedis]]:
    """A Kafka and a Redis of this test only (it kills one of them)."""
    kafka, red = EmbeddedKafka(tmp_path / "kafka"), EmbeddedRedis(tmp_path / "redis")
    kafka.start()
    red.start()
    try:
        yield kafka, red
    finally:
        red.stop()
        kafka.stop()


@pytest.fixture
def controller(own_services, tmp_path: Path) -> Iterator[subprocess.Popen]:
    """A real ``lbctl control`` on the test's services, registered in Redis."""
    kafka, red = own_services
    log = (tmp_path / "control.log").open("w")
    proc = subprocess.Popen(
        lbctl_argv("control", "--bootstrap-servers", kafka.bootstrap_servers,
                   "--redis-url", red.url, "--sweep-interval-s", "1"),
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    client = redis.Redis.from_url(red.url)
    try:
        _wait(lambda: client.hlen("lb:processes") > 0, 60, "the controller's registry entry")
        yield proc
    finally:
        client.close()
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_a_dead_kafka_shows_in_the_monitor_health_and_the_run_summary(
    own_services, controller, capsys
) -> None:
    kafka, red = own_services
    where = ["--redis-url", red.url, "--bootstrap-servers", kafka.bootstrap_servers]
    client = redis.Redis.from_url(red.url)
    RedisProgress(client, "lb").commit(Progress(batch=1, now_ms=1), {}, [], {}, [])
    _wait(lambda: client.hget("lb:processes", next(iter(client.hkeys("lb:processes"))))
          and b"lastSweepMs\": null" not in client.hvals("lb:processes")[0], 20,
          "a first sweep")  # fmt: skip

    # the embedded Kafka answers its first probes slowly on a loaded machine: wait until the
    # monitor sees it up once (the precondition), then judge what the monitor shows
    seen: list[dict[str, Any]] = []

    def kafka_up() -> bool:
        seen.append(_monitor_json(capsys, *where))
        return _service(seen[-1], "kafka")["state"] == "up"

    _wait(kafka_up, 60, "the monitor to see Kafka up")
    doc = seen[-1]
    assert doc["trouble"] == []
    controllers = [s for s in doc["services"] if s["name"].startswith("control ")]
    assert len(controllers) == 1 and controllers[0]["state"] == "up"
    code, health = _health_json(capsys, "control", *where, "--max-age-s", "30")
    assert code == 0 and health["healthy"], health

    config = LoadBalancerConfig()
    monitor = build_monitor(config, red.url, bootstrap=kafka.bootstrap_servers)
    history = UsageHistory()
    record(history, monitor.read(), 0.0, 0)

    kafka.stop()
    started = time.monotonic()
    doc = _monitor_json(capsys, *where)
    assert _service(doc, "kafka")["state"] == "down"
    assert any(line.startswith("kafka down") for line in doc["trouble"])
    code, health = _health_json(capsys, "control", *where, "--max-age-s", "30")
    assert code == 1 and not health["healthy"] and "Kafka unreachable" in health["message"]
    assert time.monotonic() - started < 30

    record(history, monitor.read(), 5.0, 0)
    record(history, monitor.read(), 7.0, 0)
    assert [o[0] for o in history.outages()] == ["kafka down"]
    summary = {"ended": "stopped", "seconds": 7, "applied": {}, "spreadStart": None,
               "spreadEnd": None, "firstBatchAfterS": None, "balancedAfterS": None,
               "runDir": "x", "outages": [{"service": "kafka down", "fromS": 5.0, "toS": 7.0}],
               "troubleAtEnd": monitor.read().trouble}  # fmt: skip
    text = _summary_text(summary)
    assert (
        "TROUBLE during the run: kafka down 5s-7s" in text and "TROUBLE at the end: kafka" in text
    )
    client.close()


def test_a_dead_redis_shows_at_the_next_refresh_of_a_running_monitor(
    own_services, tmp_path: Path
) -> None:
    kafka, red = own_services
    proc = subprocess.Popen(
        lbctl_argv("monitor", "--json", "--refresh-seconds", "1", "--duration", "40",
                   "--redis-url", red.url, "--bootstrap-servers", kafka.bootstrap_servers),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        first = json.loads(proc.stdout.readline())
        assert _service(first, "redis")["state"] == "up"
        red.stop()
        stopped = time.monotonic()
        while True:
            doc = json.loads(proc.stdout.readline())
            if _service(doc, "redis")["state"] == "down":
                break
        assert time.monotonic() - stopped < 10  # within a refresh or two, not minutes
        assert any(line.startswith("redis down") for line in doc["trouble"])
    finally:
        proc.terminate()
        proc.wait(15)


def test_a_dead_redis_is_unhealthy_in_health_json(tmp_path: Path, capsys) -> None:
    red = EmbeddedRedis(tmp_path / "redis")
    red.start()
    url = red.url
    red.stop()
    code, doc = _health_json(capsys, "control", "--redis-url", url)
    assert code == 1 and not doc["healthy"] and "Redis at" in doc["message"]
    code, doc = _health_json(capsys, "stream", "--redis-url", url,
                             "--state-file", str(tmp_path / "s.json"))  # fmt: skip
    assert code == 1 and not doc["healthy"]


def test_a_dead_job_shows_by_its_own_clock(
    redis_url: str, fresh_redis: redis.Redis, tmp_path: Path, capsys
) -> None:
    progress = RedisProgress(fresh_redis, "lb")
    progress.commit(Progress(batch=4, now_ms=1), {}, [], {}, [])
    argv = ["--redis-url", redis_url, "--stream-stale-after", "2"]
    doc = _monitor_json(capsys, *argv)
    assert _service(doc, "stream")["state"] == "up" and doc["stream"]["batchAgeS"] < 2

    time.sleep(3)  # the job stopped committing; this monitor process never saw it alive
    doc = _monitor_json(capsys, *argv)
    stream = _service(doc, "stream")
    assert stream["state"] == "stale" and stream["ageS"] >= 3, stream
    assert doc["stream"]["batchAgeS"] >= 3
    assert any(line.startswith("stream stale") for line in doc["trouble"])
    code, health = _health_json(capsys, "stream", "--redis-url", redis_url, "--max-age-s", "2",
                                "--state-file", str(tmp_path / "s.json"))  # fmt: skip
    assert code == 1 and "by the job's clock" in health["message"]
