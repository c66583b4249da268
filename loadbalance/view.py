"""The averaged cluster view the policies read, and the pure fold that maintains it.

``LoadState`` is what the leader of a Pulsar cluster keeps in memory between reports: the last
report per broker, its two history-weighted usages (the within-limit one ThresholdShedder and the
modular strategies read, and ``weightedMaxEMA``, which takes signals above 100 % as they are,
for TransferShedder), and each bundle's ``BundleData``. ``ingest``
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

import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from loadbalance.bundles import NamespaceBundles, bundle_namespace
from loadbalance.model import LocalBrokerData
from loadbalance.placement.policies import NO_POLICIES, PlacementPolicies
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
        """The within-limit reading (``getMaxResourceUsageWithWeightWithinLimit``) that
        ``history_usage`` folds: ThresholdShedder and the modular strategies read it."""
        return report.max_resource_usage_with_weight_capped(
            self.cpu, self.memory, self.direct_memory, self.bandwidth_in, self.bandwidth_out
        )

    def weighted_max_uncapped(self, report: LocalBrokerData) -> float:
        """``BrokerLoadData.getMaxResourceUsageWithWeight``: every signal as it is, one above
        100 % included, so a broker saturated on one resource reads as saturated. The
        extensible load manager folds it into ``weightedMaxEMA`` (``updateWeightedMaxEMA``)."""
        return report.max_resource_usage_with_weight(
            self.cpu, self.memory, self.direct_memory, self.bandwidth_in, self.bandwidth_out
        )


@dataclass(frozen=True, slots=True)
class BrokerView:
    """One broker as the policies see it.

    ``history_usage``: the history-weighted within-limit max usage (ThresholdShedder, the
    modular strategies). ``weighted_max_ema``: Pulsar's ``BrokerLoadData.weightedMaxEMA``, the
    same fold over the reading without the cap, which TransferShedder reads; a view made by
    hand without it (tests that give a broker one load) takes ``history_usage`` for it."""

    report: LocalBrokerData
    history_usage: float
    msg_throughput_ema: float
    time_average: TimeAverageBrokerData
    updated_at_ms: int
    weighted_max_ema: float = None  # type: ignore[assignment]  # None: history_usage

    def __post_init__(self) -> None:
        if self.weighted_max_ema is None:
            object.__setattr__(self, "weighted_max_ema", self.history_usage)

    @property
    def broker(self) -> str:
        return self.report.broker

    @property
    def bundles(self) -> frozenset[str]:
        return self.report.bundles


@dataclass(frozen=True, slots=True)
class InFlightMove:
    """A move decided in an earlier cycle that the reports may not show yet.

    The bundle's rates are those of the source's report when the move was decided, so a
    strategy can project the move into each broker's usage until the reports catch up
    (``loadbalance.in_flight``); ``destination`` is ``None`` for an unload, placed later by a
    lookup."""

    source: str
    destination: str | None
    at_ms: int
    msg_rate: float
    throughput_in: float
    throughput_out: float


@dataclass(frozen=True, slots=True)
class ClusterView:
    """Everything one policy cycle reads; built fresh for every cycle."""

    brokers: Mapping[str, BrokerView]
    bundle_data: Mapping[str, BundleData]
    namespaces: Mapping[str, NamespaceBundles] = field(default_factory=lambda: _EMPTY)
    recently_unloaded: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    preallocated: Mapping[str, Mapping[str, BundleData]] = field(default_factory=lambda: _EMPTY)
    topic_hashes: Mapping[str, tuple[int, ...]] = field(default_factory=lambda: _EMPTY)
    report_digests: ReportDigests | None = field(default=None, compare=False, repr=False)
    """Figures worked out when the reports were folded (``build_view`` sets them); read
    through ``digest_of``, which checks they still describe this view."""
    policies: PlacementPolicies = NO_POLICIES
    """The operator's placement policies (isolation, anti-affinity groups, failure domains)
    that placement and the shedders' guards read; empty when none is set."""
    in_flight: Mapping[str, InFlightMove] = field(default_factory=lambda: _EMPTY)
    """bundle -> a move decided but not yet visible in the reports (the cycle sets it from its
    state); strategies that project usage count it, Pulsar's read reports only."""

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
    """Per-broker history kept across reports (``weighted_max_ema``: as in ``BrokerView``)."""

    report: LocalBrokerData
    history_usage: float
    msg_throughput_ema: float
    received_at_ms: int
    weighted_max_ema: float


@dataclass(frozen=True, slots=True)
class ReportDigest:
    """What one broker's report brings to a cycle, worked out once, as the report is folded.

    A cycle at a million bundles would otherwise walk every bundle's averages twice (the
    broker sums below and the split scan), and those objects no longer fit in the caches; when
    the report is folded the bundles' new averages are at hand. ``time_average``: the broker's
    ``TimeAverageBrokerData`` (``None`` when the report's ``bundles`` and ``lastStats`` list
    different bundles: ``build_view`` then sums the ``bundles`` itself). The maxima are over the
    ``lastStats`` entries the split scan judges (at least two topics): topics, producers plus
    consumers, and long-term msg rate and throughput (``in + out``, the same additions as the
    scan), so the scan skips a broker none of whose bundles can be over a limit. ``-1`` and
    ``-inf`` when no entry qualifies.

    A digest is true while the broker's averages in the state are the ones its fold made:
    ``LoadState.folded_by`` tracks which report last folded each bundle, and ``ingest_many``
    and ``forget_bundles`` drop a digest as soon as another report or a removal changes one
    of its bundles."""

    report: LocalBrokerData
    time_average: TimeAverageBrokerData | None
    max_topics: int
    max_sessions: int
    max_long_term_msg_rate: float
    max_long_term_msg_throughput: float
    namespace_counts: Mapping[str, int]
    """namespace -> bundles of it in the report's ``bundles`` (placement's
    ``loadBalancerDistributeBundlesEvenlyEnabled`` filter reads them for every broker; never
    changed: ``NamespaceCounts`` copies a broker's before changing it)."""


@dataclass(frozen=True, slots=True)
class ReportDigests:
    """The digests of a view's brokers, with the bundle averages they were worked out from."""

    bundle_data: Mapping[str, BundleData]
    by_broker: Mapping[str, ReportDigest]


def digest_of(view: ClusterView, broker: str) -> ReportDigest | None:
    """The broker's ``ReportDigest`` if it describes this view's report and bundle averages."""
    digests = view.report_digests
    if digests is None or digests.bundle_data is not view.bundle_data:
        return None
    found = digests.by_broker.get(broker)
    b = view.brokers.get(broker)
    if found is None or b is None or found.report is not b.report:
        return None
    return found


@dataclass(frozen=True, slots=True)
class LoadState:
    """Cross-report state of the aggregation (per broker and per bundle).

    ``digests`` and ``folded_by`` are derived (see ``ReportDigest``): a state made without
    them is summed the long way by ``build_view``."""

    brokers: Mapping[str, BrokerLoad] = field(default_factory=lambda: _EMPTY)
    bundles: Mapping[str, BundleData] = field(default_factory=lambda: _EMPTY)
    digests: Mapping[str, ReportDigest] = field(
        default_factory=lambda: _EMPTY, compare=False, repr=False
    )
    folded_by: Mapping[str, str] = field(default_factory=lambda: _EMPTY, compare=False, repr=False)


def ingest(
    state: LoadState,
    report: LocalBrokerData,
    *,
    history_percentage: float,
    weights: UsageWeights,
    received_at_ms: int,
) -> LoadState:
    """Fold one report in: broker history usages, and one sample per bundle in ``lastStats``."""
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
    digests = dict(state.digests)
    folded_by = dict(state.folded_by)
    default = BundleData.new()
    for report in reports:
        broker = report.broker
        prev = brokers.get(broker)
        usage = history_usage(
            prev.history_usage if prev else None, weights.weighted_max(report), history_percentage
        )
        thr = history_usage(
            prev.msg_throughput_ema if prev else None, report.msg_throughput, history_percentage
        )
        # Pulsar's updateWeightedMaxEMA: seeded with the first reading, never reset
        ema = history_usage(
            prev.weighted_max_ema if prev else None,
            weights.weighted_max_uncapped(report),
            history_percentage,
        )
        brokers[broker] = BrokerLoad(report, usage, thr, received_at_ms, ema)
        fresh: list[BundleData] = []
        for name, stats in report.last_stats.items():
            data = bundles.get(name)
            data = bundles[name] = (data if data is not None else default).update(stats)
            fresh.append(data)
            before = folded_by.get(name)
            if before != broker:
                folded_by[name] = broker
                other = digests.get(before) if before is not None else None
                if other is not None and name in other.report.last_stats:
                    # that broker's digest counted this bundle's previous averages
                    del digests[before]
        digests[broker] = _digest(report, fresh)
    return LoadState(
        MappingProxyType(brokers),
        MappingProxyType(bundles),
        MappingProxyType(digests),
        MappingProxyType(folded_by),
    )


def _digest(report: LocalBrokerData, fresh: list[BundleData]) -> ReportDigest:
    """The report's ``ReportDigest``; ``fresh``: its ``lastStats`` bundles' new averages, in
    that order."""
    stats, bundles = report.last_stats, report.bundles
    ta = None
    if len(stats) == len(bundles) and stats.keys() == bundles:
        ta = TimeAverageBrokerData.of(fresh)
    max_topics = max_sessions = -1
    max_rate = max_thr = -math.inf
    for st, data in zip(stats.values(), fresh):
        topics = st.topics
        if topics < 2:
            continue
        sessions = st.consumer_count + st.producer_count
        lt = data.long_term
        rate = lt.msg_rate_in + lt.msg_rate_out
        thr = lt.msg_throughput_in + lt.msg_throughput_out
        # '>' as the scan's tests: a NaN is never a maximum, as it is never over a limit
        if topics > max_topics:
            max_topics = topics
        if sessions > max_sessions:
            max_sessions = sessions
        if rate > max_rate:
            max_rate = rate
        if thr > max_thr:
            max_thr = thr
    # a plain dict, read-only by convention: placement looks it up for every broker of every
    # placed bundle, and a proxy's lookup is a method call
    ns_counts = dict(Counter(map(bundle_namespace, bundles)))
    return ReportDigest(report, ta, max_topics, max_sessions, max_rate, max_thr, ns_counts)


def forget_brokers(state: LoadState, brokers: Iterable[str]) -> LoadState:
    """Drop brokers that stopped reporting (their bundles' data is kept)."""
    gone = set(brokers)
    kept = {k: v for k, v in state.brokers.items() if k not in gone}
    digests = {k: v for k, v in state.digests.items() if k not in gone}
    return replace(state, brokers=MappingProxyType(kept), digests=MappingProxyType(digests))


def forget_bundles(state: LoadState, bundles: Iterable[str]) -> LoadState:
    """Drop the data of bundles that were split or merged away."""
    gone = set(bundles)
    kept = {k: v for k, v in state.bundles.items() if k not in gone}
    digests = dict(state.digests)
    folded_by = dict(state.folded_by)
    for b in gone:
        broker = folded_by.pop(b, None)
        if broker is not None:
            digests.pop(broker, None)  # its sums counted the averages dropped here
    return replace(
        state,
        bundles=MappingProxyType(kept),
        digests=MappingProxyType(digests),
        folded_by=MappingProxyType(folded_by),
    )


def build_view(
    state: LoadState,
    *,
    namespaces: Mapping[str, NamespaceBundles] | None = None,
    recently_unloaded: Mapping[str, int] | None = None,
    preallocated: Mapping[str, Mapping[str, BundleData]] | None = None,
    topic_hashes: Mapping[str, tuple[int, ...]] | None = None,
    time_averages: Mapping[str, TimeAverageBrokerData] | None = None,
    policies: PlacementPolicies | None = None,
) -> ClusterView:
    """Assemble the view for one cycle from the aggregation state.

    ``time_averages``: brokers' ``TimeAverageBrokerData`` already summed by a caller that holds
    the bundles' averages as arrays (the streaming job sums 100,000 bundles that way in tens of
    milliseconds, with the same correctly rounded ``math.fsum``, so to the same bits); brokers
    it lacks take the sums their report's digest made when it was folded (``ReportDigest``), or
    are summed here."""
    brokers: dict[str, BrokerView] = {}
    default = BundleData.new()
    given = time_averages or {}
    digests: dict[str, ReportDigest] = {}
    for name, load in state.brokers.items():
        digest = state.digests.get(name)
        if digest is not None and digest.report is load.report:
            digests[name] = digest
        else:
            digest = None
        ta = given.get(name)
        if ta is None and digest is not None:
            ta = digest.time_average
        if ta is None:
            get = state.bundles.get
            ta = TimeAverageBrokerData.of(get(b, default) for b in _summing_order(load.report))
        brokers[name] = BrokerView(
            load.report,
            load.history_usage,
            load.msg_throughput_ema,
            ta,
            load.received_at_ms,
            load.weighted_max_ema,
        )
    return ClusterView(
        brokers=MappingProxyType(brokers),
        bundle_data=state.bundles,
        namespaces=MappingProxyType(dict(namespaces or {})),
        recently_unloaded=MappingProxyType(dict(recently_unloaded or {})),
        preallocated=_preallocations(preallocated),
        topic_hashes=MappingProxyType(dict(topic_hashes or {})),
        report_digests=ReportDigests(state.bundles, MappingProxyType(digests)),
        policies=policies if policies is not None else NO_POLICIES,
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


def unreported_preallocations(view: ClusterView) -> Iterator[tuple[str, str, BundleData]]:
    """(broker, bundle, data) for each preallocation whose broker is in the view and has not
    reported the bundle yet, brokers in name order, each bundle once (the first broker's).

    Pulsar drops a preallocation once the broker reports the bundle: counted with the report
    too, its load would count twice. Placement seeds its preallocations from this walk, and our
    shedder projects the same entries (``UsageModel.project_preallocated``)."""
    seen: set[str] = set()
    for name in sorted(view.preallocated):
        broker = view.brokers.get(name)
        if broker is None:
            continue
        for bundle, data in view.preallocated[name].items():
            if bundle in broker.report.bundles or bundle in seen:
                continue
            seen.add(bundle)
            yield name, bundle, data


def with_preallocated(
    view: ClusterView, preallocated: Mapping[str, Mapping[str, BundleData]] | None
) -> ClusterView:
    """The same view with other preallocations (lookups placed since it was built); every
    other field, the policies included, is kept."""
    return replace(view, preallocated=_preallocations(preallocated))


def _preallocations(
    preallocated: Mapping[str, Mapping[str, BundleData]] | None,
) -> Mapping[str, Mapping[str, BundleData]]:
    return MappingProxyType({k: dict(v) for k, v in (preallocated or {}).items()})
