"""Anti-affinity groups restated from Pulsar's ``AntiAffinityNamespaceGroupTest`` (modular:
``LoadManagerShared.filterAntiAffinityGroupOwnedBrokers`` and
``shouldAntiAffinityNamespaceUnload``) and the extensible manager's
``AntiAffinityGroupPolicyFilterTest``; then through lookups (``BrokerSelector``), where each
placement counts for the next one."""

from __future__ import annotations

from loadbalance.placement.anti_affinity import (
    filter_anti_affinity_group_owned_brokers,
    should_anti_affinity_namespace_unload,
)
from tests.conformance.placement_rules_fixtures import FULL, policies, selector, view


def group(namespaces: list[str], name: str, domains: dict[str, list[str]] | None = None) -> dict:
    doc: dict = {"localPolicies": {ns: {"namespaceAntiAffinityGroup": name} for ns in namespaces}}
    if domains:
        doc["failureDomains"] = {d: {"brokers": b} for d, b in domains.items()}
    return doc


NS = [f"my-tenant/my-ns{i}" for i in range(5)]


def test_anti_affinity_namespace_filtering_with_domain() -> None:
    """AntiAffinityNamespaceGroupTest.testAntiAffinityNamespaceFilteringWithDomain: domain-0 =
    b0, b1 and domain-1 = b2, b3; ns0 -> b0, then ns1 may use only domain-1, ns2 only b1 or b3,
    ns3 only b3, and ns4 every broker again."""
    domains = {"domain-0": ["b0", "b1"], "domain-1": ["b2", "b3"]}
    p = policies(group(NS, "my-antiaffinity", domains))
    brokers = ["b0", "b1", "b2", "b3"]
    owned: dict[str, list[str]] = {}

    def candidates(i: int) -> list[str]:
        return filter_anti_affinity_group_owned_brokers(
            brokers, f"{NS[i]}/{FULL}", p, owned, domains_enabled=True
        )

    assert candidates(0) == brokers
    owned["b0"] = [f"{NS[0]}/{FULL}"]
    assert candidates(1) == ["b2", "b3"]
    owned["b2"] = [f"{NS[1]}/{FULL}"]
    assert candidates(2) == ["b1", "b3"]
    owned["b1"] = [f"{NS[2]}/{FULL}"]
    assert candidates(3) == ["b3"]
    owned["b3"] = [f"{NS[3]}/{FULL}"]
    assert candidates(4) == brokers


def test_anti_affinity_namespace_filtering_without_domain() -> None:
    """AntiAffinityNamespaceGroupTest.testAntiAffinityNamespaceFilteringWithoutDomain: three
    brokers; each group namespace placed removes its broker until all own one. Failure domains
    defined but not enabled change nothing."""
    p = policies(group(NS, "my-antiaffinity-wo-domain", {"d": ["broker-0", "broker-1"]}))
    brokers = ["broker-0", "broker-1", "broker-2"]
    owned: dict[str, list[str]] = {}

    def candidates(i: int) -> list[str]:
        return filter_anti_affinity_group_owned_brokers(
            brokers, f"{NS[i]}/{FULL}", p, owned, domains_enabled=False
        )

    assert candidates(0) == brokers
    owned["broker-0"] = [f"{NS[0]}/{FULL}"]
    assert candidates(1) == ["broker-1", "broker-2"]
    owned["broker-1"] = [f"{NS[1]}/{FULL}"]
    assert candidates(2) == ["broker-2"]
    owned["broker-2"] = [f"{NS[2]}/{FULL}"]
    assert candidates(3) == brokers


def test_namespace_in_no_group_keeps_every_candidate() -> None:
    """getAntiAffinityNamespaceOwnedBrokers returns null for a namespace without a group."""
    p = policies(group(NS[:2], "g"))
    owned = {"a": [f"{NS[0]}/{FULL}"]}
    got = filter_anti_affinity_group_owned_brokers(
        ["a", "b"], f"t/free/{FULL}", p, owned, domains_enabled=False
    )
    assert got == ["a", "b"]


def test_groups_compare_without_case() -> None:
    """getAntiAffinityNamespaceOwnedBrokers: ``equalsIgnoreCase`` on the group names."""
    p = policies(
        {
            "localPolicies": {
                NS[0]: {"namespaceAntiAffinityGroup": "Grp"},
                NS[1]: {"namespaceAntiAffinityGroup": "grp"},
            }
        }
    )
    owned = {"a": [f"{NS[0]}/{FULL}"]}
    got = filter_anti_affinity_group_owned_brokers(
        ["a", "b"], f"{NS[1]}/{FULL}", p, owned, domains_enabled=False
    )
    assert got == ["b"]


def test_load_shedding_util_with_anti_affinity_namespace() -> None:
    """AntiAffinityNamespaceGroupTest.testLoadSheddingUtilWithAntiAffinityNamespace: broker-0
    may unload ns0 while another broker owns no group namespace; once all three own one, the
    bundle would come back, so it may not."""
    p = policies(group(NS, "my-antiaffinity-load-shedding-util"))
    brokers = ["broker-0", "broker-1", "broker-2"]
    owned = {"broker-0": [f"{NS[0]}/{FULL}"]}

    def should() -> bool:
        return should_anti_affinity_namespace_unload(
            NS[0], "broker-0", p, owned, brokers, domains_enabled=False
        )

    assert should() is True
    owned["broker-1"] = [f"{NS[1]}/{FULL}"]
    assert should() is True
    owned["broker-2"] = [f"{NS[2]}/{FULL}"]
    assert should() is False


def test_unload_guard_allows_a_namespace_in_no_group() -> None:
    """ModularLoadManagerImpl.shouldAntiAffinityNamespaceUnload: no group -> true."""
    owned = {"a": [f"t/free/{FULL}"]}
    assert should_anti_affinity_namespace_unload(
        "t/free", "a", policies({}), owned, ["a"], domains_enabled=False
    )


def test_anti_affinity_group_policy_filter() -> None:
    """AntiAffinityGroupPolicyFilterTest.testFilter: the group's other namespaces are on
    broker1 and broker2 (one assigned, not yet reported); brokers 3 and 4 remain."""
    p = policies(group(NS[:3], "my-anti-affinity-filter"))
    owned = {"broker1": [f"{NS[1]}/{FULL}"], "broker2": [f"{NS[2]}/0x00000000_0x80000000"]}
    got = filter_anti_affinity_group_owned_brokers(
        ["broker1", "broker2", "broker3", "broker4"],
        f"{NS[0]}/{FULL}",
        p,
        owned,
        domains_enabled=False,
    )
    assert got == ["broker3", "broker4"]


def test_broker_selection_for_anti_affinity_group() -> None:
    """AntiAffinityNamespaceGroupTest.testBrokerSelectionForAntiAffinityGroup: two brokers in
    two failure domains, two group namespaces looked up in turn: different brokers, under any
    seed (the first placement counts as a preallocation for the second)."""
    doc = group(NS[:2], "group", {"domain1": ["broker1"], "domain2": ["broker2"]})
    for seed in range(20):
        sel = selector(view(["broker1", "broker2"], doc), seed, failureDomainsEnabled=True)
        first = sel.select(f"{NS[0]}/{FULL}")
        second = sel.select(f"{NS[1]}/{FULL}")
        assert {first, second} == {"broker1", "broker2"}, seed


def test_lookups_spread_a_group_over_failure_domains() -> None:
    """With failure domains on, four group namespaces over two domains of two brokers each:
    both domains get two, every broker one (Pulsar's javadoc example's rule)."""
    doc = group(NS[:4], "g", {"d1": ["b1", "b2"], "d2": ["b3", "b4"]})
    for seed in range(10):
        sel = selector(view(["b1", "b2", "b3", "b4"], doc), seed, failureDomainsEnabled=True)
        owners = [sel.select(f"{ns}/{FULL}") for ns in NS[:4]]
        assert sorted(owners) == ["b1", "b2", "b3", "b4"], seed
        assert {owners[0], owners[1]} & {"b1", "b2"} and {owners[0], owners[1]} & {"b3", "b4"}
