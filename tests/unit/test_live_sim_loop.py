"""The live simulator's shell without services: pacing, stop, retry, progress line, config order.

The Kafka/Redis behaviour is in ``tests/integration/test_live_sim.py``; here ``tick`` is replaced
so the loop itself (what SIGTERM and a Redis outage go through) is checked in milliseconds.
"""

from __future__ import annotations

import argparse
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from loadbalance.config import LoadBalancerConfig
from producers import cli
from producers.live_sim import LiveCycle, LiveSim, resume_start_ms
from producers.scenarios import parse_scenario

DOC = {
    "name": "tiny",
    "brokers": [{"count": 2}],
    "namespaces": [{"name": "public/tiny", "bundles": 4, "topics": 10}],
}


class ScriptedSim(LiveSim):
    """A LiveSim whose cycles only record when they ran (and can fail on demand)."""

    def __init__(self, fail_at: set[int] | None = None) -> None:
        scenario = parse_scenario(DOC, random.Random(0))
        super().__init__(scenario, LoadBalancerConfig(), None, None, start_ms=0)  # type: ignore[arg-type]
        self.calls: list[tuple[int, float]] = []
        self.fail_at = set(fail_at or ())

    def setup(self) -> int:
        return 0

    def tick(self, cycle: int) -> LiveCycle:
        self.calls.append((cycle, time.monotonic()))
        if cycle in self.fail_at:
            self.fail_at.discard(cycle)
            raise redis.ConnectionError("down")
        return LiveCycle(cycle, self.virtual_ms(cycle), 0, (), 4, 4, 0, 0, 2, (), {}, {})


def test_run_plays_the_requested_cycles_and_paces_them() -> None:
    sim = ScriptedSim()
    seen: list[int] = []
    t0 = time.monotonic()
    assert sim.run(4, 0.05, lambda r: seen.append(r.cycle)) == 4
    assert seen == [0, 1, 2, 3]
    assert time.monotonic() - t0 >= 0.15  # three waits between four cycles, none after the last
    starts = [t for _, t in sim.calls]
    # never early: cycle k starts at least k periods after cycle 0 (an overrun only delays)
    assert all(t - starts[0] >= k * 0.05 - 0.002 for k, t in enumerate(starts))


def test_stop_during_the_wait_returns_promptly() -> None:
    sim = ScriptedSim()
    threading.Timer(0.2, sim.stop).start()
    t0 = time.monotonic()
    assert sim.run(None, 30.0) == 1
    assert time.monotonic() - t0 < 1.0


def test_a_redis_error_replays_the_same_cycle() -> None:
    sim = ScriptedSim(fail_at={1})
    assert sim.run(3, 0.0) == 3
    assert [c for c, _ in sim.calls] == [0, 1, 1, 2]


def test_virtual_time_is_start_plus_cycles_of_ticks() -> None:
    sim = ScriptedSim()
    assert sim.virtual_ms(0) == 0 and sim.virtual_ms(3) == 3 * sim.scenario.tick_ms


def test_progress_line_and_json_row() -> None:
    r = LiveCycle(
        cycle=7,
        virtual_ms=1_700_000_040_000,
        wall_ms=1,
        brokers=("a", "b"),
        bundles=12,
        owned=10,
        assigned=2,
        moved=3,
        published=2,
        events=("crash:b",),
        usage={"a": 0.5, "b": 0.3},
        reports={},
    )
    line = r.line()
    assert line.startswith("cycle    7  virtual 2023-11-14T22:14:00Z  brokers  2")
    assert "owned   10/12" in line and "reports  2" in line and "max  50.0%" in line
    assert "lookups 2" in line and "moved 3" in line and "events crash:b" in line
    row = r.to_json()
    assert row["ownedBundles"] == 10 and row["reportsPublished"] == 2 and row["usage"]["a"] == 0.5


def _clear_lb_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in [v for v in os.environ if v.startswith("LB_")]:
        monkeypatch.delenv(var)


def _args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["simulate", "steady", *extra])


def test_live_config_order_file_then_scenario_then_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clear_lb_env(monkeypatch)
    conf = tmp_path / "broker.conf"
    conf.write_text("loadBalancerOwnershipLeaseTtlSeconds=11\nloadReportsTopic=from-file\n")
    knobs: dict[str, Any] = {"loadBalancerOwnershipLeaseTtlSeconds": 12}
    args = _args("--config", str(conf))
    config = cli._live_config(args, knobs)
    assert config.load_balancer_ownership_lease_ttl_seconds == 12
    assert config.load_reports_topic == "from-file"
    args = _args("--config", str(conf), "--set", "loadBalancerOwnershipLeaseTtlSeconds=13")
    assert cli._live_config(args, knobs).load_balancer_ownership_lease_ttl_seconds == 13


def test_live_mode_without_services_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear_lb_env(monkeypatch)
    args = _args()
    assert args.func(args) == 2


def test_virtual_time_resumes_after_the_newest_report_never_behind_the_wall_clock() -> None:
    assert resume_start_ms(None, 1_000, 60_000) == 1_000
    assert resume_start_ms(500_000, 1_000, 60_000) == 560_000  # a previous run ran ahead
    assert resume_start_ms(100, 1_000_000, 60_000) == 1_000_000  # an old topic: now wins
