"""LeastResourceUsageWithWeight: place on a broker clearly below the average weighted usage.

Mirrors Pulsar's ``org.apache.pulsar.broker.loadbalance.impl.LeastResourceUsageWithWeight`` (the
extensible load manager's default selection strategy works the same way):

* A broker's usage is its history-weighted max resource usage with weight
  (``BrokerView.history_usage``: ``h * previous + (1 - h) * current`` with
  ``loadBalancerHistoryResourcePercentage`` and the ``loadBalancer*ResourceWeight`` knobs), the
  same number ThresholdShedder sheds on, so placement and shedding agree on what "loaded" means.
* Like Pulsar, a broker that serves no bundle or reports no messages is judged on its current
  reading instead of its history, so a restarted broker looks empty at once.
* ``avg`` is the mean usage over the candidates that have load data (are in the view); the best
  brokers are those with ``usage + d <= avg``,
  ``d = loadBalancerAverageResourceUsageDifferenceThresholdPercentage / 100``; one of them is
  chosen at random (seeded ``rng``); if none qualifies, any candidate is, including one without
  load data (the extensible strategy's "no load data" brokers: a broker that has just joined).

Known weakness (PIP-364): the random fallback ignores load entirely. With usages
40, 40, 40, 40, 69, 70 (avg 49.8) and ``d = 10`` no broker qualifies, so a bundle unloaded from the
69 % broker can be placed on the 70 % one. Faithful to Pulsar, preallocated bundles are not
counted: a bundle's message rate cannot be turned into a resource-usage increase, so every bundle
placed in one cycle sees the same scores (they spread at random over the best set rather than
herding on one broker). Stateless.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar

from loadbalance.time_average import BundleData
from loadbalance.view import BrokerView, ClusterView

if TYPE_CHECKING:
    from loadbalance.config import LoadBalancerConfig


def placement_usage(broker: BrokerView, config: LoadBalancerConfig) -> float:
    """The usage this strategy compares: history, or the current reading after a restart."""
    report = broker.report
    if not report.bundles or report.msg_rate == 0:
        return report.max_resource_usage_with_weight_capped(
            config.load_balancer_cpu_resource_weight,
            config.load_balancer_memory_resource_weight,
            config.load_balancer_direct_memory_resource_weight,
            config.load_balancer_bandwidth_in_resource_weight,
            config.load_balancer_bandwidth_out_resource_weight,
        )
    return broker.history_usage


class LeastResourceUsageWithWeight:
    """Pick at random among brokers at least ``d`` below the candidates' average usage."""

    name: ClassVar[str] = "LeastResourceUsageWithWeight"
    state_type: ClassVar[type] = type(None)

    def initial_state(self) -> None:
        """Stateless: every selection reads only the view and the preallocations."""
        return None

    def select_broker(
        self,
        candidates: Sequence[str],
        bundle: str,
        bundle_data: BundleData,
        view: ClusterView,
        preallocated: Mapping[str, Mapping[str, BundleData]],
        config: LoadBalancerConfig,
        rng: random.Random,
        state: None,
    ) -> tuple[None, str | None]:
        everyone = sorted(set(candidates))
        if not everyone:
            return None, None
        known = [c for c in everyone if c in view.brokers]
        best: list[str] = []
        if known:
            usage = {c: placement_usage(view.brokers[c], config) for c in known}
            avg = sum(usage.values()) / len(known)
            pct = config.load_balancer_average_resource_usage_difference_threshold_percentage
            diff = pct / 100.0
            best = [c for c in known if usage[c] + diff <= avg]
        best = best or everyone
        return None, best[rng.randrange(len(best))]
