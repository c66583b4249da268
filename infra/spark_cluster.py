"""A Spark standalone cluster on loopback, started from the pyspark package's own launcher.

Why: the streaming job must run unchanged on a real cluster, where each executor is its own JVM
with its own Python workers, state is written by executors on other processes than the driver,
and the driver reaches Kafka and Redis from elsewhere than the tasks do. ``local[N]`` hides all
of that (one JVM), so the test suite starts a real master and real workers here, the way
``sbin/start-master.sh`` would on a machine of the cluster, but with no install beyond the
pyspark wheel (docs/architecture.md, Constraints):

* ``SPARK_HOME`` is the pyspark package folder, whose ``bin/spark-class`` runs
  ``org.apache.spark.deploy.master.Master`` and ``...deploy.worker.Worker``;
* every port (the master's RPC and web UI, each worker's web UI) is a free loopback port, and
  ``SPARK_LOCAL_IP=127.0.0.1`` keeps every JVM, executors and drivers included, on loopback;
* each worker has its own ``SPARK_WORKER_DIR`` (executors' logs and scratch files) under the
  cluster's folder, and ``SPARK_CONF_DIR`` is an empty folder there, so no ``spark-env.sh`` or
  ``spark-defaults.conf`` of the machine leaks in;
* readiness is the master's web UI JSON (``/json/``): ``status`` ALIVE, then every worker
  registered and ALIVE. The master's log line ("I have been elected leader") says the same
  thing later than the UI can be asked;
* every JVM runs in its own process group and dies with its parent (``infra.process.spawn``); a
  worker's executors run in the worker's group, so stopping a worker's group stops them too, and
  an executor whose worker vanished exits by itself (Spark's worker watcher). ``stop()`` stops the
  workers, then the master, and is called on any failure during ``start()``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from infra.process import (
    StartStop,
    free_port,
    free_ports,
    log_tail,
    pid_alive,
    spawn,
    terminate,
)

__all__ = ["SparkClusterError", "StandaloneCluster", "spark_home"]

HOST = "127.0.0.1"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


class SparkClusterError(RuntimeError):
    """The cluster did not come up (the message has the logs' ends) or misbehaved."""


def spark_home() -> Path:
    """``$SPARK_HOME`` if set, else the installed pyspark package folder (it has ``bin/``)."""
    override = os.environ.get("SPARK_HOME")
    if override:
        return Path(override)
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise SparkClusterError("pyspark is not installed; it ships Spark's launcher")
    return Path(next(iter(spec.submodule_search_locations)))


class StandaloneCluster(StartStop):
    """One master and ``workers`` workers on 127.0.0.1, each worker offering ``cores`` cores and
    ``memory`` to executors. ``with StandaloneCluster(folder) as c: ... c.master_url ...``.

    ``daemon_memory`` is the heap of the master and worker JVMs themselves (they only schedule;
    Spark's default of 1 GB each is for clusters with hundreds of applications).
    """

    def __init__(
        self,
        folder: Path,
        workers: int = 2,
        *,
        cores: int = 1,
        memory: str = "1g",
        daemon_memory: str = "256m",
        start_timeout_s: float = 90.0,
        die_with_parent: bool = True,
    ) -> None:
        if workers < 1 or cores < 1:
            raise ValueError(f"need at least one worker and one core, got {workers}, {cores}")
        self.folder = Path(folder)
        self.n_workers = workers
        self.cores = cores
        self.memory = memory
        self.daemon_memory = daemon_memory
        self.start_timeout_s = start_timeout_s
        self.die_with_parent = die_with_parent
        self._master: subprocess.Popen[bytes] | None = None
        self._workers: list[subprocess.Popen[bytes]] = []
        self._port: int | None = None
        self._ui_port: int | None = None
        self._groups: list[int] = []  # process groups started, kept after stop() for alive()

    # --- where things are -----------------------------------------------------------------

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:PORT``, the ``--master`` of a driver."""
        if self._port is None:
            raise SparkClusterError("the cluster has not been started")
        return f"spark://{HOST}:{self._port}"

    @property
    def ui_url(self) -> str:
        """The master's web UI (``/json/`` there is the cluster's state)."""
        if self._ui_port is None:
            raise SparkClusterError("the cluster has not been started")
        return f"http://{HOST}:{self._ui_port}"

    @property
    def log_dir(self) -> Path:
        return self.folder / "logs"

    def worker_dir(self, index: int) -> Path:
        """Worker ``index``'s ``SPARK_WORKER_DIR``: ``<app id>/<executor id>/stderr`` and
        ``stdout`` of each executor it ran, and the executors' scratch files."""
        return self.folder / f"worker-{index}"

    @property
    def pids(self) -> list[int]:
        """Process ids of the master and worker JVMs (each leads its own process group)."""
        procs = ([self._master] if self._master else []) + self._workers
        return [p.pid for p in procs]

    def driver_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment for a driver process of this cluster: loopback addresses and the
        current interpreter for every Python worker (executors run ``PYSPARK_PYTHON``, which
        the driver names in each task; on a real cluster that path must exist on every
        machine)."""
        env = dict(os.environ if base is None else base)
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_LOCAL_IP=HOST,
            SPARK_CONF_DIR=str(self._conf_dir()),
            PYSPARK_PYTHON=sys.executable,
            PYSPARK_DRIVER_PYTHON=sys.executable,
        )
        return env

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the master and the workers; return once every worker is registered ALIVE.

        Anything started is stopped again if the cluster does not come up."""
        if self._master is not None:
            return
        try:
            self._start_master()
            for i in range(self.n_workers):
                self._start_worker(i)
            self._wait(lambda s: _alive_workers(s) >= self.n_workers, "workers registered")
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop the workers (and with them their executors), then the master; idempotent."""
        for proc in self._workers:
            terminate(proc, timeout_s)
        self._workers = []
        terminate(self._master, timeout_s)
        self._master = None

    def alive(self) -> list[int]:
        """Pids still running in the process groups this cluster started: the master, the
        workers, their executors and the executors' Python workers. Empty after ``stop()``."""
        groups = set(self._groups)
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                pgid = os.getpgid(int(entry.name))
            except OSError:
                continue
            if pgid in groups and pid_alive(int(entry.name)):
                found.append(int(entry.name))
        return sorted(found)

    def state(self) -> dict[str, Any]:
        """The master's view of the cluster (its web UI's ``/json/``): ``status``, ``workers``
        (each with ``state``, ``cores``, ``coresused``), ``activeapps``, ``completedapps``."""
        with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=5) as response:
            return dict(json.load(response))

    # --- internals ------------------------------------------------------------------------

    def _conf_dir(self) -> Path:
        path = self.folder / "conf"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _daemon_env(self, extra: dict[str, str]) -> dict[str, str]:
        env = self.driver_env()
        env.update(SPARK_DAEMON_MEMORY=self.daemon_memory, SPARK_LOG_DIR=str(self.log_dir))
        env.update(extra)
        return env

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        launcher = spark_home() / "bin" / "spark-class"
        proc = spawn(
            [str(launcher), *argv],
            self.log_dir / f"{name}.log",
            die_with_parent=self.die_with_parent,
            env=env,
            cwd=self.folder,
        )
        self._groups.append(proc.pid)  # spawn() made it a session (and group) leader
        return proc

    def _start_master(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._port, self._ui_port = free_ports(2)
        argv = [MASTER_CLASS, "--host", HOST, "--port", str(self._port)]
        argv += ["--webui-port", str(self._ui_port)]
        self._master = self._spawn("master", argv, self._daemon_env({}))
        self._wait(lambda s: s.get("status") == "ALIVE", "master ALIVE")

    def _start_worker(self, index: int) -> None:
        work_dir = self.worker_dir(index)
        work_dir.mkdir(parents=True, exist_ok=True)
        argv = [WORKER_CLASS, self.master_url, "--host", HOST]
        argv += ["--cores", str(self.cores), "--memory", self.memory]
        argv += ["--webui-port", str(free_port()), "--work-dir", str(work_dir)]
        env = self._daemon_env({"SPARK_WORKER_DIR": str(work_dir)})
        self._workers.append(self._spawn(f"worker-{index}", argv, env))

    def _wait(self, ready: Any, what: str) -> None:
        """Poll the master's ``/json/`` until ``ready(state)``; raise with the logs if a JVM
        exits or the time is up."""
        deadline = time.monotonic() + self.start_timeout_s
        last = "no answer yet"
        while time.monotonic() < deadline:
            for name, proc in self._named_procs():
                code = proc.poll()
                if code is not None:
                    raise self._error(f"{name} exited with code {code} (waiting for {what})")
            try:
                if ready(self.state()):
                    return
                last = "not yet"
            except (OSError, urllib.error.URLError, ValueError) as e:
                last = repr(e)
            time.sleep(0.2)
        raise self._error(f"timed out after {self.start_timeout_s:g} s waiting for {what}: {last}")

    def _named_procs(self) -> list[tuple[str, subprocess.Popen[bytes]]]:
        named = [("master", self._master)] if self._master else []
        return named + [(f"worker-{i}", p) for i, p in enumerate(self._workers)]

    def _error(self, message: str) -> SparkClusterError:
        tails = [f"--- {path} ---\n{log_tail(path)}" for path in sorted(self.log_dir.glob("*.log"))]
        return SparkClusterError("\n".join([message, *tails]))


def _alive_workers(state: dict[str, Any]) -> int:
    return sum(1 for w in state.get("workers", ()) if w.get("state") == "ALIVE")
