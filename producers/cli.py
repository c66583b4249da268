"""``lbctl simulate SCENARIO [--fast]``: the closed-loop cluster simulator on one scenario.

``simulate --fast`` plays one scenario in fast mode under one strategy pair and prints one line
per cycle, so a user can watch a policy work on one case (the scoreboard over every scenario is
``lbctl bench balance``, in ``lbctl.bench_cmd``).

``simulate`` without ``--fast`` is the live mode (``producers.live_sim``): the same world
publishes real load reports to Kafka and serves what Redis says each broker owns, for the
streaming job and the controller to balance. ``lbctl run`` starts it as a child process as
``lbctl simulate SCENARIO --bootstrap-servers B --redis-url R --cycle-seconds S [--cycles N]
[--seed N] [--set k=v ...]``; keep that command line stable. It runs until SIGINT/SIGTERM (or
``--cycles``) and exits 0 after a clean stop.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import redis
from confluent_kafka import KafkaException

from controller.events import EventPublisher
from infra import metrics
from infra.config_loading import add_config_arguments, kafka_security, reports_topic_config
from infra.redis_client import connect
from infra.topics import ensure_topics
from loadbalance.config import ConfigError, LoadBalancerConfig, load_config
from loadbalance.errors import InvalidInput
from metadata_store.ownership_redis import RedisStore
from producers import scoreboard
from producers.fast_sim import FastSim, make_config
from producers.live_sim import (
    LiveSim,
    TimestampedReportPublisher,
    newest_record_ms,
    resume_start_ms,
)
from producers.scenarios import load_scenario


def register(subparsers: argparse._SubParsersAction) -> None:
    _register_simulate(subparsers)


def _register_simulate(subparsers: argparse._SubParsersAction) -> None:
    sim = subparsers.add_parser(
        "simulate",
        help="run the closed-loop cluster simulator on one scenario",
        description="Play one scenario. Live (default): publish the simulated brokers' load "
        "reports to Kafka, stamped with virtual time (start + cycle x tick), and follow bundle "
        "ownership in Redis (leases renewed against the wall clock), one cycle every "
        "--cycle-seconds, until SIGINT/SIGTERM or --cycles. --fast: the same scenario in "
        "process, in virtual time, with the policy run in memory.",
    )
    sim.add_argument("scenario", help="bundled scenario name or path to a scenario JSON file")
    sim.add_argument("--fast", action="store_true", help="fast mode: in-memory, virtual time")
    sim.add_argument(
        "--pair",
        default=None,
        help="strategy pair key (fast default: ours; live: only its placement knobs matter, "
        "for lookups, and only when given)",
    )
    sim.add_argument(
        "--cycles",
        type=int,
        default=None,
        help="cycles (default: fast, the scenario's; live, until stopped)",
    )
    sim.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    sim.add_argument("--json", action="store_true", help="one JSON object per cycle")
    sim.add_argument(
        "--bootstrap-servers",
        default="",
        help="live: Kafka bootstrap servers (default: kafkaBootstrapServers)",
    )
    sim.add_argument("--redis-url", default="", help="live: Redis URL (default: redisUrl)")
    sim.add_argument(
        "--cycle-seconds",
        type=float,
        default=2.0,
        help="live: wall seconds per cycle, i.e. per virtual tick (default 2)",
    )
    sim.add_argument(
        "--serving-log",
        type=Path,
        default=None,
        metavar="FILE",
        help="live: after every cycle, rewrite FILE (atomically) with every interval the "
        "simulated brokers served, on the host's monotonic clock, for the real-time checker "
        "(loadbalance.serving_checker)",
    )
    add_config_arguments(sim)
    metrics.add_metrics_argument(sim)
    sim.set_defaults(func=run_simulate)


def run_simulate(args: argparse.Namespace) -> int:
    if not args.fast:
        return run_simulate_live(args)

    try:
        scenario = load_scenario(args.scenario, args.seed)
        pair = scoreboard.PAIRS[args.pair or scoreboard.OUR_PAIR_KEY]
    except InvalidInput as e:
        print(f"lbctl simulate: {e}", file=sys.stderr)
        return 2
    except KeyError:
        print(f"lbctl simulate: unknown pair {args.pair!r}; use {', '.join(scoreboard.PAIRS)}")
        return 2
    sim = FastSim(scenario, make_config(scenario, pair.overrides), seed=args.seed)
    cycles = scenario.cycles if args.cycles is None else args.cycles
    for c in range(cycles):
        before = len(sim.run_data.decisions)
        sim.tick(c)
        usage = sim.run_data.usage[-1]
        new = sim.run_data.decisions[before:]
        mean = sum(usage.values()) / len(usage) if usage else 0.0
        peak = max(usage.values(), default=0.0)
        kinds: dict[str, int] = {}
        for d in new:
            kinds[d.kind] = kinds.get(d.kind, 0) + 1
        if args.json:
            row = {"cycle": c, "maxUsage": peak, "meanUsage": mean, "decisions": kinds}
            print(json.dumps({**row, "usage": usage}, sort_keys=True))
        else:
            acts = " ".join(f"{k}={v}" for k, v in sorted(kinds.items()))
            ratio = peak / mean if mean else 0.0
            print(
                f"cycle {c:4d}  max {peak * 100:5.1f}%  mean {mean * 100:5.1f}%  "
                f"max/mean {ratio:4.2f}  brokers {len(usage):2d}  {acts}"
            )
    score = scoreboard.score_run(sim.run_data, pair, scenario.kinds)
    if args.json:
        print(json.dumps({"summary": scoreboard.score_dict(score)}, sort_keys=True))
    else:
        print(scoreboard.to_text([score]), end="")
    return 0


def _live_config(args: argparse.Namespace, scenario_knobs: dict[str, Any]) -> LoadBalancerConfig:
    """Defaults < --config file < LB_* environment < the scenario's knobs < --pair < --set.

    The scenario's and the pair's knobs sit above the file because they are what the scenario
    is about; the user's ``--set`` still wins. Raises ``ConfigError``.
    """
    conf_text = None
    if args.config is not None:
        try:
            conf_text = Path(args.config).read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError("--config", f"cannot read {args.config}: {e.strerror}") from None
    explicit: dict[str, str] = {}
    for pair in args.set or []:
        if "=" not in pair:
            raise ConfigError(pair, "expected KNOB=VALUE")
        k, v = pair.split("=", 1)
        explicit[k.strip()] = v.strip()
    overrides = {**scenario_knobs, **explicit}
    config, warnings = load_config(conf_text=conf_text, env=os.environ, overrides=overrides)
    for w in warnings:
        print(f"lbctl: warning: {w}", file=sys.stderr)
    return config


def _export_metrics(result: Any) -> None:
    """Per-broker usage gauges (percent, Pulsar's names) and the simulator counters."""
    for broker, r in result.reports.items():
        metrics.set_broker_usage(
            broker,
            cpu=r.cpu.percent_usage(),
            memory=r.memory.percent_usage(),
            direct_memory=r.direct_memory.percent_usage(),
            bandwidth_in=r.bandwidth_in.percent_usage(),
            bandwidth_out=r.bandwidth_out.percent_usage(),
        )
    metrics.forget_brokers(result.reports)
    metrics.SIMULATOR_CYCLES.inc()
    metrics.SIMULATOR_REPORTS_PUBLISHED.inc(result.published)


def run_simulate_live(args: argparse.Namespace) -> int:
    """``lbctl simulate SCENARIO``: the live simulator until SIGINT/SIGTERM or ``--cycles``.

    The signal handlers go in first, so a stop that arrives while the services are still being
    reached (topic creation, the resume probe) is a clean exit 0 as well.
    """
    stopping = threading.Event()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, lambda _s, _f: stopping.set())
    try:
        return _run_live(args, stopping)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _Exit(Exception):
    """Leave ``_run_live`` with ``code`` after the message was printed."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _run_live(args: argparse.Namespace, stopping: threading.Event) -> int:
    try:
        scenario, config, bootstrap, redis_url = _live_inputs(args)
        security = kafka_security(config)
        start_ms = _live_start_ms(config, bootstrap, security, scenario.tick_ms)
    except _Exit as e:
        return e.code
    client = connect(redis_url, config, purpose="simulate")
    store = RedisStore(client, config.redis_key_prefix, clock="server")
    publisher = TimestampedReportPublisher(bootstrap, config.load_reports_topic, security)
    events = EventPublisher(bootstrap, config.ownership_events_topic, security)
    sim = LiveSim(
        scenario, config, store, publisher, seed=args.seed, start_ms=start_ms,
        stop_event=stopping, events=events,
    )  # fmt: skip
    on_cycle = _cycle_printer(args)
    if args.serving_log is not None:
        on_cycle = _with_serving_log(on_cycle, sim, args.serving_log)
    t0 = time.monotonic()
    try:
        done = sim.run(args.cycles, args.cycle_seconds, on_cycle)
    except redis.RedisError as e:  # at setup; a later outage is retried cycle by cycle
        print(f"lbctl simulate: Redis unavailable: {e}", file=sys.stderr)
        return 1
    finally:
        publisher.close()
        events.close()
        store.close()
    print(
        f"lbctl simulate: {scenario.name} stopped after {done} cycles "
        f"({time.monotonic() - t0:.1f} s wall, virtual {done * scenario.tick_ms // 1000} s)",
        file=sys.stderr,
        flush=True,
    )
    return 0


def _live_inputs(args: argparse.Namespace) -> tuple[Any, LoadBalancerConfig, str, str]:
    """The scenario, the configuration (with the pair's knobs), Kafka and Redis; ``_Exit(2)``
    after saying what is wrong with the arguments."""
    try:
        scenario = load_scenario(args.scenario, args.seed)
        knobs = dict(scenario.config)
        if args.pair is not None:
            knobs.update(scoreboard.PAIRS[args.pair].overrides)
        config = _live_config(args, knobs)
    except (InvalidInput, ConfigError) as e:
        print(f"lbctl simulate: {e}", file=sys.stderr)
        raise _Exit(2) from e
    except KeyError as e:
        print(f"lbctl simulate: unknown pair {args.pair!r}; use {', '.join(scoreboard.PAIRS)}")
        raise _Exit(2) from e
    bootstrap = args.bootstrap_servers or config.kafka_bootstrap_servers
    redis_url = args.redis_url or config.redis_url
    if not bootstrap or not redis_url:
        print(
            "lbctl simulate: live mode needs --bootstrap-servers and --redis-url (or "
            "kafkaBootstrapServers/redisUrl; 'lbctl infra up' starts embedded ones), or --fast",
            file=sys.stderr,
        )
        raise _Exit(2)
    if args.cycle_seconds < 0:
        print("lbctl simulate: --cycle-seconds must be >= 0", file=sys.stderr)
        raise _Exit(2)
    return scenario, config, bootstrap, redis_url


def _live_start_ms(
    config: LoadBalancerConfig, bootstrap: str, security: dict[str, str], tick_ms: int
) -> int:
    """Create the reports topic and pick the virtual start time after its newest record;
    ``_Exit(1)`` when Kafka cannot be used."""
    try:
        ensure_topics(
            bootstrap,
            {config.load_reports_topic: config.topic_partitions},
            security,
            topic_configs={config.load_reports_topic: reports_topic_config(config)},
        )
    except KafkaException as e:
        print(f"lbctl simulate: Kafka at {bootstrap} unavailable: {e}", file=sys.stderr)
        raise _Exit(1) from e
    try:
        newest_ms = newest_record_ms(bootstrap, config.load_reports_topic, security)
    except (KafkaException, TimeoutError) as e:
        print(f"lbctl simulate: cannot read {config.load_reports_topic}: {e}", file=sys.stderr)
        raise _Exit(1) from e
    return resume_start_ms(newest_ms, int(time.time() * 1000), tick_ms)


def _with_serving_log(on_cycle: Any, sim: LiveSim, path: Path) -> Any:
    """``on_cycle`` that first rewrites ``path`` with the brokers' serving intervals. Why after
    every cycle and whole: a process killed at any moment leaves the intervals as of its last
    cycle, and an interval still open there ends at its serve-until, past which a dead
    broker cannot have served anyway."""

    def write_then(result: Any) -> None:
        doc = [i.to_json() for i in sim.serving_intervals()]
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, path)
        on_cycle(result)

    return write_then


def _cycle_printer(args: argparse.Namespace) -> Any:
    """Start the metrics endpoint if asked; the callback that prints (and exports) a cycle."""
    metrics_on = False
    if getattr(args, "metrics_port", None) is not None:
        port = metrics.serve_from_args(args)
        metrics_on = port is not None
        print(f"metrics on port {port}", file=sys.stderr, flush=True)

    def on_cycle(result: Any) -> None:
        if metrics_on:
            _export_metrics(result)
        if args.json:
            print(json.dumps(result.to_json(), sort_keys=True), flush=True)
        else:
            print(result.line(), flush=True)

    return on_cycle
