"""The bundles a shedder may move off one broker, ranked by work, their stats fetched lazily.

Why its own module: the plan of ``ProjectedUsageShedder`` ranks every bundle of each broker it
sheds from (thousands at a million bundles) but looks at a window of a few dozen per move, so
the ranking keeps only each bundle's work and name, and a bundle's stats are made when the plan
first looks at it.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Mapping
from typing import NamedTuple

import numpy as np

from loadbalance.bundles import is_system_service_bundle
from loadbalance.model import NamespaceBundleStats
from loadbalance.ranking import order_by_value_then_name
from loadbalance.strategies.usage_projection import KBYTES, BundleLoad
from loadbalance.view import ClusterView

__all__ = ["WINDOW", "Candidate", "Candidates", "movable"]

WINDOW = 16
"""Candidates looked at on each side of the size a move needs, when a broker has many."""


class Candidate(NamedTuple):
    """A bundle that may move. A tuple, so a broker's candidates sort natively, by work then
    name (names are unique within a broker, so ``stats`` is never compared)."""

    work: float
    bundle: str
    stats: NamespaceBundleStats

    @property
    def load(self) -> BundleLoad:
        return BundleLoad.of_stats(self.stats)


class Candidates:
    """A broker's movable bundles sorted by (work, name), each bundle's stats fetched when a
    candidate is first looked at.

    Why not a list of candidates: the plan ranks every bundle of each broker it sheds from
    (thousands at a million bundles) but looks at a window of a few dozen per move, so the
    ranking needs only the work and the name, and the stats come from ``stats_of`` on demand
    (a view over columns makes them one by one instead of a whole broker's)."""

    __slots__ = ("_keys", "_stats_of")

    def __init__(
        self, keys: list[tuple[float, str]], stats_of: Callable[[str], NamespaceBundleStats]
    ) -> None:
        self._keys, self._stats_of = keys, stats_of  # keys sorted, names unique

    def __len__(self) -> int:
        return len(self._keys)

    def __getitem__(self, i: int) -> Candidate:
        work, bundle = self._keys[i]
        return Candidate(work, bundle, self._stats_of(bundle))

    def __iter__(self) -> Iterator[Candidate]:
        stats_of = self._stats_of
        return (Candidate(w, b, stats_of(b)) for w, b in self._keys)

    def window(self, start: int, stop: int) -> list[Candidate]:
        """The candidates at positions ``start`` to ``stop`` (clipped, as a slice is)."""
        stats_of = self._stats_of
        return [Candidate(w, b, stats_of(b)) for w, b in self._keys[start:stop]]

    def copy(self) -> Candidates:
        """A copy to remove picks from while this one keeps them (a trial plan's)."""
        return Candidates(list(self._keys), self._stats_of)

    def first_at_least(self, work: float) -> int:
        """``bisect_left`` of ``work`` over the candidates' work."""
        return bisect.bisect_left(self._keys, (work,))

    def remove(self, pick: Candidate) -> None:
        """Remove ``pick``, found by bisection (names are unique, so the key is its own)."""
        del self._keys[bisect.bisect_left(self._keys, (pick.work, pick.bundle))]


def movable(view: ClusterView, broker: str, held: Mapping[str, object]) -> Candidates:
    """The broker's bundles that may move now, sorted by work (ties by name): not in the grace
    period, not in ``held`` (moves in flight), and never a heartbeat,
    SLA-monitor and ``pulsar/system`` bundles never move (``is_system_service_bundle``).

    Built only for brokers the plan actually sheds from: with 100k bundles most brokers are
    never a source in a cycle. A ``lastStats`` that offers ``sample_columns()`` (the streaming
    driver's view: the names and their figures as one array) is ranked from the columns, with
    the same float operations, and ``stat(name)`` makes the value of a bundle looked at.
    """
    recent = view.recently_unloaded
    stats = view.brokers[broker].report.last_stats
    bulk = getattr(stats, "sample_columns", None)
    columns = bulk() if bulk is not None else None
    if columns is not None:
        names, values = columns  # STAT_COLUMNS: throughput in, out, rate in, out
        work = values[:, 2] + values[:, 3] + (values[:, 0] + values[:, 1]) / KBYTES
        kept = [
            i
            for i in np.flatnonzero(work > 0).tolist()  # work > 0: never a NaN
            if names[i] not in recent
            and names[i] not in held
            and not is_system_service_bundle(names[i])
        ]
        kept_names = [names[i] for i in kept]
        kept_work = work[kept]
        order = order_by_value_then_name(kept_work, kept_names)
        works = kept_work.tolist()
        stat = getattr(stats, "stat", stats.__getitem__)
        return Candidates([(works[i], kept_names[i]) for i in order], stat)
    raw: list[tuple[float, str]] = []
    made: dict[str, NamespaceBundleStats] = {}
    for bundle, s in stats.items():
        if bundle in recent or bundle in held or is_system_service_bundle(bundle):
            continue
        work = (
            s.msg_rate_in + s.msg_rate_out + (s.msg_throughput_in + s.msg_throughput_out) / KBYTES
        )
        if work > 0:
            raw.append((work, bundle))
            made[bundle] = s
    raw.sort()  # (work, bundle): work > 0 above, so never a NaN
    return Candidates(raw, made.__getitem__)
