"""The state step folds a key's rows in report order whatever order they arrive in.

Why a unit test: in the job, the shuffle happens to hand a key's rows over in map-task order,
which is already report order, so no Spark test breaks when the state step's sort by
``(event_ms, partition, offset)`` is removed. Reading tasks finish in any order, though, and
a range cut into several tasks (``maxRecordsPerPartition``) gives a broker's reports to more
than one of them, so the order must not be left to the shuffle.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from streaming.schema import BROKER_PREFIX, PARSED_FIELDS, REPORT, SAMPLES, frame
from streaming.shard_cache import WORKER_SHARD_CACHE
from streaming.shard_state import pack_samples
from streaming.state import LoadStateProcessor
from tests.unit.test_state_shard_cache import FakeHandle

NAMES = [f"t/ns/0x{i:08x}_0x{i + 1:08x}" for i in range(6)]


class TimedHandle(FakeHandle):
    """``FakeHandle`` that also takes the broker keys' timers."""

    def __init__(self) -> None:
        super().__init__()
        self.timers: list[int] = []

    def registerTimer(self, at_ms: int) -> None:
        self.timers.append(at_ms)


@pytest.fixture(autouse=True)
def _empty_cache():
    WORKER_SHARD_CACHE.clear()
    yield
    WORKER_SHARD_CACHE.clear()


def _rows(kind: str, key: str, reports: list[tuple[str, int, int, int, float]]) -> pd.DataFrame:
    """One row per ``(broker, event_ms, partition, offset, rate)``: a sample block of every
    name at ``rate`` (``SAMPLES``), or a report row with usage ``rate`` (``REPORT``)."""
    payloads = [
        pack_samples(NAMES, np.full((len(NAMES), 4), rate), np.ones((len(NAMES), 3), np.int64))
        if kind == SAMPLES
        else b"{}"
        for _, _, _, _, rate in reports
    ]
    n = len(reports)
    return frame(
        PARSED_FIELDS,
        n,
        key=np.full(n, key, dtype=object),
        kind=np.full(n, kind, dtype=object),
        broker=np.array([r[0] for r in reports], dtype=object),
        event_ms=np.array([r[1] for r in reports], dtype=np.int64),
        partition=np.array([r[2] for r in reports], dtype=np.int32),
        offset=np.array([r[3] for r in reports], dtype=np.int64),
        usage=np.array([r[4] for r in reports], dtype=np.float64),
        msg_throughput=np.array([1e6 * r[4] for r in reports], dtype=np.float64),
        payload=np.array(payloads, dtype=object),
    )


# Two brokers' reports on two partitions; ties in event_ms are broken by partition, then
# offset. Every report carries every bundle, so each bundle's owner is the last reporter:
# b:1's at (3000, partition 1, offset 6), although a:1's at (3000, 0, 13) has the larger
# offset.
REPORTS = [
    ("a:1", 1_000, 0, 10, 5.0),
    ("b:1", 1_000, 1, 3, 9.0),
    ("a:1", 2_000, 0, 11, 7.0),
    ("b:1", 2_000, 1, 4, 2.0),
    ("a:1", 3_000, 0, 12, 30.0),
    ("a:1", 3_000, 0, 13, 1.0),
    ("b:1", 2_500, 1, 5, 11.0),
    ("b:1", 3_000, 1, 6, 4.0),
]
IN_ORDER = sorted(REPORTS, key=lambda r: (r[1], r[2], r[3]))
SHUFFLED = [REPORTS[i] for i in (7, 5, 3, 0, 6, 1, 4, 2)]


def _fold(kind: str, key: str, reports: list[tuple[str, int, int, int, float]]) -> TimedHandle:
    """``reports`` through the state step in two chunks, as two reading tasks would send."""
    handle = TimedHandle()
    proc = LoadStateProcessor(0.9, 10_000, 3_600_000)
    proc.init(handle)
    chunks = iter([_rows(kind, key, reports[:3]), _rows(kind, key, reports[3:])])
    list(proc.handleInputRows((key,), chunks, None))
    return handle


def test_a_shard_folds_its_samples_in_report_order_whatever_order_they_arrive_in():
    assert SHUFFLED != IN_ORDER
    arrived = _fold(SAMPLES, "s:0", SHUFFLED).stored()
    ordered = _fold(SAMPLES, "s:0", IN_ORDER).stored()
    assert arrived.to_bytes() == ordered.to_bytes()
    assert set(arrived.owners) == {"b:1"}
    assert arrived.last_values[:, 0].tolist() == [4.0] * len(NAMES)


def test_a_broker_folds_its_reports_usage_in_report_order_whatever_order_they_arrive_in():
    a_reports = [r for r in REPORTS if r[0] == "a:1"]
    shuffled = [a_reports[i] for i in (3, 0, 2, 1)]
    key = BROKER_PREFIX + "a:1"
    arrived = _fold(REPORT, key, shuffled).values["broker"].value
    ordered = _fold(REPORT, key, a_reports).values["broker"].value
    assert arrived == ordered
    assert arrived[2] == 3_000  # the newest report's event time
