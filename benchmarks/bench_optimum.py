"""Moves near the optimum: our pair's moves against the fewest that balance the same snapshot.

The scoreboard counts moves; this says how many of them a perfect planner would have needed. For
every bundled scenario the fast simulator plays our pair, and each cycle in which our cycle emits
unloads or transfers is a **snapshot**: the live brokers, the bundles each owns and the bundles'
figures in that cycle's reports, plus the view the policies read. Per snapshot:

* **ours**: the moves our cycle emitted there (unloads + transfers);
* **optimum**: the fewest moves, then the fewest bytes moved, that bring every broker within the
  balance band (usage <= ``loadBalancerBalancedMaxOverMean`` x mean, the scoreboard's usage),
  from ``producers.optimum.fewest_moves`` (HiGHS, a time limit per solve; a solve that hit it
  is marked, and its proven lower bound is what the ratio uses, so a timeout never flatters us);
* **at ours' level**: where our moves reached the band, the fewest moves that reach the
  max/mean ours reached (our pair aims tighter than the band; this separates that choice from
  the efficiency of its moves);
* **each Pulsar pair**: the moves that pair's cycle emits on the same view, from a fresh cycle
  state (the view's recently-unloaded bundles still count); a shedder that waits for its
  condition on several cycles in a row (TransferShedder's hit count) gets those cycles on the
  same view, and its first cycle that moves bundles is its answer;
* **after**: max/mean once a set of moves is applied in the snapshot's model (transfers only: an
  unload's destination is chosen later, by the lookup, so its ``after`` is not known here).

A snapshot **needs balancing** when its max/mean is above the band, judged as the shedder and
the scoreboard judge it: per isolation pool, each pool's busiest broker over that pool's own
mean, from the cycle's reports (the scoreboard's usage); the optimum is then solved per pool
above the band (load cannot cross a pool's edge). The headline figure is our
moves over the optimum, both summed over those snapshots (target: at most 1.10); ``summary``
adds the cross-checks, and ``per_scenario`` each scenario's moves inside the band (target 0)
and its moves per episode against the optimum at the episode's start (target: at most 1.25
overall, 1.5 on every scenario). An **episode** is a run of consecutive cycles above the band
in which ours moved, cycles in which ours waited included (waiting for a second report never
splits an episode), on one fleet: a broker that joins, leaves or crashes ends the episode and
the next cycle above the band starts another, solved on the new fleet (the optimum at the first
cycle is of the brokers that cycle had: it never fills a broker that joins later, so an episode
across a join charged ours with the join's rebalance against an optimum that had none).
Snapshots where no reassignment reaches the band (one bundle
alone above it) are counted apart.

Run: ``.venv/bin/python benchmarks/bench_optimum.py [--scenarios a,b] [--seed 0]
[--time-limit 10] [--json]`` (needs the ``bench`` extra: ``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadbalance.cycle import CycleState, step, weights_from_config
from loadbalance.model import LocalBrokerData
from loadbalance.view import ClusterView
from producers.fast_sim import FastSim, make_config
from producers.optimum import (
    INFEASIBLE,
    NO_PLAN,
    OPTIMAL,
    TIME_LIMIT,
    Plan,
    Snapshot,
    SolverMissing,
    broker_usage,
    fewest_moves,
    from_reports,
    max_over_mean,
    moves_of,
)
from producers.scenarios import Scenario, available_scenarios, load_scenario
from producers.scoreboard import BALANCE_RATIO as BAND
from producers.scoreboard import OUR_PAIR_KEY, PAIRS, PULSAR_PAIR_KEYS, pooled_max_over_mean


@dataclass
class Captured:
    """One cycle in which our pair moved bundles or the cluster was above the band.

    ``ratio`` is the scoreboard's: the worst pool's max/mean of the cycle's reports."""

    cycle: int
    view: ClusterView
    reports: dict[str, LocalBrokerData]
    moves: dict[str, str | None]
    ratio: float


class CapturingSim(FastSim):
    """The fast simulator, keeping the view and reports of every cycle that moved bundles or
    had a pool above the band (a cycle above the band where ours waits is still part of the
    episode)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, keep_reports=True, **kwargs)
        self.captured: list[Captured] = []

    def tick(self, cycle: int) -> None:
        seen = len(self.run_data.decisions)
        super().tick(cycle)
        moves = moves_of(self.run_data.decisions[seen:])
        ratio = pooled_max_over_mean(self.run_data.usage[-1], self.run_data.pools)
        band = self.config.load_balancer_balanced_max_over_mean
        if (moves or ratio > band) and self.view is not None:
            self.captured.append(
                Captured(cycle, self.view, self.run_data.reports[-1], moves, ratio)
            )


def split_snapshot(snap: Snapshot, pools: dict[str, str]) -> list[Snapshot]:
    """The snapshot per isolation pool (``pools``: broker -> pool; empty: one pool). Load cannot
    cross a pool's edge, so each pool is balanced against its own mean, as the shedder and the
    scoreboard judge it; a bundle belongs to its owner's pool."""
    if not pools:
        return [snap]
    names = sorted({pools.get(b.name, "") for b in snap.brokers})
    return [
        Snapshot(
            tuple(b for b in snap.brokers if pools.get(b.name, "") == p),
            tuple(k for k in snap.bundles if pools.get(k.owner, "") == p),
        )
        for p in names
    ]


def pooled_fewest(snap: Snapshot, pools: dict[str, str], band: float, time_limit_s: float) -> Plan:
    """``fewest_moves`` per pool above the band, summed: the fewest moves that bring every
    pool within ``band`` x its own mean (a pool of one broker, or inside the band, needs none)."""
    parts = [
        fewest_moves(p, band, time_limit_s=time_limit_s)
        for p in split_snapshot(snap, pools)
        if len(p.brokers) > 1 and max_over_mean(broker_usage(p)) > band
    ]
    if not pools:
        return parts[0] if parts else fewest_moves(snap, band, time_limit_s=time_limit_s)
    statuses = {p.status for p in parts}
    status = next((s for s in (INFEASIBLE, NO_PLAN, TIME_LIMIT) if s in statuses), OPTIMAL)
    moves = {b: d for p in parts for b, d in p.moves.items()}
    return Plan(
        status, moves, sum(p.lower_bound for p in parts), sum(p.bytes_per_s for p in parts),
        sum(p.seconds for p in parts), all(p.bytes_proven for p in parts),
    )  # fmt: skip


NOT_SOLVED = "not solved"


@dataclass
class Row:
    """One snapshot's figures."""

    scenario: str
    cycle: int
    brokers: int
    bundles: int
    ratio: float
    needed: bool
    ours: int
    ours_after: float | None
    optimum: int | None
    optimum_lower: int
    status: str
    solve_s: float
    optimum_bytes_per_s: float
    ours_bytes_per_s: float
    bytes_proven: bool = False
    optimum_at_ours: int | None = None
    optimum_at_ours_status: str = ""
    pulsar: dict[str, int] = field(default_factory=dict)
    pulsar_after: dict[str, float | None] = field(default_factory=dict)
    fleet: int = 0  # which brokers the snapshot had (``_fleet``): an episode keeps one fleet


def _fleet(snap: Snapshot) -> int:
    """A stable digest of the snapshot's broker names (the same in every process)."""
    return zlib.crc32("\n".join(sorted(b.name for b in snap.brokers)).encode())


def _after(snap: Snapshot, moves: dict[str, str | None], pools: dict[str, str]) -> float | None:
    if any(dest is None for dest in moves.values()):
        return None
    usage = broker_usage(snap, {b: d for b, d in moves.items() if d})
    return round(pooled_max_over_mean(usage, pools), 3)


def _pulsar_moves(scenario: Scenario, cap: Captured, seed: int) -> dict[str, dict[str, Any]]:
    """Each Pulsar pair's moves on the snapshot's view. A shedder that waits for its condition
    to hold several cycles in a row (TransferShedder's hit count) gets those cycles on the same
    view, at the same time: the first cycle that moves bundles is the pair's answer."""
    out: dict[str, dict[str, Any]] = {}
    for key in PULSAR_PAIR_KEYS:
        config = make_config(scenario, PAIRS[key].overrides)
        state = CycleState()
        moves: dict[str, Any] = {}
        for _ in range(config.load_balancer_shedding_condition_hit_count_threshold + 1):
            state, result = step(
                replace(state, last_shedding_ms=None, last_split_ms=None),
                cap.view,
                config,
                now_ms=cap.cycle * scenario.tick_ms,
                cycle=f"{scenario.name}:{cap.cycle}",
                seed=seed,
            )
            moves = moves_of(result.decisions)
            if moves:
                break
        out[key] = moves
    return out


def snapshot_rows(name: str, seed: int, time_limit_s: float) -> list[Row]:
    """Play ``name`` with our pair and score every cycle in which it moved bundles; a cycle
    above the band in which it did not move is kept for the episodes (and solved when it starts
    one), never scored on its own."""
    scenario = load_scenario(name, seed)
    config = make_config(scenario, PAIRS[OUR_PAIR_KEY].overrides)
    sim = CapturingSim(scenario, config, seed=seed)
    sim.run()
    band = config.load_balancer_balanced_max_over_mean
    weights = weights_from_config(config)
    pools = dict(sim.run_data.pools)
    rows: list[Row] = []
    prev = (-2, OPTIMAL)  # the last cycle above the band, and its optimum's status
    prev_fleet = None
    for cap in sim.captured:
        snap = from_reports(cap.reports, scenario.model.brokers, scenario.model.cost, weights)
        needed = cap.ratio > band
        fleet = _fleet(snap)
        starts = needed and (
            prev[0] != cap.cycle - 1 or prev[1] == INFEASIBLE or fleet != prev_fleet
        )
        prev_fleet = fleet
        if needed:
            prev = (cap.cycle, NOT_SOLVED)
        if not cap.moves and not starts:
            rows.append(_waiting_row(name, cap, snap, needed, fleet))
            continue
        plan = pooled_fewest(snap, pools, band, time_limit_s)
        if needed:
            prev = (cap.cycle, plan.status)
        sizes = {k.name: k.bytes_per_s for k in snap.bundles}
        theirs = _pulsar_moves(scenario, cap, seed) if cap.moves else {}
        ours_after = _after(snap, cap.moves, pools)
        same = None
        if needed and ours_after is not None and ours_after <= band:
            level = max(ours_after, 1.0) + 1e-6
            same = pooled_fewest(snap, pools, level, time_limit_s)
        rows.append(
            Row(
                scenario=name,
                cycle=cap.cycle,
                brokers=len(snap.brokers),
                bundles=len(snap.bundles),
                ratio=round(cap.ratio, 3),
                needed=needed,
                ours=len(cap.moves),
                ours_after=ours_after,
                optimum=None if plan.status in (INFEASIBLE, NO_PLAN) else plan.count,
                optimum_lower=plan.lower_bound,
                status=plan.status,
                solve_s=round(plan.seconds + (0.0 if same is None else same.seconds), 2),
                optimum_bytes_per_s=plan.bytes_per_s,
                bytes_proven=plan.bytes_proven,
                ours_bytes_per_s=sum(sizes.get(b, 0.0) for b in cap.moves),
                pulsar={k: len(v) for k, v in theirs.items()},
                pulsar_after={k: _after(snap, v, pools) for k, v in theirs.items()},
                optimum_at_ours=None if same is None or same.status != OPTIMAL else same.count,
                optimum_at_ours_status="" if same is None else same.status,
                fleet=fleet,
            )
        )
    return rows


def _waiting_row(name: str, cap: Captured, snap: Snapshot, needed: bool, fleet: int) -> Row:
    """A cycle above the band inside an episode in which ours moved nothing (not solved)."""
    return Row(
        scenario=name, cycle=cap.cycle, brokers=len(snap.brokers), bundles=len(snap.bundles),
        ratio=round(cap.ratio, 3), needed=needed, ours=0, ours_after=None, optimum=None,
        optimum_lower=0, status=NOT_SOLVED, solve_s=0.0, optimum_bytes_per_s=0.0,
        ours_bytes_per_s=0.0, fleet=fleet,
    )  # fmt: skip


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def table(rows: list[Row]) -> str:
    head = ["scenario", "cycle", "max/mean", "ours", "ours after", "optimum", "at ours' level"]
    head += ["solve s"]
    head += list(PULSAR_PAIR_KEYS)
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in (r for r in rows if r.ours):
        if r.status == OPTIMAL:
            opt = str(r.optimum)
        elif r.status == INFEASIBLE:
            opt = "unreachable"
        else:
            opt = f"{r.optimum if r.optimum is not None else '?'} (>= {r.optimum_lower}, limit)"
        cells = [r.scenario, str(r.cycle), f"{r.ratio:.2f}" + ("" if r.needed else " (in band)")]
        level = "-" if r.optimum_at_ours is None else str(r.optimum_at_ours)
        if r.optimum_at_ours_status and r.optimum_at_ours_status != OPTIMAL:
            level = r.optimum_at_ours_status
        cells += [str(r.ours), _fmt(r.ours_after), opt, level, f"{r.solve_s:.1f}"]
        cells += [f"{r.pulsar[k]} ({_fmt(r.pulsar_after[k])})" for k in PULSAR_PAIR_KEYS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _episodes(rows: list[Row]) -> list[list[Row]]:
    """Runs of consecutive cycles of one scenario above the band (the cycles in which ours
    waited included) in which ours moved, from their first cycle whose optimum can reach the
    band (before it one bundle alone is above the band: it is split first); ours counts every
    move of the run."""
    out: list[list[Row]] = []
    for run in _runs(rows):
        start = next((i for i, r in enumerate(run) if r.status != INFEASIBLE), None)
        if start is not None and any(r.ours for r in run):
            first = replace(run[start], ours=sum(r.ours for r in run[: start + 1]))
            out.append([first, *run[start + 1 :]])
    return out


def _runs(rows: list[Row]) -> list[list[Row]]:
    """Runs of rows in consecutive cycles of one scenario and one fleet that need balancing."""
    out: list[list[Row]] = []
    for r in rows:
        if not r.needed:
            continue
        last = out[-1][-1] if out else None
        if (
            last is not None
            and last.scenario == r.scenario
            and r.cycle == last.cycle + 1
            and r.fleet == last.fleet
        ):
            out[-1].append(r)
        else:
            out.append([r])
    return out


def summary(rows: list[Row]) -> dict[str, Any]:
    """Totals over the snapshots that need balancing and can reach the band.

    ``ratio`` is the headline: our moves over the optimum's, summed over those snapshots (the
    proven lower bound where a solve hit its limit). Two cross-checks: ``ratio_at_ours_level``
    compares, on the snapshots where our moves reached the band, our moves with the fewest that
    reach the same max/mean ours reached (our pair balances tighter than the band, which costs
    moves the band does not ask for); ``ratio_per_episode`` sums our moves over each run of
    consecutive cycles that need balancing and compares them with the optimum at the run's first
    cycle (our pair spreads one rebalancing over cycles, which the per-snapshot sum counts as
    several smaller problems)."""
    rows_all, rows = rows, [r for r in rows if r.ours]
    scored = [r for r in rows if r.needed and r.status != INFEASIBLE]
    ours = sum(r.ours for r in scored)
    best = sum(r.optimum if r.optimum is not None else r.optimum_lower for r in scored)
    floor = sum(r.optimum_lower for r in scored)
    level = [r for r in scored if r.optimum_at_ours is not None]
    level_ours = sum(r.ours for r in level)
    level_opt = sum(r.optimum_at_ours or 0 for r in level)
    episodes = _episodes(rows_all)
    ep_ours = sum(r.ours for e in episodes for r in e)
    ep_opt = sum(e[0].optimum_lower for e in episodes)
    return {
        "snapshots": len(rows),
        "needing_balance": sum(1 for r in rows if r.needed),
        "unreachable": sum(1 for r in rows if r.needed and r.status == INFEASIBLE),
        "in_band_snapshots_moved": sum(1 for r in rows if not r.needed),
        "in_band_moves": sum(r.ours for r in rows if not r.needed),
        "time_limit_hits": sum(1 for r in rows if r.status not in (OPTIMAL, INFEASIBLE)),
        "bytes_pass_limit_hits": sum(1 for r in rows if r.status == OPTIMAL and not r.bytes_proven),
        "ours": ours,
        "optimum": best,
        "optimum_lower_bound": floor,
        "ratio": round(ours / floor, 3) if floor else None,
        "ours_reaching_band": sum(
            1 for r in scored if r.ours_after is not None and r.ours_after <= BAND + 1e-9
        ),
        "at_ours_level": {"snapshots": len(level), "ours": level_ours, "optimum": level_opt},
        "ratio_at_ours_level": round(level_ours / level_opt, 3) if level_opt else None,
        "episodes": {"count": len(episodes), "ours": ep_ours, "optimum_at_start": ep_opt},
        "ratio_per_episode": round(ep_ours / ep_opt, 3) if ep_opt else None,
        "ours_gb_per_min": round(sum(r.ours_bytes_per_s for r in scored) * 60 / 1e9, 2),
        "optimum_gb_per_min": round(sum(r.optimum_bytes_per_s for r in scored) * 60 / 1e9, 2),
        "pulsar": {k: sum(r.pulsar[k] for r in scored) for k in PULSAR_PAIR_KEYS},
        "pulsar_reaching_band": {
            k: sum(
                1
                for r in scored
                if r.pulsar_after[k] is not None and r.pulsar_after[k] <= BAND + 1e-9
            )
            for k in PULSAR_PAIR_KEYS
        },
    }


def per_scenario(rows: list[Row]) -> dict[str, dict[str, Any]]:
    """Per scenario: moves in snapshots inside the band (target 0), ours against the optimum
    per snapshot that needs balancing, and per episode (ours summed over a run of consecutive
    cycles that need balancing, against the optimum at the run's first cycle)."""
    out: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(r.scenario for r in rows):
        every = [r for r in rows if r.scenario == name]
        mine = [r for r in every if r.ours]
        scored = [r for r in mine if r.needed and r.status != INFEASIBLE]
        ours = sum(r.ours for r in scored)
        floor = sum(r.optimum_lower for r in scored)
        episodes = _episodes(every)
        ep_ours = sum(r.ours for e in episodes for r in e)
        ep_opt = sum(e[0].optimum_lower for e in episodes)
        out[name] = {
            "in_band_moves": sum(r.ours for r in mine if not r.needed),
            "ours": ours,
            "optimum": floor,
            "ratio": round(ours / floor, 3) if floor else None,
            "episodes": len(episodes),
            "episode_ours": ep_ours,
            "episode_optimum": ep_opt,
            "ratio_per_episode": round(ep_ours / ep_opt, 3) if ep_opt else None,
        }
    return out


def scenario_table(scenarios: dict[str, dict[str, Any]]) -> str:
    """``per_scenario`` as a markdown table."""
    head = ["scenario", "in-band moves", "ours / optimum per snapshot", "episodes"]
    head += ["ours / optimum per episode"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for name, f in scenarios.items():
        snap = f"{f['ours']} / {f['optimum']} ({_fmt(f['ratio'])})"
        ep = f"{f['episode_ours']} / {f['episode_optimum']} ({_fmt(f['ratio_per_episode'])})"
        cells = [name, str(f["in_band_moves"]), snap, str(f["episodes"]), ep]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """HiGHS prints its banner on stdout from C++ whatever its output options say; while it
    runs, file descriptor 1 points at stderr so the table or the JSON stays clean."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", default=",".join(available_scenarios()))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-limit", type=float, default=10.0, help="seconds per solve")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows: list[Row] = []
    try:
        with _stdout_to_stderr():
            for name in args.scenarios.split(","):
                rows += snapshot_rows(name, args.seed, args.time_limit)
    except SolverMissing as e:
        print(f"bench_optimum: {e}", file=sys.stderr)
        return 2
    total = summary(rows)
    total["scenarios"] = per_scenario(rows)
    total["seconds"] = round(time.perf_counter() - t0, 1)
    if args.json:
        print(json.dumps({"rows": [asdict(r) for r in rows], "summary": total}, indent=1))
        return 0
    print(table(rows), end="")
    print()
    print(scenario_table(total["scenarios"]), end="")
    print(json.dumps(total, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
