"""OverloadShedder: mirrors ``org.apache.pulsar.broker.loadbalance.impl.OverloadShedder``.

A broker whose unweighted max resource usage (``getMaxResourceUsage``, no history) is at or
above ``loadBalancerBrokerOverloadedThresholdPercentage`` sheds bundles worth
``(usage - threshold + 0.05) x (msgThroughputIn + msgThroughputOut)``, largest short-term
throughput first, at least one; a broker with a single bundle only gets a warning (skip
``HighUsageSingleBundle``, Pulsar's "HIGH USAGE WARNING").

Deviation: brokers are visited in name order and the result is a sorted list (Pulsar uses a
multimap with hash order), so a replay gives the same decisions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from loadbalance.decisions import UNLOAD, Decision, PolicyResult, Skip, make_decision
from loadbalance.shedding.selection import select_until, sheddable_bundles
from loadbalance.view import ClusterView

if TYPE_CHECKING:
    from loadbalance.config import LoadBalancerConfig

ADDITIONAL_THRESHOLD_PERCENT_MARGIN = 0.05


class OverloadShedder:
    name: ClassVar[str] = "OverloadShedder"

    def initial_state(self) -> Any:
        return None

    def find_bundles_for_unloading(
        self,
        view: ClusterView,
        config: LoadBalancerConfig,
        state: Any,
        *,
        now_ms: int,
        cycle: str,
    ) -> tuple[Any, PolicyResult]:
        threshold = config.load_balancer_broker_overloaded_threshold_percentage / 100.0
        decisions: list[Decision] = []
        skips: list[Skip] = []
        for name in sorted(view.brokers):
            broker = view.brokers[name]
            usage = broker.report.max_resource_usage()
            if usage < threshold:
                continue
            if len(broker.bundles) <= 1:
                skips.append(
                    Skip(self.name, "HighUsageSingleBundle", broker=name, detail=f"{usage:.3f}")
                )
                continue
            fraction = usage - threshold + ADDITIONAL_THRESHOLD_PERCENT_MARGIN
            target = broker.report.msg_throughput * fraction
            candidates = sheddable_bundles(view, broker, view.recently_unloaded)
            if not candidates:
                skips.append(Skip(self.name, "NoBundles", broker=name))
                continue
            for bundle, thr in select_until(candidates, target, len(broker.bundles) - 1):
                decisions.append(
                    make_decision(
                        cycle=cycle,
                        kind=UNLOAD,
                        bundle=bundle,
                        source_broker=name,
                        reason="Overloaded",
                        strategy=self.name,
                        inputs={
                            "brokerUsage": usage,
                            "threshold": threshold,
                            "minThroughputToOffload": target,
                            "bundleThroughput": thr,
                        },
                        decided_at_ms=now_ms,
                    )
                )
        if not decisions and not skips:
            skips.append(Skip(self.name, "Balanced"))
        return state, PolicyResult(tuple(decisions), tuple(skips))
