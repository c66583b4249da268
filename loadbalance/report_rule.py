"""When a broker publishes its load report: Pulsar's ``needBrokerDataUpdate``, as a pure rule.

Why a rule at all: a broker that wrote a report on every check would flood the report topic
with near-identical records and make every downstream average churn for nothing; one that wrote
rarely would hide a sudden overload. Pulsar's compromise, kept here, is to look every
``loadBalancerReportUpdateMinIntervalMillis`` and write only when a headline figure moved by more
than ``loadBalancerReportUpdateThresholdPercentage``, or when the last write is older than
``loadBalancerReportUpdateMaxIntervalMinutes`` (so a quiet broker still proves it is alive).

The figures compared are the largest resource usage (in absolute percentage points), the total
message rate, the total throughput and the bundle count. A figure going from zero to anything is
an infinite change; zero to zero is no change. No clock is read here: the caller passes
``now_ms``, so the agent and its tests drive the rule with any clock they like.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from loadbalance.config import LoadBalancerConfig
from loadbalance.model import LocalBrokerData

__all__ = [
    "PublishVerdict",
    "ReportUpdateRule",
    "max_percent_change",
    "percent_change",
]


def percent_change(old: float, new: float) -> float:
    """Relative change in percent; from 0 it is +inf unless the new value is 0 too."""
    if old == 0:
        return 0.0 if new == 0 else math.inf
    return 100.0 * abs((old - new) / old)


def max_percent_change(last: LocalBrokerData, current: LocalBrokerData) -> float:
    """The largest of the four changes Pulsar watches between two reports, in percent.

    Resource usage is already a fraction of its limit, so its change is taken in absolute
    points (80 % -> 88 % is 8, not 10); the other three are relative changes.
    """
    return max(
        100.0 * abs(last.max_resource_usage() - current.max_resource_usage()),
        percent_change(last.msg_rate, current.msg_rate),
        percent_change(last.msg_throughput, current.msg_throughput),
        percent_change(float(last.num_bundles), float(current.num_bundles)),
    )


@dataclass(frozen=True, slots=True)
class PublishVerdict:
    """Whether to publish, and why: the agent logs ``reason`` with every published report."""

    publish: bool
    reason: str
    max_change_percent: float = 0.0


@dataclass(frozen=True, slots=True)
class ReportUpdateRule:
    """The three reporting knobs, in milliseconds and percent."""

    min_interval_ms: int = 5_000
    max_interval_ms: int = 15 * 60_000
    threshold_percentage: float = 10.0

    @classmethod
    def from_config(cls, config: LoadBalancerConfig) -> ReportUpdateRule:
        return cls(
            min_interval_ms=int(config.load_balancer_report_update_min_interval_millis),
            max_interval_ms=int(config.load_balancer_report_update_max_interval_minutes * 60_000),
            threshold_percentage=float(config.load_balancer_report_update_threshold_percentage),
        )

    def check_due(self, last_check_ms: int | None, now_ms: int) -> bool:
        """True when a check may run: never checked yet, or a full min interval has passed.

        Sampling the host and the bundle stats is the expensive part, so the agent asks this
        before it samples anything. A clock that stepped backwards (NTP) counts as due, or
        the agent would go silent until wall time caught up again.
        """
        if last_check_ms is None or now_ms < last_check_ms:
            return True
        return now_ms - last_check_ms >= self.min_interval_ms

    def verdict(
        self,
        last_published: LocalBrokerData | None,
        last_published_ms: int | None,
        current: LocalBrokerData,
        now_ms: int,
    ) -> PublishVerdict:
        """Decide on one freshly sampled report against the last one that was published."""
        if last_published is None or last_published_ms is None:
            return PublishVerdict(True, "first report", math.inf)
        change = max_percent_change(last_published, current)
        since_ms = now_ms - last_published_ms
        if since_ms > self.max_interval_ms:
            return PublishVerdict(True, f"max interval passed ({since_ms} ms since last)", change)
        if change > self.threshold_percentage:
            return PublishVerdict(
                True,
                f"changed {change:.1f}% > {self.threshold_percentage:g}%",
                change,
            )
        return PublishVerdict(
            False, f"changed {change:.1f}% <= {self.threshold_percentage:g}%", change
        )
