"""The stateful step (``transformWithStateInPandas``): per-bundle averages and per-broker history.

Keys and state layout (why: DESIGN.md §5, each key costs state-server round trips and a Python
call, so there are few keys and the work inside a key is vectorised):

* ``s:<shard>`` (``crc32(bundle) % n_shards``): ONE value state ``shard`` holding the whole
  shard as a ``streaming.shard_state.ShardState`` blob: per bundle the short- (10) and long-term
  (1000 samples) ``TimeAverageMessageData``, the last sample, its reporting broker and the event
  time it was seen. State is keyed by bundle, not by broker, so it survives an ownership change.
  A bundle with no sample for ``bundle_ttl_ms`` of event time (measured against the newest
  sample of its shard) is dropped and reported as ``bundle_expired``: that is how the parent of
  a split or the halves of a merge leave the state, since their names stop appearing in reports.
  (The decision stage also drops at once the bundles its namespaces in Redis no longer contain.)
* ``b:<broker>``: value state ``broker`` with the history-weighted usage
  (``loadBalancerHistoryResourcePercentage`` over the weighted capped max usage computed at
  parse time), the throughput EMA with the same weight, the last report's figures and event
  time, and an event-time timer. A broker with no report for
  ``loadBalancerBrokerReportTimeoutSeconds`` of event time (the watermark, i.e. the other
  brokers' reports, moved past its last report plus the timeout) is forgotten and reported as
  ``broker_gone``. Event time rather than processing time because it needs no clock, is exact
  on replay, and lets ``availableNow`` runs finish: Spark runs a batch without data forever for
  pending processing-time timers, so such a query never drains.
* ``dead``: no state; dead letters pass through to the decision stage, so one query reads the
  source once.

Samples and reports are applied in ``(event_ms, partition, offset)`` order, which is report
order for a broker keyed by its id (one partition per key). Event time is the Kafka record
timestamp; Spark drops rows older than the watermark (newest timestamp minus the job's
``watermark_delay_seconds``) before they reach this step, so a broker whose clock lags the others
by more than that delay is not seen: give the reports topic ``LogAppendTime`` timestamps, or keep
broker clocks in sync.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from loadbalance.time_average import history_usage
from streaming.schema import (
    BROKER,
    BROKER_GONE,
    BROKER_PREFIX,
    BUNDLE,
    BUNDLE_EXPIRED,
    COUNT_COLUMNS,
    DEAD,
    LAST_COLUMNS,
    LONG_COLUMNS,
    OUTPUT_FIELDS,
    SHARD_PREFIX,
    SHORT_COLUMNS,
    frame,
)
from streaming.shard_state import ShardState, unpack_samples
from streaming.snapshot_docs import bundle_docs

SHARD_STATE_SCHEMA = "blob binary"
BROKER_STATE_SCHEMA = (
    "history_usage double, msg_throughput_ema double, event_ms bigint, timer_ms bigint, "
    "report string"
)


class LoadStateProcessor(StatefulProcessor):
    """Keeps the averages; see the module docstring for keys and layout."""

    def __init__(self, history_percentage: float, report_timeout_ms: int, bundle_ttl_ms: int):
        self.history_percentage = float(history_percentage)
        self.report_timeout_ms = int(report_timeout_ms)
        self.bundle_ttl_ms = int(bundle_ttl_ms)

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.shard = handle.getValueState("shard", SHARD_STATE_SCHEMA)
        self.broker = handle.getValueState("broker", BROKER_STATE_SCHEMA)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        name = key[0] if isinstance(key, tuple) else key
        pdf = pd.concat(list(rows), ignore_index=True)
        if pdf.empty:
            return
        if name.startswith(SHARD_PREFIX):
            pdf = pdf.sort_values(["event_ms", "partition", "offset"], kind="stable")
            yield from self._samples(pdf)
        elif name.startswith(BROKER_PREFIX):
            pdf = pdf.sort_values(["event_ms", "partition", "offset"], kind="stable")
            yield from self._reports(name[len(BROKER_PREFIX) :], pdf)
        else:
            yield frame(
                OUTPUT_FIELDS,
                len(pdf),
                kind=np.full(len(pdf), DEAD, dtype=object),
                event_ms=pdf["event_ms"].to_numpy(np.int64),
                payload=pdf["payload"].to_numpy(object),
            )

    def _samples(self, pdf: pd.DataFrame) -> Iterator[pd.DataFrame]:
        if self.shard.exists():
            state = ShardState.from_bytes(bytes(self.shard.get()[0]))
        else:
            state = ShardState()
        names: list[str] = []
        values, counts, owners, events = [], [], [], []
        for payload, broker, event_ms in zip(
            pdf["payload"].tolist(), pdf["broker"].tolist(), pdf["event_ms"].tolist(), strict=True
        ):
            n, v, c = unpack_samples(bytes(payload))
            names.extend(n)
            values.append(v)
            counts.append(c)
            owners.extend([broker] * len(n))
            events.append(np.full(len(n), event_ms, dtype=np.int64))
        touched = state.apply(
            names, np.concatenate(values), np.concatenate(counts), owners, np.concatenate(events)
        )
        out = [bundle_rows(state, touched)]
        newest_ms = int(pdf["event_ms"].max())
        expired = state.expire(newest_ms - self.bundle_ttl_ms)
        if expired:
            out.append(
                frame(
                    OUTPUT_FIELDS,
                    len(expired),
                    kind=np.full(len(expired), BUNDLE_EXPIRED, dtype=object),
                    name=np.array(expired, dtype=object),
                    event_ms=np.full(len(expired), newest_ms, dtype=np.int64),
                )
            )
        if len(state):
            self.shard.update((state.to_bytes(),))
        else:
            self.shard.clear()
        yield pd.concat(out, ignore_index=True) if len(out) > 1 else out[0]

    def _reports(self, broker: str, pdf: pd.DataFrame) -> Iterator[pd.DataFrame]:
        prev = self.broker.get() if self.broker.exists() else None
        usage = prev[0] if prev else None
        ema = prev[1] if prev else None
        h = self.history_percentage
        for u, thr in zip(pdf["usage"].tolist(), pdf["msg_throughput"].tolist(), strict=True):
            usage = history_usage(usage, u, h)
            ema = history_usage(ema, thr, h)
        last = pdf.iloc[-1]
        report = bytes(last["payload"]).decode()
        event_ms = int(last["event_ms"])
        for old in list(self.handle.listTimers()):
            self.handle.deleteTimer(old)
        timer_ms = event_ms + self.report_timeout_ms
        self.handle.registerTimer(timer_ms)
        self.broker.update((usage, ema, event_ms, timer_ms, report))
        yield broker_row(BROKER, broker, event_ms, usage, ema, report)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        name = key[0] if isinstance(key, tuple) else key
        if not name.startswith(BROKER_PREFIX) or not self.broker.exists():
            return
        usage, ema, event_ms, _timer, report = self.broker.get()
        self.broker.clear()
        yield broker_row(BROKER_GONE, name[len(BROKER_PREFIX) :], event_ms, usage, ema, report)

    def close(self) -> None:
        pass


def broker_row(
    kind: str, broker: str, event_ms: int, usage: float, ema: float, report: str
) -> pd.DataFrame:
    return frame(
        OUTPUT_FIELDS,
        1,
        kind=[kind],
        name=[broker],
        broker=[broker],
        event_ms=np.array([event_ms], dtype=np.int64),
        history_usage=np.array([usage], dtype=np.float64),
        msg_throughput_ema=np.array([ema], dtype=np.float64),
        doc=[report],
    )


def bundle_rows(state: ShardState, idx: np.ndarray) -> pd.DataFrame:
    """The current averages of the bundles ``idx`` as output rows."""
    n = len(idx)
    cols: dict[str, Any] = {
        "kind": np.full(n, BUNDLE, dtype=object),
        "name": np.array([state.names[i] for i in idx.tolist()], dtype=object),
        "broker": np.array([state.owners[i] for i in idx.tolist()], dtype=object),
        "event_ms": state.last_seen_ms[idx],
        "short_num_samples": state.short_n[idx],
        "long_num_samples": state.long_n[idx],
    }
    for j, c in enumerate(SHORT_COLUMNS):
        cols[c] = state.short_avg[idx, j]
    for j, c in enumerate(LONG_COLUMNS):
        cols[c] = state.long_avg[idx, j]
    for j, c in enumerate(LAST_COLUMNS):
        cols[c] = state.last_values[idx, j]
    for j, c in enumerate(COUNT_COLUMNS):
        cols[c] = state.last_counts[idx, j]
    cols["doc"] = np.array(
        bundle_docs(
            state.short_avg[idx].tolist(),
            state.short_n[idx].tolist(),
            state.long_avg[idx].tolist(),
            state.long_n[idx].tolist(),
            state.last_values[idx].tolist(),
            state.last_counts[idx].tolist(),
            cols["broker"].tolist(),
            cols["event_ms"].tolist(),
        ),
        dtype=object,
    )
    return frame(OUTPUT_FIELDS, n, **cols)
