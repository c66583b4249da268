"""``lbctl infra up|down|status``: the embedded Apache Kafka broker and Redis for a demo.

Why: a user on a fresh machine (no Docker) needs one command that brings up the services the
product talks to and tells them where they are. ``up`` starts Apache Kafka (KRaft) and Redis in
the background, detached from the terminal (they outlive the command, unlike the test
fixtures), and records their pids, ports and URLs in ``<state-dir>/state.json``; ``status``
reads it back and checks the processes; ``down`` stops them (SIGTERM, then SIGKILL) and removes
the state file.

Kafka keeps its log under ``<state-dir>/kafka-1``. Redis runs with an
append-only file under ``<state-dir>/redis-data`` unless ``--no-redis-aof`` is given.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from infra.embedded import EmbeddedKafka, EmbeddedRedis, ServiceError
from infra.process import pid_alive, port_accepts, terminate_pid

__all__ = ["register", "run", "run_down", "run_status", "run_up"]

DEFAULT_STATE_DIR = Path(".lbctl/infra")
STATE_FILE = "state.json"
# the executable name each service's pid must show, so a recycled pid is never killed
_EXPECTED_COMMAND = {"kafka": "java", "redis": "redis-server"}


HELP = """\
Start, stop or inspect an embedded Apache Kafka broker (KRaft) and Redis for a demo on a
machine without Docker.

  up      start both services in the background on free loopback ports and print their
          addresses; pids, ports and URLs are kept in <state-dir>/state.json
  status  say which services are running (exit status 3 if not all are)
  down    stop them (SIGTERM, then SIGKILL) and remove the state file

Kafka keeps its log under <state-dir>/kafka-1. Redis writes an append-only file under
<state-dir>/redis-data unless --no-redis-aof is given.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``infra`` with the verbs ``up``, ``down`` and ``status``."""
    parser = subparsers.add_parser(
        "infra",
        help="start, stop or inspect the embedded Apache Kafka broker and Redis",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = parser.add_subparsers(dest="infra_verb", metavar="VERB", required=True)
    for name, help_text in (
        ("up", "start both services in the background and print where they listen"),
        ("down", "stop the services started by 'up'"),
        ("status", "say which services are running (exit code 3 if not all are)"),
    ):
        verb = verbs.add_parser(name, help=help_text, description=help_text)
        verb.add_argument(
            "--state-dir",
            type=Path,
            default=DEFAULT_STATE_DIR,
            help=f"folder for the state file, logs and Redis data (default {DEFAULT_STATE_DIR})",
        )
        verb.add_argument("--json", action="store_true", help="print machine-readable JSON")
        if name == "up":
            verb.add_argument("--kafka-port", type=int, help="Kafka port (default: a free one)")
            verb.add_argument("--redis-port", type=int, help="Redis port (default: a free one)")
            verb.add_argument("--redis-password", help="require this password (requirepass)")
            verb.add_argument(
                "--no-redis-aof",
                action="store_true",
                help="run Redis without its append-only file (nothing survives a restart)",
            )
        verb.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Dispatch to the verb's handler."""
    handlers = {"up": run_up, "down": run_down, "status": run_status}
    return handlers[args.infra_verb](args)


def _state_path(state_dir: Path) -> Path:
    return Path(state_dir) / STATE_FILE


def load_state(state_dir: Path) -> dict[str, Any]:
    """The recorded services, or ``{}`` when nothing was started."""
    try:
        return json.loads(_state_path(state_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _write_state(state_dir: Path, state: dict[str, Any]) -> None:
    path = _state_path(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True), encoding="utf-8")
    tmp.replace(path)


def _is_our_process(name: str, pid: int | None) -> bool:
    """True when ``pid`` is alive and still runs the service's executable."""
    if not pid or not pid_alive(pid):
        return False
    try:  # comm, not cmdline: redis-server rewrites its argv into a process title
        comm = Path(f"/proc/{pid}/comm").read_text(encoding="utf-8").strip()
    except OSError:
        return False
    return _EXPECTED_COMMAND[name].startswith(comm) and bool(comm)


def service_status(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """name -> recorded entry plus ``running`` (process alive and port answering)."""
    result = {}
    for name in ("kafka", "redis"):
        entry = dict(state.get(name) or {})
        entry["running"] = bool(
            entry
            and _is_our_process(name, entry.get("pid"))
            and port_accepts("127.0.0.1", int(entry["port"]))
        )
        result[name] = entry
    return result


def _print(args: argparse.Namespace, payload: dict[str, Any], lines: list[str]) -> None:
    if getattr(args, "json", False):
        print(json.dumps(payload, indent=2, sort_keys=True))
    else:
        print("\n".join(lines))


def run_up(args: argparse.Namespace) -> int:
    """Start whatever is not running yet; print the bootstrap servers and the Redis URL."""
    state_dir = Path(args.state_dir).resolve()
    state = load_state(state_dir)
    current = service_status(state)
    log_dir = state_dir / "logs"
    started: list[Any] = []
    try:
        if not current["kafka"]["running"]:
            kafka = EmbeddedKafka(log_dir, getattr(args, "kafka_port", None), die_with_parent=False)
            kafka.start()
            started.append(kafka)
            state["kafka"] = {
                "pid": kafka.pid,
                "port": kafka.port,
                "bootstrap_servers": kafka.bootstrap_servers,
                "log": str(kafka.log_path),
            }
        if not current["redis"]["running"]:
            redis_server = EmbeddedRedis(
                log_dir,
                getattr(args, "redis_port", None),
                appendonly=not getattr(args, "no_redis_aof", False),
                data_dir=state_dir / "redis-data",
                password=getattr(args, "redis_password", None),
                die_with_parent=False,
            )
            redis_server.start()
            started.append(redis_server)
            state["redis"] = {
                "pid": redis_server.pid,
                "port": redis_server.port,
                "url": redis_server.url,
                "log": str(redis_server.log_path),
                "appendonly": redis_server.appendonly,
                "data_dir": str(redis_server.data_dir),
            }
    except ServiceError as exc:
        for service in started:  # all or nothing: do not leave half a setup running
            service.stop()
        print(f"lbctl infra up: {exc}", file=sys.stderr)
        return 1
    _write_state(state_dir, state)
    payload = {"state_dir": str(state_dir), **service_status(state)}
    _print(
        args,
        payload,
        [
            f"kafka bootstrap servers: {state['kafka']['bootstrap_servers']}"
            f" (pid {state['kafka']['pid']}, in-memory: topics are lost on 'down')",
            f"redis url: {state['redis']['url']} (pid {state['redis']['pid']})",
            f"state: {_state_path(state_dir)}; logs: {log_dir}",
        ],
    )
    return 0


def run_status(args: argparse.Namespace) -> int:
    """Report each service; exit 0 when both run, 3 otherwise (like ``systemctl status``)."""
    state_dir = Path(args.state_dir).resolve()
    status = service_status(load_state(state_dir))
    lines = []
    for name, entry in status.items():
        where = entry.get("bootstrap_servers") or entry.get("url") or "-"
        word = "running" if entry["running"] else "stopped"
        lines.append(f"{name}: {word} {where} (pid {entry.get('pid', '-')})")
    _print(args, {"state_dir": str(state_dir), **status}, lines)
    return 0 if all(entry["running"] for entry in status.values()) else 3


def run_down(args: argparse.Namespace) -> int:
    """Stop the recorded services and forget them; stopping nothing is not an error."""
    state_dir = Path(args.state_dir).resolve()
    state = load_state(state_dir)
    stopped, failed = [], []
    for name in ("kafka", "redis"):
        entry = state.get(name) or {}
        pid = entry.get("pid")
        if not _is_our_process(name, pid):
            continue
        (stopped if terminate_pid(int(pid)) else failed).append(name)
    if failed:
        _write_state(state_dir, {k: v for k, v in state.items() if k in failed})
    else:
        _state_path(state_dir).unlink(missing_ok=True)
    _print(
        args,
        {"stopped": stopped, "failed": failed},
        [f"stopped: {', '.join(stopped) or 'nothing was running'}"]
        + ([f"could not stop: {', '.join(failed)}"] if failed else []),
    )
    return 1 if failed else 0
