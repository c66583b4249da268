"""The lazy mappings a cycle's view reads: ``bundle_data`` and each broker's ``lastStats``,
made from the decoded shard arrays the first time a policy reads them, and the report rebuilt
around them (``report_from_doc``)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import numpy as np

from loadbalance.model import LocalBrokerData, NamespaceBundleStats, ResourceUsage
from loadbalance.ranking import order_by_value_then_name
from loadbalance.time_average import BundleData

if TYPE_CHECKING:
    from streaming.decoded_shards import Made
    from streaming.view_columns import BrokerRows, Columns

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
    given, so it must be read-only (the view passes a lazy ``LastStats``); so is ``bundles``,
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


Where = Mapping[str, tuple[str, int]]  # bundle -> (state shard key, row)


def make_all(
    made: Mapping[str, Made], where: Where, names: Iterable[str], stats_only: bool = False
) -> None:
    """Make the values of ``names`` (all known), grouped by shard; with ``stats_only`` only
    their last samples (``Made.make_stats``)."""
    by_shard: dict[str, list[int]] = {}
    for name in names:
        key, row = where[name]
        by_shard.setdefault(key, []).append(row)
    for key, rows in by_shard.items():
        if stats_only:
            made[key].make_stats(rows)
        else:
            made[key].make(rows)


class BundleDataView(Mapping[str, BundleData]):
    """The view's ``bundle_data``: every bundle held but those ``outside`` the namespaces,
    made from the shard arrays when first read.

    Why lazy: a cycle over a million bundles reads the values of the bundles on the brokers
    its policies look at, seldom all; making a million frozen values costs seconds."""

    __slots__ = ("_brokers", "_columns", "_len", "_made", "_outside", "_rows", "_where")

    def __init__(
        self,
        made: Mapping[str, Made],
        where: Where,
        outside: frozenset[str],
        columns: Columns,
        rows: Mapping[str, int],
        brokers: Mapping[str, BrokerRows] | None = None,
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
        make_all(self._made, where, (n for n in names if n in where and n not in outside))

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

        Why: a shedding broker's bundles are already numbered in the view (``BrokerRows``),
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


class LastStats(Mapping[str, NamespaceBundleStats]):
    """A broker's ``lastStats`` in the view: the bundles it reports and was the last to report,
    in its report's order, made from the shard arrays the first time any is read (a policy
    that reads one bundle of a broker reads most of them)."""

    __slots__ = ("_columns", "_made", "_names", "_ready", "_rows", "_set", "_where")

    def __init__(
        self,
        names: list[str],
        made: Mapping[str, Made],
        where: Where,
        columns: Columns | None = None,
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

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        """``stat(name)``, or ``default``: a policy asks ``get`` for the few bundles it moves
        (recording a move in flight, a split's sessions), and ``Mapping.get`` would go through
        ``__getitem__``, making every bundle of the broker on the first read (a cycle moving
        16k bundles off 150 brokers made 370k values to read 16k: 0.7 s of its 1.3 s)."""
        try:
            return self.stat(name)
        except KeyError:
            return default

    def _members(self) -> frozenset[str]:
        if self._set is None:
            self._set = frozenset(self._names)
        return self._set

    def __getitem__(self, name: str) -> NamespaceBundleStats:
        if name not in self._members():
            raise KeyError(name)
        if not self._ready:
            make_all(self._made, self._where, self._names, stats_only=True)
            self._ready = True
        key, row = self._where[name]
        return self._made[key].stats[row]

    def __contains__(self, name: object) -> bool:
        return name in self._members()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)
