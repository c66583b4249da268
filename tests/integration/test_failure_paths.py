"""A missing or lost service ends or shows in a few lines, within seconds, without a traceback.

Each case runs the real ``lbctl`` command in a subprocess against real services started (and
stopped or killed) here, and asserts the exit code, the wall time, the output's size and that
no Python traceback reaches the operator. Commands whose service is wrong from the start must
fail before any heavy work (no Spark start: seconds, not minutes); a Kafka killed under a
running ``lbctl stream`` ends it with one line naming Kafka and its address once
``--restart-window-s`` has passed; under ``lbctl control`` it shows as the controller's own
log line, while a second controller says it joined as a standby.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.embedded import EmbeddedKafka, EmbeddedRedis
from infra.process import free_port

pytestmark = pytest.mark.timeout(600)

FAST_S = 15.0  # python start (about 2 s on a busy 2-core machine) + the 5 s check + slack
FEW_LINES = 3


def _lbctl_argv(*argv: str) -> list[str]:
    return [sys.executable, "-m", "lbctl.main", *argv]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for key in [k for k in env if k.startswith("LB_")]:  # no configured service from outside
        del env[key]
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    return env


def _run(*argv: str, timeout_s: float = 60.0) -> tuple[int, float, str]:
    began = time.monotonic()
    done = subprocess.run(
        _lbctl_argv(*argv),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        env=_env(),
    )
    return done.returncode, time.monotonic() - began, done.stdout + done.stderr


def _assert_one_line_failure(
    code: int, took_s: float, out: str, expect_code: int, *words: str
) -> None:
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert code == expect_code, out
    assert took_s < FAST_S, f"took {took_s:.1f} s: {out}"
    assert 1 <= len(lines) <= FEW_LINES, out
    assert "Traceback" not in out, out
    for word in words:
        assert word in out, out


@pytest.fixture(scope="module")
def closed_port() -> int:
    """A loopback port nobody listens on."""
    return free_port()


@pytest.fixture(scope="module")
def stopped_redis_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The URL of a Redis that ran and was stopped: an address that used to answer."""
    server = EmbeddedRedis(tmp_path_factory.mktemp("stopped-redis"))
    server.start()
    url = server.url
    server.stop()
    return url


# -- wrong from the start: no heavy work, one line ------------------------------------------


def _kafka_unreachable_cases(bootstrap: str, redis_url: str, checkpoint: Path) -> list[list[str]]:
    where = ["--bootstrap-servers", bootstrap]
    return [
        ["stream", "--checkpoint", str(checkpoint), "--redis-url", redis_url, *where],
        ["control", "--redis-url", redis_url, *where],
        ["agent", "--broker-id", "b1", "--once", *where],
    ]


def test_kafka_unreachable_ends_each_command_in_one_line(
    closed_port: int, redis_url: str, tmp_path: Path
) -> None:
    bootstrap = f"127.0.0.1:{closed_port}"
    for argv in _kafka_unreachable_cases(bootstrap, redis_url, tmp_path / "cp"):
        code, took_s, out = _run(*argv)
        _assert_one_line_failure(
            code, took_s, out, 1, f"cannot reach Kafka at {bootstrap}", "connection refused",
            "--bootstrap-servers",
        )  # fmt: skip
        assert "rdkafka" not in out and "FAIL" not in out, out  # no raw client lines
    assert not (tmp_path / "cp").exists() or not any((tmp_path / "cp").iterdir())


def _redis_cases(redis: str, kafka: str, checkpoint: Path) -> list[list[str]]:
    return [
        ["stream", "--checkpoint", str(checkpoint), "--redis-url", redis, "--bootstrap-servers",
         kafka],
        ["control", "--redis-url", redis, "--bootstrap-servers", kafka],
        ["namespaces", "list", "--redis-url", redis],
    ]  # fmt: skip


def test_redis_url_without_scheme_is_a_usage_error_in_one_line(
    kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> None:
    bare = redis_url.split("://", 1)[1]  # 127.0.0.1:PORT/0
    monitor = ["monitor", "--once", "--redis-url", bare]
    for argv in [*_redis_cases(bare, kafka_bootstrap, tmp_path / "cp"), monitor]:
        code, took_s, out = _run(*argv)
        _assert_one_line_failure(code, took_s, out, 2, "has no scheme", "redis://", "--redis-url")
        assert "ValueError" not in out


def test_redis_unreachable_ends_each_command_in_one_line(
    kafka_bootstrap: str, stopped_redis_url: str, tmp_path: Path
) -> None:
    for argv in _redis_cases(stopped_redis_url, kafka_bootstrap, tmp_path / "cp"):
        code, took_s, out = _run(*argv)
        _assert_one_line_failure(
            code, took_s, out, 1, f"cannot reach Redis at {stopped_redis_url}",
            "connection refused", "--redis-url",
        )  # fmt: skip


def test_monitor_once_answers_with_the_unreachable_service_within_seconds(
    closed_port: int, redis_url: str, stopped_redis_url: str
) -> None:
    """The monitor's answer is the services' state (a view with a TROUBLE line naming the
    service), not the other commands' one line; it still comes in seconds, short and clean."""
    for argv, word, expect_code in (
        (["--redis-url", redis_url, "--bootstrap-servers", f"127.0.0.1:{closed_port}"],
         "kafka down", 0),
        (["--redis-url", stopped_redis_url], "redis down", 1),
    ):  # fmt: skip
        code, took_s, out = _run("monitor", "--once", *argv)
        assert code == expect_code, out
        assert took_s < FAST_S, f"took {took_s:.1f} s: {out}"
        assert re.search(rf"TROUBLE: .*{word}", out, re.IGNORECASE), out
        assert len(out.splitlines()) < 25 and "Traceback" not in out, out
        assert "%3|" not in out, out  # librdkafka's raw lines stay off the terminal


def test_a_redis_password_never_reaches_the_failure_line(closed_port: int) -> None:
    url = f"redis://ops:hunter2@127.0.0.1:{closed_port}/0"
    code, took_s, out = _run("namespaces", "list", "--redis-url", url)
    _assert_one_line_failure(code, took_s, out, 1, "redis://ops:******@127.0.0.1")
    assert "hunter2" not in out


# -- lost while running ----------------------------------------------------------------------


@pytest.fixture
def own_kafka(tmp_path: Path) -> Iterator[EmbeddedKafka]:
    """A Kafka of the test's own, to kill."""
    kafka = EmbeddedKafka(tmp_path / "kafka")
    kafka.start()
    try:
        yield kafka
    finally:
        kafka.stop()


class _Proc:
    """An ``lbctl`` process whose combined output goes to a file that is read as it grows."""

    def __init__(self, path: Path, *argv: str) -> None:
        self.path = path
        self._out = path.open("w", encoding="utf-8")
        self.proc = subprocess.Popen(
            _lbctl_argv(*argv), stdout=self._out, stderr=subprocess.STDOUT, env=_env()
        )

    def text(self) -> str:
        return self.path.read_text(encoding="utf-8", errors="replace")

    def wait_for(self, pattern: str, timeout_s: float, start: int = 0) -> float:
        """Seconds until ``pattern`` shows in the output after character ``start``."""
        began = time.monotonic()
        while time.monotonic() - began < timeout_s:
            if re.search(pattern, self.text()[start:]):
                return time.monotonic() - began
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        raise AssertionError(f"no {pattern!r} within {timeout_s} s:\n{self.text()[-4000:]}")

    def close(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self._out.close()
        return self.proc.returncode


def test_kafka_killed_under_two_controllers_shows_as_their_own_lines(
    own_kafka: EmbeddedKafka, redis_url: str, tmp_path: Path
) -> None:
    bootstrap = own_kafka.bootstrap_servers
    argv = ["control", "--redis-url", redis_url, "--bootstrap-servers", bootstrap,
            "--sweep-interval-s", "1", "--set", "topicPartitions=1",
            "--group", "lb-fp"]  # fmt: skip
    first = _Proc(tmp_path / "first.log", *argv)
    second = None
    try:
        first.wait_for(r"joined consumer group lb-fp: partitions of \S+: 0;", 60)
        second = _Proc(tmp_path / "second.log", *argv)
        # The group's assignor may hand the one partition to either member: which one holds
        # it does not matter here, only that both joined and exactly one holds it.
        both = r"active controllers: 2: \S+ \[(0|none)\]; \S+ \[(?!\1\])(?:0|none)\]"
        began = time.monotonic()
        while not any(re.search(both, p.text()) for p in (first, second)):
            assert time.monotonic() - began < 60, first.text()[-2000:] + second.text()[-2000:]
            assert second.proc.poll() is None, second.text()[-4000:]
            time.sleep(0.5)
        mark = len(first.text())
        own_kafka.nodes[0].kill()
        took_s = first.wait_for(
            rf"ERROR lbctl\.control: Kafka at {re.escape(bootstrap)} unreachable", 30, mark
        )
        assert took_s < 20
        time.sleep(10)  # what the operator sees while it lasts: a few lines, not a flood
        after = first.text()[mark:]
        assert len(after.splitlines()) < 30, after
        assert "Traceback" not in first.text() + second.text()
        assert first.proc.poll() is None, "the controller keeps running without Kafka"
    finally:
        if second is not None:
            second.close()
        first.close()


def test_kafka_killed_under_the_stream_ends_it_with_one_line_after_the_window(
    own_kafka: EmbeddedKafka, redis_url: str, tmp_path: Path
) -> None:
    bootstrap = own_kafka.bootstrap_servers
    window_s = 10
    job = _Proc(
        tmp_path / "stream.log", "stream", "--checkpoint", str(tmp_path / "cp"),
        "--redis-url", redis_url, "--bootstrap-servers", bootstrap,
        "--trigger-seconds", "1", "--restart-window-s", str(window_s),
    )  # fmt: skip
    try:
        job.wait_for(r"batch 0: ", 240)
        mark = len(job.text())
        own_kafka.nodes[0].kill()
        killed = time.monotonic()
        code = job.proc.wait(timeout=120)
        took_s = time.monotonic() - killed
    finally:
        job.close()
    after = job.text()[mark:]
    assert code == 1, after
    # window + one probe period (10 s) + a probe (5 s) + the query's stop (10 s) + slack
    assert window_s <= took_s < window_s + 45, f"{took_s:.0f} s: {after}"
    verdicts = [ln for ln in after.splitlines() if "streaming query stopped" in ln]
    assert len(verdicts) == 1, after
    assert f"Kafka at {bootstrap}" in verdicts[0] and "--restart-window-s" in verdicts[0]
    assert "Traceback" not in after, after
    assert len(after.splitlines()) < 30, after
