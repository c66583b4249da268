"""The decision stage's copy of the averaged cluster view, kept on the driver between batches.

Why a separate copy: the policies need the whole cluster at once, while the state step only
emits what a batch touched. So the driver keeps the latest blob of every state shard (what the
state step emitted for it) and the latest row of every broker, and builds a ``ClusterView`` from
them for ``cycle.step``. It is also what the job writes to Redis as the load snapshot (only the
shards and brokers a batch changed), and what a restarted job reads back from there, so the
view after a restart is the view before it.

The snapshot is the published load-snapshot format (``metadata_store.load_snapshot``,
``docs/snapshot-format.md``): ``P:load:shards`` bundle shard -> the shard blob as the state
step emitted it (the blob is the format's bundle-shard record); ``P:load:brokers`` broker ->
``{"report": <LocalBrokerData JSON without lastStats>, "historyUsage", "msgThroughputEma",
"updatedAtMs"}``, the ``brokers`` entry of ``lbctl decide``'s snapshot, floats written with
``repr`` and so read back bit for bit.

Why the driver keeps this copy rather than reading the snapshot back from Redis for each cycle:
the copy is what lets a cycle turn into the core's values only the bundles that changed since
the last one (or since the background warm-up), and it costs no more than the bytes the batch
already brought to the driver; a full read and materialisation per cycle would cost more than
a batch (``docs/benchmarks.md``, streaming job).

Blobs are decoded and turned into the core's frozen values only when a policy cycle needs them,
and then only the shards that changed since the previous cycle: with reports every few seconds
and policies every minute, most blobs are replaced before anyone reads them.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import sys
import threading
from collections import Counter
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import astuple
from types import MappingProxyType
from typing import Any

import numpy as np
import pandas as pd

from loadbalance.bundles import NamespaceBundles, bundle_namespace
from loadbalance.model import LocalBrokerData, NamespaceBundleStats, ResourceUsage
from loadbalance.time_average import (
    NUM_LONG_SAMPLES,
    NUM_SHORT_SAMPLES,
    BundleData,
    TimeAverageBrokerData,
    TimeAverageMessageData,
)
from loadbalance.view import BrokerLoad, ClusterView, LoadState, ReportDigest, build_view
from streaming.schema import BROKER, BROKER_GONE, SHARD
from streaming.shard_state import ShardState, bundle_count

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
    doc: Mapping[str, Any], broker: str, last_stats: Mapping[str, NamespaceBundleStats]
) -> LocalBrokerData:
    """Rebuild a report the codec already validated (no second validation: 5,000 bundle names
    per report would cost more than the rest of the decision stage)."""
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
        bundles=frozenset(doc.get("bundles") or ()),
        last_stats=MappingProxyType(dict(last_stats)),
        last_update_ms=int(doc.get("lastUpdate", 0)),
        web_service_url=doc.get("webServiceUrl") or "",
        pulsar_service_url=doc.get("pulsarServiceUrl") or "",
        broker_version=doc.get("brokerVersionString") or "",
        **kw,
    )


def _materialize(
    state: ShardState,
    rows: np.ndarray,
    bundles: dict[str, BundleData],
    last: dict[str, tuple[str, NamespaceBundleStats]],
) -> None:
    """Bundles ``rows`` (indices) of a decoded shard as the core's values (into ``bundles`` and
    ``last``: the owner and last sample). Float columns are ``STAT_COLUMNS`` order."""
    names, owners = state.names, state.owners
    for i, s, sn, lg, ln, la, c in zip(
        rows.tolist(),
        state.short_avg[rows].tolist(),
        state.short_n[rows].tolist(),
        state.long_avg[rows].tolist(),
        state.long_n[rows].tolist(),
        state.last_values[rows].tolist(),
        state.last_counts[rows].tolist(),
        strict=True,
    ):
        name = names[i]
        bundles[name] = BundleData(
            TimeAverageMessageData(NUM_SHORT_SAMPLES, sn, *s),
            TimeAverageMessageData(NUM_LONG_SAMPLES, ln, *lg),
            c[0],
        )
        last[name] = (owners[i], NamespaceBundleStats(la[2], la[3], la[0], la[1], *c))


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


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a view is materialised or a cycle runs.

    Why: a view holds about four objects per bundle (half a million at 100,000 bundles), and
    building tens of thousands of new ones triggers full collections that walk all of them
    (a large share of a cycle's time). The objects are plain values without reference cycles, freed
    by reference counting; collection resumes when the last thread leaves (threads may nest)."""
    with _GC_LOCK:
        if _GC_HOLDS[0] == 0:
            _GC_HOLDS[1] = gc.isenabled()
            gc.disable()
        _GC_HOLDS[0] += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _GC_HOLDS[0] -= 1
            if _GC_HOLDS[0] == 0 and _GC_HOLDS[1]:
                gc.enable()


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


class DriverView:
    """Latest shard blobs and broker rows; see the module docstring."""

    def __init__(self) -> None:
        self._shards: dict[str, bytes] = {}  # state shard key -> latest blob
        self._counts: dict[str, int] = {}  # bundles per shard blob
        # per shard: the blob last turned into the core's values, and its decoded state
        self._made: dict[str, tuple[bytes, ShardState]] = {}
        self._lock = threading.Lock()  # materialising: a policy cycle or a warm-up thread
        self._warming: threading.Thread | None = None
        self._bundles: dict[str, BundleData] = {}
        self._last: dict[str, tuple[str, NamespaceBundleStats]] = {}  # owner, last sample
        self._brokers: dict[str, tuple[dict[str, Any], float, float, int]] = {}
        self._ns_names: dict[str, tuple[tuple[int, ...], frozenset[str]]] = {}
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
        shards = pdf[kinds == SHARD]
        for key, payload in zip(shards["name"].tolist(), shards["payload"].tolist(), strict=True):
            self._set_shard(key, bytes(payload))
        reported = set()
        for row in pdf[kinds == BROKER].itertuples(index=False):
            usage, ema, event_ms = row.history_usage, row.msg_throughput_ema, row.event_ms
            self._brokers[row.name] = (json.loads(row.doc), usage, ema, event_ms)
            self.changed_brokers[row.name] = (
                f'{{"report":{row.doc},"historyUsage":{usage!r},'
                f'"msgThroughputEma":{ema!r},"updatedAtMs":{event_ms}}}'
            )
            self.removed_brokers.discard(row.name)
            reported.add(row.name)
        for name in pdf.loc[kinds == BROKER_GONE, "name"].tolist():
            if name in self._brokers and name not in reported:
                self._brokers.pop(name)
                self.changed_brokers.pop(name, None)
                self.removed_brokers.add(name)

    def _set_shard(self, key: str, blob: bytes) -> None:
        n = bundle_count(blob)
        if n:
            self._shards[key], self._counts[key] = blob, n
            self.changed_shards[key] = blob
            self.removed_shards.discard(key)
        else:  # every bundle of the shard expired
            self._shards.pop(key, None)
            self._counts.pop(key, None)
            self.changed_shards.pop(key, None)
            self.removed_shards.add(key)

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
        bundles, last = self._bundles, self._last
        self._materialize_all(dict(self._shards))
        kept = dict(bundles)
        outside = self._outside(namespaces, bundles.keys())
        for name in outside:
            del kept[name]
        brokers: dict[str, BrokerLoad] = {}
        for broker in sorted(self._brokers):
            if live is not None and broker not in live:
                continue
            doc, usage, ema, event_ms = self._brokers[broker]
            stats = {}
            for b in doc.get("bundles") or ():
                entry = last.get(b)
                if entry is not None and entry[0] == broker and b in kept:
                    stats[b] = entry[1]
            report = report_from_doc(doc, broker, stats)
            brokers[broker] = BrokerLoad(report, usage, ema, event_ms)
        averages, digests = self._per_broker(brokers, outside)
        state = LoadState(
            MappingProxyType(brokers), MappingProxyType(kept), MappingProxyType(digests)
        )
        return build_view(state, namespaces=namespaces, time_averages=averages)

    def _per_broker(
        self, brokers: Mapping[str, BrokerLoad], outside: list[str]
    ) -> tuple[dict[str, TimeAverageBrokerData], dict[str, ReportDigest]]:
        """Every broker's ``TimeAverageBrokerData`` and ``ReportDigest``, from the decoded
        shards' arrays.

        Sums: ``build_view`` would sum 100,000 bundle objects in Python; here each broker's
        rows are gathered from the shard arrays (Pulsar's defaults for bundles without data or
        left out of ``kept``) and each column is summed with ``math.fsum``, the correctly
        rounded sum ``TimeAverageBrokerData.of`` uses, so the bits are the same whatever the
        order (a unit test checks this).

        Digests: what ``ingest_many`` works out as it folds a report, made here from columns
        over the broker's ``lastStats`` (the bundles it reports and was the last to report):
        the maxima the split scan reads to skip a broker none of whose bundles is over a limit,
        and the namespace counts placement reads. Without them the split scan walks every
        bundle of every broker (1.2 s at a million bundles). The maxima are taken over the
        same figures with the same float additions as ``view._digest`` (a NaN is never a
        maximum, as there), so a skipped broker is one the scan would have found nothing in."""
        made = [self._made[key][1] for key in sorted(self._made)]
        rows: dict[str, int] = {}
        offset = 0
        for state in made:
            rows.update(zip(state.names, range(offset, offset + len(state)), strict=True))
            offset += len(state)
        for name in outside:
            rows.pop(name, None)
        values = np.concatenate(
            [np.hstack((m.short_avg, m.long_avg)) for m in made] + [_DEFAULT_SUMS[None, :]]
        )
        counts = np.concatenate([m.last_counts for m in made] + [np.zeros((1, 3), np.int64)])
        long_avg = np.concatenate([m.long_avg for m in made] + [np.zeros((1, 4))])
        topics = counts[:, 0]
        sessions = counts[:, 1] + counts[:, 2]  # consumers + producers
        rate = long_avg[:, 2] + long_avg[:, 3]  # STAT_COLUMNS: rates in, out
        throughput = long_avg[:, 0] + long_avg[:, 1]  # throughputs in, out
        sums: dict[str, TimeAverageBrokerData] = {}
        digests: dict[str, ReportDigest] = {}
        for broker in sorted(brokers):
            report = brokers[broker].report
            members = report.bundles
            gather = np.fromiter((rows.get(b, offset) for b in members), np.int64, len(members))
            columns = values[gather].T.tolist()
            sums[broker] = TimeAverageBrokerData(*(math.fsum(c) for c in columns))
            stats = report.last_stats  # every entry is a row: built from kept bundles only
            judged = np.fromiter((rows[b] for b in stats), np.int64, len(stats))
            judged = judged[topics[judged] >= 2]  # the split scan judges these alone
            digests[broker] = ReportDigest(
                report,
                None,  # the sums above are passed as ``time_averages``
                int(topics[judged].max()) if len(judged) else -1,
                int(sessions[judged].max()) if len(judged) else -1,
                _max_or_minus_inf(rate[judged]),
                _max_or_minus_inf(throughput[judged]),
                dict(Counter(map(bundle_namespace, members))),
            )
        return sums, digests

    def _materialize_all(self, shards: Mapping[str, bytes]) -> None:
        """Bring the core's values up to ``shards``: only the bundles whose values changed
        since the blob last materialised (all of a shard whose bundle list changed)."""
        with self._lock, gc_paused():
            bundles, last = self._bundles, self._last
            for key in sorted(set(self._made) - set(shards)):
                for name in self._made.pop(key)[1].names:
                    bundles.pop(name, None)
                    last.pop(name, None)
            for key in sorted(shards):
                blob = shards[key]
                made = self._made.get(key)
                if made is not None and made[0] is blob:
                    continue
                new = ShardState.from_bytes(blob)
                if made is not None and made[1].names == new.names:
                    rows = _changed_rows(made[1], new)
                else:
                    for name in made[1].names if made is not None else ():
                        bundles.pop(name, None)
                        last.pop(name, None)
                    rows = np.arange(len(new))
                _materialize(new, rows, bundles, last)
                self._made[key] = (blob, new)

    def warm(self) -> None:
        """Materialise the current blobs in a background thread, so that the next policy cycle
        turns into the core's values only the bundles that change in between (a full view of
        100,000 bundles costs more driver time than a batch; the decision stage calls this when
        a cycle is due within the next batches). The view a cycle sees does not depend on it."""
        if self._warming is not None and self._warming.is_alive():
            return
        shards = dict(self._shards)

        def run() -> None:
            lower_thread_priority()
            try:
                self._materialize_all(shards)
            except Exception:  # the cycle materialises again; a warm-up must never fail a batch
                log.warning("view warm-up failed", exc_info=True)

        self._warming = threading.Thread(target=run, name="view-warm-up", daemon=True)
        self._warming.start()

    def wait_warm(self) -> None:
        if self._warming is not None:
            self._warming.join()
            self._warming = None

    def _outside(self, namespaces: Mapping[str, NamespaceBundles], names: Any) -> list[str]:
        """Of ``names``, those a namespace in ``namespaces`` does not contain (any more).

        The names of a namespace's bundles are cached by its boundaries (building 100,000 names
        costs more than a policy step), and only names that are in no namespace's current list
        are looked at, by a set difference."""
        if not namespaces:
            return []
        seen = self._ns_names
        for ns in list(seen):
            if ns not in namespaces:
                del seen[ns]
        for ns, nb in namespaces.items():
            cached = seen.get(ns)
            if cached is None or cached[0] != nb.boundaries:
                seen[ns] = (nb.boundaries, frozenset(nb.bundle_names))
        current: set[str] = set().union(*(entry[1] for entry in seen.values()))
        return [n for n in set(names) - current if bundle_namespace(n) in namespaces]

    def take_changes(self) -> tuple[dict[str, str], set[str], dict[str, bytes], set[str]]:
        """Broker documents and shard blobs written, and keys removed, since the last call;
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
        cls, brokers: Mapping[str, str | bytes], shards: Mapping[str, bytes]
    ) -> DriverView:
        """Rebuild the view from the snapshot the job wrote (broker documents, shard blobs)."""
        view = cls()
        for key, blob in shards.items():
            view._set_shard(key, bytes(blob))
        view.changed_shards, view.removed_shards = {}, set()
        for name, raw in brokers.items():
            doc = json.loads(raw)
            view._brokers[name] = (
                doc["report"],
                float(doc["historyUsage"]),
                float(doc["msgThroughputEma"]),
                int(doc["updatedAtMs"]),
            )
        return view
