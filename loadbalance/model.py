"""The load-report model: Pulsar's ``LocalBrokerData``, ``ResourceUsage`` and
``NamespaceBundleStats``, as immutable values.

Field meanings and units follow Pulsar (``pulsar-common/.../policies/data/loadbalancer``):
rates in messages per second, throughputs in bytes per second, ``ResourceUsage`` as an
absolute ``usage`` against a ``limit`` (CPU in percent of one core times cores, memory in MB,
bandwidth in KB/s), ``last_update_ms`` in epoch milliseconds. Only what the policies read is
modelled; the codec ignores other fields of a real broker's report.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class ResourceUsage:
    """An absolute usage against its limit (Pulsar's ``ResourceUsage``)."""

    usage: float = 0.0
    limit: float = 0.0

    def percent_usage(self) -> float:
        """Usage in percent of the limit; 0 when the limit is unknown (Pulsar does the same)."""
        return self.usage / self.limit * 100.0 if self.limit > 0 else 0.0


@dataclass(frozen=True, slots=True)
class NamespaceBundleStats:
    """One bundle's current figures in a broker's report (Pulsar's ``NamespaceBundleStats``)."""

    msg_rate_in: float = 0.0
    msg_rate_out: float = 0.0
    msg_throughput_in: float = 0.0
    msg_throughput_out: float = 0.0
    topics: int = 0
    consumer_count: int = 0
    producer_count: int = 0

    @property
    def msg_rate(self) -> float:
        return self.msg_rate_in + self.msg_rate_out

    @property
    def msg_throughput(self) -> float:
        return self.msg_throughput_in + self.msg_throughput_out

    @property
    def sessions(self) -> int:
        return self.consumer_count + self.producer_count


_EMPTY: Mapping[str, NamespaceBundleStats] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class LocalBrokerData:
    """One broker's load report (Pulsar's ``LocalBrokerData``), keyed by ``broker`` id."""

    broker: str
    cpu: ResourceUsage = ResourceUsage()
    memory: ResourceUsage = ResourceUsage()
    direct_memory: ResourceUsage = ResourceUsage()
    bandwidth_in: ResourceUsage = ResourceUsage()
    bandwidth_out: ResourceUsage = ResourceUsage()
    msg_throughput_in: float = 0.0
    msg_throughput_out: float = 0.0
    msg_rate_in: float = 0.0
    msg_rate_out: float = 0.0
    num_topics: int = 0
    num_bundles: int = 0
    num_consumers: int = 0
    num_producers: int = 0
    bundles: frozenset[str] = frozenset()
    last_stats: Mapping[str, NamespaceBundleStats] = field(default_factory=lambda: _EMPTY)
    last_update_ms: int = 0
    web_service_url: str = ""
    pulsar_service_url: str = ""
    broker_version: str = ""

    @property
    def msg_rate(self) -> float:
        return self.msg_rate_in + self.msg_rate_out

    @property
    def msg_throughput(self) -> float:
        return self.msg_throughput_in + self.msg_throughput_out

    def max_resource_usage(self) -> float:
        """``getMaxResourceUsage``: the largest unweighted percentage, as a fraction."""
        return (
            max(
                self.cpu.percent_usage(),
                self.memory.percent_usage(),
                self.direct_memory.percent_usage(),
                self.bandwidth_in.percent_usage(),
                self.bandwidth_out.percent_usage(),
            )
            / 100.0
        )

    def max_resource_usage_with_weight(
        self,
        cpu_weight: float,
        memory_weight: float,
        direct_memory_weight: float,
        bandwidth_in_weight: float,
        bandwidth_out_weight: float,
    ) -> float:
        """``getMaxResourceUsageWithWeight``: the largest weighted percentage, as a fraction."""
        return (
            max(
                self.cpu.percent_usage() * cpu_weight,
                self.memory.percent_usage() * memory_weight,
                self.direct_memory.percent_usage() * direct_memory_weight,
                self.bandwidth_in.percent_usage() * bandwidth_in_weight,
                self.bandwidth_out.percent_usage() * bandwidth_out_weight,
            )
            / 100.0
        )

    def max_resource_usage_with_weight_capped(
        self,
        cpu_weight: float,
        memory_weight: float,
        direct_memory_weight: float,
        bandwidth_in_weight: float,
        bandwidth_out_weight: float,
    ) -> float:
        """ThresholdShedder's reading: if the weighted max passes 100 %, ignore the signals
        above 100 % (Pulsar treats them as measurement errors) and take the max of the rest."""
        pairs = (
            (self.cpu.percent_usage(), cpu_weight),
            (self.memory.percent_usage(), memory_weight),
            (self.direct_memory.percent_usage(), direct_memory_weight),
            (self.bandwidth_in.percent_usage(), bandwidth_in_weight),
            (self.bandwidth_out.percent_usage(), bandwidth_out_weight),
        )
        best = max(p * w for p, w in pairs) / 100.0
        if best <= 1.0:
            return best
        rest = [p * w for p, w in pairs if p <= 100.0]
        return (max(rest) if rest else 0.0) / 100.0
