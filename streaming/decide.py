"""The decision stage (``foreachBatch`` on the state output): the policy cycle once per batch.

Per micro-batch, on the driver (once the batch's rows are collected, and only while this job
holds the decider lease, ``streaming.decider``: a job that does not writes and publishes
nothing, and a cycle renews the lease once more right before it publishes, stamping every
decision with the lease's term):

1. collect the batch's rows (touched bundles and brokers, gone brokers, expired bundles, dead
   letters) and publish the dead letters;
2. apply the rows (the blobs of the state shards that received samples, the brokers that
   reported or went away) to the driver's ``DriverView``, seeded from the Redis snapshot at
   start-up;
3. write the shard records (whole or delta) and broker documents the batch changed, the clock
   and the batch id to Redis in one transaction
   (``metadata_store.progress.RedisProgress.commit``); when split or shedding is due at the
   batch's clock, the batch's namespaces, the registry's live brokers and the lookups'
   placements those brokers have not reported yet (their preallocations whose lease they still
   hold) are recorded first (``P:stream:pending``) and the commit says ``cycle_pending``;
4. a pending cycle then runs ``loadbalance.cycle.step`` over the view just committed, with
   ``cycle = str(batch_id)`` and ``now_ms`` = the newest Kafka timestamp seen so far (never the
   wall clock), publishes every decision with ``encode_decision``, keyed by bundle (the view
   leaves out bundles whose namespace's boundaries in Redis no longer contain them), and commits
   the new ``CycleState`` (``commit_cycle``). The view carries the operator's placement
   policies (``P:policies``, read when the cycle runs), so shedding's guards and transfer
   destinations honour isolation, anti-affinity groups and failure domains.

Step 4 runs on the batch's own thread, right after the commit, never beside another batch:
the order of the steps and why each due cycle completes exactly once are in
``streaming.driver_view``'s docstring.

Why replays are exact: a batch's input offsets are fixed by Spark's offset log, the state step
is deterministic (its only clock is the watermark Spark logs with the batch), the view and
``CycleState`` a batch starts from are those committed with the previous batch, and a cycle
reads the view committed with its batch and the namespaces, brokers and preallocations recorded
before that commit. So a
batch replayed after a crash computes the same view, and a cycle completed after a crash (a
stage completes a ``cycle_pending`` it finds when it seeds, before anything else) the same
decisions with the same ids.
The one input a completed cycle reads afresh is the placement policies: an operator who
changes them between a crash and the cycle's completion gets decisions that follow the new
policies, which is what the change asked for.

A batch whose id is <= the last completed one is **skipped**: it was completed only after its
producer flush returned, so its dead letters are already on their topic, and publishing them
again would only make duplicates (the controller de-duplicates decisions by id anyway, but a
clean decisions topic is easier to audit). A crash between a flush and its commit leaves the
batch or the cycle incomplete; its replay then re-publishes the same ids, which is the
at-least-once case the controller's de-duplication exists for.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from infra.redis_client import connect
from loadbalance.bundles import NamespaceBundles
from loadbalance.config import LoadBalancerConfig
from loadbalance.cycle import MINUTE_MS, CycleState, step, weights_from_config
from loadbalance.decisions import Decision
from loadbalance.shedding.registry import make_shedder
from loadbalance.snapshot import preallocations_from_documents
from loadbalance.time_average import BundleData
from loadbalance.view import with_preallocated
from metadata_store.placement_policies import PlacementPoliciesStore
from metadata_store.progress import MemoryProgress, Progress, ProgressStore, RedisProgress
from streaming.batch_stats import BatchStats
from streaming.decider import Decider
from streaming.driver_view import DriverView
from streaming.schema import DEAD
from streaming.sinks import KafkaSink
from streaming.stream_metrics import StreamMetrics

log = logging.getLogger("streaming.decide")


def policies_due(state: CycleState, config: LoadBalancerConfig, now_ms: int) -> bool:
    """Whether ``cycle.step`` would run split or shedding at ``now_ms``.

    When neither is due, ``step`` decides nothing and only prunes the grace-period map, which
    the next due cycle prunes the same way; skipping it saves building the whole view (about
    100k frozen values) on every batch. Mirrors the interval rule of ``loadbalance.cycle``.
    """

    def due(last_ms: int | None, minutes: float) -> bool:
        return last_ms is None or now_ms - last_ms >= minutes * MINUTE_MS

    return due(state.last_split_ms, config.load_balancer_split_interval_minutes) or due(
        state.last_shedding_ms, config.load_balancer_shedding_interval_minutes
    )


def _lookahead(advance_ms: int) -> int:
    """How far ahead of a batch's clock to look for a due cycle: four times what the last batch
    advanced it, at least 3 s. The first warm-up in that window decodes every shard record (up
    to about a second of CPU at a million bundles, beside the next batch, so it must start a few
    batches early to be over when the cycle comes); the next ones redo only what changed, and
    the cycle itself only what its own batch changed."""
    return max(3000, 4 * max(0, advance_ms))


def _preallocations(placed: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, BundleData]]:
    """The pending record's preallocations as the view holds them; a refused record is logged
    and left out (``preallocations_from_documents``)."""
    out, refused = preallocations_from_documents(placed)
    for line in refused:
        log.warning("preallocation left out of the policy cycle: %s", line)
    return out


class _Phases:
    """Milliseconds since the previous mark, per named step of a batch."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}
        self._last = time.monotonic()

    def mark(self, name: str) -> None:
        now = time.monotonic()
        self.ms[name] = self.ms.get(name, 0.0) + (now - self._last) * 1000
        self._last = now


@dataclass
class DecisionStage:
    """The ``foreachBatch`` callable; lives on the driver only (never pickled to executors)."""

    config: LoadBalancerConfig
    bootstrap_servers: str
    redis_url: str | None = None
    client_config: Mapping[str, Any] | None = None
    seed: int = 0
    on_batch: Callable[[BatchStats], None] | None = None
    decider_id: str | None = None  # the decider lease's holder id (None: this process's)
    _decider: Decider | None = field(default=None, init=False)
    _progress_store: ProgressStore | None = field(default=None, init=False)
    _progress: Progress | None = field(default=None, init=False)
    _policies: PlacementPoliciesStore | None = field(default=None, init=False)
    _view: DriverView | None = field(default=None, init=False)
    _metrics: StreamMetrics | None = field(default=None, init=False)
    _sink: KafkaSink | None = field(default=None, init=False)

    def _start(self) -> None:
        """Connect and seed the view from Redis (at the first batch after start-up, and after
        a failed batch), then complete the cycle the progress read says is pending."""
        if self._progress_store is None:
            client = (
                connect(self.redis_url, self.config, purpose="stream") if self.redis_url else None
            )
            self._progress_store = (
                RedisProgress(client, self.config.redis_key_prefix)
                if client is not None
                else MemoryProgress()
            )
            # the operator's placement policies, read once per cycle (none without Redis)
            self._policies = (
                PlacementPoliciesStore(client, self.config.redis_key_prefix)
                if client is not None
                else None
            )
            self._progress = self._progress_store.read()
            brokers, bundles = self._progress_store.read_snapshot()
            self._view = DriverView.from_snapshot(
                brokers, bundles, weights_from_config(self.config)
            )
            self._metrics = StreamMetrics(make_shedder(self.config.shedding_strategy_name).name)
            self._safely(self._metrics.seed, brokers)
            log.info(
                "seeded from Redis: last batch %d, %d brokers, %d bundles",
                self._progress.batch,
                len(brokers),
                len(bundles),
            )
            if self._progress.cycle_pending:
                # The last committed batch's cycle never published (the process stopped, or the
                # cycle failed): run it now, over the view just read, which is the view
                # committed with that batch (nothing later is applied yet), so its ids are the
                # same.
                log.info("batch %d: completing its policy cycle", self._progress.batch)
                self._complete_cycle(self._progress, None)

    def __call__(self, df: Any, batch_id: int) -> None:
        try:
            self._run(df, batch_id)
        except BaseException:
            # Spark retries or fails the batch; either way re-seed from Redis, since this
            # process's view may hold half of a batch that was never committed, and replay it
            # with a new producer (streaming.sinks).
            self._progress_store = None
            self._drop_sink()
            raise

    def _producer(self) -> KafkaSink:
        """The stage's producer, kept across batches: a new one per batch paid its
        connection and idempotent producer id before the first decision left."""
        if self._sink is None:
            self._sink = KafkaSink(self.bootstrap_servers, self.client_config)
        return self._sink

    def _drop_sink(self) -> None:
        if self._sink is not None:
            sink, self._sink = self._sink, None
            sink.discard()

    def close(self) -> None:
        """At a clean stop: deliver what the producer holds (nothing, after a completed
        batch) and let it go."""
        if self._sink is not None:
            sink, self._sink = self._sink, None
            sink.flush(5.0)

    def _run(self, df: Any, batch_id: int) -> None:
        started = time.monotonic()
        # Always run the batch to the end, even one we skip: Spark commits the state step's
        # stores only when every partition of it was read (it fails the query otherwise).
        pdf = df.toPandas()
        collect_ms = (time.monotonic() - started) * 1000
        if not self._lead(batch_id, len(pdf)):
            return
        self._start()
        assert self._decider is not None
        if not self._decider.deciding:  # the lease went while completing a pending cycle
            self._follow(batch_id, len(pdf))
            return
        assert self._progress_store is not None and self._progress is not None
        assert self._view is not None
        if self._skip_completed(batch_id, len(pdf)):
            return
        progress = self._progress
        # The stage's producer, on the driver (never shipped to an executor); a failed batch
        # drops it (``__call__``) and its replay starts a new one.
        phases = _Phases()
        sink = self._producer()
        dead = pdf[pdf["kind"] == DEAD]
        for payload in dead["payload"].tolist():
            sink.send(self.config.dead_letters_topic, None, bytes(payload))
        max_event_ms = int(pdf["event_ms"].max()) if len(pdf) else 0
        now_ms = max(progress.now_ms, max_event_ms)
        phases.mark("dead_letters")
        self._view.apply(pdf)
        phases.mark("view_apply")
        due = bool(len(pdf)) and policies_due(progress.cycle_state, self.config, now_ms)
        if due and self._progress_store.pending(batch_id) is None:
            # recorded before the commit: the cycle (and any replay of it) reads these
            store = self._progress_store
            live = store.read_live_brokers()
            placed = store.read_preallocated(live)
            store.set_pending(batch_id, store.read_namespaces(), live, placed)
        sink.flush()
        phases.mark("pending_and_flush")
        new = Progress(batch_id, now_ms, progress.cycle_state, cycle_pending=due)
        self._progress_store.commit(new, *self._view.take_changes())
        self._progress = new
        phases.mark("redis_commit")
        # Counted once the batch is committed: a batch that fails before is replayed, and its
        # decisions would be counted twice.
        assert self._metrics is not None
        self._safely(self._metrics.brokers, pdf)
        phases.mark("metrics")
        stats = BatchStats(
            batch_id,
            len(pdf),
            len(dead),
            0,
            0.0,
            now_ms,
            max_event_ms,
            collect_ms=collect_ms,
            phases=phases.ms,
        )
        self._cycle_or_warm(progress, new, stats, started, due)

    def release_decider(self) -> bool:
        """Give the decider lease up at a clean stop, so the next job (a restart of this one)
        decides at once instead of waiting out the lease's TTL; False when none was held."""
        return self._decider.release() if self._decider is not None else False

    def _lead(self, batch_id: int, rows: int) -> bool:
        """Hold the decider lease for this batch (``streaming.decider``); False when another
        job holds it: this batch then writes and publishes nothing. A lease just taken seeds the
        view from Redis again first (another decider may have committed batches since)."""
        if self._decider is None:
            self._decider = Decider(self.config, self.redis_url, self.decider_id)
        decide, taken = self._decider.hold(batch_id)
        if taken:
            self._progress_store = None
        if not decide:
            self._follow(batch_id, rows)
        return decide

    def _follow(self, batch_id: int, rows: int) -> None:
        """Report a batch this job did not decide (another job holds the decider lease)."""
        self._progress_store = None  # seeded again from the holder's Redis when this job leads
        self._report(BatchStats(batch_id, rows, 0, 0, 0.0, 0, 0, skipped=True))

    def _skip_completed(self, batch_id: int, rows: int) -> bool:
        """Whether ``batch_id`` was already completed (a replay after a restart), and is
        skipped (its pending cycle, if any, was completed when the stage seeded)."""
        assert self._progress is not None
        progress = self._progress
        if batch_id <= progress.batch:
            log.info("batch %d already completed (last %d): skipped", batch_id, progress.batch)
            self._report(BatchStats(batch_id, rows, 0, 0, 0.0, progress.now_ms, 0, skipped=True))
            return True
        return False

    def _cycle_or_warm(
        self, progress: Progress, new: Progress, stats: BatchStats, started: float, due: bool
    ) -> None:
        """After the commit: run the due policy cycle, else warm the view when a cycle is near,
        and finish the batch's report."""
        assert self._view is not None
        now_ms = new.now_ms
        if due:
            self._complete_cycle(new, (stats, started))
            return
        if policies_due(progress.cycle_state, self.config, now_ms + _lookahead(
            now_ms - progress.now_ms
        )):  # fmt: skip
            # a cycle is due within a few batches: decode the shard records now, beside the next
            # batch's Spark work, so the cycle decodes only what changes
            self._view.warm()
        self._finished(stats, started)

    def _complete_cycle(self, progress: Progress, batch: tuple[BatchStats, float] | None) -> None:
        """Run the policy cycle that ``progress``'s batch made due, over the view committed with
        that batch; publish its decisions; commit its ``CycleState`` (``cycle_pending`` off).

        ``cycle = str(batch id)`` and ``now_ms`` = that batch's clock: a replay of the cycle
        (after a crash before ``commit_cycle``) computes the same decisions with the same ids
        (see the module docstring). ``batch``: the batch's stats and start time, to report the
        batch once its decisions are out (None when completing one after a restart)."""
        assert self._progress_store is not None and self._view is not None
        namespaces, live, placed = self._cycle_inputs(progress.batch)
        phases = _Phases()
        self._view.wait_warm()  # a warm-up still decoding: the cycle's view needs it done
        phases.mark("cycle_warm_wait")
        with self._view.gc_paused():
            view = self._view.cluster_view(namespaces, live)
            if self._policies is not None:
                # isolation, anti-affinity and failure domains for this cycle's transfers
                view = replace(view, policies=self._policies.read())
            if placed:
                view = with_preallocated(view, _preallocations(placed))
            phases.mark("cycle_view")
            cycle_state, result = step(
                progress.cycle_state,
                view,
                self.config,
                now_ms=progress.now_ms,
                cycle=str(progress.batch),
                seed=self.seed,
            )
            phases.mark("cycle_step")
        if not self._publish(progress.batch, result.decisions):
            if batch is not None:
                self._finished(*batch)
            return
        phases.mark("cycle_publish")
        done = Progress(progress.batch, progress.now_ms, cycle_state)
        self._progress_store.commit_cycle(done)
        self._progress = done
        phases.mark("cycle_commit")
        assert self._metrics is not None
        self._safely(self._metrics.decisions, result.decisions, result)
        phases.mark("cycle_metrics")
        if batch is not None:
            stats, started = batch
            stats = replace(
                stats,
                phases={**stats.phases, **phases.ms},
                decisions=len(result.decisions),
                decision_ids=tuple(d.id for d in result.decisions),
            )
            self._finished(stats, started)

    def _cycle_inputs(
        self, batch_id: int
    ) -> tuple[dict[str, NamespaceBundles], list[str] | None, Mapping[str, Mapping[str, Any]]]:
        """What the batch recorded for its cycle before its commit (``P:stream:pending``): the
        namespaces; the registry's live brokers (None: an empty registry, agents running
        without Redis, leaves every reporting broker in); and the lookups' placements their
        owners had not reported yet, the cycle's preallocations. Without Redis
        (``MemoryProgress`` keeps no record): the namespaces now, no filter, no preallocations."""
        assert self._progress_store is not None
        pending = self._progress_store.pending(batch_id)
        if pending is None:
            return self._progress_store.read_namespaces(), None, {}
        return pending.namespaces, pending.brokers or None, pending.preallocated

    def _publish(self, batch_id: int, decisions: Iterable[Decision]) -> bool:
        """Publish a cycle's decisions stamped with the decider term, once the lease is renewed
        right before (``streaming.decider``). False when another job holds it now: nothing is
        published and the cycle stays pending in Redis, for the holder to complete under its
        own term (this job seeds again when it leads)."""
        if self._decider is None:
            self._decider = Decider(self.config, self.redis_url, self.decider_id)
        if not self._decider.confirm(batch_id):
            self._progress_store = None
            return False
        sink = self._producer()
        for d in decisions:
            sink.send(self.config.decisions_topic, d.bundle, self._decider.encode(d))
        sink.flush()
        return True

    def _finished(self, stats: BatchStats, started: float) -> None:
        """Log and report a batch whose work (its cycle's included) is done."""
        assert self._view is not None
        stats = replace(stats, duration_ms=(time.monotonic() - started) * 1000)
        log.info(
            "batch %d: %d rows, %d dead letters, %d decisions, %.0f ms",
            stats.batch_id,
            stats.input_rows,
            stats.dead_letters,
            stats.decisions,
            stats.duration_ms,
        )
        self._safely(StreamMetrics.batch, stats, len(self._view.broker_names), len(self._view))
        self._report(stats)

    @staticmethod
    def _safely(fn: Callable[..., None], *args: Any) -> None:
        """Run a metrics update; a metrics bug must never fail (and so replay) a batch."""
        try:
            fn(*args)
        except Exception:
            log.warning("metrics update %s failed", getattr(fn, "__name__", fn), exc_info=True)

    def _report(self, stats: BatchStats) -> None:
        if self.on_batch is not None:
            self.on_batch(stats)
