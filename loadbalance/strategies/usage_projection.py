"""One load measure for shedding *and* placement: projected resource usage per broker.

Pulsar's classic pairs judge "loaded" twice, differently: ThresholdShedder unloads by weighted
resource usage, LeastLongTermMessageRate places by message rate. A bundle shed for CPU can land
on a broker that is low on messages but high on CPU (a small machine), and is shed again next
cycle. LeastResourceUsageWithWeight fixes the mismatch but cannot count preallocated bundles,
because a bundle has rates, not a usage percentage, so a burst of lookups herds.

This module closes that gap by turning a bundle's rates into a usage increase on a given broker:

* **Work** of a bundle or broker: ``msgRateIn + msgRateOut + (msgThroughputIn + Out) / 1 KiB``,
  i.e. messages per second plus kilobytes per second, the two things a broker spends CPU on.
* **CPU**: each broker's absolute CPU usage (percent of one core, Pulsar's unit) per unit of
  work is measured from its own report (``cpu_per_work``); a broker with too little work to
  measure borrows the cluster's ratio. Moving work ``w`` from ``s`` to ``d`` changes CPU by
  ``-w * k_s`` on ``s`` and ``+w * k_d`` on ``d``, each against its own limit, so a broker with
  four times the cores takes four times the work for the same percentage. A broker whose CPU
  is at its limit (``_SATURATED``) reports the cap, not what its work costs: its ratio and the
  cluster's would both understate it, so such a broker is projected at its work times the ratio
  of the brokers that are not capped (above 100 %, which is what shedding has to remove), and
  the cluster's ratio is taken over those brokers only. Without this a capped broker looks
  lighter than it is, sheds too few bundles, and is shed again in the next cycles.
* **NIC**: bandwidth in and out move exactly with the bundle's throughput (KB/s against each
  broker's limit).
* Memory and direct memory are held constant (their weights are 0 by default in Pulsar).

Moves decided by earlier cycles that the reports do not show yet (``view.in_flight``) are
projected on construction: taken off a source whose report still lists the bundle, added to a
destination whose report does not list it yet (``loadbalance.in_flight``). Bundles that lookups
placed and whose new owner has not reported them yet (``view.preallocated``) are projected by a
caller that asks (``project_preallocated``): placement adds them itself, per candidate.

A broker's **load** is then Pulsar's ``getMaxResourceUsageWithWeight`` over the projected
figures, so shedding, placement and the preallocation bookkeeping all speak the same number.
The projection ignores idle CPU (it is counted as if proportional to work), which slightly
overstates a bundle's cost: errors are small and the next report corrects them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from loadbalance.in_flight import destination_shows, source_shows
from loadbalance.model import LocalBrokerData, NamespaceBundleStats
from loadbalance.time_average import BundleData
from loadbalance.view import ClusterView, unreported_preallocations

if TYPE_CHECKING:
    from loadbalance.config import LoadBalancerConfig

KBYTES = 1024.0
_MIN_WORK = 1.0


@dataclass(frozen=True, slots=True)
class BundleLoad:
    """A bundle's rates as the projection needs them."""

    msg_rate_per_s: float
    throughput_in_bytes_per_s: float
    throughput_out_bytes_per_s: float

    @property
    def work(self) -> float:
        thr = self.throughput_in_bytes_per_s + self.throughput_out_bytes_per_s
        return self.msg_rate_per_s + thr / KBYTES

    @classmethod
    def of_stats(cls, s: NamespaceBundleStats) -> BundleLoad:
        return cls(s.msg_rate, s.msg_throughput_in, s.msg_throughput_out)

    @classmethod
    def of_data(cls, d: BundleData) -> BundleLoad:
        """From a bundle's short-term averages (the freshest estimate when placing)."""
        st = d.short_term
        return cls(st.msg_rate, st.msg_throughput_in, st.msg_throughput_out)


@dataclass(frozen=True, slots=True)
class Weights:
    """The ``loadBalancer*ResourceWeight`` knobs."""

    cpu: float = 1.0
    memory: float = 0.0
    direct_memory: float = 0.0
    bandwidth_in: float = 1.0
    bandwidth_out: float = 1.0

    @classmethod
    def of(cls, config: LoadBalancerConfig) -> Weights:
        return cls(
            config.load_balancer_cpu_resource_weight,
            config.load_balancer_memory_resource_weight,
            config.load_balancer_direct_memory_resource_weight,
            config.load_balancer_bandwidth_in_resource_weight,
            config.load_balancer_bandwidth_out_resource_weight,
        )


def _work_of(report: LocalBrokerData) -> float:
    return report.msg_rate + report.msg_throughput / KBYTES


@dataclass(slots=True)
class BrokerUsage:
    """One broker's projected absolute usage; mutated as moves are planned in one cycle."""

    name: str
    cpu_pct: float
    cpu_limit_pct: float
    in_kbytes_per_s: float
    in_limit_kbytes_per_s: float
    out_kbytes_per_s: float
    out_limit_kbytes_per_s: float
    memory_pct: float
    direct_memory_pct: float
    cpu_per_work: float

    def load(self, w: Weights) -> float:
        """Weighted max usage as a fraction, over the projected figures."""
        return (
            max(
                _pct(self.cpu_pct, self.cpu_limit_pct) * w.cpu,
                self.memory_pct * w.memory,
                self.direct_memory_pct * w.direct_memory,
                _pct(self.in_kbytes_per_s, self.in_limit_kbytes_per_s) * w.bandwidth_in,
                _pct(self.out_kbytes_per_s, self.out_limit_kbytes_per_s) * w.bandwidth_out,
            )
            / 100.0
        )

    def load_shifted(self, b: BundleLoad, sign: float, w: Weights) -> float:
        """``self.shifted(b, sign).load(w)``, the same operations in the same order, without
        making the shifted copy (the shedder's planning asks this for every candidate)."""
        return (
            max(
                _pct(max(self.cpu_pct + sign * b.work * self.cpu_per_work, 0.0), self.cpu_limit_pct)
                * w.cpu,
                self.memory_pct * w.memory,
                self.direct_memory_pct * w.direct_memory,
                _pct(
                    max(self.in_kbytes_per_s + sign * b.throughput_in_bytes_per_s / KBYTES, 0.0),
                    self.in_limit_kbytes_per_s,
                )
                * w.bandwidth_in,
                _pct(
                    max(self.out_kbytes_per_s + sign * b.throughput_out_bytes_per_s / KBYTES, 0.0),
                    self.out_limit_kbytes_per_s,
                )
                * w.bandwidth_out,
            )
            / 100.0
        )

    def shifted(self, b: BundleLoad, sign: float) -> BrokerUsage:
        """A copy with the bundle added (``sign=1``) or removed (``sign=-1``)."""
        return BrokerUsage(
            self.name,
            max(self.cpu_pct + sign * b.work * self.cpu_per_work, 0.0),
            self.cpu_limit_pct,
            max(self.in_kbytes_per_s + sign * b.throughput_in_bytes_per_s / KBYTES, 0.0),
            self.in_limit_kbytes_per_s,
            max(self.out_kbytes_per_s + sign * b.throughput_out_bytes_per_s / KBYTES, 0.0),
            self.out_limit_kbytes_per_s,
            self.memory_pct,
            self.direct_memory_pct,
            self.cpu_per_work,
        )


_SATURATED = 0.99
"""A broker's CPU at this share of its limit or above is taken as capped (demand unknown)."""


def _saturated(report: LocalBrokerData) -> bool:
    return report.cpu.limit > 0 and report.cpu.usage >= _SATURATED * report.cpu.limit


def _cluster_cpu_per_work(reports: list[LocalBrokerData]) -> float:
    """CPU per unit of work over the brokers whose CPU is not capped at its limit (all of them
    when every one is): a capped broker's report understates what its work costs."""
    free = [r for r in reports if not _saturated(r)] or reports
    total_cpu = sum(r.cpu.usage for r in free)
    total_work = sum(_work_of(r) for r in free)
    return total_cpu / total_work if total_work > _MIN_WORK else 0.0


def _pct(usage: float, limit: float) -> float:
    return usage / limit * 100.0 if limit > 0 else 0.0


class UsageModel:
    """Projected usage of every broker in a view; ``add``/``remove`` plan moves."""

    def __init__(self, view: ClusterView, weights: Weights) -> None:
        self.weights = weights
        reports = [view.brokers[n].report for n in sorted(view.brokers)]
        cluster_k = _cluster_cpu_per_work(reports)
        self.brokers: dict[str, BrokerUsage] = {}
        for r in reports:
            work = _work_of(r)
            k = r.cpu.usage / work if work > _MIN_WORK * 100 else cluster_k
            cpu = r.cpu.usage
            if _saturated(r) and cluster_k > 0:
                k = cluster_k  # its own ratio is capped: the work it serves costs more than 100 %
                cpu = max(cpu, work * k)
            self.brokers[r.broker] = BrokerUsage(
                r.broker,
                cpu,
                r.cpu.limit,
                r.bandwidth_in.usage,
                r.bandwidth_in.limit,
                r.bandwidth_out.usage,
                r.bandwidth_out.limit,
                r.memory.percent_usage(),
                r.direct_memory.percent_usage(),
                k,
            )
        self.placed: dict[str, list[BundleLoad]] = {}  # broker -> preallocations projected
        self._project_in_flight(view)

    def _project_in_flight(self, view: ClusterView) -> None:
        """Count each in-flight move on the side whose report does not show it yet."""
        for bundle in sorted(view.in_flight):
            m = view.in_flight[bundle]
            load = BundleLoad(m.msg_rate, m.throughput_in, m.throughput_out)
            if m.source in self.brokers and source_shows(view, bundle, m):
                self.remove(m.source, load)
            if m.destination in self.brokers and destination_shows(view, bundle, m) is False:
                self.add(m.destination, load)

    def project_preallocated(
        self, view: ClusterView, estimate: Callable[[str, BundleData], BundleLoad]
    ) -> int:
        """Add each bundle preallocated to a broker whose report does not list it yet; how many.

        Why: after a lookup burst (a scale-in's bundles placed on the brokers left) the brokers
        that reported since carry their new bundles and those that did not yet look idle; a
        shedder reading that round would move load off the first ones and back. A bundle in
        flight is left to ``_project_in_flight``, and one preallocated twice counts once."""
        n = 0
        for broker, bundle, data in unreported_preallocations(view):
            if broker in self.brokers and bundle not in view.in_flight:
                load = estimate(bundle, data)
                self.add(broker, load)
                self.placed.setdefault(broker, []).append(load)
                n += 1
        return n

    def fork(self) -> UsageModel:
        """A copy whose planned moves leave this one as it is (a trial plan's)."""
        other = object.__new__(UsageModel)
        other.weights, other.brokers = self.weights, dict(self.brokers)
        other.placed = self.placed
        return other

    def load(self, broker: str) -> float:
        return self.brokers[broker].load(self.weights)

    def load_if_added(self, broker: str, b: BundleLoad) -> float:
        return self.brokers[broker].load_shifted(b, 1.0, self.weights)

    def load_if_removed(self, broker: str, b: BundleLoad) -> float:
        return self.brokers[broker].load_shifted(b, -1.0, self.weights)

    def add(self, broker: str, b: BundleLoad) -> None:
        self.brokers[broker] = self.brokers[broker].shifted(b, 1.0)

    def remove(self, broker: str, b: BundleLoad) -> None:
        self.brokers[broker] = self.brokers[broker].shifted(b, -1.0)
