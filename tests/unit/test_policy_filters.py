"""``allowed_destinations`` (the rules a shedder's destination must pass) and the view keeping
its policies through every rebuild."""

from __future__ import annotations

from dataclasses import replace

from loadbalance.config import LoadBalancerConfig
from loadbalance.placement.policy_filters import PolicyFilter, allowed_destinations
from loadbalance.view import LoadState, build_view, with_preallocated
from tests.conformance.placement_rules_fixtures import FULL, isolation, policies, view

CFG = LoadBalancerConfig()


def test_destinations_of_an_isolated_bundle_are_its_primaries() -> None:
    v = view(["a:1", "b:1", "c:1"], isolation(["t/iso"], ["a"], ["b"]))
    assert allowed_destinations(f"t/iso/{FULL}", ["b:1", "c:1", "a:1"], v, CFG) == ["a:1"]
    assert allowed_destinations(f"t/iso/{FULL}", ["b:1", "c:1"], v, CFG) == ["b:1"]
    assert allowed_destinations(f"t/iso/{FULL}", ["c:1"], v, CFG) == []
    assert allowed_destinations(f"t/free/{FULL}", ["a:1", "b:1", "c:1"], v, CFG) == ["c:1"]


def test_a_heartbeat_bundle_has_no_destination_but_its_own_broker() -> None:
    v = view(["a:1", "b:1"])
    assert allowed_destinations(f"pulsar/use/a:1/{FULL}", ["b:1"], v, CFG) == []
    assert allowed_destinations(f"pulsar/use/a:1/{FULL}", ["a:1", "b:1"], v, CFG) == ["a:1"]


def test_anti_affinity_counts_the_views_preallocations() -> None:
    doc = {"localPolicies": {f"t/n{i}": {"namespaceAntiAffinityGroup": "g"} for i in range(2)}}
    v = view(["a", "b"], doc)
    v = with_preallocated(v, {"a": {f"t/n0/{FULL}": v.bundle(f"t/n0/{FULL}")}})
    assert allowed_destinations(f"t/n1/{FULL}", ["a", "b"], v, CFG) == ["b"]


def test_no_policy_restricts_nothing() -> None:
    v = view(["a", "b"])
    rules = PolicyFilter(v, CFG)
    assert not rules.restricts(f"t/ns/{FULL}")
    assert rules.restricts(f"pulsar/use/a:1/{FULL}")
    assert PolicyFilter(v, LoadBalancerConfig(preferLaterVersions=True)).restricts(f"t/ns/{FULL}")


def test_views_keep_their_policies_through_every_rebuild() -> None:
    p = policies(isolation(["t/iso"], ["a"], []))
    v = build_view(LoadState(), policies=p)
    assert v.policies is p
    assert with_preallocated(v, {}).policies is p
    assert replace(v, recently_unloaded={}).policies is p
    assert build_view(LoadState()).policies.empty
