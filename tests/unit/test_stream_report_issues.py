"""What the codec ignored in accepted reports reaches ``lbctl_report_issues_total`` from the
streaming job: the state step sums a broker's issues over the batch's reports, and the decision
stage counts them under ``source="stream"``."""

from __future__ import annotations

import json

import numpy as np

from infra import metrics
from streaming.schema import BROKER, OUTPUT_FIELDS, frame
from streaming.state import with_batch_issues
from streaming.stream_metrics import StreamMetrics


def _doc(n: float, issues: dict[str, int] | None = None) -> bytes:
    doc: dict = {"cpu": {"usage": n, "limit": 100.0}, "bundles": ["a/b/0x00000000_0xffffffff"]}
    if issues:
        doc["reportIssues"] = issues
    return json.dumps(doc).encode()


def _counter(kind: str) -> float:
    sample = metrics.REGISTRY.get_sample_value(
        "lbctl_report_issues_total", {"source": "stream", "kind": kind}
    )
    return sample or 0.0


def test_the_last_report_carries_the_batchs_issues_summed() -> None:
    first = _doc(10.0, {"brokenReading": 2})
    middle = _doc(20.0)
    last = _doc(30.0, {"brokenReading": 1, "bundleSkipped": 4})
    doc = json.loads(with_batch_issues([first, middle, last]))
    assert doc["reportIssues"] == {"brokenReading": 3, "bundleSkipped": 4}
    assert doc["cpu"] == {"usage": 30.0, "limit": 100.0}  # the last report's figures
    # no issue before the last report: the last document as it came, not re-encoded
    assert with_batch_issues([middle, last]) == last.decode()
    # issues of an earlier report only: the last document gains them
    assert json.loads(with_batch_issues([first, middle]))["reportIssues"] == {"brokenReading": 2}


def test_the_decision_stage_counts_the_issues_of_the_brokers_that_reported() -> None:
    docs = [with_batch_issues([_doc(10.0, {"kindA": 2}), _doc(11.0, {"kindA": 1})]),
            _doc(12.0).decode()]  # fmt: skip
    before = _counter("kindA")
    pdf = frame(
        OUTPUT_FIELDS,
        2,
        kind=np.array([BROKER, BROKER], dtype=object),
        name=np.array(["b1", "b2"], dtype=object),
        event_ms=np.array([5, 5], dtype=np.int64),
        history_usage=np.array([0.1, 0.2]),
        msg_throughput_ema=np.array([1.0, 1.0]),
        doc=np.array(docs, dtype=object),
    )
    StreamMetrics("ThresholdShedder").brokers(pdf)
    assert _counter("kindA") == before + 3
