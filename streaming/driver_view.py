"""The decision stage's copy of the averaged cluster view, kept on the driver between batches.

Why a separate copy: the policies need the whole cluster at once, while the state step only
emits what a batch touched. So the driver keeps the latest row of every broker and bundle,
applies each batch's rows to it, and builds a ``ClusterView`` from it for ``cycle.step``. It is
also what the job writes to Redis as the load snapshot, incrementally (only what changed), and
what a restarted job reads back from there, so the view after a restart is the view before it.

Snapshot documents (the layout ``controller.placement`` reads, fields as ``loadbalance.snapshot``
names them): ``P:load:brokers`` broker -> ``{"report": <LocalBrokerData JSON without lastStats>,
"historyUsage", "msgThroughputEma", "updatedAtMs"}``; ``P:load:bundles`` bundle ->
``{"shortTerm", "longTerm", "topics", "broker", "lastStats", "updatedAtMs"}`` (the last two are
ours: the last sample and who reported it, so a broker's ``lastStats`` can be rebuilt).
Floats are written with ``repr`` and so read back bit for bit.
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


def _avg_json(t: TimeAverageMessageData) -> str:
    return (
        f'{{"msgRateIn":{t.msg_rate_in!r},"msgRateOut":{t.msg_rate_out!r},'
        f'"msgThroughputIn":{t.msg_throughput_in!r},"msgThroughputOut":{t.msg_throughput_out!r},'
        f'"numSamples":{t.num_samples}}}'
    )


def _avg_from(doc: Mapping[str, Any], max_samples: int) -> TimeAverageMessageData:
    return TimeAverageMessageData(
        max_samples,
        int(doc["numSamples"]),
        float(doc["msgThroughputIn"]),
        float(doc["msgThroughputOut"]),
        float(doc["msgRateIn"]),
        float(doc["msgRateOut"]),
    )


class DriverView:
    """Latest broker and bundle rows; see the module docstring."""

    def __init__(self) -> None:
        self.brokers: dict[str, BrokerLoad] = {}
        self.broker_docs: dict[str, str] = {}  # broker -> snapshot JSON
        self.bundles: dict[str, BundleData] = {}
        self.last: dict[str, tuple[str, NamespaceBundleStats, int]] = {}  # owner, stats, event
        self._report_docs: dict[str, dict[str, Any]] = {}
        self._ns_seen: dict[str, tuple[int, ...]] = {}
        self.changed_brokers: set[str] = set()
        self.removed_brokers: set[str] = set()
        self.changed_bundles: set[str] = set()
        self.removed_bundles: set[str] = set()

    # -- applying a batch ---------------------------------------------------------------------
    def apply(self, pdf: pd.DataFrame) -> None:
        """Apply one batch of state output rows (any order within a batch is fine: each key
        appears once per kind and a bundle's row already holds all its samples)."""
        kinds = pdf["kind"]
        bundles = pdf[kinds == BUNDLE]
        if len(bundles):
            self._apply_bundles(bundles)
        for name in pdf.loc[kinds == BUNDLE_EXPIRED, "name"].tolist():
            self._drop_bundle(name)
        reported: list[str] = []
        for row in pdf[kinds == BROKER].itertuples(index=False):
            self._report_docs[row.name] = json.loads(row.report)
            self.brokers[row.name] = BrokerLoad(
                LocalBrokerData(row.name), row.history_usage, row.msg_throughput_ema, row.event_ms
            )
            self.broker_docs[row.name] = (
                f'{{"report":{row.report},"historyUsage":{row.history_usage!r},'
                f'"msgThroughputEma":{row.msg_throughput_ema!r},"updatedAtMs":{row.event_ms}}}'
            )
            self.changed_brokers.add(row.name)
            self.removed_brokers.discard(row.name)
            reported.append(row.name)
        for name in pdf.loc[kinds == BROKER_GONE, "name"].tolist():
            if name in self.brokers and name not in reported:
                self._drop_broker(name)
        for name in reported:
            self._rebuild_report(name)

    def _apply_bundles(self, rows: pd.DataFrame) -> None:
        cols = [
            rows[c].tolist()
            for c in (
                "name",
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
                "last_msg_rate_in",
                "last_msg_rate_out",
                "last_msg_throughput_in",
                "last_msg_throughput_out",
                "topics",
                "consumer_count",
                "producer_count",
            )
        ]
        bundles, last, changed = self.bundles, self.last, self.changed_bundles
        for r in zip(*cols, strict=True):
            name = r[0]
            short = TimeAverageMessageData(NUM_SHORT_SAMPLES, r[3], r[4], r[5], r[6], r[7])
            long_ = TimeAverageMessageData(NUM_LONG_SAMPLES, r[8], r[9], r[10], r[11], r[12])
            bundles[name] = BundleData(short, long_, r[17])
            last[name] = (r[1], NamespaceBundleStats(*r[13:20]), r[2])
            changed.add(name)
        self.removed_bundles.difference_update(cols[0])

    def _rebuild_report(self, broker: str) -> None:
        doc = self._report_docs[broker]
        last = self.last
        stats = {}
        for b in doc.get("bundles") or ():
            entry = last.get(b)
            if entry is not None and entry[0] == broker:
                stats[b] = entry[1]
        load = self.brokers[broker]
        self.brokers[broker] = BrokerLoad(
            report_from_doc(doc, broker, stats),
            load.history_usage,
            load.msg_throughput_ema,
            load.received_at_ms,
        )

    def _drop_bundle(self, name: str) -> None:
        self.bundles.pop(name, None)
        self.last.pop(name, None)
        self.changed_bundles.discard(name)
        self.removed_bundles.add(name)

    def _drop_broker(self, name: str) -> None:
        self.brokers.pop(name, None)
        self.broker_docs.pop(name, None)
        self._report_docs.pop(name, None)
        self.changed_brokers.discard(name)
        self.removed_brokers.add(name)

    def drop_outside(self, namespaces: Mapping[str, NamespaceBundles]) -> list[str]:
        """Forget bundles a namespace's current boundaries no longer contain (split or merged
        away); scans only namespaces whose boundaries changed since the last call."""
        changed = {
            ns: nb for ns, nb in namespaces.items() if self._ns_seen.get(ns) != tuple(nb.boundaries)
        }
        if not changed:
            return []
        current = {ns: set(nb.bundle_names) for ns, nb in changed.items()}
        gone = [
            b
            for b in self.bundles
            if (ns := bundle_namespace(b)) in current and b not in current[ns]
        ]
        for b in gone:
            self._drop_bundle(b)
        for ns, nb in changed.items():
            self._ns_seen[ns] = tuple(nb.boundaries)
        return gone

    # -- views and snapshots ------------------------------------------------------------------
    def cluster_view(self, namespaces: Mapping[str, NamespaceBundles]) -> ClusterView:
        state = LoadState(MappingProxyType(self.brokers), MappingProxyType(self.bundles))
        return build_view(state, namespaces=namespaces)

    def bundle_doc(self, name: str) -> str:
        data = self.bundles[name]
        owner, s, event_ms = self.last[name]
        return (
            f'{{"shortTerm":{_avg_json(data.short_term)},"longTerm":{_avg_json(data.long_term)},'
            f'"topics":{data.topics},"broker":{json.dumps(owner)},"lastStats":{{'
            f'"msgRateIn":{s.msg_rate_in!r},"msgRateOut":{s.msg_rate_out!r},'
            f'"msgThroughputIn":{s.msg_throughput_in!r},'
            f'"msgThroughputOut":{s.msg_throughput_out!r},"topics":{s.topics},'
            f'"consumerCount":{s.consumer_count},"producerCount":{s.producer_count}}},'
            f'"updatedAtMs":{event_ms}}}'
        )

    def take_changes(self) -> tuple[dict[str, str], set[str], dict[str, str], set[str]]:
        """What changed since the last call, as snapshot documents; resets the change sets."""
        brokers = {b: self.broker_docs[b] for b in self.changed_brokers}
        bundles = {b: self.bundle_doc(b) for b in self.changed_bundles}
        out = (brokers, set(self.removed_brokers), bundles, set(self.removed_bundles))
        for s in (self.changed_brokers, self.removed_brokers):
            s.clear()
        self.changed_bundles.clear()
        self.removed_bundles.clear()
        return out

    @classmethod
    def from_snapshot(
        cls, brokers: Mapping[str, str | bytes], bundles: Mapping[str, str | bytes]
    ) -> DriverView:
        """Rebuild the view from the snapshot documents the job wrote."""
        view = cls()
        for name, raw in bundles.items():
            doc = json.loads(raw)
            view.bundles[name] = BundleData(
                _avg_from(doc["shortTerm"], NUM_SHORT_SAMPLES),
                _avg_from(doc["longTerm"], NUM_LONG_SAMPLES),
                int(doc.get("topics", 0)),
            )
            s = doc.get("lastStats") or {}
            stats = NamespaceBundleStats(
                float(s.get("msgRateIn", 0.0)),
                float(s.get("msgRateOut", 0.0)),
                float(s.get("msgThroughputIn", 0.0)),
                float(s.get("msgThroughputOut", 0.0)),
                int(s.get("topics", 0)),
                int(s.get("consumerCount", 0)),
                int(s.get("producerCount", 0)),
            )
            view.last[name] = (str(doc.get("broker", "")), stats, int(doc.get("updatedAtMs", 0)))
        for name, raw in brokers.items():
            text = raw.decode() if isinstance(raw, bytes) else raw
            doc = json.loads(text)
            view._report_docs[name] = doc["report"]
            view.broker_docs[name] = text
            view.brokers[name] = BrokerLoad(
                LocalBrokerData(name),
                float(doc["historyUsage"]),
                float(doc["msgThroughputEma"]),
                int(doc["updatedAtMs"]),
            )
            view._rebuild_report(name)
        return view
