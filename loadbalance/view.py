"""The averaged cluster view the policies read, and the pure fold that maintains it.

``LoadState`` is what the leader of a Pulsar cluster keeps in memory between reports: the last
report per broker, its history-weighted usage, and each bundle's ``BundleData``. ``ingest``
folds one report into it (the same arithmetic the Spark job runs per key, vectorised, in
``streaming/``); ``build_view`` turns it into a ``ClusterView`` for one policy cycle. Every
``ClusterView`` is made here: by ``build_view`` (the fast simulator, the streaming job's driver
and the snapshot reader all go through it) or, for lookups placed since, ``with_preallocated``.

Ownership in the view is what the brokers say they serve (their reports' ``bundles``), which is
what Pulsar's shedders read too; the controller re-checks it against Redis before acting.
Bundle data is kept when a bundle changes owner and dropped by ``forget_bundles`` when it is
split or merged away.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from loadbalance.bundles import NamespaceBundles
from loadbalance.model import LocalBrokerData
from loadbalance.time_average import BundleData, TimeAverageBrokerData, history_usage

_EMPTY: Mapping = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class UsageWeights:
    """Resource weights of ``getMaxResourceUsageWithWeight`` (cpu, memory, direct, in, out)."""

    cpu: float = 1.0
    memory: float = 0.0
    direct_memory: float = 0.0
    bandwidth_in: float = 1.0
    bandwidth_out: float = 1.0

    def weighted_max(self, report: LocalBrokerData) -> float:
        return report.max_resource_usage_with_weight_capped(
            self.cpu, self.memory, self.direct_memory, self.bandwidth_in, self.bandwidth_out
        )


@dataclass(frozen=True, slots=True)
class BrokerView:
    """One broker as the policies see it."""

    report: LocalBrokerData
    history_usage: float
    msg_throughput_ema: float
    time_average: TimeAverageBrokerData
    updated_at_ms: int

    @property
    def broker(self) -> str:
        return self.report.broker

    @property
    def bundles(self) -> frozenset[str]:
        return self.report.bundles


@dataclass(frozen=True, slots=True)
class ClusterView:
    """Everything one policy cycle reads; built fresh for every cycle."""

    brokers: Mapping[str, BrokerView]
    bundle_data: Mapping[str, BundleData]
    namespaces: Mapping[str, NamespaceBundles] = field(default_factory=lambda: _EMPTY)
    recently_unloaded: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    preallocated: Mapping[str, Mapping[str, BundleData]] = field(default_factory=lambda: _EMPTY)
    topic_hashes: Mapping[str, tuple[int, ...]] = field(default_factory=lambda: _EMPTY)

    def owner_of(self, bundle: str) -> str | None:
        for name, b in self.brokers.items():
            if bundle in b.report.bundles:
                return name
        return None

    def owners(self) -> dict[str, str]:
        """bundle -> broker, from the reports."""
        out: dict[str, str] = {}
        for name in sorted(self.brokers):
            for bundle in self.brokers[name].report.bundles:
                out.setdefault(bundle, name)
        return out

    def bundle(self, name: str) -> BundleData:
        """A bundle's averages, or Pulsar's defaults for a bundle never seen."""
        data = self.bundle_data.get(name)
        return data if data is not None else BundleData.new()


@dataclass(frozen=True, slots=True)
class BrokerLoad:
    """Per-broker history kept across reports."""

    report: LocalBrokerData
    history_usage: float
    msg_throughput_ema: float
    received_at_ms: int


@dataclass(frozen=True, slots=True)
class LoadState:
    """Cross-report state of the aggregation (per broker and per bundle)."""

    brokers: Mapping[str, BrokerLoad] = field(default_factory=lambda: _EMPTY)
    bundles: Mapping[str, BundleData] = field(default_factory=lambda: _EMPTY)


def ingest(
    state: LoadState,
    report: LocalBrokerData,
    *,
    history_percentage: float,
    weights: UsageWeights,
    received_at_ms: int,
) -> LoadState:
    """Fold one report in: broker history usage, and one sample per bundle in ``lastStats``."""
    return ingest_many(
        state,
        (report,),
        history_percentage=history_percentage,
        weights=weights,
        received_at_ms=received_at_ms,
    )


def ingest_many(
    state: LoadState,
    reports: Iterable[LocalBrokerData],
    *,
    history_percentage: float,
    weights: UsageWeights,
    received_at_ms: int,
) -> LoadState:
    """``ingest`` for a batch of reports, in order, copying the maps once (same result)."""
    brokers = dict(state.brokers)
    bundles = dict(state.bundles)
    for report in reports:
        prev = brokers.get(report.broker)
        usage = history_usage(
            prev.history_usage if prev else None, weights.weighted_max(report), history_percentage
        )
        thr = history_usage(
            prev.msg_throughput_ema if prev else None, report.msg_throughput, history_percentage
        )
        brokers[report.broker] = BrokerLoad(report, usage, thr, received_at_ms)
        for name, stats in report.last_stats.items():
            data = bundles.get(name)
            bundles[name] = (data if data is not None else BundleData.new()).update(stats)
    return LoadState(MappingProxyType(brokers), MappingProxyType(bundles))


def forget_brokers(state: LoadState, brokers: Iterable[str]) -> LoadState:
    """Drop brokers that stopped reporting (their bundles' data is kept)."""
    gone = set(brokers)
    kept = {k: v for k, v in state.brokers.items() if k not in gone}
    return replace(state, brokers=MappingProxyType(kept))


def forget_bundles(state: LoadState, bundles: Iterable[str]) -> LoadState:
    """Drop the data of bundles that were split or merged away."""
    gone = set(bundles)
    kept = {k: v for k, v in state.bundles.items() if k not in gone}
    return replace(state, bundles=MappingProxyType(kept))


def build_view(
    state: LoadState,
    *,
    namespaces: Mapping[str, NamespaceBundles] | None = None,
    recently_unloaded: Mapping[str, int] | None = None,
    preallocated: Mapping[str, Mapping[str, BundleData]] | None = None,
    topic_hashes: Mapping[str, tuple[int, ...]] | None = None,
    time_averages: Mapping[str, TimeAverageBrokerData] | None = None,
) -> ClusterView:
    """Assemble the view for one cycle from the aggregation state.

    ``time_averages``: brokers' ``TimeAverageBrokerData`` already summed by a caller that holds
    the bundles' averages as arrays (the streaming job sums 100,000 bundles that way in tens of
    milliseconds, with the same correctly rounded ``math.fsum``, so to the same bits); brokers
    it lacks are summed here."""
    brokers: dict[str, BrokerView] = {}
    default = BundleData.new()
    given = time_averages or {}
    for name, load in state.brokers.items():
        ta = given.get(name)
        if ta is None:
            get = state.bundles.get
            ta = TimeAverageBrokerData.of(get(b, default) for b in _summing_order(load.report))
        brokers[name] = BrokerView(
            load.report, load.history_usage, load.msg_throughput_ema, ta, load.received_at_ms
        )
    return ClusterView(
        brokers=MappingProxyType(brokers),
        bundle_data=state.bundles,
        namespaces=MappingProxyType(dict(namespaces or {})),
        recently_unloaded=MappingProxyType(dict(recently_unloaded or {})),
        preallocated=_preallocations(preallocated),
        topic_hashes=MappingProxyType(dict(topic_hashes or {})),
    )


def _summing_order(report: LocalBrokerData) -> Iterable[str]:
    """The broker's bundles in the order of its ``lastStats`` when that lists the same bundles.

    The sums are exact (``math.fsum``), so the order does not change a bit; but the bundles'
    averages were made in ``lastStats`` order by ``ingest``, so reading them in that order walks
    memory nearly in sequence, a third faster at a million bundles than the ``frozenset``'s
    hash order."""
    stats, bundles = report.last_stats, report.bundles
    if len(stats) == len(bundles) and stats.keys() == bundles:
        return stats.keys()
    return bundles


def with_preallocated(
    view: ClusterView, preallocated: Mapping[str, Mapping[str, BundleData]] | None
) -> ClusterView:
    """The same view with other preallocations (lookups placed since it was built)."""
    return replace(view, preallocated=_preallocations(preallocated))


def _preallocations(
    preallocated: Mapping[str, Mapping[str, BundleData]] | None,
) -> Mapping[str, Mapping[str, BundleData]]:
    return MappingProxyType({k: dict(v) for k, v in (preallocated or {}).items()})
