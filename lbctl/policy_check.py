"""Namespaces that the placement policies leave with no eligible live broker.

Pulsar accepts an isolation policy whatever brokers are live, and so does ``lbctl
ns-isolation-policy set``: the brokers a policy names may come later. But while no live broker
is eligible, every lookup of the namespace's free bundles is refused, so ``lbctl health`` and
``lbctl monitor`` name each such namespace and the policy responsible. The check is Pulsar's
own filter (``loadbalance.placement.isolation.namespace_candidates``) over the registry's live
brokers, with each broker's usage from the load snapshot for the failover threshold.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from loadbalance.placement.isolation import isolation_refusal, namespace_candidates
from loadbalance.placement.policies import PlacementPolicies
from metadata_store.ownership_redis import RedisStore

__all__ = ["policy_problems", "stranded_namespaces"]


def stranded_namespaces(
    namespaces: Collection[str],
    live: Collection[str],
    policies: PlacementPolicies,
    usage_percent: Mapping[str, float],
) -> list[str]:
    """One line per namespace whose policies leave no live broker eligible, naming the policy.

    Nothing when no broker is live at all (that is no policy's doing) or no isolation policy
    exists (every broker is then shared)."""
    if not live or not policies.isolation:
        return []
    return [
        isolation_refusal(ns, policies)
        for ns in sorted(namespaces)
        if not namespace_candidates(ns, live, policies, usage_percent)
    ]


def policy_problems(
    store: RedisStore, live: Collection[str], usage_percent: Mapping[str, float]
) -> list[str]:
    """``stranded_namespaces`` over the namespaces and policies ``store`` holds."""
    policies = store.placement_policies.read()
    if not policies.isolation:
        return []
    return stranded_namespaces(store.list_namespaces(), live, policies, usage_percent)
