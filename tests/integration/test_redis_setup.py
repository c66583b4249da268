"""The Redis the services start on: its eviction policy, its persistence, and credentials.

Real ``redis-server`` processes of our own (``infra.embedded``): one as the product ships it
(noeviction, AOF), reconfigured per test with ``CONFIG SET``; one with ``requirepass``; one
speaking TLS only with an ACL user and the default user off. What is checked:

* ``lbctl control`` / ``stream`` refuse a ``maxmemory-policy`` that may evict keys with one
  line naming the setting and the fix, exit 1, before touching Kafka; with
  ``redisAllowEvictingPolicy=true`` they go on (to the Kafka check) with a warning;
* a Redis that persists nothing, or whose ``CONFIG`` is refused, is a warning, not a refusal;
* ``lbctl health`` shows the settings and the verdict (text and ``--json``), and an evicting
  policy makes an otherwise healthy process unhealthy;
* ``python -m controller.recovery --check`` reaches a Redis that needs a password (and TLS)
  through the configuration's knobs, and an unreachable or refusing Redis is exit 3 with one
  line, never exit 1 (which means "a loss was found").
"""

from __future__ import annotations

import http.server
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from infra import preflight
from infra.embedded import EmbeddedRedis, redis_supports_tls
from lbctl import main as lbctl_main
from loadbalance.config import LoadBalancerConfig
from tests.integration.tls_certs import issue, make_ca

ROOT = Path(__file__).resolve().parents[2]
NO_KAFKA = "127.0.0.1:1"
PASSWORD = "pw-Setup-5d1e"
ACL_USER, ACL_PASSWORD = "lb-setup", "acl-Setup-8b2f"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis(tmp_path_factory.mktemp("redis-setup")) as s:
        yield s


@pytest.fixture
def red(server: EmbeddedRedis) -> Iterator[redis.Redis]:
    """A client of the shared server; the product's settings are restored after each test."""
    client = server.client()
    yield client
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("appendonly", "yes")
    client.close()


def _lbctl(*argv: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LB_")}
    return subprocess.run([sys.executable, "-m", "lbctl.main", *argv], cwd=ROOT, env=clean,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def _recovery(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LB_")}
    return subprocess.run(
        [sys.executable, "-m", "controller.recovery", "--bootstrap-servers", NO_KAFKA, *argv],
        cwd=ROOT, env={**clean, **(env or {})}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize("command", ["control", "stream"])
def test_an_evicting_policy_is_refused_in_one_line_before_kafka(
    command: str, server: EmbeddedRedis, red: redis.Redis, tmp_path: Path
) -> None:
    red.config_set("maxmemory-policy", "allkeys-lru")
    extra = ["--checkpoint", str(tmp_path / "checkpoint")] if command == "stream" else []
    done = _lbctl(command, "--redis-url", server.url, "--bootstrap-servers", NO_KAFKA, *extra)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "maxmemory-policy allkeys-lru" in lines[0]
    assert "CONFIG SET maxmemory-policy noeviction" in lines[0]
    assert "redisAllowEvictingPolicy=true" in lines[0]
    assert "Kafka" not in lines[0]  # refused before Kafka was asked


def test_the_override_accepts_an_evicting_policy_with_a_warning(
    server: EmbeddedRedis, red: redis.Redis
) -> None:
    red.config_set("maxmemory-policy", "volatile-lru")
    done = _lbctl("control", "--redis-url", server.url, "--bootstrap-servers", NO_KAFKA,
                  "--set", "redisAllowEvictingPolicy=true")  # fmt: skip
    assert done.returncode == 1  # Kafka at 127.0.0.1:1 does not answer: the next check
    assert "cannot reach Kafka at 127.0.0.1:1" in done.stderr, done.stderr
    assert "volatile-lru (allowed by redisAllowEvictingPolicy)" in done.stderr
    assert "ownership silently lost" not in done.stderr


def test_no_persistence_is_warned_and_accepted(
    server: EmbeddedRedis, red: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    config = LoadBalancerConfig()
    with caplog.at_level(logging.WARNING, logger="lbctl.preflight"):
        assert preflight.check_redis_settings(server.url, config).state == "ok"
        assert not caplog.records
        red.config_set("appendonly", "no")
        verdict = preflight.check_redis_settings(server.url, config)
    assert verdict.refusal is None
    assert [r.getMessage() for r in caplog.records] == list(verdict.warnings)
    (line,) = verdict.warnings
    assert "persists nothing (appendonly no, save '')" in line
    assert "CONFIG SET appendonly yes" in line


def test_a_refused_config_command_is_a_warning_and_the_command_goes_on(
    server: EmbeddedRedis, red: redis.Redis
) -> None:
    """A managed Redis: the ACL user may not run CONFIG (renamed or disabled looks the same)."""
    red.acl_setuser("no-config", enabled=True, passwords=["+pw-nc"], keys=["*"],
                    channels=["*"], commands=["+@all", "-config"])  # fmt: skip
    config = LoadBalancerConfig(redisUsername="no-config", redisPassword="pw-nc")
    verdict = preflight.check_redis_settings(server.url, config)
    assert verdict.refusal is None and verdict.state == "warning"
    (line,) = verdict.warnings
    assert "cannot check maxmemory-policy and persistence" in line and "no permissions" in line


class _Metrics(http.server.BaseHTTPRequestHandler):
    """An agent's metrics endpoint whose progress counter moves on every scrape."""

    count = 0

    def do_GET(self) -> None:
        type(self).count += 1
        body = f"lbctl_agent_checks_total {self.count}\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def metrics_url() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/metrics"
    httpd.shutdown()


def _health(capsys: pytest.CaptureFixture[str], tmp_path: Path, *argv: str) -> tuple[int, str]:
    code = lbctl_main.main(["health", "agent", "--state-file", str(tmp_path / "seen.json"), *argv])
    return code, capsys.readouterr().out


def test_health_shows_the_settings_and_refuses_an_evicting_policy(
    server: EmbeddedRedis,
    red: redis.Redis,
    metrics_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ("--metrics-url", metrics_url, "--redis-url", server.url)
    code, out = _health(capsys, tmp_path, *args)
    assert code == 0, out
    assert "redis: maxmemory-policy noeviction, appendonly yes (appendfsync everysec), " \
           "save '': ok" in out  # fmt: skip
    red.config_set("maxmemory-policy", "allkeys-random")
    red.config_set("appendonly", "no")
    code, out = _health(capsys, tmp_path, *args, "--json")
    doc = json.loads(out)
    assert code == 1 and doc["healthy"] is False
    assert "maxmemory-policy allkeys-random" in doc["message"]
    assert doc["redis"]["maxmemoryPolicy"] == "allkeys-random"
    assert doc["redis"]["appendonly"] == "no" and doc["redis"]["verdict"] == "refused"
    assert any("persists nothing" in w for w in doc["redis"]["warnings"])
    code, out = _health(capsys, tmp_path, *args, "--set", "redisAllowEvictingPolicy=true")
    assert code == 0, out
    assert "redis: warning:" in out and "allowed by redisAllowEvictingPolicy" in out


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis(tmp_path_factory.mktemp("redis-pw"), password=PASSWORD) as s:
        yield s


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    if not redis_supports_tls():
        pytest.skip("redis-server has no TLS (install Debian's redis-server)")
    tmp = tmp_path_factory.mktemp("redis-tls")
    ca = make_ca(tmp / "tls")
    cert = issue(ca, "redis")
    with EmbeddedRedis(tmp / "redis", username=ACL_USER, password=ACL_PASSWORD,
                       tls_cert_file=cert.cert, tls_key_file=cert.key,
                       tls_ca_file=ca.cert) as s:  # fmt: skip
        yield s


def _bare(server: EmbeddedRedis) -> str:
    scheme = "rediss" if server.tls else "redis"
    return f"{scheme}://127.0.0.1:{server.port}/0"


def test_recovery_check_reaches_a_password_protected_redis_through_the_knobs(
    auth_server: EmbeddedRedis,
) -> None:
    done = _recovery("--redis-url", _bare(auth_server), "--check",
                     env={"LB_redisPassword": PASSWORD})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["lost"] is False
    wrong = _recovery("--redis-url", _bare(auth_server), "--check",
                      env={"LB_redisPassword": "wrong-one"})  # fmt: skip
    assert wrong.returncode == 3, wrong.stderr  # not 1: nothing was found lost
    (line,) = wrong.stderr.strip().splitlines()
    assert "refused the credentials" in line and "redisPassword" in line
    assert "wrong-one" not in wrong.stderr and not wrong.stdout


def test_recovery_check_reaches_a_tls_redis_with_an_acl_user_through_the_knobs(
    tls_server: EmbeddedRedis,
) -> None:
    env = {"LB_redisUsername": ACL_USER, "LB_redisPassword": ACL_PASSWORD,
           "LB_redisSslCaCerts": str(tls_server.tls_ca_file)}  # fmt: skip
    done = _recovery("--redis-url", _bare(tls_server), "--check", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["lost"] is False


def test_recovery_on_an_unreachable_redis_is_exit_3_in_one_line(tmp_path: Path) -> None:
    from infra.process import free_port

    done = _recovery("--redis-url", f"redis://127.0.0.1:{free_port()}/0", "--check")
    assert done.returncode == 3, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("recovery: cannot reach Redis") and "--redis-url" in line
