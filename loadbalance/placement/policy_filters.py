"""The operator's placement rules composed into one filter, for placement and for shedding.

Every destination chosen anywhere (a lookup, a sweep, a shedder's transfer) must pass the same
rules, in the order of ``ModularLoadManagerImpl.selectBroker`` and of the extensible manager's
filter list:

1. **Pinning**: a heartbeat or SLA-monitor bundle belongs to its own broker
   (``placement.heartbeat``); no other broker is allowed, whatever the filters below say.
2. **Isolation** (``placement.isolation``): the namespace's primary brokers, failing over to its
   secondaries, or the shared brokers for a namespace under no policy. Empty means refused.
3. **Anti-affinity** (``placement.anti_affinity``): the brokers (and, with
   ``failureDomainsEnabled``, the failure domains) serving the fewest namespaces of the
   bundle's group.
4. **Version** (``placement.version_filter``, with ``preferLaterVersions``): the brokers on the
   latest ``brokerVersionString``; an empty result restores the isolation set, as Pulsar does
   when its filter pipeline leaves nothing.

``PolicyFilter`` is made once per view (it caches the per-view work: live set, usage, versions)
and answers per bundle; ``allowed_destinations`` is the one-call form. Ownership for the
anti-affinity counts is what the view holds: each broker's reported bundles plus its
preallocations (``view.preallocated``), or a caller's own count (``BrokerSelector`` passes the
counts it keeps through a batch of placements).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from loadbalance.bundles import bundle_namespace
from loadbalance.placement.anti_affinity import (
    counts_from,
    filter_by_group_counts,
    group_namespaces,
)
from loadbalance.placement.heartbeat import heartbeat_broker_id, pinned_broker
from loadbalance.placement.isolation import isolation_refusal, namespace_candidates
from loadbalance.placement.version_filter import latest_version_brokers
from loadbalance.view import ClusterView, digest_of

if TYPE_CHECKING:
    from loadbalance.config import LoadBalancerConfig

__all__ = ["Allowed", "PolicyFilter", "allowed_destinations"]

_PINNED_PREFIXES = ("pulsar/", "sla-monitor/")
"""Every heartbeat and SLA-monitor name starts so: a cheap test before the patterns."""

NamespaceCount = Callable[[str, str], int]
"""``count(broker, namespace)``: bundles of the namespace the broker serves or was assigned."""


@dataclass(frozen=True, slots=True)
class Allowed:
    """The brokers a bundle may go to after the rules, and why none when ``brokers`` is empty.

    ``isolated``: the isolation step's result (the set Pulsar restores when a later filter
    leaves nothing, and the only set the overload re-check may choose from). ``pinned``: the
    bundle is a heartbeat/SLA bundle placed on its own broker without the other rules."""

    brokers: list[str]
    isolated: list[str]
    reason: str = ""
    pinned: bool = False


class PolicyFilter:
    """The placement rules over one view, answered per bundle (see the module docstring)."""

    def __init__(self, view: ClusterView, config: LoadBalancerConfig) -> None:
        self._view = view
        self._policies = view.policies
        self._domains_enabled = config.failure_domains_enabled
        self._prefer_later = config.prefer_later_versions
        self._usage: dict[str, float] | None = None
        self._versions: dict[str, str] | None = None
        self._counts: dict[str, Mapping[str, int]] | None = None

    def restricts(self, bundle: str) -> bool:
        """Whether any rule can narrow the candidates of ``bundle`` (``False``: every live
        candidate is allowed, and callers may skip ``allowed``)."""
        if self._prefer_later:
            return True
        if bundle.startswith(_PINNED_PREFIXES) and heartbeat_broker_id(bundle) is not None:
            return True
        policies = self._policies
        if policies.empty:
            return False
        if policies.isolation:
            return True
        return policies.anti_affinity_group_of(bundle_namespace(bundle)) is not None

    def allowed(
        self,
        bundle: str,
        candidates: Iterable[str],
        *,
        count: NamespaceCount | None = None,
        live: Iterable[str] | None = None,
    ) -> Allowed:
        """The candidates ``bundle`` may go to. ``live``: the live brokers a pinned bundle's
        broker is looked for in (default: the candidates; a shedder passes the candidates
        without the source broker, so a heartbeat bundle is never allowed to move)."""
        cands = sorted(set(candidates))
        pin = pinned_broker(bundle, cands if live is None else live)
        if pin is not None:
            if pin.broker is None:
                return Allowed([], [], pin.reason, pinned=True)
            kept = [pin.broker] if pin.broker in cands else []
            reason = "" if kept else f"pinned to its own broker {pin.broker}"
            return Allowed(kept, kept, reason, pinned=True)
        ns = bundle_namespace(bundle)
        policies = self._policies
        isolated = cands
        if policies.isolation:
            isolated = namespace_candidates(ns, cands, policies, self._usage_percent())
            if not isolated:
                reason = isolation_refusal(ns, policies) if cands else "no live broker"
                return Allowed([], [], reason)
        kept = self.anti_affinity(bundle, isolated, count=count)
        kept = self.versions(kept)
        if not kept:
            kept = isolated
        return Allowed(kept, isolated, "" if kept else "no live broker")

    def anti_affinity(
        self, bundle: str, candidates: list[str], *, count: NamespaceCount | None = None
    ) -> list[str]:
        """Step 3 alone (``candidates`` sorted): unchanged for a namespace in no group."""
        members = group_namespaces(bundle_namespace(bundle), self._policies)
        if members is None or not candidates:
            return candidates
        counts = counts_from(members, candidates, count or self._count)
        return filter_by_group_counts(
            candidates, counts, self._policies, domains_enabled=self._domains_enabled
        )

    def versions(self, candidates: list[str]) -> list[str]:
        """Step 4 alone: unchanged unless ``preferLaterVersions``."""
        if not self._prefer_later or not candidates:
            return candidates
        if self._versions is None:
            self._versions = {n: b.report.broker_version for n, b in self._view.brokers.items()}
        return latest_version_brokers(candidates, self._versions)

    def _usage_percent(self) -> Mapping[str, float]:
        if self._usage is None:
            self._usage = {
                n: 100.0 * b.report.max_resource_usage() for n, b in self._view.brokers.items()
            }
        return self._usage

    def _count(self, broker: str, namespace: str) -> int:
        """Bundles of ``namespace`` the broker reports or has preallocated (served and
        preallocated counted once each, as a set of bundle ranges)."""
        if self._counts is None:
            self._counts = {}
        counts = self._counts.get(broker)
        if counts is None:
            counts = self._counts[broker] = self._broker_counts(broker)
        return counts.get(namespace, 0)

    def _broker_counts(self, broker: str) -> Mapping[str, int]:
        view_broker = self._view.brokers.get(broker)
        pre = self._view.preallocated.get(broker, {})
        if view_broker is None:
            return Counter(bundle_namespace(b) for b in pre)
        digest = digest_of(self._view, broker)
        served = view_broker.report.bundles
        extra = [b for b in pre if b not in served]
        if digest is not None and not extra:
            return digest.namespace_counts
        return Counter(bundle_namespace(b) for b in set(served) | set(pre))


def allowed_destinations(
    bundle: str,
    candidates: Iterable[str],
    view: ClusterView,
    config: LoadBalancerConfig,
) -> list[str]:
    """The candidates ``bundle`` may be moved to under the view's policies, sorted (empty: no
    candidate is allowed). For a shedder choosing a transfer destination: ``candidates`` are
    the brokers it would consider (without the source), so a pinned bundle gets none."""
    return PolicyFilter(view, config).allowed(bundle, candidates).brokers
