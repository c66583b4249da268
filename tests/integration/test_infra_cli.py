"""``lbctl infra up|status|down`` start detached services, report them, and stop them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import redis
from confluent_kafka.admin import AdminClient

from infra import cli
from infra.process import pid_alive

pytestmark = pytest.mark.integration


def _run(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["infra", *argv])
    return args.func(args)


def test_up_status_down_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state_dir = str(tmp_path / "state")
    try:
        assert _run("up", "--state-dir", state_dir, "--json") == 0
        up = json.loads(capsys.readouterr().out)
        assert up["kafka"]["running"] and up["redis"]["running"]
        assert redis.Redis.from_url(up["redis"]["url"]).ping()
        admin = AdminClient({"bootstrap.servers": up["kafka"]["bootstrap_servers"]})
        assert admin.list_topics(timeout=10).brokers

        assert _run("up", "--state-dir", state_dir, "--json") == 0  # already up: same services
        again = json.loads(capsys.readouterr().out)
        assert again["kafka"]["pid"] == up["kafka"]["pid"]
        assert again["redis"]["pid"] == up["redis"]["pid"]

        assert _run("status", "--state-dir", state_dir) == 0
        text = capsys.readouterr().out
        assert "kafka: running" in text and "redis: running" in text
    finally:
        assert _run("down", "--state-dir", state_dir, "--json") == 0
    down = json.loads(capsys.readouterr().out)
    assert sorted(down["stopped"]) == ["kafka", "redis"]
    assert not pid_alive(up["kafka"]["pid"]) and not pid_alive(up["redis"]["pid"])
    assert _run("status", "--state-dir", state_dir) == 3
    assert _run("down", "--state-dir", state_dir) == 0  # nothing left to stop is fine
