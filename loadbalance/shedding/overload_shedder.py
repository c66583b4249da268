"""OverloadShedder: mirrors ``org.apache.pulsar.broker.loadbalance.impl.OverloadShedder``.

The oldest modular strategy, and the bluntest: it looks at each broker alone. A broker is
overloaded when its *unweighted* max resource usage (``getMaxResourceUsage``, the current
report, no history) is at or above ``loadBalancerBrokerOverloadedThresholdPercentage``. It then
sheds enough bundles to bring it back under the threshold plus a 5-point margin, i.e.
``(usage - threshold + 0.05) x (msgThroughputIn + msgThroughputOut)`` of throughput, largest
short-term throughput first, at least one bundle. Underloaded brokers are not considered at all,
which is why Pulsar moved its default to ThresholdShedder.

Skips: ``NoBrokers`` (one broker or none), ``HighUsageSingleBundle`` (Pulsar's
"HIGH USAGE WARNING": the sole bundle is the problem, splitting is the cure, not moving),
``NoBundles`` (overloaded with no bundle, or every bundle recently unloaded), ``Balanced``.

Deviations from Pulsar:

* brokers are visited in name order and decisions come out grouped by broker, largest bundle
  first (Pulsar returns a hash-ordered multimap), so a replay yields the same list;
* a broker always keeps one bundle and a bundle is shed at most once (see ``selection``);
* ``NoBrokers`` is reported here too (Pulsar's caller returns before asking the strategy).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from loadbalance.decisions import Decision, PolicyResult, Skip
from loadbalance.shedding.selection import (
    max_bundles_to_shed,
    select_until,
    sheddable_bundles,
    unload_decisions,
)
from loadbalance.values import DecisionReason, SkipReason
from loadbalance.view import ClusterView

if TYPE_CHECKING:
    from loadbalance.config import LoadBalancerConfig

ADDITIONAL_THRESHOLD_PERCENT_MARGIN = 0.05


class OverloadShedder:
    """Shed from every broker whose current max resource usage crosses the threshold."""

    name: ClassVar[str] = "OverloadShedder"
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
        threshold = config.overloaded_threshold
        decisions: list[Decision] = []
        skips: list[Skip] = []
        taken: set[str] = set()
        highest = 0.0
        for name in sorted(view.brokers):
            broker = view.brokers[name]
            usage = broker.report.max_resource_usage()
            highest = max(highest, usage)
            if usage < threshold:
                continue
            if len(broker.bundles) == 1:
                (sole,) = broker.bundles
                detail = f"usage={usage:.4f} threshold={threshold:.4f}"
                skips.append(
                    Skip(self.name, SkipReason.HIGH_USAGE_SINGLE_BUNDLE, name, sole, detail)
                )
                continue
            fraction = usage - threshold + ADDITIONAL_THRESHOLD_PERCENT_MARGIN
            target_bytes_per_s = broker.report.msg_throughput * fraction
            candidates = sheddable_bundles(view, broker, taken)
            if not candidates:
                detail = "no bundles" if not broker.bundles else "all recently unloaded"
                skips.append(Skip(self.name, SkipReason.NO_BUNDLES, name, detail=detail))
                continue
            picked = select_until(candidates, target_bytes_per_s, max_bundles_to_shed(broker))
            taken.update(b for b, _ in picked)
            decisions += unload_decisions(
                self.name,
                broker,
                picked,
                reason=DecisionReason.OVERLOADED,
                inputs={
                    "brokerMaxResourceUsage": usage,
                    "overloadThreshold": threshold,
                    "percentOfTrafficToOffload": fraction,
                    "minThroughputToOffloadBytesPerS": target_bytes_per_s,
                },
                metric_name="bundleShortTermThroughputBytesPerS",
                cycle=cycle,
                now_ms=now_ms,
            )
        if not decisions and not skips:
            detail = f"max usage {highest:.4f} < threshold {threshold:.4f}"
            skips.append(Skip(self.name, SkipReason.BALANCED, detail=detail))
        return None, PolicyResult(tuple(decisions), tuple(skips))
