"""The per-cycle view assembler: a ``ClusterView`` from the ledger's broker rows and the decoded
shards, with what it keeps between cycles to make the next one cheaper.

The view reads the decoded arrays through lazy mappings (``bundle_data``, each broker's
``lastStats``): a bundle's frozen values are made the first time a policy reads them, a whole
broker at once, and kept while its row is unchanged. The per-broker figures every cycle needs
(the sums, the report digests) come from the arrays, so a cycle over a million bundles makes
values only for the brokers its policies look at.

What it keeps, and when it is dropped: per broker, the rows taken from its bundle list
(``BrokerRows``), kept while the list, the bundles left out and the last reporters of its
bundles stay the same and the decoded shards' ``generation`` (their row numbering) is the one
they were taken at; each bundle's row in the view's columns and the bundles left out, per
generation; per broker, the values its time average was last summed over and the sum (compared
bit for bit, so kept across generations).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from types import MappingProxyType

from loadbalance.bundles import NamespaceBundles, bundle_namespace
from loadbalance.time_average import TimeAverageBrokerData
from loadbalance.view import BrokerLoad, ClusterView, LoadState, ReportDigest, build_view
from streaming.decoded_shards import DecodedShards, Made, Where
from streaming.view_columns import BrokerRows, Columns, Sums
from streaming.view_ledger import BrokerRow
from streaming.view_mappings import BundleDataView, LastStats, report_from_doc

_NONE = -1  # a generation no decode has: nothing kept yet


class ViewAssembler:
    """Builds each cycle's view; keeps per-broker rows and sums between cycles."""

    def __init__(self, shards: DecodedShards) -> None:
        self._shards = shards
        self._rows_cache: dict[str, BrokerRows] = {}
        self._rows_generation = _NONE
        self._rows_outside: frozenset[str] = frozenset()
        # per broker, the values its last time average was summed over and the sums (summing
        # a million bundles' eight columns exactly costs a third of a second; the warm-up sums
        # ahead, so that a cycle sums only the brokers that reported since)
        self._sums: Sums = {}
        self._global_rows: Mapping[str, int] = {}
        self._global_generation = _NONE
        self._ns_names: dict[str, tuple[tuple[int, ...], frozenset[str]]] = {}
        self._outside_for: tuple[int, frozenset[str]] | None = None  # (generation, answer)

    def cluster_view(
        self,
        brokers: Mapping[str, BrokerRow],
        namespaces: Mapping[str, NamespaceBundles],
        live: Collection[str] | None,
    ) -> ClusterView:
        """The view of ``brokers`` (those in ``live`` when given) over the decoded shards; see
        ``DriverView.cluster_view`` for what is left out and why."""
        made, where, generation = self._shards.current()
        outside = self._outside(namespaces, where, generation)
        columns = Columns(made)
        if generation != self._rows_generation or outside != self._rows_outside:
            self._rows_cache.clear()  # rows renumbered, or other bundles left out
        moved = self._shards.take_moved()
        owners = {key: m.state.owners for key, m in made.items()}
        loads: dict[str, BrokerLoad] = {}
        taken: dict[str, BrokerRows] = {}  # what each broker's report was made from
        averages: dict[str, TimeAverageBrokerData] = {}
        digests: dict[str, ReportDigest] = {}
        for broker in sorted(brokers):
            if live is not None and broker not in live:
                continue
            doc, usage, ema, event_ms, wmax = brokers[broker]
            got = self._broker_rows(broker, doc.get("bundles") or [], owners, where, outside,
                                    columns, moved)  # fmt: skip
            last_stats = LastStats(got.names, made, where, columns, got.judged)
            report = report_from_doc(doc, broker, last_stats, got.bundle_set)
            loads[broker] = BrokerLoad(report, usage, ema, event_ms, wmax)
            taken[broker] = got
            averages[broker] = columns.time_average(got.rows, self._sums, broker)
            digests[broker] = columns.digest(report, got.judged, got.counts)
        self._forget_others(loads)
        self._rows_generation, self._rows_outside = generation, outside
        bundle_data = BundleDataView(made, where, outside, columns,
                                     self._rows_of(made, generation), taken)  # fmt: skip
        state = LoadState(MappingProxyType(loads), bundle_data, MappingProxyType(digests))
        return build_view(state, namespaces=namespaces, time_averages=averages)

    def _broker_rows(
        self,
        broker: str,
        listed: list[str],
        owners: Mapping[str, list[str]],
        where: Where,
        outside: frozenset[str],
        columns: Columns,
        moved: set[str],
    ) -> BrokerRows:
        """The broker's rows, kept from the last view unless its list or a bundle's last
        reporter changed (or the cache was cleared)."""
        got = self._rows_cache.get(broker)
        if got is None or got.listed != listed or not moved.isdisjoint(got.members):
            got = BrokerRows.of(broker, listed, where, outside, owners, columns)
            self._rows_cache[broker] = got
        return got

    def _forget_others(self, looked_at: Mapping[str, object]) -> None:
        """Drop what is kept for brokers this view did not look at (``moved`` is not kept for
        them, so their rows could not be trusted next time)."""
        for broker in set(self._rows_cache) - set(looked_at):
            del self._rows_cache[broker]
        for broker in set(self._sums) - set(looked_at):
            del self._sums[broker]

    def _rows_of(self, made: Mapping[str, Made], generation: int) -> Mapping[str, int]:
        """bundle -> its row in the view's ``Columns`` (shards in key order), made again only
        when the bundle index was (rows move only when a shard's bundle list changes)."""
        if self._global_generation != generation:
            rows: dict[str, int] = {}
            total = 0
            for key in sorted(made):
                names = made[key].state.names
                rows.update(zip(names, range(total, total + len(names)), strict=True))
                total += len(names)
            self._global_rows, self._global_generation = rows, generation
        return self._global_rows

    def sum_ahead(self) -> None:
        """Sum each broker's time average over the shards just decoded, with the rows the
        last view took from its bundle list: the next view reuses every sum whose values did
        not change in between, and a broker whose did is summed again then. Run by the
        warm-up thread, after its decode."""
        cache = dict(self._rows_cache)
        made, _, generation = self._shards.current()
        if not cache or self._rows_generation != generation:
            return  # no view yet, or the bundles were renumbered since
        columns = Columns(made)
        for broker in sorted(cache):
            columns.time_average(cache[broker].rows, self._sums, broker)

    def _outside(
        self, namespaces: Mapping[str, NamespaceBundles], where: Where, generation: int
    ) -> frozenset[str]:
        """Of the bundles held (``where``), those a namespace in ``namespaces`` does not contain
        (any more).

        The names of a namespace's bundles are cached by its boundaries (building 100,000 names
        costs more than a policy step), and only names that are in no namespace's current list
        are looked at, by a set difference. The answer is kept while neither the bundle index
        (its generation) nor any namespace's boundaries changed: at a million bundles the
        difference alone costs a few hundred ms a cycle."""
        if not namespaces:
            return frozenset()
        changed = self._note_namespaces(namespaces)
        last = self._outside_for
        if not changed and last is not None and last[0] == generation:
            return last[1]
        current: set[str] = set().union(*(entry[1] for entry in self._ns_names.values()))
        out = frozenset(n for n in where.keys() - current if bundle_namespace(n) in namespaces)
        self._outside_for = (generation, out)
        return out

    def _note_namespaces(self, namespaces: Mapping[str, NamespaceBundles]) -> bool:
        """Keep each namespace's bundle names by its boundaries; whether any changed."""
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
        return changed
