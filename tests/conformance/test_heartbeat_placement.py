"""Heartbeat and SLA-monitor lookups restated from the extensible manager
(``ExtensibleLoadManagerImpl.assign`` -> ``NamespaceService.getHeartbeatOrSLAMonitorBrokerId``,
Pulsar PR 21213, ``ExtensibleLoadManagerImplTest`` heartbeat cases): such a bundle goes to the
broker its namespace names, whatever the load, the filters or the policies say."""

from __future__ import annotations

from loadbalance.placement.heartbeat import (
    heartbeat_broker_of,
    is_heartbeat_namespace,
    pinned_broker,
)
from tests.conformance.placement_rules_fixtures import FULL, isolation, selector, view
from tests.conformance.pulsar_fixtures import Broker

B1, B2 = "broker-1:8080", "broker-2:8080"


def test_patterns_match_the_three_namespaces() -> None:
    """NamespaceService.HEARTBEAT_NAMESPACE_PATTERN(_V2) and SLA_NAMESPACE_PATTERN."""
    assert heartbeat_broker_of(f"pulsar/use/{B1}/{FULL}", [B1, B2]) == B1
    assert heartbeat_broker_of(f"pulsar/{B2}/{FULL}", [B1, B2]) == B2
    assert heartbeat_broker_of(f"sla-monitor/use/{B1}", [B1, B2]) == B1
    assert is_heartbeat_namespace("pulsar/use/broker-1:8080")
    assert not is_heartbeat_namespace("pulsar/system")
    assert not is_heartbeat_namespace("pulsar/use/broker-1")  # no port: not Pulsar's pattern
    assert heartbeat_broker_of(f"public/default/{FULL}", [B1]) is None


def test_heartbeat_lookup_returns_its_own_broker_whatever_the_load() -> None:
    """ExtensibleLoadManagerImplTest (heartbeat namespace lookups): broker-1 is the busier
    one, yet its heartbeat and SLA bundles go to it, and broker-2's to broker-2, under every
    seed and even when broker-1 is excluded (an unload from it)."""
    v = view({B1: Broker(load=0.99), B2: Broker(load=0.01)})
    for seed in range(10):
        sel = selector(v, seed)
        assert sel.select(f"pulsar/use/{B1}/{FULL}") == B1
        assert sel.select(f"pulsar/{B1}/{FULL}") == B1
        assert sel.select(f"sla-monitor/use/{B1}/{FULL}") == B1
        assert sel.select(f"pulsar/use/{B2}/{FULL}") == B2
        assert sel.select(f"pulsar/use/{B1}/0x00000000_0x80000000", exclude=[B1]) == B1


def test_heartbeat_pinning_wins_over_isolation() -> None:
    """Pinning runs before any filter: an isolation policy covering every namespace and naming
    only broker-2 does not move broker-1's heartbeat bundle."""
    doc = isolation([".*"], ["broker-2"], [])
    sel = selector(view([B1, B2], doc))
    assert sel.select(f"pulsar/use/{B1}/{FULL}") == B1
    assert sel.select(f"public/default/{FULL}") == B2


def test_dead_brokers_heartbeat_has_no_owner_but_sla_is_placed() -> None:
    """getHeartbeatOrSLAMonitorBrokerId: the heartbeat names its broker whatever its state (no
    other broker may own it); the SLA-monitor namespace only while its broker is active, else
    it is placed like any other bundle."""
    sel = selector(view([B2]))
    assert sel.select(f"pulsar/use/{B1}/{FULL}") is None
    assert "not live" in sel.last_reason
    assert sel.select(f"sla-monitor/use/{B1}/{FULL}") == B2
    assert pinned_broker(f"sla-monitor/use/{B1}/{FULL}", [B2]) is None
