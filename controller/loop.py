"""``lbctl control``: consume the decisions topic and hand each decision to the reconciler.

This module is the runner: it owns the Kafka consumer and the event publisher, the stop
signals, the timing of the periodic work, the back-off while Redis is away, offset commits and
the metrics. What a decision does to Redis, and which ownership events that gives, is the
``controller.reconciler``'s.

At-least-once consumption made exactly-once in effect: the consumer group commits a record's
offset only after the decision's outcome is recorded in Redis, and the applier de-duplicates by
decision id, so a crash between the two replays the record harmlessly. A record that cannot be
decoded gets a ``rejected`` outcome keyed by its coordinates (topic/partition/offset), never a
crash. Every applied ownership change is published to the ownership-events topic as an
``OwnershipEvent`` keyed by bundle, with the old and new owner and their fencing tokens (as
Pulsar's service-unit state channel lets other systems follow ownership), and so is every lease
the periodic sweep finds expired and every bundle it places again. A record's offset is
committed only after its events are flushed to Kafka; the reconciler's event outbox covers a
kill between the Redis change and the flush.

**Faults.** Every error met while applying a record, sweeping or checking for a loss is named
by one classification, ``controller.redis_faults.fault_kind``. A passing Redis fault (a dropped
connection, a timeout, a ``READONLY``, ``OOM``, ``BUSY``, ``MASTERDOWN`` or ``LOADING`` reply, ...)
is waited out: the record in hand is held un-committed (seek back, read it again after a
back-off of 0.2 s doubling to 5 s), a sweep is skipped (the next one tries again), with a
warning. Any other Redis reply and any unexpected exception is handled the same way but logged
as an error (the traceback once per record): the loop holds what it cannot apply rather than
exit, since a restarted controller would read the same record again while nobody swept
expired leases (``controller.redis_faults`` argues the choice). Each is counted in
``lbctl_control_redis_faults_total{kind}``. Only ``Transient`` from the event publisher (it
was told to stop, or to give up) ends the loop.

A Redis that lost its data (restarted without persistence) is rebuilt by the loop itself when
given an ``AutoRecovery`` (``controller.recovery``; ``lbctl control`` does, unless
``--no-auto-recover``): it is checked at start, on every sweep and, with one GET of the epoch key,
before every decision. From the detection until the recovery the loop neither applies decisions
(each is held un-committed: seek back and wait, as for a Redis outage) nor sweeps, since either
would hand out tokens below the floor or place bundles on a half-rebuilt ring. After it, the
loop logs a one-line summary, publishes an ``assigned`` event per re-granted lease and resumes.

Consumer settings (docs/architecture.md, Constraints): ``session.timeout.ms=6000`` and
``max.poll.interval.ms=10000`` keep a group join on the embedded broker to a few seconds.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from controller.apply import APPLIED, REJECTED
from controller.events import EXPIRED, EventPublisher, OwnershipEvent
from controller.heartbeat import ControllerHeartbeat
from controller.kafka_watch import KafkaWatch, controller_client_id
from controller.reconciler import Reconciler
from controller.recovery import AutoRecovery
from controller.redis_faults import fault_kind, is_transient
from infra import metrics
from loadbalance.config import LoadBalancerConfig
from loadbalance.decisions import decode_decision
from loadbalance.errors import InvalidDecision, Transient
from metadata_store.ownership_redis import RedisStore

REDIS_BACKOFF_FIRST_S = 0.2
REDIS_BACKOFF_MAX_S = 5.0
RECOVERY_HOLD_S = 0.5
"""How long a decision held during a pending recovery waits before it is read again."""
POLL_TIMEOUT_S = 0.5

log = logging.getLogger("lbctl.control")


@dataclass
class LoopStats:
    """What one run of the loop did."""

    consumed: int = 0
    applied: int = 0
    rejected: int = 0
    other: int = 0
    events: int = 0
    sweeps: int = 0
    expired: int = 0
    recoveries: int = 0


REOPEN_AFTER_S = 30.0
"""A consumer that has not reached Kafka this long is replaced (``Runner._reopen_if_stuck``)."""


class _Idle(Exception):
    """No record for longer than the idle timeout: the loop ends."""


class Runner:
    """Polls the decisions topic and drives a ``Reconciler``: timing, back-off, commits,
    metrics. ``reconciler`` is set after construction, since its ``publish`` is ``deliver``."""

    reconciler: Reconciler
    heartbeat: ControllerHeartbeat | None = None  # the registry entry (monitor, health)

    def __init__(
        self,
        consumer: Any,
        publisher: EventPublisher,
        *,
        max_messages: int | None = None,
        idle_timeout_s: float | None = None,
        max_decision_bytes: int = 65536,
        sweep_interval_s: float = 5.0,
        clock: Callable[[], int],
    ) -> None:
        self.consumer = consumer
        self.publisher = publisher
        self.max_messages = max_messages
        self.idle_timeout_s = idle_timeout_s
        self.max_decision_bytes = max_decision_bytes
        self.sweep_interval_s = sweep_interval_s
        self.clock = clock
        self.stats = LoopStats()
        self.stopping = False
        self.redis_failures = 0
        self.last_message = self.last_sweep = self.last_check = time.monotonic()
        self.kafka_watch: KafkaWatch | None = None
        self.reopen: Callable[[], Any] | None = None  # a fresh, subscribed consumer
        self._reopened_at = float("-inf")
        self._traced: tuple[str, type] | None = None  # the unexpected error last traced

    def stop(self, *_: Any) -> None:
        """Signal handler: finish the record in hand, then end."""
        self.stopping = True

    def deliver(self, events: list[OwnershipEvent]) -> None:
        """The reconciler's ``publish``: Kafka refusing events stops progress (nothing is
        committed) rather than losing them."""
        self.publisher.deliver(events, attempts=None, should_stop=lambda: self.stopping)
        for e in events:
            metrics.OWNERSHIP_EVENTS_PUBLISHED.labels(event=e.event).inc()
            log.info("%s %s %s -> %s", e.event, e.bundle, e.old_owner, e.new_owner)
        expired = sum(1 for e in events if e.event == EXPIRED)
        self.stats.events += len(events)
        self.stats.expired += expired
        metrics.CONTROL_LEASES_EXPIRED.inc(expired)

    def run(self) -> LoopStats:
        """Consume until stopped, ``max_messages`` records, or ``idle_timeout_s`` without one."""
        if self.reconciler.recovery is not None:
            self._recover()  # at start: a loss while no controller ran
        while not self.stopping and (
            self.max_messages is None or self.stats.consumed < self.max_messages
        ):
            self._periodic()
            try:
                msg = self._poll()
            except _Idle:
                break
            if msg is not None and not self._held_for_recovery(msg):
                self._process(msg)
        if self.heartbeat is not None:
            self.heartbeat.stopped()
        return self.stats

    def _periodic(self) -> None:
        """The recovery check (at once while one is pending) and the sweep, each every
        ``sweep_interval_s``; no sweep while a recovery is pending. The Kafka watch says what
        the group and Kafka do (``controller.kafka_watch``)."""
        if self.kafka_watch is not None:
            self.kafka_watch.tick(self.consumer)
            self._reopen_if_stuck(self.kafka_watch.lost_for())
        rec = self.reconciler
        if rec.recovery is not None and (
            rec.recovery.pending or time.monotonic() - self.last_check >= self.sweep_interval_s
        ):
            self.last_check = time.monotonic()
            self._recover()
        if (
            rec.config is not None
            and time.monotonic() - self.last_sweep >= self.sweep_interval_s
            and not rec.holding
        ):
            self.last_sweep = time.monotonic()
            self._sweep()

    def _reopen_if_stuck(self, lost_s: float | None) -> None:
        """A consumer that has not reached Kafka for ``REOPEN_AFTER_S`` is replaced by a new
        one (at most once per ``REOPEN_AFTER_S``). Seen after a broker was frozen and resumed
        under load: the broker answered every new client, but this consumer's requests timed
        out for minutes. A new consumer rejoins the group and reads from the committed
        offsets, so nothing is skipped; the old one is closed in the background, since a
        close may wait for its dead requests."""
        now = time.monotonic()
        if (
            self.reopen is None
            or lost_s is None
            or lost_s < REOPEN_AFTER_S
            or now - self._reopened_at < REOPEN_AFTER_S
        ):
            return
        self._reopened_at = now
        log.warning("Kafka unreachable for %.0f s: opening a new consumer", lost_s)
        old, self.consumer = self.consumer, self.reopen()
        threading.Thread(target=old.close, name="close-stuck-consumer", daemon=True).start()

    def _fault(self, what: str, e: Exception) -> str:
        """Count and log an error the loop backs off from; its kind (module docstring)."""
        kind = fault_kind(e)
        metrics.CONTROL_REDIS_FAULTS.labels(kind=kind).inc()
        if is_transient(e):
            log.warning("%s: Redis cannot serve now (%s: %s)", what, kind, e)
        elif kind == "reply":
            log.error("%s: Redis refused (%s); held, fix the cause: %s", what, e, type(e).__name__)
        elif self._traced != (what, type(e)):
            self._traced = (what, type(e))
            log.exception("%s: unexpected error, held and retried", what)
        else:
            log.error("%s: unexpected error again: %r", what, e)
        return kind

    def _recover(self) -> None:
        """Detect or progress a data loss; count a recovery that happened."""
        try:
            report = self.reconciler.recover()
        except Transient as e:
            log.warning("recovery postponed, token floor unknown: %s", e)
            return
        except Exception as e:  # the next check tries again
            self._fault("recovery check skipped", e)
            return
        if report is not None:
            self.stats.recoveries += 1
            metrics.CONTROL_RECOVERIES.inc()

    def _sweep(self) -> None:
        """One sweep; a fault skips the rest of it (what it removed is announced already,
        what it did not place the next sweep places: ``controller.sweep``)."""
        try:
            self.reconciler.sweep()
        except Transient:
            raise  # the publisher gave up: ends the loop, as for a decision's events
        except Exception as e:  # the next sweep tries again
            self._fault("sweep skipped", e)
            return
        self.stats.sweeps += 1
        if self.heartbeat is not None:
            self.heartbeat.swept()
        metrics.CONTROL_SWEEPS.inc()

    def _poll(self) -> Any:
        """The next record, or None (nothing yet, or a consumer error); raises ``_Idle``."""
        msg = self.consumer.poll(POLL_TIMEOUT_S)
        if self.heartbeat is not None:
            failed = (
                msg is not None and msg.error() and msg.error().code() != KafkaError._PARTITION_EOF
            )
            self.heartbeat.polled(str(msg.error()) if failed else None)
        if msg is None:
            if (
                self.idle_timeout_s is not None
                and time.monotonic() - self.last_message > self.idle_timeout_s
            ):
                raise _Idle
            return None
        if msg.error():
            if msg.error().code() != KafkaError._PARTITION_EOF:
                log.warning("consumer error: %s", msg.error())
            return None
        self.last_message = time.monotonic()
        return msg

    def _held_for_recovery(self, msg: Any) -> bool:
        """Whether ``msg`` must wait for a recovery (checked first if a loss is suspected)."""
        rec = self.reconciler
        if rec.recovery is None:
            return False
        try:
            if rec.loss_suspected():
                self._recover()  # a loss since the last check: before this decision
        except Exception as e:  # _process meets the fault and backs off
            log.debug("loss check skipped: %s", e)
        if not rec.holding:
            return False
        log.debug("recovery pending: record %s/%s held", msg.partition(), msg.offset())
        self._hold(msg, RECOVERY_HOLD_S)
        return True

    def _process(self, msg: Any) -> None:
        """Reconcile one record; commit its offset, or read it again after a back-off."""
        started = time.perf_counter()
        try:
            outcome = self._handle(msg, self.clock())
        except Transient:
            raise  # the publisher gave up on Kafka: nothing committed, the loop ends
        except Exception as e:
            # Nothing is committed: read the same record again after a bounded backoff.
            # The wait stays under max.poll.interval.ms, so the group keeps this consumer.
            delay = min(REDIS_BACKOFF_MAX_S, REDIS_BACKOFF_FIRST_S * 2**self.redis_failures)
            self.redis_failures += 1
            self._fault(f"record {_where(msg)} held, read again in {delay:.1f} s", e)
            self._hold(msg, delay)
            return
        self.redis_failures = 0
        self._traced = None
        self._count(outcome)
        if self.heartbeat is not None:
            self.heartbeat.consumed()
        self._commit(msg)
        metrics.CONTROL_CYCLE_DURATION.observe(time.perf_counter() - started)

    def _commit(self, msg: Any) -> None:
        """Commit ``msg``'s offset. A commit the group refuses (this consumer was dropped while
        Kafka was away, a rebalance, the coordinator moving) is no reason to stop: the record
        is read again by whoever holds its partition next, and the reconciler finds its
        outcome recorded (idempotent), so nothing is lost and nothing is applied twice."""
        try:
            self.consumer.commit(message=msg, asynchronous=False)
        except KafkaException as e:
            log.warning("offset of %s not committed (%s): the record will be read again",
                        _where(msg), e.args[0] if e.args else e)  # fmt: skip

    def _handle(self, msg: Any, now: int) -> str:
        """Decode and reconcile one record; the outcome's name. A fault raises out of here
        before the offset is committed."""
        try:
            d = decode_decision(msg.value() or b"", max_bytes=self.max_decision_bytes)
        except InvalidDecision as e:
            self.reconciler.reject(_where(msg), str(e), now)
            metrics.CONTROL_DECISIONS.labels(kind="invalid", outcome=REJECTED).inc()
            return REJECTED
        outcome = self.reconciler.reconcile(d, now)
        metrics.CONTROL_DECISIONS.labels(kind=d.kind, outcome=outcome.outcome).inc()
        return outcome.outcome

    def _count(self, outcome: str) -> None:
        self.stats.consumed += 1
        if outcome == APPLIED:
            self.stats.applied += 1
        elif outcome == REJECTED:
            self.stats.rejected += 1
        else:
            self.stats.other += 1

    def _hold(self, msg: Any, delay: float) -> None:
        """Read ``msg`` again after ``delay`` s: nothing is committed meanwhile."""
        self.consumer.seek(TopicPartition(msg.topic(), msg.partition(), msg.offset()))
        deadline = time.monotonic() + delay
        while not self.stopping and time.monotonic() < deadline:
            time.sleep(0.05)


def _where(msg: Any) -> str:
    return f"{msg.topic()}/{msg.partition()}/{msg.offset()}"


def _consumer(client_config: dict[str, Any], group_id: str) -> Consumer:
    return Consumer(
        {
            **client_config,
            "group.id": group_id,
            "client.id": client_config.get("client.id") or controller_client_id(),
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "max.poll.interval.ms": 10000,
        }
    )


@contextlib.contextmanager
def _stop_on_signals(stop: Callable[..., None]) -> Iterator[None]:
    """SIGTERM and SIGINT call ``stop`` while inside; the previous handlers come back after.
    Outside the main thread nothing is installed: the caller stops the loop by
    ``max_messages`` or the idle timeout."""
    previous = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, stop)
    except ValueError:  # not the main thread
        previous = {}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_loop(
    store: RedisStore,
    *,
    client_config: dict[str, Any],
    decisions_topic: str,
    events_topic: str,
    group_id: str = "lb-controller",
    lease_ttl_ms: int = 30_000,
    max_messages: int | None = None,
    idle_timeout_s: float | None = None,
    dry_run: bool = False,
    max_decision_bytes: int = 65536,
    clock: Callable[[], int] = lambda: int(time.time() * 1000),
    config: LoadBalancerConfig | None = None,
    sweep_interval_s: float = 5.0,
    publisher: EventPublisher | None = None,
    recovery: AutoRecovery | None = None,
) -> LoopStats:
    """Consume until stopped, ``max_messages`` records, or ``idle_timeout_s`` without one.

    With ``config``, expired leases are swept (and their bundles placed again) every
    ``sweep_interval_s``. ``publisher`` defaults to one on ``events_topic`` over
    ``client_config``; the loop closes only a publisher it created. With ``recovery``, a store
    that lost its data is rebuilt (module docstring), checked every ``sweep_interval_s`` too.
    """
    watch = KafkaWatch(client_config, group_id, decisions_topic, every_s=sweep_interval_s)

    def open_consumer() -> Consumer:
        consumer = _consumer(client_config, group_id)
        consumer.subscribe([decisions_topic], on_assign=watch.on_assign, on_revoke=watch.on_revoke)
        return consumer

    consumer = open_consumer()
    own_publisher = publisher is None
    if publisher is None:
        extra = {k: v for k, v in client_config.items() if k != "bootstrap.servers"}
        publisher = EventPublisher(client_config["bootstrap.servers"], events_topic, extra)
    runner = Runner(
        consumer, publisher, max_messages=max_messages, idle_timeout_s=idle_timeout_s,
        max_decision_bytes=max_decision_bytes, sweep_interval_s=sweep_interval_s, clock=clock,
    )  # fmt: skip
    runner.kafka_watch = watch
    runner.reopen = open_consumer
    runner.heartbeat = ControllerHeartbeat(store.processes, group=group_id)
    runner.reconciler = Reconciler(
        store, publish=runner.deliver, clock=clock, lease_ttl_ms=lease_ttl_ms, dry_run=dry_run,
        config=config, recovery=recovery,
    )  # fmt: skip
    try:
        with _stop_on_signals(runner.stop):
            return runner.run()
    finally:
        runner.consumer.close()
        if own_publisher:
            publisher.close()


__all__ = ["LoopStats", "Runner", "run_loop"]
