"""The decoded shards' arrays laid end to end for one view, and what a view takes from each
broker's bundle list: the per-broker sums, report digests and rows that ``ViewAssembler`` keeps
between cycles."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import astuple, dataclass
from typing import TYPE_CHECKING

import numpy as np

from loadbalance.bundles import bundle_namespace
from loadbalance.model import LocalBrokerData
from loadbalance.time_average import BundleData, TimeAverageBrokerData
from loadbalance.view import ReportDigest

if TYPE_CHECKING:
    from streaming.decoded_shards import Made

DEFAULT_SUMS = tuple(astuple(TimeAverageBrokerData.of([BundleData.new()])))
"""A bundle without data in ``TimeAverageBrokerData`` order (``build_view``'s default)."""


def _max_or_minus_inf(values: np.ndarray) -> float:
    """The largest value that is not NaN, as a float; -inf when there is none (the start value
    of ``view._digest``'s running maximum, which a NaN never replaces)."""
    values = values[~np.isnan(values)]
    return float(values.max()) if len(values) else -math.inf


class Columns:
    """The decoded shards' arrays end to end (shards in key order), for per-broker figures.

    Sums: ``build_view`` would sum 100,000 bundle objects in Python; here a broker's rows are
    gathered (Pulsar's defaults for bundles without data or left out of the view) and each
    column is summed with ``math.fsum``, the correctly rounded sum ``TimeAverageBrokerData.of``
    uses, so the bits are the same whatever the order (a unit test checks this).

    Digests: what ``ingest_many`` works out as it folds a report, made here over the broker's
    ``lastStats`` (the bundles it reports and was the last to report): the maxima the split
    scan reads to skip a broker none of whose bundles is over a limit, and the namespace counts
    placement reads. Without them the split scan walks every bundle of every broker (1.2 s at a
    million bundles). The maxima are over the same figures with the same float additions as
    ``view._digest`` (a NaN is never a maximum, as there), so a skipped broker is one the scan
    would have found nothing in."""

    def __init__(self, made: Mapping[str, Made]) -> None:
        keys = sorted(made)
        states = [made[key].state for key in keys]
        self.offset: dict[str, int] = {}
        total = 0
        for key, state in zip(keys, states, strict=True):
            self.offset[key] = total
            total += len(state)
        self.default_row = total  # the last row: a bundle without data
        # each column filled in place, shard by shard (one copy of every array)
        self.values = np.empty((total + 1, 8))
        self.last = np.empty((total + 1, 4))  # the last samples (``LastStats.sample_columns``)
        counts = np.empty((total + 1, 3), dtype=np.int64)
        for key, state in zip(keys, states, strict=True):
            at, n = self.offset[key], len(state)
            self.values[at : at + n, :4] = state.short_avg
            self.values[at : at + n, 4:] = state.long_avg
            self.last[at : at + n] = state.last_values
            counts[at : at + n] = state.last_counts
        self.values[total] = DEFAULT_SUMS
        self.last[total] = 0.0
        counts[total] = 0
        self.topics = counts[:, 0]
        self.sessions = counts[:, 1] + counts[:, 2]  # consumers + producers
        long_avg = self.values[:, 4:]  # the default row is never judged (``digest``)
        self.rate = long_avg[:, 2] + long_avg[:, 3]  # STAT_COLUMNS: rates in, out
        self.throughput = long_avg[:, 0] + long_avg[:, 1]  # throughputs in, out

    def time_average(self, rows: np.ndarray, sums: Sums, broker: str) -> TimeAverageBrokerData:
        """The broker's sums over ``rows``, from ``sums`` when the same values were summed
        before (compared bit for bit: ``fsum`` is exact, so equal values give equal sums)."""
        block = self.values[rows]
        kept = sums.get(broker)
        if (
            kept is not None
            and kept[0].shape == block.shape
            and np.array_equal(kept[0].view(np.int64), block.view(np.int64))
        ):
            return kept[1]
        got = TimeAverageBrokerData(*(math.fsum(c) for c in block.T.tolist()))
        sums[broker] = (block, got)
        return got

    def digest(
        self, report: LocalBrokerData, stats_rows: list[int], counts: dict[str, int]
    ) -> ReportDigest:
        judged = np.asarray(stats_rows, dtype=np.int64)
        judged = judged[self.topics[judged] >= 2]  # the split scan judges these alone
        return ReportDigest(
            report,
            None,  # the sums are passed to ``build_view`` as ``time_averages``
            int(self.topics[judged].max()) if len(judged) else -1,
            int(self.sessions[judged].max()) if len(judged) else -1,
            _max_or_minus_inf(self.rate[judged]),
            _max_or_minus_inf(self.throughput[judged]),
            dict(counts),
        )


Sums = dict[str, tuple[np.ndarray, TimeAverageBrokerData]]
"""broker -> the values its time average was last summed over, and that sum."""


@dataclass(frozen=True, slots=True, eq=False)
class BrokerRows:
    """What a view takes from one broker's bundle list: each bundle's row in ``Columns`` (the
    defaults' row for a bundle without data or left out), the bundles that make its
    ``lastStats`` (those it was the last to report) and their rows, and its bundles per
    namespace. Kept between views while the list, the row numbering, the bundles left out and
    the last reporters of its bundles stay the same: a cycle over a million bundles would
    otherwise look up every bundle of every broker again (most of a view's time)."""

    listed: list[str]  # the report's list, as given
    members: list[str]  # the same without repeats
    rows: np.ndarray  # each member's row (int64)
    names: list[str]
    judged: list[int]
    counts: dict[str, int]
    bundle_set: frozenset[str]  # the members as the report's ``bundles``
    # name test -> the members it is true of (the shedders' system-namespace test, asked again
    # every cycle while the list stays the same)
    tested: dict[Callable[[str], bool], frozenset[str]]

    def matching(self, test: Callable[[str], bool]) -> frozenset[str]:
        """The members ``test`` is true of, worked out once per list and test."""
        found = self.tested.get(test)
        if found is None:
            found = self.tested[test] = frozenset(b for b in self.members if test(b))
        return found

    @classmethod
    def of(
        cls,
        broker: str,
        listed: list[str],
        where: Mapping[str, tuple[str, int]],
        outside: frozenset[str],
        owners: Mapping[str, list[str]],
        columns: Columns,
    ) -> BrokerRows:
        members = list(dict.fromkeys(listed))
        rows, names, judged = [], [], []
        for b in members:
            at = where.get(b)
            if at is None or b in outside:
                rows.append(columns.default_row)
                continue
            row = columns.offset[at[0]] + at[1]
            rows.append(row)
            if owners[at[0]][at[1]] == broker:
                names.append(b)
                judged.append(row)
        counts = dict(Counter(map(bundle_namespace, members)))
        row_array = np.array(rows, dtype=np.int64)
        return cls(list(listed), members, row_array, names, judged, counts, frozenset(members), {})
