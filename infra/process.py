"""Child-process plumbing shared by the embedded services.

Why a module of its own: both the Kafka-protocol broker and Redis must be started the same careful
way, so that a test run or a demo never leaves a server behind holding a port:

* every child runs in its own session / process group, so one ``killpg`` reaches anything it
  forks and a Ctrl-C in the terminal does not hit it before we stop it in order;
* with ``die_with_parent=True`` the child asks the Linux kernel (``prctl(PR_SET_PDEATHSIG)``) to
  send it SIGKILL when its parent dies, so even ``kill -9`` of the Python caller leaves nothing
  running. Note the kernel ties this to the *thread* that forked the child: start services from
  a long-lived thread (the main thread in pytest and the CLI);
* stopping is SIGTERM to the group, then SIGKILL after a timeout, then a reap, so no zombie and
  no orphan is left.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TypeVar

_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    """Return a loopback TCP port that was free a moment ago.

    The kernel picks it (bind to port 0), so two parallel test sessions do not collide; the small
    race until the server binds it is handled by callers retrying on a new port.
    """
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback TCP ports that were free a moment ago.

    Why not ``free_port()`` n times: each socket is closed before the next is bound, so the
    kernel may hand the same port out twice, and two servers told the same port collide (a
    Spark master whose web UI got its RPC port answered HTTP polls with RPC frames). The
    sockets here stay bound until all n are picked."""
    socks = []
    try:
        for _ in range(n):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def port_accepts(host: str, port: int, timeout_s: float = 0.2) -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _die_with_parent_preexec(parent_pid: int) -> Callable[[], None]:
    """Build a ``preexec_fn`` that makes the child die with ``parent_pid``.

    The ``getppid`` check closes the race where the parent dies between ``fork`` and ``prctl``.
    """
    libc_name = ctypes.util.find_library("c") or "libc.so.6"

    def preexec() -> None:
        libc = ctypes.CDLL(libc_name, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec


def spawn(
    argv: Sequence[str],
    log_path: Path,
    *,
    die_with_parent: bool = True,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session with stdout and stderr appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent_preexec(os.getpid()) if die_with_parent else None,
            env=env,
            cwd=str(cwd) if cwd else None,
            close_fds=True,
        )


def pid_alive(pid: int) -> bool:
    """True when ``pid`` exists and is not a zombie (a zombie holds no port and does no work)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # the state letter follows the parenthesised command name, which may itself hold spaces
    state = stat.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X")


def _signal_group(pid: int, sig: int) -> None:
    """Signal the process group led by ``pid``, falling back to the process alone."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def terminate(proc: subprocess.Popen[bytes] | None, timeout_s: float = 10.0) -> None:
    """Stop a child we started: SIGTERM to its group, SIGKILL after ``timeout_s``, then reap."""
    if proc is None:
        return
    if proc.poll() is None:
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout_s)
    # members of the group that outlived the leader (none expected) go too
    _signal_group(proc.pid, signal.SIGKILL)


def terminate_pid(pid: int, timeout_s: float = 10.0) -> bool:
    """Stop a process that is not our child (``lbctl infra down``): SIGTERM, then SIGKILL.

    Returns True when the process is gone afterwards. We cannot reap a non-child, so we poll.
    """
    if not pid_alive(pid):
        return True
    _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    _signal_group(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return not pid_alive(pid)


def log_tail(log_path: Path, max_bytes: int = 2000) -> str:
    """The end of a log file, for error messages that say why a server did not come up."""
    try:
        data = log_path.read_bytes()
    except OSError:
        return ""
    return data[-max_bytes:].decode("utf-8", errors="replace")


_T = TypeVar("_T", bound="StartStop")


class StartStop:
    """``with`` support for the services and clusters started from Python: ``start()`` on
    entry, ``stop()`` on exit, also when the body raised, so nothing is left running."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self: _T) -> _T:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
