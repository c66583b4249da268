"""``lbctl decide``: run the policies offline on a cluster snapshot file.

No Spark, Kafka or Redis: it reads a snapshot (``docs/snapshot-format.md``), applies the
snapshot's config overrides and then the command line's, runs ``loadbalance.cycle.step`` the
requested number of times (advancing virtual time by the shedding interval, so debounced
strategies such as TransferShedder can reach their hit count), and prints each decision as one
JSON line. Skips go to stderr, or into the JSON stream with ``--skips``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from lbctl.config_cmd import add_config_arguments, load_from_args
from loadbalance.config import ConfigError
from loadbalance.cycle import CycleState, step, weights_from_config
from loadbalance.decisions import decision_to_dict
from loadbalance.errors import InvalidInput
from loadbalance.snapshot import parse_snapshot

MINUTE_MS = 60_000


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "decide",
        help="run the configured policies on a snapshot file and print the decisions",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "snapshot", type=Path, help="cluster snapshot JSON (see docs/snapshot-format.md)"
    )
    p.add_argument(
        "--cycles",
        type=int,
        default=1,
        help="policy cycles to run on the same snapshot, one shedding interval apart (default 1)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed for random tie-breaks (default 0)")
    p.add_argument("--skips", action="store_true", help="also print skips as JSON lines")
    add_config_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        text = args.snapshot.read_text(encoding="utf-8")
    except OSError as e:
        print(f"lbctl decide: cannot read snapshot {args.snapshot}: {e.strerror}", file=sys.stderr)
        return 2
    try:
        # The snapshot's own config overrides sit below the command line's --set values.
        probe = parse_snapshot(text)
        args.set = [f"{k}={v}" for k, v in probe.config_overrides.items()] + list(args.set or [])
        config = load_from_args(args)
        snap = parse_snapshot(text, weights_from_config(config))
    except ConfigError as e:
        print(f"lbctl decide: {e}", file=sys.stderr)
        return 2
    except InvalidInput as e:
        print(f"lbctl decide: invalid snapshot: {e}", file=sys.stderr)
        return 2
    if args.cycles < 1:
        print("lbctl decide: --cycles must be at least 1", file=sys.stderr)
        return 2
    state = CycleState()
    interval_ms = int(
        min(
            config.load_balancer_shedding_interval_minutes,
            config.load_balancer_split_interval_minutes,
        )
        * MINUTE_MS
    )
    now = snap.now_ms
    out = sys.stdout
    for i in range(args.cycles):
        state, result = step(
            state, snap.view, config, now_ms=now, cycle=f"decide-{i}", seed=args.seed
        )
        for d in result.decisions:
            out.write(json.dumps(decision_to_dict(d), sort_keys=True) + "\n")
        for s in result.skips:
            line = json.dumps({"skip": asdict(s), "cycle": i}, sort_keys=True)
            if args.skips:
                out.write(line + "\n")
            else:
                print(line, file=sys.stderr)
        now += interval_ms
    return 0
