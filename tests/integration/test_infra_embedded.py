"""The embedded Kafka-protocol broker and Redis start, answer, stop and leave nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import redis
from confluent_kafka.admin import AdminClient

from infra.embedded import EmbeddedKafka, EmbeddedRedis, free_port
from infra.process import pid_alive, port_accepts

pytestmark = pytest.mark.integration


def _wait_gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_kafka_answers_metadata_on_a_loopback_port_and_stops_without_a_trace(
    tmp_path: Path,
) -> None:
    with EmbeddedKafka(tmp_path) as kafka:
        pid = kafka.pid
        assert pid is not None and pid_alive(pid)
        assert kafka.bootstrap_servers == f"127.0.0.1:{kafka.port}"
        metadata = AdminClient({"bootstrap.servers": kafka.bootstrap_servers}).list_topics(
            timeout=10
        )
        assert metadata.brokers
    assert not pid_alive(pid)
    assert not port_accepts("127.0.0.1", kafka.port)
    assert kafka.log_path.stat().st_size > 0


def test_redis_answers_ping_and_stops_without_a_trace(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path)
    server.start()
    pid = server.pid
    try:
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        client = redis.Redis.from_url(server.url)
        assert client.ping()
        # configured as the product needs it (docs/reliability.md, supported deployments)
        assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        assert client.config_get("appendonly")["appendonly"] == "yes"
        assert client.config_get("appendfsync")["appendfsync"] == "everysec"
        assert client.config_get("save")["save"] == ""
        client.close()
    finally:
        server.stop()
    assert pid is not None and not pid_alive(pid)
    server.stop()  # idempotent


def test_redis_with_aof_keeps_data_and_port_across_restart(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path / "logs", appendonly=True, data_dir=tmp_path / "data") as server:
        port, old_pid = server.port, server.pid
        server.client().set("bundle", "owner-1")
        server.restart()
        assert server.port == port
        assert server.pid != old_pid and not pid_alive(old_pid)
        assert server.client().get("bundle") == b"owner-1"
    assert any((tmp_path / "data").rglob("*.aof*"))


def test_redis_password_and_acl_user_are_required(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path, password="s3cret pw") as server:
        assert server.client().ping()
        bare = f"redis://127.0.0.1:{server.port}/0"
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(bare).ping()
    with EmbeddedRedis(tmp_path, password="pw", username="lb") as server:
        assert server.url.startswith("redis://lb:pw@127.0.0.1:")
        assert server.client().ping()
        with pytest.raises(redis.RedisError):  # the default user is switched off
            redis.Redis.from_url(f"redis://127.0.0.1:{server.port}/0").ping()


def test_a_fixed_port_is_used_as_given(tmp_path: Path) -> None:
    port = free_port()
    with EmbeddedRedis(tmp_path, port=port) as server:
        assert server.port == port
        assert server.client().ping()


def test_services_die_when_the_python_parent_is_killed(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from infra.embedded import EmbeddedKafka, EmbeddedRedis
        kafka = EmbeddedKafka(Path({str(tmp_path)!r}))
        kafka.start()
        r = EmbeddedRedis(Path({str(tmp_path)!r}))
        r.start()
        print(kafka.pid, r.pid, flush=True)
        time.sleep(60)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert parent.stdout is not None
        kafka_pid, redis_pid = (int(x) for x in parent.stdout.readline().split())
        assert pid_alive(kafka_pid) and pid_alive(redis_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        assert _wait_gone(kafka_pid), "the Kafka broker outlived its killed parent"
        assert _wait_gone(redis_pid), "redis-server outlived its killed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
