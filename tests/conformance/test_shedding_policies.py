"""Shedding under placement policies, restated from Pulsar's own tests.

* ``ModularLoadManagerImplTest.testLoadSheddingWithNamespaceIsolationPolicies`` and
  ``AntiAffinityNamespaceGroupTest``'s unload guard cases
  (``testLoadSheddingUtilWithAntiAffinityNamespace``,
  ``testLoadSheddingWithAntiAffinityNamespace``):
  the two guards ``doLoadShedding`` applies to a modular shedder's selection
  (``shedding.policy_guards.PolicyGuard``), then the same guards through a whole policy cycle
  for each modular shedder.
* ``TransferShedderTest``'s ``testBundlesWithIsolationPolicies``,
  ``testBundlesWithAntiAffinityGroup`` and ``testIsLoadBalancerSheddingBundlesWithPoliciesEnabled``
  with ``loadBalancerSheddingBundlesWithPoliciesEnabled`` both ways, on the ``setupContext``
  fixture of ``test_transfer_shedder.py``.

Pulsar's tests mock the policy helpers; here the same outcomes come from real policies in
Pulsar's admin JSON shapes, the mock's effect noted per case. Pulsar's v1 namespaces
(``my-tenant/use/my-ns``) are written as ``tenant/namespace``, the only form modelled. Not ported:
``TransferShedderTest.testFilterHasException`` (a pure filter cannot fail).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from loadbalance.cycle import CycleState, step
from loadbalance.decisions import UNLOAD, make_decision
from loadbalance.model import NamespaceBundleStats, ResourceUsage
from loadbalance.placement.policies import PlacementPolicies
from loadbalance.shedding.policy_guards import PolicyGuard, guard_unloads
from loadbalance.shedding.transfer_shedder import top_bundles
from loadbalance.view import ClusterView
from tests.conformance.pulsar_fixtures import (
    MB,
    NOW_MS,
    Broker,
    config,
    moves,
    reasons,
    shed,
    view_of,
)
from tests.conformance.test_modular_shedders import (
    BW_999,
    another_broker,
    broker1_with_ten_bundles,
    uniform_cluster,
)
from tests.conformance.test_transfer_shedder import D1, E1, HIT0, b, setup_brokers

FULL = "0x00000000_0xffffffff"


def isolation(name: str, namespaces: list[str], primary: list[str], **extra: Any) -> dict:
    """One ``NamespaceIsolationData`` with ``min_available`` (min_limit 1, threshold 80, as
    Pulsar's tests write it) unless ``extra`` says otherwise."""
    body = {
        "namespaces": namespaces,
        "primary": primary,
        "secondary": extra.pop("secondary", []),
        "auto_failover_policy": {
            "policy_type": "min_available",
            "parameters": {"min_limit": str(extra.pop("min_limit", 1)), "usage_threshold": "80"},
        },
    }
    return {name: body}


def with_policies(view: ClusterView, doc: dict) -> ClusterView:
    return replace(view, policies=PlacementPolicies.from_admin_json(doc))


def group_doc(group: str, namespaces: list[str], **extra: Any) -> dict:
    doc = {"localPolicies": {ns: {"namespaceAntiAffinityGroup": group} for ns in namespaces}}
    doc.update(extra)
    return doc


def idle(*bundles: str) -> Broker:
    """A broker at 10 % CPU serving ``bundles`` (1 B/s in and out each)."""
    tiny = NamespaceBundleStats(msg_throughput_in=1.0, msg_throughput_out=1.0)
    return Broker(0.1, dict.fromkeys(bundles, tiny), cpu=ResourceUsage(10, 100))


# ----- ModularLoadManagerImplTest.testLoadSheddingWithNamespaceIsolationPolicies ---------------

NS = "my-tenant/my-ns"
BUNDLE = f"{NS}/{FULL}"
PRIMARY_BROKER = "localhost:8080"  # pulsar1: primaryBrokerId
SECOND_BROKER = "localhost:8081"  # pulsar2, the same advertised host on another port


def two_localhost_brokers() -> ClusterView:
    return view_of({PRIMARY_BROKER: idle(BUNDLE), SECOND_BROKER: idle()})


def test_namespace_policies_unload_without_policy() -> None:
    """ModularLoadManagerImplTest.testLoadSheddingWithNamespaceIsolationPolicies, test1: no
    isolation policy, another (shared) broker can take the bundle."""
    guard = PolicyGuard(two_localhost_brokers(), config())
    assert guard.should_namespace_policies_unload(BUNDLE, PRIMARY_BROKER)


def test_namespace_policies_unload_no_other_broker_allowed() -> None:
    """...testLoadSheddingWithNamespaceIsolationPolicies, test2: the policy names a host
    (``localhost1``) no available broker has, as primary and secondary: no other broker may
    load the bundle, so it is not unloaded."""
    doc = {
        "namespaceIsolationPolicies": isolation(
            "my-ns-isolation-policies", [f"{NS}.*"], ["localhost1"], secondary=["localhost1"]
        )
    }
    guard = PolicyGuard(with_policies(two_localhost_brokers(), doc), config())
    assert not guard.should_namespace_policies_unload(BUNDLE, "localhost1:8080")
    assert not guard.should_namespace_policies_unload(BUNDLE, PRIMARY_BROKER)


def test_namespace_policies_unload_another_primary_available() -> None:
    """...testLoadSheddingWithNamespaceIsolationPolicies, test3: the policy's primary is the
    brokers' host (``localhost``, matched without the port), so the other broker may load it."""
    doc = {
        "namespaceIsolationPolicies": isolation(
            "my-ns-isolation-policies", [f"{NS}.*"], ["localhost"], secondary=["localhost"]
        )
    }
    guard = PolicyGuard(with_policies(two_localhost_brokers(), doc), config())
    assert guard.should_namespace_policies_unload(BUNDLE, PRIMARY_BROKER)


# ----- AntiAffinityNamespaceGroupTest: the unload guard ---------------------------------------

AA_NS = "my-tenant/my-ns-load-shedding-util"
AA_GROUP = "my-antiaffinity-load-shedding-util"


def aa_view(owned: dict[str, list[int]], *, domains: dict | None = None) -> ClusterView:
    """broker-0..2, each serving the full bundle of the listed namespaces ``AA_NS<i>``; all
    five namespaces ``AA_NS0..4`` in one group."""
    brokers = {
        f"broker-{n}": idle(*(f"{AA_NS}{i}/{FULL}" for i in owned.get(f"broker-{n}", [])))
        for n in range(3)
    }
    extra = {"failureDomains": domains} if domains else {}
    doc = group_doc(AA_GROUP, [f"{AA_NS}{i}" for i in range(5)], **extra)
    return with_policies(view_of(brokers), doc)


@pytest.mark.parametrize("domains_enabled", [False, True], ids=["no-domains", "domains"])
def test_load_shedding_util_with_anti_affinity_namespace(domains_enabled: bool) -> None:
    """AntiAffinityNamespaceGroupTest.testLoadSheddingUtilWithAntiAffinityNamespace:
    broker-0 owns ns-0 -> may unload it; broker-1 owns ns-1 -> still may; broker-2 owns ns-2
    -> every broker serves one namespace of the group, so it may not. With failure domains
    (``failureDomainsEnabled``, broker-0 and broker-1 in one domain, broker-2 in another) the
    answers are the same: Pulsar's guard counts brokers, not domains."""
    domains = {
        "domain1": {"brokers": ["broker-0", "broker-1"]},
        "domain2": {"brokers": ["broker-2"]},
    }
    cfg = config(failureDomainsEnabled=domains_enabled)
    bundle = f"{AA_NS}0/{FULL}"
    steps = [({"broker-0": [0]}, True), ({"broker-0": [0], "broker-1": [1]}, True)]
    steps.append(({"broker-0": [0], "broker-1": [1], "broker-2": [2]}, False))
    for owned, expected in steps:
        guard = PolicyGuard(aa_view(owned, domains=domains if domains_enabled else None), cfg)
        assert guard.should_anti_affinity_namespace_unload(bundle, "broker-0") is expected, owned


def test_load_shedding_with_anti_affinity_namespace() -> None:
    """AntiAffinityNamespaceGroupTest.testLoadSheddingWithAntiAffinityNamespace: one namespace
    of a five-namespace group loaded on the first of two brokers may be unloaded."""
    guard = PolicyGuard(aa_view({"broker-0": [0]}), config())
    assert guard.should_anti_affinity_namespace_unload(f"{AA_NS}0/{FULL}", "broker-0")


def test_anti_affinity_guard_namespace_in_no_group() -> None:
    """``shouldAntiAffinityNamespaceUnload`` answers true for a namespace in no group."""
    guard = PolicyGuard(aa_view({"broker-0": [0], "broker-1": [1], "broker-2": [2]}), config())
    assert guard.should_anti_affinity_namespace_unload("other/ns/" + FULL, "broker-0")


# ----- the guards in a policy cycle, for every modular shedder -------------------------------


def overloaded_cluster(shedder: str) -> ClusterView:
    """broker-1 sheds under ``shedder`` (the modular shedder tests' scenarios); its bundles are
    of namespace ``t/ns``."""
    if shedder == "UniformLoadShedder":
        return view_of(uniform_cluster([i * MB for i in range(1, 11)]))
    broker1 = broker1_with_ten_bundles(0.999, cpu=ResourceUsage(0, 100), **BW_999)
    other = another_broker()
    other = replace(
        other, bundles={f"u/ns/{k.rpartition('/')[2]}": v for k, v in other.bundles.items()}
    )
    return view_of({"broker-1": broker1, "broker2": other})


def run_cycle(view: ClusterView, shedder: str, **knobs: Any):
    cfg = config(loadBalancerLoadSheddingStrategy=shedder, **knobs)
    _, res = step(CycleState(), view, cfg, now_ms=NOW_MS, cycle="c")
    return res


MODULAR = ["ThresholdShedder", "OverloadShedder", "UniformLoadShedder"]


@pytest.mark.parametrize("shedder", MODULAR)
def test_cycle_sheds_without_policies(shedder: str) -> None:
    """The scenarios shed from broker-1 when no policy is set (the baseline of the cases below)."""
    res = run_cycle(overloaded_cluster(shedder), shedder)
    assert [d for d in res.decisions if d.source_broker == "broker-1"]


@pytest.mark.parametrize("shedder", MODULAR)
def test_cycle_keeps_isolated_bundles_without_another_allowed_broker(shedder: str) -> None:
    """``doLoadShedding`` with ``shouldNamespacePoliciesUnload`` false: ``t/ns`` may live only on
    broker-1 (its only primary; no secondary), so nothing of it is unloaded, whichever shedder
    selected it; each refusal is a ``NamespacePolicies`` skip."""
    doc = {"namespaceIsolationPolicies": isolation("p", ["t/ns"], ["broker-1"])}
    res = run_cycle(with_policies(overloaded_cluster(shedder), doc), shedder)
    assert [d for d in res.decisions if d.source_broker == "broker-1"] == []
    refused = [s for s in res.skips if s.reason == "NamespacePolicies"]
    assert refused and all(s.broker == "broker-1" and s.policy == shedder for s in refused)


@pytest.mark.parametrize("shedder", MODULAR)
def test_cycle_sheds_isolated_bundles_to_a_secondary(shedder: str) -> None:
    """With a secondary broker the failover may use (``min_limit`` 2 > one primary), the
    isolated bundles may leave broker-1 again."""
    doc = {
        "namespaceIsolationPolicies": isolation(
            "p", ["t/ns"], ["broker-1"], secondary=["broker2"], min_limit=2
        )
    }
    res = run_cycle(with_policies(overloaded_cluster(shedder), doc), shedder)
    assert [d for d in res.decisions if d.source_broker == "broker-1"]
    assert "NamespacePolicies" not in reasons(res)


@pytest.mark.parametrize("shedder", MODULAR)
def test_cycle_keeps_anti_affinity_bundles_that_would_come_back(shedder: str) -> None:
    """``doLoadShedding`` with ``shouldAntiAffinityNamespaceUnload`` false: ``t/ns`` (on
    broker-1) and ``u/ns`` (on broker2) form a group; each broker serves one namespace of it,
    so unloading would only bring the bundle back: nothing is unloaded (``AntiAffinity``)."""
    view = overloaded_cluster(shedder)
    if shedder == "UniformLoadShedder":  # its idle broker serves nothing: give it u/ns
        base = uniform_cluster([i * MB for i in range(1, 11)])
        base["broker2"] = replace(base["broker2"], bundles={f"u/ns/{FULL}": NamespaceBundleStats()})
        view = view_of(base)
    res = run_cycle(with_policies(view, group_doc("g", ["t/ns", "u/ns"])), shedder)
    assert [d for d in res.decisions if d.source_broker == "broker-1"] == []
    assert "AntiAffinity" in reasons(res)


def test_guard_never_unloads_a_heartbeat_bundle() -> None:
    """A heartbeat bundle has its own broker as the only candidate (``applyNamespacePolicies``
    for a heartbeat namespace), so the guard refuses it even with other brokers live."""
    hb = f"pulsar/use/broker-1:8080/{FULL}"
    view = view_of({"broker-1:8080": idle(hb), "broker-2:8080": idle()})
    decision = make_decision(
        cycle="c", kind=UNLOAD, bundle=hb, source_broker="broker-1:8080", reason="Overloaded",
        strategy="ThresholdShedder", inputs={}, decided_at_ms=NOW_MS,
    )  # fmt: skip
    kept, skips = guard_unloads([decision], view, config(), "ThresholdShedder")
    assert kept == [] and [s.reason for s in skips] == ["NamespacePolicies"]


# ----- TransferShedderTest ------------------------------------------------------------------


def setup_view(doc: dict) -> ClusterView:
    return with_policies(view_of(setup_brokers()), doc)


E_ON_BROKER5 = {
    "namespaceIsolationPolicies": isolation("e", ["my-tenant/my-namespaceE"], ["broker5"])
}


def test_bundles_with_isolation_policies_enabled() -> None:
    """TransferShedderTest.testBundlesWithIsolationPolicies, with
    ``loadBalancerSheddingBundlesWithPoliciesEnabled``: namespaceE may live only on broker5,
    so broker5's bundles cannot go to broker1; broker4's D1 goes there. With transfers off
    the same bundle is unloaded without a destination."""
    view = setup_view(E_ON_BROKER5)
    on = {"loadBalancerSheddingBundlesWithPoliciesEnabled": True, **HIT0}
    _, res = shed("TransferShedder", view, **on)
    assert moves(res) == {(b(4), D1, b(1))}
    assert {d.reason for d in res.decisions} == {"Overloaded"}
    _, res = shed("TransferShedder", view, loadBalancerTransferEnabled=False, **on)
    assert moves(res) == {(b(4), D1, None)}


@pytest.mark.parametrize("transfer", [True, False])
def test_bundles_with_isolation_policies_disabled(transfer: bool) -> None:
    """TransferShedderTest.testBundlesWithIsolationPolicies, knob off: every namespace has an
    isolation policy (Pulsar's mock answers ``areIsolationPoliciesPresent`` true for all), so
    no bundle is shed: ``NoBundles``, with transfers on and off."""
    doc = {"namespaceIsolationPolicies": isolation("all", ["my-tenant/.*"], ["broker.*"])}
    _, res = shed("TransferShedder", setup_view(doc), loadBalancerTransferEnabled=transfer, **HIT0)
    assert res.decisions == () and reasons(res)[-1] == "NoBundles"


def test_bundles_with_isolation_policies_knob_changes_decisions() -> None:
    """The knob acts: namespaceE may live on broker1 and broker5. On: E1 goes from broker5 to
    broker1 (allowed), and broker4's D1 to broker2 (broker1, a primary, is no longer shared).
    Off: E's bundles are not shed and nobody else may go to broker1, the min broker of every
    pair, so nothing moves; each max broker reports its two refused bundles."""
    doc = {
        "namespaceIsolationPolicies": isolation("e", ["my-tenant/my-namespaceE"], ["broker[15]"])
    }
    view = setup_view(doc)
    _, on = shed(
        "TransferShedder", view, loadBalancerSheddingBundlesWithPoliciesEnabled=True, **HIT0
    )
    assert moves(on) == {(b(5), E1, b(1)), (b(4), D1, b(2))}
    _, off = shed("TransferShedder", view, **HIT0)
    assert off.decisions == () and reasons(off)[-1] == "NoBundles"
    details = {s.broker: s.detail for s in off.skips if s.broker}
    assert details[b(5)] == "every bundle is under placement policies"  # left out of its top-K
    assert all("2 refused by placement policies" in details[b(n)] for n in (2, 3, 4))


ALL_NS = [f"my-tenant/my-namespace{x}" for x in "ABCDE"]


def test_bundles_with_anti_affinity_group_disabled() -> None:
    """TransferShedderTest.testBundlesWithAntiAffinityGroup, first part: every namespace is in
    an anti-affinity group and no destination is allowed -> nothing is shed (``NoBundles``).
    Restated with the knob off, which refuses every grouped bundle whatever the filter says."""
    _, res = shed("TransferShedder", setup_view(group_doc("g", ALL_NS)), **HIT0)
    assert res.decisions == () and reasons(res)[-1] == "NoBundles"


def test_bundles_with_anti_affinity_group_enabled() -> None:
    """TransferShedderTest.testBundlesWithAntiAffinityGroup, second part: only E1's move is
    allowed -> ``{broker5 -> broker1: E1}``. Pulsar's mocked filter clears the candidates of every
    other bundle; here namespaces B, C and D form a group served by broker2, broker3 and
    broker4, so D's and C's bundles may only go to brokers serving none of the group (broker1,
    broker5), not to broker2, their pair's min broker."""
    view = setup_view(group_doc("g", ALL_NS[1:4]))
    _, res = shed(
        "TransferShedder", view, loadBalancerSheddingBundlesWithPoliciesEnabled=True, **HIT0
    )
    assert moves(res) == {(b(5), E1, b(1))}
    assert {d.reason for d in res.decisions} == {"Overloaded"}


def test_bundles_with_anti_affinity_group_all_equal_enabled() -> None:
    """With the knob on and all five namespaces in one group, every broker serves one of them,
    so the filter keeps every broker and the cycle is the unpolicied one (``setupContext``)."""
    view = setup_view(group_doc("g", ALL_NS))
    _, plain = shed("TransferShedder", view_of(setup_brokers()), **HIT0)
    _, res = shed(
        "TransferShedder", view, loadBalancerSheddingBundlesWithPoliciesEnabled=True, **HIT0
    )
    assert moves(res) == moves(plain) == {(b(5), E1, b(1)), (b(4), D1, b(2))}


@pytest.mark.parametrize(
    ("isolated", "grouped", "knob", "expected"),
    [
        (True, True, True, True),
        (True, True, False, False),
        (True, False, True, True),
        (True, False, False, False),
        (False, True, True, True),
        (False, True, False, False),
        (False, False, True, True),
        (False, False, False, True),
    ],
)
def test_is_load_balancer_shedding_bundles_with_policies_enabled(
    isolated: bool, grouped: bool, knob: bool, expected: bool
) -> None:
    """TransferShedderTest.testIsLoadBalancerSheddingBundlesWithPoliciesEnabled: Pulsar's table
    of (isolation policy, anti-affinity group, knob) -> may be shed."""
    doc: dict = {}
    if isolated:
        doc["namespaceIsolationPolicies"] = isolation("p", ["my-tenant/my-namespaceD"], ["broker4"])
    if grouped:
        doc.update(group_doc("g", ["my-tenant/my-namespaceD"]))
    cfg = config(loadBalancerSheddingBundlesWithPoliciesEnabled=knob)
    guard = PolicyGuard(setup_view(doc), cfg)
    assert guard.shedding_with_policies_enabled(D1) is expected


def test_transfer_shedder_refuses_a_destination_the_policies_forbid() -> None:
    """``isTransferable`` for bundles under no policy: broker1, namespaceA's primary, is not a
    shared broker, so no other namespace's bundle may be moved onto it. It is every pair's min
    broker (Pulsar advances the min side only after a move), so nothing moves at all."""
    doc = {"namespaceIsolationPolicies": isolation("a", ["my-tenant/my-namespaceA"], ["broker1"])}
    _, res = shed("TransferShedder", setup_view(doc), **HIT0)
    assert res.decisions == () and reasons(res)[-1] == "NoBundles"
    _, plain = shed("TransferShedder", view_of(setup_brokers()), **HIT0)
    assert (b(5), E1, b(1)) in moves(plain)


# ----- TopKBundlesTest: bundles under policies in the top-K list -----------------------------

BUNDLE1 = "my-tenant/my-namespace1/0x00000000_0x0fffffff"
BUNDLE2 = "my-tenant/my-namespace2/0x00000000_0x0fffffff"
TOPK_ISOLATION = isolation(
    "policy",
    ["my-tenant/my-namespace1.*"],
    ["prod1-broker[1-3].messaging.use.example.com"],
    secondary=["prod1-broker.*.use.example.com"],
    min_limit=3,
)


def top_k(doc: dict, knob: bool) -> list[str]:
    """``TopKBundles.update(bundleStats, 2)`` of a broker serving bundle1 (500 msg/s in) and
    bundle2 (10000 msg/s in), as TransferShedder lists them."""
    rates = {
        BUNDLE1: NamespaceBundleStats(msg_rate_in=500),
        BUNDLE2: NamespaceBundleStats(msg_rate_in=10000),
    }
    view = with_policies(view_of({"b": Broker(0.5, rates)}), doc)
    guard = PolicyGuard(view, config(loadBalancerSheddingBundlesWithPoliciesEnabled=knob))
    excluded = None if guard.sheds_bundles_with_policies() else guard.has_policies
    return [name for name, _ in top_bundles(view, view.brokers["b"], 2, excluded=excluded)]


def test_top_k_isolation_policy() -> None:
    """TopKBundlesTest.testIsolationPolicy: namespace1 is isolated -> only bundle2 is listed."""
    assert top_k({"namespaceIsolationPolicies": TOPK_ISOLATION}, False) == [BUNDLE2]


def test_top_k_anti_affinity_group_policy() -> None:
    """TopKBundlesTest.testAntiAffinityGroupPolicy: namespace2 is in a group -> only bundle1."""
    doc = group_doc("namespaceAntiAffinityGroup", ["my-tenant/my-namespace2"])
    assert top_k(doc, False) == [BUNDLE1]


def test_top_k_load_balancer_shedding_bundles_with_policies_enabled_config() -> None:
    """TopKBundlesTest.testLoadBalancerSheddingBundlesWithPoliciesEnabledConfig: both under
    policies; knob on -> both listed, smallest first; off -> none."""
    doc = group_doc(
        "namespaceAntiAffinityGroup",
        ["my-tenant/my-namespace2"],
        namespaceIsolationPolicies=TOPK_ISOLATION,
    )
    assert top_k(doc, True) == [BUNDLE1, BUNDLE2]
    assert top_k(doc, False) == []
