"""``lbctl run --fast``: the in-memory closed-loop simulator with the monitor's table.

Why a module of its own: the live pipeline (``lbctl.run_cmd``) supervises processes and reads
Redis; this mode does neither. It runs the same policies through ``producers.fast_sim`` at
thousands of virtual minutes per second, for comparing strategies by eye. The table is
``lbctl monitor``'s (``lbctl.monitor_cmd.render``), and the run ends with the same usage picture
as the live run, over virtual minutes (``--plot FILE``, default ``usage.png`` in ``--run-dir`` or
a new folder under ``.lbctl/run/``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from rich.console import Group
from rich.live import Live
from rich.text import Text

from lbctl.monitor import BrokerRow, Snapshot, spread_of
from lbctl.monitor_cmd import render
from lbctl.plots import UsageHistory, write_usage_png
from loadbalance.errors import InvalidInput
from producers import scoreboard
from producers.fast_sim import FastSim, make_config
from producers.scenarios import load_scenario

# where a run's files go when --run-dir is not given (a folder per run), live and fast alike
DEFAULT_RUN_ROOT = Path(".lbctl/run")


def fast_snapshot(sim, cycle: int, totals: dict[str, int], balanced_max_over_mean: float):
    """The simulator's current view as a monitor ``Snapshot`` (no Redis: leases and lag absent)."""

    view = sim.view
    rows = []
    for name in sorted(view.brokers if view is not None else {}):
        r = view.brokers[name].report
        rows.append(
            BrokerRow(
                broker=name,
                cpu_pct=r.cpu.percent_usage(),
                memory_pct=r.memory.percent_usage(),
                bandwidth_in_pct=r.bandwidth_in.percent_usage(),
                bandwidth_out_pct=r.bandwidth_out.percent_usage(),
                max_pct=r.max_resource_usage() * 100,
                bundles=len(r.bundles),
                topics=r.num_topics,
                msg_rate_in=r.msg_rate_in,
                msg_rate_out=r.msg_rate_out,
                direct_memory_pct=r.direct_memory.percent_usage(),
                producers=r.num_producers,
                consumers=r.num_consumers,
                throughput_in_kb_per_s=r.msg_throughput_in / 1024,
                throughput_out_kb_per_s=r.msg_throughput_out / 1024,
            )
        )
    usage = sim.run_data.usage[-1] if sim.run_data.usage else {}
    return Snapshot(
        rows=tuple(rows),
        applied=dict(totals),
        outcomes={"applied": sum(totals.values())},
        spread=spread_of([v * 100 for v in usage.values()]),
        owning_brokers=frozenset(r.broker for r in rows),
        batch=cycle,
        batch_event_ms=cycle * 60_000,
        batch_age_s=None,
        read_at_ms=0,
        overloaded_pct=float(sim.config.load_balancer_broker_overloaded_threshold_percentage),
        balanced_max_over_mean=balanced_max_over_mean,
    )


def fast_table(sim, cycle: int, totals: dict[str, int], last_ms: float, width: int = 80):
    ratio = float(sim.config.load_balancer_balanced_max_over_mean)
    snap = fast_snapshot(sim, cycle, totals, ratio)
    view = render(snap, f"{sim.scenario.name} (fast): virtual minute {cycle}", width=width)
    return Group(view, Text(f"policy cycle {last_ms:.1f} ms"))


def run_fast(args: argparse.Namespace) -> int:
    """The closed-loop simulator in memory, with the same table."""

    try:
        scenario = load_scenario(args.scenario, args.seed)
    except InvalidInput as e:
        print(f"lbctl run: {e}", file=sys.stderr)
        return 2
    pair = scoreboard.PAIRS.get(args.pair)
    if pair is None:
        print(f"lbctl run: unknown pair {args.pair!r}; use {', '.join(scoreboard.PAIRS)}")
        return 2
    sim = FastSim(scenario, make_config(scenario, pair.overrides), seed=args.seed)
    cycles = scenario.cycles if args.cycles is None else args.cycles
    totals: dict[str, int] = {}

    history = UsageHistory(x_label="virtual minutes")
    live = None
    if not (args.json or args.no_monitor):
        live = Live(refresh_per_second=4, transient=False)
        live.start()
    try:
        for c in range(cycles):
            before = len(sim.run_data.decisions)
            t0 = time.perf_counter()
            sim.tick(c)
            last_ms = (time.perf_counter() - t0) * 1000
            for d in sim.run_data.decisions[before:]:
                totals[d.kind] = totals.get(d.kind, 0) + 1
                history.mark(c, d.kind)
            usage_now = sim.run_data.usage[-1] if sim.run_data.usage else {}
            history.sample(c, {b: u * 100 for b, u in usage_now.items()})
            if live is not None:
                live.update(fast_table(sim, c, totals, last_ms, live.console.width))
            else:
                usage = sim.run_data.usage[-1]
                row = {"cycle": c, "usage": usage, "decisionsApplied": dict(totals)}
                print(json.dumps(row, sort_keys=True), flush=True)
            if args.interval_seconds > 0:
                time.sleep(args.interval_seconds)
    except KeyboardInterrupt:
        pass
    finally:
        if live is not None:
            live.stop()
            print()
    score = scoreboard.score_run(sim.run_data, pair, scenario.kinds)
    _plot(args, history, sim, pair.key)
    if args.json:
        print(json.dumps({"summary": scoreboard.score_dict(score)}, sort_keys=True))
    else:
        print(scoreboard.to_text([score]), end="")
    return 0


def _plot(args: argparse.Namespace, history, sim, pair: str) -> None:
    path = getattr(args, "plot", None)
    if path is None:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        folder = getattr(args, "run_dir", None) or DEFAULT_RUN_ROOT / f"{stamp}-{os.getpid()}-fast"
        path = Path(folder) / "usage.png"
    out = sys.stderr if args.json else sys.stdout
    threshold = float(sim.config.load_balancer_broker_overloaded_threshold_percentage)
    title = f"lbctl run --fast {sim.scenario.name} ({pair}): broker usage"
    written = write_usage_png(history, path, title=title, overloaded_pct=threshold, out=out)
    if written is not None:
        print(f"usage picture: {written}", file=out)
