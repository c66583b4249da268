"""Dump every decision and the resulting state of several policy cycles, to compare two versions.

Speed-ups of the pure core must not change a single decision. This script runs, for every
shedder/placement pair of ``bench_cycle.py`` (and a few configuration variants that reach other
branches: bundles spread evenly per namespace, the projected overload check, transfers off),
several consecutive cycles (also from a state without report digests, as the streaming job's
driver builds it) over the seeded synthetic cluster of ``bench_cycle.py``. Between
cycles the decisions are applied to the brokers' reports (a transfer moves the bundle's stats
to its destination, an unload to the least loaded broker by name order, a split is left to the
grace period), the reports are ingested again and a new view is built, so the later cycles see
stateful shedders' memory, preallocations and grace periods at work.

Everything a cycle produces is written as text, one line per item, floats in ``repr`` (so the
same text means the same bits): each broker's ``TimeAverageBrokerData`` of the view, every
decision (``decision_to_dict``), every skip, and the ``CycleState``. Compare two dumps with
``cmp`` or ``diff``.

Run: ``.venv/bin/python benchmarks/check_cycle_equality.py --bundles 20000 --out /tmp/a.txt``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_cycle import MINUTE_MS, SHEDDERS, namespaces_for, synthetic_reports
from loadbalance.config import LoadBalancerConfig
from loadbalance.cycle import CycleState, ingest_kwargs, step
from loadbalance.decisions import TRANSFER, UNLOAD, decision_to_dict
from loadbalance.model import LocalBrokerData, ResourceUsage
from loadbalance.view import LoadState, build_view, ingest_many

VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "evenly": {"loadBalancerDistributeBundlesEvenlyEnabled": True},
    "projected-check": {"loadBalancerPlacementProjectedOverloadCheckEnabled": True},
    "no-transfer": {"loadBalancerTransferEnabled": False},
    # ThresholdShedder's default 10 MB/s minimum leaves the synthetic brokers alone
    "min-throughput-0": {"loadBalancerBundleUnloadMinThroughputThreshold": 0},
    # the state as the streaming job's driver and the snapshot reader make it: no report
    # digests, so the view sums, the split scan and placement take their long way
    "no-digests": {},
}


def _move(reports: dict[str, LocalBrokerData], bundle: str, src: str, dst: str) -> None:
    """Move one bundle's stats from ``src``'s report to ``dst``'s, broker totals following."""
    a, b = reports.get(src), reports.get(dst)
    if a is None or b is None or bundle not in a.last_stats or src == dst:
        return
    st = a.last_stats[bundle]
    a_stats = {k: v for k, v in a.last_stats.items() if k != bundle}
    b_stats = {**b.last_stats, bundle: st}
    reports[src] = _with_stats(a, a_stats)
    reports[dst] = _with_stats(b, b_stats)


def _with_stats(r: LocalBrokerData, stats: dict[str, Any]) -> LocalBrokerData:
    """The report with these bundles: rates, bandwidth and CPU scaled with the load it carries."""
    ri = sum(s.msg_rate_in for s in stats.values())
    old = r.msg_rate_in if r.msg_rate_in > 0 else 1.0
    cpu = ResourceUsage(r.cpu.usage * (ri / old if ri > 0 else 1.0), r.cpu.limit)
    return replace(
        r,
        cpu=cpu,
        bandwidth_in=ResourceUsage(ri, r.bandwidth_in.limit),
        bandwidth_out=ResourceUsage(ri, r.bandwidth_out.limit),
        msg_rate_in=ri,
        msg_rate_out=ri,
        msg_throughput_in=ri * 1024,
        msg_throughput_out=ri * 1024,
        num_topics=3 * len(stats),
        num_bundles=len(stats),
        bundles=frozenset(stats),
        last_stats=stats,
    )


def run_pair(
    name: str, variant: str, n_bundles: int, n_brokers: int, cycles: int, out: list[str]
) -> None:
    shedder, placement = SHEDDERS[name]
    config = LoadBalancerConfig(
        loadBalancerLoadSheddingStrategy=shedder,
        loadBalancerLoadPlacementStrategy=placement,
        **VARIANTS[variant],
    )
    now = 10 * MINUTE_MS
    reports = synthetic_reports(n_bundles, n_brokers, 1, now)
    namespaces = namespaces_for(n_bundles)
    kw = ingest_kwargs(config)
    lstate = LoadState()
    cstate = CycleState()
    for i in range(cycles):
        ordered = [reports[b] for b in sorted(reports)]
        lstate = ingest_many(lstate, ordered, received_at_ms=now, **kw)
        plain = LoadState(lstate.brokers, lstate.bundles) if variant == "no-digests" else lstate
        view = build_view(plain, namespaces=namespaces)
        tag = f"{name}/{variant}/cycle{i}"
        for b in sorted(view.brokers):
            out.append(f"{tag} view {b} {view.brokers[b].time_average!r}")
        cstate, res = step(cstate, view, config, now_ms=now, cycle=f"c{i}")
        for d in res.decisions:
            out.append(f"{tag} decision {json.dumps(decision_to_dict(d), sort_keys=True)}")
        for s in res.skips:
            out.append(f"{tag} skip {s!r}")
        out.append(f"{tag} ran split={res.split_ran} shed={res.shedding_ran}")
        out.append(f"{tag} state {cstate!r}")
        for d in res.decisions:
            if d.kind == TRANSFER and d.source_broker and d.destination_broker:
                _move(reports, d.bundle, d.source_broker, d.destination_broker)
            elif d.kind == UNLOAD and d.source_broker:
                dst = min(reports, key=lambda b: (reports[b].msg_rate_in, b))
                _move(reports, d.bundle, d.source_broker, dst)
        now += MINUTE_MS
        reports = {b: replace(r, last_update_ms=now) for b, r in reports.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundles", type=int, default=20_000)
    p.add_argument("--brokers", type=int, default=400)
    p.add_argument("--cycles", type=int, default=6)
    p.add_argument("--shedders", default=",".join(SHEDDERS))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    lines: list[str] = []
    for variant in args.variants.split(","):
        for name in args.shedders.split(","):
            if variant == "min-throughput-0" and name != "ThresholdShedder":
                continue
            run_pair(name, variant, args.bundles, args.brokers, args.cycles, lines)
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text, encoding="utf-8")
    n_dec = sum(1 for line in lines if " decision " in line)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    print(f"{len(lines)} lines, {n_dec} decisions, sha256 {digest} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
