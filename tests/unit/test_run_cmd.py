"""``lbctl run``: the closed-loop main job balances the default scenario and reports it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_run_balances_the_hot_bundle_scenario_and_prints_json_lines() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "lbctl.main", "run", "--fast", "--json", "--interval-seconds", "0",
         "--cycles", "40"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    cycles, summary = lines[:-1], lines[-1]["summary"]
    assert len(cycles) == 40
    applied = cycles[-1]["decisionsApplied"]
    assert applied.get("split", 0) >= 1, "the hot bundle must split"
    first, last = cycles[0]["usage"], cycles[-1]["usage"]
    spread = lambda u: max(u.values()) / (sum(u.values()) / len(u))  # noqa: E731
    assert spread(last) < spread(first), "broker usage spread shrinks"
    assert "end max/mean" in json.dumps(summary) or summary


def test_run_rejects_unknown_scenario_and_pair() -> None:
    for args in (["--scenario", "nope"], ["--pair", "nope"]):
        out = subprocess.run(
            [sys.executable, "-m", "lbctl.main", "run", "--json", *args],
            capture_output=True, text=True, cwd=ROOT, timeout=120,
        )  # fmt: skip
        assert out.returncode == 2
        assert "nope" in (out.stderr + out.stdout)
