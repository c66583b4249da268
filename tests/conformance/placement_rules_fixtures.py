"""Builders for the placement-rule cases restated from Pulsar's tests: policies in Pulsar's
admin JSON, a view of idle brokers carrying them, and one lookup through ``BrokerSelector``."""

from __future__ import annotations

import random
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from loadbalance.config import LoadBalancerConfig
from loadbalance.placement.pipeline import BrokerSelector
from loadbalance.placement.policies import PlacementPolicies
from loadbalance.view import ClusterView
from tests.conformance.pulsar_fixtures import Broker, view_of

FULL = "0x00000000_0xffffffff"


def isolation(
    namespaces: list[str],
    primary: list[str],
    secondary: list[str],
    *,
    min_limit: int = 1,
    usage_threshold: int = 100,
    name: str = "policy",
) -> dict[str, Any]:
    """A ``namespaceIsolationPolicies`` document with one ``NamespaceIsolationData``."""
    return {
        "namespaceIsolationPolicies": {
            name: {
                "namespaces": namespaces,
                "primary": primary,
                "secondary": secondary,
                "auto_failover_policy": {
                    "policy_type": "min_available",
                    "parameters": {
                        "min_limit": str(min_limit),
                        "usage_threshold": str(usage_threshold),
                    },
                },
            }
        }
    }


def policies(doc: dict[str, Any]) -> PlacementPolicies:
    return PlacementPolicies.from_admin_json(doc)


def view(
    brokers: list[str] | dict[str, Broker],
    doc: dict[str, Any] | None = None,
    *,
    versions: dict[str, str] | None = None,
) -> ClusterView:
    """Idle brokers (or the given ones) with the policies ``doc`` and report versions."""
    specs = brokers if isinstance(brokers, dict) else {b: Broker(load=0.1) for b in brokers}
    v = view_of(specs)
    if versions:
        v = replace(
            v,
            brokers=MappingProxyType(
                {
                    n: replace(b, report=replace(b.report, broker_version=versions.get(n, "")))
                    for n, b in v.brokers.items()
                }
            ),
        )
    return replace(v, policies=policies(doc or {}))


def selector(v: ClusterView, seed: int = 0, **knobs: Any) -> BrokerSelector:
    return BrokerSelector(v, LoadBalancerConfig(**knobs), random.Random(seed))
