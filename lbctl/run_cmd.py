"""``lbctl run``: the main job as it stands today, with a live broker monitor.

What runs: the closed-loop cluster simulator (``producers.fast_sim``) plays a scenario; every
virtual minute its brokers produce Pulsar ``LocalBrokerData`` reports from the bundles they own,
the reports are folded into the averaged view, and the real policy cycle
(``loadbalance.cycle.step``: split, shedding, placement) decides; decisions are applied to the
ownership map, which changes the next reports. A table in the spirit of
``pulsar-perf monitor-brokers`` refreshes as it goes (rich), with the decisions applied and the
spread of broker usage in the footer.

What does not run yet: the embedded Kafka broker, the Spark Structured Streaming job and the
Redis controller in between (issues 3 to 5). The policies, the model and the decisions are the
ones those components will carry, so the balance shown here is the product's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from loadbalance.errors import InvalidInput

DEFAULT_SCENARIO = "hot_bundle"
DEFAULT_PAIR = "ours"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "run",
        help="run the main job: a simulated cluster balanced by the policies, with a monitor",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--scenario",
        default=DEFAULT_SCENARIO,
        help=f"bundled scenario name or scenario JSON file (default {DEFAULT_SCENARIO})",
    )
    p.add_argument(
        "--pair",
        default=DEFAULT_PAIR,
        help="strategy pair: ours, classic, uniform, overload, extensible (default ours)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the traffic model (default 0)")
    p.add_argument("--cycles", type=int, default=None, help="virtual minutes to run")
    p.add_argument(
        "--interval-seconds",
        type=float,
        default=0.5,
        help="wall-clock pause per virtual minute, so the monitor can be watched (default 0.5)",
    )
    p.add_argument("--json", action="store_true", help="one JSON line per cycle, no monitor")
    p.set_defaults(func=run)


def _table(sim, cycle: int, totals: dict[str, int], last_ms: float):
    from rich.table import Table

    view = sim.view
    usage = sim.run_data.usage[-1] if sim.run_data.usage else {}
    table = Table(title=f"{sim.scenario.name}: virtual minute {cycle}", expand=False)
    for col in (
        "broker", "CPU %", "MEM %", "BW in %", "BW out %", "MAX %",
        "bundles", "topics", "msg/s in", "msg/s out",
    ):  # fmt: skip
        table.add_column(col, justify="right" if col != "broker" else "left")
    brokers = view.brokers if view is not None else {}
    for name in sorted(brokers):
        r = brokers[name].report
        peak = r.max_resource_usage() * 100
        style = "bold red" if peak >= 85 else None
        table.add_row(
            name,
            f"{r.cpu.percent_usage():.1f}",
            f"{r.memory.percent_usage():.1f}",
            f"{r.bandwidth_in.percent_usage():.1f}",
            f"{r.bandwidth_out.percent_usage():.1f}",
            f"{peak:.1f}",
            str(len(r.bundles)),
            str(r.num_topics),
            f"{r.msg_rate_in:,.0f}",
            f"{r.msg_rate_out:,.0f}",
            style=style,
        )
    values = list(usage.values())
    mean = statistics.fmean(values) if values else 0.0
    spread = (max(values) / mean) if values and mean else 0.0
    std = statistics.pstdev(values) if len(values) > 1 else 0.0
    table.caption = (
        f"decisions applied: splits {totals.get('split', 0)}, unloads {totals.get('unload', 0)}, "
        f"transfers {totals.get('transfer', 0)}, merges {totals.get('merge', 0)}   |   "
        f"usage max/mean {spread:.2f}, std {std * 100:.1f} pts   |   last cycle {last_ms:.1f} ms"
    )
    return table


def run(args: argparse.Namespace) -> int:
    from producers import scoreboard
    from producers.fast_sim import FastSim, make_config
    from producers.scenarios import load_scenario

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
    live = None
    if not args.json:
        from rich.live import Live

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
            if live is not None:
                live.update(_table(sim, c, totals, last_ms))
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
    if args.json:
        print(json.dumps({"summary": scoreboard.score_dict(score)}, sort_keys=True))
    else:
        print(scoreboard.to_text([score]), end="")
    return 0
