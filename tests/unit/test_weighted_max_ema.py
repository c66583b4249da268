"""``weightedMaxEMA`` (TransferShedder's broker load) beside the within-limit history usage:
the fold, the snapshot reader and the driver's copy of the view agree, and documents written
without the field stay readable."""

from __future__ import annotations

import json

import numpy as np
import pytest

from loadbalance.model import LocalBrokerData, ResourceUsage
from loadbalance.report_codec import report_to_dict
from loadbalance.snapshot import snapshot_from_document
from loadbalance.view import LoadState, UsageWeights, build_view, ingest_many
from streaming.driver_view import DriverView
from streaming.schema import BROKER, OUTPUT_FIELDS, frame

WEIGHTS = UsageWeights()


def _report(cpu: float, bandwidth: float = 30.0) -> LocalBrokerData:
    bw = ResourceUsage(bandwidth, 100.0)
    return LocalBrokerData(
        broker="b1:8080", cpu=ResourceUsage(cpu, 100.0), bandwidth_in=bw, bandwidth_out=bw
    )


def test_the_uncapped_reading_keeps_a_signal_above_100_percent() -> None:
    report = _report(120.0)
    assert WEIGHTS.weighted_max(report) == pytest.approx(0.3)
    assert WEIGHTS.weighted_max_uncapped(report) == pytest.approx(1.2)


def test_the_fold_seeds_with_the_first_reading_then_weighs_the_history() -> None:
    state = ingest_many(
        LoadState(), [_report(120.0)], history_percentage=0.9, weights=WEIGHTS, received_at_ms=1
    )
    assert state.brokers["b1:8080"].weighted_max_ema == pytest.approx(1.2)
    state = ingest_many(
        state, [_report(50.0)], history_percentage=0.9, weights=WEIGHTS, received_at_ms=2
    )
    view = build_view(state).brokers["b1:8080"]
    assert view.weighted_max_ema == pytest.approx(0.9 * 1.2 + 0.1 * 0.5)
    assert view.history_usage == pytest.approx(0.9 * 0.3 + 0.1 * 0.5)


def test_a_snapshot_without_weighted_max_ema_starts_from_the_uncapped_reading() -> None:
    doc = {"report": report_to_dict(_report(120.0)), "historyUsage": 0.25}
    old = snapshot_from_document({"brokers": {"b1:8080": doc}}, {}).view.brokers["b1:8080"]
    assert (old.history_usage, old.weighted_max_ema) == pytest.approx((0.25, 1.2))
    new = snapshot_from_document(
        {"brokers": {"b1:8080": {**doc, "weightedMaxEma": 0.7}}}, {}
    ).view.brokers["b1:8080"]
    assert new.weighted_max_ema == 0.7


def test_the_driver_writes_weighted_max_ema_and_reads_older_documents_without_it() -> None:
    report = report_to_dict(_report(120.0))
    view = DriverView()
    view.apply(
        frame(
            OUTPUT_FIELDS,
            1,
            kind=np.array([BROKER], dtype=object),
            name=np.array(["b1:8080"], dtype=object),
            event_ms=np.array([5], dtype=np.int64),
            history_usage=np.array([0.25]),
            msg_throughput_ema=np.array([1.0]),
            weighted_max_ema=np.array([0.75]),
            doc=np.array([json.dumps(report)], dtype=object),
        )
    )
    written = json.loads(view.take_changes()[0]["b1:8080"])
    assert (written["historyUsage"], written["weightedMaxEma"]) == (0.25, 0.75)
    assert view.cluster_view({}).brokers["b1:8080"].weighted_max_ema == 0.75
    again = DriverView.from_snapshot({"b1:8080": json.dumps(written)}, {})
    assert again.cluster_view({}).brokers["b1:8080"].weighted_max_ema == 0.75
    del written["weightedMaxEma"]
    older = DriverView.from_snapshot({"b1:8080": json.dumps(written)}, {}, WEIGHTS)
    got = older.cluster_view({}).brokers["b1:8080"]
    assert (got.history_usage, got.weighted_max_ema) == pytest.approx((0.25, 1.2))
