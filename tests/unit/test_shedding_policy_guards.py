"""The shedding side of the placement policies, beyond what Pulsar's tests restate
(``tests/conformance/test_shedding_policies.py``): the guards in a cycle for our own shedder,
the knob through a whole cycle, and system bundles under ProjectedUsageShedder."""

from __future__ import annotations

from dataclasses import replace

from loadbalance.config import LoadBalancerConfig
from loadbalance.cycle import CycleState, step
from loadbalance.decisions import TRANSFER, make_decision
from loadbalance.placement.policies import PlacementPolicies
from loadbalance.shedding.policy_guards import PolicyGuard, guard_unloads
from loadbalance.view import ClusterView
from tests.conformance.pulsar_fixtures import NOW_MS, view_of
from tests.conformance.test_shedding_policies import E1, HIT0, b, isolation, setup_brokers
from tests.unit.test_shed_to_band import _broker, _shed

HB = "pulsar/use/hot:8080/0x00000000_0xffffffff"
SLA = "sla-monitor/use/hot:8080/0x00000000_0xffffffff"


def test_projected_usage_shedder_never_moves_heartbeat_or_sla_bundles() -> None:
    """``hot`` serves its heartbeat and SLA-monitor bundles and one ordinary bundle, all equally
    busy, ``idle`` almost nothing: only the ordinary bundle may move."""
    ordinary = "t/ns/0x00000000_0x80000000"
    view = ClusterView(
        brokers={
            "hot:8080": _broker("hot:8080", {HB: 4_000.0, SLA: 4_000.0, ordinary: 4_000.0}),
            "idle:8080": _broker("idle:8080", {"t/ns/0x80000000_0xffffffff": 100.0}),
        },
        bundle_data={},
    )
    res = _shed(view)
    assert [d.bundle for d in res.decisions] == [ordinary]


def transfer_to(dest: str):
    return make_decision(
        cycle="c", kind=TRANSFER, bundle=E1, source_broker=b(5), destination_broker=dest,
        reason="Overloaded", strategy="ProjectedUsageShedder", inputs={}, decided_at_ms=NOW_MS,
    )  # fmt: skip


def test_a_shedders_own_destination_must_be_allowed() -> None:
    """A transfer whose shedder chose the destination goes ahead only to a broker the
    bundle's policies allow (namespaceE: primaries broker1 and broker5)."""
    doc = {
        "namespaceIsolationPolicies": isolation("e", ["my-tenant/my-namespaceE"], ["broker[15]"])
    }
    view = replace(view_of(setup_brokers()), policies=PlacementPolicies.from_admin_json(doc))
    cfg = LoadBalancerConfig()
    kept, skips = guard_unloads([transfer_to(b(2)), transfer_to(b(1))], view, cfg, "P")
    assert [d.destination_broker for d in kept] == [b(1)]
    assert [(s.policy, s.reason, s.bundle) for s in skips] == [("P", "NamespacePolicies", E1)]


def test_without_policies_every_bundle_may_move_anywhere() -> None:
    """No policy: the guards pass every selected bundle and every broker is a destination."""
    view = view_of(setup_brokers())
    guard = PolicyGuard(view, LoadBalancerConfig())
    assert guard.should_namespace_policies_unload(E1, b(5))
    assert guard.should_anti_affinity_namespace_unload(E1, b(5))
    assert guard.destinations(E1) == frozenset(view.brokers)
    assert guard.is_transferable(E1, b(5), b(1), transfer=True)


def test_the_knob_acts_through_a_cycle() -> None:
    """``loadBalancerSheddingBundlesWithPoliciesEnabled`` read where the cycle runs
    TransferShedder: namespaceE (isolated on broker1 and broker5) moves only with it on."""
    doc = {
        "namespaceIsolationPolicies": isolation("e", ["my-tenant/my-namespaceE"], ["broker[15]"])
    }
    view = replace(view_of(setup_brokers()), policies=PlacementPolicies.from_admin_json(doc))

    def bundles(knob: bool) -> set[str]:
        cfg = LoadBalancerConfig(
            loadBalancerLoadSheddingStrategy="TransferShedder",
            loadBalancerSheddingBundlesWithPoliciesEnabled=knob,
            **HIT0,
        )
        _, res = step(CycleState(), view, cfg, now_ms=NOW_MS, cycle="c")
        return {d.bundle for d in res.decisions}

    assert E1 in bundles(True)
    assert E1 not in bundles(False)
