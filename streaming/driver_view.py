"""The decision stage's copy of the averaged cluster view, kept on the driver between batches.

Why a separate copy: the policies need the whole cluster at once, while the state step only
emits what a batch touched. So the driver keeps every state shard as the state step stored it
(its latest whole record and the delta records after it) and the latest row of every broker,
and builds a ``ClusterView`` from them for ``cycle.step``. It is also what the job writes to
Redis as the load snapshot (only the records and brokers a batch changed), and what a restarted
job reads back from there, so the view after a restart is the view before it.

The snapshot is the published load-snapshot format (``metadata_store.load_snapshot``,
``docs/snapshot-format.md``): ``P:load:shards`` bundle shard ``s:<n>`` -> its whole record and
``s:<n>+<k>`` -> its k-th delta record, as the state step emitted them; ``P:load:brokers`` broker ->
``{"report": <LocalBrokerData JSON without lastStats>, "historyUsage", "weightedMaxEma",
"msgThroughputEma", "updatedAtMs"}``, the ``brokers`` entry of ``lbctl decide``'s snapshot,
floats written with ``repr`` and so read back bit for bit.

Why the driver keeps this copy rather than reading the snapshot back from Redis for each cycle:
the copy is what lets a cycle decode only the shards that changed since the last one (or since
the background warm-up) and keep the values it made for unchanged bundles, and it costs no more
than the bytes the batch already brought to the driver; a full read and decode per cycle would
cost more than a batch (``docs/benchmarks.md``, streaming job).

Records are decoded only when a policy cycle needs them, and then only what changed since the
previous cycle: the new deltas applied to a copy of the shard decoded before, or a new whole
record (with reports every few seconds and policies every minute, most records are replaced
before anyone reads them). The cycle's view reads the decoded arrays through lazy
mappings (``bundle_data``, each broker's ``lastStats``): a bundle's frozen values are made the
first time a policy reads them, a whole broker at once, and kept while its row is unchanged. The
per-broker figures every cycle needs (the sums, the report digests) come from the arrays, so a
cycle over a million bundles makes values only for the brokers its policies look at; a broker's
sums are kept while the values they were made from stay the same, and the warm-up before a
cycle makes them ahead. Policies that rank all of a broker's bundles (the shedders) ask the view
for the ranking or the figures as arrays (``short_term_ranking``, ``_LastStats.sample_columns``)
instead of reading a value per bundle.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import astuple, dataclass
from operator import itemgetter
from types import MappingProxyType
from typing import Any

import numpy as np
import pandas as pd

from loadbalance.bundles import NamespaceBundles, bundle_namespace
from loadbalance.model import LocalBrokerData, NamespaceBundleStats, ResourceUsage
from loadbalance.ranking import order_by_value_then_name
from loadbalance.time_average import (
    NUM_LONG_SAMPLES,
    NUM_SHORT_SAMPLES,
    BundleData,
    TimeAverageBrokerData,
    TimeAverageMessageData,
)
from loadbalance.view import (
    BrokerLoad,
    ClusterView,
    LoadState,
    ReportDigest,
    UsageWeights,
    build_view,
)
from metadata_store.load_snapshot import (
    decode_bundle_shard,
    delta_key,
    record_names,
    shard_bundle_count,
    split_field,
)
from streaming.schema import BROKER, BROKER_GONE, SHARD, SHARD_DELTA
from streaming.shard_state import ShardState

log = logging.getLogger("streaming.driver_view")

_DEFAULT_SUMS = np.array(astuple(TimeAverageBrokerData.of([BundleData.new()])))
"""A bundle without data in ``TimeAverageBrokerData`` order (``build_view``'s default)."""

_RESOURCES = (
    ("cpu", "cpu"),
    ("memory", "memory"),
    ("directMemory", "direct_memory"),
    ("bandwidthIn", "bandwidth_in"),
    ("bandwidthOut", "bandwidth_out"),
)


def report_from_doc(
    doc: Mapping[str, Any],
    broker: str,
    last_stats: Mapping[str, NamespaceBundleStats],
    bundles: frozenset[str] | None = None,
) -> LocalBrokerData:
    """Rebuild a report the codec already validated (no second validation: 5,000 bundle names
    per report would cost more than the rest of the decision stage). ``last_stats`` is used as
    given, so it must be read-only (the view passes a lazy ``_LastStats``); so is ``bundles``,
    the set of the document's bundle list when the caller has it already."""
    kw = {
        attr: ResourceUsage(float(doc[key]["usage"]), float(doc[key]["limit"]))
        for key, attr in _RESOURCES
        if isinstance(doc.get(key), dict)
    }
    return LocalBrokerData(
        broker=broker,
        msg_throughput_in=float(doc.get("msgThroughputIn", 0.0)),
        msg_throughput_out=float(doc.get("msgThroughputOut", 0.0)),
        msg_rate_in=float(doc.get("msgRateIn", 0.0)),
        msg_rate_out=float(doc.get("msgRateOut", 0.0)),
        num_topics=int(doc.get("numTopics", 0)),
        num_bundles=int(doc.get("numBundles", 0)),
        num_consumers=int(doc.get("numConsumers", 0)),
        num_producers=int(doc.get("numProducers", 0)),
        bundles=frozenset(doc.get("bundles") or ()) if bundles is None else bundles,
        last_stats=last_stats,
        last_update_ms=int(doc.get("lastUpdate", 0)),
        web_service_url=doc.get("webServiceUrl") or "",
        pulsar_service_url=doc.get("pulsarServiceUrl") or "",
        broker_version=doc.get("brokerVersionString") or "",
        **kw,
    )


class _Made:
    """One decoded shard blob and the core's values made from it so far (by row).

    Never changed once a view may read it, except that its caches fill: a changed blob gets a
    new ``_Made`` (keeping the cached values of the rows that did not change), so a view taken
    before keeps reading the state it was taken from."""

    __slots__ = ("blob", "data", "deltas", "state", "stats")

    def __init__(
        self,
        blob: bytes,
        state: ShardState,
        deltas: int = 0,
        data: dict[int, BundleData] | None = None,
        stats: dict[int, NamespaceBundleStats] | None = None,
    ) -> None:
        # the whole record decoded, and how many of its delta records are applied
        self.blob, self.state, self.deltas = blob, state, deltas
        self.data: dict[int, BundleData] = data if data is not None else {}
        self.stats: dict[int, NamespaceBundleStats] = stats if stats is not None else {}

    def make(self, rows: list[int]) -> None:
        """The values of ``rows`` not made yet, in one vectorised pass (float columns in
        ``STAT_COLUMNS`` order): the averages here, the last samples by ``make_stats``."""
        todo = [r for r in rows if r not in self.data]
        if not todo:
            return
        st, data = self.state, self.data
        for i, s, sn, lg, ln, topics in zip(
            todo,
            st.short_avg[todo].tolist(),
            st.short_n[todo].tolist(),
            st.long_avg[todo].tolist(),
            st.long_n[todo].tolist(),
            st.last_counts[todo, 0].tolist(),
            strict=True,
        ):
            data[i] = BundleData(
                TimeAverageMessageData(NUM_SHORT_SAMPLES, sn, *s),
                TimeAverageMessageData(NUM_LONG_SAMPLES, ln, *lg),
                topics,
            )
        self.make_stats(todo)

    def make_stats(self, rows: list[int]) -> None:
        """The last samples (``lastStats`` values) of ``rows`` not made yet, without their
        averages: a policy that ranks a broker's bundles by its report (ProjectedUsageShedder
        reads every bundle of each broker it may shed from) needs only these, and the averages
        are two thirds of what ``make`` builds."""
        todo = [r for r in rows if r not in self.stats]
        if not todo:
            return
        stats = self.stats
        for i, la, c in zip(
            todo,
            self.state.last_values[todo].tolist(),
            self.state.last_counts[todo].tolist(),
            strict=True,
        ):
            stats[i] = NamespaceBundleStats(la[2], la[3], la[0], la[1], *c)


Where = Mapping[str, tuple[str, int]]  # bundle -> (state shard key, row)


def _make_all(
    made: Mapping[str, _Made], where: Where, names: Iterable[str], stats_only: bool = False
) -> None:
    """Make the values of ``names`` (all known), grouped by shard; with ``stats_only`` only
    their last samples (``_Made.make_stats``)."""
    by_shard: dict[str, list[int]] = {}
    for name in names:
        key, row = where[name]
        by_shard.setdefault(key, []).append(row)
    for key, rows in by_shard.items():
        if stats_only:
            made[key].make_stats(rows)
        else:
            made[key].make(rows)


class _BundleData(Mapping[str, BundleData]):
    """The view's ``bundle_data``: every bundle held but those ``outside`` the namespaces,
    made from the shard arrays when first read.

    Why lazy: a cycle over a million bundles reads the values of the bundles on the brokers
    its policies look at, seldom all; making a million frozen values costs seconds."""

    __slots__ = ("_brokers", "_columns", "_len", "_made", "_outside", "_rows", "_where")

    def __init__(
        self,
        made: Mapping[str, _Made],
        where: Where,
        outside: frozenset[str],
        columns: _Columns,
        rows: Mapping[str, int],
        brokers: Mapping[str, _BrokerRows] | None = None,
    ):
        self._made, self._where, self._outside = made, where, outside
        # the view's columns and each bundle's row in them (``short_term_totals`` reads them)
        self._columns, self._rows = columns, rows
        # broker -> the rows the view took from its list (and the report's bundle set)
        self._brokers = brokers or {}
        self._len = len(where) - sum(1 for n in outside if n in where)

    def __getitem__(self, name: str) -> BundleData:
        at = self._where.get(name)
        if at is None or name in self._outside:
            raise KeyError(name)
        made = self._made[at[0]]
        data = made.data.get(at[1])
        if data is None:
            made.make([at[1]])
            data = made.data[at[1]]
        return data

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self[name]
        except KeyError:
            return default

    def prefetch(self, names: Iterable[str]) -> None:
        """Make the values of ``names`` (those held and not left out) now, a shard at a time:
        placement reads thousands of moved bundles one by one, and a value made alone costs
        as much as fifty made together."""
        where, outside = self._where, self._outside
        _make_all(self._made, where, (n for n in names if n in where and n not in outside))

    def short_term_totals(self, names: list[str], by_msg_rate: bool) -> list[float | None]:
        """Each name's short-term throughput (or with ``by_msg_rate`` msg rate) in + out, as
        ``d.short_term.msg_throughput_in + d.short_term.msg_throughput_out`` of its value
        would give it (one float64 addition of the same two numbers), ``None`` for a name
        without data; for ``shedding.selection.sheddable_bundles``, which ranks every bundle of
        a shedding broker and would otherwise make a value for each."""
        first, second = (2, 3) if by_msg_rate else (0, 1)  # STAT_COLUMNS: rates after throughputs
        # one lookup per name and two gathers (the columns' first four are the short-term)
        rows = self._rows_of(names)
        values = self._columns.values
        found = rows >= 0
        picked = rows[found]
        totals = (values[picked, first] + values[picked, second]).tolist()
        out: list[float | None] = [None] * len(names)
        for pos, total in zip(np.flatnonzero(found).tolist(), totals, strict=True):
            out[pos] = total
        return out

    def short_term_ranking(
        self,
        broker: str,
        bundles: frozenset[str],
        recent: Collection[str],
        taken: Collection[str],
        skip_name: Callable[[str], bool],
        by_msg_rate: bool,
        unseen: float,
    ) -> list[tuple[str, float]] | None:
        """``shedding.selection.sheddable_bundles`` for one broker of this view, ranked here:
        (bundle, short-term in + out) of the broker's bundles in neither ``recent`` nor
        ``taken`` and not ``skip_name``, largest first, ties by name, ``unseen`` for a bundle
        without data.

        Why: a shedding broker's bundles are already numbered in the view (``_BrokerRows``),
        so their sums are two gathers and their order one ``argsort``, where the generic path
        looks up each name in a million-entry index and sorts tuples in Python. ``None`` (the
        caller ranks the generic way) when ``bundles`` is not the set this view took the rows
        from, or a sum is NaN (Python's sort leaves a NaN where the input order puts it)."""
        got = self._brokers.get(broker)
        if got is None or got.bundle_set is not bundles:
            return None
        members, rows = got.members, got.rows
        system = got.matching(skip_name)
        drop = set(system)
        if taken:
            drop.update(bundles.intersection(taken))  # C loops: over the smaller of the two
        if recent:
            keys = getattr(recent, "keys", None)
            drop.update(keys() & bundles if keys is not None else bundles.intersection(recent))
        if drop:
            picked = np.flatnonzero([b not in drop for b in members])
            members = [members[i] for i in picked.tolist()]
            rows = rows[picked]
        first, second = (2, 3) if by_msg_rate else (0, 1)  # STAT_COLUMNS: rates after throughputs
        values = self._columns.values
        totals = values[rows, first] + values[rows, second]
        totals[rows == self._columns.default_row] = unseen
        if np.isnan(totals).any():
            return None
        order_list = order_by_value_then_name(totals, members, descending=True)
        sums = totals.tolist()
        return [(members[i], sums[i]) for i in order_list]

    def _rows_of(self, names: list[str]) -> np.ndarray:
        """Each name's row in the view's columns, -1 for a name without data or left out.

        One C-level lookup of every name (``itemgetter``) in the usual case, a bundle list with
        every name known and none left out; else one by one."""
        outside, rows = self._outside, self._rows
        if len(names) > 1 and (not outside or outside.isdisjoint(names)):
            try:
                return np.array(itemgetter(*names)(rows), dtype=np.int64)
            except KeyError:
                pass
        get = rows.get
        return np.fromiter(
            (-1 if n in outside else get(n, -1) for n in names), np.int64, len(names)
        )

    def __contains__(self, name: object) -> bool:
        return name in self._where and name not in self._outside

    def __iter__(self) -> Iterator[str]:
        outside = self._outside
        return (n for n in self._where if n not in outside)

    def __len__(self) -> int:
        return self._len


class _LastStats(Mapping[str, NamespaceBundleStats]):
    """A broker's ``lastStats`` in the view: the bundles it reports and was the last to report,
    in its report's order, made from the shard arrays the first time any is read (a policy
    that reads one bundle of a broker reads most of them)."""

    __slots__ = ("_columns", "_made", "_names", "_ready", "_rows", "_set", "_where")

    def __init__(
        self,
        names: list[str],
        made: Mapping[str, _Made],
        where: Where,
        columns: _Columns | None = None,
        rows: list[int] | None = None,
    ) -> None:
        self._names, self._made, self._where = names, made, where
        # the view's columns and the names' rows in them (``sample_columns``)
        self._columns, self._rows = columns, rows
        self._set: frozenset[str] | None = None
        self._ready = False

    def sample_columns(self) -> tuple[list[str], np.ndarray] | None:
        """The names in this mapping's order and their last samples, one row each, columns
        in ``STAT_COLUMNS`` order (throughputs in, out, rates in, out): the figures the values
        of this mapping hold, for a policy that ranks all of a broker's bundles and then
        reads few (ProjectedUsageShedder); ``None`` without the view's columns."""
        if self._columns is None or self._rows is None:
            return None
        return self._names, self._columns.last[np.asarray(self._rows, dtype=np.int64)]

    def stat(self, name: str) -> NamespaceBundleStats:
        """``self[name]``, making only that bundle's value (``__getitem__`` makes the whole
        broker's at the first read, which a policy reading few of them need not pay for)."""
        if name not in self._members():
            raise KeyError(name)
        key, row = self._where[name]
        made = self._made[key]
        value = made.stats.get(row)
        if value is None:
            made.make_stats([row])
            value = made.stats[row]
        return value

    def _members(self) -> frozenset[str]:
        if self._set is None:
            self._set = frozenset(self._names)
        return self._set

    def __getitem__(self, name: str) -> NamespaceBundleStats:
        if name not in self._members():
            raise KeyError(name)
        if not self._ready:
            _make_all(self._made, self._where, self._names, stats_only=True)
            self._ready = True
        key, row = self._where[name]
        return self._made[key].stats[row]

    def __contains__(self, name: object) -> bool:
        return name in self._members()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


BACKGROUND_NICE = 10
"""Niceness added to the threads that build a view or run a cycle in the background."""


def lower_thread_priority(nice: int = BACKGROUND_NICE) -> None:
    """Make the calling thread ``nice`` steps nicer (Linux schedules threads separately).

    Why: a background view build or policy cycle needs about a second of CPU; at equal
    priority it takes one of two cores from the Spark batch it overlaps and slows every report
    of that batch, while a nicer thread uses what the batches leave. No-op off Linux, where
    the id of a thread is not a process id."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + nice)
    except OSError:  # not allowed here: run at the normal priority
        pass


_GC_LOCK = threading.Lock()
_GC_HOLDS = [0, False]  # threads inside gc_paused(), and whether the collector was on before
_GC_FROZEN = [0]  # freezes since the frozen objects were last handed back to the collector

FREEZES_PER_SWEEP = 10
"""How many pauses end in ``gc.freeze()`` before one ends in ``gc.unfreeze()`` instead."""


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a view is materialised or a cycle runs.

    Why: a view holds about four objects per bundle (half a million at 100,000 bundles), and
    building tens of thousands of new ones triggers full collections that walk all of them
    (a large share of a cycle's time). The objects are plain values without reference cycles, freed
    by reference counting; collection resumes when the last thread leaves (threads may nest).

    When it resumes, the objects then alive are frozen (``gc.freeze``: moved where collections
    do not walk them; reference counting still frees them): otherwise the first collections
    after a cycle at a million bundles walk everything the cycle made, young and old, and took
    0.3-0.5 s of the batch that publishes its decisions. Every ``FREEZES_PER_SWEEP``-th time
    they are handed back instead (``gc.unfreeze``) and one full collection runs, so that cyclic
    garbage frozen with them is collected and memory stays bounded."""
    with _GC_LOCK:
        if _GC_HOLDS[0] == 0:
            _GC_HOLDS[1] = gc.isenabled()
            gc.disable()
        _GC_HOLDS[0] += 1
    try:
        yield
    finally:
        sweep = False
        with _GC_LOCK:
            _GC_HOLDS[0] -= 1
            if _GC_HOLDS[0] == 0 and _GC_HOLDS[1]:
                _GC_FROZEN[0] += 1
                if _GC_FROZEN[0] >= FREEZES_PER_SWEEP:
                    gc.unfreeze()
                    _GC_FROZEN[0] = 0
                    sweep = True
                else:
                    gc.freeze()
                gc.enable()
        if sweep:  # outside the lock: a collection runs finalizers, which may take locks
            gc.collect()


def _max_or_minus_inf(values: np.ndarray) -> float:
    """The largest value that is not NaN, as a float; -inf when there is none (the start value
    of ``view._digest``'s running maximum, which a NaN never replaces)."""
    values = values[~np.isnan(values)]
    return float(values.max()) if len(values) else -math.inf


def _changed_rows(old: ShardState, new: ShardState) -> np.ndarray:
    """Rows of ``new`` whose values differ from ``old`` (same bundles in the same order), bit
    for bit (so 0.0 and -0.0 differ, as they would in a fresh materialisation)."""

    def differ(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        d = a.view(np.int64) != b.view(np.int64)
        return d.any(axis=1) if d.ndim == 2 else d

    changed = differ(old.short_avg, new.short_avg) | differ(old.long_avg, new.long_avg)
    changed |= differ(old.last_values, new.last_values) | differ(old.last_counts, new.last_counts)
    changed |= (old.short_n != new.short_n) | (old.long_n != new.long_n)
    if old.owners != new.owners:
        changed |= np.array(old.owners, dtype=object) != np.array(new.owners, dtype=object)
    return np.flatnonzero(changed)


_EMPTY_RECORD = ShardState().to_bytes()


def _kept(old: _Made, blob: bytes, state: ShardState, deltas: int, changed: np.ndarray) -> _Made:
    """A new ``_Made`` for ``state`` keeping ``old``'s values of the rows not in ``changed``
    (the rows keep their numbers: a shard only grows at its end between whole records)."""
    drop = set(changed.tolist())
    data = {r: v for r, v in old.data.items() if r not in drop}
    stats = {r: v for r, v in old.stats.items() if r not in drop}
    return _Made(blob, state, deltas, data, stats)


class _Columns:
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

    def __init__(self, made: Mapping[str, _Made]) -> None:
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
        self.last = np.empty((total + 1, 4))  # the last samples (``_LastStats.sample_columns``)
        counts = np.empty((total + 1, 3), dtype=np.int64)
        for key, state in zip(keys, states, strict=True):
            at, n = self.offset[key], len(state)
            self.values[at : at + n, :4] = state.short_avg
            self.values[at : at + n, 4:] = state.long_avg
            self.last[at : at + n] = state.last_values
            counts[at : at + n] = state.last_counts
        self.values[total] = _DEFAULT_SUMS
        self.last[total] = 0.0
        counts[total] = 0
        self.topics = counts[:, 0]
        self.sessions = counts[:, 1] + counts[:, 2]  # consumers + producers
        long_avg = self.values[:, 4:]  # the default row is never judged (``digest``)
        self.rate = long_avg[:, 2] + long_avg[:, 3]  # STAT_COLUMNS: rates in, out
        self.throughput = long_avg[:, 0] + long_avg[:, 1]  # throughputs in, out

    def time_average(self, rows: np.ndarray, sums: _Sums, broker: str) -> TimeAverageBrokerData:
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


_Sums = dict[str, tuple[np.ndarray, TimeAverageBrokerData]]
"""broker -> the values its time average was last summed over, and that sum."""


@dataclass(frozen=True, slots=True, eq=False)
class _BrokerRows:
    """What a view takes from one broker's bundle list: each bundle's row in ``_Columns`` (the
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
        columns: _Columns,
    ) -> _BrokerRows:
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


class DriverView:
    """Latest shard records and broker rows; see the module docstring."""

    def __init__(self) -> None:
        self._shards: dict[str, bytes] = {}  # state shard key -> its latest whole record
        # and the delta records after it: (k of its field ``s:<n>+<k>``, record), in order
        self._deltas: dict[str, tuple[tuple[int, bytes], ...]] = {}
        self._counts: dict[str, int] = {}  # bundles per shard
        # per shard: the blob last decoded for a view, its state and the values made from it
        self._made: dict[str, _Made] = {}
        # bundle -> (shard key, row) in ``_made``; replaced, never changed, when names change,
        # so a view keeps the index it was taken with
        self._where: dict[str, tuple[str, int]] = {}
        self._lock = threading.Lock()  # decoding: a policy cycle or a warm-up thread
        self._warming: threading.Thread | None = None
        # per broker, what a view took from its bundle list (``_BrokerRows``), and the bundles
        # whose last reporter changed since the last view (they may join or leave a lastStats)
        self._rows_cache: dict[str, _BrokerRows] = {}
        self._rows_where: Mapping[str, tuple[str, int]] | None = None
        self._rows_outside: frozenset[str] = frozenset()
        self._moved: set[str] = set()
        # per broker, the values its last time average was summed over and the sums (summing
        # a million bundles' eight columns exactly costs a third of a second; the warm-up sums
        # ahead, so that a cycle sums only the brokers that reported since)
        self._sums: _Sums = {}
        self._global_rows: Mapping[str, int] = {}
        self._global_where: Mapping[str, tuple[str, int]] | None = None
        # broker -> (report document, history usage, throughput EMA, event ms, weightedMaxEMA)
        self._brokers: dict[str, tuple[dict[str, Any], float, float, int, float]] = {}
        self._ns_names: dict[str, tuple[tuple[int, ...], frozenset[str]]] = {}
        # the last answer of ``_outside`` and the bundle index it was for
        self._outside_for: tuple[Where, frozenset[str]] | None = None
        self.changed_brokers: dict[str, str] = {}  # snapshot documents to write
        self.removed_brokers: set[str] = set()
        self.changed_shards: dict[str, bytes] = {}
        self.removed_shards: set[str] = set()

    @property
    def broker_names(self) -> list[str]:
        return sorted(self._brokers)

    def __len__(self) -> int:
        """Bundles held (including any a split or merge removed that the state still keeps)."""
        return sum(self._counts.values())

    # -- applying a batch ---------------------------------------------------------------------
    def apply(self, pdf: pd.DataFrame) -> None:
        """Apply one batch of state output rows (each key appears once per kind in a batch)."""
        kinds = pdf["kind"]
        shards = pdf[kinds.isin((SHARD, SHARD_DELTA))]
        for kind, name, payload, n in zip(
            shards["kind"].tolist(),
            shards["name"].tolist(),
            shards["payload"].tolist(),
            shards["bundles"].tolist(),
            strict=True,
        ):
            if kind == SHARD:
                record = bytes(payload)
                self._set_shard(name, record, shard_bundle_count(record))
            else:
                self._add_delta(name, bytes(payload), int(n))
        reported = set()
        for row in pdf[kinds == BROKER].itertuples(index=False):
            usage, ema, event_ms = row.history_usage, row.msg_throughput_ema, row.event_ms
            wmax = row.weighted_max_ema
            self._brokers[row.name] = (json.loads(row.doc), usage, ema, event_ms, wmax)
            self.changed_brokers[row.name] = (
                f'{{"report":{row.doc},"historyUsage":{usage!r},"weightedMaxEma":{wmax!r},'
                f'"msgThroughputEma":{ema!r},"updatedAtMs":{event_ms}}}'
            )
            self.removed_brokers.discard(row.name)
            reported.add(row.name)
        for name in pdf.loc[kinds == BROKER_GONE, "name"].tolist():
            if name in self._brokers and name not in reported:
                self._brokers.pop(name)
                self.changed_brokers.pop(name, None)
                self.removed_brokers.add(name)

    def _set_shard(self, key: str, blob: bytes, n: int) -> None:
        """A shard's whole record (its deltas are dropped, here and in the snapshot)."""
        for k, _ in self._deltas.pop(key, ()):
            field = delta_key(key, k)
            self.changed_shards.pop(field, None)
            self.removed_shards.add(field)
        if n:
            self._shards[key], self._counts[key], self._deltas[key] = blob, n, ()
            self.changed_shards[key] = blob
            self.removed_shards.discard(key)
        else:  # every bundle of the shard expired
            self._shards.pop(key, None)
            self._counts.pop(key, None)
            self.changed_shards.pop(key, None)
            self.removed_shards.add(key)

    def _add_delta(self, field: str, record: bytes, n: int) -> None:
        """A shard's next delta record (``field`` is ``s:<n>+<k>``)."""
        key, k = split_field(field)
        deltas = self._deltas.get(key, ())
        if key not in self._shards or k != (deltas[-1][0] if deltas else 0) + 1:
            # The state step stores what it emits and this view is committed with each batch,
            # so they disagree only when the snapshot in Redis was lost or changed behind the
            # job's back. The delta is applied to what is held (nothing, for a lost record):
            # the bundles of every broker that reports are back at once, the whole shard at
            # its next whole record (``shard_state.compaction_due``).
            log.warning(
                "delta record %s does not follow the records held for shard %s (the load "
                "snapshot was lost or changed); the shard is whole again at its next record",
                field,
                key,
            )
            self._shards.setdefault(key, _EMPTY_RECORD)
        self._deltas[key] = (*deltas, (k, record))
        self._counts[key] = n
        self.changed_shards[field] = record
        self.removed_shards.discard(field)

    # -- views and snapshots ------------------------------------------------------------------
    def cluster_view(
        self,
        namespaces: Mapping[str, NamespaceBundles],
        live: Collection[str] | None = None,
    ) -> ClusterView:
        """The view for one policy cycle; with ``live``, only those brokers (the registry's).

        Why ``live``: the job learns that a broker stopped reporting only when its report
        timeout passes, a cycle or more after a graceful leave ended its registration. Pulsar's
        leader considers only the brokers its registry lists, and so does the fast model; a
        cycle that still counted a departed broker planned transfers to it that the controller
        then refused, while the grace period held the bundles it had meant to move.

        Bundles a namespace's current boundaries no longer contain (split or merged away, kept
        by the state step until they expire) are left out. Every broker's ``lastStats`` is
        rebuilt from the bundles it reports and was the last to report, so the view is a
        function of the blobs and broker rows alone, and a view rebuilt from Redis after a
        restart is the same."""
        self.wait_warm()
        self._decode_all(self._records())
        made, where = dict(self._made), self._where  # this view's; the next batch replaces them
        outside = self._outside(namespaces, where)
        columns = _Columns(made)
        owners = {key: m.state.owners for key, m in made.items()}
        cache = self._rows_cache
        if where is not self._rows_where or outside != self._rows_outside:
            cache.clear()  # rows renumbered, or other bundles left out
        moved, self._moved = self._moved, set()
        brokers: dict[str, BrokerLoad] = {}
        broker_rows: dict[str, _BrokerRows] = {}  # what each broker's report was made from
        averages: dict[str, TimeAverageBrokerData] = {}
        digests: dict[str, ReportDigest] = {}
        for broker in sorted(self._brokers):
            if live is not None and broker not in live:
                continue
            doc, usage, ema, event_ms, wmax = self._brokers[broker]
            listed = doc.get("bundles") or []
            got = cache.get(broker)
            if got is None or got.listed != listed or not moved.isdisjoint(got.members):
                got = cache[broker] = _BrokerRows.of(broker, listed, where, outside, owners,
                                                     columns)  # fmt: skip
            last_stats = _LastStats(got.names, made, where, columns, got.judged)
            report = report_from_doc(doc, broker, last_stats, got.bundle_set)
            brokers[broker] = BrokerLoad(report, usage, ema, event_ms, wmax)
            broker_rows[broker] = got
            averages[broker] = columns.time_average(got.rows, self._sums, broker)
            digests[broker] = columns.digest(report, got.judged, got.counts)
        for broker in set(cache) - set(brokers):  # not looked at: ``moved`` is not kept for it
            del cache[broker]
        for broker in set(self._sums) - set(brokers):
            del self._sums[broker]
        self._rows_where, self._rows_outside = where, outside
        state = LoadState(
            MappingProxyType(brokers),
            _BundleData(made, where, outside, columns, self._rows_of(made, where), broker_rows),
            MappingProxyType(digests),
        )
        return build_view(state, namespaces=namespaces, time_averages=averages)

    def _rows_of(self, made: Mapping[str, _Made], where: Where) -> Mapping[str, int]:
        """bundle -> its row in the view's ``_Columns`` (shards in key order), made again only
        when the bundle index was (rows move only when a shard's bundle list changes)."""
        if self._global_where is not where:
            rows: dict[str, int] = {}
            total = 0
            for key in sorted(made):
                names = made[key].state.names
                rows.update(zip(names, range(total, total + len(names)), strict=True))
                total += len(names)
            self._global_rows, self._global_where = rows, where
        return self._global_rows

    def _note_moved(self, old: ShardState, new: ShardState, rows: np.ndarray) -> None:
        """Add the bundles of ``rows`` (rows of both, same names) whose last reporter differs."""
        if not len(rows):
            return
        picked = rows.tolist()  # only these rows: a batch changes a small part of a shard
        was = np.array(list(map(old.owners.__getitem__, picked)), dtype=object)
        now = np.array(list(map(new.owners.__getitem__, picked)), dtype=object)
        self._moved.update(new.names[r] for r in rows[was != now].tolist())

    def _records(self) -> dict[str, tuple[bytes, tuple[bytes, ...]]]:
        """shard -> (whole record, its deltas): what a view is built from, as of now."""
        return {
            key: (blob, tuple(r for _, r in self._deltas.get(key, ())))
            for key, blob in self._shards.items()
        }

    def _decode_all(self, shards: Mapping[str, tuple[bytes, tuple[bytes, ...]]]) -> None:
        """Decode the records that changed since they were last decoded: only the new deltas
        when the whole record is the one decoded before. A shard keeps the values already made
        for its unchanged rows (so a cycle makes again only what changed); the bundle index is
        rebuilt when a shard's bundle list changed."""
        with self._lock, gc_paused():
            made = self._made
            renamed = False
            for key in sorted(set(made) - set(shards)):
                del made[key]
                renamed = True
            for key in sorted(shards):
                blob, deltas = shards[key]
                old = made.get(key)
                if old is not None and old.blob is blob and old.deltas <= len(deltas):
                    if old.deltas == len(deltas):
                        continue
                    # the same whole record: apply the new deltas to a copy (a view taken
                    # before keeps reading the old state)
                    state = old.state.copy()
                    written = state.merge_all(
                        [decode_bundle_shard(d) for d in deltas[old.deltas :]]
                    )
                    renamed |= len(state) != len(old.state)
                    rows = np.concatenate(written)
                    self._note_moved(old.state, state, rows[rows < len(old.state)])
                    made[key] = _kept(old, blob, state, len(deltas), rows)
                    continue
                new = ShardState.from_bytes(blob, deltas)
                if old is not None and old.state.names == new.names:
                    changed = _changed_rows(old.state, new)
                    self._note_moved(old.state, new, changed)
                    if len(changed) < len(new):
                        made[key] = _kept(old, blob, new, len(deltas), changed)
                        continue
                else:
                    renamed = True
                made[key] = _Made(blob, new, len(deltas))
            if renamed:
                self._where = {
                    name: (key, i)
                    for key in sorted(made)
                    for i, name in enumerate(made[key].state.names)
                }

    def warm(self) -> None:
        """Decode the current blobs in a background thread, so that the next policy cycle
        decodes only the shards that change in between (the decision stage calls this when a
        cycle is due within the next batches). The view a cycle sees does not depend on it."""
        if self._warming is not None and self._warming.is_alive():
            return
        shards = self._records()

        def run() -> None:
            lower_thread_priority()
            wall, cpu = time.monotonic(), time.thread_time()
            try:
                self._decode_all(shards)
                self._sum_ahead()
            except Exception:  # the cycle decodes again; a warm-up must never fail a batch
                log.warning("view warm-up failed", exc_info=True)
            log.debug(
                "view warm-up of %d shards: %.0f ms, %.0f ms of its CPU",
                len(shards),
                (time.monotonic() - wall) * 1000,
                (time.thread_time() - cpu) * 1000,
            )

        self._warming = threading.Thread(target=run, name="view-warm-up", daemon=True)
        self._warming.start()

    def _sum_ahead(self) -> None:
        """Sum each broker's time average over the records just decoded, with the rows the
        last view took from its bundle list: the next view reuses every sum whose values did
        not change in between, and a broker whose did is summed again then."""
        cache = dict(self._rows_cache)
        if not cache or self._rows_where is not self._where:
            return  # no view yet, or the bundles were renumbered since
        with self._lock, gc_paused():
            columns = _Columns(dict(self._made))
            for broker in sorted(cache):
                columns.time_average(cache[broker].rows, self._sums, broker)

    def wait_warm(self) -> None:
        if self._warming is not None:
            self._warming.join()
            self._warming = None

    def _outside(self, namespaces: Mapping[str, NamespaceBundles], where: Where) -> frozenset[str]:
        """Of the bundles held (``where``), those a namespace in ``namespaces`` does not contain
        (any more).

        The names of a namespace's bundles are cached by its boundaries (building 100,000 names
        costs more than a policy step), and only names that are in no namespace's current list
        are looked at, by a set difference. The answer is kept while neither the bundles held
        nor any namespace's boundaries changed: at a million bundles the difference alone
        costs a few hundred ms a cycle."""
        if not namespaces:
            return frozenset()
        seen = self._ns_names
        changed = False
        for ns in list(seen):
            if ns not in namespaces:
                del seen[ns]
                changed = True
        for ns, nb in namespaces.items():
            cached = seen.get(ns)
            if cached is None or cached[0] != nb.boundaries:
                seen[ns] = (nb.boundaries, frozenset(nb.bundle_names))
                changed = True
        last = self._outside_for
        if not changed and last is not None and last[0] is where:
            return last[1]
        current: set[str] = set().union(*(entry[1] for entry in seen.values()))
        out = frozenset(n for n in where.keys() - current if bundle_namespace(n) in namespaces)
        self._outside_for = (where, out)
        return out

    def take_changes(self) -> tuple[dict[str, str], set[str], dict[str, bytes], set[str]]:
        """Broker documents and shard records written, and fields removed, since the last call;
        resets them."""
        out = (
            self.changed_brokers,
            self.removed_brokers,
            self.changed_shards,
            self.removed_shards,
        )
        self.changed_brokers, self.removed_brokers = {}, set()
        self.changed_shards, self.removed_shards = {}, set()
        return out

    @classmethod
    def from_snapshot(
        cls,
        brokers: Mapping[str, str | bytes],
        shards: Mapping[str, bytes],
        weights: UsageWeights | None = None,
    ) -> DriverView:
        """Rebuild the view from the snapshot the job wrote (broker documents, shard records).

        ``weights``: the configured resource weights, for a broker document without
        ``weightedMaxEma`` (written before the job kept it), which starts from its report's
        weighted max usage with every signal, as ``snapshot_from_document`` reads it."""
        weights = weights or UsageWeights()
        view = cls()
        by_shard: dict[str, dict[int, bytes]] = {}
        for name, raw in shards.items():
            key, k = split_field(name)
            by_shard.setdefault(key, {})[k] = bytes(raw)
        for key, records in sorted(by_shard.items()):
            # deltas without their record apply to an empty one, as ``merged_shards`` reads them
            base = records.get(0, _EMPTY_RECORD)
            names = dict.fromkeys(record_names(base))
            deltas = tuple((k, records[k]) for k in sorted(records) if k)
            for _, delta in deltas:
                names.update(dict.fromkeys(record_names(delta)))
            if names:
                view._shards[key], view._deltas[key] = base, deltas
                view._counts[key] = len(names)
        for name, raw in brokers.items():
            doc = json.loads(raw)
            wmax = doc.get("weightedMaxEma")
            if wmax is None:
                wmax = weights.weighted_max_uncapped(report_from_doc(doc["report"], name, {}))
            view._brokers[name] = (
                doc["report"],
                float(doc["historyUsage"]),
                float(doc["msgThroughputEma"]),
                int(doc["updatedAtMs"]),
                float(wmax),
            )
        return view
