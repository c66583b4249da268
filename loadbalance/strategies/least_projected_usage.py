"""LeastProjectedUsage (ours): place a bundle where the projected usage after placing is lowest.

The placement half of our default pair. It scores each candidate with the same measure the
``ProjectedUsageShedder`` sheds on (``usage_projection``): the broker's current weighted max
resource usage, plus every bundle preallocated to it and not yet reported, plus this bundle, each
converted from rates into usage on *that* broker. Two problems of Pulsar's strategies go away:

* Herding (PIP-364): preallocations count in usage terms, so a burst of lookups after
  a scale-in spreads over the brokers in proportion to their headroom, which
  LeastResourceUsageWithWeight cannot do (it sees the same scores for every bundle of the burst).
* Heterogeneity: a broker with four times the cores absorbs four times the work before its
  projected usage rises as much, which LeastLongTermMessageRate (message rates only) cannot see.

A bundle never seen before (no samples: typically a child of a split a moment ago) would count as
Pulsar's default 50 msg/s, so every child of a hot bundle would look tiny and land on the same
broker (the emptiest one, even a weak one it then saturates). Instead its load is inherited
(``LoadIndex``) from the closest ancestor the view knows: the smallest range with data that
contains it, the parent still in a broker's last report or, once the parent has left the
reports, the parent's averages the view still holds (the load snapshot keeps a split bundle's
averages until they expire). The ancestor's short-term averages are divided by the share of its
topics that fall in the child where the view knows the topics' hashes (``topic_hashes``, the input
of the topic-count split), else by the share of its hash range the child covers.

Candidates whose projection would pass ``loadBalancerBrokerOverloadedThresholdPercentage`` are
avoided unless every candidate would. Exact ties are broken with the caller's seeded ``rng``.
The instance only caches an index of the view it last saw.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar

from loadbalance.bundles import FULL_UPPER, BundleRange, parse_bundle
from loadbalance.errors import InvalidBundle
from loadbalance.model import NamespaceBundleStats
from loadbalance.placement.base import Preallocations
from loadbalance.strategies.usage_projection import BrokerUsage, BundleLoad, UsageModel, Weights
from loadbalance.time_average import (
    NUM_LONG_SAMPLES,
    NUM_SHORT_SAMPLES,
    BundleData,
    TimeAverageMessageData,
)
from loadbalance.view import ClusterView

if TYPE_CHECKING:
    from loadbalance.config import LoadBalancerConfig

_NOTHING: Mapping[str, BundleData] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class _Known:
    """A range whose load the view knows (a reported bundle, or one with averages)."""

    lower: int
    upper: int
    name: str
    load: BundleLoad


def _load_of(name: str, view: ClusterView, stats: NamespaceBundleStats | None) -> BundleLoad:
    """A known bundle's load: its short-term averages if sampled, else its last report."""
    data = view.bundle_data.get(name)
    if data is not None and data.short_term.num_samples > 0:
        return BundleLoad.of_data(data)
    if stats is not None:
        return BundleLoad.of_stats(stats)
    return BundleLoad.of_data(BundleData.new())


class LoadIndex:
    """Loads of the bundles a view knows, to estimate one it has never sampled.

    Two lists per namespace: the reported bundles (disjoint ranges, searched by bisection) and
    the bundles with averages that no broker reports any more (split parents until they expire,
    bundles of a broker that left; few, searched in full). Built on the first estimate that needs
    it, estimates cached by name: one index serves one view."""

    def __init__(self, view: ClusterView) -> None:
        self._view = view
        self._reported: dict[str, tuple[list[int], list[_Known]]] | None = None
        self._unreported: dict[str, list[_Known]] = {}
        self._cache: dict[str, BundleLoad] = {}

    def _build(self) -> dict[str, tuple[list[int], list[_Known]]]:
        view = self._view
        rows: dict[str, list[_Known]] = {}
        seen: set[str] = set()
        for broker in sorted(view.brokers):
            for bundle, stats in view.brokers[broker].report.last_stats.items():
                r = _parse(bundle)
                if r is None or bundle in seen:
                    continue
                seen.add(bundle)
                known = _Known(r.lower, r.upper, bundle, _load_of(bundle, view, stats))
                rows.setdefault(r.namespace, []).append(known)
        for bundle in sorted(view.bundle_data.keys() - seen):
            if view.bundle_data[bundle].short_term.num_samples <= 0:
                continue
            r = _parse(bundle)
            if r is not None:
                known = _Known(r.lower, r.upper, bundle, _load_of(bundle, view, None))
                self._unreported.setdefault(r.namespace, []).append(known)
        out: dict[str, tuple[list[int], list[_Known]]] = {}
        for ns, ks in rows.items():
            ks.sort(key=lambda k: k.lower)
            out[ns] = ([k.lower for k in ks], ks)
        return out

    def estimate(self, bundle: str, data: BundleData) -> BundleLoad:
        """The bundle's short-term load or, if never sampled, its share of its closest ancestor's
        (Pulsar's defaults when the view knows no range containing it)."""
        if data.short_term.num_samples > 0:
            return BundleLoad.of_data(data)
        cached = self._cache.get(bundle)
        if cached is None:
            cached = self._cache[bundle] = self._inherited(bundle, data)
        return cached

    def placed_data(self, bundle: str, data: BundleData) -> BundleData:
        """The averages a preallocation records for ``bundle`` placed with this estimate:
        ``data`` itself once sampled or when no ancestor is known, else one sample of the
        inherited load (all of its messages counted as in, which ``BundleLoad.of_data`` reads
        back to the same load).

        Why: a preallocation is read again without this index, by the policy cycle's projection,
        whose view no longer holds a split parent (its namespace's boundaries no longer contain
        it) once the parent has left the reports; a child recorded at Pulsar's defaults counted
        there as almost nothing until its new owner reported it, and a cycle filled its broker
        with transfers (paced ``hot_bundle``)."""
        if data.short_term.num_samples > 0:
            return data
        load = self.estimate(bundle, data)
        if load == BundleLoad.of_data(data):
            return data
        rate, thr_in, thr_out = (
            load.msg_rate_per_s,
            load.throughput_in_bytes_per_s,
            load.throughput_out_bytes_per_s,
        )
        return BundleData(
            TimeAverageMessageData(NUM_SHORT_SAMPLES, 1, thr_in, thr_out, rate, 0.0),
            TimeAverageMessageData(NUM_LONG_SAMPLES, 1, thr_in, thr_out, rate, 0.0),
            data.topics,
        )

    def _inherited(self, bundle: str, data: BundleData) -> BundleLoad:
        r = _parse(bundle)
        if r is None:
            return BundleLoad.of_data(data)
        if self._reported is None:
            self._reported = self._build()
        candidates: list[_Known] = []
        lowers, rows = self._reported.get(r.namespace, ([], []))
        i = bisect.bisect_right(lowers, r.lower) - 1
        if i >= 0:
            candidates.append(rows[i])
        candidates.extend(self._unreported.get(r.namespace, ()))
        enclosing = [
            k for k in candidates if k.lower <= r.lower and r.upper <= k.upper and k.name != bundle
        ]
        if not enclosing:
            return BundleLoad.of_data(data)
        parent = min(enclosing, key=lambda k: (k.upper - k.lower, k.name))
        share = _share(r.lower, r.upper, parent, self._view.topic_hashes.get(parent.name))
        p = parent.load
        return BundleLoad(
            p.msg_rate_per_s * share,
            p.throughput_in_bytes_per_s * share,
            p.throughput_out_bytes_per_s * share,
        )


def _parse(bundle: str) -> BundleRange | None:
    try:
        return parse_bundle(bundle)
    except InvalidBundle:
        return None


def _share(lower: int, upper: int, parent: _Known, hashes: Sequence[int] | None) -> float:
    """The child's share of the parent: of its topics when their hashes are known, else of its
    hash range (the last bundle of a ring includes its upper bound)."""
    if hashes:
        last = parent.upper == FULL_UPPER and upper == FULL_UPPER
        inside = sum(1 for h in hashes if lower <= h < upper or (last and h == upper))
        return inside / len(hashes)
    width = parent.upper - parent.lower
    return (upper - lower) / width if width > 0 else 1.0


def projected_scores(
    candidates: Sequence[str],
    load: BundleLoad,
    view: ClusterView,
    preallocated: Mapping[str, Mapping[str, BundleData]],
    config: LoadBalancerConfig,
    index: LoadIndex | None = None,
    memo: _Projections | None = None,
) -> dict[str, float]:
    """Each known candidate's projected load (fraction) if ``load`` were placed there.

    ``memo``: the same caller's previous projections (one selector's placements in a cycle)."""
    weights = Weights.of(config)
    index = index if index is not None else LoadIndex(view)
    if memo is None:
        memo = _Projections(view, weights)
    elif memo.view is not view or memo.weights != weights:
        memo.reset(view, weights)
    brokers = memo.model.brokers
    scores: dict[str, float] = {}
    for c in sorted(set(candidates)):
        if c not in brokers:
            continue
        usage = memo.with_preallocated(c, preallocated.get(c, _NOTHING), index)
        scores[c] = usage.load_shifted(load, 1.0, weights)
    return scores


class _Projections:
    """Each broker's projected usage with its preallocated bundles added, kept between the
    placements of one cycle.

    Adding a broker's preallocations afresh for every candidate of every placement costs the
    square of the placements; here a broker's entry is extended by the bundles appended since
    (the same ``shifted`` calls in the same order, so the same bits) and rebuilt only when an
    entry was replaced or removed (``Preallocations.generation``) or the mapping is another."""

    def __init__(self, view: ClusterView, weights: Weights) -> None:
        self.reset(view, weights)

    def reset(self, view: ClusterView, weights: Weights) -> None:
        self.view, self.weights = view, weights
        self.model = UsageModel(view, weights)
        self._done: dict[str, tuple[Mapping[str, BundleData], int, int, BrokerUsage]] = {}

    def with_preallocated(
        self, broker: str, pre: Mapping[str, BundleData], index: LoadIndex
    ) -> BrokerUsage:
        generation = pre.generation if isinstance(pre, Preallocations) else None
        done = self._done.get(broker)
        if (
            generation is not None
            and done is not None
            and done[0] is pre
            and done[1] == generation
            and done[2] <= len(pre)
        ):
            start, usage = done[2], done[3]
        else:
            start, usage = 0, self.model.brokers[broker]
        for name, data in islice(pre.items(), start, None):
            usage = usage.shifted(index.estimate(name, data), 1.0)
        if generation is not None:
            self._done[broker] = (pre, generation, len(pre), usage)
        return usage


class LeastProjectedUsage:
    """Pick the candidate with the lowest projected usage after the placement."""

    name: ClassVar[str] = "LeastProjectedUsage"
    state_type: ClassVar[type] = type(None)

    def __init__(self) -> None:
        self._index_for: ClusterView | None = None
        self._index: LoadIndex | None = None
        self._memo: _Projections | None = None

    def initial_state(self) -> None:
        """Stateless across selections (the load index above is a per-view cache)."""
        return None

    def select_broker(
        self,
        candidates: Sequence[str],
        bundle: str,
        bundle_data: BundleData,
        view: ClusterView,
        preallocated: Mapping[str, Mapping[str, BundleData]],
        config: LoadBalancerConfig,
        rng: random.Random,
        state: None,
    ) -> tuple[None, str | None]:
        if self._index is None or self._index_for is not view:
            # one selector serves one view; index its known ranges once, not per lookup
            self._index, self._index_for = LoadIndex(view), view
        if self._memo is None or self._memo.view is not view:
            self._memo = _Projections(view, Weights.of(config))
        load = self._index.estimate(bundle, bundle_data)
        scores = projected_scores(
            candidates, load, view, preallocated, config, self._index, self._memo
        )
        if not scores:
            return None, None
        threshold = config.overloaded_threshold
        fitting = {c: s for c, s in scores.items() if s <= threshold} or scores
        best_score = min(fitting.values())
        best = [c for c in sorted(fitting) if fitting[c] == best_score]
        return None, best[rng.randrange(len(best))] if len(best) > 1 else best[0]
