"""ThresholdShedder: mirrors ``org.apache.pulsar.broker.loadbalance.impl.ThresholdShedder``.

Per broker the history-weighted usage ``u_b`` (EMA with ``loadBalancerHistoryResourcePercentage``
of the weighted, capped max usage; computed by the aggregation, ``BrokerView.history_usage``).
With ``avg`` the mean and ``t = loadBalancerBrokerThresholdShedderPercentage / 100``, a broker
is overloaded when ``u_b >= avg + t``; it sheds ``(u_b - avg - t + 0.05) x throughput``, skipped
when that is below ``loadBalancerBundleUnloadMinThroughputThreshold`` MB. Lower-boundary
shedding (``lowerBoundarySheddingEnabled``): when nothing was selected and some broker is below
``avg - t``, the highest broker with more than one bundle sheds ``throughput x t x 0.5``.

Deviations: the history average is kept by the aggregation, not inside the shedder (same
formula, seeded with the first reading as after Pulsar #13119); brokers are visited in a
deterministic order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from loadbalance.decisions import UNLOAD, Decision, PolicyResult, Skip, make_decision
from loadbalance.shedding.selection import select_until, sheddable_bundles
from loadbalance.view import BrokerView, ClusterView

if TYPE_CHECKING:
    from loadbalance.config import LoadBalancerConfig

ADDITIONAL_THRESHOLD_PERCENT_MARGIN = 0.05
LOWER_BOUNDARY_THRESHOLD_MARGIN = 0.5
MB = 1024 * 1024


class ThresholdShedder:
    name: ClassVar[str] = "ThresholdShedder"

    def initial_state(self) -> Any:
        return None

    def _shed(
        self,
        view: ClusterView,
        broker: BrokerView,
        target: float,
        reason: str,
        inputs: dict[str, float],
        cycle: str,
        now_ms: int,
    ) -> list[Decision]:
        candidates = sheddable_bundles(view, broker, view.recently_unloaded)
        out = []
        for bundle, thr in select_until(candidates, target, len(broker.bundles) - 1):
            out.append(
                make_decision(
                    cycle=cycle,
                    kind=UNLOAD,
                    bundle=bundle,
                    source_broker=broker.broker,
                    reason=reason,
                    strategy=self.name,
                    inputs={**inputs, "minThroughputToOffload": target, "bundleThroughput": thr},
                    decided_at_ms=now_ms,
                )
            )
        return out

    def find_bundles_for_unloading(
        self,
        view: ClusterView,
        config: LoadBalancerConfig,
        state: Any,
        *,
        now_ms: int,
        cycle: str,
    ) -> tuple[Any, PolicyResult]:
        decisions: list[Decision] = []
        skips: list[Skip] = []
        brokers = [view.brokers[n] for n in sorted(view.brokers)]
        if not brokers:
            return state, PolicyResult((), (Skip(self.name, "NoBrokers"),))
        avg = sum(b.history_usage for b in brokers) / len(brokers)
        t = config.load_balancer_broker_threshold_shedder_percentage / 100.0
        min_thr = config.load_balancer_bundle_unload_min_throughput_threshold * MB
        for b in brokers:
            usage = b.history_usage
            if usage < avg + t:
                continue
            target = b.report.msg_throughput * (
                usage - avg - t + ADDITIONAL_THRESHOLD_PERCENT_MARGIN
            )
            if target < min_thr:
                skips.append(Skip(self.name, "BelowMinThroughput", broker=b.broker))
                continue
            if len(b.bundles) <= 1:
                skips.append(Skip(self.name, "HighUsageSingleBundle", broker=b.broker))
                continue
            inputs = {"brokerUsage": usage, "avgUsage": avg, "threshold": t}
            decisions += self._shed(view, b, target, "Overloaded", inputs, cycle, now_ms)
        if not decisions and config.lower_boundary_shedding_enabled:
            decisions += self._lower_boundary(view, brokers, avg, t, min_thr, cycle, now_ms, skips)
        if not decisions and not skips:
            skips.append(Skip(self.name, "Balanced", detail=f"avg={avg:.4f} trigger={avg + t:.4f}"))
        return state, PolicyResult(tuple(decisions), tuple(skips))

    def _lower_boundary(
        self,
        view: ClusterView,
        brokers: list[BrokerView],
        avg: float,
        t: float,
        min_thr: float,
        cycle: str,
        now_ms: int,
        skips: list[Skip],
    ) -> list[Decision]:
        if not any(b.history_usage < avg - t for b in brokers):
            return []
        eligible = [b for b in brokers if len(b.bundles) > 1 and b.history_usage > avg - t]
        if not eligible:
            return []
        top = max(eligible, key=lambda b: (b.history_usage, b.broker))
        target = top.report.msg_throughput * t * LOWER_BOUNDARY_THRESHOLD_MARGIN
        if target < min_thr:
            skips.append(Skip(self.name, "BelowMinThroughput", broker=top.broker))
            return []
        inputs = {"brokerUsage": top.history_usage, "avgUsage": avg, "threshold": t}
        return self._shed(view, top, target, "Underloaded", inputs, cycle, now_ms)
