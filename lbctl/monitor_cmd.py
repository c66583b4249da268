"""``lbctl monitor``: ``pulsar-perf monitor-brokers`` for this product, against any Kafka + Redis.

What it shows (read by ``lbctl.monitor.Monitor``; ``lbctl run`` shows the same view):

* the broker table: one row per broker with the columns of ``pulsar-perf monitor-brokers``
  (SYSTEM: CPU, memory, direct memory, bandwidth in/out and max usage in percent; COUNT: topics,
  bundles, producers, consumers; LATEST: message rates and throughput in/out), bundles being the
  ones the broker holds leases on in Redis. A broker at or above
  ``loadBalancerBrokerOverloadedThresholdPercentage`` is red; one above the balance band (the
  mean times ``loadBalancerBalancedMaxOverMean``) is yellow; one whose reports stopped is dim.
  Narrow terminals (under 120 columns) get the ten most useful columns;
* the latest decisions from the controller's outcome stream: kind, bundle, brokers, the
  policy's reason, the outcome and its reason;
* health: the usage spread against the balance band, leases ending within ``--expiring-within``
  seconds and bundles without a live owner, brokers whose registration expired or whose reports
  fell behind the job's clock, and the streaming job's last batch and Kafka lag.

``--once`` prints one refresh and exits; ``--json`` prints the same data as JSON (one document
per refresh); ``--record FILE.png`` samples broker usage and applied decisions while it runs and
writes a picture at the end (``lbctl.plots``). Pulsar's monitor prints its summary every 60 s;
this one refreshes every ``--refresh-seconds`` (default 2).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import redis
from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from infra.config_loading import add_config_arguments, load_from_args
from lbctl.monitor import DECISION_KINDS, Monitor, Snapshot
from lbctl.monitor_lag import LagProbe
from lbctl.plots import UsageHistory, write_usage_png
from loadbalance.config import ConfigError, redact_url
from loadbalance.values import OutcomeKind

HELP = """\
Watch the cluster as the load balancer sees it, from Redis (and Kafka for the job's lag); the
same view as pulsar-perf monitor-brokers, plus the state of every service.

  services   Kafka and Redis reachable or not, the streaming job's last batch by the job's own
             clock, each controller's last poll and sweep. Anything down or stale is shown in
             red and named on a TROUBLE line.
  brokers    one row per broker: CPU, memory, direct memory, bandwidth in/out and the largest
             of them in percent, topics, bundles owned, producers, consumers, message rates and
             throughput. Red: at or above loadBalancerBrokerOverloadedThresholdPercentage;
             yellow: above the mean times loadBalancerBalancedMaxOverMean; dim: reports
             stopped. Terminals under 120 columns get the ten most useful columns.
  decisions  the latest decisions: kind, bundle, brokers, the measured condition behind the
             decision, and how it ended.
  health     usage spread, leases ending within --expiring-within seconds, bundles without a
             live owner, brokers whose registration expired or whose reports stopped.

--once prints one view and exits (status 1 if Redis does not answer); --json prints the same
data as one JSON document per refresh; --record FILE.png writes a usage picture at the end,
with the periods a service was in trouble shaded. Piped output is never cut to the terminal
width.
"""


WIDE_COLUMNS = 120  # from this terminal width on, every pulsar-perf column is shown
FROZEN_BY = ("kafka", "redis", "stream")  # down or stale: the usage read is not current
PIPED_WIDTH = 400  # piped output: wide enough for every column and the longest status line


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "monitor",
        help="live broker table, latest decisions, lease/registry health and stream lag "
        "(pulsar-perf monitor-brokers)",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--redis-url", default=None, help="Redis URL (default: config redisUrl)")
    p.add_argument(
        "--bootstrap-servers",
        default=None,
        help="Kafka, for the streaming job's lag (default: config kafkaBootstrapServers; "
        "none: no lag)",
    )
    p.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="the streaming job's checkpoint folder, if readable here: gives the lag in records",
    )
    p.add_argument("--refresh-seconds", type=float, default=2.0, help="refresh interval (2)")
    p.add_argument("--once", action="store_true", help="print one refresh and exit")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    p.add_argument(
        "--record", type=Path, default=None, metavar="FILE.png", help="write a usage picture"
    )
    p.add_argument("--decisions", type=int, default=10, help="latest decisions shown (10)")
    p.add_argument(
        "--expiring-within",
        type=float,
        default=None,
        metavar="S",
        help="list leases ending within S seconds (default: a third of the lease TTL)",
    )
    p.add_argument(
        "--stale-after",
        type=float,
        default=None,
        metavar="S",
        help="a broker whose last report is S seconds behind the job's clock is stale "
        "(default: half of loadBalancerBrokerReportTimeoutSeconds)",
    )
    _add_stale_arguments(p)
    add_config_arguments(p)
    p.set_defaults(func=monitor_main)


def _add_stale_arguments(p: argparse.ArgumentParser) -> None:
    """When the job and a controller count as stale (red, on a TROUBLE line)."""
    p.add_argument(
        "--stream-stale-after",
        type=float,
        default=30.0,
        metavar="S",
        help="the streaming job is stale when its last commit, by its own clock, is older than "
        "S seconds while reports wait to be read (default 30)",
    )
    p.add_argument(
        "--control-stale-after",
        type=float,
        default=10.0,
        metavar="S",
        help="a controller is stale when its registry entry (rewritten every second) is older "
        "than S seconds (default 10)",
    )


def build_monitor(
    config: Any,
    redis_url: str,
    *,
    bootstrap: str | None = None,
    checkpoint: Path | None = None,
    expiring_within_s: float | None = None,
    stale_after_s: float | None = None,
    decisions: int = 10,
) -> Monitor:
    """A ``Monitor`` set up from the configuration (thresholds, key prefix, clients)."""

    monitor = Monitor.connect(redis_url, config)
    monitor.kafka_configured = bool(bootstrap)
    if bootstrap:
        monitor.lag_probe = LagProbe(
            bootstrap,
            config.load_reports_topic,
            config.kafka_client_settings() or None,
            checkpoint,
        )
    ttl_s = float(config.load_balancer_ownership_lease_ttl_seconds)
    monitor.expiring_window_s = ttl_s / 3 if expiring_within_s is None else expiring_within_s
    timeout_s = float(config.load_balancer_broker_report_timeout_seconds)
    monitor.stale_after_s = timeout_s / 2 if stale_after_s is None else stale_after_s
    monitor.overloaded_pct = float(config.load_balancer_broker_overloaded_threshold_percentage)
    monitor.balanced_max_over_mean = float(config.load_balancer_balanced_max_over_mean)
    monitor.recent = max(1, decisions)
    return monitor


def monitor_main(args: argparse.Namespace) -> int:
    try:
        config = load_from_args(args)
    except ConfigError as e:
        print(f"lbctl monitor: {e}", file=sys.stderr)
        return 2
    url = args.redis_url or config.redis_url
    if not url:
        print("lbctl monitor: no Redis: pass --redis-url or set redisUrl", file=sys.stderr)
        return 2
    monitor = build_monitor(
        config,
        url,
        bootstrap=args.bootstrap_servers or config.kafka_bootstrap_servers,
        checkpoint=args.checkpoint,
        expiring_within_s=args.expiring_within,
        stale_after_s=args.stale_after,
        decisions=args.decisions,
    )
    monitor.stream_stale_after_s = args.stream_stale_after
    monitor.control_stale_after_s = args.control_stale_after
    try:
        return _loop(args, monitor)
    except redis.ConnectionError as e:
        print(f"lbctl monitor: Redis at {redact_url(url)} unreachable: {e}", file=sys.stderr)
        return 1


def _loop(args: argparse.Namespace, monitor: Monitor) -> int:
    """Refresh until ``--once``, ``--duration`` or Ctrl-C. A Redis that goes away while watching
    (restarted, failed over) costs refreshes, not the monitor: it retries, says so, and still
    writes the picture at the end; only ``--once`` and the first read fail fast."""

    history = UsageHistory() if args.record else None
    t0, start_ms = time.monotonic(), int(time.time() * 1000)
    live = None
    if not (args.json or args.once):
        live = Live(refresh_per_second=1, transient=False)
        live.start()
    snap = None
    try:
        while True:
            elapsed = time.monotonic() - t0
            snap = monitor.read()  # a Redis away is a snapshot that says so
            if history is not None:
                record(history, snap, elapsed, start_ms)
            if args.json:
                print(json.dumps(snap.as_dict(), sort_keys=True), flush=True)
            elif args.once:
                console = output_console()
                console.print(render(snap, "lbctl monitor", width=console.width))
            else:
                live.update(
                    render(snap, f"lbctl monitor: {elapsed:.0f}s", width=live.console.width)
                )
            if args.once or (args.duration is not None and elapsed >= args.duration):
                break
            time.sleep(args.refresh_seconds)
    except KeyboardInterrupt:
        pass
    finally:
        if live is not None:
            live.stop()
    if history is not None and snap is not None:
        written = write_usage_png(
            history, args.record, title="broker usage (lbctl monitor)",
            overloaded_pct=snap.overloaded_pct,
        )  # fmt: skip
        if written:
            print(f"usage picture: {written}", file=sys.stderr)
    redis_down = snap is not None and (svc := snap.service("redis")) is not None and svc.trouble
    return 1 if args.once and redis_down else 0


def output_console() -> Console:
    """A console for one printed view: a terminal's width, or, piped, wide enough that no
    column is cut (rich would assume 80 columns)."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=PIPED_WIDTH, soft_wrap=True)
    return console


def record(history: Any, snap: Snapshot, t_s: float, start_ms: int) -> None:
    """One sample of every broker's max usage, and a marker per decision applied since start.
    Refreshes before the first report (Spark still starting) are not samples. While a service
    is down or stale the sample is a gap, and the trouble is marked, so the picture shows the
    outage instead of the last values drawn flat."""
    history.trouble(t_s, [line.split(":", 1)[0] for line in snap.trouble])
    if any(s.trouble for s in snap.services if s.name in FROZEN_BY):
        history.sample(t_s, {})
    elif snap.rows:
        history.sample(t_s, {r.broker: r.max_pct for r in snap.rows})
    for d in snap.new_decisions:
        if d.outcome == OutcomeKind.APPLIED and d.at_ms >= start_ms:
            history.mark(max(0.0, (d.at_ms - start_ms) / 1000), d.kind)


# -- rendering ------------------------------------------------------------------------------
def _rate(per_s: float) -> str:
    """Compact numbers (``55.8k``), so the table fits a terminal."""
    if per_s >= 1e6:
        return f"{per_s / 1e6:.1f}M"
    if per_s >= 1e3:
        return f"{per_s / 1e3:.1f}k"
    return f"{per_s:.0f}"


def _clock(ms: int | None) -> str:
    return "-" if not ms else time.strftime("%H:%M:%S", time.gmtime(ms / 1000)) + "Z"


def usage_text(s: Snapshot) -> str:
    """Decisions applied by kind, outcomes, and the spread against the balance band."""
    applied = ", ".join(f"{k}s {s.applied.get(k, 0)}" for k in DECISION_KINDS[:3])
    if s.applied.get("merge"):
        applied += f", merges {s.applied['merge']}"
    other = sum(v for k, v in s.outcomes.items() if k != OutcomeKind.APPLIED)
    if s.spread is None:
        spread = "usage: no reports yet"
    else:
        verdict = "balanced" if s.balanced else "not balanced"
        spread = (
            f"usage max/mean {s.spread.max_over_mean:.2f} ({verdict} at <= "
            f"{s.balanced_max_over_mean:.2f}), std {s.spread.std_pct:.1f} pts"
        )
    return f"applied: {applied} (other outcomes {other})  |  {spread}"


def stream_text(s: Snapshot) -> str:
    if s.batch is None:
        text = "stream: no batch yet"
    else:
        age = f", committed {s.batch_age_s:.0f}s ago" if s.batch_age_s is not None else ""
        text = f"stream: batch {s.batch} (event time {_clock(s.batch_event_ms)}{age})"
    lag = s.lag
    if lag is None:
        return text
    if lag.error:
        return f"{text}; Kafka lag unknown: {lag.error}"
    end = sum(lag.end_offsets.values())
    if lag.records is None:
        why = "no committed batch in a readable checkpoint"
        return f"{text}; {lag.topic}: {end} records, lag unknown ({why})"
    return f"{text}; lag {lag.records} records of {end} on {lag.topic}"


def health_text(s: Snapshot) -> list[str]:
    """Lease and registry lines; problems are named, a healthy cluster gets short lines."""
    h = s.health
    if h is None:
        return []
    lines = []
    lease = f"leases: {h.owned}/{h.bundles} bundles owned"
    if h.unowned:
        lease += f", {h.unowned} without a live owner"
    if h.expiring:
        named = ", ".join(f"{e.bundle} ({e.broker}, {e.expires_in_s:.0f}s)" for e in h.expiring[:4])
        more = f" and {len(h.expiring) - 4} more" if len(h.expiring) > 4 else ""
        lease += f"; {len(h.expiring)} ending within {h.expiring_window_s:.0f}s: {named}{more}"
    lines.append(lease)
    reg = f"registry: {len(h.live)}/{len(h.registered)} brokers live"
    if h.registration_expired:
        reg += "; registration expired: " + ", ".join(
            f"{b} ({age:.0f}s since heartbeat)" for b, age in sorted(h.registration_expired.items())
        )
    if h.reports_stale:
        reg += "; reports stopped: " + ", ".join(
            f"{b} ({behind:.0f}s behind the job)" for b, behind in sorted(h.reports_stale.items())
        )
    if h.without_report:
        reg += "; no report yet: " + ", ".join(h.without_report)
    if h.unregistered_reporting:
        reg += "; reporting but not registered: " + ", ".join(h.unregistered_reporting)
    lines.append(reg)
    lines += [f"placement: {problem}" for problem in h.policy_problems]
    return lines


def services_text(s: Snapshot) -> str:
    """One line: each service's state (``kafka up, redis up, stream up (batch 41, 2s ago),
    control host:1 up``); the detail of each one in trouble follows in ``trouble_text``."""
    if not s.services:
        return ""
    parts = []
    for svc in s.services:
        age = f" ({svc.age_s:.0f}s ago)" if svc.age_s is not None and svc.name != "kafka" else ""
        parts.append(f"{svc.name} {svc.state.upper() if svc.trouble else svc.state}{age}")
    return "services: " + ", ".join(parts)


def trouble_text(s: Snapshot) -> list[str]:
    """One ``TROUBLE:`` line per service down or stale."""
    return [f"TROUBLE: {line}" for line in s.trouble]


def footer_text(s: Snapshot) -> str:
    """Every status line, joined with `` | `` (for the plain log line)."""
    lines = [services_text(s), *trouble_text(s), usage_text(s), stream_text(s), *health_text(s)]
    return "  |  ".join(line for line in lines if line)


def _style(s: Snapshot, max_pct: float, broker: str) -> str | None:
    if s.health is not None and broker in s.health.reports_stale:
        return "dim"
    if max_pct >= s.overloaded_pct:
        return "bold red"
    if s.spread is not None and max_pct > s.spread.mean_pct * s.balanced_max_over_mean:
        return "yellow"
    return None


def broker_table(s: Snapshot, title: str, *, wide: bool = False) -> Any:
    """The ``pulsar-perf monitor-brokers`` table, one row per broker."""

    cols = ["broker", "CPU%", "MEM%", *(["DIR%"] if wide else []), "BWin%", "BWout%", "MAX%",
            "topics", "bundles", *(["prod", "cons"] if wide else []), "msg/s in", "msg/s out",
            *(["KB/s in", "KB/s out"] if wide else [])]  # fmt: skip
    table = Table(title=title, expand=False, box=box.SIMPLE_HEAD, padding=(0, 0), pad_edge=False)
    for col in cols:
        table.add_column(col, justify="left" if col == "broker" else "right", no_wrap=True)
    for r in s.rows:
        cells = {
            "broker": r.broker, "CPU%": f"{r.cpu_pct:.1f}", "MEM%": f"{r.memory_pct:.1f}",
            "DIR%": f"{r.direct_memory_pct:.1f}", "BWin%": f"{r.bandwidth_in_pct:.1f}",
            "BWout%": f"{r.bandwidth_out_pct:.1f}", "MAX%": f"{r.max_pct:.1f}",
            "topics": str(r.topics), "bundles": str(r.bundles), "prod": str(r.producers),
            "cons": str(r.consumers), "msg/s in": _rate(r.msg_rate_in),
            "msg/s out": _rate(r.msg_rate_out), "KB/s in": _rate(r.throughput_in_kb_per_s),
            "KB/s out": _rate(r.throughput_out_kb_per_s),
        }  # fmt: skip
        table.add_row(*(cells[c] for c in cols), style=_style(s, r.max_pct, r.broker))
    return table


_OUTCOME_STYLE = {
    OutcomeKind.APPLIED: "green",
    OutcomeKind.REJECTED: "red",
    OutcomeKind.CONFLICT: "red",
    OutcomeKind.DRY_RUN: "cyan",
}


def decisions_table(s: Snapshot) -> Any:
    """The latest decisions, newest first: what, why, and how it ended."""

    table = Table(title="latest decisions", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    for col in ("at", "kind", "bundle", "from -> to", "why", "outcome"):
        table.add_column(col, no_wrap=col != "outcome", overflow="fold")
    for d in s.decisions:
        moved = f"{d.source or '-'} -> {d.destination}" if d.destination else d.source or "-"
        outcome = d.outcome + (f": {d.reason}" if d.reason else "")
        style = _OUTCOME_STYLE.get(d.outcome, "dim")
        table.add_row(_clock(d.at_ms), d.kind, d.bundle, moved,
                      d.condition or d.decision_reason or "-",
                      f"[{style}]{outcome}[/]")  # fmt: skip
    return table


def render(s: Snapshot, title: str, *, width: int = 80) -> Any:
    """The whole view: broker table, status lines, latest decisions."""

    parts: list[Any] = [broker_table(s, title, wide=width >= WIDE_COLUMNS)]
    if s.services:
        style = "bold red" if s.trouble else "green"
        parts.append(Text(services_text(s), style=style))
    parts += [Text(line, style="bold red") for line in trouble_text(s)]
    parts += [Text(line) for line in (usage_text(s), stream_text(s), *health_text(s))]
    if s.decisions:
        parts.append(decisions_table(s))
    return Group(*parts)


def plain_line(s: Snapshot) -> str:
    """One log line per refresh (``--no-monitor``, tests, CI)."""
    brokers = " ".join(f"{r.broker}={r.max_pct:.0f}%/{r.bundles}b" for r in s.rows)
    return f"{footer_text(s)}  |  {brokers}"
