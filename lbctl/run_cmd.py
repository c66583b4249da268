"""``lbctl run [SCENARIO]``: the whole product in one command, with a live broker monitor.

What runs (each its own process, logs in one run folder, ``.lbctl/run/<time>/`` by default):

* Apache Kafka and Redis: embedded (a KRaft broker from cached jars, ``redis-server``) on
  free loopback ports, unless ``--bootstrap-servers`` / ``--redis-url`` (or the configuration's
  ``kafkaBootstrapServers`` / ``redisUrl``) point at real ones;
* ``lbctl stream``: the Spark Structured Streaming job (load reports -> averages -> decisions);
* ``lbctl control``: the controller applying decisions to the ownership in Redis;
* ``lbctl simulate``: a simulated cluster playing the scenario (default ``hot_bundle``); its
  brokers publish load reports to Kafka and serve the bundles Redis says they own. It starts
  once the job's streaming query has started (``wait_for_query``), so the scenario's first
  cycles are not played while Spark is still starting.

The live view is ``lbctl monitor``'s (``lbctl.monitor_cmd``): the ``pulsar-perf monitor-brokers``
table, the latest decisions, lease and registry health and the streaming job's lag, read from
Redis (and Kafka for the lag). Ctrl-C (or SIGTERM) stops every process within a few seconds and
says where the logs are; a second run needs no clean-up (fresh ports, fresh run folder). With
``--duration`` or ``--cycles`` the run ends by itself and prints a summary: decisions applied by
kind, the spread of broker usage at start and end, and when the cluster first counted as
balanced (max/mean usage within ``loadBalancerBalancedMaxOverMean``). At the end it writes
``usage.png`` in the run folder (or ``--plot FILE``): broker usage over time with the applied
decisions and the overload threshold (``lbctl.plots``).

``--fast`` runs the in-memory closed-loop simulator instead (no Kafka, Spark or Redis): the same
policies at thousands of virtual minutes per second, for comparing strategies; its picture has
virtual minutes on the time axis.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rich.live import Live

from infra.config_loading import add_config_arguments, ensure_pipeline_topics, load_from_args
from infra.embedded import EmbeddedKafka, EmbeddedRedis, ServiceError
from infra.redis_client import connect
from lbctl.monitor_cmd import build_monitor, plain_line, record, render
from lbctl.plots import UsageHistory, write_usage_png
from lbctl.presets import DEMO, preset_path
from lbctl.run_fast import DEFAULT_RUN_ROOT, run_fast
from lbctl.supervisor import SPARK_ENV, Supervisor, lbctl_argv
from loadbalance.config import ConfigError, LoadBalancerConfig, knob_text
from loadbalance.errors import InvalidInput
from metadata_store.progress import RedisProgress
from producers import scoreboard
from producers.scenarios import load_scenario

HELP = """\
Run the whole product in one command, with a live view: Apache Kafka and Redis (embedded on
free loopback ports unless --bootstrap-servers / --redis-url or the configuration name real
ones), the streaming job (lbctl stream), the controller (lbctl control) and a simulated
cluster (lbctl simulate) playing SCENARIO. The simulator starts once the streaming query has
started. Knob settings come from the demo preset (conf/demo.conf) unless --config is given,
then the scenario's and the strategy pair's, then --set.

The live view is lbctl monitor's. Every process logs to a run folder (.lbctl/run/<time>/ by
default). Ctrl-C stops every process within a few seconds. With --duration or --cycles the run
ends by itself and prints a summary: decisions applied by kind, the usage spread at start and
end, when the first batch came and when the cluster first counted as balanced, and every period
a service was down or stale. --json prints that summary as JSON on stdout (status lines go to
stderr). usage.png in the run folder (or --plot FILE) shows broker usage over time with the
applied decisions and the periods of trouble.

--fast runs the in-memory closed-loop simulator instead (no Kafka, Spark or Redis): the same
policies, for comparing strategies, with virtual minutes on the picture's time axis; it pauses
--interval-seconds per virtual minute (0.5 by default).
"""

DEFAULT_SCENARIO = "hot_bundle"
DEFAULT_PAIR = "ours"
QUERY_START_LIMIT_S = 180.0  # the simulator waits at most this for the job's query to start
CATCH_UP_LIMIT_S = 240.0  # after the simulator's last cycle, wait at most this for the job

log = logging.getLogger("lbctl.run")


def _default_balanced() -> float:
    return LoadBalancerConfig().load_balancer_balanced_max_over_mean


DEFAULT_BALANCED = _default_balanced()  # loadBalancerBalancedMaxOverMean's default


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "run",
        help="run the main job: Kafka, Redis, the streaming job, the controller and a "
        "simulated cluster, with a live monitor",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "scenario",
        nargs="?",
        default=None,
        help=f"bundled scenario name or scenario JSON file (default {DEFAULT_SCENARIO})",
    )
    p.add_argument("--scenario", dest="scenario_opt", default=None, help=argparse.SUPPRESS)
    p.add_argument(
        "--fast", action="store_true", help="in-memory simulator only (no Kafka/Spark/Redis)"
    )
    p.add_argument(
        "--pair",
        default=DEFAULT_PAIR,
        help="strategy pair: ours, classic, uniform, overload, extensible (default ours)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the traffic model (default 0)")
    p.add_argument(
        "--cycles", type=int, default=None, help="simulator cycles; stop once they are processed"
    )
    p.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    _add_process_arguments(p)
    add_config_arguments(p)
    p.set_defaults(func=run)


def _add_process_arguments(p: argparse.ArgumentParser) -> None:
    """Where the services are, how fast the processes run, and what the run leaves behind."""
    p.add_argument("--bootstrap-servers", default=None, help="real Kafka instead of embedded")
    p.add_argument("--redis-url", default=None, help="real Redis instead of embedded")
    p.add_argument(
        "--cycle-seconds",
        type=float,
        default=2.0,
        help="wall seconds per simulator cycle (one virtual report interval; default 2)",
    )
    p.add_argument(
        "--trigger-seconds", type=float, default=2.0, help="streaming micro-batch interval"
    )
    p.add_argument("--refresh-seconds", type=float, default=2.0, help="monitor refresh interval")
    p.add_argument("--grace-seconds", type=float, default=5.0, help="SIGTERM -> SIGKILL delay")
    p.add_argument("--run-dir", type=Path, default=None, help="folder for logs and checkpoint")
    p.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="Spark checkpoint (default: in the run folder with embedded Kafka, else a folder "
        "under .lbctl/checkpoints/ per Kafka+Redis+prefix, so a rerun resumes)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="BASE",
        help="serve each child's Prometheus metrics: stream on BASE, control on BASE+1, "
        "simulate on BASE+2 (all on 127.0.0.1; default: no metrics endpoints)",
    )
    p.add_argument("--no-monitor", action="store_true", help="plain log lines, no live table")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="FILE.png",
        help="where to write the usage picture (default: usage.png in the run folder)",
    )
    p.add_argument(
        "--interval-seconds",
        type=float,
        default=0.5,
        help="--fast only: wall-clock pause per virtual minute (default 0.5)",
    )


def run(args: argparse.Namespace) -> int:
    args.scenario = args.scenario or args.scenario_opt or DEFAULT_SCENARIO
    if args.fast:
        return run_fast(args)
    return run_live(args)


# -- the live pipeline ---------------------------------------------------------------------
def _knob_sets(args: argparse.Namespace) -> list[str] | None:
    """The scenario's knobs, then the pair's, then the user's ``--set`` (last wins), over the
    ``--config`` file (the demo preset by default), for every child: a scenario's own knobs
    must reach the job and the controller as they reach the fast model, or the two would play
    different policies."""

    pair = scoreboard.PAIRS.get(args.pair)
    if pair is None:
        print(f"lbctl run: unknown pair {args.pair!r}; use {', '.join(scoreboard.PAIRS)}")
        return None
    try:
        scenario_knobs = dict(load_scenario(args.scenario, args.seed).config)
    except InvalidInput:  # run_live reports it
        scenario_knobs = {}
    knobs = {k: knob_text(v) for k, v in scenario_knobs.items()}
    knobs.update({k: knob_text(v) for k, v in pair.overrides.items()})
    return [f"{k}={v}" for k, v in knobs.items()] + list(args.set or [])


def _default_checkpoint(bootstrap: str, redis_url: str, prefix: str) -> Path:
    key = hashlib.sha1(f"{bootstrap}|{redis_url}|{prefix}".encode()).hexdigest()[:12]
    return Path(".lbctl/checkpoints") / key


def run_live(args: argparse.Namespace) -> int:
    sets = _knob_sets(args)
    if sets is None:
        return 2
    if args.config is None:  # the demo preset: the same file an operator uses by hand
        args.config = preset_path(DEMO)
    try:
        load_scenario(args.scenario, args.seed)
        config = load_from_args(argparse.Namespace(config=args.config, set=sets))
    except (InvalidInput, ConfigError) as e:
        print(f"lbctl run: {e}", file=sys.stderr)
        return 2
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    run_dir = (args.run_dir or DEFAULT_RUN_ROOT / f"{stamp}-{os.getpid()}").resolve()
    sup = Supervisor(run_dir, grace_s=args.grace_seconds)
    sup.install_signal_handlers()
    say = _sayer(args)
    say(f"lbctl run: {args.scenario}; logs in {run_dir}")
    code = 1
    try:
        bootstrap, redis_url = _services(args, config, sup, say, run_dir)
        if sup.stop_requested.is_set():  # Ctrl-C while the services started: start no job
            raise _StoppedEarly
        checkpoint = _prepare(args, config, bootstrap, redis_url, run_dir)
        stream = _start_pipeline(args, config, sets, sup, say, bootstrap, redis_url, checkpoint)
        started = wait_for_query(checkpoint, stream.proc, sup.stop_requested, QUERY_START_LIMIT_S)
        if sup.stop_requested.is_set():
            raise _StoppedEarly
        if started is not None:
            say(f"streaming query started after {started:.1f}s; starting the simulator")
        else:  # ended or slow: the watch loop reports an ended job with its log
            say(f"the streaming query has not started after {QUERY_START_LIMIT_S:.0f}s; "
                "starting the simulator anyway")  # fmt: skip
        _start_simulator(args, sets, sup, say, bootstrap, redis_url)
        monitor = build_monitor(config, redis_url, bootstrap=bootstrap, checkpoint=checkpoint)
        code, summary = _watch(args, sup, monitor, say, run_dir)
    except ServiceError as e:
        print(f"lbctl run: {e}", file=sys.stderr)
        summary = None
    except _StoppedEarly:
        code, summary = 0, None
    finally:
        took = sup.stop_all()
        sup.restore_signal_handlers()
    say(f"stopped every process in {took:.1f}s; logs in {run_dir}")
    if summary is not None:
        summary["stopSeconds"] = round(took, 2)
        summary["runDir"] = str(run_dir)
        if args.json:
            print(json.dumps(summary, sort_keys=True))
        else:
            print(_summary_text(summary))
    return code


def _services(args, config: Any, sup: Supervisor, say, run_dir: Path) -> tuple[str, str]:
    """Kafka and Redis as configured, or embedded ones started under ``sup``; their
    addresses."""
    bootstrap = args.bootstrap_servers or config.kafka_bootstrap_servers
    redis_url = args.redis_url or config.redis_url
    if not bootstrap:
        kafka = EmbeddedKafka(run_dir / "services")
        kafka.start()
        sup.add_service("kafka", kafka)
        bootstrap = kafka.bootstrap_servers
    if not redis_url:
        redis_server = EmbeddedRedis(run_dir / "services", data_dir=run_dir / "redis-data")
        redis_server.start()
        sup.add_service("redis", redis_server)
        redis_url = redis_server.url
    names = {name for name, _ in sup.services}
    say(
        f"kafka {bootstrap}{' (embedded)' if 'kafka' in names else ''}; "
        f"redis {redis_url}{' (embedded)' if 'redis' in names else ''}"
    )
    return bootstrap, redis_url


def _common_flags(args: argparse.Namespace, sets: list[str]) -> list[str]:
    common = [*(["--config", str(args.config)] if args.config else [])]
    for s in sets:
        common += ["--set", s]
    return common


def _start_pipeline(
    args,
    config: Any,
    sets: list[str],
    sup: Supervisor,
    say,
    bootstrap: str,
    redis_url: str,
    checkpoint: Path,
) -> Any:
    """Start the streaming job and the controller, sharing the configuration flags and the
    service addresses; the job's ``Child``."""
    common = _common_flags(args, sets)
    where = ["--bootstrap-servers", bootstrap, "--redis-url", redis_url]
    port = child_metrics_ports(args.metrics_port)
    stream = sup.start(
        "stream",
        lbctl_argv(
            "stream", *where, "--checkpoint", str(checkpoint),
            "--trigger-seconds", str(args.trigger_seconds), *port["stream"], *common,
        ),
        env_defaults=SPARK_ENV,
    )  # fmt: skip
    sup.start(
        "control",
        lbctl_argv(
            "control",
            *where,
            "--group",
            f"{config.redis_key_prefix}-controller",
            *port["control"],
            *common,
        ),
    )
    if args.metrics_port is not None:
        say(
            "metrics: " + ", ".join(f"{n} http://127.0.0.1:{p[1]}/metrics" for n, p in port.items())
        )
    return stream


def _start_simulator(args, sets: list[str], sup: Supervisor, say, bootstrap: str, redis_url: str):
    where = ["--bootstrap-servers", bootstrap, "--redis-url", redis_url]
    sim = ["simulate", args.scenario, *where, "--cycle-seconds", str(args.cycle_seconds)]
    sim += ["--seed", str(args.seed), *(["--cycles", str(args.cycles)] if args.cycles else [])]
    sim += child_metrics_ports(args.metrics_port)["simulate"]
    sup.start(
        "simulate", lbctl_argv(*sim, *_common_flags(args, sets)), may_finish=args.cycles is not None
    )


def wait_for_query(
    checkpoint: Path, proc: Any, stop: threading.Event, limit_s: float, poll_s: float = 0.2
) -> float | None:
    """Seconds until the streaming job's query started, None if the job ended first, a stop
    was asked for, or ``limit_s`` passed.

    Why wait: the simulator runs the scenario at seconds per cycle, while the job's JVM and
    query take ten seconds or more to start; cycles played meanwhile reach the job as one first
    batch, which decides on many cycles' reports at once where the model decides after each
    (docs/scoreboard.md, paced mode). So the simulator is held until the job's first batch
    has been read and committed (``<checkpoint>/commits/<id>``): Spark runs it as soon as the
    query starts, with no report yet, and it carries the job's warm-up, so cycle 0 reaches the
    next batch alone (a resumed checkpoint has commits already: no wait)."""
    started = time.monotonic()
    commits = checkpoint / "commits"
    while True:
        if commits.is_dir() and any(f.name.isdigit() for f in commits.iterdir()):
            return time.monotonic() - started
        if proc.poll() is not None or time.monotonic() - started >= limit_s:
            return None
        if stop.wait(poll_s):
            return None


def child_metrics_ports(base: int | None) -> dict[str, list[str]]:
    """The ``--metrics-port`` arguments of each child: stream BASE, control +1, simulate +2.

    Consecutive ports, in the order of docker-compose.yml's 9401-9403, so one scrape config
    serves both ways of running the product. ``None`` gives every child no endpoint.
    """
    children = ("stream", "control", "simulate")
    if base is None:
        return {c: [] for c in children}
    return {c: ["--metrics-port", str(base + i)] for i, c in enumerate(children)}


class _StoppedEarly(Exception):
    """A stop was asked for before the jobs started."""


def _sayer(args: argparse.Namespace):
    """Status lines: stderr when stdout carries JSON, stdout otherwise."""
    stream = sys.stderr if args.json else sys.stdout

    def say(text: str) -> None:
        print(text, file=stream, flush=True)

    return say


def _prepare(
    args: argparse.Namespace, config: Any, bootstrap: str, redis_url: str, run_dir: Path
) -> Path:
    """Create the topics; choose the checkpoint; drop Redis progress a new checkpoint would
    contradict (its batch ids restart at 0, and the job skips ids it has already completed)."""

    ensure_pipeline_topics(bootstrap, config)
    if args.checkpoint is not None:
        checkpoint = args.checkpoint
    elif args.bootstrap_servers or config.kafka_bootstrap_servers:
        checkpoint = _default_checkpoint(bootstrap, redis_url, config.redis_key_prefix)
    else:
        checkpoint = run_dir / "checkpoint"
    checkpoint = checkpoint.resolve()
    if not (checkpoint / "offsets").exists():
        client = connect(redis_url, config, purpose="run")
        try:
            if RedisProgress(client, config.redis_key_prefix).forget():
                log.warning("new checkpoint %s: dropped the old streaming progress", checkpoint)
        finally:
            client.close()
    return checkpoint


def _watch(args, sup, monitor: Any, say, run_dir: Path) -> tuple[int, dict[str, Any]]:
    """Refresh the monitor until a stop, the end of the run, or a child's death; sample usage
    and applied decisions for the picture written at the end."""
    return _Watch(args, sup, monitor, say, run_dir).run()


class _Watch:
    """The state of one ``_watch``: what the monitor showed so far, and why the watch ended."""

    def __init__(self, args, sup, monitor: Any, say, run_dir: Path) -> None:
        self.args, self.sup, self.monitor, self.say, self.run_dir = args, sup, monitor, say, run_dir
        self.history = UsageHistory()
        self.t0, self.start_ms = time.monotonic(), int(time.time() * 1000)
        self.balanced_ratio = monitor.balanced_max_over_mean
        self.start_spread: Any = None
        self.end_spread: Any = None
        self.balanced_after: float | None = None
        self.first_batch_after: float | None = None
        self.initial_batch: int | str | None = "unread"
        self.initial_applied: dict[str, int] = {}
        self.snap: Any = None
        self.live: Live | None = None
        self.code, self.reason, self.finishing_at = 0, "stopped", None

    def run(self) -> tuple[int, dict[str, Any]]:
        if not (self.args.no_monitor or self.args.json):
            self.live = Live(refresh_per_second=1, transient=False)
            self.live.start()
        try:
            while not self._step():
                pass
        finally:
            if self.live is not None:
                self.live.stop()
                print()
        return self.code, self._summary()

    def _step(self) -> bool:
        """One refresh; True when the watch ends (``self.reason`` says why)."""
        elapsed = time.monotonic() - self.t0
        fresh = self._read(elapsed)
        if self.snap is not None:
            record(self.history, self.snap, elapsed, self.start_ms)
            title = f"lbctl run {self.args.scenario}: {elapsed:.0f}s"
            if self.live is not None:
                self.live.update(render(self.snap, title, width=self.live.console.width))
            else:
                self.say(f"[{elapsed:6.1f}s] {plain_line(self.snap)}")
        self._poll_children()
        if self.code:
            return True
        return self._finished(fresh, elapsed)

    def _read(self, elapsed: float) -> bool:
        """Read the monitor and note the spread and timings; whether its batch is this run's."""
        try:
            self.snap = self.monitor.read()
        except Exception as e:  # Redis hiccup: a display, not a reason to stop the job
            log.warning("monitor read failed: %s", e)
        snap = self.snap
        if snap is not None and self.initial_batch == "unread":
            # real Redis may hold a previous run's view and outcomes: the summary is this run's
            self.initial_batch, self.initial_applied = snap.batch, dict(snap.applied)
        fresh = snap is not None and snap.batch is not None and snap.batch != self.initial_batch
        if self.first_batch_after is None and fresh:
            self.first_batch_after = elapsed
        if fresh and snap.complete and snap.spread is not None:
            if self.start_spread is None:
                self.start_spread = snap.spread
            self.end_spread = snap.spread
            if (
                self.balanced_after is None
                and sum(snap.applied.values()) > sum(self.initial_applied.values())
                and snap.spread.max_over_mean <= self.balanced_ratio
            ):
                self.balanced_after = elapsed
        return fresh

    def _poll_children(self) -> None:
        """An expected exit starts the catch-up wait; any other sets the exit code and shows
        the child's last output."""
        for ex in self.sup.poll():
            if ex.expected:
                self.say(f"{ex.name} finished; stopping once the streaming job has caught up")
                self.finishing_at = time.monotonic() + CATCH_UP_LIMIT_S
                continue
            self.code, self.reason = 1, f"{ex.name} exited with code {ex.code}"
            if self.live is not None:
                self.live.stop()
                self.live = None
            print(f"lbctl run: {self.reason}; the end of {ex.log_path}:", file=sys.stderr)
            print(ex.tail, file=sys.stderr)
            if ex.error:
                print(f"lbctl run: {ex.name}'s last error: {ex.error}", file=sys.stderr)

    def _finished(self, fresh: bool, elapsed: float) -> bool:
        """Whether the run is over: caught up after the simulation, the duration, or a stop."""
        snap, args = self.snap, self.args
        caught_up = (
            fresh
            and snap.batch_age_s is not None
            and snap.batch_age_s >= max(10.0, 4 * args.trigger_seconds)
        )  # no new batch for a while: every report on the topic has been processed
        if self.finishing_at is not None and (caught_up or time.monotonic() >= self.finishing_at):
            self.reason = "simulation finished"
            return True
        if args.duration is not None and elapsed >= args.duration:
            self.reason = "duration reached"
            return True
        if self.sup.wait(args.refresh_seconds):
            self.reason = f"stopped by {signal.Signals(self.sup.stop_signal or 2).name}"
            return True
        return False

    def _summary(self) -> dict[str, Any]:
        snap, initial = self.snap, self.initial_applied
        return {
            "scenario": self.args.scenario,
            "ended": self.reason,
            "seconds": round(time.monotonic() - self.t0, 1),
            "applied": {
                k: n - initial.get(k, 0)
                for k, n in (snap.applied if snap else {}).items()
                if n > initial.get(k, 0)
            },
            "outcomes": dict(snap.outcomes) if snap else {},
            "spreadStart": self.start_spread.as_dict() if self.start_spread else None,
            "spreadEnd": self.end_spread.as_dict() if self.end_spread else None,
            "firstBatchAfterS": _round(self.first_batch_after),
            "balancedAfterS": _round(self.balanced_after),
            "lastBatch": snap.batch if snap else None,
            "balancedMaxOverMean": self.balanced_ratio,
            "outages": [
                {"service": name, "fromS": round(a, 1), "toS": round(b, 1)}
                for name, a, b in self.history.outages()
            ],
            "troubleAtEnd": snap.trouble if snap else [],
            "plot": _plot(self.args, self.history, self.run_dir, self.monitor.overloaded_pct),
        }


def _round(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 1)


def _plot(args, history: Any, run_dir: Path, overloaded_pct: float) -> str | None:
    """Write the usage picture; its path (the summary names it), or None without matplotlib
    or samples."""

    path = args.plot or run_dir / "usage.png"
    title = f"lbctl run {args.scenario} ({args.pair}): broker usage"
    written = write_usage_png(
        history, path, title=title, overloaded_pct=overloaded_pct,
        out=sys.stderr if args.json else sys.stdout,
    )  # fmt: skip
    return None if written is None else str(written)


def _summary_text(s: dict[str, Any]) -> str:
    applied = ", ".join(f"{k} {v}" for k, v in sorted(s["applied"].items())) or "none"

    def spread(d: dict[str, float] | None) -> str:
        return "n/a" if d is None else f"max/mean {d['maxOverMean']:.2f}, std {d['stdPct']:.1f}"

    def secs(value: float | None) -> str:
        return "-" if value is None else f"{value}s"

    outages = "; ".join(
        f"{o['service']} {o['fromS']:.0f}s-{o['toS']:.0f}s" for o in s.get("outages", [])
    )
    return "\n".join(
        [
            f"run ended ({s['ended']}) after {s['seconds']}s; decisions applied: {applied}",
            *([f"TROUBLE during the run: {outages}"] if outages else []),
            *(f"TROUBLE at the end: {line}" for line in s.get("troubleAtEnd", [])),
            f"usage spread: start {spread(s['spreadStart'])} -> end {spread(s['spreadEnd'])}",
            f"first streaming batch after: {secs(s['firstBatchAfterS'])}; balanced (max/mean <= "
            f"{s.get('balancedMaxOverMean', DEFAULT_BALANCED):.2f}) after: "
            f"{secs(s['balancedAfterS'])}",
            f"logs: {s['runDir']}",
            *([f"usage picture: {s['plot']}"] if s.get("plot") else []),
        ]
    )
