"""Namespace isolation: which brokers a namespace's bundles may be placed on.

``namespace_candidates`` is ``LoadManagerShared.applyNamespacePolicies``, the first filter of
``ModularLoadManagerImpl.selectBroker`` and of the extensible manager's
``BrokerIsolationPoliciesFilter``:

* a namespace covered by an isolation policy may use the policy's **primary** brokers; its
  **secondary** brokers are added when ``auto_failover_policy`` (``min_available``) says so,
  that is when fewer than ``min_limit`` primaries are available;
* a namespace covered by no policy may use only the **shared** brokers, those that are primary
  or secondary in no policy (so brokers dedicated to a tenant take nobody else's bundles);
* brokers are matched by their host without the port (``broker_host``).

When no broker is eligible the answer is empty, and placement refuses (Pulsar's lookup fails
the same way): an isolated namespace never falls back to other brokers.

A primary counts as available while its usage is below the policy's ``usage_threshold``
(``MinAvailablePolicy.isBrokerAvailable``, with 100 meaning "always"). Deviation: Pulsar's
modular and extensible managers call the count-only ``shouldFailoverToSecondary(int)``, which
counts every live primary whatever its load; only its older ``SimpleLoadManagerImpl`` applied
the threshold. With the default threshold of 100 the two agree; a lower threshold here lets the
secondaries take bundles while the primaries are busy, which is what the knob is documented to do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from loadbalance.placement.policies import PlacementPolicies

__all__ = ["isolation_refusal", "namespace_candidates"]

MAX_USAGE_THRESHOLD = 100.0
"""``MinAvailablePolicy.MAX_USAGE_THRESHOLD``: a threshold of 100 counts every live primary."""


def namespace_candidates(
    namespace: str,
    candidates: Iterable[str],
    policies: PlacementPolicies,
    usage_percent: Mapping[str, float],
) -> list[str]:
    """The candidates ``namespace``'s bundles may be placed on, sorted (empty: none may).

    ``usage_percent``: broker -> its usage in percent (the failover test reads the primaries';
    a broker missing from it counts as idle)."""
    cands = sorted(set(candidates))
    if not policies.isolation:
        return cands  # no policy at all: every broker is shared
    policy = policies.isolation_policy_of(namespace)
    if policy is None:
        return [b for b in cands if policies.is_shared_broker(b)]
    primaries: list[str] = []
    secondaries: list[str] = []
    for b in cands:
        if policy.is_primary(b):
            primaries.append(b)
        elif policy.is_secondary(b):
            secondaries.append(b)
    failover = policy.auto_failover
    if failover.usage_threshold >= MAX_USAGE_THRESHOLD:
        available = len(primaries)
    else:
        available = sum(
            1 for b in primaries if failover.is_broker_available(usage_percent.get(b, 0.0))
        )
    if failover.should_failover_to_secondary(available):
        return sorted(primaries + secondaries)
    return primaries


def isolation_refusal(namespace: str, policies: PlacementPolicies) -> str:
    """Why no broker is eligible for ``namespace`` (for a lookup's answer)."""
    policy = policies.isolation_policy_of(namespace)
    if policy is None:
        return (
            f"namespace {namespace} has no isolation policy and no live broker is shared "
            "(every live broker is primary or secondary in some isolation policy)"
        )
    name = next(n for n in sorted(policies.isolation) if policies.isolation[n] is policy)
    return (
        f"namespace {namespace} is isolated by policy {name!r} and no live broker matches "
        f"its primary {list(policy.primary)} or secondary {list(policy.secondary)} brokers"
    )
