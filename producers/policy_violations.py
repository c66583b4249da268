"""Placement-policy violations in one ownership state, judged independently of the placement code.

The scoreboard asks of every pair, at every cycle, whether the ownership it produced keeps the
scenario's placement policies. The answer must not come from the filters that chose the brokers
(a bug there would then judge itself correct), so this module restates each rule from its
meaning, over the owners and the live brokers only:

* **isolation**: a bundle of a namespace under an isolation policy is owned by a broker that is
  neither primary nor secondary of the policy, or a bundle of a namespace under no policy by a
  broker that some policy names, while a broker the bundle may use is live (with none live the
  bundle has nowhere better to be; Pulsar then refuses new lookups but leaves owners alone);
* **anti-affinity**: among the live brokers an anti-affinity group's namespaces may use, one
  serves two or more namespaces of the group more than another (counts differ by two or more),
  so the group could be spread further; a namespace counts once per broker however many of its
  bundles are there, as in Pulsar's ``getAntiAffinityNamespaceOwnedBrokers``;
* **failure domain** (with ``failureDomainsEnabled``): the same over failure domains (a broker in
  no domain is in the domain ``default``), among the domains holding a usable live broker;
* **heartbeat**: a heartbeat or SLA-monitor bundle owned by a broker other than its own while its
  own broker is live.

Owners on a broker that is not live (a crash, before the leases run out) count for no rule but
isolation: they are where they were put, and are looked up again once their leases expire.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from loadbalance.bundles import bundle_namespace
from loadbalance.placement.anti_affinity import DEFAULT_DOMAIN
from loadbalance.placement.heartbeat import heartbeat_broker_id, heartbeat_broker_of
from loadbalance.placement.policies import PlacementPolicies

__all__ = [
    "ANTI_AFFINITY",
    "FAILURE_DOMAIN",
    "HEARTBEAT",
    "ISOLATION",
    "Violation",
    "find_violations",
    "isolation_pools",
]

ISOLATION, ANTI_AFFINITY, FAILURE_DOMAIN, HEARTBEAT = (
    "isolation",
    "anti-affinity",
    "failure-domain",
    "heartbeat",
)
SHARED_POOL = "shared"


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule: which rule, what it concerns (a bundle or a group), and how."""

    rule: str
    subject: str
    detail: str


def _allowed_by_isolation(namespace: str, broker: str, policies: PlacementPolicies) -> bool:
    """Whether a policy lets ``namespace`` live on ``broker`` at all (primary or secondary; the
    shared brokers for a namespace under no policy)."""
    if not policies.isolation:
        return True
    policy = policies.isolation_policy_of(namespace)
    if policy is None:
        return policies.is_shared_broker(broker)
    return policy.is_primary(broker) or policy.is_secondary(broker)


def _uneven(kind: str, key: str, counts: Mapping[str, int], place: str) -> list[Violation]:
    """One ``kind`` violation when the fullest and the emptiest of ``counts`` differ by two or
    more namespaces of the group (``place`` names what is counted: "" or "domain ")."""
    if len(counts) < 2:
        return []
    hi = max(sorted(counts), key=lambda k: counts[k])
    lo = min(sorted(counts), key=lambda k: counts[k])
    if counts[hi] - counts[lo] < 2:
        return []
    text = f"{place}{hi} serves {counts[hi]} namespaces of the group, {lo} {counts[lo]}"
    return [Violation(kind, key, text)]


def _group_violations(
    key: str,
    members: Collection[str],
    served: Mapping[str, set[str]],
    live: Collection[str],
    policies: PlacementPolicies,
    domains_enabled: bool,
) -> list[Violation]:
    """The anti-affinity and failure-domain violations of one anti-affinity group (``key``, its
    casefolded name): ``members`` are its namespaces, ``served`` maps each live broker to the
    group's namespaces it serves. Only live brokers some member may use count, so a namespace
    kept off a broker by isolation does not make the group look uneven."""
    out: list[Violation] = []
    usable = sorted(
        b for b in live if any(_allowed_by_isolation(ns, b, policies) for ns in members)
    )
    per_broker = {b: len(served.get(b, ())) for b in usable}
    out += _uneven(ANTI_AFFINITY, key, per_broker, "")
    if domains_enabled and policies.failure_domains:
        per_domain: dict[str, int] = {}
        for b in usable:
            domain = policies.domain_of(b) or DEFAULT_DOMAIN
            per_domain[domain] = per_domain.get(domain, 0) + per_broker[b]
        out += _uneven(FAILURE_DOMAIN, key, per_domain, "domain ")
    return out


def find_violations(
    owners: Mapping[str, str],
    live: Collection[str],
    policies: PlacementPolicies,
    *,
    domains_enabled: bool,
) -> list[Violation]:
    """Every rule the ownership ``owners`` (bundle -> broker) breaks, given the ``live``
    brokers; sorted, empty when all hold (see the module docstring for each rule)."""
    if policies.empty and not any(heartbeat_broker_id(b) for b in owners):
        return []
    live_set = set(live)
    out: list[Violation] = []
    group_brokers: dict[str, dict[str, set[str]]] = {}  # group -> broker -> namespaces
    group_members: dict[str, set[str]] = {}
    for bundle, owner in sorted(owners.items()):
        named = heartbeat_broker_id(bundle)
        if named is not None:
            own = heartbeat_broker_of(bundle, live_set)
            if own is not None and owner != own:
                out.append(Violation(HEARTBEAT, bundle, f"on {owner}, its broker {own} is live"))
            continue
        ns = bundle_namespace(bundle)
        if not _allowed_by_isolation(ns, owner, policies) and any(
            _allowed_by_isolation(ns, b, policies) for b in live_set
        ):
            out.append(Violation(ISOLATION, bundle, f"on {owner}, not allowed by its policies"))
        group = policies.anti_affinity_group_of(ns)
        if group is not None:
            key = group.casefold()
            group_members.setdefault(key, set()).add(ns)
            if owner in live_set:
                group_brokers.setdefault(key, {}).setdefault(owner, set()).add(ns)
    for key in sorted(group_members):
        served = group_brokers.get(key, {})
        out.extend(
            _group_violations(key, group_members[key], served, live_set, policies, domains_enabled)
        )
    return out


def isolation_pools(brokers: Collection[str], policies: PlacementPolicies) -> dict[str, str]:
    """broker -> the pool it balances in: the brokers an isolation policy names (primary or
    secondary; the policy names joined when several name one broker) or ``shared``.

    A pool is a set of brokers that take the same namespaces, so load can move only inside
    one; balance is judged per pool (``producers.scoreboard``)."""
    out: dict[str, str] = {}
    for b in sorted(brokers):
        names = [
            name
            for name in sorted(policies.isolation)
            if policies.isolation[name].is_primary(b) or policies.isolation[name].is_secondary(b)
        ]
        out[b] = "+".join(names) if names else SHARED_POOL
    return out
