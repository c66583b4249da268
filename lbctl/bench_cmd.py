"""``lbctl bench balance [--live]``: the balance-quality scoreboard, in the model or the product.

Without ``--live`` every scenario runs under every strategy pair in the fast in-memory model
(``producers.scoreboard``) and the JSON, Markdown and PNG files are written to ``--out``. With
``--live`` every scenario runs through the real pipeline (embedded Kafka and Redis, the Spark
job, the controller; ``lbctl.bench_live``) under one pair, beside the fast run of the same
scenario, seed and pair, and the side-by-side table is written to ``OUT/live.md`` and
``OUT/live.json``. A live run takes minutes per scenario (one Spark micro-batch per cycle);
progress goes to stderr.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from lbctl import bench_live
from loadbalance.config import ConfigError
from loadbalance.errors import InvalidInput
from producers import scoreboard
from producers.scenarios import available_scenarios

DEFAULT_OUT = Path(".lbctl/bench")
BALANCE_HELP = """\
Score balance quality per scenario and strategy pair.

Without --live, every scenario runs under every strategy pair in the fast in-memory model, and
JSON, Markdown and PNG results are written to --out. With --live, every scenario runs through
the real pipeline (embedded Kafka and Redis, the Spark job, the controller) under one pair,
beside the fast run of the same scenario, seed and pair; the side-by-side table is written to
OUT/live.md and OUT/live.json. A live run takes minutes per scenario (one Spark micro-batch per
cycle); progress goes to stderr. --report-lag-cycles 1 plays the fast model with reports a cycle
behind the decisions, as a paced live run (--cycle-seconds 2) sees them: the same figures in
seconds.
"""


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
        description=BALANCE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bal.add_argument("--scenarios", type=_csv, default=None, help="comma list (default: all)")
    bal.add_argument(
        "--pairs",
        type=_csv,
        default=None,
        help="comma list of pair keys (default: all; with --live: ours)",
    )
    bal.add_argument(
        "--cycles", type=int, default=None, help="cycles per run (default: scenario's)"
    )
    bal.add_argument("--seed", type=int, default=0, help="seed of every run (default 0)")
    bal.add_argument(
        "--report-lag-cycles",
        type=int,
        default=0,
        metavar="N",
        help="fast runs: brokers report the ownership of N cycles ago, as a paced live run's "
        "reports lag its decisions (default 0: every move shows in the next reports)",
    )
    bal.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output dir ({DEFAULT_OUT})")
    bal.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    bal.add_argument("--json", action="store_true", help="print the JSON document, not a table")
    _add_live_arguments(bal)
    bal.set_defaults(func=run_bench_balance)


def _add_live_arguments(bal: argparse.ArgumentParser) -> None:
    """The options of ``--live`` runs, in a group of their own in ``--help``."""
    live = bal.add_argument_group("live runs (--live)")
    live.add_argument(
        "--live",
        action="store_true",
        help="play each scenario through Kafka, the Spark job, the controller and Redis, "
        "beside its fast run",
    )
    live.add_argument(
        "--cycle-seconds",
        type=float,
        default=None,
        help="pace one cycle every S wall seconds as 'lbctl run' does (default: lockstep, each "
        "cycle once the pipeline has applied the previous one's decisions)",
    )
    live.add_argument(
        "--trigger-seconds",
        type=float,
        default=0.5,
        help="the streaming job's micro-batch interval (default 0.5)",
    )
    live.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="a load-balancer knob for the job, the controller and the lookups (repeatable)",
    )


def _check(args: argparse.Namespace, pairs: list[str], scenarios: list[str]) -> str | None:
    """What is wrong with the arguments, or None."""
    unknown = [p for p in pairs if p not in scoreboard.PAIRS]
    missing = [s for s in scenarios if s not in available_scenarios() and not Path(s).is_file()]
    if unknown or missing:
        return (
            f"unknown pairs {unknown} / scenarios {missing}; pairs: "
            f"{', '.join(scoreboard.PAIRS)}; scenarios: {', '.join(available_scenarios())}"
        )
    if args.live and len(pairs) != 1:
        return "--live plays one pair at a time; give --pairs with one key"
    if args.cycle_seconds is not None and args.cycle_seconds <= 0:
        return "--cycle-seconds must be > 0"
    if args.trigger_seconds <= 0:
        return "--trigger-seconds must be > 0"
    bad = [s for s in args.set if "=" not in s]
    if bad:
        return f"--set expects KNOB=VALUE, got {bad}"
    if args.cycles is not None and args.cycles <= 0:
        return "--cycles must be > 0"
    if args.report_lag_cycles < 0:
        return "--report-lag-cycles must be >= 0"
    if args.live and args.report_lag_cycles:
        return "--report-lag-cycles plays the fast model only; a live run's reports lag as they do"
    return None


def run_bench_balance(args: argparse.Namespace) -> int:
    scenarios = args.scenarios or available_scenarios()
    default_pairs = [scoreboard.OUR_PAIR_KEY] if args.live else list(scoreboard.ALL_PAIR_KEYS)
    pairs = args.pairs or default_pairs
    problem = _check(args, pairs, scenarios)
    if problem is not None:
        print(f"lbctl bench balance: {problem}", file=sys.stderr)
        return 2
    if args.live:
        return _run_live(args, scenarios, pairs[0])
    t0 = time.perf_counter()
    scores = scoreboard.run_scoreboard(
        scenarios,
        pairs,
        seed=args.seed,
        cycles=args.cycles,
        workers=args.workers,
        report_lag_cycles=args.report_lag_cycles,
    )
    elapsed_s = time.perf_counter() - t0
    meta = {
        "seed": args.seed,
        "cycles": args.cycles,
        "reportLagCycles": args.report_lag_cycles,
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
    failed = scoreboard.failure_text(scores)
    if failed:  # a run that broke a placement policy fails the benchmark, whatever it balanced
        print(failed, file=sys.stderr)
        return 1
    return 0


def _run_live(args: argparse.Namespace, scenarios: list[str], pair: str) -> int:
    opts = bench_live.LiveOptions(
        trigger_seconds=args.trigger_seconds,
        cycle_seconds=args.cycle_seconds,
        sets=tuple(args.set),
        seed=args.seed,
        cycles=args.cycles,
    )
    t0 = time.perf_counter()
    try:
        results = bench_live.run_live_scoreboard(
            scenarios, pair, args.out, opts, bench_live.stderr_say
        )
    except (InvalidInput, ConfigError) as e:
        print(f"lbctl bench balance --live: {e}", file=sys.stderr)
        return 2
    except bench_live.LiveRunError as e:
        print(f"lbctl bench balance --live: {e}", file=sys.stderr)
        return 1
    elapsed_s = time.perf_counter() - t0
    meta = {
        "seed": args.seed,
        "cycles": args.cycles,
        "pair": {pair: scoreboard.PAIRS[pair].label},
        "mode": "lockstep" if args.cycle_seconds is None else f"paced {args.cycle_seconds:g} s",
        "triggerSeconds": args.trigger_seconds,
        "sets": list(args.set),
        "elapsed_s": round(elapsed_s, 1),
    }
    paths = bench_live.write_outputs(results, args.out, meta)
    if args.json:
        print(bench_live.to_json(results, meta))
    else:
        print(bench_live.to_markdown(results), end="")
        within = sum(r.within_targets for r in results)
        print(
            f"{within}/{len(results)} scenarios within the targets (live cycles to balance <= "
            f"fast + {bench_live.BALANCE_SLACK_CYCLES}, live moves <= "
            f"{bench_live.MOVES_RATIO} x fast, end max/mean within "
            f"{bench_live.END_RATIO_SLACK}); {elapsed_s:.0f} s; wrote " + ", ".join(map(str, paths))
        )
    return 0
