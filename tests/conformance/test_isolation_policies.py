"""Namespace isolation restated from Pulsar's tests: ``ModularLoadManagerImplTest``
(``testNamespaceIsolationPoliciesForPrimaryAndSecondaryBrokers``, which calls
``LoadManagerShared.applyNamespacePolicies``) and the extensible manager's
``BrokerIsolationPoliciesFilterTest``; then the same rules through a lookup
(``BrokerSelector.select``), where no eligible broker means no owner."""

from __future__ import annotations

import pytest

from loadbalance.placement.isolation import namespace_candidates
from tests.conformance.placement_rules_fixtures import FULL, isolation, policies, selector, view

NS = "my-tenant/my-ns"
B1, B2, SHARED = "prefix0:8080", "prefix1:8080", "broker3:8080"


@pytest.mark.parametrize(
    ("min_limit", "available", "expected"),
    [
        # (1) primary=broker1, secondary=broker2, min_limit=1
        (1, [SHARED, B1, B2], [B1]),
        (1, [SHARED, B2], [B2]),
        (1, [SHARED], []),
        # (2) the same policy with min_limit=2: primary + secondary while one primary is up
        (2, [SHARED, B1, B2], [B1, B2]),
        (2, [SHARED, B2], [B2]),
        (2, [SHARED], []),
    ],
)
def test_namespace_isolation_policies_for_primary_and_secondary_brokers(
    min_limit: int, available: list[str], expected: list[str]
) -> None:
    """ModularLoadManagerImplTest.testNamespaceIsolationPoliciesForPrimaryAndSecondaryBrokers:
    regexes match the broker's host without the port; a shared broker never takes an isolated
    namespace."""
    p = policies(isolation([f"{NS}.*"], ["prefix0"], ["prefix1"], min_limit=min_limit))
    assert namespace_candidates(NS, available, p, {}) == sorted(expected)


def test_isolation_filter_keeps_primaries_then_fails_over_to_secondaries() -> None:
    """BrokerIsolationPoliciesFilterTest.testFilterWithNamespaceIsolationPoliciesForPrimaryAndSecondaryBrokers:
    primary broker1, secondary broker2, min_limit 1 over brokers 1-3; with broker1 gone the
    secondary takes over; a namespace under no policy gets only the shared broker."""
    p = policies(isolation(["my-tenant/my-ns.*"], ["broker1"], ["broker2"]))
    all3 = ["broker1:8080", "broker2:8080", "broker3:8080"]
    assert namespace_candidates(NS, all3, p, {}) == ["broker1:8080"]
    assert namespace_candidates(NS, all3[1:], p, {}) == ["broker2:8080"]
    assert namespace_candidates("my-tenant/other", all3, p, {}) == ["broker3:8080"]


def test_no_isolation_policy_means_every_broker_is_shared() -> None:
    """ModularLoadManagerImplTest.testLoadSheddingWithNamespaceIsolationPolicies (test1): with
    no policy, every broker may take the namespace."""
    assert namespace_candidates(NS, [B2, B1], policies({}), {}) == [B1, B2]


def test_busy_primaries_stop_counting_below_the_usage_threshold() -> None:
    """MinAvailablePolicy.isBrokerAvailable: a primary at or above ``usage_threshold`` does not
    count toward ``min_limit``, so the secondaries join (100 means every live primary counts)."""
    p = policies(isolation([f"{NS}.*"], ["prefix0"], ["prefix1"], usage_threshold=80))
    assert namespace_candidates(NS, [B1, B2], p, {B1: 79.0}) == [B1]
    assert namespace_candidates(NS, [B1, B2], p, {B1: 80.0}) == [B1, B2]
    p100 = policies(isolation([f"{NS}.*"], ["prefix0"], ["prefix1"], usage_threshold=100))
    assert namespace_candidates(NS, [B1, B2], p100, {B1: 100.0}) == [B1]


def test_lookup_places_an_isolated_namespace_only_on_its_primaries() -> None:
    """Modular selectBroker: applyNamespacePolicies first; the strategy never sees another
    broker, over many lookups and seeds."""
    doc = isolation([f"{NS}.*"], ["prefix0"], ["prefix1"])
    for seed in range(10):
        sel = selector(view([B1, B2, SHARED], doc), seed)
        owners = {sel.select(f"{NS}/0x{i:08x}_0x{i + 1:08x}") for i in range(20)}
        assert owners == {B1}
        other = {sel.select(f"my-tenant/free/0x{i:08x}_0x{i + 1:08x}") for i in range(20)}
        assert other == {SHARED}


def test_lookup_refuses_when_no_broker_is_eligible_and_says_why() -> None:
    """applyNamespacePolicies leaves nothing (only a shared broker is live): Pulsar's lookup
    fails; it never falls back to every broker."""
    doc = isolation([f"{NS}.*"], ["prefix0"], ["prefix1"])
    sel = selector(view([SHARED], doc))
    assert sel.select(f"{NS}/{FULL}") is None
    assert "isolated by policy 'policy'" in sel.last_reason
    assert sel.candidates(f"{NS}/{FULL}") == []


def test_overload_recheck_stays_inside_the_isolation_set() -> None:
    """selectBroker's re-run on an overloaded choice re-applies applyNamespacePolicies: the
    only primary is overloaded and a shared broker idle, and the primary is still chosen."""
    from tests.conformance.pulsar_fixtures import Broker

    doc = isolation([f"{NS}.*"], ["prefix0"], [])
    v = view({B1: Broker(load=0.99), SHARED: Broker(load=0.01)}, doc)
    assert selector(v).select(f"{NS}/{FULL}") == B1
