"""``lbctl decide``: run the policies offline on a cluster snapshot file.

No Spark, Kafka or Redis: it reads a snapshot (``docs/snapshot-format.md``), applies the
snapshot's config overrides and then the command line's, runs ``loadbalance.cycle.step`` the
requested number of times (advancing virtual time by the shedding interval, so debounced
strategies such as TransferShedder can reach their hit count), and prints each decision as one
JSON line. Skips go to stderr, or into the JSON stream with ``--skips``. The snapshot's
``recentlyUnloaded`` entries hold their bundles through the grace period, as the cycle's own do.

A snapshot that fails validation (``loadbalance.snapshot``: the report codec's rules for every
field) ends the command with exit status 2 and one line naming the JSON path of the problem;
the file is read as bytes so that invalid UTF-8 is such a refusal, not a traceback.

``--lookup BUNDLE`` (repeatable) answers lookups instead of running cycles: for each bundle, in
order, one JSON line ``{"bundle", "candidates", "owner", "reason"?, "alreadyOwned"?}`` placed
as the controller would (``BrokerSelector`` over the snapshot's view and ``policies``, the
brokers' reported bundles as the current ownership, each answer preallocated so the next one
counts it). A bundle a live broker already reports keeps that owner (``"alreadyOwned": true``),
as a lookup of an owned bundle does; ``owner`` is ``null`` with a ``reason`` when no broker is
eligible (an isolated namespace with none of its brokers live, a dead broker's heartbeat).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from dataclasses import asdict
from pathlib import Path

from infra.config_loading import add_config_arguments, load_from_args
from loadbalance.bundles import canonical_bundle_name
from loadbalance.config import ConfigError, LoadBalancerConfig
from loadbalance.cycle import CycleState, step, weights_from_config
from loadbalance.decisions import decision_to_dict
from loadbalance.errors import InvalidInput
from loadbalance.placement.filters import live_candidates
from loadbalance.placement.pipeline import BrokerSelector
from loadbalance.snapshot import (
    Snapshot,
    key_path,
    load_snapshot_document,
    snapshot_config,
    snapshot_from_document,
)

MINUTE_MS = 60_000


HELP = """\
Run the load balancer's policies offline on a cluster snapshot file (docs/snapshot-format.md)
and print each decision as one JSON line. No Spark, Kafka or Redis is needed.

The snapshot's config overrides apply first, then --config and --set. Each cycle advances
virtual time by the shedding interval, so strategies that wait for several hits (such as
TransferShedder) can fire. Skipped candidates go to stderr, or into the JSON output with
--skips. A snapshot that fails validation ends the command with exit status 2 and one line
naming the JSON path of the problem.

--lookup BUNDLE (repeatable) answers lookups instead of running cycles: one JSON line per
bundle, {"bundle", "candidates", "owner", "reason"?, "alreadyOwned"?}, placed as the controller
would. A bundle a live broker already reports keeps that owner; "owner" is null with a "reason"
when no broker is eligible.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "decide",
        help="run the configured policies on a snapshot file and print the decisions",
        description=HELP,
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
    p.add_argument(
        "--lookup",
        action="append",
        default=[],
        metavar="BUNDLE",
        help="answer a lookup for BUNDLE (repeatable) instead of running cycles: one JSON line "
        "each with the candidates left after the placement rules and the owner chosen",
    )
    add_config_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        raw = args.snapshot.read_bytes()
    except OSError as e:
        print(f"lbctl decide: cannot read snapshot {args.snapshot}: {e.strerror}", file=sys.stderr)
        return 2
    if args.cycles < 1:
        print("lbctl decide: --cycles must be at least 1", file=sys.stderr)
        return 2
    try:
        doc = load_snapshot_document(raw)
        overrides = snapshot_config(doc)
    except InvalidInput as e:
        return _invalid(e)
    try:
        # Checked alone first, so that a bad --set, --config or LB_* value is not blamed on
        # the snapshot.
        load_from_args(args, quiet=True)
    except ConfigError as e:
        print(_one_line(f"lbctl decide: {e}"), file=sys.stderr)
        return 2
    # The snapshot's own config overrides sit below the command line's --set values.
    merged = argparse.Namespace(**vars(args))
    merged.set = [f"{k}={v}" for k, v in overrides.items()] + list(args.set or [])
    try:
        config = load_from_args(merged)
    except ConfigError as e:
        where = key_path("snapshot.config", e.knob) if e.knob in overrides else "snapshot.config"
        return _invalid(InvalidInput(where, str(e)))
    interval_minutes = min(
        config.load_balancer_shedding_interval_minutes,
        config.load_balancer_split_interval_minutes,
    )
    if not math.isfinite(interval_minutes * MINUTE_MS):
        print(
            "lbctl decide: loadBalancerSheddingIntervalMinutes and "
            "loadBalancerSplitIntervalMinutes must be finite",
            file=sys.stderr,
        )
        return 2
    try:
        snap = snapshot_from_document(doc, overrides, weights_from_config(config))
    except InvalidInput as e:
        return _invalid(e)
    if args.lookup:
        return _write_lookups(args.lookup, snap, config, args.seed)
    _write_cycles(args, snap, config, int(interval_minutes * MINUTE_MS))
    return 0


def _write_lookups(
    bundles: list[str], snap: Snapshot, config: LoadBalancerConfig, seed: int
) -> int:
    """One JSON line per looked-up bundle (see the module docstring); exit status 2 when a
    bundle name is not one."""
    names = []
    for raw in bundles:
        try:
            names.append(canonical_bundle_name(raw))
        except InvalidInput as e:
            print(_one_line(f"lbctl decide: --lookup {raw!r}: {e}"), file=sys.stderr)
            return 2
    view = snap.view
    selector = BrokerSelector(view, config, random.Random(seed), now_ms=snap.now_ms)
    ttl_s = config.load_balancer_broker_load_data_ttl_in_seconds
    live = set(live_candidates(view, now_ms=snap.now_ms, load_data_ttl_s=ttl_s))
    owners = view.owners()
    for bundle in names:
        line: dict[str, object] = {"bundle": bundle}
        line["candidates"] = selector.candidates(bundle)
        current = owners.get(bundle)
        if current is not None and current in live:
            line["owner"] = current
            line["alreadyOwned"] = True
        else:
            owner = selector.select(bundle)
            line["owner"] = owner
            if owner is None:
                line["reason"] = selector.last_reason
        sys.stdout.write(json.dumps(line, sort_keys=True) + "\n")
    return 0


def _write_cycles(
    args: argparse.Namespace, snap: Snapshot, config: LoadBalancerConfig, interval_ms: int
) -> None:
    """Run ``args.cycles`` cycles ``interval_ms`` apart over the snapshot's view; decisions
    (and with ``--skips`` the skips) go to stdout as JSON lines, skips otherwise to stderr."""
    state = CycleState()
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


MAX_ERROR_CHARS = 1000


def _one_line(text: str) -> str:
    """Whitespace folded and length bounded (the whole line, prefix included): the error is
    one readable line, whatever the input held (a knob value is echoed in its error)."""
    line = " ".join(text.split())
    return line if len(line) <= MAX_ERROR_CHARS else line[: MAX_ERROR_CHARS - 3] + "..."


def _invalid(e: InvalidInput) -> int:
    """A refused snapshot: one line naming the JSON path, exit code 2."""
    print(_one_line(f"lbctl decide: invalid snapshot: {e}"), file=sys.stderr)
    return 2
