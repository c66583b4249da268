"""The stateful step (``transformWithStateInPandas``): per-bundle averages and per-broker history.

Keys and state layout (why, docs/architecture.md, Constraints: each key costs state-server
round trips and a Python call, so there are few keys and the work inside a key is vectorised):

* ``s:<shard>`` (``crc32(bundle) % n_shards``; with a salt, ``s:<shard>.<salt>``, that deals the
  shards out evenly over the state partitions: ``streaming.state_keys``; its output is named
  ``s:<shard>`` either way): the shard's whole ``streaming.shard_state.ShardState`` record (per
  bundle the short- (10) and long-term (1000 samples) ``TimeAverageMessageData``, the last
  sample, its reporting broker and the event time it was seen), the delta records written
  since, and a tag naming them, stored as ``streaming.shard_store`` lays them out (the one
  layout; a checkpoint of an older one is refused with one line). Each batch adds the record of
  the bundles it changed, and the whole record is written again (the deltas cleared) when
  ``shard_state.compaction_due`` says the deltas have grown to about the record's size or
  number (in a batch picked so that shards do not all do it at once), for a new shard, or when
  bundles expired. Why deltas: with a million bundles each batch changes about a sixth of every
  shard, and storing and shipping every whole shard in every batch was most of a batch's time.
  Each Python worker keeps the shards it wrote (``streaming.shard_cache``), used only while the
  stored tag says the store holds them. State is keyed by bundle, not by broker, so it survives
  an ownership change.
  A bundle with no sample for ``bundle_ttl_ms`` of event time (measured against the newest
  sample of its shard) is dropped: that is how the parent of a split or the halves of a merge
  leave the state, since their names stop appearing in reports. (The decision stage leaves out
  at once the bundles its namespaces in Redis no longer contain.) The output is one row per
  shard that received samples: the whole record or the delta, as stored (``streaming.schema``).
* ``b:<broker>``: value state ``broker`` with the history-weighted usage
  (``loadBalancerHistoryResourcePercentage`` over the weighted capped max usage computed at
  parse time), the throughput EMA with the same weight, the last report's event time (the
  report itself goes to the decision stage, not into state), and one event-time timer; and value
  state ``broker_weighted_max_ema`` with Pulsar's ``weightedMaxEMA`` (the same fold over the
  weighted max usage with every signal, signals above 100 % included, which TransferShedder
  reads). Why a state of its own rather than a column of ``broker``: a checkpoint written before
  it existed keeps ``broker``'s schema and stays readable, and adding a state variable is what
  ``transformWithStateInPandas`` accepts on an existing checkpoint; there, the average starts
  from the broker's first report after the upgrade (the first-sample rule), while the others
  carry on. A broker
  with no report for
  ``loadBalancerBrokerReportTimeoutSeconds`` of event time (the watermark, i.e. the other
  brokers' reports, moved past its last report plus the timeout) is forgotten and reported as
  ``broker_gone``; the timer is armed at the first report and, when it fires for a broker that
  reported since, armed again at the new deadline (no timer calls per report). Event time
  rather than processing time because it needs no clock, is exact
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

import json
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
from metadata_store.load_snapshot import delta_key
from streaming import stage_timing
from streaming.schema import (
    BROKER,
    BROKER_GONE,
    BROKER_PREFIX,
    DEAD,
    ISSUES_FIELD,
    ISSUES_MARK,
    OUTPUT_FIELDS,
    SHARD,
    SHARD_DELTA,
    SHARD_PREFIX,
    frame,
)
from streaming.shard_cache import WORKER_SHARD_CACHE, Checkout, ShardCache
from streaming.shard_records import LocalRecords
from streaming.shard_state import ShardState, compaction_due, split_samples
from streaming.shard_store import ShardStore, record_id, tag_parts
from streaming.state_keys import shard_name, shard_number

BROKER_STATE_SCHEMA = (
    "history_usage double, msg_throughput_ema double, event_ms bigint, timer_ms bigint"
)
BROKER_WEIGHTED_MAX_EMA_SCHEMA = "weighted_max_ema double"


class LoadStateProcessor(StatefulProcessor):
    """Keeps the averages; see the module docstring for keys and layout."""

    def __init__(
        self,
        history_percentage: float,
        report_timeout_ms: int,
        bundle_ttl_ms: int,
        records_dir: str | None = None,
    ):
        self.history_percentage = float(history_percentage)
        self.report_timeout_ms = int(report_timeout_ms)
        self.bundle_ttl_ms = int(bundle_ttl_ms)
        self.records_dir = records_dir
        """A local folder for each shard's whole record (``streaming.shard_records``); None:
        none, a worker without a copy of a shard reads it from the store."""
        self.cache: ShardCache | None = None
        """The shard cache; None: this worker process's (``WORKER_SHARD_CACHE``)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.shards = ShardStore(handle)
        self.records = LocalRecords(self.records_dir) if self.records_dir else None
        self.broker = handle.getValueState("broker", BROKER_STATE_SCHEMA)
        self.broker_weighted_max_ema = handle.getValueState(
            "broker_weighted_max_ema", BROKER_WEIGHTED_MAX_EMA_SCHEMA
        )

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        clock = stage_timing.Clock()
        name = key[0] if isinstance(key, tuple) else key
        pdf = pd.concat(list(rows), ignore_index=True)
        if pdf.empty:
            return
        if name.startswith(SHARD_PREFIX):
            pdf = pdf.sort_values(["event_ms", "partition", "offset"], kind="stable")
            out = list(self._samples(name, pdf))
            clock.record("state.shard", len(pdf))
            yield from out
        elif name.startswith(BROKER_PREFIX):
            pdf = pdf.sort_values(["event_ms", "partition", "offset"], kind="stable")
            out = list(self._reports(name[len(BROKER_PREFIX) :], pdf))
            clock.record("state.broker", len(pdf))
            yield from out
        else:
            yield frame(
                OUTPUT_FIELDS,
                len(pdf),
                kind=np.full(len(pdf), DEAD, dtype=object),
                event_ms=pdf["event_ms"].to_numpy(np.int64),
                payload=pdf["payload"].to_numpy(object),
            )

    def _samples(self, key_name: str, pdf: pd.DataFrame) -> Iterator[pd.DataFrame]:
        cache = WORKER_SHARD_CACHE if self.cache is None else self.cache
        with cache.checkout(key_name) as slot:
            out = self._fold(key_name, pdf, slot)
        if out is not None:
            yield out

    def _fold(self, key_name: str, pdf: pd.DataFrame, slot: Checkout) -> pd.DataFrame | None:
        """Fold a shard's samples into its state and store the change; the output row, or None
        when nothing changed. What ``slot`` keeps is the state as stored."""
        state, tag = self._load_shard(key_name, slot.cached)
        rows: list[np.ndarray] = []
        values, counts, owners, events = [], [], [], []
        for payload, broker, event_ms in zip(
            pdf["payload"].tolist(), pdf["broker"].tolist(), pdf["event_ms"].tolist(), strict=True
        ):
            names_part, v, c = split_samples(bytes(payload))
            rows.append(state.rows_of_block(names_part))
            values.append(v)
            counts.append(c)
            owners.extend([broker] * len(v))
            events.append(np.full(len(v), event_ms, dtype=np.int64))
        newest_ms = int(pdf["event_ms"].max())
        touched = state.apply_rows(
            np.concatenate(rows),
            np.concatenate(values),
            np.concatenate(counts),
            owners,
            np.concatenate(events),
        )
        dropped = state.expire(newest_ms - self.bundle_ttl_ms)
        if not len(touched) and not dropped:  # nothing changed: nothing to store or emit
            if tag is not None:
                slot.keep(tag, state)
            return None
        kind, name, record = self._store(key_name, state, touched, dropped, newest_ms)
        if len(state):
            slot.keep(state.tag, state)
        # An emptied shard's record holds no bundle, which is how expiry reaches the view.
        return frame(
            OUTPUT_FIELDS,
            1,
            kind=np.array([kind], dtype=object),
            name=np.array([name], dtype=object),
            event_ms=np.array([newest_ms], dtype=np.int64),
            payload=np.array([record], dtype=object),
            bundles=np.array([len(state)], dtype=np.int64),
        )

    def _store(
        self,
        key_name: str,
        state: ShardState,
        touched: np.ndarray,
        dropped: list[str],
        newest_ms: int,
    ) -> tuple[str, str, bytes]:
        """Store the changed shard: (output kind, its field name, the record stored)."""
        if not len(state):
            self.shards.clear()
            kind, name, record = SHARD, shard_name(key_name), state.to_bytes()
        elif (
            dropped
            or not state.stored
            or compaction_due(
                shard_number(key_name),
                len(state),
                state.delta_rows + len(touched),
                state.deltas + 1,
                newest_ms,
            )
        ):
            # the whole record, and no deltas: a new shard, expired bundles (a delta cannot
            # remove one), or deltas about as large as the record
            record = state.to_bytes()
            self.shards.write_whole(state, record)
            if self.records is not None:
                self.records.put(key_name, record_id(state.tag), record)
            kind, name = SHARD, shard_name(key_name)
        else:
            # only the rows this batch changed: the state store and the driver get a sixth of
            # the shard when a batch holds a sixth of the brokers' reports
            record = state.delta_bytes(touched)
            self.shards.write_delta(state, record, len(touched))
            kind, name = SHARD_DELTA, delta_key(shard_name(key_name), state.deltas)
        return kind, name, record

    def _load_shard(
        self, key_name: str, cached: tuple[str, ShardState] | None
    ) -> tuple[ShardState, str | None]:
        """The shard's state and the stored tag: this worker's ``cached`` copy when its tag is
        the stored one; the cached copy brought up to date with the deltas written since by
        another worker (same whole record, and the tag's history continues the copy's); else
        the stored record with its deltas applied, or a new state when none is stored."""
        tag = self.shards.stored_tag()
        if cached is not None and tag is not None:
            if cached[0] == tag:
                return cached[1], tag
            clock = stage_timing.Clock()
            state = self._catch_up(cached[1], tag)
            if state is not None:
                clock.record("state.catch_up", 1)  # part of state.shard
                return state, tag
        if tag is None:
            return ShardState(), None
        clock = stage_timing.Clock()
        parts = tag_parts(tag)
        local = None
        if self.records is not None and parts is not None:
            local = self.records.get(key_name, parts[0])
        state = self.shards.read(key_name, tag, local)
        # a cache miss (part of state.shard), its record from the local file or the store
        clock.record("state.file_read" if local is not None else "state.blob_read", 1)
        return state, tag

    def _catch_up(self, state: ShardState, tag: str) -> ShardState | None:
        """``state`` (cached here at an older tag) with the store's deltas after it applied, or
        None when the store's history does not continue from it (another whole record was
        written since, or the store rolled back past it).

        Why: Spark hands a shard's partition to whichever of its pooled Python workers is free,
        so with two workers about half of the batches find the cached copy one or two batches
        old. The tag lists the id of every delta since the whole record, so whether the store
        continues the copy's history is known from the tag alone, and only the deltas the copy
        lacks are read, each by its number: what crosses from the state server is what the
        other worker wrote, not the whole list."""
        parts, mine = tag_parts(tag), tag_parts(state.tag)
        if parts is None or mine is None:
            return None
        (base, chain), (my_base, my_chain) = parts, mine
        have = len(my_chain)
        if base != my_base or have != state.deltas or chain[:have] != my_chain:
            return None
        missing = []
        for k in range(have + 1, len(chain) + 1):
            got = self.shards.delta(k)
            if got is None:
                return None
            missing.append(got)
        state.add_deltas(missing)
        state.tag = tag
        return state

    def _reports(self, broker: str, pdf: pd.DataFrame) -> Iterator[pd.DataFrame]:
        prev = self.broker.get()
        usage = prev[0] if prev else None
        ema = prev[1] if prev else None
        prev_wmax = self.broker_weighted_max_ema.get()
        wmax = prev_wmax[0] if prev_wmax else None
        h = self.history_percentage
        for u, thr, w in zip(
            pdf["usage"].tolist(),
            pdf["msg_throughput"].tolist(),
            pdf["weighted_max"].tolist(),
            strict=True,
        ):
            usage = history_usage(usage, u, h)
            ema = history_usage(ema, thr, h)
            wmax = history_usage(wmax, w, h)
        last = pdf.iloc[-1]
        # the parse stage keeps only the latest report's document (earlier ones: None, or
        # their reportIssues alone)
        report = with_batch_issues([bytes(p) for p in pdf["payload"].tolist() if p is not None])
        event_ms = int(last["event_ms"])
        # One timer per broker, armed at its first report and re-armed when it fires (see
        # handleExpiredTimer), instead of deleting and registering one on every report: each
        # timer call is a state-server round trip, and brokers report every few seconds.
        timer_ms = prev[3] if prev and prev[3] else 0
        if not timer_ms:
            timer_ms = event_ms + self.report_timeout_ms
            self.handle.registerTimer(timer_ms)
        self.broker.update((usage, ema, max(event_ms, prev[2] if prev else 0), timer_ms))
        self.broker_weighted_max_ema.update((wmax,))
        yield broker_row(BROKER, broker, event_ms, usage, ema, report, wmax)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        """A broker's deadline passed: gone if the watermark is past its last report plus the
        timeout, else (it reported since the timer was armed) armed again for that time."""
        name = key[0] if isinstance(key, tuple) else key
        if not name.startswith(BROKER_PREFIX):
            return
        prev = self.broker.get()
        if prev is None:
            return
        usage, ema, event_ms, _timer = prev
        deadline = event_ms + self.report_timeout_ms
        if deadline > timerValues.getCurrentWatermarkInMs():
            self.handle.registerTimer(deadline)
            self.broker.update((usage, ema, event_ms, deadline))
            return
        prev_wmax = self.broker_weighted_max_ema.get()
        wmax = prev_wmax[0] if prev_wmax else usage  # none kept (an older checkpoint): unread
        self.broker.clear()
        self.broker_weighted_max_ema.clear()
        yield broker_row(BROKER_GONE, name[len(BROKER_PREFIX) :], event_ms, usage, ema, "", wmax)

    def close(self) -> None:
        pass


_ISSUES_KEY = ISSUES_MARK.encode()


def with_batch_issues(payloads: list[bytes]) -> str:
    """The last of a broker's report documents in this batch, with ``reportIssues`` (kind ->
    count, what the codec ignored in an accepted report) summed over all of them (the earlier
    ones may be documents of their ``reportIssues`` alone, see ``parse.parse_records``).

    Why: only the last report goes on to the decision stage, which counts the issues for
    ``lbctl_report_issues_total``; a batch that read several reports of one broker (a catch-up)
    would otherwise count the last one's issues alone. A document without issues is not
    decoded (the parse stage adds the key only when there are some), so the usual batch costs a
    substring search per report."""
    last = payloads[-1]
    if not any(_ISSUES_KEY in p for p in payloads[:-1]):
        return last.decode()
    total: dict[str, int] = {}
    for raw in payloads:
        if _ISSUES_KEY in raw:
            for kind, n in (json.loads(raw).get(ISSUES_FIELD) or {}).items():
                total[kind] = total.get(kind, 0) + int(n)
    doc = json.loads(last)
    doc[ISSUES_FIELD] = total
    return json.dumps(doc)


def broker_row(
    kind: str,
    broker: str,
    event_ms: int,
    usage: float,
    ema: float,
    report: str,
    weighted_max_ema: float,
) -> pd.DataFrame:
    """One broker's output row: its averages and, for ``broker``, its last report's document."""
    return frame(
        OUTPUT_FIELDS,
        1,
        kind=[kind],
        name=[broker],
        event_ms=np.array([event_ms], dtype=np.int64),
        history_usage=np.array([usage], dtype=np.float64),
        msg_throughput_ema=np.array([ema], dtype=np.float64),
        weighted_max_ema=np.array([weighted_max_ema], dtype=np.float64),
        doc=[report],
    )
