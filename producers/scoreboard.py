"""``lbctl bench balance``: every scenario, every strategy pair, one balance-quality table.

Each (scenario, pair) runs in fast mode with the same seed, so the pairs see the same world and
the same starting ownership; only the policies differ. What is scored, and why:

* **cycles to balance**: cycles after the last disturbance until the busiest broker is within
  1.10 x the mean usage (Cruise Control's default balance threshold) and stays there for
  5 cycles. ``never`` when that does not happen before the run ends.
* **moves / splits / oscillations**: bundle moves made by shedding decisions (lookups of freed
  bundles are not moves), splits, and moves that undo recent work: the bundle moved again inside
  ``loadBalancerSheddingGracePeriodMinutes``, or went back to the broker it had just left.
* **useful / churn** (Cruise Control's verifier, in spirit): on scale-out or after a restart only
  moves onto the joining brokers are useful; after a scale-in or crash only displaced bundles
  should move, so moves of other bundles count as churn.
* **peak after event**: the highest broker usage seen after the first event (herding shows here).
* **end MAD**: mean absolute deviation of broker usage over the last 5 cycles, in points.
* **policy ms**: wall time of ``cycle.step`` plus lookups per cycle (the pure core only).
* **bytes moved / connections disturbed** (what the moves cost the clients): per move, the
  moved bundle's figures in the last report that showed it on the broker it left, at or before
  the move's cycle (the traffic at the time of the move, not a long-term average, because that
  is the traffic cut over). Bytes moved is its throughput in + out (bytes/s) times one report
  interval, summed over moves, in GB: the traffic a move re-routes in the cycle it happens.
  Connections disturbed is its producers + consumers summed over moves: every client of a moved
  bundle's topics is disconnected and reconnects to the new owner. Both need the run's reports
  (``keep_reports``); ``-`` without them.
* **policy violations** (scenarios with placement policies or heartbeat namespaces): over every
  cycle, the rules the ownership at the cycle's end breaks (``producers.policy_violations``:
  isolation, anti-affinity spread over brokers and failure domains, heartbeat pinning), judged
  apart from the filters that chose the owners. A run with any violation **fails**: ``failures``
  names it, and ``lbctl bench balance`` exits with status 1.
* **pools**: an isolation policy splits the brokers into pools that take different namespaces
  (``policy_violations.isolation_pools``). Load cannot cross a pool's edge, so a cluster-wide
  max/mean would never reach the band however well each pool is balanced. With pools, the
  balance ratio of a cycle is that of the worst pool (each pool's busiest broker over the pool's
  own mean), end MAD is taken from each broker's pool mean, and the per-pool cycles to balance
  and end max/mean are reported as well. Without isolation there is one pool and nothing changes.
* **in-band moves**: moves (unloads and transfers) decided in a cycle whose reports already had
  the cluster within the balance band (each pool's busiest broker at most
  ``loadBalancerBalancedMaxOverMean`` x the pool's mean). Every move disconnects clients and a
  cluster inside the band gains nothing the band does not give; target 0.
* **max moves of one bundle in 60 cycles**: the most moves any single bundle made inside any
  window of 60 consecutive cycles, leaving out bundles a scenario event displaced (a crash or a
  leave freed them, so moving them on is recovery, not churn). A bundle moved back and forth
  shows here even when each move waits out the grace period.

Outputs go to ``--out``: ``balance.json``, ``balance.md`` and ``balance.png`` (max and mean broker
usage over time, one panel per scenario, one colour per pair).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Collection, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loadbalance.config import LoadBalancerConfig
from loadbalance.decisions import TRANSFER, UNLOAD, Decision
from loadbalance.model import NamespaceBundleStats
from producers.fast_sim import Move, SimRun, simulate
from producers.scenarios import ADD_BROKERS, CRASH, REMOVE_BROKERS, RESTART, load_scenario

BALANCE_RATIO = LoadBalancerConfig().load_balancer_balanced_max_over_mean  # one value: the knob
HOLD_CYCLES = 5
MOVE_WINDOW_CYCLES = 60
GB = 1e9
_IMPL = "org.apache.pulsar.broker.loadbalance.impl."
_EXT = "org.apache.pulsar.broker.loadbalance.extensions.scheduler."


@dataclass(frozen=True, slots=True)
class StrategyPair:
    """A shedder and a placement strategy, with any knobs the pair needs."""

    key: str
    label: str
    overrides: Mapping[str, Any]
    pulsar: bool = True


def _pair(key: str, label: str, shedder: str, placement: str, **knobs: Any) -> StrategyPair:
    return StrategyPair(
        key,
        label,
        {
            "loadBalancerLoadSheddingStrategy": shedder,
            "loadBalancerLoadPlacementStrategy": _IMPL + placement,
            **knobs,
        },
    )


PAIRS: dict[str, StrategyPair] = {
    p.key: p
    for p in (
        _pair(
            "classic",
            "ThresholdShedder + LeastLongTermMessageRate",
            _IMPL + "ThresholdShedder",
            "LeastLongTermMessageRate",
        ),
        _pair(
            "uniform",
            "UniformLoadShedder + LeastLongTermMessageRate",
            _IMPL + "UniformLoadShedder",
            "LeastLongTermMessageRate",
        ),
        _pair(
            "overload",
            "OverloadShedder + LeastLongTermMessageRate",
            _IMPL + "OverloadShedder",
            "LeastLongTermMessageRate",
        ),
        _pair(
            "extensible",
            "TransferShedder + LeastResourceUsageWithWeight",
            _EXT + "TransferShedder",
            "LeastResourceUsageWithWeight",
        ),
        StrategyPair(
            "ours",
            "ProjectedUsageShedder + LeastProjectedUsage",
            {
                "loadBalancerLoadSheddingStrategy": "ProjectedUsageShedder",
                "loadBalancerLoadPlacementStrategy": "LeastProjectedUsage",
                "loadBalancerDistributeBundlesEvenlyEnabled": False,
                "loadBalancerPlacementProjectedOverloadCheckEnabled": True,
            },
            pulsar=False,
        ),
    )
}
PULSAR_PAIR_KEYS = ("classic", "uniform", "overload", "extensible")
ALL_PAIR_KEYS = (*PULSAR_PAIR_KEYS, "ours")
OUR_PAIR_KEY = "ours"


@dataclass(frozen=True)
class Score:
    """One row of the scoreboard."""

    scenario: str
    pair: str
    label: str
    cycles: int
    balanced_after: int | None
    moves: int
    splits: int
    oscillations: int
    useful: int | None
    churn: int | None
    peak_after_event_pct: float | None
    end_mad_pct: float
    end_max_over_mean: float
    policy_ms_mean: float
    policy_ms_p90: float
    bytes_moved_gb: float | None = None
    connections_disturbed: int | None = None
    max_moves_one_bundle_60: int = 0
    in_band_moves: int = 0
    policy_violations: int | None = None
    first_violation: str = ""
    pools_balanced_after: dict[str, int | None] = field(default_factory=dict)
    pools_end_max_over_mean: dict[str, float] = field(default_factory=dict)
    series_max_pct: list[float] = field(default_factory=list, repr=False)
    series_mean_pct: list[float] = field(default_factory=list, repr=False)


def max_over_mean(usage: Mapping[str, float]) -> float:
    """The busiest broker's usage over the mean (inf for no brokers or an idle cluster)."""
    if not usage:
        return float("inf")
    mean = sum(usage.values()) / len(usage)
    return max(usage.values()) / mean if mean > 0 else float("inf")


def _mad(usage: Mapping[str, float]) -> float:
    if not usage:
        return 0.0
    mean = sum(usage.values()) / len(usage)
    return sum(abs(u - mean) for u in usage.values()) / len(usage)


def split_pools(
    usage: Mapping[str, float], pools: Mapping[str, str]
) -> dict[str, dict[str, float]]:
    """One cycle's usage per pool (``pools``: broker -> pool; empty: one pool of all)."""
    if not pools:
        return {"": dict(usage)}
    out: dict[str, dict[str, float]] = {}
    for b, u in usage.items():
        out.setdefault(pools.get(b, ""), {})[b] = u
    return out


def pooled_max_over_mean(usage: Mapping[str, float], pools: Mapping[str, str]) -> float:
    """The worst pool's max/mean: the cluster is balanced when every pool is."""
    if not pools:
        return max_over_mean(usage)
    return max((max_over_mean(u) for u in split_pools(usage, pools).values()), default=0.0)


def pooled_mad(usage: Mapping[str, float], pools: Mapping[str, str]) -> float:
    """Mean absolute deviation of each broker from its own pool's mean."""
    if not pools:
        return _mad(usage)
    parts = split_pools(usage, pools).values()
    total = sum(_mad(u) * len(u) for u in parts)
    return total / len(usage) if usage else 0.0


def balanced_after(ratios: Sequence[float], start: int, hold: int = HOLD_CYCLES) -> int | None:
    """Cycles from ``start`` until ``hold`` consecutive cycles are within the balance band."""
    run = 0
    for c in range(start, len(ratios)):
        run = run + 1 if ratios[c] <= BALANCE_RATIO else 0
        if run >= hold:
            return c - hold + 1 - start
    return None


def moved_stats(run: SimRun, move: Move) -> NamespaceBundleStats | None:
    """The moved bundle's figures at the time of the move: those of the last report, at or
    before the move's cycle, that showed it on the broker it left. A transfer's source reports it
    in the move's own cycle; an unload is recorded when a later lookup places the bundle, so its
    source reported it a cycle or more before. ``None`` without reports."""
    for c in range(min(move.cycle, len(run.reports) - 1), -1, -1):
        report = run.reports[c].get(move.source)
        stats = None if report is None else report.last_stats.get(move.bundle)
        if stats is not None:
            return stats
    return None


def move_costs(run: SimRun, tick_seconds: float) -> tuple[float | None, int | None]:
    """(bytes moved in GB, connections disturbed) over the run's moves; ``None`` without reports.

    Bytes: throughput in + out (bytes/s) x one report interval per move. Connections: producers
    + consumers of the moved bundle's topics per move."""
    if not run.reports:
        return None, None
    total_bytes = 0.0
    clients = 0
    for m in run.moves:
        stats = moved_stats(run, m)
        if stats is None:
            continue
        total_bytes += (stats.msg_throughput_in + stats.msg_throughput_out) * tick_seconds
        clients += stats.producer_count + stats.consumer_count
    return round(total_bytes / GB, 2), clients


def max_moves_in_window(
    moves: Sequence[Move], exclude: Collection[str], window: int = MOVE_WINDOW_CYCLES
) -> int:
    """The most moves of one bundle inside any ``window`` consecutive cycles, leaving out the
    bundles in ``exclude`` (those displaced by scenario events)."""
    cycles: dict[str, list[int]] = {}
    for m in moves:
        if m.bundle not in exclude:
            cycles.setdefault(m.bundle, []).append(m.cycle)
    best = 0
    for seen in cycles.values():
        seen.sort()
        lo = 0
        for hi, c in enumerate(seen):
            while c - seen[lo] >= window:
                lo += 1
            best = max(best, hi - lo + 1)
    return best


def in_band_moves(
    decisions: Iterable[Decision],
    ratios: Sequence[float],
    tick_ms: int,
    band: float = BALANCE_RATIO,
) -> int:
    """Unloads and transfers decided in a cycle whose balance ratio (``ratios``, per cycle) was
    already within ``band``."""
    count = 0
    for d in decisions:
        if d.kind not in (TRANSFER, UNLOAD):
            continue
        c = d.decided_at_ms // tick_ms
        if 0 <= c < len(ratios) and ratios[c] <= band:
            count += 1
    return count


def score_run(
    run: SimRun, pair: StrategyPair, kinds: set[str], *, tick_seconds: float = 60.0
) -> Score:
    """Turn one run's recordings into a scoreboard row (``tick_seconds``: one report interval,
    the scenario's cycle, for bytes moved)."""
    pools = run.pools
    ratios = [pooled_max_over_mean(u, pools) for u in run.usage]
    start = max(run.event_cycles, default=0)
    first_event = min(run.event_cycles, default=None)
    useful = churn = None
    after = [m for m in run.moves if first_event is not None and m.cycle >= first_event]
    if ADD_BROKERS in kinds or RESTART in kinds:
        useful = sum(1 for m in after if m.destination in run.joined)
        churn = len(after) - useful
    elif REMOVE_BROKERS in kinds or CRASH in kinds:
        churn = sum(1 for m in after if m.bundle not in run.displaced)
    peak = None
    if first_event is not None:
        peak = max((max(u.values()) for u in run.usage[first_event:] if u), default=0.0) * 100
    tail = run.usage[-HOLD_CYCLES:]
    ms = sorted(run.policy_ms) or [0.0]
    moved_gb, disturbed = move_costs(run, tick_seconds)
    return Score(
        scenario=run.scenario,
        pair=pair.key,
        label=pair.label,
        cycles=run.cycles,
        balanced_after=balanced_after(ratios, start),
        moves=len(run.moves),
        splits=run.splits,
        oscillations=sum(1 for m in run.moves if m.oscillation),
        useful=useful,
        churn=churn,
        peak_after_event_pct=None if peak is None else round(peak, 1),
        end_mad_pct=(
            round(statistics.fmean(pooled_mad(u, pools) for u in tail) * 100, 2) if tail else 0.0
        ),
        end_max_over_mean=round(ratios[-1], 3) if ratios else 0.0,
        policy_ms_mean=round(statistics.fmean(ms), 3),
        policy_ms_p90=round(ms[int(0.9 * (len(ms) - 1))], 3),
        bytes_moved_gb=moved_gb,
        connections_disturbed=disturbed,
        max_moves_one_bundle_60=max_moves_in_window(run.moves, run.displaced),
        in_band_moves=in_band_moves(run.decisions, ratios, int(tick_seconds * 1000)),
        policy_violations=sum(run.violations) if run.violations else None,
        first_violation=_first_violation(run),
        pools_balanced_after=_pool_balance(run, pools, start),
        pools_end_max_over_mean={
            name: round(max_over_mean(u), 3)
            for name, u in sorted(split_pools(run.usage[-1], pools).items())
        }
        if pools and run.usage
        else {},
        series_max_pct=[round(max(u.values()) * 100, 2) if u else 0.0 for u in run.usage],
        series_mean_pct=[round(sum(u.values()) / len(u) * 100, 2) if u else 0.0 for u in run.usage],
    )


def _first_violation(run: SimRun) -> str:
    if not run.violation_examples:
        return ""
    cycle, v = run.violation_examples[0]
    return f"cycle {cycle}: {v.rule} {v.subject}: {v.detail}"


def _pool_balance(run: SimRun, pools: Mapping[str, str], start: int) -> dict[str, int | None]:
    """Per pool: cycles after the last event until the pool is within the band (a pool with
    one live broker is balanced by definition)."""
    if not pools:
        return {}
    names = sorted(set(pools.values()))
    series: dict[str, list[float]] = {n: [] for n in names}
    for u in run.usage:
        parts = split_pools(u, pools)
        for n in names:
            series[n].append(max_over_mean(parts[n]) if parts.get(n) else 1.0)
    return {n: balanced_after(series[n], start) for n in names}


def failures(scores: Sequence[Score]) -> list[tuple[str, str, str]]:
    """(scenario, pair, why) for every run that failed: one that broke a placement policy at
    some cycle. A failed run scores nothing else: balance bought by breaking an operator's
    rule is not balance."""
    return [
        (s.scenario, s.pair, f"{s.policy_violations} policy violations ({s.first_violation})")
        for s in scores
        if s.policy_violations
    ]


def failure_text(scores: Sequence[Score]) -> str:
    rows = failures(scores)
    return "\n".join(f"FAILED {name} / {pair}: {why}" for name, pair, why in rows)


def run_one(
    scenario_name: str, pair_key: str, seed: int, cycles: int | None, report_lag_cycles: int = 0
) -> Score:
    """One (scenario, pair) run; a module-level function so a process pool can call it."""
    scenario = load_scenario(scenario_name, seed)
    pair = PAIRS[pair_key]
    run = simulate(
        scenario, pair.overrides, seed=seed, cycles=cycles, keep_reports=True,
        report_lag_cycles=report_lag_cycles,
    )  # fmt: skip
    return score_run(run, pair, scenario.kinds, tick_seconds=scenario.tick_ms / 1000.0)


def run_scoreboard(
    scenarios: Iterable[str],
    pairs: Iterable[str],
    *,
    seed: int = 0,
    cycles: int | None = None,
    workers: int = 2,
    report_lag_cycles: int = 0,
) -> list[Score]:
    """Every scenario under every pair; rows in (scenario, pair) order (``report_lag_cycles``:
    brokers report the ownership of that many cycles ago, ``FastSim``)."""
    jobs = [(s, p) for s in scenarios for p in pairs]
    lag = report_lag_cycles
    if workers <= 1 or len(jobs) <= 1:
        return [run_one(s, p, seed, cycles, lag) for s, p in jobs]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(run_one, s, p, seed, cycles, lag) for s, p in jobs]
        return [f.result() for f in futures]


COLUMNS = (
    ("scenario", "scenario"),
    ("pair", "pair"),
    ("balanced_after", "cycles to balance"),
    ("moves", "moves"),
    ("splits", "splits"),
    ("oscillations", "oscillations"),
    ("max_moves_one_bundle_60", "max moves of a bundle in 60 cycles"),
    ("in_band_moves", "in-band moves"),
    ("policy_violations", "policy violations"),
    ("bytes_moved_gb", "GB moved"),
    ("connections_disturbed", "connections disturbed"),
    ("useful", "useful"),
    ("churn", "churn"),
    ("peak_after_event_pct", "peak after event %"),
    ("end_mad_pct", "end MAD pts"),
    ("end_max_over_mean", "end max/mean"),
    ("pools_balanced_after", "cycles to balance per pool"),
    ("pools_end_max_over_mean", "end max/mean per pool"),
    ("policy_ms_mean", "policy ms/cycle"),
)


def cell(score: Score, key: str) -> str:
    """One figure of a score as the scoreboard's tables print it."""
    value = getattr(score, key)
    if key == "balanced_after" and value is None:
        return "never"
    if isinstance(value, dict):
        if not value:
            return "-"
        return ", ".join(f"{k} {_pool_cell(v)}" for k, v in value.items())
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}" if key != "peak_after_event_pct" else f"{value:.1f}"
    return str(value)


def _pool_cell(value: float | int | None) -> str:
    if value is None:
        return "never"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def to_rows(scores: Sequence[Score]) -> list[list[str]]:
    return [[cell(s, k) for k, _ in COLUMNS] for s in scores]


def to_markdown(scores: Sequence[Score]) -> str:
    head = "| " + " | ".join(t for _, t in COLUMNS) + " |"
    sep = "|" + "|".join("---" for _ in COLUMNS) + "|"
    body = ["| " + " | ".join(r) + " |" for r in to_rows(scores)]
    return "\n".join([head, sep, *body]) + "\n"


def to_text(scores: Sequence[Score]) -> str:
    rows = [[t for _, t in COLUMNS], *to_rows(scores)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows) + "\n"


def to_json(scores: Sequence[Score], meta: Mapping[str, Any]) -> str:
    doc = {
        "meta": dict(meta),
        "columns": [k for k, _ in COLUMNS],
        "rows": [asdict(s) for s in scores],
    }
    return json.dumps(doc, indent=1)


def score_dict(score: Score) -> dict[str, Any]:
    """A row without its per-cycle series (for one-line JSON summaries)."""
    doc = asdict(score)
    doc.pop("series_max_pct")
    doc.pop("series_mean_pct")
    return doc


def _key(s: Score) -> tuple[float, int, float, int]:
    never = float("inf") if s.balanced_after is None else float(s.balanced_after)
    return (never, s.oscillations, s.end_mad_pct, s.moves + s.splits)


def verdicts(scores: Sequence[Score]) -> list[tuple[str, str, str]]:
    """Per scenario: (scenario, best Pulsar pair, ours vs it: better / no worse / worse).

    The best Pulsar pair ranks first on (cycles to balance, oscillations, end MAD, moves +
    splits), leaving out failed runs (``failures``); ours is *worse* when its run failed. Ours is
    *no worse* when it balances at least as fast, oscillates no more, ends within 0.25 points of
    its MAD and peaks within 1 point after events; *better* when, on top, it balances faster,
    oscillates less, ends 0.5 points flatter or peaks 2 points lower.
    """
    out: list[tuple[str, str, str]] = []
    for name in dict.fromkeys(s.scenario for s in scores):
        rows = [s for s in scores if s.scenario == name]
        ours = next((s for s in rows if s.pair == OUR_PAIR_KEY), None)
        theirs = [s for s in rows if s.pair in PULSAR_PAIR_KEYS and not s.policy_violations]
        if ours is None or not theirs:
            continue
        best = min(theirs, key=_key)
        if ours.policy_violations:
            out.append((name, best.pair, "worse"))
            continue
        k_o, k_b = _key(ours), _key(best)
        peak_o, peak_b = ours.peak_after_event_pct or 0.0, best.peak_after_event_pct or 0.0
        no_worse = (
            k_o[0] <= k_b[0]
            and k_o[1] <= k_b[1]
            and k_o[2] <= k_b[2] + 0.25
            and peak_o <= peak_b + 1.0
        )
        better = no_worse and (
            k_o[0] < k_b[0] or k_o[1] < k_b[1] or k_o[2] <= k_b[2] - 0.5 or peak_o <= peak_b - 2
        )
        verdict = "better" if better else "no worse" if no_worse else "worse"
        out.append((name, best.pair, verdict))
    return out


def verdict_text(scores: Sequence[Score]) -> str:
    rows = verdicts(scores)
    if not rows:
        return ""
    lines = [f"  {n}: ours {v} (best Pulsar pair there: {b})" for n, b, v in rows]
    better = sum(1 for *_, v in rows if v == "better")
    worse = sum(1 for *_, v in rows if v == "worse")
    lines.append(f"ours: better on {better}/{len(rows)} scenarios, worse on {worse}")
    return "\n".join(lines)


class PlotsMissing(RuntimeError):
    """matplotlib (the ``plots`` extra) is not installed."""


def write_chart(scores: Sequence[Score], path: Path) -> None:
    """Max (solid) and mean (dotted) broker usage per cycle; one panel per scenario.

    matplotlib is the optional ``plots`` extra (one chart does not justify it as a core
    dependency), so it is imported here and its absence is named with the install command.
    """
    try:  # matplotlib: the optional 'plots' extra (see above)
        import matplotlib
    except ModuleNotFoundError as e:
        raise PlotsMissing(
            "the balance chart needs matplotlib, the 'plots' extra: "
            "pip install 'pulsar-lb-stream[plots]' (scripts/bootstrap.sh installs it)"
        ) from e

    matplotlib.use("Agg")  # before pyplot loads: no display here
    import matplotlib.pyplot as plt

    scenarios = list(dict.fromkeys(s.scenario for s in scores))
    pairs = list(dict.fromkeys(s.pair for s in scores))
    cols = min(4, len(scenarios))
    rows = -(-len(scenarios) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, name in enumerate(scenarios):
        ax = axes[i // cols][i % cols]
        for j, key in enumerate(pairs):
            row = next((s for s in scores if s.scenario == name and s.pair == key), None)
            if row is None:
                continue
            c = colours[j % len(colours)]
            ax.plot(row.series_max_pct, color=c, lw=1.2, label=key)
            ax.plot(row.series_mean_pct, color=c, lw=0.8, ls=":")
        ax.set_title(name, fontsize=10)
        ax.set_ylim(0, 105)
        ax.set_xlabel("cycle (1 min)", fontsize=8)
        ax.set_ylabel("broker usage %", fontsize=8)
        ax.tick_params(labelsize=7)
    for k in range(len(scenarios), rows * cols):
        axes[k // cols][k % cols].axis("off")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(pairs), fontsize=8)
    fig.suptitle("max (solid) and mean (dotted) broker usage per cycle", fontsize=11)
    fig.tight_layout(rect=(0, 0.05, 1, 0.97))
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_outputs(scores: Sequence[Score], out: Path, meta: Mapping[str, Any]) -> dict[str, Path]:
    """``balance.json``, ``balance.md`` and ``balance.png`` under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "balance.json", "md": out / "balance.md", "png": out / "balance.png"}
    paths["json"].write_text(to_json(scores, meta), encoding="utf-8")
    verdict = "\n".join(t for t in (verdict_text(scores), failure_text(scores)) if t)
    md = to_markdown(scores) + (f"\n```\n{verdict}\n```\n" if verdict else "")
    paths["md"].write_text(md, encoding="utf-8")
    try:
        write_chart(scores, paths["png"])
    except PlotsMissing as e:  # the figures are written; only the chart needs the extra
        print(f"lbctl bench balance: no chart: {e}", file=sys.stderr)
        del paths["png"]
    return paths
