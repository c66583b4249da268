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


def test_summary_text_names_decisions_spreads_and_times_and_copes_with_no_batch() -> None:
    from lbctl.run_cmd import _summary_text

    base = {"ended": "duration reached", "seconds": 90.0, "runDir": "/tmp/r"}
    text = _summary_text(
        {
            **base,
            "applied": {"split": 2, "transfer": 9},
            "spreadStart": {"maxOverMean": 1.65, "stdPct": 13.5},
            "spreadEnd": {"maxOverMean": 1.1, "stdPct": 2.3},
            "firstBatchAfterS": 40.0,
            "balancedAfterS": 80.5,
        }
    )
    assert "split 2, transfer 9" in text
    assert "start max/mean 1.65, std 13.5 -> end max/mean 1.10, std 2.3" in text
    assert "first streaming batch after: 40.0s" in text and "after: 80.5s" in text
    empty = _summary_text(
        {**base, "applied": {}, "spreadStart": None, "spreadEnd": None,
         "firstBatchAfterS": None, "balancedAfterS": None}
    )  # fmt: skip
    assert "decisions applied: none" in empty and "start n/a -> end n/a" in empty


class _Proc:
    """A child process stand-in: ``poll`` is None while it runs."""

    def __init__(self) -> None:
        self.code: int | None = None

    def poll(self) -> int | None:
        return self.code


def test_the_simulator_waits_for_the_query_to_start(tmp_path) -> None:
    """``wait_for_query`` returns once Spark has committed the job's first batch, and gives up
    (None) when the job ends, a stop is asked for, or the limit passes."""
    import threading
    import time

    from lbctl.run_cmd import wait_for_query

    proc, stop = _Proc(), threading.Event()
    (tmp_path / "metadata").write_text("{}")  # the query started: not enough
    (tmp_path / "commits").mkdir()

    timer = threading.Timer(0.3, lambda: (tmp_path / "commits" / "0").write_text("v1"))
    timer.start()
    took = wait_for_query(tmp_path, proc, stop, limit_s=10, poll_s=0.02)
    timer.join()
    assert took is not None and 0.25 <= took < 5
    assert wait_for_query(tmp_path, proc, stop, limit_s=10) is not None  # a resumed checkpoint

    fresh = tmp_path / "fresh"
    proc.code = 1  # the job died
    started = time.monotonic()
    assert wait_for_query(fresh, proc, stop, limit_s=10, poll_s=0.02) is None
    assert time.monotonic() - started < 1
    proc.code = None
    assert wait_for_query(fresh, proc, stop, limit_s=0.1, poll_s=0.02) is None  # too slow
    stop.set()
    started = time.monotonic()
    assert wait_for_query(fresh, proc, stop, limit_s=10, poll_s=0.02) is None  # Ctrl-C
    assert time.monotonic() - started < 1
