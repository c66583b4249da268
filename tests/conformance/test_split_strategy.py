"""Pulsar's split strategy tests restated on this model: ``BundleSplitterTaskTest`` (``impl``,
the modular load manager) and ``DefaultNamespaceBundleSplitStrategyTest``
(``extensions/strategy``), plus the system-namespace rule.

``loadbalance.split_policy`` is ``BundleSplitterTask`` with the extensible strategy's options:
it reads the bundles' **long-term** averages (``BundleData``), as the modular task does, where
the extensible strategy reads the broker's current bundle stats. The extensible tests' figures
therefore go into both the reported ``lastStats`` and the bundles' long-term data (one sample,
so long-term = the figure). The extensible strategy always counts split-condition hits; here
that is ``load_balancer_split_debounce_enabled`` (off by default, as the modular task has no
such count). Bundle names are canonical (lower-case hex); Pulsar's test writes ``0xFFFFFFFF``.

Not ported: ``DefaultNamespaceBundleSplitStrategyTest.testError`` (a namespace service that
throws: the bundle count here is read from the view and cannot fail).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from loadbalance.bundles import NamespaceBundles, is_system_service_bundle
from loadbalance.config import LoadBalancerConfig
from loadbalance.decisions import PolicyResult
from loadbalance.model import LocalBrokerData, NamespaceBundleStats
from loadbalance.split_algorithms import MBYTES
from loadbalance.split_policy import SplitState, find_bundles_to_split
from loadbalance.time_average import BundleData, TimeAverageBrokerData, TimeAverageMessageData
from loadbalance.view import BrokerView, ClusterView

BROKER = "broker-1"
BUNDLE1 = "tenant/namespace/0x00000000_0xffffffff"
BUNDLE2 = "tenant/namespace/0x00000000_0x0fffffff"
#: ``DefaultNamespaceBundleSplitStrategyTest.setup``
EXTENSIBLE: dict[str, Any] = {
    "load_balancer_namespace_maximum_bundles": 100,
    "load_balancer_namespace_bundle_max_topics": 100,
    "load_balancer_namespace_bundle_max_sessions": 100,
    "load_balancer_namespace_bundle_max_msg_rate": 100,
    "load_balancer_namespace_bundle_max_bandwidth_mbytes": 100,
    "load_balancer_max_number_of_bundles_to_split_per_cycle": 1,
    "load_balancer_namespace_bundle_split_condition_hit_count_threshold": 3,
    "load_balancer_split_debounce_enabled": True,
}


def view_of(
    bundles: Mapping[str, NamespaceBundleStats],
    *,
    long_term: Mapping[str, BundleData] | None = None,
    namespaces: Mapping[str, NamespaceBundles] | None = None,
) -> ClusterView:
    """One broker reporting ``bundles``; each bundle's long-term data is its figures unless
    ``long_term`` gives it."""
    report = LocalBrokerData(broker=BROKER, bundles=frozenset(bundles), last_stats=bundles)
    data = {b: BundleData.new().update(s) for b, s in bundles.items()}
    data.update(long_term or {})
    return ClusterView(
        brokers={BROKER: BrokerView(report, 0.1, 0.0, TimeAverageBrokerData(), 0)},
        bundle_data=data,
        namespaces=namespaces or {},
    )


def split(
    view: ClusterView, state: SplitState | None = None, **knobs: Any
) -> tuple[SplitState, PolicyResult]:
    config = LoadBalancerConfig(**knobs)
    return find_bundles_to_split(view, config, state, now_ms=0, cycle="c")


def decided(result: PolicyResult) -> set[tuple[str, str, str]]:
    """Pulsar's ``SplitDecision`` set: (bundle, broker, reason)."""
    return {(d.bundle, d.source_broker or "", d.reason) for d in result.decisions}


def two_bundles(**figures: Any) -> dict[str, NamespaceBundleStats]:
    return {b: NamespaceBundleStats(**{"topics": 5, **figures}) for b in (BUNDLE1, BUNDLE2)}


def test_namespace_bundle_split_condition_threshold() -> None:
    """DefaultNamespaceBundleSplitStrategyTest.testNamespaceBundleSplitConditionThreshold:
    hit-count threshold 0, both bundles at 101 msg/s: one split (one per cycle)."""
    knobs = {
        **EXTENSIBLE,
        "load_balancer_namespace_bundle_split_condition_hit_count_threshold": 0,
    }
    _, result = split(view_of(two_bundles(msg_rate_in=101)), **knobs)
    assert len(result.decisions) == 1
    assert [s.reason for s in result.skips] == ["MaxSplitsPerCycle"]


def test_not_enough_topics() -> None:
    """DefaultNamespaceBundleSplitStrategyTest.testNotEnoughTopics"""
    knobs = {
        **EXTENSIBLE,
        "load_balancer_namespace_bundle_split_condition_hit_count_threshold": 0,
    }
    _, result = split(view_of(two_bundles(msg_rate_in=101, topics=1)), **knobs)
    assert result.decisions == ()


def test_namespace_maximum_bundles() -> None:
    """DefaultNamespaceBundleSplitStrategyTest.testNamespaceMaximumBundles: the namespace
    already has ``loadBalancerNamespaceMaximumBundles`` (100) bundles. Pulsar's mock returns a
    count of 100 for the overlapping test bundles; here two current bundles of a namespace
    that really has 100 are hot."""
    namespace = NamespaceBundles.initial("tenant/namespace", 100)
    hot = {b: NamespaceBundleStats(topics=5, msg_rate_in=101) for b in namespace.bundle_names[:2]}
    knobs = {
        **EXTENSIBLE,
        "load_balancer_namespace_bundle_split_condition_hit_count_threshold": 0,
    }
    _, result = split(view_of(hot, namespaces={namespace.namespace: namespace}), **knobs)
    assert result.decisions == ()
    assert {s.reason for s in result.skips} == {"NamespaceMaximumBundles"}


def test_empty_bundle_stats() -> None:
    """DefaultNamespaceBundleSplitStrategyTest.testEmptyBundleStats"""
    knobs = {
        **EXTENSIBLE,
        "load_balancer_namespace_bundle_split_condition_hit_count_threshold": 0,
    }
    _, result = split(view_of({}), **knobs)
    assert result.decisions == () and result.skips == ()


HALF_RATE = 100 // 2 + 1
HALF_SESSIONS = 100 // 2 + 1
HALF_BANDWIDTH = 100 * MBYTES // 2 + 1


@pytest.mark.parametrize(
    ("figures", "reason"),
    [
        ({"msg_rate_in": HALF_RATE, "msg_rate_out": HALF_RATE}, "MsgRate"),
        ({"topics": 101}, "Topics"),
        ({"producer_count": HALF_SESSIONS, "consumer_count": HALF_SESSIONS}, "Sessions"),
        (
            {"msg_throughput_in": HALF_BANDWIDTH, "msg_throughput_out": HALF_BANDWIDTH},
            "Bandwidth",
        ),
    ],
    ids=["testMaxMsgRate", "testMaxTopics", "testMaxSessions", "testMaxBandwidthMbytes"],
)
def test_split_after_hit_count_threshold(figures: dict[str, Any], reason: str) -> None:
    """DefaultNamespaceBundleSplitStrategyTest.testMaxMsgRate / testMaxTopics /
    testMaxSessions / testMaxBandwidthMbytes: both bundles over one limit on every check;
    nothing for ``threshold`` checks, then one bundle (one split per cycle), then the other.
    Pulsar splits ``bundle1`` first (its map order); equal bundles are taken by name here,
    so ``bundle2`` (``0x00000000_0x0fffffff``) goes first."""
    threshold = EXTENSIBLE["load_balancer_namespace_bundle_split_condition_hit_count_threshold"]
    view = view_of(two_bundles(**figures))
    state: SplitState | None = None
    per_check = []
    for _ in range(threshold + 2):
        state, result = split(view, state, **EXTENSIBLE)
        per_check.append(decided(result))
    assert per_check[:threshold] == [set()] * threshold
    assert per_check[threshold] == {(BUNDLE2, BROKER, reason)}
    assert per_check[threshold + 1] == {(BUNDLE1, BROKER, reason)}


def test_split_task_when_topic_just_one() -> None:
    """BundleSplitterTaskTest.testSplitTaskWhenTopicJustOne: long-term msgRateIn at the
    maximum plus 1 msg/s out, but one topic: no split."""
    lt = TimeAverageMessageData(1000, 1, 0.0, 0.0, 30000.0, 1.0)
    bundle = "ten/ns/0x00000000_0x80000000"
    view = view_of(
        {bundle: NamespaceBundleStats(topics=1)},
        long_term={bundle: BundleData(TimeAverageMessageData(10), lt, 1)},
    )
    _, result = split(view)
    assert result.decisions == ()
    # The same bundle with two topics is split: the topic count alone held it back.
    view2 = view_of(
        {bundle: NamespaceBundleStats(topics=2)},
        long_term={bundle: BundleData(TimeAverageMessageData(10), lt, 2)},
    )
    assert [d.reason for d in split(view2)[1].decisions] == ["MsgRate"]


TEN_NS = ("ten/ns/0x00000000_0x20000000", "ten/ns/0x20000000_0x40000000")


@pytest.mark.parametrize(
    ("namespaces", "bundles", "current"),
    [
        # The namespace's boundaries unknown to the view: its count is the bundles reported.
        ({}, (*TEN_NS, "ten/ns/0x40000000_0x60000000"), 3),
        # Known boundaries, two bundles: room for one more.
        (
            {"ten/ns": NamespaceBundles("ten/ns", (0, 0x20000000, 0xFFFFFFFF))},
            ("ten/ns/0x00000000_0x20000000", "ten/ns/0x20000000_0xffffffff"),
            2,
        ),
    ],
)
def test_load_balancer_namespace_maximum_bundles(
    namespaces: dict[str, NamespaceBundles], bundles: tuple[str, ...], current: int
) -> None:
    """BundleSplitterTaskTest.testLoadBalancerNamespaceMaximumBundles: with
    ``loadBalancerNamespaceMaximumBundles = 3`` and every bundle hot (long-term msgRateIn
    twice the maximum), current bundles + splits chosen = 3."""
    lt = TimeAverageMessageData(1000, 1, 0.0, 0.0, 60000.0, 1.0)
    view = view_of(
        {b: NamespaceBundleStats(topics=5) for b in bundles},
        long_term={b: BundleData(TimeAverageMessageData(10), lt, 5) for b in bundles},
        namespaces=namespaces,
    )
    _, result = split(view, load_balancer_namespace_maximum_bundles=3)
    assert current + len(result.decisions) == 3


SYSTEM_BUNDLES = (
    "pulsar/broker-1.example.com:8080/0x00000000_0xffffffff",  # heartbeat, v2
    "pulsar/use/broker-1.example.com:8080/0x00000000_0xffffffff",  # heartbeat, v1
    "sla-monitor/use/broker-1.example.com:8080/0x00000000_0xffffffff",
    "pulsar/system/0x00000000_0x40000000",
)


def test_system_service_bundles_are_never_split() -> None:
    """(The system-namespace rule) A heartbeat, SLA-monitor or ``pulsar/system`` bundle over
    every limit is left whole, with or without the debounce, while an ordinary bundle with
    the same figures beside it is split."""
    assert all(is_system_service_bundle(b) for b in SYSTEM_BUNDLES)
    figures = NamespaceBundleStats(
        topics=5000, producer_count=5000, msg_rate_in=1e6, msg_throughput_in=1e12
    )
    bundles = dict.fromkeys((*SYSTEM_BUNDLES, BUNDLE1), figures)
    for knobs in ({}, {**EXTENSIBLE, "load_balancer_max_number_of_bundles_to_split_per_cycle": 10}):
        state: SplitState | None = None
        for _ in range(5):
            state, result = split(view_of(bundles), state, **knobs)
            assert not {d.bundle for d in result.decisions} & set(SYSTEM_BUNDLES)
            assert not {s.bundle for s in result.skips} & set(SYSTEM_BUNDLES)
        assert state is not None and not set(state.hit_counts) & set(SYSTEM_BUNDLES)
    _, result = split(view_of(bundles))
    assert {d.bundle for d in result.decisions} == {BUNDLE1}
