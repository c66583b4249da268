"""The stream job's Prometheus updates, made by the decision stage once per batch.

Kept apart from the stage (``streaming.decide``) because they only read what a batch did: the
brokers' usage gauges and scores from the reports, decisions by kind and reason, and the batch's
own counters, Pulsar's metric names included (``infra.metrics``).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from infra import metrics
from loadbalance.cycle import CycleResult
from loadbalance.decisions import SPLIT, TRANSFER, UNLOAD, Decision
from loadbalance.values import DecisionReason, SkipReason
from metadata_store.load_snapshot import decode_broker_entry
from streaming.batch_stats import BatchStats
from streaming.schema import BROKER, BROKER_GONE, ISSUES_FIELD, ISSUES_MARK

__all__ = ["StreamMetrics", "count_report_issues", "usage_percents"]


_USAGE_KEYS = ("cpu", "memory", "directMemory", "bandwidthIn", "bandwidthOut")


def usage_percents(doc: str) -> tuple[float, float, float, float, float]:
    """CPU, memory, direct memory, bandwidth in/out usage in percent from a report document.

    Why not ``json.loads(doc)``: the document carries the broker's bundle list (thousands of
    names) after the usage fields, and the driver view already pays for one full parse per
    report; the head before ``"bundles"`` is all the gauges need. A JSON string cannot hold an
    unescaped ``"``, so the first ``,"bundles":`` is the top-level key; anything odd falls back to
    the full parse.
    """
    cut = doc.find(',"bundles":')
    try:
        head = json.loads(doc[:cut] + "}") if cut > 0 else json.loads(doc)
    except ValueError:
        head = json.loads(doc)
    out = []
    for key in _USAGE_KEYS:
        r = head.get(key)
        usage = limit = 0.0
        if isinstance(r, dict):
            usage, limit = float(r.get("usage") or 0.0), float(r.get("limit") or 0.0)
        out.append(usage / limit * 100.0 if limit > 0 else 0.0)  # Pulsar's percentUsage()
    return out[0], out[1], out[2], out[3], out[4]


def count_report_issues(doc: str) -> None:
    """Add a report's ``reportIssues`` (summed over the broker's reports of the batch by the
    state step) to ``lbctl_report_issues_total`` with ``source="stream"``. Counted once per
    batch the decision stage completes; a batch replayed after a crash may count twice, as any
    counter of a restarted process would."""
    for kind, n in (json.loads(doc).get(ISSUES_FIELD) or {}).items():
        metrics.REPORT_ISSUES.labels(source="stream", kind=kind).inc(int(n))


class StreamMetrics:
    """The stream job's Prometheus updates, once per batch (never per record).

    Keeps every broker's score so that ``pulsar_lb_resource_usage_stats`` is over the whole
    cluster, not only the brokers that reported in this batch. Input rows are counted by the
    query listener in ``streaming.job`` (Spark knows the source's row count; this stage only sees
    the state step's output).
    """

    def __init__(self, shedder_name: str) -> None:
        self.shedder_name = shedder_name
        self.scores: dict[str, float] = {}

    def seed(self, brokers: Mapping[str, str | bytes]) -> None:
        """Gauges from the snapshot the view was seeded with (so they are right from the start)."""
        self.scores = {}
        for name, raw in brokers.items():
            entry = decode_broker_entry(raw)
            self._set(name, json.dumps(entry.report or {}), entry.history_usage)
        metrics.forget_brokers(self.scores)
        self._stats()

    def _set(self, broker: str, report_doc: str, score: float) -> None:
        cpu, mem, direct, bw_in, bw_out = usage_percents(report_doc)
        metrics.set_broker_usage(
            broker, cpu=cpu, memory=mem, direct_memory=direct, bandwidth_in=bw_in,
            bandwidth_out=bw_out,
        )  # fmt: skip
        metrics.set_broker_score(broker, max_ema=score)
        self.scores[broker] = score

    def _stats(self) -> None:
        if not self.scores:
            return
        values = list(self.scores.values())
        avg = sum(values) / len(values)
        var = max(0.0, sum(v * v for v in values) / len(values) - avg * avg)
        metrics.set_resource_usage_stats(avg, math.sqrt(var))

    def brokers(self, pdf: Any) -> None:
        """Usage gauges of the brokers this batch reported; drop the ones that went away."""
        # One selection of the few broker rows out of the (many) bundle rows.
        rows = pdf.loc[pdf["kind"].isin((BROKER, BROKER_GONE)), ["kind", "name", "doc"]]
        scores = pdf.loc[rows.index, "history_usage"].tolist() if len(rows) else []
        reported, gone = set(), []
        for kind, name, doc, score in zip(
            rows["kind"].tolist(), rows["name"].tolist(), rows["doc"].tolist(), scores
        ):
            if kind == BROKER:
                self._set(name, doc, float(score))
                reported.add(name)
                if ISSUES_MARK in doc:
                    count_report_issues(doc)
            else:
                gone.append(name)
        gone = [n for n in gone if n not in reported]
        for name in gone:
            self.scores.pop(name, None)
        if gone:
            metrics.forget_brokers(self.scores)
        if reported or gone:
            self._stats()

    def decisions(self, decisions: Iterable[Decision], result: CycleResult | None) -> None:
        """Decisions by kind and reason, and Pulsar's unload/split counters and breakdowns."""
        unloads, splits = [], []
        published: Counter[tuple[str, str]] = Counter()  # one increment per label set
        for d in decisions:
            published[d.kind, d.reason or DecisionReason.UNKNOWN] += 1
            if d.kind in (UNLOAD, TRANSFER):
                unloads.append((d.source_broker or "", d.reason))
            elif d.kind == SPLIT:
                splits.append(d.reason)
        for (kind, reason), n in published.items():
            metrics.DECISIONS_PUBLISHED.labels(kind=kind, reason=reason).inc(n)
        metrics.record_unloads(unloads)
        metrics.record_splits(splits)
        if result is not None and result.shedding_ran and not unloads:
            # Pulsar counts a shedding cycle that unloaded nothing once, with its skip reason.
            reasons = [s.reason for s in result.skips if s.policy == self.shedder_name]
            metrics.record_unload_skip(reasons[0] if reasons else SkipReason.BALANCED)

    @staticmethod
    def batch(stats: BatchStats, n_brokers: int, n_bundles: int) -> None:
        metrics.STREAM_BATCHES.inc()
        metrics.STREAM_LAST_BATCH_ID.set(stats.batch_id)
        metrics.STREAM_BATCH_DURATION.observe(stats.duration_ms / 1000.0)
        metrics.STREAM_BATCH_SPARK_DURATION.observe(stats.collect_ms / 1000.0)
        metrics.STREAM_DEAD_LETTERS.inc(stats.dead_letters)
        metrics.STREAM_BROKERS.set(n_brokers)
        metrics.STREAM_BUNDLES.set(n_bundles)
