"""The merge step (ours): only adjacent, same-owner, cold pairs, within caps and floors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loadbalance.bundles import NamespaceBundles
from loadbalance.config import LoadBalancerConfig
from loadbalance.decisions import MERGE
from loadbalance.merge_policy import find_bundles_to_merge
from loadbalance.model import LocalBrokerData, NamespaceBundleStats
from loadbalance.time_average import BundleData, TimeAverageBrokerData, TimeAverageMessageData
from loadbalance.view import BrokerView, ClusterView

NS = "t/ns"
MIB = 1024 * 1024
MERGE_ON = {
    "load_balancer_merge_enabled": True,
    "load_balancer_merge_max_msg_rate": 1000.0,
    "load_balancer_merge_max_bandwidth_mbytes": 1.0,
    "load_balancer_merge_max_topics": 100,
    "load_balancer_max_number_of_bundles_to_merge_per_cycle": 10,
    "default_number_of_namespace_bundles": 1,
}


def make_config(**overrides: Any) -> LoadBalancerConfig:
    """Pulsar's defaults with overrides by attribute name, validated like a real config."""
    return LoadBalancerConfig(**overrides)


def data(msg_rate: float = 10.0, throughput: float = 1000.0, topics: int = 2) -> BundleData:
    lt = TimeAverageMessageData(
        1000, 1000, throughput / 2, throughput / 2, msg_rate / 2, msg_rate / 2
    )
    return BundleData(TimeAverageMessageData(10), lt, topics)


def view_of(
    ns: NamespaceBundles,
    owners: Mapping[str, str],
    bundle_data: Mapping[str, BundleData] | None = None,
    *,
    recently_unloaded: Mapping[str, int] | None = None,
    sessions: Mapping[str, int] | None = None,
) -> ClusterView:
    """``owners``: bundle -> broker; every bundle gets cold data unless given."""
    per_broker: dict[str, list[str]] = {}
    for bundle, broker in owners.items():
        per_broker.setdefault(broker, []).append(bundle)
    brokers = {}
    for broker, bundles in per_broker.items():
        last_stats = {
            b: NamespaceBundleStats(topics=2, producer_count=(sessions or {}).get(b, 0))
            for b in bundles
        }
        report = LocalBrokerData(broker=broker, bundles=frozenset(bundles), last_stats=last_stats)
        brokers[broker] = BrokerView(report, 0.1, 0.0, TimeAverageBrokerData(), 0)
    all_data = {b: data() for b in ns.bundle_names}
    all_data.update(bundle_data or {})
    return ClusterView(
        brokers=brokers,
        bundle_data=all_data,
        namespaces={ns.namespace: ns},
        recently_unloaded=recently_unloaded or {},
    )


def run(view: ClusterView, **cfg: Any):
    return find_bundles_to_merge(view, make_config(**{**MERGE_ON, **cfg}), now_ms=5, cycle="c")


def test_merging_is_off_by_default() -> None:
    ns = NamespaceBundles.initial(NS, 8)
    view = view_of(ns, dict.fromkeys(ns.bundle_names, "a"))
    result = find_bundles_to_merge(view, make_config(), now_ms=0, cycle="c")
    assert result.decisions == () and result.skips == ()


def test_two_cold_adjacent_bundles_of_one_owner_merge() -> None:
    ns = NamespaceBundles.initial(NS, 2)
    left, right = ns.bundle_names
    [d] = run(view_of(ns, {left: "a", right: "a"})).decisions
    assert (d.kind, d.bundle, d.merge_bundle, d.source_broker) == (MERGE, left, right, "a")
    assert (d.reason, d.strategy, d.decided_at_ms) == ("Cold", "ColdBundleMerger", 5)
    assert ns.merge(d.bundle, d.merge_bundle).boundaries == (0, 0xFFFFFFFF)


def test_bundles_of_different_owners_do_not_merge() -> None:
    ns = NamespaceBundles.initial(NS, 2)
    left, right = ns.bundle_names
    assert run(view_of(ns, {left: "a", right: "b"})).decisions == ()
    assert run(view_of(ns, {left: "a"})).decisions == ()  # right is served by nobody


def test_only_adjacent_bundles_merge() -> None:
    ns = NamespaceBundles.initial(NS, 4)
    b = ns.bundle_names
    # a serves 0 and 2, which are not neighbours; b serves 1 and c serves 3
    view = view_of(ns, {b[0]: "a", b[1]: "b", b[2]: "a", b[3]: "c"})
    assert run(view).decisions == ()


def test_both_bundles_must_be_cold() -> None:
    ns = NamespaceBundles.initial(NS, 2)
    left, right = ns.bundle_names
    owners = {left: "a", right: "a"}
    assert run(view_of(ns, owners, {right: data(msg_rate=1000.0)})).decisions == ()
    assert run(view_of(ns, owners, {left: data(throughput=2 * MIB)})).decisions == ()
    assert run(view_of(ns, owners, {left: data(topics=60), right: data(topics=41)})).decisions == ()
    assert (
        len(run(view_of(ns, owners, {left: data(topics=60), right: data(topics=40)})).decisions)
        == 1
    )


def test_recently_unloaded_or_split_bundles_wait() -> None:
    ns = NamespaceBundles.initial(NS, 2)
    left, right = ns.bundle_names
    result = run(view_of(ns, {left: "a", right: "a"}, recently_unloaded={right: 1}))
    assert result.decisions == () and [s.reason for s in result.skips] == ["CoolDown"]


def test_a_pair_that_would_qualify_for_a_split_is_not_merged() -> None:
    ns = NamespaceBundles.initial(NS, 2)
    left, right = ns.bundle_names
    owners = {left: "a", right: "a"}
    lax = {"load_balancer_merge_max_msg_rate": 20000.0}
    hot_pair = {left: data(msg_rate=16000.0), right: data(msg_rate=16000.0)}
    result = run(view_of(ns, owners, hot_pair), **lax)
    assert result.decisions == () and [s.reason for s in result.skips] == ["Hysteresis"]
    busy = view_of(ns, owners, sessions={left: 600, right: 600})
    assert [s.reason for s in run(busy).skips] == ["Hysteresis"]
    assert len(run(view_of(ns, owners, {left: data(msg_rate=14000.0)}), **lax).decisions) == 1


def test_namespace_keeps_its_minimum_bundle_count() -> None:
    ns = NamespaceBundles.initial(NS, 6)
    view = view_of(ns, dict.fromkeys(ns.bundle_names, "a"))
    result = run(view, default_number_of_namespace_bundles=4)
    assert len(result.decisions) == 2
    assert "NamespaceMinimumBundles" in {s.reason for s in result.skips}
    assert run(view, default_number_of_namespace_bundles=6).decisions == ()


def test_per_cycle_cap_keeps_the_coldest_pairs() -> None:
    ns = NamespaceBundles.initial(NS, 8)
    b = ns.bundle_names
    rates = {b[i]: data(msg_rate=10.0 * (8 - i)) for i in range(8)}  # the last ones are coldest
    view = view_of(ns, dict.fromkeys(b, "a"), rates)
    result = run(view, load_balancer_max_number_of_bundles_to_merge_per_cycle=2)
    assert [(d.bundle, d.merge_bundle) for d in result.decisions] == [(b[6], b[7]), (b[4], b[5])]
    assert [s.reason for s in result.skips] == ["MaxMergesPerCycle"]
    assert len(run(view, load_balancer_max_number_of_bundles_to_merge_per_cycle=9).decisions) == 4
    assert run(view, load_balancer_max_number_of_bundles_to_merge_per_cycle=0).decisions == ()


def test_a_bundle_takes_part_in_at_most_one_merge_per_cycle() -> None:
    ns = NamespaceBundles.initial(NS, 3)
    view = view_of(ns, dict.fromkeys(ns.bundle_names, "a"))
    result = run(view)
    assert len(result.decisions) == 1
    named = [n for d in result.decisions for n in (d.bundle, d.merge_bundle)]
    assert len(named) == len(set(named))


def test_merge_decisions_are_deterministic() -> None:
    ns = NamespaceBundles.initial(NS, 8)
    view = view_of(ns, dict.fromkeys(ns.bundle_names, "a"))
    assert [d.id for d in run(view).decisions] == [d.id for d in run(view).decisions]


SYSTEM_NAMESPACES = (
    "pulsar/broker-1.example.com:8080",  # heartbeat, v2
    "pulsar/use/broker-1.example.com:8080",  # heartbeat, v1
    "sla-monitor/use/broker-1.example.com:8080",
    "pulsar/system",
)


def test_system_service_namespaces_are_never_merged() -> None:
    """Cold adjacent same-owner bundles of a heartbeat / SLA-monitor / ``pulsar/system``
    namespace stay apart, while an ordinary namespace beside them in the same view merges."""
    namespaces = {ns: NamespaceBundles.initial(ns, 4) for ns in (*SYSTEM_NAMESPACES, NS)}
    base = view_of(namespaces[NS], dict.fromkeys(namespaces[NS].bundle_names, "a"))
    owned = [b for nb in namespaces.values() for b in nb.bundle_names]
    report = LocalBrokerData(
        broker="a",
        bundles=frozenset(owned),
        last_stats={b: NamespaceBundleStats(topics=2) for b in owned},
    )
    view = ClusterView(
        brokers={"a": BrokerView(report, 0.1, 0.0, TimeAverageBrokerData(), 0)},
        bundle_data={b: data() for b in owned},
        namespaces=namespaces,
        recently_unloaded=base.recently_unloaded,
    )
    result = run(view)
    merged = {d.bundle.rpartition("/")[0] for d in result.decisions if d.kind == MERGE}
    assert merged == {NS}
    touched = {d.bundle for d in result.decisions} | {d.merge_bundle for d in result.decisions}
    assert not any(b.startswith(("pulsar/", "sla-monitor/")) for b in touched)
