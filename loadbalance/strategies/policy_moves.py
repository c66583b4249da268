"""Which moves a shedder that picks its own destinations may plan under placement policies.

ProjectedUsageShedder chooses each bundle's destination itself, so it must choose one the
bundle's policies allow (the cycle refuses any other, and the move is lost). Two things differ
from checking one decision at a time:

* **Pools.** An isolation policy splits the brokers into pools that take different namespaces
  (each policy's primary and secondary brokers; the shared brokers). Load cannot move between
  pools, so a pool is balanced against its own mean: a cluster-wide mean would ask the shared
  brokers to even out with brokers they may never take load from. ``pools`` groups the brokers.
* **Batches.** One plan moves several bundles. The anti-affinity rule depends on where the
  group's other namespaces are, and those move too; and a moved bundle no longer counts on its
  source. ``PolicyMoves`` keeps the plan's own moves in the namespace counts it passes to the
  placement filter, so the tenth move of a plan is judged on the ownership the first nine leave.

A move is allowed when the cycle's guard accepts it (``PolicyGuard``: Pulsar's
``shouldNamespacePoliciesUnload`` and ``shouldAntiAffinityNamespaceUnload``, and the
destination among the bundle's allowed brokers over the view) and, for a namespace in an
anti-affinity group, the destination is also allowed on the ownership the plan leaves.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from loadbalance.bundles import bundle_namespace
from loadbalance.placement.policy_filters import PolicyFilter
from loadbalance.shedding.policy_guards import PolicyGuard
from loadbalance.view import ClusterView

if TYPE_CHECKING:
    from loadbalance.config import LoadBalancerConfig

__all__ = ["PolicyMoves", "restricts_moves"]


def restricts_moves(view: ClusterView, config: LoadBalancerConfig) -> bool:
    """Whether any placement rule can refuse a destination (``False``: the plain plan, with no
    per-move check, is already allowed; heartbeat bundles never move either way)."""
    return not view.policies.empty or config.prefer_later_versions


class PolicyMoves:
    """The policy side of one shedding plan over one view (see the module docstring)."""

    def __init__(self, view: ClusterView, config: LoadBalancerConfig) -> None:
        self._view = view
        self._policies = view.policies
        self._guard = PolicyGuard(view, config)
        self._filter = PolicyFilter(view, config)
        self._brokers = sorted(view.brokers)
        self._delta: Counter[tuple[str, str]] = Counter()
        self._served: dict[str, Mapping[str, int]] = {}
        self._movable: dict[tuple[str, str], bool] = {}

    def pools(self, brokers: Iterable[str]) -> list[list[str]]:
        """``brokers`` grouped by the isolation policies that name them (primary or secondary),
        the shared brokers together; each pool sorted, pools in order of their first broker."""
        by_key: dict[tuple[str, ...], list[str]] = {}
        isolation = self._policies.isolation
        for b in sorted(brokers):
            key = tuple(
                name
                for name in sorted(isolation)
                if isolation[name].is_primary(b) or isolation[name].is_secondary(b)
            )
            by_key.setdefault(key, []).append(b)
        return sorted(by_key.values())

    def allows(self, bundle: str, source: str, destination: str) -> bool:
        """Whether moving ``bundle`` from ``source`` to ``destination`` keeps every policy,
        counting the moves planned so far."""
        if destination == source:
            return False
        key = (bundle, source)
        ok = self._movable.get(key)
        if ok is None:
            ok = self._movable[key] = self._guard.unload_refusal(bundle, source) is None
        if not ok or destination not in self._guard.destinations(bundle):
            return False
        namespace = bundle_namespace(bundle)
        if self._policies.anti_affinity_group_of(namespace) is None:
            return True

        def count(broker: str, ns: str) -> int:
            n = self._served_on(broker).get(ns, 0) + self._delta[(broker, ns)]
            return n - 1 if broker == source and ns == namespace else n

        allowed = self._filter.allowed(bundle, self._brokers, count=count)
        return destination in allowed.brokers

    def fork(self) -> PolicyMoves:
        """A copy whose recorded moves leave this one as it is (a trial plan's); the caches,
        functions of the view alone, are shared."""
        other = copy.copy(self)
        other._delta = Counter(self._delta)
        return other

    def moved(self, bundle: str, source: str, destination: str) -> None:
        """Record a planned move, so later checks of this plan see it."""
        namespace = bundle_namespace(bundle)
        if self._policies.anti_affinity_group_of(namespace) is not None:
            self._delta[(source, namespace)] -= 1
            self._delta[(destination, namespace)] += 1

    def _served_on(self, broker: str) -> Mapping[str, int]:
        """Namespace -> bundles the broker reports or was assigned (made once per broker, and
        only for brokers a group namespace's move is judged on)."""
        got = self._served.get(broker)
        if got is None:
            b = self._view.brokers.get(broker)
            reported = b.report.bundles if b is not None else frozenset()
            pre = self._view.preallocated.get(broker, {})
            got = Counter(bundle_namespace(x) for x in set(reported) | set(pre))
            self._served[broker] = got
        return got
