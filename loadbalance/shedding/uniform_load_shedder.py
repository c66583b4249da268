"""UniformLoadShedder: mirrors ``org.apache.pulsar.broker.loadbalance.impl.UniformLoadShedder``.

This strategy balances traffic, not machines: it looks only at the two extreme brokers by
message rate (``msgRateIn + Out``) and by throughput (``msgThroughputIn + Out``) from the
current reports, and moves a fixed share of the gap from the busiest one. A minimum within
``1e-6`` of zero is replaced by 1.0 so the ratios stay finite.

* msg-rate rule (checked first, ``loadBalancerMsgRateDifferenceShedderThreshold`` > 0 enables):
  ``(maxRate - minRate) x 100 / minRate`` above the threshold (percent);
* throughput rule (only if the first did not fire,
  ``loadBalancerMsgThroughputMultiplierDifferenceShedderThreshold`` > 0 enables):
  ``maxThroughput / minThroughput`` above the multiplier.

The amount is ``int((max - min) x maxUnloadPercentage)`` of the rule's metric; nothing moves
unless it reaches ``minUnloadMessage`` msg/s (rate rule) or ``minUnloadMessageThroughput`` B/s
(throughput rule) and the max broker has more than one bundle. The max broker's bundles with a
positive short-term metric are walked largest first; a bundle is taken when
``metric <= remaining + 1000`` - Pulsar's hard-coded delta, kept on purpose although it makes
low-traffic clusters herd (apache/pulsar#21905) - and ``remaining`` shrinks by it, possibly
below zero (Pulsar does not stop there, so a small bundle can still follow). At most
``maxUnloadBundleNumPerShedding`` bundles (-1 = unlimited). Only the single max broker sheds
per cycle, which is why PIP-364 measured ~100 cycles to absorb 100 new brokers.

Skips: ``NoBrokers``, ``Balanced``, ``BelowMinUnload``, ``HighUsageSingleBundle``,
``NoBundles``.

Deviations from Pulsar: ties between brokers go to the first name (Pulsar: map order); ties
between bundles go to the first name; the broker always keeps one bundle and a bundle
listed by two brokers is considered once (see ``selection``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from loadbalance.decisions import PolicyResult, Skip
from loadbalance.shedding.selection import (
    max_bundles_to_shed,
    sheddable_bundles,
    unload_decisions,
)
from loadbalance.values import DecisionReason, SkipReason
from loadbalance.view import BrokerView, ClusterView

if TYPE_CHECKING:
    from loadbalance.config import LoadBalancerConfig

EPS = 1e-6
UNLOAD_DELTA = 1000
"""Pulsar's hard-coded slack: a bundle up to this much above the remaining amount still moves."""


def _extremes(
    brokers: list[BrokerView], metric: str
) -> tuple[BrokerView, float, BrokerView, float]:
    """(max broker, max, min broker, min) by a report metric; first name wins a tie."""
    hi = lo = brokers[0]
    hi_v = lo_v = getattr(hi.report, metric)
    for b in brokers[1:]:
        v = getattr(b.report, metric)
        if v > hi_v:
            hi, hi_v = b, v
        if v < lo_v:
            lo, lo_v = b, v
    if -EPS <= lo_v <= EPS:
        lo_v = 1.0
    return hi, hi_v, lo, lo_v


class UniformLoadShedder:
    """Move a share of the msg-rate (or throughput) gap off the single busiest broker."""

    name: ClassVar[str] = "UniformLoadShedder"
    state_type: ClassVar[type] = type(None)

    def initial_state(self) -> None:
        """Stateless: every cycle reads only the current reports."""
        return None

    def find_bundles_for_unloading(
        self,
        view: ClusterView,
        config: LoadBalancerConfig,
        state: None,
        *,
        now_ms: int,
        cycle: str,
    ) -> tuple[None, PolicyResult]:
        if len(view.brokers) <= 1:
            return None, PolicyResult((), (Skip(self.name, SkipReason.NO_BROKERS),))
        brokers = [view.brokers[n] for n in sorted(view.brokers)]
        rate_hi, max_rate, rate_lo, min_rate = _extremes(brokers, "msg_rate")
        thr_hi, max_thr, thr_lo, min_thr = _extremes(brokers, "msg_throughput")
        rate_diff_pct = (max_rate - min_rate) * 100.0 / min_rate
        thr_multiplier = max_thr / min_thr

        rate_knob = config.load_balancer_msg_rate_difference_shedder_threshold
        thr_knob = config.load_balancer_msg_throughput_multiplier_difference_shedder_threshold
        if rate_knob > 0 and rate_diff_pct > rate_knob:
            source, dest, metric = rate_hi, rate_lo, "msgRate"
            amount = int((max_rate - min_rate) * config.max_unload_percentage)
            minimum: float = config.min_unload_message
        elif thr_knob > 0 and thr_multiplier > thr_knob:
            source, dest, metric = thr_hi, thr_lo, "msgThroughput"
            amount = int((max_thr - min_thr) * config.max_unload_percentage)
            minimum = config.min_unload_message_throughput
        else:
            detail = f"msgRateDiff={rate_diff_pct:.1f}% throughputMultiplier={thr_multiplier:.2f}"
            return None, PolicyResult((), (Skip(self.name, SkipReason.BALANCED, detail=detail),))

        name = source.broker
        if len(source.bundles) <= 1:
            sole = next(iter(source.bundles), None)
            skip = Skip(self.name, SkipReason.HIGH_USAGE_SINGLE_BUNDLE, name, sole, detail=metric)
            return None, PolicyResult((), (skip,))
        if amount < minimum:
            detail = f"{metric}: {amount} to move < minimum {minimum:g}"
            return None, PolicyResult(
                (), (Skip(self.name, SkipReason.BELOW_MIN_UNLOAD, name, None, detail),)
            )

        cap = config.max_unload_bundle_num_per_shedding
        limit = max_bundles_to_shed(source) if cap < 0 else min(cap, max_bundles_to_shed(source))
        remaining = float(amount)
        picked: list[tuple[str, float]] = []
        by_msg_rate = metric == "msgRate"
        for bundle, value in sheddable_bundles(view, source, by_msg_rate=by_msg_rate):
            if len(picked) >= limit or value <= 0:
                break  # sorted descending: once one is <= 0, so are the rest
            if value <= remaining + UNLOAD_DELTA:
                remaining -= value
                picked.append((bundle, value))
        if not picked:
            detail = f"{metric}: no bundle <= {amount} + {UNLOAD_DELTA}"
            return None, PolicyResult(
                (), (Skip(self.name, SkipReason.NO_BUNDLES, name, None, detail),)
            )
        decisions = unload_decisions(
            self.name,
            source,
            picked,
            reason=DecisionReason.OVERLOADED,
            inputs={
                "rule": metric,
                "underloadedBroker": dest.broker,
                "msgRateDifferencePercent": rate_diff_pct,
                "msgThroughputMultiplier": thr_multiplier,
                "amountToUnload": amount,
            },
            metric_name="bundleShortTermMetric",
            cycle=cycle,
            now_ms=now_ms,
        )
        return None, PolicyResult(tuple(decisions), ())
