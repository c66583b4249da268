"""``lbctl.supervisor``: children in their own groups, death reported with a log tail, and a
bounded stop that also reaches what the children forked (real processes, no mocks)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from infra.process import pid_alive
from lbctl.supervisor import CHILDREN_FILE, Supervisor, group_members

# a child that ignores SIGTERM and forks a grandchild (as Spark's driver forks its JVM)
STUBBORN = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print("ready", flush=True)
time.sleep(60)
"""


def _wait_for(predicate, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_a_child_that_dies_is_reported_once_with_its_log_tail_and_last_error(
    tmp_path: Path,
) -> None:
    sup = Supervisor(tmp_path, grace_s=1)
    crash = "print('boom: starting', flush=True); raise ValueError('bad config')"
    sup.start("crasher", [sys.executable, "-c", crash])
    sup.start("finisher", [sys.executable, "-c", "pass"], may_finish=True)
    exited: list = []
    deadline = time.monotonic() + 10
    while len(exited) < 2 and time.monotonic() < deadline:
        exited += sup.poll()
        time.sleep(0.05)
    by_name = {e.name: e for e in exited}
    assert by_name["crasher"].code == 1 and not by_name["crasher"].expected
    assert "boom: starting" in by_name["crasher"].tail
    assert by_name["crasher"].error == "ValueError: bad config"
    assert by_name["finisher"].expected
    assert sup.poll() == []
    sup.stop_all()


def test_stop_all_kills_a_child_ignoring_sigterm_and_its_group_within_the_grace(
    tmp_path: Path,
) -> None:
    sup = Supervisor(tmp_path, grace_s=1.0)
    child = sup.start("stubborn", [sys.executable, "-c", STUBBORN])
    assert _wait_for(lambda: "ready" in child.log_path.read_text())
    assert _wait_for(lambda: len(group_members([child.pid])) == 2)
    doc = json.loads((tmp_path / CHILDREN_FILE).read_text())
    assert doc["children"][0]["pid"] == child.pid
    took = sup.stop_all()
    assert took < 4.0
    assert not pid_alive(child.pid)
    assert _wait_for(lambda: group_members([child.pid]) == [], 5)


def test_a_stop_signal_only_sets_the_flag_the_main_loop_waits_on(tmp_path: Path) -> None:
    import os
    import signal

    sup = Supervisor(tmp_path)
    sup.install_signal_handlers()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        assert sup.wait(2.0)
        assert sup.stop_signal == signal.SIGINT
    finally:
        sup.restore_signal_handlers()
