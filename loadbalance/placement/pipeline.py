"""Broker selection for bundle assignment: filters, strategy, overload re-check, preallocation.

``BrokerSelector`` mirrors ``ModularLoadManagerImpl.selectBrokerForAssignment``. It is a small
mutable object built for one cycle (or one batch of lookups) because placements inside a batch
must see each other: that is the whole point of Pulsar's preallocation. Per ``select``:

1. A bundle already preallocated to a live, non-excluded broker goes there again.
2. Candidates are the reporting brokers minus ``exclude``, narrowed by the operator's placement
   rules (``placement.policy_filters``, from ``view.policies`` and two knobs): a heartbeat or
   SLA-monitor bundle goes to its own live broker whatever the rest says (even when excluded);
   namespace isolation keeps the namespace's primary brokers (failing over to its secondaries)
   or, for a namespace under no policy, the shared brokers, and when it keeps none ``select``
   returns ``None`` with ``last_reason`` saying so (never another broker). Then the
   ``loadBalancerBrokerMaxTopics`` filter, the anti-affinity filter (with failure domains when
   ``failureDomainsEnabled``), when ``loadBalancerDistributeBundlesEvenlyEnabled`` the
   fewest-bundles-of-this-namespace filter, and with ``preferLaterVersions`` the version
   filter. An empty result restores the candidate set the isolation step left, as Pulsar
   restores ``applyNamespacePolicies``' result.
3. The placement strategy picks a broker.
4. If that broker's ``max_resource_usage()`` is above the overload threshold, the strategy runs
   again on the isolation step's candidate set (the filters may have left only overloaded
   brokers; the rules' set is never left). With
   ``loadBalancerPlacementProjectedOverloadCheckEnabled`` (ours, off by default) the check also
   projects the bundle's estimated load onto the chosen broker's own capacity
   (``loadbalance.strategies``: usage per unit of work measured on that broker, its NIC limits;
   a bundle never sampled counts as its share of its closest ancestor's load): if that passes the
   threshold while other live candidates would stay below it, the strategy chooses again among
   those. Pulsar checks the chosen broker's usage before the bundle, so an empty weak broker
   takes a bundle that saturates it.
5. The bundle is recorded as preallocated on the chosen broker (with its ``BundleData``, or
   Pulsar's defaults for a bundle never seen), so the next ``select`` counts it.

With ``LeastLongTermMessageRate`` (the default strategy) steps 2-4 do not visit every broker:
the selector keeps the brokers sorted by that strategy's score (``LeastRateOrder``; a placement
moves only the broker it preallocates to) and walks them from the least score, skipping the
brokers the filters would drop, until the first kept broker and those tied with it. That is
the same broker, from the same tied brokers in the same order and the same seeded draw, as
filtering the candidate list and scoring all of it; where the walk cannot tell (every candidate
already serves the bundle's namespace, or a score is NaN) the lists are filtered and scored.
A bundle the placement rules can narrow (``PolicyFilter.restricts``: an isolation policy
exists, its namespace is in an anti-affinity group, it is pinned, or ``preferLaterVersions``)
always takes the filter-and-score path; with no policy the walk runs as before, at the cost of
one emptiness test and one prefix test per selection.

Inherited preallocations (``view.preallocated``) are pruned on construction: entries of brokers
that left the view, and bundles the broker's report already lists (Pulsar drops a preallocation
once the broker reports the bundle, and keeping it would count the load twice). The caller
persists ``preallocated`` and ``strategy_state`` between cycles.

Deviation: Pulsar returns a preallocated broker even if it is the one being unloaded from; here
``exclude`` always wins, and the bundle is placed anew.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeAlias

from loadbalance.bundles import bundle_namespace
from loadbalance.errors import InvalidInput
from loadbalance.placement.base import PlacementStrategy, Preallocations, pending_topics
from loadbalance.placement.filters import NamespaceCounts, live_candidates
from loadbalance.placement.heartbeat import pinned_broker
from loadbalance.placement.least_long_term_message_rate import (
    LeastLongTermMessageRate,
    LeastRateOrder,
)
from loadbalance.placement.least_resource_usage_with_weight import (
    LeastResourceUsageWithWeight,
    LeastResourceUsageWithWeightState,
)
from loadbalance.placement.policy_filters import PolicyFilter
from loadbalance.placement.round_robin import RoundRobinBrokerSelector, RoundRobinState
from loadbalance.strategies.least_projected_usage import (
    LeastProjectedUsage,
    LoadIndex,
    projected_scores,
)
from loadbalance.time_average import BundleData
from loadbalance.view import ClusterView, unreported_preallocations

if TYPE_CHECKING:
    from loadbalance.config import LoadBalancerConfig

PlacementState: TypeAlias = RoundRobinState | LeastResourceUsageWithWeightState | None
"""The state of any registered placement strategy (``None``: a stateless one)."""

_EMPTY = "\x00no live broker"
"""``_least_rate``'s answer when no candidate is left (``None`` there means: run the filters)."""
_NO_LIVE_BROKER = "no live broker to place on"
_STRATEGY_NONE = "the placement strategy chose no broker"

_REGISTRY: dict[str, Callable[[], PlacementStrategy[Any]]] = {
    LeastLongTermMessageRate.name: LeastLongTermMessageRate,
    LeastResourceUsageWithWeight.name: LeastResourceUsageWithWeight,
    RoundRobinBrokerSelector.name: RoundRobinBrokerSelector,
    LeastProjectedUsage.name: LeastProjectedUsage,  # ours, see loadbalance/strategies
}
PLACEMENT_STRATEGIES = tuple(sorted(_REGISTRY))


def make_placement(name: str) -> PlacementStrategy[Any]:
    """A placement strategy by its short class name (a fully qualified Pulsar name also works).

    Pulsar's three, plus our ``LeastProjectedUsage``.
    """
    short = name.rsplit(".", 1)[-1]
    factory = _REGISTRY.get(short)
    if factory is None:
        known = ", ".join(PLACEMENT_STRATEGIES)
        raise InvalidInput("loadBalancerLoadPlacementStrategy", f"unknown {name!r}; use {known}")
    return factory()


class BrokerSelector:
    """Selects brokers for bundles during one cycle, remembering what it already placed."""

    def __init__(
        self,
        view: ClusterView,
        config: LoadBalancerConfig,
        rng: random.Random,
        strategy: PlacementStrategy[Any] | None = None,
        strategy_state: PlacementState = None,
        *,
        now_ms: int | None = None,
    ) -> None:
        self._view = view
        self._config = config
        self._rng = rng
        self._strategy = strategy or make_placement(config.placement_strategy_name)
        if not isinstance(strategy_state, self._strategy.state_type):
            # none yet, or one another strategy left (the configuration changed): start afresh
            strategy_state = self._strategy.initial_state()
        self._strategy_state: PlacementState = strategy_state
        self._now_ms = now_ms
        self._index: LoadIndex | None = None
        self._live: list[str] | None = None
        self._preallocated: dict[str, Preallocations] = {}
        self._bundle_to_broker: dict[str, str] = {}
        for broker_name, bundle, data in unreported_preallocations(view):
            self._preallocated.setdefault(broker_name, Preallocations())[bundle] = data
            self._bundle_to_broker[bundle] = broker_name
        self._ns_counts = NamespaceCounts(view, self._preallocated)
        self._over_topics: set[str] | None = None
        self._order: LeastRateOrder | None = None
        self._live_set: frozenset[str] = frozenset()
        self._usage: dict[str, float] = {}  # broker -> its report's max resource usage
        self._rules = PolicyFilter(view, config)
        self._last_reason = ""

    @property
    def strategy(self) -> PlacementStrategy[Any]:
        return self._strategy

    @property
    def strategy_state(self) -> PlacementState:
        return self._strategy_state

    @property
    def preallocated(self) -> Mapping[str, Mapping[str, BundleData]]:
        """broker -> {bundle: BundleData} placed but not yet reported (a read-only copy)."""
        return MappingProxyType(
            {b: MappingProxyType(dict(m)) for b, m in self._preallocated.items() if m}
        )

    @property
    def last_reason(self) -> str:
        """Why the last ``select`` returned ``None`` (empty after a placement)."""
        return self._last_reason

    def select(self, bundle: str, *, exclude: Collection[str] = ()) -> str | None:
        """The broker ``bundle`` should go to, or ``None`` when no broker can take it (then
        ``last_reason`` says why: no live broker, or the placement rules allow none)."""
        self._last_reason = ""
        excluded = set(exclude)
        previous = self._bundle_to_broker.get(bundle)
        if previous is not None:
            if previous in self._view.brokers and previous not in excluded:
                return previous
            self._forget(bundle, previous)

        if self._live is None:
            # the same for every selection of this selector: its view and clock are fixed
            ttl_s = self._config.load_balancer_broker_load_data_ttl_in_seconds
            self._live = live_candidates(self._view, now_ms=self._now_ms, load_data_ttl_s=ttl_s)
            self._live_set = frozenset(self._live)
        threshold = self._config.overloaded_threshold
        data = self._view.bundle(bundle)
        if self._rules.restricts(bundle):
            chosen = self._select_by_rules(bundle, excluded, data, threshold)
            if chosen is None:
                return None
            return self._record(bundle, chosen, data)
        order = self._rate_order(threshold)
        chosen = None
        if order is not None:
            chosen = self._least_rate(order, bundle, excluded, threshold)
            if chosen is _EMPTY:
                self._last_reason = _NO_LIVE_BROKER
                return None
        if chosen is None:
            full = self._full(excluded)
            if not full:
                self._last_reason = _NO_LIVE_BROKER
                return None
            candidates = self._below_max_topics(full)
            if self._config.load_balancer_distribute_bundles_evenly_enabled:
                candidates = self._ns_counts.fewest(bundle, candidates)
            if not candidates:
                candidates = full

            chosen = self._run_strategy(candidates, bundle, data)
            if chosen is None:
                self._last_reason = _STRATEGY_NONE
                return None
            if self._max_usage(chosen) > threshold:
                chosen = self._run_strategy(full, bundle, data) or chosen
        if self._config.load_balancer_placement_projected_overload_check_enabled:
            full = self._full(excluded)
            chosen = self._below_threshold(chosen, full, bundle, data, threshold)
        return self._record(bundle, chosen, data)

    def candidates(self, bundle: str, *, exclude: Collection[str] = ()) -> list[str]:
        """The brokers left for ``bundle`` after every filter (what the strategy would score),
        without placing it: for ``lbctl decide --lookup`` and for operators' questions."""
        if self._live is None:
            ttl_s = self._config.load_balancer_broker_load_data_ttl_in_seconds
            self._live = live_candidates(self._view, now_ms=self._now_ms, load_data_ttl_s=ttl_s)
            self._live_set = frozenset(self._live)
        excluded = set(exclude)
        if self._rules.restricts(bundle):
            allowed = self._rules.allowed(
                bundle, self._full(excluded), count=self._ns_counts.count, live=self._live_set
            )
            if allowed.pinned or not allowed.brokers:
                return allowed.brokers
            return self._filtered(bundle, allowed.isolated)
        full = self._full(excluded)
        candidates = self._below_max_topics(full)
        if self._config.load_balancer_distribute_bundles_evenly_enabled:
            candidates = self._ns_counts.fewest(bundle, candidates)
        return candidates or full

    def _select_by_rules(
        self, bundle: str, excluded: set[str], data: BundleData, threshold: float
    ) -> str | None:
        """``select`` for a bundle the placement rules narrow (``PolicyFilter``), in the order
        of ``ModularLoadManagerImpl.selectBroker``: pinning, isolation, max topics,
        anti-affinity, distribute evenly, version; an empty result restores the isolation set;
        the overload re-check (and the projected one) choose only within the isolation set."""
        allowed = self._rules.allowed(
            bundle, self._full(excluded), count=self._ns_counts.count, live=self._live_set
        )
        if allowed.pinned:
            # a heartbeat/SLA bundle goes to its own live broker, excluded or not
            pin = pinned_broker(bundle, self._live_set)
            if pin is None or pin.broker is None:
                self._last_reason = allowed.reason or _NO_LIVE_BROKER
                return None
            return pin.broker
        if not allowed.brokers:
            self._last_reason = allowed.reason
            return None
        isolated = allowed.isolated
        candidates = self._filtered(bundle, isolated)
        chosen = self._run_strategy(candidates, bundle, data)
        if chosen is None:
            self._last_reason = _STRATEGY_NONE
            return None
        if self._max_usage(chosen) > threshold:
            chosen = self._run_strategy(isolated, bundle, data) or chosen
        if self._config.load_balancer_placement_projected_overload_check_enabled:
            chosen = self._below_threshold(chosen, isolated, bundle, data, threshold)
        return chosen

    def _filtered(self, bundle: str, isolated: list[str]) -> list[str]:
        """Max topics, anti-affinity, distribute evenly and version over the isolation set
        (sorted); the isolation set itself when they leave nothing."""
        candidates = self._below_max_topics(isolated)
        candidates = self._rules.anti_affinity(bundle, candidates, count=self._ns_counts.count)
        if self._config.load_balancer_distribute_bundles_evenly_enabled:
            candidates = self._ns_counts.fewest(bundle, candidates)
        candidates = self._rules.versions(candidates)
        return candidates or isolated

    def _record(self, bundle: str, chosen: str, data: BundleData) -> str:
        """Preallocate ``bundle`` on ``chosen`` so that the next ``select`` counts it; under
        our strategy a never-sampled bundle at the estimate it was placed with
        (``LoadIndex.placed_data``), which every later reader counts the same."""
        if type(self._strategy) is LeastProjectedUsage and data.short_term.num_samples <= 0:
            if self._index is None:
                self._index = LoadIndex(self._view)
            data = self._index.placed_data(bundle, data)
        pre = self._preallocated.get(chosen)
        if pre is None:  # (not ``setdefault``: it would build a new one for every placement)
            pre = self._preallocated[chosen] = Preallocations()
        pre[bundle] = data
        self._bundle_to_broker[bundle] = chosen
        self._ns_counts.add(chosen, bundle_namespace(bundle))
        self._recount_topics(chosen)
        if self._order is not None:
            self._order.rescore(chosen)
        return chosen

    def _max_usage(self, broker: str) -> float:
        """The broker's ``report.max_resource_usage()``, worked out once per selector (its view
        is fixed, and a cycle that moves thousands of bundles re-checks the chosen broker for
        each)."""
        usage = self._usage.get(broker)
        if usage is None:
            usage = self._usage[broker] = self._view.brokers[broker].report.max_resource_usage()
        return usage

    def _full(self, excluded: set[str]) -> list[str]:
        """The live brokers not excluded, sorted: every candidate before the filters."""
        live = self._live or []
        return [c for c in live if c not in excluded] if excluded else list(live)

    def _rate_order(self, threshold: float) -> LeastRateOrder | None:
        """The kept score order when the strategy is ``LeastLongTermMessageRate`` itself
        (made on first use), else ``None``: other strategies score the candidate list."""
        if type(self._strategy) is not LeastLongTermMessageRate:
            return None
        if self._order is None:
            self._order = LeastRateOrder(
                self._strategy, self._view, self._live or (), self._preallocated, threshold
            )
        return self._order if self._order.usable else None

    def _least_rate(
        self, order: LeastRateOrder, bundle: str, excluded: set[str], threshold: float
    ) -> str | None:
        """Steps 2-4 of ``select`` for ``LeastLongTermMessageRate`` without scoring every
        candidate: the same broker, drawn from the same tied brokers with the same ``rng``
        call, as the filters followed by ``select_broker`` on the lists they leave.

        The order is walked from the least score. A broker is a candidate unless excluded, or
        over ``loadBalancerBrokerMaxTopics`` while some live broker is not. With the
        even-distribution filter on, the candidates kept are those with the fewest bundles of
        the namespace: no count is below zero, so as soon as one candidate has none, the
        fewest is zero and the least-scored candidate with none is the minimum; when every
        candidate serves the namespace already, this returns ``None`` and the caller runs the
        filters on the full lists. ``_EMPTY`` when no live broker is left at all."""
        live = self._live_set
        n_full = len(live) - sum(1 for c in excluded if c in live)
        if n_full <= 0:
            return _EMPTY
        over = self._over_topics_set()
        if over:
            n_over = sum(1 for c in over if c in live and c not in excluded)
            if n_over >= n_full:
                over = set()  # every candidate is over: the filter keeps them all
        ns = (
            bundle_namespace(bundle)
            if self._config.load_balancer_distribute_bundles_evenly_enabled
            else None
        )
        chosen = self._walk(order, excluded, over, ns)
        if chosen is None:
            return None
        if self._max_usage(chosen) > threshold:
            # every kept candidate is overloaded: choose again among all, as ``select`` does
            chosen = self._walk(order, excluded, set(), None) or chosen
        return chosen

    def _walk(
        self, order: LeastRateOrder, excluded: set[str], over: set[str], ns: str | None
    ) -> str | None:
        """The seeded pick among the least-scored candidates (see ``_least_rate``)."""
        count = self._ns_counts.count
        best: list[str] = []
        best_score = 0.0
        for score, name in order.entries:
            if best and score != best_score:
                break
            if name in excluded or name in over:
                continue
            if ns is not None and count(name, ns) != 0:
                continue
            best_score = score
            best.append(name)
        if not best:
            return None
        return best[self._rng.randrange(len(best))]

    def _over_topics_set(self) -> set[str]:
        if self._over_topics is None:
            self._over_topics = set()
            for name in self._view.brokers:
                self._recount_topics(name)
        return self._over_topics

    def _below_max_topics(self, full: list[str]) -> list[str]:
        """``filter_brokers_with_large_topic_count`` over ``full`` (sorted, every one in the
        view), with the brokers over the limit kept as a set that each placement updates for
        the one broker it changes, instead of adding up every broker's topics each time."""
        over = self._over_topics_set()
        if not over:
            return full
        kept = [c for c in full if c not in over]
        return kept if kept else full

    def _recount_topics(self, broker: str) -> None:
        over = self._over_topics
        if over is None:
            return
        view_broker = self._view.brokers.get(broker)
        if view_broker is None:
            return
        pre = self._preallocated.get(broker)
        total = view_broker.report.num_topics + (pending_topics(pre) if pre else 0)
        if total <= self._config.load_balancer_broker_max_topics:
            over.discard(broker)
        else:
            over.add(broker)

    def _below_threshold(
        self, chosen: str, full: list[str], bundle: str, data: BundleData, threshold: float
    ) -> str:
        """``chosen``, unless the bundle's projected load would put it past ``threshold`` while
        some of ``full`` would stay below: then the strategy's choice among those."""
        if self._index is None:
            self._index = LoadIndex(self._view)
        load = self._index.estimate(bundle, data)
        scores = projected_scores(
            full, load, self._view, self._preallocated, self._config, self._index
        )
        if scores.get(chosen, 0.0) <= threshold:
            return chosen
        below = [c for c in full if c in scores and scores[c] <= threshold]
        if not below:
            return chosen
        return self._run_strategy(below, bundle, data) or chosen

    def _run_strategy(self, candidates: list[str], bundle: str, data: BundleData) -> str | None:
        self._strategy_state, chosen = self._strategy.select_broker(
            candidates,
            bundle,
            data,
            self._view,
            self._preallocated,
            self._config,
            self._rng,
            self._strategy_state,
        )
        if chosen is None or chosen not in candidates:
            return None
        return chosen

    def _forget(self, bundle: str, broker: str) -> None:
        self._bundle_to_broker.pop(bundle, None)
        self._preallocated.get(broker, {}).pop(bundle, None)
        self._ns_counts.remove(broker, bundle_namespace(bundle))
        self._recount_topics(broker)
        if self._order is not None:
            self._order.rescore(broker)
