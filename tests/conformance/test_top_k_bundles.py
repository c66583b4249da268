"""Pulsar's ``TopKBundlesTest`` (``extensions/models``) and its system-namespace rule, restated
on ``transfer_shedder.top_bundles``, plus the same rule for the modular shedders and the split
policy (Pulsar's ``NamespaceService.isSystemServiceNamespace`` bundles are never moved).

``testIsolationPolicy``, ``testAntiAffinityGroupPolicy`` and
``testLoadBalancerSheddingBundlesWithPoliciesEnabledConfig`` are in
``test_shedding_policies.py``. Not ported: ``testSheddingExcludedNamespaces``
(``loadBalancerSheddingExcludedNamespaces`` is not a knob here).
"""

from __future__ import annotations

import random

import pytest

from loadbalance.model import NamespaceBundleStats
from loadbalance.shedding.system_namespaces import is_system_namespace
from loadbalance.shedding.transfer_shedder import compare_bundle_stats, top_bundles
from tests.conformance.pulsar_fixtures import MB, Broker, shed, view_of

BUNDLE1 = "my-tenant/my-namespace1/0x00000000_0x0FFFFFFF"
BUNDLE2 = "my-tenant/my-namespace2/0x00000000_0x0FFFFFFF"
BUNDLE3 = "my-tenant/my-namespace3/0x00000000_0x0FFFFFFF"
BUNDLE4 = "my-tenant/my-namespace4/0x00000000_0x0FFFFFFF"


def rate_in(x: float) -> NamespaceBundleStats:
    return NamespaceBundleStats(msg_rate_in=x)


def top(bundles: dict[str, NamespaceBundleStats], k: int) -> list[str]:
    view = view_of({"b": Broker(0.5, bundles)})
    return [name for name, _ in top_bundles(view, view.brokers["b"], k)]


def test_top_bundles_load_data() -> None:
    """TopKBundlesTest.testTopBundlesLoadData: the top 3 by msg rate, smallest first."""
    bundles = {BUNDLE1: rate_in(100000), BUNDLE2: rate_in(500), BUNDLE3: rate_in(10000)}
    bundles[BUNDLE4] = rate_in(0)
    assert top(bundles, 3) == [BUNDLE2, BUNDLE3, BUNDLE1]


def test_system_namespace() -> None:
    """TopKBundlesTest.testSystemNamespace"""
    bundles = {"pulsar/system/0x00000000_0x0FFFFFFF": rate_in(500), BUNDLE1: rate_in(10000)}
    assert top(bundles, 2) == [BUNDLE1]


def test_partition_sort() -> None:
    """TopKBundlesTest.testPartitionSort (seeded): the top-k selection holds the k largest
    values of a full descending sort."""
    rng = random.Random(3)
    for _ in range(100):
        n = rng.randrange(10) + 1
        values = [rng.randrange(n) * 1000 for _ in range(n)]
        bundles = {f"t/ns/0x{i:08x}_0x{i + 1:08x}": rate_in(v) for i, v in enumerate(values)}
        k = rng.randrange(n) + 1
        got = [bundles[b].msg_rate_in for b in top(bundles, k)]
        assert got == sorted(values, reverse=True)[:k][::-1]


def test_compare_to_order_and_thresholds() -> None:
    """NamespaceBundleStats.compareTo, which TopKBundles ranks with: bandwidth in first, then
    out, then msg rate; differences within 100 KB/s or 100 msg/s count as equal."""
    big_in = NamespaceBundleStats(msg_throughput_in=2 * MB)
    big_out = NamespaceBundleStats(msg_throughput_out=50 * MB, msg_rate_in=1e6)
    assert compare_bundle_stats(big_in, big_out) > 0
    near = NamespaceBundleStats(msg_throughput_in=2 * MB + 50_000, msg_rate_in=1000)
    assert compare_bundle_stats(near, big_in) > 0  # in is equal within 100 KB/s: msg rate decides
    assert compare_bundle_stats(rate_in(150), rate_in(100)) == 0


@pytest.mark.parametrize(
    ("namespace", "system"),
    [
        ("pulsar/system", True),
        ("pulsar/use/broker-1.example.com:8080", True),
        ("pulsar/broker-1.example.com:8080", True),
        ("sla-monitor/use/broker-1.example.com:8080", True),
        ("pulsar/functions", False),
        ("my-tenant/my-namespace1", False),
    ],
)
def test_is_system_service_namespace(namespace: str, system: bool) -> None:
    """NamespaceService.isSystemServiceNamespace's four forms."""
    assert is_system_namespace(namespace) is system


HEARTBEAT = "pulsar/use/broker-1:8080/0x00000000_0xffffffff"


def test_modular_shedders_never_unload_system_bundles() -> None:
    """A broker whose largest bundle is its heartbeat bundle sheds other bundles only."""
    stats = {HEARTBEAT: NamespaceBundleStats(msg_throughput_in=90 * MB)}
    for i in range(3):
        stats[f"t/ns/0x{i:08x}_0x{i + 1:08x}"] = NamespaceBundleStats(msg_throughput_in=MB)
    busy = Broker(0.95, stats, thr_in=93 * MB, thr_out=0.0)
    view = view_of({"broker-1:8080": busy, "idle": Broker(0.05, {})})
    for name in ("OverloadShedder", "ThresholdShedder"):
        _, res = shed(name, view)
        assert res.decisions and HEARTBEAT not in {d.bundle for d in res.decisions}, name
