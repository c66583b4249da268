"""``lbctl run --fast``: the in-memory closed-loop simulator with the monitor's table.

Why a module of its own: the live pipeline (``lbctl.run_cmd``) supervises processes and reads
Redis; this mode does neither. It runs the same policies through ``producers.fast_sim`` at
thousands of virtual minutes per second, for comparing strategies by eye.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from loadbalance.errors import InvalidInput


def fast_table(sim, cycle: int, totals: dict[str, int], last_ms: float):
    from lbctl.monitor import BrokerRow, Snapshot, render, spread_of

    view = sim.view
    rows = []
    for name in sorted(view.brokers if view is not None else {}):
        r = view.brokers[name].report
        rows.append(
            BrokerRow(
                name,
                r.cpu.percent_usage(),
                r.memory.percent_usage(),
                r.bandwidth_in.percent_usage(),
                r.bandwidth_out.percent_usage(),
                r.max_resource_usage() * 100,
                len(r.bundles),
                r.num_topics,
                r.msg_rate_in,
                r.msg_rate_out,
            )
        )
    usage = sim.run_data.usage[-1] if sim.run_data.usage else {}
    snap = Snapshot(
        rows=tuple(rows),
        applied=totals,
        outcomes={"applied": sum(totals.values())},
        spread=spread_of([v * 100 for v in usage.values()]),
        owning_brokers=frozenset(r.broker for r in rows),
        batch=cycle,
        batch_event_ms=cycle * 60_000,
        batch_age_s=None,
        read_at_ms=0,
    )
    table = render(snap, f"{sim.scenario.name} (fast): virtual minute {cycle}")
    table.caption += f"\npolicy cycle {last_ms:.1f} ms"
    return table


def run_fast(args: argparse.Namespace) -> int:
    """The closed-loop simulator in memory, with the same table."""
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
    if not (args.json or args.no_monitor):
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
                live.update(fast_table(sim, c, totals, last_ms))
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
