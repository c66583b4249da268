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
broker. Instead its load is estimated from the reported bundle whose range contains it (the
parent, still in the last reports), scaled by the share of the parent's hash range it covers.

Candidates whose projection would pass ``loadBalancerBrokerOverloadedThresholdPercentage`` are
avoided unless every candidate would. Exact ties are broken with the caller's seeded ``rng``.
The instance only caches an index of the view it last saw.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar

from loadbalance.bundles import bundle_namespace, parse_bundle
from loadbalance.errors import InvalidBundle
from loadbalance.model import NamespaceBundleStats
from loadbalance.strategies.usage_projection import BundleLoad, UsageModel, Weights
from loadbalance.time_average import BundleData
from loadbalance.view import ClusterView

if TYPE_CHECKING:
    from loadbalance.config import LoadBalancerConfig


_Ranges = dict[str, tuple[list[int], list[tuple[int, NamespaceBundleStats]]]]


def reported_ranges(view: ClusterView) -> _Ranges:
    """namespace -> (sorted lower bounds, [(upper, stats)]) of every reported bundle."""
    tmp: dict[str, list[tuple[int, int, NamespaceBundleStats]]] = {}
    for name in sorted(view.brokers):
        for bundle, stats in view.brokers[name].report.last_stats.items():
            try:
                r = parse_bundle(bundle)
            except InvalidBundle:
                continue
            tmp.setdefault(r.namespace, []).append((r.lower, r.upper, stats))
    out: _Ranges = {}
    for ns, rows in tmp.items():
        rows.sort(key=lambda t: t[0])
        out[ns] = ([t[0] for t in rows], [(t[1], t[2]) for t in rows])
    return out


def estimate_load(bundle: str, data: BundleData, ranges: _Ranges) -> BundleLoad:
    """The bundle's short-term load, or, if never sampled, its share of the reported parent's."""
    if data.short_term.num_samples > 0:
        return BundleLoad.of_data(data)
    found = ranges.get(bundle_namespace(bundle))
    try:
        r = parse_bundle(bundle)
    except InvalidBundle:
        return BundleLoad.of_data(data)
    if found is not None:
        lowers, rows = found
        i = bisect.bisect_right(lowers, r.lower) - 1
        if i >= 0:
            upper, stats = rows[i]
            lower = lowers[i]
            if lower <= r.lower and r.upper <= upper and upper > lower:
                share = (r.upper - r.lower) / (upper - lower)
                return BundleLoad(
                    stats.msg_rate * share,
                    stats.msg_throughput_in * share,
                    stats.msg_throughput_out * share,
                )
    return BundleLoad.of_data(data)


def projected_scores(
    candidates: Sequence[str],
    load: BundleLoad,
    view: ClusterView,
    preallocated: Mapping[str, Mapping[str, BundleData]],
    config: LoadBalancerConfig,
    ranges: _Ranges | None = None,
) -> dict[str, float]:
    """Each known candidate's projected load (fraction) if ``load`` were placed there."""
    model = UsageModel(view, Weights.of(config))
    ranges = ranges if ranges is not None else {}
    scores: dict[str, float] = {}
    for c in sorted(set(candidates)):
        if c not in model.brokers:
            continue
        for name, data in preallocated.get(c, {}).items():
            model.add(c, estimate_load(name, data, ranges))
        scores[c] = model.load_if_added(c, load)
    return scores


class LeastProjectedUsage:
    """Pick the candidate with the lowest projected usage after the placement."""

    name: ClassVar[str] = "LeastProjectedUsage"
    state_type: ClassVar[type] = type(None)

    def __init__(self) -> None:
        self._ranges_for: int | None = None
        self._ranges: _Ranges = {}

    def initial_state(self) -> None:
        """Stateless across selections (the range index above is a per-view cache)."""
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
        if self._ranges_for != id(view):
            # one selector serves one view; index its reported ranges once, not per lookup
            self._ranges, self._ranges_for = reported_ranges(view), id(view)
        load = estimate_load(bundle, bundle_data, self._ranges)
        scores = projected_scores(candidates, load, view, preallocated, config, self._ranges)
        if not scores:
            return None, None
        threshold = config.load_balancer_broker_overloaded_threshold_percentage / 100.0
        fitting = {c: s for c, s in scores.items() if s <= threshold} or scores
        best_score = min(fitting.values())
        best = [c for c in sorted(fitting) if fitting[c] == best_score]
        return None, best[rng.randrange(len(best))] if len(best) > 1 else best[0]
