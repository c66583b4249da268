"""UniformLoadShedder: mirrors ``org.apache.pulsar.broker.loadbalance.impl.UniformLoadShedder``.

Looks only at the brokers with the highest and lowest message rate (msgRateIn + Out) and
throughput (msgThroughputIn + Out); a minimum near zero is replaced by 1.0. It sheds from the
single max broker when the msg-rate difference ``(max - min) x 100 / min`` exceeds
``loadBalancerMsgRateDifferenceShedderThreshold`` (percent, > 0 enables), else when the
throughput ratio ``max / min`` exceeds
``loadBalancerMsgThroughputMultiplierDifferenceShedderThreshold`` (> 0 enables). The amount is
``(max - min) x maxUnloadPercentage``, required to be at least ``minUnloadMessage`` msg/s or
``minUnloadMessageThroughput`` B/s. Bundles are taken by short-term metric, largest first, when
``bundleMetric <= remaining + 1000`` (Pulsar's hard-coded delta, complaint #21905), up to
``maxUnloadBundleNumPerShedding`` (-1 = unlimited), never the broker's last bundle.

Deviation: ties between brokers resolve by name (Pulsar: map order).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from loadbalance.decisions import UNLOAD, Decision, PolicyResult, Skip, make_decision
from loadbalance.view import BrokerView, ClusterView

if TYPE_CHECKING:
    from loadbalance.config import LoadBalancerConfig

EPS = 1e-6
UNLOAD_DELTA = 1000.0


class UniformLoadShedder:
    name: ClassVar[str] = "UniformLoadShedder"

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
        brokers = [view.brokers[n] for n in sorted(view.brokers)]
        if len(brokers) < 2:
            return state, PolicyResult((), (Skip(self.name, "NoBrokers"),))

        def rate(b: BrokerView) -> float:
            return b.report.msg_rate

        def thr(b: BrokerView) -> float:
            return b.report.msg_throughput

        max_rate_b = max(brokers, key=lambda b: (rate(b), b.broker))
        min_rate_b = min(brokers, key=lambda b: (rate(b), b.broker))
        max_thr_b = max(brokers, key=lambda b: (thr(b), b.broker))
        min_thr_b = min(brokers, key=lambda b: (thr(b), b.broker))
        max_rate, min_rate = rate(max_rate_b), max(rate(min_rate_b), 0.0)
        max_thr, min_thr = thr(max_thr_b), max(thr(min_thr_b), 0.0)
        min_rate = 1.0 if min_rate < EPS else min_rate
        min_thr = 1.0 if min_thr < EPS else min_thr
        rate_diff_pct = (max_rate - min_rate) * 100.0 / min_rate
        thr_ratio = max_thr / min_thr

        rate_knob = config.load_balancer_msg_rate_difference_shedder_threshold
        thr_knob = config.load_balancer_msg_throughput_multiplier_difference_shedder_threshold
        pct = config.max_unload_percentage
        by_rate = rate_knob > 0 and rate_diff_pct > rate_knob
        by_thr = not by_rate and thr_knob > 0 and thr_ratio > thr_knob
        if not (by_rate or by_thr):
            return state, PolicyResult((), (Skip(self.name, "Balanced"),))

        if by_rate:
            source, amount = max_rate_b, (max_rate - min_rate) * pct
            minimum, metric = config.min_unload_message, "msgRate"
        else:
            source, amount = max_thr_b, (max_thr - min_thr) * pct
            minimum, metric = config.min_unload_message_throughput, "msgThroughput"
        if amount < minimum:
            skip = Skip(self.name, "BelowMinUnload", broker=source.broker, detail=metric)
            return state, PolicyResult((), (skip,))
        if len(source.bundles) <= 1:
            skip = Skip(self.name, "HighUsageSingleBundle", broker=source.broker)
            return state, PolicyResult((), (skip,))

        def bundle_metric(b: str) -> float:
            st = view.bundle(b).short_term
            return st.msg_rate if by_rate else st.msg_throughput

        candidates = sorted(
            ((b, bundle_metric(b)) for b in source.bundles if b not in view.recently_unloaded),
            key=lambda x: (-x[1], x[0]),
        )
        cap = config.max_unload_bundle_num_per_shedding
        limit = len(source.bundles) - 1 if cap < 0 else min(cap, len(source.bundles) - 1)
        remaining = amount
        decisions: list[Decision] = []
        for bundle, m in candidates:
            if len(decisions) >= limit or remaining <= 0:
                break
            if m <= remaining + UNLOAD_DELTA:
                remaining -= m
                decisions.append(
                    make_decision(
                        cycle=cycle,
                        kind=UNLOAD,
                        bundle=bundle,
                        source_broker=source.broker,
                        reason="Overloaded",
                        strategy=self.name,
                        inputs={
                            "metric": metric,
                            "amountToUnload": amount,
                            "bundleMetric": m,
                            "msgRateDifferencePercent": rate_diff_pct,
                            "throughputMultiplier": thr_ratio,
                        },
                        decided_at_ms=now_ms,
                    )
                )
        skips = () if decisions else (Skip(self.name, "NoBundles", broker=source.broker),)
        return state, PolicyResult(tuple(decisions), skips)
