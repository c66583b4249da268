"""ProjectedUsageShedder picks its own destinations: under placement policies it balances each
isolation pool against its own mean and sends a bundle only where its policies allow, counting
the moves it already planned in the same cycle (``loadbalance.strategies.policy_moves``)."""

from __future__ import annotations

from dataclasses import replace

from loadbalance.config import LoadBalancerConfig
from loadbalance.placement.policies import PlacementPolicies
from loadbalance.shedding.policy_guards import PolicyGuard
from loadbalance.strategies.policy_moves import PolicyMoves
from loadbalance.view import ClusterView
from tests.unit.test_shed_to_band import _broker, _shed

Q = ("0x00000000_0x40000000", "0x40000000_0x80000000", "0x80000000_0xc0000000")
ISOLATED = {
    "namespaceIsolationPolicies": {
        "pool": {"namespaces": ["iso/.*"], "primary": ["iso-[01]"], "secondary": []}
    }
}


def _with(view: ClusterView, doc: dict) -> ClusterView:
    return replace(view, policies=PlacementPolicies.from_admin_json(doc))


def _pooled_view() -> ClusterView:
    """iso-0 carries the isolated tenant (8000), iso-1 a little of it (500); the shared
    brokers sit at 100 and 3000. The idlest broker, sh-0, may never take an isolated bundle."""
    view = ClusterView(
        brokers={
            "iso-0": _broker("iso-0", {f"iso/ns/{Q[0]}": 4000.0, f"iso/ns/{Q[1]}": 4000.0}),
            "iso-1": _broker("iso-1", {f"iso/ns/{Q[2]}": 500.0}),
            "sh-0": _broker("sh-0", {f"pub/ns/{Q[0]}": 100.0}),
            "sh-1": _broker("sh-1", {f"pub/ns/{Q[1]}": 1500.0, f"pub/ns/{Q[2]}": 1500.0}),
        },
        bundle_data={},
    )
    return _with(view, ISOLATED)


def test_each_isolation_pool_is_balanced_inside_itself() -> None:
    view = _pooled_view()
    res = _shed(view)
    moves = {d.bundle: (d.source_broker, d.destination_broker) for d in res.decisions}
    assert moves[f"iso/ns/{Q[0]}"] == ("iso-0", "iso-1") or moves[f"iso/ns/{Q[1]}"] == (
        "iso-0",
        "iso-1",
    )
    assert any(d.source_broker == "sh-1" and d.destination_broker == "sh-0" for d in res.decisions)
    guard = PolicyGuard(view, LoadBalancerConfig())
    for d in res.decisions:
        assert d.destination_broker in guard.destinations(d.bundle), d


def test_pools_group_brokers_by_the_policies_that_name_them() -> None:
    moves = PolicyMoves(_pooled_view(), LoadBalancerConfig())
    assert moves.pools(["sh-1", "iso-1", "sh-0", "iso-0"]) == [["iso-0", "iso-1"], ["sh-0", "sh-1"]]


def _group_view() -> ClusterView:
    """Namespaces g/a, g/b and g/c in anti-affinity group G, all on ``h``; ``x`` and ``y``
    serve none of the group."""
    view = ClusterView(
        brokers={
            "h": _broker("h", {f"g/a/{Q[0]}": 100.0, f"g/b/{Q[0]}": 100.0, f"g/c/{Q[0]}": 100.0}),
            "x": _broker("x", {f"p/q/{Q[0]}": 100.0}),
            "y": _broker("y", {f"p/q/{Q[1]}": 100.0}),
        },
        bundle_data={},
    )
    doc = {"localPolicies": {ns: {"namespaceAntiAffinityGroup": "G"} for ns in ("g/a", "g/b")}}
    doc["localPolicies"]["g/c"] = {"namespaceAntiAffinityGroup": "G"}
    return _with(view, doc)


def test_a_plan_counts_its_own_moves_of_an_anti_affinity_group() -> None:
    moves = PolicyMoves(_group_view(), LoadBalancerConfig())
    a, b = f"g/a/{Q[0]}", f"g/b/{Q[0]}"
    assert moves.allows(a, "h", "x") and moves.allows(b, "h", "x")
    moves.moved(a, "h", "x")
    # x now serves g/a: g/b may go only to y, the broker serving none of the group
    assert not moves.allows(b, "h", "x")
    assert moves.allows(b, "h", "y")
    assert not moves.allows(b, "h", "h")


def test_a_heartbeat_bundle_is_never_a_move() -> None:
    hb = f"pulsar/h:8080/{Q[0]}"
    view = _with(
        ClusterView(
            brokers={"h:8080": _broker("h:8080", {hb: 100.0}), "x": _broker("x", {})},
            bundle_data={},
        ),
        {"localPolicies": {"g/a": {"namespaceAntiAffinityGroup": "G"}}},
    )
    assert not PolicyMoves(view, LoadBalancerConfig()).allows(hb, "h:8080", "x")
