"""Anti-affinity groups: spread the namespaces of one group over brokers and failure domains.

An operator puts namespaces in a group (``namespaces set-anti-affinity-group``) so that their
bundles do not share a broker (replicas of one service, say), and with
``failureDomainsEnabled`` not even a failure domain (``clusters create-failure-domain``).
Pulsar's ``LoadManagerShared``:

* ``getAntiAffinityNamespaceOwnedBrokers``: broker -> how many namespaces of the bundle's
  group it serves (a namespace counts once per broker however many of its bundles are there;
  preallocated bundles count, they are in ``brokerToNamespaceToBundleRange``). Groups compare
  without regard to case (``equalsIgnoreCase``).
* ``filterAntiAffinityGroupOwnedBrokers``: with failure domains on, keep only the candidates in
  the domains whose candidates serve the fewest group namespaces in total (a broker in no
  domain is in the domain ``default``); then keep the candidates serving the fewest group
  namespaces. A namespace in no group keeps every candidate. The filter never empties a
  non-empty candidate set.
* ``shouldAntiAffinityNamespaceUnload``: shedding a group namespace's bundle helps only if some
  candidate serves fewer group namespaces than the current broker, or not every candidate
  serves the same number; otherwise the bundle would come straight back.

``ownership`` is broker -> the bundles it serves or has been assigned (preallocated).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from loadbalance.bundles import bundle_namespace
from loadbalance.placement.policies import PlacementPolicies

__all__ = [
    "DEFAULT_DOMAIN",
    "anti_affinity_counts",
    "filter_anti_affinity_group_owned_brokers",
    "filter_by_group_counts",
    "group_namespaces",
    "should_anti_affinity_namespace_unload",
]

DEFAULT_DOMAIN = "default"
"""The failure domain of a broker listed in none (``LoadManagerShared.DEFAULT_DOMAIN``)."""


def group_namespaces(namespace: str, policies: PlacementPolicies) -> frozenset[str] | None:
    """The namespaces in ``namespace``'s anti-affinity group (itself included), or ``None``
    when it is in no group."""
    group = policies.anti_affinity_group_of(namespace)
    if group is None:
        return None
    folded = group.casefold()
    return frozenset(
        ns for ns, g in policies.anti_affinity_groups.items() if g.casefold() == folded
    )


def anti_affinity_counts(
    namespace: str, policies: PlacementPolicies, ownership: Mapping[str, Iterable[str]]
) -> dict[str, int] | None:
    """``getAntiAffinityNamespaceOwnedBrokers``: broker -> group namespaces it serves (brokers
    serving none are absent), or ``None`` when ``namespace`` is in no group."""
    members = group_namespaces(namespace, policies)
    if members is None:
        return None
    counts: dict[str, int] = {}
    for broker, bundles in ownership.items():
        served = {bundle_namespace(b) for b in bundles} & members
        if served:
            counts[broker] = len(served)
    return counts


def counts_from(
    members: frozenset[str], brokers: Iterable[str], count: Callable[[str, str], int]
) -> dict[str, int]:
    """``anti_affinity_counts`` from a per-broker namespace bundle count (what a placement
    batch keeps anyway) instead of every bundle name: ``count(broker, namespace)``."""
    out: dict[str, int] = {}
    for b in brokers:
        n = sum(1 for ns in members if count(b, ns) > 0)
        if n:
            out[b] = n
    return out


def filter_by_group_counts(
    candidates: Iterable[str],
    counts: Mapping[str, int],
    policies: PlacementPolicies,
    *,
    domains_enabled: bool,
) -> list[str]:
    """``filterAntiAffinityGroupOwnedBrokers`` once the counts are known (sorted result)."""
    cands = sorted(set(candidates))
    if not cands:
        return cands
    if domains_enabled and policies.failure_domains:
        cands = _least_loaded_domains(cands, counts, policies)
    least = min(counts.get(b, 0) for b in cands)
    return [b for b in cands if counts.get(b, 0) == least]


def _least_loaded_domains(
    cands: list[str], counts: Mapping[str, int], policies: PlacementPolicies
) -> list[str]:
    """``filterDomainsNotHavingLeastNumberAntiAffinityNamespaces``."""
    domain_of = {b: policies.domain_of(b) or DEFAULT_DOMAIN for b in cands}
    per_domain: dict[str, int] = {}
    for b in cands:
        per_domain[domain_of[b]] = per_domain.get(domain_of[b], 0) + counts.get(b, 0)
    least = min(per_domain.values())
    return [b for b in cands if per_domain[domain_of[b]] == least]


def filter_anti_affinity_group_owned_brokers(
    candidates: Iterable[str],
    bundle: str,
    policies: PlacementPolicies,
    ownership: Mapping[str, Iterable[str]],
    *,
    domains_enabled: bool,
) -> list[str]:
    """The candidates that may take ``bundle`` under its namespace's anti-affinity group,
    sorted: all of them when the namespace is in no group."""
    counts = anti_affinity_counts(bundle_namespace(bundle), policies, ownership)
    if counts is None:
        return sorted(set(candidates))
    return filter_by_group_counts(candidates, counts, policies, domains_enabled=domains_enabled)


def should_anti_affinity_namespace_unload(
    namespace: str,
    current_broker: str,
    policies: PlacementPolicies,
    ownership: Mapping[str, Iterable[str]],
    candidates: Iterable[str],
    *,
    domains_enabled: bool,
) -> bool:
    """Whether unloading a bundle of ``namespace`` from ``current_broker`` can put it somewhere
    better for its anti-affinity group (``True`` for a namespace in no group).

    ``candidates``: the brokers the bundle could go to (Pulsar passes the namespace's isolation
    candidates among the live brokers). ``domains_enabled`` is accepted so that callers pass
    the filter's arguments; Pulsar's guard counts brokers, not domains, and so does this one."""
    del domains_enabled
    counts = anti_affinity_counts(namespace, policies, ownership)
    if not counts:
        return True
    cands = list(dict.fromkeys(candidates))
    least = min((counts.get(b, 0) for b in cands), default=2**31 - 1)
    current = counts.get(current_broker, 0) if current_broker in cands else 0
    if least == 0 or current > least:
        return True
    at_least = sum(1 for b in cands if counts.get(b, 0) == least)
    return len(cands) != at_least
