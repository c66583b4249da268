"""The fewest bundle moves that balance a cluster snapshot: a model and its integer program.

The balance scoreboard says how well a pair balances; this says how far its moves are from the
least a perfect planner would need. A **snapshot** is the cluster as a policy saw it in one cycle:
the live brokers, the bundles each owns and each bundle's figures in that cycle's reports. The
question asked of it: which bundles must change owner so that every broker ends within the
balance band (usage <= ``loadBalancerBalancedMaxOverMean`` x mean usage), moving as few bundles as
possible and, among those plans, as few bytes as possible?

Usage is the scoreboard's: the weighted max resource usage of a broker's report. In the
simulator's model (``producers.sim_model``) every resource of a broker is a base that depends on
the broker alone plus a sum over its bundles of a per-bundle load, scaled by the broker's own
limit (CPU by its cores, bandwidth by its NIC, memory by its heap):

* CPU: ``noise x (idle x limit + 0.004 per msg/s + 0.002 per KB/s)`` against ``100 x cores``; the
  snapshot keeps each broker's own noise factor, read back from its report;
* heap: 25 % base + 0.25 MB per topic; direct memory: 5 % base + 0.002 MB per KB/s;
* bandwidth in / out: the bundles' throughput in / out in KB/s against the NIC.

So a broker's usage after any reassignment is ``max_r (base[b][r] + scale[b][r] x load_r)``, the
model ``broker_usage`` evaluates and the integer program encodes exactly: binaries place each
bundle on one broker, and one binary per (broker, resource) picks the resource that is the
maximum so the mean on the right-hand side of the band is the true mean, not a bound the solver
could inflate. What the model leaves out: the usage reading's cap (a resource over 100 % is
ignored by ``getMaxResourceUsageWithWeightWithinLimit``) and the report noise a move would
change; both are second-order for the band.

The solver is HiGHS (``highspy``), the optional ``bench`` extra: an offline benchmark and test
dependency, never a runtime one, so it is imported where a solve starts and its absence is named
with the install command.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loadbalance.decisions import TRANSFER, UNLOAD, Decision
from loadbalance.model import LocalBrokerData
from loadbalance.view import UsageWeights
from producers.sim_model import KBYTES, BrokerSpec, CostModel

RESOURCES = ("cpu", "memory", "direct_memory", "bandwidth_in", "bandwidth_out")
OPTIMAL, TIME_LIMIT, INFEASIBLE, NO_PLAN = "optimal", "time limit", "infeasible", "no plan"


@dataclass(frozen=True, slots=True)
class BrokerCapacity:
    """A broker's usage as a function of its bundles: ``max_r base[r] + scale[r] x load_r``."""

    name: str
    base: tuple[float, ...]
    scale: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class BundleLoad:
    """One bundle: its owner in the snapshot, its load per resource, and what moving it costs."""

    name: str
    owner: str
    load: tuple[float, ...]
    bytes_per_s: float = 0.0
    clients: int = 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Brokers and bundles as one cycle saw them."""

    brokers: tuple[BrokerCapacity, ...]
    bundles: tuple[BundleLoad, ...]


@dataclass(frozen=True, slots=True)
class Plan:
    """A solve's answer: the moves (bundle -> destination), and whether they are proven fewest.

    ``status``: ``optimal`` (the fewest moves, proven; the bytes of that plan are the fewest the
    second solve found within its limit), ``time limit`` (the best plan found when the limit
    stopped the first solve), ``no plan`` (the limit came before any plan) or ``infeasible`` (no
    reassignment reaches the band, e.g. one bundle alone is above it). ``lower_bound`` is the
    proven floor on the number of moves: the count itself when optimal. ``bytes_proven``: the
    bytes of an optimal plan are proven the fewest for its count too."""

    status: str
    moves: Mapping[str, str]
    lower_bound: int
    bytes_per_s: float
    seconds: float
    bytes_proven: bool = False

    @property
    def count(self) -> int:
        return len(self.moves)


class SolverMissing(RuntimeError):
    """highspy (the ``bench`` extra) is not installed."""


def from_reports(
    reports: Mapping[str, LocalBrokerData],
    specs: Mapping[str, BrokerSpec],
    cost: CostModel,
    weights: UsageWeights,
) -> Snapshot:
    """The snapshot one cycle's reports describe, in the simulator's cost model."""
    w = (
        weights.cpu,
        weights.memory,
        weights.direct_memory,
        weights.bandwidth_in,
        weights.bandwidth_out,
    )
    brokers: list[BrokerCapacity] = []
    bundles: list[BundleLoad] = []
    for name in sorted(reports):
        report, spec = reports[name], specs[name]
        loads = []
        for bundle in sorted(report.last_stats):
            s = report.last_stats[bundle]
            kb_in, kb_out = s.msg_throughput_in / KBYTES, s.msg_throughput_out / KBYTES
            cpu = cost.cpu_pct_per_msg_per_s * (s.msg_rate_in + s.msg_rate_out)
            cpu += cost.cpu_pct_per_kbyte_per_s * (kb_in + kb_out)
            load = (
                cpu,
                s.topics * cost.heap_mb_per_topic,
                (kb_in + kb_out) * cost.direct_mb_per_kbyte_per_s,
                kb_in,
                kb_out,
            )
            loads.append(load[0])
            clients = s.producer_count + s.consumer_count
            bytes_per_s = s.msg_throughput_in + s.msg_throughput_out
            bundles.append(BundleLoad(bundle, name, load, bytes_per_s, clients))
        idle = cost.idle_cpu_fraction * spec.cpu_limit_pct
        noiseless = idle + sum(loads)
        noise = report.cpu.usage / noiseless if noiseless > 0 else 1.0
        limits = (
            spec.cpu_limit_pct / noise,
            spec.memory_mb,
            spec.direct_memory_mb,
            spec.nic_kbytes_per_s,
            spec.nic_kbytes_per_s,
        )
        base_units = (
            idle,
            spec.memory_mb * cost.heap_base_fraction,
            spec.direct_memory_mb * cost.direct_base_fraction,
            0.0,
            0.0,
        )
        brokers.append(
            BrokerCapacity(
                name,
                tuple(wr * b / lim for wr, b, lim in zip(w, base_units, limits)),
                tuple(wr / lim for wr, lim in zip(w, limits)),
            )
        )
    return Snapshot(tuple(brokers), tuple(bundles))


def broker_usage(snapshot: Snapshot, moves: Mapping[str, str] | None = None) -> dict[str, float]:
    """Each broker's usage (a fraction) after ``moves`` (bundle -> destination broker)."""
    moves = moves or {}
    totals = {b.name: [0.0] * len(b.base) for b in snapshot.brokers}
    for k in snapshot.bundles:
        t = totals[moves.get(k.name, k.owner)]
        for r, v in enumerate(k.load):
            t[r] += v
    return {
        b.name: max(base + s * t for base, s, t in zip(b.base, b.scale, totals[b.name]))
        for b in snapshot.brokers
    }


def max_over_mean(usage: Mapping[str, float]) -> float:
    mean = sum(usage.values()) / len(usage) if usage else 0.0
    return max(usage.values()) / mean if mean > 0 else float("inf")


def fewest_moves(
    snapshot: Snapshot, band: float, *, time_limit_s: float = 10.0, bytes_limit_s: float = 5.0
) -> Plan:
    """The fewest moves, then the fewest bytes/s moved, that bring every broker within ``band``
    x the mean usage, as a mixed-integer program solved by HiGHS.

    Two solves, lexicographic: the first minimises the number of moves (an integer objective,
    which the solver can prove optimal far sooner than a blend of moves and bytes), the second
    keeps that number and minimises bytes/s moved. ``time_limit_s`` bounds the first,
    ``bytes_limit_s`` the second; when the second stops at its limit the count is still proven
    and its plan is the best found for bytes (status ``optimal`` concerns the count). Bundles
    with no load stay where they are (moving one changes nothing)."""
    try:  # highspy: the optional 'bench' extra (see the module docstring)
        import highspy
    except ModuleNotFoundError as e:
        raise SolverMissing(
            "the optimizer needs highspy, the 'bench' extra: pip install 'pulsar-lb-stream[bench]'"
        ) from e

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit_s))
    h.setOptionValue("mip_rel_gap", 0.0)
    h.setOptionValue("threads", 1)
    h.setOptionValue("random_seed", 0)
    movable = [k for k in snapshot.bundles if any(v > 0 for v in k.load)]
    x = _placement(h, snapshot, movable, band)
    moved = {k.name: 1 - x[k.name, k.owner] for k in movable}
    t0 = time.perf_counter()
    h.minimize(sum(moved.values()))
    status, info = h.getModelStatus(), h.getInfo()
    seconds = time.perf_counter() - t0
    if status == highspy.HighsModelStatus.kInfeasible:
        return Plan(INFEASIBLE, {}, 0, 0.0, seconds)
    if info.primal_solution_status != 2:  # kSolutionStatusFeasible: no plan within the limit
        return Plan(NO_PLAN, {}, max(0, math.ceil(info.mip_dual_bound - 1e-6)), 0.0, seconds)
    plan = _read_plan(h, x, snapshot, movable)
    if status != highspy.HighsModelStatus.kOptimal:
        lower = min(len(plan), max(0, math.ceil(info.mip_dual_bound - 1e-6)))
        return Plan(TIME_LIMIT, plan, lower, _bytes(movable, plan), seconds)
    count = len(plan)
    bytes_proven = count == 0
    if count:
        h.addConstr(sum(moved.values()) <= count)
        h.setOptionValue("time_limit", float(bytes_limit_s))
        t1 = time.perf_counter()
        h.minimize(sum(k.bytes_per_s * moved[k.name] for k in movable))
        seconds += time.perf_counter() - t1
        bytes_proven = h.getModelStatus() == highspy.HighsModelStatus.kOptimal
        if h.getInfo().primal_solution_status == 2:
            better = _read_plan(h, x, snapshot, movable)
            if len(better) == count and _bytes(movable, better) <= _bytes(movable, plan):
                plan = better
    return Plan(OPTIMAL, plan, count, _bytes(movable, plan), seconds, bytes_proven)


def _placement(h: Any, snapshot: Snapshot, movable: list[BundleLoad], band: float) -> dict:
    """Binaries ``x[bundle, broker]`` (each bundle on one broker) and the band constraints.

    ``u[b]`` is broker ``b``'s usage: at least every resource's level, and at most the level of
    the resource ``pick`` selects, so it is exactly the largest. A resource that can never be
    the largest (its level with every bundle on the broker is below another resource's level
    with none of them) gets no pick."""
    brokers = snapshot.brokers
    names = [b.name for b in brokers]
    n_res = len(brokers[0].base) if brokers else 0
    movable_names = {k.name for k in movable}
    x = {(k.name, b): h.addBinary() for k in movable for b in names}
    for k in movable:
        h.addConstr(sum(x[k.name, b] for b in names) == 1)
    fixed_load = {b: [0.0] * n_res for b in names}
    for k in snapshot.bundles:
        if k.name not in movable_names:
            for r, v in enumerate(k.load):
                fixed_load[k.owner][r] += v
    all_load = [sum(k.load[r] for k in movable) for r in range(n_res)]
    u = {}
    for b in brokers:
        low = [b.base[r] + b.scale[r] * fixed_load[b.name][r] for r in range(n_res)]
        high = [low[r] + b.scale[r] * all_load[r] for r in range(n_res)]
        big = max(high)
        u[b.name] = h.addVariable(lb=max(low), ub=big)
        levels = []
        for r in range(n_res):
            expr = low[r] + sum(b.scale[r] * k.load[r] * x[k.name, b.name] for k in movable)
            h.addConstr(u[b.name] >= expr)
            levels.append(expr)
        candidates = _may_be_largest(b, low, high, movable)
        pick = {r: h.addBinary() for r in candidates}
        h.addConstr(sum(pick.values()) == 1)
        for r in candidates:
            h.addConstr(u[b.name] <= levels[r] + (big - low[r]) * (1 - pick[r]))
    n = len(brokers)
    for b in names:
        h.addConstr(n * u[b] <= band * sum(u.values()))
    return x


def _may_be_largest(
    b: BrokerCapacity, low: list[float], high: list[float], movable: list[BundleLoad]
) -> list[int]:
    """The resources that can be broker ``b``'s largest for some placement. Resource ``r`` cannot
    when another resource's level with none of the bundles beats ``r``'s with all of them, or
    when another resource is at least as high at the start and grows at least as much with every
    bundle (in the simulator CPU usually dominates bandwidth this way). Dropping those picks
    leaves the model exact and its relaxation much tighter."""
    n_res = len(low)
    keep: list[int] = []
    for r in range(n_res):
        if high[r] < max(low):
            continue
        dominated = False
        for s in range(n_res):
            if s == r or low[s] < low[r]:
                continue
            if all(b.scale[s] * k.load[s] >= b.scale[r] * k.load[r] for k in movable):
                # s is never below r; of two equal resources the first one stays
                equal = low[s] == low[r] and all(
                    b.scale[s] * k.load[s] == b.scale[r] * k.load[r] for k in movable
                )
                if not equal or s < r:
                    dominated = True
                    break
        if not dominated:
            keep.append(r)
    return keep


def _read_plan(h: Any, x: dict, snapshot: Snapshot, movable: list[BundleLoad]) -> dict[str, str]:
    names = [b.name for b in snapshot.brokers]
    return {k.name: b for k in movable for b in names if b != k.owner and h.val(x[k.name, b]) > 0.5}


def _bytes(movable: list[BundleLoad], plan: Mapping[str, str]) -> float:
    return sum(k.bytes_per_s for k in movable if k.name in plan)


def moves_of(decisions: Sequence[Decision]) -> dict[str, str | None]:
    """Bundle -> destination (``None`` for an unload the next lookup places) of a cycle's moves."""
    return {
        d.bundle: d.destination_broker if d.kind == TRANSFER else None
        for d in decisions
        if d.kind in (TRANSFER, UNLOAD)
    }
