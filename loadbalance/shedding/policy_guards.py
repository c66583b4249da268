"""Placement policies on the shedding side: which selected bundles may really move, and where.

A shedder picks bundles by load alone; an operator's placement policies (namespace isolation,
anti-affinity groups, heartbeat pinning) decide whether moving one can help. Pulsar checks two
ways, and both are here over one ``ClusterView`` (its ``policies``, its brokers as the available
brokers, their reported bundles as the ownership):

* **Modular shedders** (``ModularLoadManagerImpl.doLoadShedding``): after the strategy's
  selection and before each unload, ``shouldNamespacePoliciesUnload`` (the namespace's isolation
  candidates among the available brokers, less the current owner, must not be empty: otherwise
  the bundle could only come back) and then ``shouldAntiAffinityNamespaceUnload`` (for a
  namespace in an anti-affinity group, some candidate must serve fewer of the group's
  namespaces than the current broker, or not all the same number). ``guard_unloads`` applies
  them and records each refusal as a ``Skip`` (``NamespacePolicies``, ``AntiAffinity``).
* **TransferShedder** (``TransferShedder.isTransferable``): a bundle whose namespace has an
  isolation policy or an anti-affinity group is shed only with
  ``loadBalancerSheddingBundlesWithPoliciesEnabled``; then, as for every other bundle, the
  broker filter pipeline (``allowed_destinations``: heartbeat, isolation, anti-affinity,
  version) runs over the available brokers, and the move is allowed only if the destination is
  among the survivors (for a plain unload, only if some survivor other than the source is left).

Heartbeat and SLA-monitor bundles (and ``pulsar/system``) never pass either check: Pulsar's
``applyNamespacePolicies`` gives a heartbeat namespace its own broker as the only candidate,
and ``TopKBundles`` never offers them to TransferShedder.

Answers are worked out once per namespace (candidates) or bundle (destinations) in a cycle:
``PolicyGuard`` lives for one cycle. A namespace in no group never counts ownership, so a
cluster without policies pays one set lookup per selected bundle.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from loadbalance.bundles import bundle_namespace
from loadbalance.decisions import TRANSFER, Decision, Skip
from loadbalance.placement.anti_affinity import should_anti_affinity_namespace_unload
from loadbalance.placement.isolation import namespace_candidates
from loadbalance.placement.policy_filters import PolicyFilter
from loadbalance.shedding.system_namespaces import is_system_bundle
from loadbalance.values import SkipReason
from loadbalance.view import ClusterView

if TYPE_CHECKING:
    from loadbalance.config import LoadBalancerConfig

__all__ = ["PolicyGuard", "guard_unloads"]


@dataclass(slots=True)
class PolicyGuard:
    """The policy checks of one shedding cycle over one view (answers memoised per cycle)."""

    view: ClusterView
    config: LoadBalancerConfig
    _brokers: list[str] = field(init=False)
    _usage: dict[str, float] | None = field(init=False, default=None)
    _ownership: Mapping[str, Iterable[str]] | None = field(init=False, default=None)
    _candidates: dict[str, list[str]] = field(init=False, default_factory=dict)
    _destinations: dict[str, frozenset[str]] = field(init=False, default_factory=dict)
    _has_policies: dict[str, bool] = field(init=False, default_factory=dict)
    _filter: PolicyFilter | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self._brokers = sorted(self.view.brokers)

    # ----- inputs, made on first use ----------------------------------------------------------
    def _usage_percent(self) -> Mapping[str, float]:
        if self._usage is None:
            self._usage = {
                name: b.report.max_resource_usage() * 100.0 for name, b in self.view.brokers.items()
            }
        return self._usage

    def ownership(self) -> Mapping[str, Iterable[str]]:
        """broker -> the bundles it reports or was assigned since (Pulsar's
        ``brokerToNamespaceToBundleRange``, which holds preallocations too)."""
        if self._ownership is None:
            pre = self.view.preallocated
            self._ownership = {
                name: (b.bundles | frozenset(pre[name])) if pre.get(name) else b.bundles
                for name, b in self.view.brokers.items()
            }
        return self._ownership

    def namespace_candidates(self, namespace: str) -> list[str]:
        """``applyNamespacePolicies`` over the available brokers (memoised)."""
        got = self._candidates.get(namespace)
        if got is None:
            if not self.view.policies.isolation and self._candidates:
                # no isolation policy: every namespace has the same answer (all brokers), and
                # working it out again per namespace sorts every broker name thousands of times
                got = next(iter(self._candidates.values()))
            else:
                got = namespace_candidates(
                    namespace, self._brokers, self.view.policies, self._usage_percent()
                )
            self._candidates[namespace] = got
        return got

    # ----- modular shedders -------------------------------------------------------------------
    def should_namespace_policies_unload(self, bundle: str, current_broker: str) -> bool:
        """``ModularLoadManagerImpl.shouldNamespacePoliciesUnload``: some broker other than the
        current one may take the bundle under its namespace's isolation policy."""
        if is_system_bundle(bundle):
            return False
        cands = self.namespace_candidates(bundle_namespace(bundle))
        return any(b != current_broker for b in cands)

    def should_anti_affinity_namespace_unload(self, bundle: str, current_broker: str) -> bool:
        """``ModularLoadManagerImpl.shouldAntiAffinityNamespaceUnload``: ``True`` for a namespace
        in no group, else whether a move can spread the group further."""
        namespace = bundle_namespace(bundle)
        policies = self.view.policies
        if policies.anti_affinity_group_of(namespace) is None:
            return True
        return should_anti_affinity_namespace_unload(
            namespace,
            current_broker,
            policies,
            self.ownership(),
            self.namespace_candidates(namespace),
            domains_enabled=self.config.failure_domains_enabled,
        )

    def unload_refusal(self, bundle: str, current_broker: str) -> Skip | None:
        """The guard that refuses unloading ``bundle`` from ``current_broker``, as a ``Skip``
        (policy left to the caller), or ``None`` when both allow it."""
        if not self.should_namespace_policies_unload(bundle, current_broker):
            return Skip(
                "",
                SkipReason.NAMESPACE_POLICIES,
                current_broker,
                bundle,
                "no other available broker is allowed by its namespace's isolation policy",
            )
        if not self.should_anti_affinity_namespace_unload(bundle, current_broker):
            group = self.view.policies.anti_affinity_group_of(bundle_namespace(bundle))
            return Skip(
                "",
                SkipReason.ANTI_AFFINITY,
                current_broker,
                bundle,
                f"every candidate serves as many namespaces of anti-affinity group {group!r}",
            )
        return None

    # ----- TransferShedder --------------------------------------------------------------------
    def has_policies(self, bundle: str) -> bool:
        """Whether the bundle's namespace has an isolation policy or an anti-affinity group
        (``IsolationPoliciesHelper.hasIsolationPolicy`` or
        ``AntiAffinityGroupPolicyHelper.hasAntiAffinityGroupPolicy``)."""
        policies = self.view.policies
        if policies.empty:
            return False
        namespace = bundle_namespace(bundle)
        got = self._has_policies.get(namespace)
        if got is None:  # a shedding broker lists thousands of bundles of a few namespaces
            got = policies.is_isolated(namespace) or (
                policies.anti_affinity_group_of(namespace) is not None
            )
            self._has_policies[namespace] = got
        return got

    def sheds_bundles_with_policies(self) -> bool:
        """Whether bundles under policies may be shed at all: the knob is on, or no policy
        names any namespace (so no bundle is under one)."""
        policies = self.view.policies
        enabled = self.config.load_balancer_shedding_bundles_with_policies_enabled
        return enabled or not (policies.isolation or policies.anti_affinity_groups)

    def shedding_with_policies_enabled(self, bundle: str) -> bool:
        """``TransferShedder.isLoadBalancerSheddingBundlesWithPoliciesEnabled``: a bundle under
        policies may be shed only when the knob is on; any other bundle may."""
        if not self.has_policies(bundle):
            return True
        return self.config.load_balancer_shedding_bundles_with_policies_enabled

    def destinations(self, bundle: str) -> frozenset[str]:
        """The available brokers the bundle may go to: the broker filter pipeline
        (``PolicyFilter``: heartbeat pin, isolation, anti-affinity, version) over every broker
        of the view, memoised. A bundle no rule can narrow skips the pipeline."""
        got = self._destinations.get(bundle)
        if got is None:
            if self._filter is None:
                self._filter = PolicyFilter(self.view, self.config)
            if self._filter.restricts(bundle):
                got = frozenset(self._filter.allowed(bundle, self._brokers).brokers)
            else:
                got = frozenset(self._brokers)
            self._destinations[bundle] = got
        return got

    def is_transferable(self, bundle: str, src: str, dst: str, *, transfer: bool) -> bool:
        """``TransferShedder.isTransferable(bundle, src, Optional.of(dst))``."""
        if not self.shedding_with_policies_enabled(bundle):
            return False
        allowed = self.destinations(bundle)
        if dst not in allowed:
            return False
        if not transfer:  # an unload: some broker other than the source must be left
            return any(b != src for b in allowed)
        return dst != src


def guard_unloads(
    decisions: Iterable[Decision], view: ClusterView, config: LoadBalancerConfig, policy: str
) -> tuple[list[Decision], list[Skip]]:
    """Apply the modular guards to a shedder's selection, in order: the decisions that may go
    ahead, and a ``Skip`` (named for ``policy``) for each bundle refused.

    A decision the shedder already gave a destination (a transfer) must also name a broker the
    bundle's policies allow; otherwise it is refused as ``NamespacePolicies``."""
    guard = PolicyGuard(view, config)
    kept: list[Decision] = []
    skips: list[Skip] = []
    # Both guards answer for the bundle's namespace and current broker (a system bundle is one
    # by its namespace), so one answer per pair serves every bundle of it: a cycle at a million
    # bundles guards tens of thousands of bundles of a few hundred namespaces per broker.
    answers: dict[tuple[str, str], Skip | None] = {}
    for d in decisions:
        source = d.source_broker or ""
        key = (bundle_namespace(d.bundle), source)
        if key in answers:
            refusal = answers[key]
            if refusal is not None:
                refusal = replace(refusal, bundle=d.bundle)
        else:
            refusal = answers[key] = guard.unload_refusal(d.bundle, source)
        dest = d.destination_broker if d.kind == TRANSFER else None
        if refusal is None and dest is not None and dest not in guard.destinations(d.bundle):
            refusal = Skip(
                "",
                SkipReason.NAMESPACE_POLICIES,
                source,
                d.bundle,
                f"destination {dest} is not allowed by its policies",
            )
        if refusal is None:
            kept.append(d)
        else:
            skips.append(
                Skip(policy, refusal.reason, refusal.broker, refusal.bundle, refusal.detail)
            )
    return kept, skips
