"""LeastLongTermMessageRate: place a bundle on the broker with the smallest long-term message rate.

Mirrors Pulsar's ``org.apache.pulsar.broker.loadbalance.impl.LeastLongTermMessageRate``, the
default ``loadBalancerLoadPlacementStrategy`` of the modular load manager:

* A broker whose ``max_resource_usage()`` is above
  ``loadBalancerBrokerOverloadedThresholdPercentage`` (85 %) scores ``+inf``, so it is chosen
  only when every candidate is overloaded.
* Otherwise the score is the long-term ``msgRateIn + msgRateOut`` of the broker
  (``TimeAverageBrokerData``) plus that of every bundle preallocated to it in this cycle. The
  preallocation term is what stops herding: the broker's report will not show a new bundle for a
  while, so without it every bundle placed in one cycle would land on the same least-loaded broker.
* Ties at the minimum are broken at random, with the caller's seeded ``rng`` instead of
  ``ThreadLocalRandom``; candidates are visited in sorted order so a seed gives one answer.

Deviations: the overload test uses the unweighted ``getMaxResourceUsage`` (as Pulsar did before it
switched this check to the weighted reading); a candidate missing from the view is ignored rather
than failing the lookup. The strategy is stateless (its state is always ``None``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar

from loadbalance.placement.base import pending_msg_rate
from loadbalance.time_average import BundleData
from loadbalance.view import BrokerView, ClusterView

if TYPE_CHECKING:
    from loadbalance.config import LoadBalancerConfig


def long_term_score(
    broker: BrokerView,
    preallocated: Mapping[str, BundleData],
    overload_threshold: float,
) -> float:
    """The broker's estimated long-term msg/s, or ``inf`` when it is overloaded."""
    if broker.report.max_resource_usage() > overload_threshold:
        return math.inf
    pending_msg_rate_per_s = pending_msg_rate(preallocated)
    return pending_msg_rate_per_s + broker.time_average.long_term_msg_rate


class LeastLongTermMessageRate:
    """Pick the candidate with the least long-term message rate, counting preallocations."""

    name: ClassVar[str] = "LeastLongTermMessageRate"
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
        threshold = config.load_balancer_broker_overloaded_threshold_percentage / 100.0
        known = sorted(c for c in set(candidates) if c in view.brokers)
        if not known:
            return None, None
        scores = {
            c: long_term_score(view.brokers[c], preallocated.get(c, {}), threshold) for c in known
        }
        best_score = min(scores.values())
        best = [c for c in known if scores[c] == best_score]
        return None, best[rng.randrange(len(best))]
