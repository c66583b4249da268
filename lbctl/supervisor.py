"""Start, watch and stop the processes of ``lbctl run``: one run folder, one log per process.

Why a supervisor of our own instead of a shell script: the main job is five processes (Kafka,
Redis, the streaming job with its JVM, the controller, the simulator), and a Ctrl-C or a crash
of any of them must leave nothing behind and say what happened. So:

* every child is ``python -m lbctl.main ...`` with stdout and stderr in ``<run dir>/<name>.log``,
  started in its own session (one ``killpg`` reaches what it forks, e.g. Spark's JVM and Python
  workers) and dying with this process (``PR_SET_PDEATHSIG`` through ``infra.process.spawn``;
  the JVM itself exits when its Python driver's pipe closes), so even ``kill -9`` of ``lbctl
  run`` leaves nothing running;
* ``children.json`` in the run folder lists every pid and process group, for humans and for the
  end-to-end test that checks nothing is left;
* ``poll()`` reports a child that exited; unless it was allowed to finish (the simulator with
  ``--cycles``), the caller stops the run and shows the tail of its log;
* ``stop_all()`` sends SIGTERM to every group at once, waits a grace period in total (not per
  child, so a stop stays within a few seconds), SIGKILLs what is left, and reaps everything.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from infra.process import log_tail, spawn

DEFAULT_GRACE_S = 5.0
CHILDREN_FILE = "children.json"


class Service(Protocol):
    """What the supervisor needs of an embedded server (``infra.embedded``)."""

    pid: int | None
    log_path: Path

    def stop(self, timeout_s: float = 10.0) -> None: ...


@dataclass
class Child:
    """One process started by the supervisor."""

    name: str
    argv: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes]
    may_finish: bool = False  # exit code 0 ends the run normally instead of failing it
    started_at: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass(frozen=True)
class Exited:
    """A child that ended on its own."""

    name: str
    code: int
    expected: bool
    log_path: Path
    tail: str
    error: str = ""  # the log's last exception line, often far above a JVM's closing noise


# Spark's console progress bar would fill the stream's log file with carriage-return noise
SPARK_ENV = {"PYSPARK_SUBMIT_ARGS": "--conf spark.ui.showConsoleProgress=false pyspark-shell"}


def lbctl_argv(*args: str, log_level: str = "INFO") -> list[str]:
    """The command line of an ``lbctl`` verb run with this interpreter."""
    return [sys.executable, "-u", "-m", "lbctl.main", "--log-level", log_level, *args]


class Supervisor:
    """Owns the run folder, the children and the embedded services of one run."""

    def __init__(self, run_dir: Path, grace_s: float = DEFAULT_GRACE_S) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.grace_s = grace_s
        self.children: list[Child] = []
        self.services: list[tuple[str, Service]] = []
        self.stop_requested = threading.Event()
        self.stop_signal: int | None = None
        self._previous_handlers: dict[int, Any] = {}

    # -- starting ------------------------------------------------------------------------
    def add_service(self, name: str, service: Service) -> None:
        """Record an embedded server already started (it is stopped last, after the children)."""
        self.services.append((name, service))
        self._write_children()

    def start_embedded(self, services_dir: Path, redis_data: Path | None = None) -> tuple[str, str]:
        """Start an embedded Kafka-protocol broker and Redis on free loopback ports, stopped
        with the children; (bootstrap servers, Redis URL)."""
        from infra.embedded import EmbeddedKafka, EmbeddedRedis

        kafka = EmbeddedKafka(services_dir)
        kafka.start()
        self.add_service("kafka", kafka)
        redis_server = EmbeddedRedis(services_dir, data_dir=redis_data)
        redis_server.start()
        self.add_service("redis", redis_server)
        return kafka.bootstrap_servers, redis_server.url

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        may_finish: bool = False,
        env_defaults: dict[str, str] | None = None,
    ) -> Child:
        """Start one child from the calling (main) thread: PDEATHSIG is tied to that thread.

        ``env_defaults`` are set only where the user's environment does not set them already.
        """
        env = {**(env_defaults or {}), **os.environ}
        env["PYTHONUNBUFFERED"] = "1"
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        log_path = self.run_dir / f"{name}.log"
        with open(log_path, "ab") as log:
            log.write(f"$ {' '.join(argv)}\n".encode())
        proc = spawn(argv, log_path, die_with_parent=True, env=env)
        child = Child(name, list(argv), log_path, proc, may_finish)
        self.children.append(child)
        self._write_children()
        return child

    def _write_children(self) -> None:
        rows = [
            {"name": c.name, "pid": c.pid, "pgid": c.pid, "log": str(c.log_path)}
            for c in self.children
        ]
        rows += [
            {"name": n, "pid": s.pid, "pgid": s.pid, "log": str(s.log_path)}
            for n, s in self.services
            if s.pid is not None
        ]
        doc = {"supervisor": os.getpid(), "children": rows}
        tmp = self.run_dir / (CHILDREN_FILE + ".tmp")
        tmp.write_text(json.dumps(doc, indent=2), encoding="utf-8")
        tmp.replace(self.run_dir / CHILDREN_FILE)

    # -- signals -------------------------------------------------------------------------
    def install_signal_handlers(self) -> None:
        """SIGINT, SIGTERM and SIGHUP (terminal closed) only ask for a stop; the main loop then
        stops the children in order."""

        def handler(signum: int, _frame: Any) -> None:
            self.stop_signal = signum
            self.stop_requested.set()

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self._previous_handlers[sig] = signal.signal(sig, handler)

    def restore_signal_handlers(self) -> None:
        for sig, previous in self._previous_handlers.items():
            signal.signal(sig, previous)
        self._previous_handlers.clear()

    # -- watching ------------------------------------------------------------------------
    def poll(self) -> list[Exited]:
        """Children that exited since the last call (each reported once)."""
        out = []
        for child in list(self.children):
            code = child.proc.poll()
            if code is None:
                continue
            self.children.remove(child)
            _signal_group(child.pid, signal.SIGKILL)  # what it left in its group (a JVM)
            expected = child.may_finish and code == 0
            tail = log_tail(child.log_path)
            error = last_error_line(child.log_path)
            out.append(Exited(child.name, code, expected, child.log_path, tail, error))
        return out

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds`` or until a stop is requested; True when one was."""
        return self.stop_requested.wait(seconds)

    # -- stopping ------------------------------------------------------------------------
    def stop_all(self) -> float:
        """Stop children, then services; return how long it took, seconds."""
        t0 = time.monotonic()
        live = [c for c in self.children if c.proc.poll() is None]
        for child in reversed(live):  # the simulator first, the streaming job last
            _signal_group(child.pid, signal.SIGTERM)
        deadline = t0 + self.grace_s
        for child in live:
            left = max(0.0, deadline - time.monotonic())
            try:
                child.proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                _signal_group(child.pid, signal.SIGKILL)
                child.proc.wait(timeout=10)
        for child in self.children:
            # whatever the leader left in its group (a JVM, Python workers) goes too
            _signal_group(child.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=1)
        self.children.clear()
        for _name, service in reversed(self.services):
            service.stop(timeout_s=self.grace_s)
        self.services.clear()
        return time.monotonic() - t0


_ERROR_LINE = re.compile(r"^([\w.]+)?(Error|Exception|Exit|Interrupt)\b.*")


def last_error_line(log_path: Path, max_bytes: int = 500_000) -> str:
    """The last line that looks like an exception (``TypeError: ...``) in the end of a log."""
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    found = ""
    for line in text.splitlines():
        if _ERROR_LINE.match(line):
            found = line.strip()
    return found[:500]


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_members(pgids: Sequence[int]) -> list[int]:
    """Live (non-zombie) pids whose process group is one of ``pgids`` (Linux ``/proc``)."""
    wanted = set(pgids)
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, pgrp = fields[0], int(fields[2])
        if pgrp in wanted and state not in ("Z", "X"):
            out.append(int(entry.name))
    return out
