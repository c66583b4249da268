"""``lbctl bench balance`` and ``lbctl simulate SCENARIO --fast``.

``bench balance`` runs the balance-quality scoreboard (``producers.scoreboard``) and writes its
JSON, Markdown and PNG files; ``simulate --fast`` plays one scenario in fast mode under one
strategy pair and prints one line per cycle, so a user can watch a policy work on one case.
The live mode (reports through Kafka, ownership in Redis) plugs in beside ``--fast``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from loadbalance.errors import InvalidInput

DEFAULT_OUT = Path(".lbctl/bench")


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def register(subparsers: argparse._SubParsersAction) -> None:
    bench = subparsers.add_parser(
        "bench", help="benchmarks of the policies (balance-quality scoreboard)"
    )
    bench_sub = bench.add_subparsers(dest="bench_command", metavar="BENCH")
    bench.set_defaults(func=lambda _args: bench.print_help() or 2)
    bal = bench_sub.add_parser(
        "balance",
        help="run every scenario under every strategy pair and score balance quality",
        description="Fast-mode scoreboard: cycles to balance, moves, splits, oscillations, "
        "churn, peak usage after events, end deviation and policy time per cycle.",
    )
    bal.add_argument("--scenarios", type=_csv, default=None, help="comma list (default: all)")
    bal.add_argument(
        "--pairs", type=_csv, default=None, help="comma list of pair keys (default: all)"
    )
    bal.add_argument(
        "--cycles", type=int, default=None, help="cycles per run (default: scenario's)"
    )
    bal.add_argument("--seed", type=int, default=0, help="seed of every run (default 0)")
    bal.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output dir ({DEFAULT_OUT})")
    bal.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    bal.add_argument("--json", action="store_true", help="print the JSON document, not a table")
    bal.set_defaults(func=run_bench_balance)

    sim = subparsers.add_parser(
        "simulate",
        help="run the closed-loop cluster simulator on one scenario",
        description="Play one scenario; --fast runs it in process with virtual time.",
    )
    sim.add_argument("scenario", help="bundled scenario name or path to a scenario JSON file")
    sim.add_argument("--fast", action="store_true", help="fast mode: in-memory, virtual time")
    sim.add_argument("--pair", default="ours", help="strategy pair key (default: ours)")
    sim.add_argument("--cycles", type=int, default=None, help="cycles (default: scenario's)")
    sim.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    sim.add_argument("--json", action="store_true", help="one JSON object per cycle")
    sim.set_defaults(func=run_simulate)


def run_bench_balance(args: argparse.Namespace) -> int:
    from producers import scoreboard
    from producers.scenarios import available_scenarios

    scenarios = args.scenarios or available_scenarios()
    pairs = args.pairs or list(scoreboard.ALL_PAIR_KEYS)
    unknown = [p for p in pairs if p not in scoreboard.PAIRS]
    missing = [s for s in scenarios if s not in available_scenarios() and not Path(s).is_file()]
    if unknown or missing:
        print(
            f"lbctl bench balance: unknown pairs {unknown} / scenarios {missing}; "
            f"pairs: {', '.join(scoreboard.PAIRS)}; scenarios: {', '.join(available_scenarios())}",
            file=sys.stderr,
        )
        return 2
    t0 = time.perf_counter()
    scores = scoreboard.run_scoreboard(
        scenarios, pairs, seed=args.seed, cycles=args.cycles, workers=args.workers
    )
    elapsed_s = time.perf_counter() - t0
    meta = {
        "seed": args.seed,
        "cycles": args.cycles,
        "scenarios": scenarios,
        "pairs": {p: scoreboard.PAIRS[p].label for p in pairs},
        "elapsed_s": round(elapsed_s, 2),
    }
    paths = scoreboard.write_outputs(scores, args.out, meta)
    if args.json:
        print(scoreboard.to_json(scores, meta))
    else:
        print(scoreboard.to_text(scores), end="")
        print(scoreboard.verdict_text(scores))
        print(
            f"{len(scores)} runs in {elapsed_s:.1f} s; wrote " + ", ".join(map(str, paths.values()))
        )
    return 0


def run_simulate(args: argparse.Namespace) -> int:
    if not args.fast:
        print(
            "lbctl simulate: only --fast is available in this build (live mode lands later)",
            file=sys.stderr,
        )
        return 2
    from producers import scoreboard
    from producers.fast_sim import FastSim, make_config
    from producers.scenarios import load_scenario

    try:
        scenario = load_scenario(args.scenario, args.seed)
        pair = scoreboard.PAIRS[args.pair]
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
