"""TransferShedder (PIP-220): mirrors
``org.apache.pulsar.broker.loadbalance.extensions.scheduler.TransferShedder``.

The extensible load manager's shedder balances the *spread* of broker load rather than chasing
one hot broker, so it also fixes clusters ThresholdShedder never touches (PIP-220's
``[12, 2, 1, 1] %`` and ``[50 x 5, 0] %``). Broker load ``L`` is ``weightedMaxEMA``
(``BrokerView.weighted_max_ema``): the history-weighted max weighted usage with every signal as
it is, so a broker at 120 % CPU and 30 % bandwidth reads 1.2, not the 0.3 of the within-limit
reading ThresholdShedder uses (which would make it look like the least loaded broker). One
cycle:

1. Load data: a broker whose data is older than ``loadBalancerBrokerLoadDataTTLInSeconds`` is
   left out (skip ``OutDatedData``); a non-finite load stops the cycle (``NoLoadData``); fewer
   than two brokers left stops it too (``NoBrokers``).
2. Cool-down: if a broker this shedder recently moved bundles off or onto has not reported for
   ``loadBalanceSheddingDelayInSeconds`` since (``updated_at_ms - moved_at_ms < delay``), its
   report does not show the move yet and the whole cycle is skipped (``CoolDown``); once its
   data is that recent, the broker is forgotten.
3. Condition, on ``avg`` and ``std = sqrt(sum(L^2)/n - avg^2)``: ``std >
   loadBalancerBrokerLoadTargetStd``; or the min broker is underloaded (``L_min < avg x m``, or
   its throughput EMA ``< m x`` the max broker's, ``m = min(0.5, max(0, targetStd / 2))``); or
   the max broker is overloaded (``L_max >`` the overload threshold and ``> avg + targetStd``).
4. Debounce: the hit count grows by one per cycle the condition holds and drops to 0 when it
   does not; the cycle is skipped (``HitCount``) while ``hitCount <=
   loadBalancerSheddingConditionHitCountThreshold``. With the default 3, the first three cycles
   of a lasting imbalance are skipped and the **4th consecutive cycle sheds**. The count resets
   after a cycle that decided something and is left as it was by cycles that stop in step 1 or 2
   (Pulsar returns before counting).
5. Up to ``loadBalancerMaxNumberOfBrokerSheddingPerCycle`` (max, min) pairs, walking in from both
   ends of the brokers sorted by load while the condition still holds (reason ``Overloaded``
   when ``std`` is above target or the max is overloaded, ``Underloaded`` when only the min is
   starved). Per pair, ``offload = (L_max - L_min) / 2`` of load is ``thr_max x offload /
   L_max`` bytes/s of the max broker's current throughput. Its top-K bundles
   (``loadBalancerMaxNumberOfBundlesInBundleLoadReport`` largest by ``lastStats``, ranked as
   ``NamespaceBundleStats.compareTo``: bandwidth in, then out, then msg rate) are walked
   **smallest first**, the order ``TopKBundles`` stores them in, skipping recently unloaded and
   zero-throughput ones and system namespaces, and those ``isTransferable`` refuses (below),
   never emptying the top-K list. When the next
   bundle would overshoot, a swap is tried (transfers only): the min broker's top bundles,
   smallest first too, go to the max broker while both new
   throughputs stay below ``thr_max``, accepted once the min side is not above the max side and
   the max side is below ``0.75 x thr_max``; without a swap the pair stops there. A pair that
   moved something re-estimates ``std`` with the moved load and advances the min side; a max
   broker that moved nothing is passed over (skip ``NoBundles``, or ``NoLoadData`` when none of
   its bundles has stats) and its min broker is offered to the next one.
6. Decisions are TRANSFER to the min broker when ``loadBalancerTransferEnabled``, else UNLOAD.

Placement policies: with ``loadBalancerSheddingBundlesWithPoliciesEnabled`` off (the default),
bundles whose namespace has an isolation policy or an anti-affinity group are left out of the
top-K lists (as ``TopKBundles`` leaves them out of the report), so they are never shed and do
not take the places of bundles that may be. ``isTransferable``
(``policy_guards.PolicyGuard.is_transferable``) is checked for every bundle of a max broker
and of a min broker offered for a swap: such a bundle moves only with the knob on; then the
placement filters (heartbeat pin, isolation, anti-affinity, version) over all brokers of the
view must keep the pair's other broker, and, for a plain unload, some broker other than the
source. A pair whose bundles are all refused moves nothing (``NoBundles``).

Deviations from Pulsar:

* the "recently unloaded brokers" map lives in this shedder's state and is filled when it
  decides (Pulsar's scheduler fills it when an unload completes, with the source only); the
  source and, for a transfer, the destination are recorded; entries go after
  ``loadBalancerSheddingGracePeriodMinutes`` or when the broker leaves the view. It is not
  derived from ``view.recently_unloaded``, which also holds bundles being split;
* swap gains are subtracted from the traffic marked to offload (Pulsar does so only in debug
  mode, a bug); a swap never takes the min broker's last bundle or a recently unloaded bundle
  (Pulsar checks neither on that side); no bundle is named twice in a cycle;
* the view holds reporting brokers only, so Pulsar's "available broker without load data" has
  no counterpart: ``NoLoadData`` covers a non-finite load and max brokers without bundle stats;
* with fewer than two fresh brokers the cycle stops (``NoBrokers``) without counting a hit;
* a max broker whose top-K list is empty only because every bundle is under policies is a
  ``NoBundles`` skip (Pulsar's empty ``TopBundlesLoadData`` counts as ``NoLoadData``);
* brokers tie on load by name and bundles on throughput by name; decisions come out pair by
  pair, a swap's bundles just before the bundle that triggered it (Pulsar: an unordered set).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar

from loadbalance.decisions import TRANSFER, UNLOAD, Decision, PolicyResult, Skip, make_decision
from loadbalance.model import NamespaceBundleStats
from loadbalance.shedding.policy_guards import PolicyGuard
from loadbalance.shedding.system_namespaces import is_system_bundle
from loadbalance.values import DecisionReason, SkipReason
from loadbalance.view import BrokerView, ClusterView

if TYPE_CHECKING:
    from loadbalance.config import LoadBalancerConfig

MINUTE_MS = 60_000
SWAP_MAX_BROKER_RATIO = 0.75
"""A swap is accepted only if it leaves the max broker below this share of its throughput."""


@dataclass(frozen=True, slots=True)
class TransferShedderState:
    """Consecutive condition hits, and broker -> time (ms) this shedder last moved a bundle off
    or onto it (for the cool-down)."""

    hit_count: int = 0
    recent_brokers: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


THROUGHPUT_DIFFERENCE_THRESHOLD_BYTES_PER_S = 1e5
"""``NamespaceBundleStats.compareTo``: throughputs closer than 100 KB/s count as equal."""
MSG_RATE_DIFFERENCE_THRESHOLD_PER_S = 100.0
"""``NamespaceBundleStats.compareTo``: msg rates closer than 100 msg/s count as equal."""
TOPIC_CONNECTION_DIFFERENCE_THRESHOLD = 500
"""``NamespaceBundleStats.compareTo``: topic + connection counts closer than 500 are equal."""


def _fuzzy_cmp(a: float, b: float, threshold: float) -> int:
    if abs(a - b) > threshold:
        return (a > b) - (a < b)
    return 0


def compare_bundle_stats(a: NamespaceBundleStats, b: NamespaceBundleStats) -> int:
    """Pulsar's ``NamespaceBundleStats.compareTo``: bandwidth in, then bandwidth out, then total
    msg rate, then topics + producers + consumers, each compared only past its threshold (the
    cache size, its last criterion, is not reported here)."""
    return (
        _fuzzy_cmp(
            a.msg_throughput_in, b.msg_throughput_in, THROUGHPUT_DIFFERENCE_THRESHOLD_BYTES_PER_S
        )
        or _fuzzy_cmp(
            a.msg_throughput_out, b.msg_throughput_out, THROUGHPUT_DIFFERENCE_THRESHOLD_BYTES_PER_S
        )
        or _fuzzy_cmp(a.msg_rate, b.msg_rate, MSG_RATE_DIFFERENCE_THRESHOLD_PER_S)
        or _fuzzy_cmp(
            a.topics + a.sessions, b.topics + b.sessions, TOPIC_CONNECTION_DIFFERENCE_THRESHOLD
        )
    )


def _ranked(
    items: list[tuple[str, NamespaceBundleStats]],
) -> list[tuple[str, NamespaceBundleStats]]:
    """Largest first by ``compare_bundle_stats``, ties by name. The comparison is Pulsar's, with
    its thresholds, so it is not transitive; sorting a name-ordered list makes the result
    depend on the figures alone."""

    def cmp(x: tuple[str, NamespaceBundleStats], y: tuple[str, NamespaceBundleStats]) -> int:
        return compare_bundle_stats(y[1], x[1]) or ((x[0] > y[0]) - (x[0] < y[0]))

    return sorted(sorted(items), key=functools.cmp_to_key(cmp))


def top_bundles(
    view: ClusterView,
    broker: BrokerView,
    k: int,
    *,
    excluded: Callable[[str], bool] | None = None,
) -> list[tuple[str, float]]:
    """The broker's top-K bundles as Pulsar's ``TopKBundles.update`` stores them: the K largest
    by ``NamespaceBundleStats.compareTo``, **smallest first**, with their throughput in bytes/s.
    Bundles for which ``excluded`` answers true are left out before the K are chosen
    (``TopKBundles`` leaves out bundles under placement policies unless
    ``loadBalancerSheddingBundlesWithPoliciesEnabled``).

    ``TransferShedder`` walks this list in stored order, so a pair first moves the smallest of
    the top bundles and stops at the first one that would overshoot the offload target; the
    min broker's list is offered for swaps in the same order. Stats come from ``lastStats``,
    else from the short-term average; never-measured bundles and system namespaces (which
    Pulsar's ``TopKBundles`` leaves out) are not listed. ``k < 0`` lists all of them."""
    stats = broker.report.last_stats
    data = view.bundle_data
    items: list[tuple[str, NamespaceBundleStats]] = []
    for b in broker.bundles:
        if is_system_bundle(b) or (excluded is not None and excluded(b)):
            continue
        s = stats.get(b)
        if s is None:
            d = data.get(b)
            if d is None:
                continue
            t = d.short_term
            s = NamespaceBundleStats(
                t.msg_rate_in, t.msg_rate_out, t.msg_throughput_in, t.msg_throughput_out
            )
        items.append((b, s))
    chosen = _ranked(items)
    if k >= 0:
        chosen = chosen[:k]
    return [(b, s.msg_throughput_in + s.msg_throughput_out) for b, s in reversed(chosen)]


class _LoadStats:
    """Pulsar's ``LoadStats``: brokers sorted by load, avg and std, and the two pair cursors."""

    def __init__(self, brokers: list[BrokerView], config: LoadBalancerConfig) -> None:
        self.brokers = brokers
        self.loads = [b.weighted_max_ema for b in brokers]
        n = len(brokers)
        self.avg = sum(self.loads) / n
        self.sq_sum = sum(x * x for x in self.loads)
        self.std = math.sqrt(max(self.sq_sum / n - self.avg * self.avg, 0.0))
        self.target_std = config.load_balancer_broker_load_target_std
        self.multiplier = min(0.5, max(0.0, self.target_std / 2.0))
        self.overload = config.overloaded_threshold
        self.lo, self.hi, self.pairs = 0, n - 1, 0

    def underloaded(self) -> bool:
        lo, hi = self.brokers[self.lo], self.brokers[self.hi]
        if self.loads[self.lo] < self.avg * self.multiplier:
            return True
        return lo.msg_throughput_ema < hi.msg_throughput_ema * self.multiplier

    def overloaded(self) -> bool:
        load = self.loads[self.hi]
        return load > self.overload and load > self.avg + self.target_std

    def reason(self) -> str | None:
        """Why the current (max, min) pair should shed, or ``None`` when balanced."""
        if self.std > self.target_std:
            return DecisionReason.OVERLOADED
        if self.underloaded():
            return DecisionReason.UNDERLOADED
        if self.overloaded():
            return DecisionReason.OVERLOADED
        return None

    def offload(self, max_load: float, min_load: float, moved_load: float) -> None:
        """Re-estimate ``std`` as if ``moved_load`` went from the max to the min broker."""
        max_after = max(0.0, max_load - moved_load)
        min_after = min_load + moved_load
        self.sq_sum += max_after**2 + min_after**2 - max_load**2 - min_load**2
        n = len(self.brokers)
        self.std = math.sqrt(abs(self.sq_sum / n - self.avg * self.avg))
        self.pairs += 1
        self.lo += 1

    def describe(self) -> str:
        return f"avg={self.avg:.4f} std={self.std:.4f} targetStd={self.target_std:.4f}"


@dataclass(slots=True)
class _Pair:
    """One (max, min) pair's walk; ``moves`` are (bundle, from, to, bytes/s) in decision order."""

    view: ClusterView
    src: BrokerView
    dst: BrokerView
    taken: set[str]
    k: int
    transfer: bool
    guard: PolicyGuard
    excluded: Callable[[str], bool] | None
    moves: list[tuple[str, str, str, float]] = field(default_factory=list)
    marked: float = 0.0
    gained: float = 0.0
    refused: int = 0
    """Bundles passed over because their policies do not allow the move."""

    def walk(self, offload_bytes_per_s: float, top: list[tuple[str, float]]) -> None:
        recent = self.view.recently_unloaded
        thr_max = self.src.report.msg_throughput
        min_side = (
            iter(top_bundles(self.view, self.dst, self.k, excluded=self.excluded))
            if self.transfer
            else iter(())
        )
        min_left = len(self.dst.bundles)
        remaining = len(top)
        src, dst = self.src.broker, self.dst.broker
        for bundle, thr in top:
            if bundle in recent or bundle in self.taken:
                continue
            if not self.guard.is_transferable(bundle, src, dst, transfer=self.transfer):
                self.refused += 1
                continue
            if remaining <= 1:
                break
            if thr <= 0:
                continue
            if self.marked - self.gained + thr > offload_bytes_per_s:
                swap = self._swap(min_side, thr, thr_max, min_left) if self.transfer else []
                if not swap:
                    break
                min_left -= len(swap)
                for b, t in swap:
                    self.moves.append((b, self.dst.broker, self.src.broker, t))
                    self.taken.add(b)
                    self.gained += t
            self.moves.append((bundle, self.src.broker, self.dst.broker, thr))
            self.taken.add(bundle)
            self.marked += thr
            remaining -= 1

    def _swap(self, min_side, thr: float, thr_max: float, min_left: int) -> list[tuple[str, float]]:
        """Min-broker bundles to send back so that moving ``thr`` does not overshoot."""
        recent = self.view.recently_unloaded
        net = self.marked - self.gained + thr
        max_new = thr_max - net
        min_new = self.dst.report.msg_throughput + net
        back: list[tuple[str, float]] = []
        for b, t in min_side:
            if b in recent or b in self.taken:
                continue
            if not self.guard.is_transferable(b, self.dst.broker, self.src.broker, transfer=True):
                continue
            if t <= 0:
                continue
            if min_left - len(back) <= 1:
                break  # the min broker keeps at least one bundle
            if max_new + t < thr_max and min_new - t < thr_max:
                back.append((b, t))
                max_new += t
                min_new -= t
                if min_new <= max_new and max_new < thr_max * SWAP_MAX_BROKER_RATIO:
                    return back
        return []


class TransferShedder:
    """Bring the std of broker load under a target, pairing the busiest with the idlest."""

    name: ClassVar[str] = "TransferShedder"
    state_type: ClassVar[type] = TransferShedderState

    def initial_state(self) -> TransferShedderState:
        return TransferShedderState()

    def find_bundles_for_unloading(
        self,
        view: ClusterView,
        config: LoadBalancerConfig,
        state: TransferShedderState,
        *,
        now_ms: int,
        cycle: str,
    ) -> tuple[TransferShedderState, PolicyResult]:
        grace_ms = config.load_balancer_shedding_grace_period_minutes * MINUTE_MS
        recent = {
            b: t
            for b, t in state.recent_brokers.items()
            if b in view.brokers and now_ms - t < grace_ms
        }
        skips: list[Skip] = []

        def stop(hits: int, reason: str | None = None, detail: str = ""):
            if reason is not None:
                skips.append(Skip(self.name, reason, detail=detail))
            new_state = TransferShedderState(hits, MappingProxyType(recent))
            return new_state, PolicyResult((), tuple(skips))

        fresh = self._fresh_brokers(view, config, recent, now_ms, skips)
        if fresh is None:  # cool-down, already recorded as a skip
            return stop(state.hit_count)
        if any(not math.isfinite(b.weighted_max_ema) for b in fresh.values()):
            return stop(state.hit_count, SkipReason.NO_LOAD_DATA, "a broker's load is not a number")
        if len(fresh) < 2:
            return stop(
                state.hit_count, SkipReason.NO_BROKERS, f"{len(fresh)} broker(s) with fresh data"
            )

        stats = _LoadStats(
            sorted(fresh.values(), key=lambda b: (b.weighted_max_ema, b.broker)), config
        )
        if stats.reason() is None:
            return stop(0, SkipReason.BALANCED, stats.describe())
        hits = state.hit_count + 1
        threshold = config.load_balancer_shedding_condition_hit_count_threshold
        if hits <= threshold:
            return stop(
                hits, SkipReason.HIT_COUNT, f"hit {hits} <= {threshold}; {stats.describe()}"
            )

        decisions = self._shed(view, config, stats, skips, cycle=cycle, now_ms=now_ms)
        if not decisions:
            no_data = any(s.reason == SkipReason.NO_LOAD_DATA for s in skips)
            return stop(
                hits,
                SkipReason.NO_LOAD_DATA if no_data else SkipReason.NO_BUNDLES,
                stats.describe(),
            )
        for d in decisions:
            for broker in (d.source_broker, d.destination_broker):
                if broker is not None:
                    recent[broker] = now_ms
        new_state = TransferShedderState(0, MappingProxyType(recent))
        return new_state, PolicyResult(tuple(decisions), tuple(skips))

    def _fresh_brokers(
        self,
        view: ClusterView,
        config: LoadBalancerConfig,
        recent: dict[str, int],
        now_ms: int,
        skips: list[Skip],
    ) -> dict[str, BrokerView] | None:
        """Brokers with data younger than the TTL, or ``None`` when a cool-down stops the cycle;
        forgets (in ``recent``) brokers whose data already reflects their last move."""
        ttl_ms = config.load_balancer_broker_load_data_ttl_in_seconds * 1000
        delay_ms = config.load_balance_shedding_delay_in_seconds * 1000
        fresh: dict[str, BrokerView] = {}
        for name in sorted(view.brokers):
            b = view.brokers[name]
            age_ms = now_ms - b.updated_at_ms
            if age_ms > ttl_ms:
                skips.append(
                    Skip(self.name, SkipReason.OUT_DATED_DATA, name, detail=f"age {age_ms} ms")
                )
                continue
            moved_at_ms = recent.get(name)
            if moved_at_ms is not None:
                elapsed_ms = b.updated_at_ms - moved_at_ms
                if elapsed_ms < delay_ms:
                    detail = f"data {elapsed_ms} ms after the last move < {delay_ms:g} ms"
                    skips.append(Skip(self.name, SkipReason.COOL_DOWN, name, detail=detail))
                    return None
                del recent[name]
            fresh[name] = b
        return fresh

    def _sheddable_top(
        self,
        view: ClusterView,
        src: BrokerView,
        max_load: float,
        k: int,
        excluded: Callable[[str], bool] | None,
        skips: list[Skip],
    ) -> list[tuple[str, float]] | None:
        """The max broker ``src``'s top-K bundles (``top_bundles``), or ``None`` with the skip
        recorded when it has nothing a pair may move: no bundle outside placement policies, no
        bundle stats (``NoLoadData`` when it has bundles), a sole bundle (never emptied), or a
        load of 0 (nothing to offload; Pulsar would divide by zero here)."""
        top = top_bundles(view, src, k, excluded=excluded)
        if not top:
            if excluded is not None and top_bundles(view, src, k):
                detail = "every bundle is under placement policies"
                skips.append(Skip(self.name, SkipReason.NO_BUNDLES, src.broker, detail=detail))
                return None
            why = SkipReason.NO_LOAD_DATA if src.bundles else SkipReason.NO_BUNDLES
            skips.append(Skip(self.name, why, src.broker, detail="no bundle stats"))
            return None
        if len(top) == 1:
            skips.append(
                Skip(self.name, SkipReason.NO_BUNDLES, src.broker, top[0][0], "sole bundle")
            )
            return None
        if max_load <= 0:  # nothing to offload (Pulsar would divide by zero here)
            skips.append(Skip(self.name, SkipReason.NO_BUNDLES, src.broker, detail="max load is 0"))
            return None
        return top

    def _shed(
        self,
        view: ClusterView,
        config: LoadBalancerConfig,
        stats: _LoadStats,
        skips: list[Skip],
        *,
        cycle: str,
        now_ms: int,
    ) -> list[Decision]:
        """Step 5: walk (max, min) pairs inwards until balanced or out of pairs."""
        k = config.load_balancer_max_number_of_bundles_in_bundle_load_report
        transfer = config.load_balancer_transfer_enabled
        max_pairs = config.load_balancer_max_number_of_broker_shedding_per_cycle
        taken: set[str] = set()
        decisions: list[Decision] = []
        guard = PolicyGuard(view, config)
        excluded = None if guard.sheds_bundles_with_policies() else guard.has_policies
        while stats.pairs < max_pairs and stats.lo < stats.hi:
            reason = stats.reason()
            if reason is None:
                break
            src, dst = stats.brokers[stats.hi], stats.brokers[stats.lo]
            max_load, min_load = stats.loads[stats.hi], stats.loads[stats.lo]
            stats.hi -= 1
            top = self._sheddable_top(view, src, max_load, k, excluded, skips)
            if top is None:
                continue
            offload = (max_load - min_load) / 2
            thr_max = src.report.msg_throughput
            offload_bytes_per_s = thr_max * offload / max_load
            pair = _Pair(view, src, dst, taken, k, transfer, guard, excluded)
            pair.walk(offload_bytes_per_s, top)
            if pair.marked <= 0:
                detail = f"no bundle fits {offload_bytes_per_s:.0f} B/s"
                if pair.refused:
                    detail += f"; {pair.refused} refused by placement policies"
                skips.append(Skip(self.name, SkipReason.NO_BUNDLES, src.broker, detail=detail))
                continue
            net = pair.marked - pair.gained
            moved_load = net * max_load / thr_max if thr_max > 0 else offload
            inputs = {
                "maxBrokerLoad": max_load,
                "minBrokerLoad": min_load,
                "avgLoad": stats.avg,
                "stdBefore": stats.std,
                "targetStd": stats.target_std,
                "offloadThroughputBytesPerS": offload_bytes_per_s,
                "netThroughputMovedBytesPerS": net,
            }
            for bundle, frm, to, thr in pair.moves:
                decisions.append(
                    make_decision(
                        cycle=cycle,
                        kind=TRANSFER if transfer else UNLOAD,
                        bundle=bundle,
                        source_broker=frm,
                        destination_broker=to if transfer else None,
                        reason=reason,
                        strategy=self.name,
                        inputs={
                            **inputs,
                            "bundleThroughputBytesPerS": thr,
                            "swap": frm == dst.broker,
                        },
                        decided_at_ms=now_ms,
                    )
                )
            stats.offload(max_load, min_load, moved_load)
        return decisions
