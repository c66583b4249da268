"""ThresholdShedder: mirrors ``org.apache.pulsar.broker.loadbalance.impl.ThresholdShedder``.

The modular load manager's default shedder compares every broker with the cluster average
instead of a fixed line. Each broker's load ``u`` is the history-weighted usage
(``BrokerView.history_usage``: an EMA with ``h = loadBalancerHistoryResourcePercentage`` of the
weighted, capped ``getMaxResourceUsageWithWeight``), so one noisy report does not trigger a
move. With ``avg`` the mean over brokers and ``t = loadBalancerBrokerThresholdShedderPercentage
/ 100``:

* a broker with ``u >= avg + t`` sheds ``(u - avg - t + 0.05) x (msgThroughputIn + Out)`` of
  throughput (to end 5 points below the trigger), largest short-term bundle first, at least one;
  it is left alone when that amount is below ``loadBalancerBundleUnloadMinThroughputThreshold``
  MB/s (moving crumbs costs more than it gains) or when it has a single bundle;
* lower-boundary shedding (``lowerBoundarySheddingEnabled``, Pulsar PR #17456): when nothing was
  selected and some broker sits below ``avg - t`` - the case the plain rule never fixes, e.g. ten
  brokers at 80 % and a new one at 0 % (avg 72.7 %, trigger 82.7 %) - the busiest broker with
  more than one bundle and ``u > avg - t`` sheds ``(msgThroughputIn + Out) x t x 0.5``, again
  subject to the minimum.

Skips: ``NoBrokers``, ``NoLoadData`` (average usage 0: Pulsar gives up, the resource limits are
missing), ``BelowMinThroughput``, ``HighUsageSingleBundle``, ``NoBundles``, ``Balanced``.

Deviations from Pulsar:

* the history average is kept by the aggregation (``view.ingest``), not inside the shedder: same
  formula, seeded with the first reading as after Pulsar #13119, and not advanced a second time
  when lower-boundary shedding runs (Pulsar's ``tryLowerBoundaryShedding`` calls
  ``getBrokerAvgUsage`` again, folding the same report in twice);
* brokers are visited in name order, the lower-boundary tie goes to the first name, and
  decisions come out grouped by broker, largest bundle first (Pulsar: hash order);
* a broker always keeps one bundle and a bundle is shed at most once (see ``selection``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from loadbalance.decisions import Decision, PolicyResult, Skip
from loadbalance.shedding.selection import (
    MB,
    max_bundles_to_shed,
    select_until,
    sheddable_bundles,
    unload_decisions,
)
from loadbalance.values import DecisionReason, SkipReason
from loadbalance.view import BrokerView, ClusterView

if TYPE_CHECKING:
    from loadbalance.config import LoadBalancerConfig

ADDITIONAL_THRESHOLD_PERCENT_MARGIN = 0.05
LOWER_BOUNDARY_THRESHOLD_MARGIN = 0.5


class ThresholdShedder:
    """Shed from brokers whose history usage is ``t`` above the cluster average."""

    name: ClassVar[str] = "ThresholdShedder"
    state_type: ClassVar[type] = type(None)

    def initial_state(self) -> None:
        """Stateless here: the history EMA lives in the aggregation, not in the shedder."""
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
        avg = sum(b.history_usage for b in brokers) / len(brokers)
        if avg == 0:
            skip = Skip(
                self.name, SkipReason.NO_LOAD_DATA, detail="average max resource usage is 0"
            )
            return None, PolicyResult((), (skip,))
        t = config.load_balancer_broker_threshold_shedder_percentage / 100.0
        min_bytes_per_s = config.load_balancer_bundle_unload_min_throughput_threshold * MB
        decisions: list[Decision] = []
        skips: list[Skip] = []
        taken: set[str] = set()
        for broker in brokers:
            usage = broker.history_usage
            if usage < avg + t:
                continue
            fraction = usage - avg - t + ADDITIONAL_THRESHOLD_PERCENT_MARGIN
            target = broker.report.msg_throughput * fraction
            inputs = {
                "brokerHistoryUsage": usage,
                "avgUsage": avg,
                "threshold": t,
                "percentOfTrafficToOffload": fraction,
            }
            decisions += self._shed(
                view,
                broker,
                target,
                min_bytes_per_s,
                DecisionReason.OVERLOADED,
                inputs,
                taken,
                skips,
                cycle=cycle,
                now_ms=now_ms,
            )
        if not decisions and config.lower_boundary_shedding_enabled:
            decisions += self._lower_boundary(
                view, brokers, avg, t, min_bytes_per_s, taken, skips, cycle=cycle, now_ms=now_ms
            )
        if not decisions and not skips:
            detail = f"avg={avg:.4f} trigger={avg + t:.4f} lower={avg - t:.4f}"
            skips.append(Skip(self.name, SkipReason.BALANCED, detail=detail))
        return None, PolicyResult(tuple(decisions), tuple(skips))

    def _shed(
        self,
        view: ClusterView,
        broker: BrokerView,
        target_bytes_per_s: float,
        min_bytes_per_s: float,
        reason: str,
        inputs: dict[str, float],
        taken: set[str],
        skips: list[Skip],
        *,
        cycle: str,
        now_ms: int,
    ) -> list[Decision]:
        """Pulsar's order of checks: the minimum first, then the single-bundle warning."""
        name = broker.broker
        if target_bytes_per_s < min_bytes_per_s:
            detail = f"target={target_bytes_per_s:.0f} B/s < minimum={min_bytes_per_s:.0f} B/s"
            skips.append(Skip(self.name, SkipReason.BELOW_MIN_THROUGHPUT, name, detail=detail))
            return []
        if len(broker.bundles) == 1:
            (sole,) = broker.bundles
            skips.append(Skip(self.name, SkipReason.HIGH_USAGE_SINGLE_BUNDLE, name, sole))
            return []
        candidates = sheddable_bundles(view, broker, taken)
        if not candidates:
            detail = "no bundles" if not broker.bundles else "all recently unloaded"
            skips.append(Skip(self.name, SkipReason.NO_BUNDLES, name, detail=detail))
            return []
        picked = select_until(candidates, target_bytes_per_s, max_bundles_to_shed(broker))
        taken.update(b for b, _ in picked)
        return unload_decisions(
            self.name,
            broker,
            picked,
            reason=reason,
            inputs={**inputs, "minThroughputToOffloadBytesPerS": target_bytes_per_s},
            metric_name="bundleShortTermThroughputBytesPerS",
            cycle=cycle,
            now_ms=now_ms,
        )

    def _lower_boundary(
        self,
        view: ClusterView,
        brokers: list[BrokerView],
        avg: float,
        t: float,
        min_bytes_per_s: float,
        taken: set[str],
        skips: list[Skip],
        *,
        cycle: str,
        now_ms: int,
    ) -> list[Decision]:
        """Pulsar's ``tryLowerBoundaryShedding``: relieve the busiest broker for a starved one."""
        lower = avg - t
        if not any(b.history_usage < lower for b in brokers):
            return []
        top: BrokerView | None = None
        for b in brokers:  # strict '>' in name order: the first name wins a tie, as in Pulsar
            best = top.history_usage if top is not None else lower
            if b.history_usage > best and len(b.bundles) > 1:
                top = b
        if top is None:
            detail = f"lower boundary: no broker with more than one bundle above {lower:.4f}"
            skips.append(Skip(self.name, SkipReason.NO_BUNDLES, detail=detail))
            return []
        target = top.report.msg_throughput * t * LOWER_BOUNDARY_THRESHOLD_MARGIN
        inputs = {
            "brokerHistoryUsage": top.history_usage,
            "avgUsage": avg,
            "threshold": t,
            "lowerBoundary": lower,
        }
        return self._shed(
            view,
            top,
            target,
            min_bytes_per_s,
            DecisionReason.UNDERLOADED,
            inputs,
            taken,
            skips,
            cycle=cycle,
            now_ms=now_ms,
        )
