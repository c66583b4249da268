"""LeastLongTermMessageRate: place a bundle on the broker with the smallest long-term message rate.

Mirrors Pulsar's ``org.apache.pulsar.broker.loadbalance.impl.LeastLongTermMessageRate``, the
default ``loadBalancerLoadPlacementStrategy`` of the modular load manager:

* A broker whose ``max_resource_usage()`` is above
  ``loadBalancerBrokerOverloadedThresholdPercentage`` (85 %) scores ``+inf``, so it is chosen
  only when every candidate is overloaded.
* Otherwise the score is the long-term ``msgRateIn + msgRateOut`` of the broker
  (``TimeAverageBrokerData``) plus that of every bundle preallocated to it in this cycle. The
  preallocation term is what stops herding: the broker's report will not show a new bundle for a
  while, so without it every bundle placed in one cycle would land on the same least-loaded broker.
* Ties at the minimum are broken at random, with the caller's seeded ``rng`` instead of
  ``ThreadLocalRandom``; candidates are visited in sorted order so a seed gives one answer.

Deviations: the overload test uses the unweighted ``getMaxResourceUsage`` (as Pulsar did before it
switched this check to the weighted reading); a candidate missing from the view is ignored rather
than failing the lookup. The strategy is stateless (its state is always ``None``).
"""

from __future__ import annotations

import math
import random
from bisect import bisect_left, insort
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar

from loadbalance.placement.base import Preallocations, pending_msg_rate
from loadbalance.time_average import BundleData
from loadbalance.view import BrokerView, ClusterView

if TYPE_CHECKING:
    from loadbalance.config import LoadBalancerConfig
    from loadbalance.model import LocalBrokerData

_USAGE_MEMO = 4096


def long_term_score(
    broker: BrokerView,
    preallocated: Mapping[str, BundleData],
    overload_threshold: float,
) -> float:
    """The broker's estimated long-term msg/s, or ``inf`` when it is overloaded."""
    if broker.report.max_resource_usage() > overload_threshold:
        return math.inf
    pending_msg_rate_per_s = pending_msg_rate(preallocated)
    return pending_msg_rate_per_s + broker.time_average.long_term_msg_rate


class LeastLongTermMessageRate:
    """Pick the candidate with the least long-term message rate, counting preallocations."""

    name: ClassVar[str] = "LeastLongTermMessageRate"
    state_type: ClassVar[type] = type(None)

    def __init__(self) -> None:
        self._usage: dict[int, tuple[LocalBrokerData, float]] = {}
        self._base_for: ClusterView | None = None
        self._base_threshold = math.nan
        self._base: dict[str, float] = {}
        self._overloaded: set[str] = set()

    def initial_state(self) -> None:
        """Stateless: every selection reads only the view and the preallocations."""
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
        threshold = config.overloaded_threshold
        base, overloaded = self._base_scores(view, threshold)
        known = sorted(set(candidates).intersection(base))
        if not known:
            return None, None
        # long_term_score per candidate: the same additions, the broker's part read once per view
        get = preallocated.get
        scores = []
        for c in known:
            if c in overloaded:
                scores.append(math.inf)
                continue
            pre = get(c)
            if pre is None:
                pending = 0  # pending_msg_rate of nothing: the int 0, as its fold starts
            elif type(pre) is Preallocations:
                pending = pre.long_term_msg_rate
            else:
                pending = pending_msg_rate(pre)
            scores.append(pending + base[c])
        best_score = min(scores)
        best = [c for c, score in zip(known, scores, strict=True) if score == best_score]
        return None, best[rng.randrange(len(best))]

    def _base_scores(
        self, view: ClusterView, threshold: float
    ) -> tuple[dict[str, float], set[str]]:
        """Each broker's long-term msg/s and the overloaded brokers, once per view and
        threshold: a cycle placing thousands of bundles scores every broker for each, and
        neither the reports nor the averages change within it."""
        if self._base_for is not view or self._base_threshold != threshold:
            base: dict[str, float] = {}
            overloaded: set[str] = set()
            for name, broker in view.brokers.items():
                base[name] = broker.time_average.long_term_msg_rate
                if self._max_usage(broker.report) > threshold:
                    overloaded.add(name)
            self._base, self._overloaded = base, overloaded
            self._base_for, self._base_threshold = view, threshold
        return self._base, self._overloaded

    def _max_usage(self, report: LocalBrokerData) -> float:
        """``report.max_resource_usage()``, remembered by report: a cycle placing thousands of
        bundles scores every broker for each, and the reports do not change within it."""
        hit = self._usage.get(id(report))
        if hit is not None and hit[0] is report:
            return hit[1]
        if len(self._usage) >= _USAGE_MEMO:
            self._usage.clear()
        value = report.max_resource_usage()
        self._usage[id(report)] = (report, value)  # holding the report keeps its id its own
        return value


class LeastRateOrder:
    """``LeastLongTermMessageRate``'s scores of a fixed set of brokers, kept sorted by
    (score, name) through one cycle's placements.

    A cycle that places thousands of bundles over hundreds of brokers would otherwise score
    every broker for every bundle, although a placement changes one broker's score only (the
    one it preallocates to). ``BrokerSelector`` walks this order from the least score, skipping
    the brokers its filters drop, and stops after the first broker it keeps and those tied with
    it: the same minimum, the same tied brokers in name order and so the same seeded draw as
    ``select_broker`` over the filtered list.

    Scores are made with the same operations as ``select_broker`` (``inf`` when overloaded,
    else the preallocations' kept msg rate, or the int ``0`` for none, plus the broker's
    long-term rate), read from ``preallocated`` - the selector's own map, which it changes in
    place and then calls ``rescore``. ``usable`` turns false once a score is NaN: a NaN has no
    place in a sorted order (and ``min`` over it depends on its position), so the selector
    goes back to scoring every candidate."""

    def __init__(
        self,
        strategy: LeastLongTermMessageRate,
        view: ClusterView,
        brokers: Iterable[str],
        preallocated: Mapping[str, Preallocations],
        threshold: float,
    ) -> None:
        self._base, self._overloaded = strategy._base_scores(view, threshold)
        self._pre = preallocated
        self._score: dict[str, float] = {}
        self.usable = True
        for name in brokers:
            if name in self._base:
                self._score[name] = self._compute(name)
        self.entries: list[tuple[float, str]] = sorted((s, n) for n, s in self._score.items())

    def _compute(self, name: str) -> float:
        if name in self._overloaded:
            return math.inf
        pre = self._pre.get(name)
        score = (0 if pre is None else pre.long_term_msg_rate) + self._base[name]
        if score != score:
            self.usable = False
        return score

    def rescore(self, name: str) -> None:
        """Move ``name`` to its place for its current preallocations."""
        old = self._score.get(name)
        if old is None or not self.usable:
            return
        new = self._compute(name)
        if not self.usable:
            return
        entries = self.entries
        del entries[bisect_left(entries, (old, name))]
        self._score[name] = new
        insort(entries, (new, name))
