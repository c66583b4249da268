"""The split step: Pulsar's thresholds, reasons, namespace limit, per-cycle cap and debounce."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from loadbalance.bundles import NamespaceBundles, parse_bundle
from loadbalance.config import LoadBalancerConfig
from loadbalance.decisions import SPLIT
from loadbalance.model import LocalBrokerData, NamespaceBundleStats
from loadbalance.split_algorithms import MBYTES, TopicLoad
from loadbalance.split_policy import SplitState, find_bundles_to_split
from loadbalance.time_average import BundleData, TimeAverageBrokerData, TimeAverageMessageData
from loadbalance.view import BrokerView, ClusterView

NS = "t/ns"
NAMESPACE = NamespaceBundles.initial(NS, 4)
B = NAMESPACE.bundle_names


def make_config(**overrides: Any) -> LoadBalancerConfig:
    """Pulsar's defaults with overrides by attribute name, validated like a real config."""
    return LoadBalancerConfig(**overrides)


def stats(topics: int = 10, sessions: int = 0, **kw: float) -> NamespaceBundleStats:
    return NamespaceBundleStats(topics=topics, producer_count=sessions, **kw)


def long_term(msg_rate: float = 0.0, throughput: float = 0.0) -> BundleData:
    lt = TimeAverageMessageData(
        1000, 1000, throughput / 2, throughput / 2, msg_rate / 2, msg_rate / 2
    )
    return BundleData(TimeAverageMessageData(10), lt, 0)


def view_of(
    owned: Mapping[str, Mapping[str, NamespaceBundleStats]],
    *,
    data: Mapping[str, BundleData] | None = None,
    namespaces: Mapping[str, NamespaceBundles] | None = None,
    topic_hashes: Mapping[str, tuple[int, ...]] | None = None,
) -> ClusterView:
    brokers = {}
    for name, last_stats in owned.items():
        report = LocalBrokerData(broker=name, bundles=frozenset(last_stats), last_stats=last_stats)
        brokers[name] = BrokerView(report, 0.1, 0.0, TimeAverageBrokerData(), 0)
    return ClusterView(
        brokers=brokers,
        bundle_data=data or {},
        namespaces={NS: NAMESPACE} if namespaces is None else namespaces,
        topic_hashes=topic_hashes or {},
    )


def run(view: ClusterView, state: SplitState | None = None, **cfg: Any):
    return find_bundles_to_split(view, make_config(**cfg), state, now_ms=1000, cycle="c1")


# --- thresholds and reasons ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bundle_stats", "data", "reason"),
    [
        (stats(topics=1001), None, "Topics"),
        (stats(topics=2, sessions=1001), None, "Sessions"),
        (stats(topics=2), long_term(msg_rate=30001), "MsgRate"),
        (stats(topics=2), long_term(throughput=100 * MBYTES + 1), "Bandwidth"),
    ],
)
def test_each_threshold_triggers_a_split_with_its_reason(
    bundle_stats: NamespaceBundleStats, data: BundleData | None, reason: str
) -> None:
    view = view_of({"broker-a": {B[0]: bundle_stats}}, data={B[0]: data} if data else {})
    _, result = run(view)
    [d] = result.decisions
    assert (d.kind, d.bundle, d.reason, d.source_broker) == (SPLIT, B[0], reason, "broker-a")
    assert d.strategy == "BundleSplitterTask" and d.decided_at_ms == 1000
    assert d.split_algorithm == "range_equally_divide"
    assert d.split_boundaries == (0x20000000,)  # range_equally_divide of [0, 0x40000000)


@pytest.mark.parametrize(
    ("bundle_stats", "data", "reason"),
    [
        (stats(topics=1001, sessions=1001), long_term(40000, 200 * MBYTES), "Topics"),
        (stats(topics=2, sessions=1001), long_term(40000, 200 * MBYTES), "Sessions"),
        (stats(topics=2), long_term(40000, 200 * MBYTES), "MsgRate"),
    ],
)
def test_reason_priority_is_topics_sessions_msgrate_bandwidth(
    bundle_stats: NamespaceBundleStats, data: BundleData, reason: str
) -> None:
    _, result = run(view_of({"a": {B[0]: bundle_stats}}, data={B[0]: data}))
    assert [d.reason for d in result.decisions] == [reason]


def test_values_at_the_thresholds_do_not_split() -> None:
    view = view_of(
        {"a": {B[0]: stats(topics=1000, sessions=1000)}},
        data={B[0]: long_term(30000, 100 * MBYTES)},
    )
    assert run(view)[1].decisions == ()


def test_sessions_limit_of_zero_or_less_disables_the_sessions_check() -> None:
    view = view_of({"a": {B[0]: stats(topics=2, sessions=50_000)}})
    assert run(view, load_balancer_namespace_bundle_max_sessions=0)[1].decisions == ()
    assert run(view, load_balancer_namespace_bundle_max_sessions=-1)[1].decisions == ()


def test_rate_and_bandwidth_use_long_term_averages_not_the_current_report() -> None:
    burst = stats(topics=5, msg_rate_in=1e6, msg_throughput_in=1e12)
    view = view_of({"a": {B[0]: burst, B[1]: burst}}, data={B[0]: long_term(100, 1000)})
    assert run(view)[1].decisions == ()  # B[1] has no averages: counts as 0, as in Pulsar


def test_bundles_with_fewer_than_two_topics_never_split() -> None:
    huge = stats(topics=1, sessions=1_000_000)
    view = view_of({"a": {B[0]: huge, B[1]: stats(topics=0)}}, data={B[0]: long_term(1e9, 1e15)})
    _, result = run(view)
    assert result.decisions == () and result.skips == ()


# --- namespace maximum, per-cycle cap, ordering ----------------------------------------------


def _namespace_with(n_bundles: int) -> NamespaceBundles:
    ns = NamespaceBundles.initial(NS, 128)
    while len(ns) > n_bundles:
        first, second = ns.bundles[-2:]
        ns = ns.merge(first, second)
    return ns


def test_namespace_maximum_counts_splits_already_chosen_this_cycle() -> None:
    """126 bundles, 3 hot, maximum 128: 126+0 < 128 and 126+1 < 128 pass, 126+2 < 128 fails."""
    ns = _namespace_with(126)
    hot = ns.bundle_names[:3]
    view = view_of(
        {"a": {b: stats(topics=2000 + i) for i, b in enumerate(hot)}}, namespaces={NS: ns}
    )
    _, result = run(view)
    assert [d.bundle for d in result.decisions] == [hot[2], hot[1]]  # hottest first
    assert [(s.reason, s.bundle) for s in result.skips] == [("NamespaceMaximumBundles", hot[0])]


def test_namespace_at_its_maximum_does_not_split() -> None:
    ns = _namespace_with(128)
    view = view_of({"a": {ns.bundle_names[0]: stats(topics=5000)}}, namespaces={NS: ns})
    assert run(view)[1].decisions == ()


def test_namespace_unknown_to_the_view_is_counted_from_the_reports() -> None:
    view = view_of({"a": {B[0]: stats(topics=5000), B[1]: stats()}}, namespaces={})
    assert len(run(view, load_balancer_namespace_maximum_bundles=3)[1].decisions) == 1
    assert run(view, load_balancer_namespace_maximum_bundles=2)[1].decisions == ()


def test_per_cycle_cap_keeps_the_bundles_furthest_over_their_threshold() -> None:
    ns = NamespaceBundles.initial(NS, 8)
    names = ns.bundle_names
    owned = {
        "a": {names[0]: stats(topics=1100), names[1]: stats(topics=3000)},
        "b": {names[2]: stats(topics=2, sessions=2500), names[3]: stats(topics=1500)},
        "c": {names[4]: stats(topics=2)},
    }
    view = view_of(owned, data={names[4]: long_term(msg_rate=90000)}, namespaces={NS: ns})
    _, result = run(view, load_balancer_max_number_of_bundles_to_split_per_cycle=3)
    # over-ratios: 3.0, 3.0 (90000/30000), 2.5, 1.5, 1.1 -> ties broken by name
    assert [d.bundle for d in result.decisions] == [names[1], names[4], names[2]]
    assert [d.source_broker for d in result.decisions] == ["a", "c", "b"]
    assert {s.reason for s in result.skips} == {"MaxSplitsPerCycle"}
    assert {s.bundle for s in result.skips} == {names[3], names[0]}


def test_decisions_are_deterministic() -> None:
    view = view_of({"a": {B[0]: stats(topics=5000)}, "b": {B[2]: stats(topics=1001)}})
    first, second = run(view)[1], run(view)[1]
    assert [d.id for d in first.decisions] == [d.id for d in second.decisions]
    assert len(first.decisions) == 2


# --- debounce ----------------------------------------------------------------------------------


def test_debounce_needs_more_than_threshold_consecutive_hot_checks() -> None:
    hot = view_of({"a": {B[0]: stats(topics=5000)}})
    cfg = {"load_balancer_split_debounce_enabled": True}
    state = None
    for check in range(1, 4):
        state, result = run(hot, state, **cfg)
        assert result.decisions == ()
        assert [s.reason for s in result.skips] == ["HitCount"]
        assert state.hit_counts == {B[0]: check}
    state, result = run(hot, state, **cfg)
    assert [d.bundle for d in result.decisions] == [B[0]]
    assert result.decisions[0].inputs["hitCount"] == 4
    assert state.hit_counts == {}  # restarts after a split


def test_debounce_resets_when_the_bundle_cools_down_or_disappears() -> None:
    hot = view_of({"a": {B[0]: stats(topics=5000)}})
    cool = view_of({"a": {B[0]: stats(topics=5)}})
    gone = view_of({"a": {B[1]: stats(topics=5)}})
    cfg = {"load_balancer_split_debounce_enabled": True}
    state, _ = run(hot, None, **cfg)
    state, _ = run(hot, state, **cfg)
    assert run(cool, state, **cfg)[0].hit_counts == {}
    assert run(gone, state, **cfg)[0].hit_counts == {}


def test_without_debounce_the_first_hot_check_splits() -> None:
    state, result = run(view_of({"a": {B[0]: stats(topics=5000)}}), SplitState({B[0]: 1}))
    assert len(result.decisions) == 1 and state.hit_counts == {}


# --- ranges and algorithms ---------------------------------------------------------------------


def test_unsplittable_or_unknown_ranges_are_skipped() -> None:
    tiny = "t/ns/0x00000005_0x00000006"
    ns = NamespaceBundles(NS, (0, 5, 6, 0xFFFFFFFF))
    view = view_of({"a": {tiny: stats(topics=5000)}}, namespaces={NS: ns})
    _, result = run(view)
    assert result.decisions == () and [s.reason for s in result.skips] == ["CannotSplit"]
    stale = view_of({"a": {"t/ns/0x00000000_0x80000000": stats(topics=5000)}})
    _, result = run(stale)
    assert result.decisions == () and [s.reason for s in result.skips] == ["UnknownBundle"]


def test_topic_count_algorithm_uses_topic_hashes_when_present() -> None:
    hashes = (0x100, 0x200, 0x300, 0x400)
    view = view_of({"a": {B[0]: stats(topics=5000)}}, topic_hashes={B[0]: hashes})
    _, result = run(view, default_namespace_bundle_split_algorithm="topic_count_equally_divide")
    [d] = result.decisions
    assert d.split_algorithm == "topic_count_equally_divide"
    assert d.split_boundaries == (0x280,)
    assert "splitAlgorithmFallback" not in d.inputs


def test_topic_count_algorithm_falls_back_to_halving_without_hashes_and_says_so() -> None:
    view = view_of({"a": {B[0]: stats(topics=5000)}})
    _, result = run(view, default_namespace_bundle_split_algorithm="topic_count_equally_divide")
    [d] = result.decisions
    assert d.split_algorithm == "range_equally_divide"
    assert d.split_boundaries == (0x20000000,)
    assert d.inputs["configuredSplitAlgorithm"] == "topic_count_equally_divide"
    assert "no topic hashes" in str(d.inputs["splitAlgorithmFallback"])


def test_flow_or_qps_uses_topic_loads_and_may_cut_several_times() -> None:
    loads = {B[0]: [TopicLoad(h, 20000.0, 1.0) for h in (0x1000, 0x2000, 0x3000)]}
    view = view_of({"a": {B[0]: stats(topics=3)}}, data={B[0]: long_term(60000)})
    algo = {"default_namespace_bundle_split_algorithm": "flow_or_qps_equally_divide"}
    _, result = find_bundles_to_split(
        view, make_config(**algo), None, now_ms=0, cycle="c", topic_loads=loads
    )
    [d] = result.decisions
    assert d.split_boundaries == (0x1801, 0x2801)
    _, fallback = run(view, **algo)
    assert fallback.decisions[0].split_algorithm == "range_equally_divide"
    assert "splitAlgorithmFallback" in fallback.decisions[0].inputs


def test_multi_boundary_split_is_trimmed_to_the_namespace_maximum() -> None:
    loads = {B[0]: [TopicLoad(h, 20000.0, 1.0) for h in (0x1000, 0x2000, 0x3000)]}
    view = view_of({"a": {B[0]: stats(topics=3)}}, data={B[0]: long_term(60000)})
    cfg = make_config(
        default_namespace_bundle_split_algorithm="flow_or_qps_equally_divide",
        load_balancer_namespace_maximum_bundles=5,
    )
    _, result = find_bundles_to_split(view, cfg, None, now_ms=0, cycle="c", topic_loads=loads)
    assert result.decisions[0].split_boundaries == (0x1801,)


def test_an_algorithm_that_finds_no_boundary_gives_a_skip_not_a_decision() -> None:
    view = view_of({"a": {B[0]: stats(topics=5000)}}, topic_hashes={B[0]: (0, 0)})
    _, result = run(view, default_namespace_bundle_split_algorithm="topic_count_equally_divide")
    assert result.decisions == ()
    assert [s.reason for s in result.skips] == ["NoBoundary"]
    _, result = run(
        view_of({"a": {B[0]: stats(topics=5000)}}),
        default_namespace_bundle_split_algorithm="specified_positions_divide",
    )
    assert result.decisions == () and [s.reason for s in result.skips] == ["NoBoundary"]


def test_boundaries_always_fall_strictly_inside_the_bundle() -> None:
    owned = {"a": {b: stats(topics=5000) for b in B}}
    for d in run(view_of(owned))[1].decisions:
        r = parse_bundle(d.bundle)
        assert all(r.lower < p < r.upper for p in d.split_boundaries)
        NAMESPACE.split(r, d.split_boundaries)  # accepted by the ring arithmetic
