"""A placement that finds no eligible broker is counted by kind and says why: the metric's
label is bounded (the reason's text names namespaces), the reason reaches the caller."""

from __future__ import annotations

from dataclasses import replace

from controller.placement import place
from infra import metrics
from loadbalance.config import LoadBalancerConfig
from loadbalance.placement.policies import PlacementPolicies
from metadata_store.ownership_memory import MemoryStore
from tests.conformance.pulsar_fixtures import NOW_MS, view_of
from tests.conformance.test_shedding_policies import isolation
from tests.conformance.test_transfer_shedder import setup_brokers

BUNDLE = "my-tenant/my-namespaceE/0x00000000_0xffffffff"


def _refused(kind: str) -> float:
    return metrics.LOOKUPS_REFUSED.labels(reason=kind)._value.get()


def test_an_isolated_namespace_with_no_live_primary_is_refused_counted_and_explained() -> None:
    doc = {"namespaceIsolationPolicies": isolation("e", ["my-tenant/.*"], ["nowhere-[0-9]"])}
    view = replace(view_of(setup_brokers()), policies=PlacementPolicies.from_admin_json(doc))
    store = MemoryStore()
    store.create_namespace("my-tenant/my-namespaceE", 1)
    for broker in view.brokers:
        store.register_broker(broker, NOW_MS, 60_000)
    before = _refused("isolation")
    placed = place(store, BUNDLE, view, LoadBalancerConfig(), NOW_MS)
    assert placed.lease is None
    assert "isolated by policy 'e'" in placed.refusal
    assert _refused("isolation") == before + 1
    # without the policy the same lookup is placed, and nothing more is counted
    placed = place(store, BUNDLE, view_of(setup_brokers()), LoadBalancerConfig(), NOW_MS)
    assert placed.lease is not None and placed.refusal == ""
    assert _refused("isolation") == before + 1


def test_refusal_kinds_are_a_closed_set() -> None:
    assert metrics.refusal_kind("namespace a/b is isolated by policy 'p' and no ...") == "isolation"
    assert metrics.refusal_kind("heartbeat bundle of broker h:8080, which is not live") == (
        "heartbeat"
    )
    assert metrics.refusal_kind("no live broker to place on") == "no_live_broker"
    assert metrics.refusal_kind("the placement strategy chose no broker") == "strategy"
    assert metrics.refusal_kind("something new") == "other"
    assert {metrics.refusal_kind(t) for t in ("x", "", "strategy")} <= set(metrics.REFUSAL_REASONS)
