"""TransferShedder (PIP-220): mirrors
``org.apache.pulsar.broker.loadbalance.extensions.scheduler.TransferShedder``.

Load per broker ``L = weightedMaxEMA`` (``BrokerView.history_usage``). Per cycle:

* brokers whose data is older than ``loadBalancerBrokerLoadDataTTLInSeconds`` are left out
  (skip ``OutDatedData``); fewer than two left -> ``NoBrokers``;
* cool-down: if a broker that gave or took a bundle within the grace period has not reported
  for ``loadBalanceSheddingDelayInSeconds`` since that move, the whole cycle is skipped
  (``CoolDown``) - its data does not show the move yet;
* condition: ``std > loadBalancerBrokerLoadTargetStd``, or the min broker is underloaded
  (``L_min < avg x min(0.5, targetStd / 2)`` or its throughput EMA below the max's times the
  same multiplier), or the max broker is overloaded (``L_max > overload threshold`` and
  ``L_max > avg + targetStd``);
* debounce: the condition must hold on consecutive cycles; while the hit count is
  ``<= loadBalancerSheddingConditionHitCountThreshold`` the cycle is skipped (``HitCount``), so
  with the default 3 the 4th consecutive hit sheds; the count resets after a decision or when
  the condition breaks;
* up to ``loadBalancerMaxNumberOfBrokerSheddingPerCycle`` (max, min) pairs from the two ends of
  the sorted list: offload ``(L_max - L_min) / 2`` of load, i.e.
  ``thrEMA_max x offload / L_max`` of throughput, from the max broker's top-K bundles
  (``loadBalancerMaxNumberOfBundlesInBundleLoadReport``) by current throughput, never its last
  bundle; when the next bundle would overshoot, try a swap (min-broker bundles go back to the
  max broker while both sides stay below ``thr_max``, accepted once ``minNew <= maxNew`` and
  ``maxNew < 0.75 x thr_max``); the std is re-estimated after each pair and the loop stops once
  balanced;
* decisions are TRANSFER to the min broker when ``loadBalancerTransferEnabled``, else UNLOAD.

Deviations: cool-down is judged from the shedder's own record of brokers it moved bundles
between (Pulsar keeps the same map); isolation/anti-affinity policies are not modelled, so
``loadBalancerSheddingBundlesWithPoliciesEnabled`` has no effect; the std re-estimate moves
load linearly in throughput, as Pulsar's ``stats.offload`` does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar

from loadbalance.decisions import TRANSFER, UNLOAD, Decision, PolicyResult, Skip, make_decision
from loadbalance.view import BrokerView, ClusterView

if TYPE_CHECKING:
    from loadbalance.config import LoadBalancerConfig

SWAP_MAX_RATIO = 0.75
MINUTE_MS = 60_000


@dataclass(frozen=True, slots=True)
class TransferShedderState:
    """Consecutive condition hits and the brokers recently moved between (broker -> ms)."""

    hit_count: int = 0
    recent_brokers: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


def _stats(loads: Mapping[str, float]) -> tuple[float, float]:
    n = len(loads)
    avg = sum(loads.values()) / n
    var = max(sum(v * v for v in loads.values()) / n - avg * avg, 0.0)
    return avg, math.sqrt(var)


class TransferShedder:
    name: ClassVar[str] = "TransferShedder"

    def initial_state(self) -> TransferShedderState:
        return TransferShedderState()

    def find_bundles_for_unloading(
        self,
        view: ClusterView,
        config: LoadBalancerConfig,
        state: TransferShedderState | None,
        *,
        now_ms: int,
        cycle: str,
    ) -> tuple[TransferShedderState, PolicyResult]:
        state = state or self.initial_state()
        skips: list[Skip] = []
        grace_ms = config.load_balancer_shedding_grace_period_minutes * MINUTE_MS
        recent = {b: t for b, t in state.recent_brokers.items() if now_ms - t < grace_ms}
        ttl_ms = config.load_balancer_broker_load_data_ttl_in_seconds * 1000
        brokers: dict[str, BrokerView] = {}
        for name in sorted(view.brokers):
            b = view.brokers[name]
            if now_ms - b.updated_at_ms > ttl_ms:
                skips.append(Skip(self.name, "OutDatedData", broker=name))
            else:
                brokers[name] = b
        if len(brokers) < 2:
            skips.append(Skip(self.name, "NoBrokers"))
            return TransferShedderState(0, MappingProxyType(recent)), PolicyResult((), tuple(skips))
        delay_ms = config.load_balance_shedding_delay_in_seconds * 1000
        for name, moved_at in sorted(recent.items()):
            b = brokers.get(name)
            if b is not None and b.updated_at_ms - moved_at < delay_ms:
                skips.append(Skip(self.name, "CoolDown", broker=name))
                new = TransferShedderState(state.hit_count, MappingProxyType(recent))
                return new, PolicyResult((), tuple(skips))

        loads = {n: b.history_usage for n, b in brokers.items()}
        avg, std = _stats(loads)
        target_std = config.load_balancer_broker_load_target_std
        overload = config.load_balancer_broker_overloaded_threshold_percentage / 100.0
        order = sorted(brokers, key=lambda n: (loads[n], n))
        multiplier = min(0.5, max(0.0, target_std / 2))

        def underloaded(lo: str, hi: str) -> bool:
            thr_lo, thr_hi = brokers[lo].msg_throughput_ema, brokers[hi].msg_throughput_ema
            return loads[lo] < avg * multiplier or thr_lo < thr_hi * multiplier

        def overloaded(hi: str) -> bool:
            return loads[hi] > overload and loads[hi] > avg + target_std

        lo, hi = order[0], order[-1]
        hit = std > target_std or underloaded(lo, hi) or overloaded(hi)
        if not hit:
            skips.append(Skip(self.name, "Balanced", detail=f"std={std:.4f}"))
            return TransferShedderState(0, MappingProxyType(recent)), PolicyResult((), tuple(skips))
        hits = state.hit_count + 1
        if hits <= config.load_balancer_shedding_condition_hit_count_threshold:
            skips.append(Skip(self.name, "HitCount", detail=f"{hits}"))
            return TransferShedderState(hits, MappingProxyType(recent)), PolicyResult(
                (), tuple(skips)
            )

        decisions: list[Decision] = []
        i, j, pairs = 0, len(order) - 1, 0
        max_pairs = config.load_balancer_max_number_of_broker_shedding_per_cycle
        while i < j and pairs < max_pairs:
            lo, hi = order[i], order[j]
            if not (std > target_std or underloaded(lo, hi) or overloaded(hi)):
                break
            reason = "Overloaded" if overloaded(hi) else "Underloaded"
            moved = self._pair(view, config, brokers, loads, lo, hi, reason, cycle, now_ms)
            if moved:
                decisions.extend(moved)
                recent[lo] = recent[hi] = now_ms
                pairs += 1
                avg, std = _stats(loads)
            i, j = i + 1, j - 1
        if not decisions:
            skips.append(Skip(self.name, "NoBundles", broker=order[-1]))
            return TransferShedderState(hits, MappingProxyType(recent)), PolicyResult(
                (), tuple(skips)
            )
        return TransferShedderState(0, MappingProxyType(recent)), PolicyResult(
            tuple(decisions), tuple(skips)
        )

    def _pair(
        self,
        view: ClusterView,
        config: LoadBalancerConfig,
        brokers: Mapping[str, BrokerView],
        loads: dict[str, float],
        lo: str,
        hi: str,
        reason: str,
        cycle: str,
        now_ms: int,
    ) -> list[Decision]:
        """Move load from ``hi`` to ``lo``; update ``loads`` with the estimate of what moved."""
        src, dst = brokers[hi], brokers[lo]
        if loads[hi] <= 0:
            return []
        offload = (loads[hi] - loads[lo]) / 2
        thr_max = src.msg_throughput_ema
        target = thr_max * offload / loads[hi]
        top = _top_bundles(
            view, src, config.load_balancer_max_number_of_bundles_in_bundle_load_report
        )
        remaining_bundles = len(src.bundles)
        moves: list[tuple[str, str, str, float]] = []  # bundle, from, to, throughput
        moved = 0.0
        for bundle, thr in top:
            if remaining_bundles <= 1:
                break
            if moved + thr <= target:
                moves.append((bundle, hi, lo, thr))
                moved += thr
                remaining_bundles -= 1
                continue
            if not moves and config.load_balancer_transfer_enabled:  # Pulsar swaps only then
                moves += _swap(view, src, dst, bundle, thr, thr_max, hi, lo)
                moved = sum(t if f == hi else -t for _, f, _, t in moves)
            break
        if not moves:
            return []
        shift = loads[hi] * moved / thr_max if thr_max > 0 else 0.0
        loads[hi] -= shift
        loads[lo] += shift
        kind = TRANSFER if config.load_balancer_transfer_enabled else UNLOAD
        return [
            make_decision(
                cycle=cycle,
                kind=kind,
                bundle=bundle,
                source_broker=frm,
                destination_broker=to if kind == TRANSFER else None,
                reason=reason,
                strategy=self.name,
                inputs={
                    "maxBrokerLoad": loads[hi] + shift,
                    "minBrokerLoad": loads[lo] - shift,
                    "offloadThroughput": target,
                    "bundleThroughput": thr,
                    "swap": frm == lo,
                },
                decided_at_ms=now_ms,
            )
            for bundle, frm, to, thr in moves
        ]


def _bundle_throughput(view: ClusterView, broker: BrokerView, bundle: str) -> float:
    stats = broker.report.last_stats.get(bundle)
    if stats is not None:
        return stats.msg_throughput
    return view.bundle(bundle).short_term.msg_throughput


def _top_bundles(view: ClusterView, broker: BrokerView, k: int) -> list[tuple[str, float]]:
    items = [
        (b, _bundle_throughput(view, broker, b))
        for b in broker.bundles
        if b not in view.recently_unloaded
    ]
    items = [x for x in items if x[1] > 0]
    items.sort(key=lambda x: (-x[1], x[0]))
    return items if k < 0 else items[:k]


def _swap(
    view: ClusterView,
    src: BrokerView,
    dst: BrokerView,
    bundle: str,
    thr: float,
    thr_max: float,
    hi: str,
    lo: str,
) -> list[tuple[str, str, str, float]]:
    """Move ``bundle`` hi -> lo and some of lo's bundles back, if that balances the pair."""
    max_new = src.report.msg_throughput - thr
    min_new = dst.report.msg_throughput + thr
    back: list[tuple[str, str, str, float]] = []
    for b, t in _top_bundles(view, dst, -1):
        if len(back) + 1 >= len(dst.bundles):  # the min broker keeps at least one bundle
            break
        if max_new + t >= thr_max or min_new - t >= thr_max:
            continue
        max_new += t
        min_new -= t
        back.append((b, lo, hi, t))
        if min_new <= max_new and max_new < SWAP_MAX_RATIO * thr_max:
            return [(bundle, hi, lo, thr), *back]
    return []
