"""The offline cluster snapshot read by ``lbctl decide``: parse it into a ``ClusterView``.

A snapshot is one JSON document (documented in ``docs/snapshot-format.md``, example in
``examples/snapshot.json``)::

    {
      "snapshotVersion": 1,
      "nowMs": 1700000000000,
      "config": {"loadBalancerLoadSheddingStrategy": "OverloadShedder"},
      "namespaces": {"tenant/ns": ["0x00000000", "0x80000000", "0xffffffff"]},
      "brokers": {
        "broker-1:8080": {"report": {<LocalBrokerData JSON>}, "historyUsage": 0.72}
      },
      "bundleData": {"tenant/ns/0x00000000_0x80000000": {
          "shortTerm": {"msgRateIn": 1, "msgRateOut": 1, "msgThroughputIn": 1,
                        "msgThroughputOut": 1, "numSamples": 10},
          "longTerm": {...}, "topics": 3}},
      "recentlyUnloaded": {"tenant/ns/0x80000000_0xffffffff": 1699999990000},
      "topicHashes": {"tenant/ns/0x00000000_0x80000000": ["0x00000010", "0x00000020"]}
    }

Only ``brokers`` is required. A broker without ``historyUsage`` starts from its report's
weighted usage (the first-sample rule); a bundle without ``bundleData`` gets one sample from the
reports' ``lastStats``, as the first report would give it. Parsing is pure: the shell reads the
file and passes the text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from loadbalance.bundles import FULL_UPPER, NamespaceBundles, parse_bundle
from loadbalance.errors import InvalidInput
from loadbalance.report_codec import report_from_dict
from loadbalance.time_average import (
    NUM_LONG_SAMPLES,
    NUM_SHORT_SAMPLES,
    BundleData,
    TimeAverageBrokerData,
    TimeAverageMessageData,
)
from loadbalance.view import BrokerView, ClusterView, UsageWeights

SNAPSHOT_VERSION = 1


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A parsed snapshot: the view, its time, and the config overrides it carries."""

    view: ClusterView
    now_ms: int
    config_overrides: Mapping[str, str]


def _hex(value: Any, path: str) -> int:
    try:
        v = int(value, 16) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        raise InvalidInput(path, f"not a hash value: {value!r}") from None
    if not 0 <= v <= FULL_UPPER:
        raise InvalidInput(path, f"outside the 32-bit ring: {value!r}")
    return v


def _average(doc: Any, max_samples: int, path: str) -> TimeAverageMessageData:
    if not isinstance(doc, dict):
        raise InvalidInput(path, "must be an object")
    try:
        return TimeAverageMessageData(
            max_samples=max_samples,
            num_samples=min(int(doc.get("numSamples", max_samples)), max_samples),
            msg_throughput_in=float(doc.get("msgThroughputIn", 0.0)),
            msg_throughput_out=float(doc.get("msgThroughputOut", 0.0)),
            msg_rate_in=float(doc.get("msgRateIn", 0.0)),
            msg_rate_out=float(doc.get("msgRateOut", 0.0)),
        )
    except (TypeError, ValueError) as e:
        raise InvalidInput(path, f"bad number: {e}") from None


def parse_snapshot(text: str, weights: UsageWeights | None = None) -> Snapshot:
    """Parse snapshot JSON; raise ``InvalidInput`` naming the path of the first problem."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise InvalidInput("snapshot", f"not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise InvalidInput("snapshot", "must be a JSON object")
    version = doc.get("snapshotVersion", SNAPSHOT_VERSION)
    if version != SNAPSHOT_VERSION:
        raise InvalidInput("snapshotVersion", f"unsupported version {version!r}")
    weights = weights or UsageWeights()
    raw_brokers = doc.get("brokers")
    if not isinstance(raw_brokers, dict) or not raw_brokers:
        raise InvalidInput("brokers", "must be a non-empty object of broker -> {report}")

    bundles: dict[str, BundleData] = {}
    for name, bd in (doc.get("bundleData") or {}).items():
        path = f"bundleData[{name!r}]"
        parse_bundle(name)
        if not isinstance(bd, dict):
            raise InvalidInput(path, "must be an object")
        bundles[name] = BundleData(
            _average(bd.get("shortTerm", {}), NUM_SHORT_SAMPLES, f"{path}.shortTerm"),
            _average(bd.get("longTerm", {}), NUM_LONG_SAMPLES, f"{path}.longTerm"),
            int(bd.get("topics", 0)),
        )

    reports = {}
    for broker, entry in sorted(raw_brokers.items()):
        if not isinstance(entry, dict) or not isinstance(entry.get("report"), dict):
            raise InvalidInput(f"brokers[{broker!r}]", "must be an object with a 'report'")
        report = report_from_dict(entry["report"], broker)
        reports[broker] = (report, entry)
        for name, stats in report.last_stats.items():
            if name not in bundles:
                bundles[name] = BundleData.new().update(stats)

    brokers: dict[str, BrokerView] = {}
    default = BundleData.new()
    for broker, (report, entry) in reports.items():
        usage = entry.get("historyUsage")
        thr = entry.get("msgThroughputEma")
        ta = TimeAverageBrokerData.of(bundles.get(b, default) for b in report.bundles)
        brokers[broker] = BrokerView(
            report=report,
            history_usage=float(usage) if usage is not None else weights.weighted_max(report),
            msg_throughput_ema=float(thr) if thr is not None else report.msg_throughput,
            time_average=ta,
            updated_at_ms=int(entry.get("updatedAtMs", report.last_update_ms)),
        )

    namespaces: dict[str, NamespaceBundles] = {}
    for ns, bounds in (doc.get("namespaces") or {}).items():
        if not isinstance(bounds, list):
            raise InvalidInput(f"namespaces[{ns!r}]", "must be a list of boundaries")
        parsed = tuple(_hex(b, f"namespaces[{ns!r}]") for b in bounds)
        namespaces[ns] = NamespaceBundles(ns, parsed)

    recent = {str(b): int(t) for b, t in (doc.get("recentlyUnloaded") or {}).items()}
    hashes = {
        str(b): tuple(_hex(h, f"topicHashes[{b!r}]") for h in hs)
        for b, hs in (doc.get("topicHashes") or {}).items()
    }
    overrides = {str(k): str(v) for k, v in (doc.get("config") or {}).items()}
    now_ms = int(doc.get("nowMs", max((r.last_update_ms for r, _ in reports.values()), default=0)))
    view = ClusterView(
        brokers=MappingProxyType(brokers),
        bundle_data=MappingProxyType(bundles),
        namespaces=MappingProxyType(namespaces),
        recently_unloaded=MappingProxyType(recent),
        topic_hashes=MappingProxyType(hashes),
    )
    return Snapshot(view, now_ms, MappingProxyType(overrides))
