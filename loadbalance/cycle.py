"""One policy cycle over the averaged cluster view: split, shed, place, merge.

``step(state, view, config, now_ms=..., cycle=...) -> (state, result)`` is the whole brain in one
pure function, so the Spark job (per micro-batch), the fast simulator (per virtual tick) and
``lbctl decide`` (once, offline) all run the same code and replay deterministically.

What it mirrors, and where it differs from Pulsar:

* Split runs every ``loadBalancerSplitIntervalMinutes`` (Pulsar's modular manager checks after
  every report batch; the extensible one on this interval). Bundles chosen for a split are not
  shed in the same cycle.
* Shedding runs every ``loadBalancerSheddingIntervalMinutes`` with more than one broker, as
  ``LoadSheddingTask``; bundles unloaded within ``loadBalancerSheddingGracePeriodMinutes`` are
  passed to the shedder as ``recently_unloaded`` and never moved again inside the grace period.
  Those are the moves the state recorded and those the view brings in (a snapshot's
  ``recentlyUnloaded``), the newer time winning where both name a bundle.
* Placement: when ``loadBalancerTransferEnabled`` is on, an UNLOAD from a modular shedder is
  turned into a TRANSFER to the broker the configured placement strategy picks now (with
  preallocation, so several bundles shed in one cycle do not herd onto one broker). Pulsar's
  modular manager places the bundle later, on the next lookup, with the same strategy; choosing
  here makes the destination visible in the decision and lets the controller move it in one step.
  With transfer off, UNLOAD stays an unload and the controller places on lookup.
* Policy guards: every shedder but TransferShedder (which checks ``isTransferable`` itself) has
  its selection passed through ``shouldNamespacePoliciesUnload`` and
  ``shouldAntiAffinityNamespaceUnload`` before placement, as ``doLoadShedding`` does
  (``shedding.policy_guards``); a refused bundle stays where it is, recorded as a
  ``NamespacePolicies`` or ``AntiAffinity`` skip. A transfer whose shedder chose the destination
  (ProjectedUsageShedder) must also name a broker the bundle's policies allow.
* Merge (ours, off by default) runs with the split step and never touches a bundle another
  decision of this cycle names.
* In-flight moves (ours): every unload and transfer a cycle decides (and every split whose
  children are left free, as an unload of its parent) stays in the state until the reports show
  it or ``loadBalancerInFlightMoveTimeoutSeconds`` passed (``loadbalance.in_flight``), and the
  next cycles' view carries them (``ClusterView.in_flight``), so a strategy that projects usage
  does not move the same load again while a report lags. Pulsar's strategies read the reports
  alone, as Pulsar's do.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from loadbalance.config import LoadBalancerConfig
from loadbalance.decisions import (
    MERGE,
    SPLIT,
    TRANSFER,
    UNLOAD,
    Decision,
    Skip,
    transfer_of,
)
from loadbalance.in_flight import record_moves, retire_moves
from loadbalance.merge_policy import find_bundles_to_merge
from loadbalance.placement.pipeline import BrokerSelector, PlacementState
from loadbalance.shedding.policy_guards import guard_unloads
from loadbalance.shedding.registry import ShedderState, make_shedder
from loadbalance.split_policy import SplitState, find_bundles_to_split
from loadbalance.values import SkipReason
from loadbalance.view import ClusterView, InFlightMove, UsageWeights

_EMPTY: Mapping[str, int] = MappingProxyType({})
MINUTE_MS = 60_000
TRANSFER_SHEDDER = "TransferShedder"


@dataclass(frozen=True, slots=True)
class CycleState:
    """Cross-cycle state; everything a restart needs to continue where it stopped.

    Every part is a frozen value (the strategies' own state dataclasses, ``None`` for a stateless
    one), so the whole pickles deterministically and compares by content."""

    last_shedding_ms: int | None = None
    last_split_ms: int | None = None
    shedder_state: ShedderState = None
    split_state: SplitState | None = None
    placement_state: PlacementState = None
    recently_unloaded: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    in_flight: Mapping[str, InFlightMove] = field(default_factory=lambda: _EMPTY)
    """bundle -> a move decided by an earlier cycle that the reports did not show in full yet
    (``loadbalance.in_flight``)."""


@dataclass(frozen=True, slots=True)
class CycleResult:
    """Decisions and skips of one cycle, and which steps ran."""

    decisions: tuple[Decision, ...] = ()
    skips: tuple[Skip, ...] = ()
    shedding_ran: bool = False
    split_ran: bool = False


def weights_from_config(config: LoadBalancerConfig) -> UsageWeights:
    """The resource weights of ``getMaxResourceUsageWithWeight``."""
    return UsageWeights(
        cpu=config.load_balancer_cpu_resource_weight,
        memory=config.load_balancer_memory_resource_weight,
        direct_memory=config.load_balancer_direct_memory_resource_weight,
        bandwidth_in=config.load_balancer_bandwidth_in_resource_weight,
        bandwidth_out=config.load_balancer_bandwidth_out_resource_weight,
    )


def ingest_kwargs(config: LoadBalancerConfig) -> dict[str, Any]:
    """Keyword arguments of ``loadbalance.view.ingest`` taken from the configuration."""
    return {
        "history_percentage": config.load_balancer_history_resource_percentage,
        "weights": weights_from_config(config),
    }


def cycle_rng(cycle: str, seed: int = 0) -> random.Random:
    """A generator seeded from the cycle key, stable across processes (unlike ``hash``)."""
    digest = hashlib.sha256(f"{seed}:{cycle}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def _due(last_ms: int | None, interval_minutes: float, now_ms: int) -> bool:
    return last_ms is None or now_ms - last_ms >= interval_minutes * MINUTE_MS


def _in_grace(
    state: CycleState, view: ClusterView, config: LoadBalancerConfig, now_ms: int
) -> dict[str, int]:
    """The view's and the state's recently moved bundles still inside the grace period.

    Both count: the view carries moves made before this process started (a snapshot's
    ``recentlyUnloaded``, or a restarted job's), the state those of the cycles it ran. A bundle
    in both keeps the newer time, so the grace period is never cut short."""
    grace_ms = config.load_balancer_shedding_grace_period_minutes * MINUTE_MS
    merged = dict(view.recently_unloaded)
    for b, t in state.recently_unloaded.items():
        if b not in merged or t > merged[b]:
            merged[b] = t
    return {b: t for b, t in merged.items() if now_ms - t < grace_ms}


def step(
    state: CycleState,
    view: ClusterView,
    config: LoadBalancerConfig,
    *,
    now_ms: int,
    cycle: str,
    seed: int = 0,
) -> tuple[CycleState, CycleResult]:
    """Run one cycle; see the module docstring for what runs when."""
    decisions: list[Decision] = []
    skips: list[Skip] = []
    recent = _in_grace(state, view, config, now_ms)
    max_age_ms = int(config.load_balancer_in_flight_move_timeout_seconds * 1000)
    in_flight = retire_moves(state.in_flight, view, now_ms=now_ms, max_age_ms=max_age_ms)
    view = replace(view, recently_unloaded=MappingProxyType(dict(recent)), in_flight=in_flight)
    split_state, shedder_state = state.split_state, state.shedder_state
    placement_state = state.placement_state
    last_split, last_shed = state.last_split_ms, state.last_shedding_ms
    split_ran = shedding_ran = False
    if not config.load_balancer_enabled:
        skips.append(Skip("LoadManager", SkipReason.DISABLED, detail="loadBalancerEnabled=false"))
        return state, CycleResult((), tuple(skips))

    busy: set[str] = set()
    if _due(last_split, config.load_balancer_split_interval_minutes, now_ms):
        split_ran, last_split = True, now_ms
        split_state = _split_and_merge(
            view, config, split_state, recent, busy, decisions, skips, now_ms=now_ms, cycle=cycle
        )
    if _due(last_shed, config.load_balancer_shedding_interval_minutes, now_ms):
        shedding_ran, last_shed = True, now_ms
        shedder_state, placement_state = _shed(
            view, config, shedder_state, placement_state, busy, decisions, skips,
            now_ms=now_ms, cycle=cycle, seed=seed,
        )  # fmt: skip
    _mark_recent(recent, decisions, now_ms)
    new_state = CycleState(
        in_flight=record_moves(
            in_flight,
            decisions,
            view,
            now_ms,
            splits_leave=config.load_balancer_auto_unload_split_bundles_enabled,
        ),
        last_shedding_ms=last_shed,
        last_split_ms=last_split,
        shedder_state=shedder_state,
        split_state=split_state,
        placement_state=placement_state,
        recently_unloaded=MappingProxyType(recent),
    )
    return new_state, CycleResult(tuple(decisions), tuple(skips), shedding_ran, split_ran)


def _split_and_merge(
    view: ClusterView,
    config: LoadBalancerConfig,
    split_state: SplitState | None,
    recent: Mapping[str, int],
    busy: set[str],
    decisions: list[Decision],
    skips: list[Skip],
    *,
    now_ms: int,
    cycle: str,
) -> SplitState | None:
    """The split and merge policies, when enabled; their decisions and skips are appended, the
    bundles they touch added to ``busy``. The new split state."""
    if config.load_balancer_auto_bundle_split_enabled:
        split_state, res = find_bundles_to_split(
            view, config, split_state, now_ms=now_ms, cycle=cycle
        )
        # A bundle split within the grace period is gone (or about to be): not again.
        fresh = [d for d in res.decisions if d.bundle not in recent]
        decisions.extend(fresh)
        skips.extend(res.skips)
        busy.update(d.bundle for d in fresh)
    if config.load_balancer_merge_enabled:
        res = find_bundles_to_merge(view, config, now_ms=now_ms, cycle=cycle)
        for d in res.decisions:
            if d.bundle in busy or d.merge_bundle in busy:
                continue
            decisions.append(d)
            busy.update((d.bundle, d.merge_bundle or ""))
        skips.extend(res.skips)
    return split_state


def _shed(
    view: ClusterView,
    config: LoadBalancerConfig,
    shedder_state: ShedderState,
    placement_state: PlacementState,
    busy: set[str],
    decisions: list[Decision],
    skips: list[Skip],
    *,
    now_ms: int,
    cycle: str,
    seed: int,
) -> tuple[ShedderState, PlacementState]:
    """The configured shedder, its unloads placed; decisions and skips are appended. The new
    shedder and placement states."""
    shedder = make_shedder(config.shedding_strategy_name)
    if not isinstance(shedder_state, shedder.state_type):
        # none yet, or one another shedder left (the configuration changed): start afresh
        shedder_state = shedder.initial_state()
    if not config.load_balancer_shedding_enabled:
        skips.append(
            Skip(shedder.name, SkipReason.DISABLED, detail="loadBalancerSheddingEnabled=false")
        )
    elif len(view.brokers) <= 1:
        skips.append(Skip(shedder.name, SkipReason.NO_BROKERS, detail="one broker or none"))
    else:
        # Bundles being split or merged now are out of reach, as if just unloaded, so the
        # shedder picks others instead of choosing them and losing them here.
        held = {**view.recently_unloaded, **dict.fromkeys(busy, now_ms)}
        shed_view = replace(view, recently_unloaded=MappingProxyType(held))
        shedder_state, res = shedder.find_bundles_for_unloading(
            shed_view, config, shedder_state, now_ms=now_ms, cycle=cycle
        )
        skips.extend(res.skips)
        shed = [d for d in res.decisions if d.bundle not in busy]
        if shedder.name != TRANSFER_SHEDDER:  # it checks isTransferable per bundle itself
            shed, refused = guard_unloads(shed, view, config, shedder.name)
            skips.extend(refused)
        placed, placement_state = _place(shed, view, config, placement_state, cycle, seed, now_ms)
        decisions.extend(placed)
    return shedder_state, placement_state


def _mark_recent(recent: dict[str, int], decisions: list[Decision], now_ms: int) -> None:
    """Every bundle a decision moves, splits or merges enters its grace period now."""
    for d in decisions:
        if d.kind in (UNLOAD, TRANSFER, SPLIT):
            recent[d.bundle] = now_ms
        elif d.kind == MERGE:
            recent[d.bundle] = now_ms
            if d.merge_bundle:
                recent[d.merge_bundle] = now_ms


def _place(
    shed: list[Decision],
    view: ClusterView,
    config: LoadBalancerConfig,
    placement_state: PlacementState,
    cycle: str,
    seed: int,
    now_ms: int,
) -> tuple[list[Decision], PlacementState]:
    """Give modular shedders' unloads a destination when transfers are enabled.

    A ``bundle_data`` that offers ``prefetch(names)`` (the streaming driver's lazy view) is
    told up front which bundles placement will read, so it can make their values in one pass
    rather than one at a time."""
    if not config.load_balancer_transfer_enabled or not any(d.kind == UNLOAD for d in shed):
        return shed, placement_state
    prefetch = getattr(view.bundle_data, "prefetch", None)
    if prefetch is not None:
        prefetch([d.bundle for d in shed if d.kind == UNLOAD])
    selector = BrokerSelector(
        view, config, cycle_rng(cycle, seed), strategy_state=placement_state, now_ms=now_ms
    )
    out: list[Decision] = []
    for d in shed:
        if d.kind != UNLOAD:
            out.append(d)
            continue
        dest = selector.select(d.bundle, exclude=(d.source_broker,) if d.source_broker else ())
        if dest is None or dest == d.source_broker:
            out.append(d)
            continue
        inputs = dict(d.inputs)
        inputs["placementStrategy"] = config.placement_strategy_name
        out.append(transfer_of(d, cycle=cycle, destination=dest, inputs=inputs))
    return out, selector.strategy_state
