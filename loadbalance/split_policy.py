"""The bundle split step: find hot bundles and say where to cut them.

Mirrors Pulsar's ``BundleSplitterTask`` (modular load manager) with the options its extensible
successor ``DefaultNamespaceBundleSplitStrategyImpl`` added:

* Every bundle in every broker's ``lastStats`` is looked at; bundles with fewer than two topics
  never split (a split could not separate anything).
* A bundle is hot when, in this priority order (the first one names the reason):
  ``topics > loadBalancerNamespaceBundleMaxTopics`` (``Topics``),
  ``producers + consumers > loadBalancerNamespaceBundleMaxSessions`` (``Sessions``; a limit <= 0
  disables it), **long-term** ``msgRateIn + msgRateOut > loadBalancerNamespaceBundleMaxMsgRate``
  (``MsgRate``), long-term ``msgThroughputIn + Out > loadBalancerNamespaceBundleMaxBandwidthMbytes``
  MiB (``Bandwidth``). Long-term averages are used so a burst does not split a bundle; a bundle
  without averages counts as 0 msg/s there, as in Pulsar.
* With ``load_balancer_split_debounce_enabled`` (ours, off by default) a bundle must be hot on more
  than ``loadBalancerNamespaceBundleSplitConditionHitCountThreshold`` consecutive checks; the
  counts live in ``SplitState`` and restart after a split or a cool check.
* A namespace is never split beyond ``loadBalancerNamespaceMaximumBundles``: a split is allowed
  only while ``bundle count + bundles added this cycle < maximum`` (Pulsar PR #16552), and at most
  ``loadBalancerMaxNumberOfBundlesToSplitPerCycle`` splits are chosen per cycle.
* Cut points come from ``defaultNamespaceBundleSplitAlgorithm``. ``topic_count_equally_divide``
  needs the bundle's topic hashes (``view.topic_hashes``) and ``flow_or_qps_equally_divide`` its
  per-topic loads (``topic_loads``); without them the range is halved instead and the decision's
  inputs say so. An algorithm that finds no cut point yields a skip, not a decision.

Deviations: hot bundles are ranked by how far the deciding metric is over its limit (ratio,
largest first, then name), so the caps keep the hottest bundles; Pulsar takes them in map order.
Debounce counts are updated for every bundle, not only those visited before the per-cycle cap is
reached. A multi-boundary split counts every bundle it adds against the namespace maximum and is
trimmed to fit under it (Pulsar counts one per split and can overshoot).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from loadbalance.bundles import (
    BundleRange,
    bundle_namespace,
    is_system_service_bundle,
    parse_bundle,
)
from loadbalance.decisions import SPLIT, Decision, PolicyResult, Skip, make_decision
from loadbalance.errors import InvalidBundle
from loadbalance.model import NamespaceBundleStats
from loadbalance.split_algorithms import (
    FLOW_OR_QPS_EQUALLY_DIVIDE,
    MBYTES,
    RANGE_EQUALLY_DIVIDE,
    TOPIC_COUNT_EQUALLY_DIVIDE,
    TopicLoad,
    range_equally_divide,
    split_boundaries,
)
from loadbalance.time_average import NUM_LONG_SAMPLES, BundleData, TimeAverageMessageData
from loadbalance.values import DecisionReason, SkipReason
from loadbalance.view import ClusterView, digest_of

if TYPE_CHECKING:
    from loadbalance.config import LoadBalancerConfig

STRATEGY = "BundleSplitterTask"

_EMPTY: Mapping[str, int] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class SplitState:
    """Consecutive hot checks per bundle (only used with the split debounce on)."""

    hit_counts: Mapping[str, int] = field(default_factory=lambda: _EMPTY)


@dataclass(frozen=True, slots=True)
class _Hot:
    bundle: str
    owner: str
    stats: NamespaceBundleStats
    reason: DecisionReason
    over_ratio: float
    msg_rate_per_s: float
    throughput_bytes_per_s: float


# Stands in for a bundle without averages: 0 msg/s and 0 B/s long term, as in Pulsar.
_NO_DATA = BundleData(long_term=TimeAverageMessageData(NUM_LONG_SAMPLES, 0, 0.0, 0.0, 0.0, 0.0))


def _ratio(value: float, limit: float) -> float:
    return value / limit if limit > 0 else float("inf")


def split_reason(
    stats: NamespaceBundleStats,
    long_term_msg_rate_per_s: float,
    long_term_throughput_bytes_per_s: float,
    config: LoadBalancerConfig,
) -> tuple[DecisionReason, float] | None:
    """The first threshold a bundle exceeds, with how far over it is (value / limit)."""
    max_topics = config.load_balancer_namespace_bundle_max_topics
    max_sessions = config.load_balancer_namespace_bundle_max_sessions
    max_rate = config.load_balancer_namespace_bundle_max_msg_rate
    max_bytes = config.load_balancer_namespace_bundle_max_bandwidth_mbytes * MBYTES
    if stats.topics > max_topics:
        return DecisionReason.TOPICS, _ratio(stats.topics, max_topics)
    if max_sessions > 0 and stats.sessions > max_sessions:
        return DecisionReason.SESSIONS, _ratio(stats.sessions, max_sessions)
    if long_term_msg_rate_per_s > max_rate:
        return DecisionReason.MSG_RATE, _ratio(long_term_msg_rate_per_s, max_rate)
    if long_term_throughput_bytes_per_s > max_bytes:
        return DecisionReason.BANDWIDTH, _ratio(long_term_throughput_bytes_per_s, max_bytes)
    return None


def _hot_bundles(
    view: ClusterView, config: LoadBalancerConfig
) -> tuple[list[_Hot], Callable[[str], bool]]:
    """Hot bundles (one entry per bundle), and whether a bundle is in some ``lastStats``.

    The hot path of a cycle (a million bundles). A broker whose report digest
    (``view.digest_of``) shows no bundle over any limit is not walked at all; the others get one
    pass over their ``lastStats`` reading each bundle's figures once, the limits tested inline
    (the same tests as ``split_reason``). A bundle reported by several brokers is judged on the
    ``lastStats`` of the first in name order (``_first_reported``). Only bundles over a limit get
    the full ``split_reason`` and an owner, looked up for them alone.
    """
    max_topics = config.load_balancer_namespace_bundle_max_topics
    max_sessions = config.load_balancer_namespace_bundle_max_sessions
    sessions_limit = max_sessions if max_sessions > 0 else float("inf")
    max_rate = config.load_balancer_namespace_bundle_max_msg_rate
    max_bytes = config.load_balancer_namespace_bundle_max_bandwidth_mbytes * MBYTES
    get_data = view.bundle_data.get
    broker_names = sorted(view.brokers)
    all_stats = [view.brokers[b].report.last_stats for b in broker_names]
    raw: list[tuple[str, NamespaceBundleStats, int]] = []
    for i, broker_name in enumerate(broker_names):
        digest = digest_of(view, broker_name)
        if digest is not None and not (
            digest.max_topics > max_topics
            or digest.max_sessions > sessions_limit
            or digest.max_long_term_msg_rate > max_rate
            or digest.max_long_term_msg_throughput > max_bytes
        ):
            continue  # no bundle of this broker is over a limit
        for bundle, stats in all_stats[i].items():
            topics = stats.topics
            if topics < 2:
                continue
            lt = get_data(bundle, _NO_DATA).long_term
            if (
                topics > max_topics
                or stats.consumer_count + stats.producer_count > sessions_limit
                or lt.msg_rate_in + lt.msg_rate_out > max_rate
                or lt.msg_throughput_in + lt.msg_throughput_out > max_bytes
            ):
                raw.append((bundle, stats, i))
    n_reported = sum(len(s) for s in all_stats)

    def seen(bundle: str) -> bool:
        return any(bundle in s for s in all_stats)

    hot: list[_Hot] = []
    candidates = _first_reported(raw, all_stats, n_reported)
    if not candidates:
        return hot, seen
    owner_of = _owner_lookup(view, broker_names, len(candidates), n_reported)
    for bundle, st, i in sorted(candidates, key=lambda c: c[0]):
        lt = get_data(bundle, _NO_DATA).long_term
        rate = lt.msg_rate_in + lt.msg_rate_out
        thr = lt.msg_throughput_in + lt.msg_throughput_out
        found = split_reason(st, rate, thr, config)
        if found is not None and not is_system_service_bundle(bundle):  # these stay whole
            owner = owner_of(bundle) or broker_names[i]
            hot.append(_Hot(bundle, owner, st, found[0], found[1], rate, thr))
    return hot, seen


def _first_reported(
    raw: list[tuple[str, NamespaceBundleStats, int]],
    all_stats: list[Mapping[str, NamespaceBundleStats]],
    n_reported: int,
) -> list[tuple[str, NamespaceBundleStats, int]]:
    """The entries of ``raw`` (bundle, stats, index of the broker in name order) whose bundle no
    earlier broker's ``lastStats`` lists: each bundle is judged where it is first reported.

    A few entries are checked against the earlier brokers one by one; many, against a set of
    the bundles seen so far grown broker by broker (the same answer either way)."""
    if len(raw) * max(len(all_stats), 1) <= n_reported:
        return [c for c in raw if not any(c[0] in s for s in all_stats[: c[2]])]
    out = []
    seen: set[str] = set()
    grown = 0
    for c in raw:
        while grown < c[2]:
            seen.update(all_stats[grown])
            grown += 1
        if c[0] not in seen:
            out.append(c)
    return out


def _owner_lookup(
    view: ClusterView, broker_names: list[str], n_lookups: int, n_bundles: int
) -> Callable[[str], str | None]:
    """``view.owners().get`` (the first broker in name order whose report lists the bundle),
    without building the whole map when only a few bundles are asked about."""
    if n_lookups * max(len(broker_names), 1) > n_bundles:
        return view.owners().get
    served = [(b, view.brokers[b].report.bundles) for b in broker_names]

    def owner_of(bundle: str) -> str | None:
        return next((b for b, owned in served if bundle in owned), None)

    return owner_of


def _namespace_bundle_count(view: ClusterView, namespace: str) -> int:
    """Bundles the namespace has now: from its boundaries, else from what brokers report."""
    known = view.namespaces.get(namespace)
    if known is not None:
        return len(known)
    names: set[str] = set()
    for broker in view.brokers.values():
        names.update(broker.report.bundles)
        names.update(broker.report.last_stats)
    return sum(1 for n in names if bundle_namespace(n) == namespace)


def _cut_points(
    bundle: BundleRange,
    view: ClusterView,
    config: LoadBalancerConfig,
    topic_loads: Mapping[str, Sequence[TopicLoad]],
) -> tuple[str, list[int], dict[str, Any]]:
    """(algorithm used, boundaries, inputs to record) for the configured algorithm."""
    algorithm = config.default_namespace_bundle_split_algorithm
    extra: dict[str, Any] = {"configuredSplitAlgorithm": algorithm}
    if algorithm == TOPIC_COUNT_EQUALLY_DIVIDE and bundle.name not in view.topic_hashes:
        extra["splitAlgorithmFallback"] = "no topic hashes for the bundle"
        return RANGE_EQUALLY_DIVIDE, range_equally_divide(bundle), extra
    if algorithm == FLOW_OR_QPS_EQUALLY_DIVIDE and bundle.name not in topic_loads:
        extra["splitAlgorithmFallback"] = "no per-topic loads for the bundle"
        return RANGE_EQUALLY_DIVIDE, range_equally_divide(bundle), extra
    knobs = {
        "max_msg_rate": config.load_balancer_namespace_bundle_max_msg_rate,
        "max_bandwidth_mbytes": config.load_balancer_namespace_bundle_max_bandwidth_mbytes,
        "difference_threshold_percentage": config.flow_or_qps_difference_threshold_percentage,
    }
    points = split_boundaries(
        algorithm,
        bundle,
        topic_hashes=view.topic_hashes.get(bundle.name, ()),
        topic_loads=topic_loads.get(bundle.name, ()),
        knobs=knobs,
    )
    return algorithm, points, extra


def _limit_inputs(config: LoadBalancerConfig) -> dict[str, Any]:
    """The thresholds a split was judged against, under Pulsar's knob names."""
    c = config
    return {
        "loadBalancerNamespaceBundleMaxTopics": c.load_balancer_namespace_bundle_max_topics,
        "loadBalancerNamespaceBundleMaxSessions": c.load_balancer_namespace_bundle_max_sessions,
        "loadBalancerNamespaceBundleMaxMsgRate": c.load_balancer_namespace_bundle_max_msg_rate,
        "loadBalancerNamespaceBundleMaxBandwidthMbytes": (
            c.load_balancer_namespace_bundle_max_bandwidth_mbytes
        ),
        "loadBalancerNamespaceMaximumBundles": c.load_balancer_namespace_maximum_bundles,
    }


def _valid_range(
    view: ClusterView, bundle: str
) -> tuple[BundleRange | None, SkipReason | None, str]:
    """Parse the bundle and check it is current and splittable: (range, skip reason, detail)."""
    try:
        rng = parse_bundle(bundle)
    except InvalidBundle as e:
        return None, SkipReason.INVALID_BUNDLE, e.reason
    known = view.namespaces.get(rng.namespace)
    if known is not None and not known.contains(rng):
        return None, SkipReason.UNKNOWN_BUNDLE, f"not a current bundle of {rng.namespace}"
    if not rng.can_split():
        return None, SkipReason.CANNOT_SPLIT, "range is one hash wide"
    return rng, None, ""


def _hit_counts(
    state: SplitState, hot: Sequence[_Hot], seen: Callable[[str], bool]
) -> dict[str, int]:
    """Consecutive cycles each hot bundle has been hot: a bundle that cooled down, or is no
    longer seen, starts again from zero."""
    hits = {b: n for b, n in state.hit_counts.items() if seen(b)}
    hot_names = {h.bundle for h in hot}
    for b in list(hits):
        if b not in hot_names:
            del hits[b]
    for h in hot:
        hits[h.bundle] = hits.get(h.bundle, 0) + 1
    return hits


def _split_decision(
    h: _Hot,
    points: Sequence[int],
    algorithm: str,
    inputs: dict[str, Any],
    cycle: str,
    now_ms: int,
) -> Decision:
    return make_decision(
        cycle=cycle,
        kind=SPLIT,
        bundle=h.bundle,
        source_broker=h.owner,
        split_boundaries=tuple(points),
        split_algorithm=algorithm,
        reason=h.reason,
        strategy=STRATEGY,
        inputs=inputs,
        decided_at_ms=now_ms,
    )


def find_bundles_to_split(
    view: ClusterView,
    config: LoadBalancerConfig,
    state: SplitState | None,
    *,
    now_ms: int,
    cycle: str,
    topic_loads: Mapping[str, Sequence[TopicLoad]] | None = None,
) -> tuple[SplitState, PolicyResult]:
    """Choose this cycle's splits; returns the new debounce state and decisions plus skips."""
    state = state if isinstance(state, SplitState) else SplitState()
    loads = topic_loads or {}
    debounce = config.load_balancer_split_debounce_enabled
    hit_threshold = config.load_balancer_namespace_bundle_split_condition_hit_count_threshold
    max_bundles = config.load_balancer_namespace_maximum_bundles
    max_splits = config.load_balancer_max_number_of_bundles_to_split_per_cycle
    hot, seen = _hot_bundles(view, config)

    hits = _hit_counts(state, hot, seen) if debounce else {}

    decisions: list[Decision] = []
    skips: list[Skip] = []
    added: dict[str, int] = {}
    for h in sorted(hot, key=lambda h: (-h.over_ratio, h.bundle)):
        bundle_range, why, detail = _valid_range(view, h.bundle)
        if bundle_range is None:
            skips.append(Skip(STRATEGY, why, h.owner, h.bundle, detail))
            continue
        if debounce and hits.get(h.bundle, 0) <= hit_threshold:
            detail = f"hot {hits.get(h.bundle, 0)} times, needs more than {hit_threshold}"
            skips.append(Skip(STRATEGY, SkipReason.HIT_COUNT, h.owner, h.bundle, detail))
            continue
        if len(decisions) >= max_splits:
            detail = f"already {len(decisions)} splits this cycle"
            skips.append(Skip(STRATEGY, SkipReason.MAX_SPLITS_PER_CYCLE, h.owner, h.bundle, detail))
            continue
        ns = bundle_range.namespace
        count = _namespace_bundle_count(view, ns)
        room = max_bundles - count - added.get(ns, 0)
        if room <= 0:
            detail = f"{count} bundles + {added.get(ns, 0)} this cycle, maximum {max_bundles}"
            skips.append(
                Skip(STRATEGY, SkipReason.NAMESPACE_MAXIMUM_BUNDLES, h.owner, h.bundle, detail)
            )
            continue
        algorithm, points, extra = _cut_points(bundle_range, view, config, loads)
        points = points[:room]
        if not points:
            detail = f"{algorithm} found no boundary inside {bundle_range.range_name}"
            skips.append(Skip(STRATEGY, SkipReason.NO_BOUNDARY, h.owner, h.bundle, detail))
            continue
        added[ns] = added.get(ns, 0) + len(points)
        inputs: dict[str, Any] = {
            "topics": h.stats.topics,
            "sessions": h.stats.sessions,
            "longTermMsgRate": h.msg_rate_per_s,
            "longTermMsgThroughput": h.throughput_bytes_per_s,
            **_limit_inputs(config),
            "namespaceBundleCount": count,
            **extra,
        }
        hit_count = hits.pop(h.bundle, 0)
        if debounce:
            inputs["hitCount"] = hit_count
        decisions.append(_split_decision(h, points, algorithm, inputs, cycle, now_ms))
    new_state = SplitState(MappingProxyType(dict(sorted(hits.items()))))
    return new_state, PolicyResult(tuple(decisions), tuple(skips))
