"""``lbctl health PROCESS``: a health probe that means "making progress", not "process is up".

Why a probe of its own: a streaming job whose batches stopped, or a controller stuck on a Kafka
or Redis outage, still has a running process and an open metrics port, so "the port answers"
says nothing. Each process has one record that moves only when it does useful work:

* ``stream``: the id of the last batch the job committed, ``P:stream:progress`` field ``batch``
  in Redis (written by ``metadata_store.progress.RedisProgress`` in the same transaction as the load
  snapshot, so a batch counts only once its results are in Redis);
* ``control``: every controller in the process registry in Redis (``P:processes``, written by
  the controller loop every second, ``lbctl.health_control``): its loop beats, its last lease
  sweep, and its consumer group's committed offsets on the decisions topic (nothing unread, or
  offsets moving). A sweep needs only Redis, so a controller cut off from Kafka still sweeps:
  the offsets catch it. No metrics port is needed; ``--metrics-url`` probes
  ``lbctl_control_sweeps_total`` there instead;
* ``simulate``: ``lbctl_simulator_cycles_total``; ``agent``: ``lbctl_agent_checks_total``.

The stream's record carries the job's own wall-clock commit time (``wall_ms``), so a stopped
job is judged by how long ago it committed. The metrics counters carry no time, so for them the
probe remembers, in a small state file, when it first saw the current value: the process is
healthy while the value changed within ``--max-age-s`` (the first reading counts as fresh).
No record yet is unhealthy, which a container's start period absorbs. ``--json`` prints the
verdict, its message and each check as one JSON document.

A job runs a batch only when reports arrive, so an unchanged batch id is also what an idle job
shows (brokers report on a 10 % change or at least every
``loadBalancerReportUpdateMaxIntervalMinutes``). With ``--checkpoint`` (the probe runs where the
job's Spark checkpoint is readable) the probe tells the two apart: it compares the offsets of
the job's last committed batch with the end of the load-reports topic, and an unchanged batch
with nothing unread is idle, so healthy; with reports unread it is stuck, and the message says
how many. Without a checkpoint, or when Kafka does not answer, an unchanged batch is judged by
its age alone.

When a Redis is known (``--redis-url`` or ``redisUrl``), the probe also prints one
``placement:`` line per namespace that the placement policies leave with no eligible live
broker (``lbctl.policy_check``), naming the namespace and the policy; those lines leave the
exit status alone, since the process is not at fault. It also prints the Redis settings
ownership depends on (``maxmemory-policy``, ``appendonly``/``appendfsync``, ``save``) and
their verdict (``lbctl.health_redis``): a ``maxmemory-policy`` that may evict keys, unless
``redisAllowEvictingPolicy`` allows it, makes the process unhealthy; no persistence or an
unreadable ``CONFIG`` is a warning line.

Exit status 0 healthy, 1 not healthy (also for a bad option or an unreachable Redis or endpoint:
container engines reserve status 2); one line on stdout says why.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import redis
from prometheus_client.parser import text_string_to_metric_families

from infra.config_loading import add_config_arguments, kafka_security, load_from_args
from infra.redis_client import PROBE_TIMEOUT_S, connect
from lbctl import health_control, health_redis
from lbctl.monitor import broker_row
from lbctl.monitor_lag import LagProbe
from lbctl.policy_check import policy_problems
from loadbalance.config import ConfigError, LoadBalancerConfig, redact_url
from loadbalance.errors import LoadBalancerError
from metadata_store.load_snapshot import decode_broker_docs
from metadata_store.ownership_redis import RedisStore
from metadata_store.progress import RedisProgress

HEALTHY, UNHEALTHY = 0, 1

#: The counter that moves when each metrics-probed process does a unit of work.
PROGRESS_COUNTERS = {
    "control": "lbctl_control_sweeps_total",
    "simulate": "lbctl_simulator_cycles_total",
    "agent": "lbctl_agent_checks_total",
}
DEFAULT_MAX_AGE_S = {"stream": 300.0, "control": 60.0, "simulate": 60.0, "agent": 120.0}


@dataclass(frozen=True)
class Seen:
    """The progress value last seen and the wall time (ms) it was first seen at."""

    value: str
    since_ms: int


@dataclass(frozen=True)
class Verdict:
    healthy: bool
    message: str
    seen: Seen | None  # what to remember for the next probe (None: forget)


def judge(previous: Seen | None, value: str | None, now_ms: int, max_age_ms: int) -> Verdict:
    """Healthy while the progress value changed within ``max_age_ms``.

    ``value`` None means the process has recorded no progress at all. A value different from
    the previous one (including a counter that restarted lower) is progress now; the same value
    is progress as old as when it was first seen. A ``since_ms`` in the future (the wall clock
    went back) is treated as now, so a clock step never makes a live process unhealthy.
    """
    if value is None:
        return Verdict(False, "no progress recorded yet", None)
    if previous is None or previous.value != value:
        return Verdict(True, f"progress: {value} (new)", Seen(value, now_ms))
    since_ms = min(previous.since_ms, now_ms)
    age_s = (now_ms - since_ms) / 1000
    seen = Seen(value, since_ms)
    if now_ms - since_ms <= max_age_ms:
        return Verdict(True, f"progress: {value} (unchanged for {age_s:.0f} s)", seen)
    return Verdict(
        False,
        f"no progress for {age_s:.0f} s (still {value}; limit {max_age_ms / 1000:.0f} s)",
        seen,
    )


def with_input_position(verdict: Verdict, unread: int | None, topic: str) -> Verdict:
    """Refine a stream verdict with how many reports the job has not read (None: unknown).

    Only a stale batch changes: with nothing unread the job is idle, not stuck, and is
    healthy; the value and the time it was first seen are kept either way, so the job is
    judged stuck as soon as reports arrive and the batch still does not move."""
    if verdict.healthy or verdict.seen is None or unread is None:
        return verdict
    if unread == 0:
        return Verdict(
            True,
            f"idle: {verdict.seen.value} unchanged, every report on {topic} read",
            verdict.seen,
        )
    return Verdict(False, f"{verdict.message}; {unread} reports unread on {topic}", verdict.seen)


def load_seen(path: Path) -> Seen | None:
    """The previous probe's memory; a missing or unreadable file is no memory."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        return Seen(str(doc["value"]), int(doc["since_ms"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_seen(path: Path, seen: Seen | None) -> None:
    """Replace the memory atomically (two probes overlapping never leave half a file)."""
    if seen is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"value": seen.value, "since_ms": seen.since_ms}, f)
    os.replace(tmp, path)


def default_state_file(process: str, source: str) -> Path:
    """One file per process and source, named by a hash (a URL may hold a password)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"lbctl-health-{process}-{digest}.json"


def stream_progress(client: Any, prefix: str) -> str | None:
    """The last committed batch id, as ``metadata_store.progress.RedisProgress`` writes it."""
    batch = RedisProgress(client, prefix).last_batch()
    return None if batch is None else f"batch {batch}"


def counter_total(metrics_text: str, sample_name: str) -> float | None:
    """Sum of a counter's samples over all label sets; None if the exposition lacks it."""

    total, found = 0.0, False
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == sample_name:
                total += sample.value
                found = True
    return total if found else None


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "health",
        help="health probe: is a process making progress (for container health checks)",
        description="Exit 0 if PROCESS made progress within --max-age-s, else 1. stream: the "
        "last batch the job committed to Redis, by the job's own clock. control: every "
        "controller registered in Redis: its loop, its last lease sweep, and its consumer "
        "group's offsets on the decisions topic (no decision unread, or offsets moving); no "
        "port needed. simulate, agent: their progress counter on --metrics-url "
        "(lbctl_simulator_cycles_total, lbctl_agent_checks_total). The probe remembers what it "
        "saw last in --state-file. --json prints the verdict and every check.",
    )
    p.add_argument("process", choices=("stream", *PROGRESS_COUNTERS))
    p.add_argument(
        "--max-age-s",
        type=float,
        default=None,
        help="longest time without progress that is still healthy (default: stream 300, "
        "control 60, simulate 60, agent 120)",
    )
    p.add_argument("--redis-url", default=None, help="stream: Redis URL (default: config)")
    p.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="stream: the job's Spark checkpoint folder, where the probe can read it; an "
        "unchanged batch with every report on the topic read is then idle (healthy), one with "
        "reports unread is stuck (needs kafkaBootstrapServers)",
    )
    p.add_argument(
        "--metrics-url",
        default=None,
        help="simulate, agent (and control, instead of the registry): the process's metrics "
        "URL, e.g. http://127.0.0.1:9402/metrics",
    )
    p.add_argument(
        "--bootstrap-servers",
        default=None,
        help="control: Kafka, to check the controllers' consumption (default: config "
        "kafkaBootstrapServers)",
    )
    p.add_argument("--json", action="store_true", help="print the verdict and every check as JSON")
    p.add_argument(
        "--state-file",
        type=Path,
        default=None,
        help="where the probe remembers the last value it saw (default: a file in the temp dir "
        "named after the process and source)",
    )
    add_config_arguments(p)
    p.set_defaults(func=run_health)


def run_health(args: argparse.Namespace) -> int:
    max_age_s = args.max_age_s if args.max_age_s is not None else DEFAULT_MAX_AGE_S[args.process]
    checks: list[dict[str, Any]] = []
    try:
        if args.process == "control" and args.metrics_url is None:
            verdict, checks = _control_from_registry(args, max_age_s)
            return _report(args, verdict, checks)
        if args.process == "stream":
            config = _stream_config(args)
            value, source, wall = _read_stream(args, config)
        else:
            if args.metrics_url is None:
                raise _ProbeError("pass --metrics-url (the process's /metrics endpoint)")
            value, source = _read_counter(args.metrics_url, PROGRESS_COUNTERS[args.process])
    except _ProbeError as e:
        return _report(args, Verdict(False, str(e), None), checks)
    state_file = args.state_file or default_state_file(args.process, source)
    now_ms = int(time.time() * 1000)
    verdict = judge(load_seen(state_file), value, now_ms, int(max_age_s * 1000))
    if args.process == "stream":
        verdict = by_job_clock(verdict, wall, now_ms, max_age_s)
        if args.checkpoint is not None:
            verdict = _with_stream_input(verdict, args.checkpoint, config)
    try:
        save_seen(state_file, verdict.seen)
    except OSError as e:  # a probe that cannot remember cannot detect a stall: say so
        verdict = Verdict(False, f"cannot write {state_file}: {e.strerror}", None)
    return _report(args, verdict, checks)


def by_job_clock(verdict: Verdict, wall_ms: int | None, now_ms: int, max_age_s: float) -> Verdict:
    """The stream's verdict from the job's own commit time, when it records one: a job that
    stopped is judged by how long ago it committed, not by when this probe first looked."""
    if wall_ms is None or verdict.seen is None:
        return verdict
    age_s = max(0.0, (now_ms - wall_ms) / 1000)
    value = verdict.seen.value
    if age_s <= max_age_s:
        return Verdict(True, f"progress: {value} committed {age_s:.0f} s ago", verdict.seen)
    return Verdict(
        False,
        f"no progress for {age_s:.0f} s (still {value}, by the job's clock; limit "
        f"{max_age_s:.0f} s)",
        verdict.seen,
    )


def _report(args: argparse.Namespace, verdict: Verdict, checks: list[dict[str, Any]]) -> int:
    """Print the verdict (one line, or ``--json``) and the placement lines; the exit status."""
    placement, settings = _redis_views(args)
    if settings is not None and settings.refusal and verdict.healthy:
        verdict = replace(verdict, healthy=False, message=f"redis: {settings.refusal}")
    state = "healthy" if verdict.healthy else "unhealthy"
    if args.json:
        doc = {"process": args.process, "healthy": verdict.healthy, "message": verdict.message,
               "checks": checks, "placement": placement,
               "redis": settings.as_dict() if settings is not None else None}  # fmt: skip
        print(json.dumps(doc, sort_keys=True))
    else:
        print(f"{args.process}: {state}: {verdict.message}")
        for line in placement:
            print(f"placement: {line}")
        for line in settings.lines() if settings is not None else []:
            print(line)
    return HEALTHY if verdict.healthy else UNHEALTHY


def _redis_client(url: str, config: LoadBalancerConfig) -> redis.Redis:
    """A client for a health probe: the configuration's credentials and TLS, and 5 s
    timeouts, so a Redis that does not answer is a verdict rather than a hang."""
    return connect(
        url,
        config,
        purpose="health",
        socket_timeout=PROBE_TIMEOUT_S,
        socket_connect_timeout=PROBE_TIMEOUT_S,
    )


def _redis_views(args: argparse.Namespace) -> tuple[list[str], health_redis.RedisCheck | None]:
    """The placement lines and the Redis settings with their verdict, over one client, when
    a Redis is known (nothing otherwise). A Redis that does not answer the settings read is
    not asked for the placement lines: one probe timeout, not two."""
    try:
        config = load_from_args(args, quiet=True)
    except ConfigError:
        return [], None
    url = args.redis_url or config.redis_url
    if not url:
        return [], None
    client = _redis_client(url, config)
    try:
        settings = health_redis.inspect(client, url, config)
        placement = _policy_lines(client, config) if settings.error is None else []
    finally:
        client.close()
    return placement, settings


def _control_from_registry(
    args: argparse.Namespace, max_age_s: float
) -> tuple[Verdict, list[dict[str, Any]]]:
    """Every registered controller's loop, sweeps and consumption (``lbctl.health_control``)."""
    config = _stream_config(args)
    url = args.redis_url or config.redis_url
    if not url:
        raise _ProbeError("no Redis: pass --redis-url or set redisUrl (or pass --metrics-url)")
    client = _redis_client(url, config)
    try:
        entries = health_control.live_controllers(
            RedisStore(client, config.redis_key_prefix).processes.entries("control")
        )
    except redis.RedisError as e:
        raise _ProbeError(f"Redis at {redact_url(url)}: {e}") from None
    finally:
        client.close()
    now_ms = health_control.wall_ms()
    report = health_control.ControlReport(health_control.judge_entries(entries, now_ms, max_age_s))
    bootstrap = args.bootstrap_servers or config.kafka_bootstrap_servers
    state_file = args.state_file or default_state_file("control", f"{url}|{bootstrap}")
    if entries and bootstrap:
        seen = load_seen(state_file)
        check, total = health_control.consumption(
            bootstrap, config.decisions_topic, str(entries[0].doc.get("group") or "lb-controller"),
            kafka_security(config) or None,
            previous_committed=int(seen.value) if seen and seen.value.isdigit() else None,
            previous_since_ms=seen.since_ms if seen else None, now_ms=now_ms, max_age_s=max_age_s,
        )  # fmt: skip
        report.checks.append(check)
        if total is not None and (seen is None or seen.value != str(total)):
            _save_quietly(state_file, Seen(str(total), now_ms))
    elif entries:
        report.checks.append(health_control.Check("consumption", False, "no Kafka to check: "
                             "pass --bootstrap-servers or set kafkaBootstrapServers"))  # fmt: skip
    checks = [c.as_dict() for c in report.checks]
    for e in entries:
        checks.append({"name": f"{e.id} entry", "ok": True, "detail": "registered",
                       "entry": dict(e.doc)})  # fmt: skip
    return Verdict(report.healthy, report.message, None), checks


def _save_quietly(path: Path, seen: Seen) -> None:
    # unwritable: the next probe compares with an older total, still right, only slower
    with contextlib.suppress(OSError):
        save_seen(path, seen)


def _policy_lines(client: redis.Redis, config: LoadBalancerConfig) -> list[str]:
    """Namespaces the placement policies leave with no eligible live broker (``P:policies``
    against the registry); nothing when they cannot be read. They do not
    change the exit status: the process is not at fault, and restarting it would not help."""
    try:
        store = RedisStore(client, config.redis_key_prefix, clock="server")
        live = store.live_brokers(store.server_time_ms())
        usage = {
            name: broker_row(name, doc, 0).max_pct
            for name, doc in decode_broker_docs(
                store.load_snapshot.broker_docs_raw(), skip_unreadable=True
            ).items()
        }
        return policy_problems(store, live, usage)
    except (redis.RedisError, LoadBalancerError, ValueError):
        return []


class _ProbeError(Exception):
    """The progress record could not be read at all."""


def _stream_config(args: argparse.Namespace) -> LoadBalancerConfig:
    try:
        return load_from_args(args, quiet=True)
    except ConfigError as e:
        raise _ProbeError(str(e)) from None


def _read_stream(
    args: argparse.Namespace, config: LoadBalancerConfig
) -> tuple[str | None, str, int | None]:
    url = args.redis_url or config.redis_url
    if not url:
        raise _ProbeError("no Redis: pass --redis-url or set redisUrl")
    client = _redis_client(url, config)
    try:
        value = stream_progress(client, config.redis_key_prefix)
        wall = RedisProgress(client, config.redis_key_prefix).committed_wall_ms()
    except redis.RedisError as e:
        raise _ProbeError(f"Redis at {redact_url(url)}: {e}") from None
    except ValueError as e:
        raise _ProbeError(f"unreadable stream progress: {e}") from None
    finally:
        client.close()
    return value, f"{url}|{config.redis_key_prefix}", wall


def _with_stream_input(verdict: Verdict, checkpoint: Path, config: LoadBalancerConfig) -> Verdict:
    """``with_input_position`` with the job's unread reports (``lbctl monitor``'s lag probe),
    read only for a stale batch (a Kafka round trip per probe otherwise buys nothing)."""
    if verdict.healthy or verdict.seen is None:
        return verdict
    if not config.kafka_bootstrap_servers:
        return replace(verdict, message=f"{verdict.message}; set kafkaBootstrapServers to compare")
    topic = config.load_reports_topic
    lag = LagProbe(
        config.kafka_bootstrap_servers, topic, kafka_security(config) or None, checkpoint
    )()
    if lag.error:  # Kafka away: the age alone decides
        return replace(verdict, message=f"{verdict.message}; Kafka unreadable: {lag.error}")
    if lag.processed_offsets is None:
        return replace(verdict, message=f"{verdict.message}; no committed batch in {checkpoint}")
    return with_input_position(verdict, lag.records, topic)


def _read_counter(url: str, sample_name: str) -> tuple[str | None, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError) as e:
        raise _ProbeError(f"metrics at {redact_url(url)} unreachable: {e}") from None
    try:
        total = counter_total(text, sample_name)
    except ValueError as e:
        raise _ProbeError(f"metrics at {redact_url(url)} unreadable: {e}") from None
    value = None if total is None else f"{sample_name} {total:g}"
    return value, url
