"""The load-report model: Pulsar's ``LocalBrokerData``, ``ResourceUsage`` and
``NamespaceBundleStats``, as immutable values.

Field meanings and units follow Pulsar (``pulsar-common/.../policies/data/loadbalancer``):
rates in messages per second, throughputs in bytes per second, ``ResourceUsage`` as an
absolute ``usage`` against a ``limit`` (CPU in percent of one core times cores, memory in MB,
bandwidth in KB/s), ``last_update_ms`` in epoch milliseconds. Only what the policies read is
modelled; the codec ignores other fields of a real broker's report.

Unknown readings: Pulsar starts every resource at ``ResourceUsage(-1, -1)`` and a broker that
cannot read a NIC (``GenericBrokerHostUsageImpl``) keeps bandwidth there; a missing resource is
``0 of 0``. A resource with a negative usage or a limit <= 0 is *unknown*: its percentage is 0
and the max-usage computations leave it out, as ``LocalBrokerData.getMaxResourceUsage*`` do
(``percentUsage`` is 0 for a limit <= 0, and the within-limit variant skips values <= 0).

``report_type`` says which of Pulsar's three documents the report came from
(``LocalBrokerData`` of the modular manager, ``LoadReport`` of the simple one, ``BrokerLoadData``
of the extensible one, which carries no per-bundle data); ``issues`` lists what the codec
ignored (a broken reading, an unusable bundle entry), so the shell can count and log it.
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

    @property
    def known(self) -> bool:
        """A usable reading: usage >= 0 against a limit > 0 (Pulsar writes -1 for unknown)."""
        return self.usage >= 0 and self.limit > 0

    def percent_usage(self) -> float:
        """Usage in percent of the limit; 0 when the reading is unknown."""
        return self.usage / self.limit * 100.0 if self.usage >= 0 and self.limit > 0 else 0.0


UNKNOWN_USAGE = ResourceUsage(-1.0, -1.0)
"""Pulsar's initial value of every resource, and what a broken reading is replaced by."""


@dataclass(frozen=True, slots=True)
class ReportIssue:
    """Something the codec ignored in an otherwise valid report (counted, logged, not fatal).

    ``kind`` is one of ``ISSUE_KINDS``; ``field`` is the JSON path; ``reason`` says why.
    """

    kind: str
    field: str
    reason: str


READING_IGNORED = "reading_ignored"
BUNDLE_SKIPPED = "bundle_skipped"
NO_BUNDLE_DATA = "no_bundle_data"
ISSUE_KINDS = (READING_IGNORED, BUNDLE_SKIPPED, NO_BUNDLE_DATA)

LOCAL_BROKER_DATA = "LocalBrokerData"
LOAD_REPORT = "LoadReport"
BROKER_LOAD_DATA = "BrokerLoadData"
REPORT_TYPES = (LOCAL_BROKER_DATA, LOAD_REPORT, BROKER_LOAD_DATA)


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
    report_type: str = LOCAL_BROKER_DATA
    issues: tuple[ReportIssue, ...] = ()
    issue_counts: tuple[tuple[str, int], ...] = ()

    @property
    def has_bundle_data(self) -> bool:
        """False for the extensible manager's ``BrokerLoadData``: it names no bundles, so
        bundle-level policies (shedding, splitting) cannot act on this broker."""
        return self.report_type != BROKER_LOAD_DATA

    def _percents(self) -> tuple[float, float, float, float, float]:
        return (
            self.cpu.percent_usage(),
            self.memory.percent_usage(),
            self.direct_memory.percent_usage(),
            self.bandwidth_in.percent_usage(),
            self.bandwidth_out.percent_usage(),
        )

    @property
    def msg_rate(self) -> float:
        return self.msg_rate_in + self.msg_rate_out

    @property
    def msg_throughput(self) -> float:
        return self.msg_throughput_in + self.msg_throughput_out

    def max_resource_usage(self) -> float:
        """``getMaxResourceUsage``: the largest unweighted percentage, as a fraction (unknown
        readings count as 0 %, as Pulsar's ``percentUsage`` makes them)."""
        return max(self._percents()) / 100.0

    def max_resource_usage_with_weight(
        self,
        cpu_weight: float,
        memory_weight: float,
        direct_memory_weight: float,
        bandwidth_in_weight: float,
        bandwidth_out_weight: float,
    ) -> float:
        """``getMaxResourceUsageWithWeight``: the largest weighted percentage, as a fraction."""
        weights = (
            cpu_weight,
            memory_weight,
            direct_memory_weight,
            bandwidth_in_weight,
            bandwidth_out_weight,
        )
        return max(p * w for p, w in zip(self._percents(), weights, strict=True)) / 100.0

    def max_resource_usage_with_weight_capped(
        self,
        cpu_weight: float,
        memory_weight: float,
        direct_memory_weight: float,
        bandwidth_in_weight: float,
        bandwidth_out_weight: float,
    ) -> float:
        """``getMaxResourceUsageWithWeightWithinLimit`` (ThresholdShedder's reading): the
        largest weighted percentage of at most 100 %, as a fraction. A signal above 100 % is a
        measurement error to Pulsar (its ``ThresholdShedderTest`` feeds memory 5000 of 100)
        and is left out; the broker's other readings still count."""
        weights = (
            cpu_weight,
            memory_weight,
            direct_memory_weight,
            bandwidth_in_weight,
            bandwidth_out_weight,
        )
        best = 0.0
        for p, w in zip(self._percents(), weights, strict=True):
            d = p * w
            if best < d <= 100.0:
                best = d
        return best / 100.0
