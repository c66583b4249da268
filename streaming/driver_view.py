"""The decision stage's copy of the averaged cluster view, kept on the driver between batches.

Why a separate copy: the policies need the whole cluster at once, while the state step only
emits what a batch touched. So the driver keeps the latest row of every broker and bundle,
applies each batch's rows to it, and builds a ``ClusterView`` from it for ``cycle.step``. It is
also what the job writes to Redis as the load snapshot, incrementally (only what changed), and
what a restarted job reads back from there, so the view after a restart is the view before it.

Snapshot documents (the layout ``controller.placement`` reads, fields as ``loadbalance.snapshot``
names them): ``P:load:brokers`` broker -> ``{"report": <LocalBrokerData JSON without lastStats>,
"historyUsage", "msgThroughputEma", "updatedAtMs"}``; ``P:load:bundles`` bundle -> the document
of ``streaming.snapshot_docs`` (built by the state step). Floats are written with ``repr`` and
so read back bit for bit.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import pandas as pd

from loadbalance.bundles import NamespaceBundles, bundle_namespace
from loadbalance.model import LocalBrokerData, NamespaceBundleStats, ResourceUsage
from loadbalance.time_average import (
    NUM_LONG_SAMPLES,
    NUM_SHORT_SAMPLES,
    BundleData,
    TimeAverageMessageData,
)
from loadbalance.view import BrokerLoad, ClusterView, LoadState, build_view
from streaming.schema import BROKER, BROKER_GONE, BUNDLE, BUNDLE_EXPIRED

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


_ROW_COLUMNS = (
    "broker",
    "event_ms",
    "short_num_samples",
    "short_msg_throughput_in",
    "short_msg_throughput_out",
    "short_msg_rate_in",
    "short_msg_rate_out",
    "long_num_samples",
    "long_msg_throughput_in",
    "long_msg_throughput_out",
    "long_msg_rate_in",
    "long_msg_rate_out",
    "last_msg_throughput_in",
    "last_msg_throughput_out",
    "last_msg_rate_in",
    "last_msg_rate_out",
    "topics",
    "consumer_count",
    "producer_count",
)
_AVG_KEYS = ("msgThroughputIn", "msgThroughputOut", "msgRateIn", "msgRateOut")


def _materialize(row: tuple) -> tuple[BundleData, str, NamespaceBundleStats]:
    """A raw row (``_ROW_COLUMNS`` order) as the core's values."""
    short = TimeAverageMessageData(NUM_SHORT_SAMPLES, row[2], *row[3:7])
    long_ = TimeAverageMessageData(NUM_LONG_SAMPLES, row[7], *row[8:12])
    stats = NamespaceBundleStats(row[14], row[15], row[12], row[13], *row[16:19])
    return BundleData(short, long_, row[16]), row[0], stats


def _row_from_doc(doc: Mapping[str, Any]) -> tuple:
    s, lg, la = doc["shortTerm"], doc["longTerm"], doc.get("lastStats") or {}
    return (
        str(doc.get("broker", "")),
        int(doc.get("updatedAtMs", 0)),
        int(s["numSamples"]),
        *(float(s[k]) for k in _AVG_KEYS),
        int(lg["numSamples"]),
        *(float(lg[k]) for k in _AVG_KEYS),
        *(float(la.get(k, 0.0)) for k in _AVG_KEYS),
        int(la.get("topics", doc.get("topics", 0))),
        int(la.get("consumerCount", 0)),
        int(la.get("producerCount", 0)),
    )


class DriverView:
    """Latest broker and bundle rows; see the module docstring.

    Rows are kept raw and turned into the core's frozen values only when a policy cycle needs
    them (``cluster_view``), and then only for bundles that changed since: with reports every
    few seconds and policies every minute, most rows are overwritten before anyone reads them.
    """

    def __init__(self) -> None:
        self._rows: dict[str, tuple] = {}  # bundle -> raw row (``_ROW_COLUMNS``)
        self._bundles: dict[str, BundleData] = {}
        self._last: dict[str, tuple[str, NamespaceBundleStats]] = {}  # owner, last sample
        self._dirty: set[str] = set()
        self._brokers: dict[str, tuple[dict[str, Any], float, float, int]] = {}
        self._ns_seen: dict[str, tuple[int, ...]] = {}
        self.changed_brokers: dict[str, str] = {}  # snapshot documents to write
        self.removed_brokers: set[str] = set()
        self.changed_bundles: dict[str, str] = {}
        self.removed_bundles: set[str] = set()

    @property
    def broker_names(self) -> list[str]:
        return sorted(self._brokers)

    def __len__(self) -> int:
        return len(self._rows)

    # -- applying a batch ---------------------------------------------------------------------
    def apply(self, pdf: pd.DataFrame) -> None:
        """Apply one batch of state output rows (each key appears once per kind in a batch,
        and a bundle's row already holds all of its samples)."""
        kinds = pdf["kind"]
        rows = pdf[kinds == BUNDLE]
        if len(rows):
            names = rows["name"].tolist()
            self._rows.update(zip(names, zip(*(rows[c].tolist() for c in _ROW_COLUMNS))))
            self.changed_bundles.update(zip(names, rows["doc"].tolist()))
            self._dirty.update(names)
            self.removed_bundles.difference_update(names)
        for name in pdf.loc[kinds == BUNDLE_EXPIRED, "name"].tolist():
            self._drop_bundle(name)
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

    def _drop_bundle(self, name: str) -> None:
        self._rows.pop(name, None)
        self._bundles.pop(name, None)
        self._last.pop(name, None)
        self._dirty.discard(name)
        self.changed_bundles.pop(name, None)
        self.removed_bundles.add(name)

    def drop_outside(self, namespaces: Mapping[str, NamespaceBundles]) -> list[str]:
        """Forget bundles a namespace's current boundaries no longer contain (split or merged
        away); scans only namespaces whose boundaries changed since the last call."""
        changed = {
            ns: nb for ns, nb in namespaces.items() if self._ns_seen.get(ns) != nb.boundaries
        }
        if not changed:
            return []
        current = {ns: set(nb.bundle_names) for ns, nb in changed.items()}
        gone = [
            b for b in self._rows if (ns := bundle_namespace(b)) in current and b not in current[ns]
        ]
        for b in gone:
            self._drop_bundle(b)
        for ns, nb in changed.items():
            self._ns_seen[ns] = nb.boundaries
        return gone

    # -- views and snapshots ------------------------------------------------------------------
    def cluster_view(self, namespaces: Mapping[str, NamespaceBundles]) -> ClusterView:
        """The view for one policy cycle. Every broker's ``lastStats`` is rebuilt from the
        bundles it reports and was the last to report, so the view is a function of the rows
        alone and a view rebuilt from Redis after a restart is the same."""
        rows, bundles, last = self._rows, self._bundles, self._last
        for name in self._dirty:
            bundles[name], owner, stats = _materialize(rows[name])
            last[name] = (owner, stats)
        self._dirty.clear()
        brokers: dict[str, BrokerLoad] = {}
        for broker in sorted(self._brokers):
            doc, usage, ema, event_ms = self._brokers[broker]
            stats = {}
            for b in doc.get("bundles") or ():
                entry = last.get(b)
                if entry is not None and entry[0] == broker:
                    stats[b] = entry[1]
            report = report_from_doc(doc, broker, stats)
            brokers[broker] = BrokerLoad(report, usage, ema, event_ms)
        state = LoadState(MappingProxyType(brokers), MappingProxyType(bundles))
        return build_view(state, namespaces=namespaces)

    def take_changes(self) -> tuple[dict[str, str], set[str], dict[str, str], set[str]]:
        """Snapshot documents written and keys removed since the last call; resets them."""
        out = (
            self.changed_brokers,
            self.removed_brokers,
            self.changed_bundles,
            self.removed_bundles,
        )
        self.changed_brokers, self.removed_brokers = {}, set()
        self.changed_bundles, self.removed_bundles = {}, set()
        return out

    @classmethod
    def from_snapshot(
        cls, brokers: Mapping[str, str | bytes], bundles: Mapping[str, str | bytes]
    ) -> DriverView:
        """Rebuild the view from the snapshot documents the job wrote."""
        view = cls()
        for name, raw in bundles.items():
            view._rows[name] = _row_from_doc(json.loads(raw))
            view._dirty.add(name)
        for name, raw in brokers.items():
            doc = json.loads(raw)
            view._brokers[name] = (
                doc["report"],
                float(doc["historyUsage"]),
                float(doc["msgThroughputEma"]),
                int(doc["updatedAtMs"]),
            )
        return view
