"""LeastResourceUsageWithWeight: place on a broker clearly below the average weighted usage.

Mirrors Pulsar's ``org.apache.pulsar.broker.loadbalance.impl.LeastResourceUsageWithWeight``:

* The strategy keeps a history usage per broker, ``brokerAvgResourceUsageWithWeight``, and folds
  each candidate's current reading into it **at every selection**
  (``updateAndGetMaxResourceUsageWithWeight``): ``h * previous + (1 - h) * current`` with
  ``h = loadBalancerHistoryResourcePercentage``; the reading is the report's
  ``getMaxResourceUsageWithWeight`` with the ``loadBalancer*ResourceWeight`` knobs, signals above
  100 % included. Pulsar keeps the map inside the strategy object; here it is the strategy state
  (``LeastResourceUsageWithWeightState``) that the caller threads through and persists, so a
  selection stays a pure function and an offline replay folds the same sequence. Several
  selections between two reports fold the same reading several times, as Pulsar's do.
* A broker that serves no bundle or reports no messages starts its history afresh from the
  current reading, so a restarted broker looks empty at once.
* A broker no longer live (not in the view) leaves the map (``onActiveBrokersChange``).
* ``avg`` is the mean history over the candidates that have load data (are in the view); the best
  brokers are those with ``history + d <= avg``,
  ``d = loadBalancerAverageResourceUsageDifferenceThresholdPercentage / 100``; one of them is
  chosen at random (seeded ``rng``); if none qualifies, any candidate is, including one without
  load data (the extensible strategy's "no load data" brokers: a broker that has just joined).

Known weakness (PIP-364): the random fallback ignores load entirely. With usages
40, 40, 40, 40, 69, 70 (avg 49.8) and ``d = 10`` no broker qualifies, so a bundle unloaded from the
69 % broker can be placed on the 70 % one. Faithful to Pulsar, preallocated bundles are not
counted: a bundle's message rate cannot be turned into a resource-usage increase.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar

from loadbalance.model import LocalBrokerData
from loadbalance.time_average import BundleData, history_usage
from loadbalance.view import ClusterView

if TYPE_CHECKING:
    from loadbalance.config import LoadBalancerConfig


@dataclass(frozen=True, slots=True)
class LeastResourceUsageWithWeightState:
    """Pulsar's ``brokerAvgResourceUsageWithWeight``: broker -> history usage (a fraction), as
    folded by the last selection that had the broker among its candidates."""

    broker_avg_resource_usage_with_weight: Mapping[str, float] = field(
        default_factory=lambda: MappingProxyType({})
    )


def resource_usage_with_weight(report: LocalBrokerData, config: LoadBalancerConfig) -> float:
    """``LocalBrokerData.getMaxResourceUsageWithWeight`` with the configured weights: the
    largest weighted reading, above 100 % included (a saturated broker must not look idle)."""
    return report.max_resource_usage_with_weight(
        config.load_balancer_cpu_resource_weight,
        config.load_balancer_memory_resource_weight,
        config.load_balancer_direct_memory_resource_weight,
        config.load_balancer_bandwidth_in_resource_weight,
        config.load_balancer_bandwidth_out_resource_weight,
    )


def update_and_get_max_resource_usage_with_weight(
    previous: float | None, report: LocalBrokerData, config: LoadBalancerConfig
) -> float:
    """``updateAndGetMaxResourceUsageWithWeight``: fold the report's reading into ``previous``;
    a broker that serves nothing or moves no messages (restarted) starts afresh."""
    if not report.bundles or report.msg_rate == 0:
        previous = None
    current = resource_usage_with_weight(report, config)
    return history_usage(previous, current, config.load_balancer_history_resource_percentage)


class LeastResourceUsageWithWeight:
    """Pick at random among brokers at least ``d`` below the candidates' average history usage."""

    name: ClassVar[str] = "LeastResourceUsageWithWeight"
    state_type: ClassVar[type] = LeastResourceUsageWithWeightState

    def initial_state(self) -> LeastResourceUsageWithWeightState:
        """No history yet: the first selection takes each candidate's current reading."""
        return LeastResourceUsageWithWeightState()

    def select_broker(
        self,
        candidates: Sequence[str],
        bundle: str,
        bundle_data: BundleData,
        view: ClusterView,
        preallocated: Mapping[str, Mapping[str, BundleData]],
        config: LoadBalancerConfig,
        rng: random.Random,
        state: LeastResourceUsageWithWeightState,
    ) -> tuple[LeastResourceUsageWithWeightState, str | None]:
        everyone = sorted(set(candidates))
        if not everyone:
            return state, None
        live = view.brokers
        before = state.broker_avg_resource_usage_with_weight
        history = {b: u for b, u in before.items() if b in live}
        known = [c for c in everyone if c in live]
        for c in known:
            history[c] = update_and_get_max_resource_usage_with_weight(
                history.get(c), live[c].report, config
            )
        best: list[str] = []
        if known:
            avg = sum(history[c] for c in known) / len(known)
            pct = config.load_balancer_average_resource_usage_difference_threshold_percentage
            diff = pct / 100.0
            best = [c for c in known if history[c] + diff <= avg]
        best = best or everyone
        after = LeastResourceUsageWithWeightState(MappingProxyType(history))
        return after, best[rng.randrange(len(best))]
