"""``lbctl control``: consume the decisions topic and apply each decision to Redis.

At-least-once consumption made exactly-once in effect: the consumer group commits a record's
offset only after the decision's outcome is recorded in Redis, and the applier de-duplicates by
decision id, so a crash between the two replays the record harmlessly. A record that cannot be
decoded gets a ``rejected`` outcome keyed by its coordinates (topic/partition/offset), never a
crash. Every applied ownership change is published to the ownership-events topic as an
``OwnershipEvent`` keyed by bundle, with the old and new owner and their fencing tokens (as
Pulsar's service-unit state channel lets other systems follow ownership), and so is every lease
the periodic sweep finds expired and every bundle it places again. A record's offset is
committed only after its events are flushed to Kafka.

A process killed between the Redis change and the flush does not lose the events: the leases
read before applying are saved in a Redis outbox first, and the replayed record (found
``already_satisfied`` or ``duplicate``) publishes them from there. Sweep events have no outbox:
a sweep killed before its flush loses its ``expired``/``assigned`` events (Redis stays right).

A Redis that lost its data (restarted without persistence) is rebuilt by the loop itself when
given an ``AutoRecovery`` (``controller.recovery``; ``lbctl control`` does, unless
``--no-auto-recover``): it is checked at start, on every sweep and, with one GET of the epoch key,
before every decision. From the detection until the recovery the loop neither applies decisions
(each is held un-committed: seek back and wait, as for a Redis outage) nor sweeps, since either
would hand out tokens below the floor or place bundles on a half-rebuilt ring. After it, the
loop logs a one-line summary, publishes an ``assigned`` event per re-granted lease and resumes.

Consumer settings follow DESIGN.md §6: ``session.timeout.ms=6000`` and
``max.poll.interval.ms=10000`` keep a group join on the embedded broker to a few seconds.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import redis
from confluent_kafka import Consumer, KafkaError, TopicPartition

from controller.apply import (
    ALREADY_SATISFIED,
    APPLIED,
    DUPLICATE,
    REJECTED,
    Outcome,
    apply_decision,
    outcome_of,
)
from controller.events import (
    ASSIGNED,
    MERGED,
    RELEASED,
    TRANSFERRED,
    EventPublisher,
    OwnershipEvent,
)
from controller.events import (
    SPLIT as SPLIT_EVENT,
)
from controller.placement import sweep_and_reassign
from controller.recovery import AutoRecovery, recovery_events, summary
from infra import metrics
from loadbalance.bundles import format_range, parse_bundle
from loadbalance.config import LoadBalancerConfig
from loadbalance.decisions import MERGE, SPLIT, TRANSFER, UNLOAD, Decision, decode_decision
from loadbalance.errors import InvalidDecision, Transient
from metadata_store.leases import Lease
from metadata_store.ownership_redis import RedisStore
from metadata_store.protocol import OwnershipStore

REDIS_UNAVAILABLE = (redis.ConnectionError, redis.TimeoutError)
"""Errors that mean Redis is away for now (a restart, a failover): wait and retry, not exit."""
REDIS_BACKOFF_FIRST_S = 0.2
REDIS_BACKOFF_MAX_S = 5.0
RECOVERY_HOLD_S = 0.5
"""How long a decision held during a pending recovery waits before it is read again."""

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


def _bundles_of(d: Decision) -> list[str]:
    return [d.bundle, d.merge_bundle] if d.kind == MERGE and d.merge_bundle else [d.bundle]


def decision_events(
    store: OwnershipStore, d: Decision, before: dict[str, Lease | None], now_ms: int
) -> list[OwnershipEvent]:
    """The ownership events of an *applied* decision.

    ``before`` holds the leases read just before applying; the new lease of a transfer is read
    after. A transfer of a free bundle is an ``assigned`` event; a merge gives one ``merged``
    event per bundle that ended (each keyed by its own bundle, so a compacted topic forgets
    both), with the merged bundle as the only child.
    """

    def ev(kind: str, bundle: str, **kw: Any) -> OwnershipEvent:
        old = before.get(bundle)
        return OwnershipEvent(
            kind,
            bundle,
            now_ms,
            old_owner=old.broker if old else None,
            old_token=old.token if old else None,
            decision_id=d.id,
            reason=d.reason,
            **kw,
        )

    if d.kind == UNLOAD:
        return [ev(RELEASED, d.bundle)]
    if d.kind == TRANSFER:
        new = store.owner(d.bundle, now_ms)
        kind = TRANSFERRED if before.get(d.bundle) else ASSIGNED
        return [
            ev(kind, d.bundle, new_owner=new.broker if new else d.destination_broker,
               new_token=new.token if new else None)
        ]  # fmt: skip
    if d.kind == SPLIT:
        r = parse_bundle(d.bundle)
        points = [r.lower, *sorted(set(d.split_boundaries)), r.upper]
        children = tuple(f"{r.namespace}/{format_range(a, b)}" for a, b in pairwise(points))
        return [ev(SPLIT_EVENT, d.bundle, children=children)]
    if d.kind == MERGE:
        a, b = parse_bundle(d.bundle), parse_bundle(d.merge_bundle or "")
        merged = f"{a.namespace}/{format_range(min(a.lower, b.lower), max(a.upper, b.upper))}"
        return [ev(MERGED, x, children=(merged,)) for x in _bundles_of(d)]
    return []


def _effect_holds(store: RedisStore, outcome: Outcome) -> bool:
    """Whether the decision's change is in Redis: applied now, found made, or a duplicate of
    one that was applied or found made."""
    if outcome.outcome in (APPLIED, ALREADY_SATISFIED):
        return True
    if outcome.outcome == DUPLICATE:
        first = outcome_of(store, outcome.decision_id)
        return first is not None and first.outcome in (APPLIED, ALREADY_SATISFIED)
    return False


def apply_with_events(
    store: RedisStore,
    d: Decision,
    *,
    now_ms: int,
    lease_ttl_ms: int,
    dry_run: bool = False,
    outbox: bool = False,
) -> tuple[Outcome, list[OwnershipEvent]]:
    """``apply_decision``, plus the events to publish when it was applied (see above).

    With ``outbox``, the leases read before applying are first saved in Redis
    (``P:event-outbox``, by decision id) and stay there until ``clear_outbox`` after the events
    are delivered. Why: a process killed after the Redis change but before Kafka had the events
    replays the record and finds the change made (``already_satisfied``) or recorded
    (``duplicate``); the saved entry says this decision's events may be unannounced, and gives
    the old owners and tokens to announce them with.
    """
    if dry_run:
        return apply_decision(store, d, now_ms=now_ms, lease_ttl_ms=lease_ttl_ms, dry_run=True), []
    saved = store.outbox.get(d.id) if outbox else None
    if saved is not None:
        before = saved
    else:
        before = {b: store.owner(b, now_ms) for b in _bundles_of(d)}
        if outbox:
            store.outbox.put(d.id, before)
    outcome = apply_decision(store, d, now_ms=now_ms, lease_ttl_ms=lease_ttl_ms)
    if outcome.outcome == APPLIED or (saved is not None and _effect_holds(store, outcome)):
        return outcome, decision_events(store, d, before, now_ms)
    return outcome, []


def clear_outbox(store: RedisStore, decision_id: str) -> None:
    """Forget a decision's saved leases once its events are delivered (or it had none)."""
    store.outbox.clear(decision_id)


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
    if dry_run:
        recovery = None  # a dry run changes nothing, so it rebuilds nothing either
    consumer = Consumer(
        {
            **client_config,
            "group.id": group_id,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "max.poll.interval.ms": 10000,
        }
    )
    own_publisher = publisher is None
    if publisher is None:
        extra = {k: v for k, v in client_config.items() if k != "bootstrap.servers"}
        publisher = EventPublisher(client_config["bootstrap.servers"], events_topic, extra)
    consumer.subscribe([decisions_topic])
    stats = LoopStats()
    stopping = False

    def stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    def deliver(events: list[OwnershipEvent]) -> None:
        # Kafka refusing events stops progress (nothing is committed) rather than losing them.
        publisher.deliver(events, attempts=None, should_stop=lambda: stopping)
        for e in events:
            metrics.OWNERSHIP_EVENTS_PUBLISHED.labels(event=e.event).inc()
            log.info("%s %s %s -> %s", e.event, e.bundle, e.old_owner, e.new_owner)
        stats.events += len(events)

    def _handle(msg: Any, now: int) -> str:
        """Record one decision's outcome (and deliver its events); the outcome's name.

        Redis being unavailable raises out of here before the offset is committed.
        """
        try:
            d = decode_decision(msg.value() or b"", max_bytes=max_decision_bytes)
        except InvalidDecision as e:
            where = f"{msg.topic()}/{msg.partition()}/{msg.offset()}"
            store.outcomes.record_unreadable(where, REJECTED, str(e), now)
            log.warning("rejected record %s: %s", where, e)
            metrics.CONTROL_DECISIONS.labels(kind="invalid", outcome=REJECTED).inc()
            return REJECTED
        outcome, events = apply_with_events(
            store, d, now_ms=now, lease_ttl_ms=lease_ttl_ms, dry_run=dry_run, outbox=True
        )
        log.info("%s %s %s: %s %s", d.id[:12], d.kind, d.bundle, outcome.outcome, outcome.reason)
        metrics.CONTROL_DECISIONS.labels(kind=d.kind, outcome=outcome.outcome).inc()
        deliver(events)  # usually an applied decision's; or a replay's unannounced ones
        if not dry_run:
            clear_outbox(store, d.id)
        return outcome.outcome

    def check_recovery() -> None:
        """Detect or progress a data loss; after a recovery, report and announce it."""
        assert recovery is not None
        try:
            report = recovery.check(clock())
        except REDIS_UNAVAILABLE as e:  # the next check tries again
            log.warning("recovery check skipped: Redis unavailable (%s)", e)
            return
        except Transient as e:
            log.warning("recovery postponed, token floor unknown: %s", e)
            return
        if report is None:
            return
        stats.recoveries += 1
        metrics.CONTROL_RECOVERIES.inc()
        log.warning("%s", summary(report, store.keys.recovery_last()))
        deliver(recovery_events(report))

    def hold(msg: Any, delay: float) -> None:
        """Read ``msg`` again after ``delay`` s: nothing is committed meanwhile."""
        consumer.seek(TopicPartition(msg.topic(), msg.partition(), msg.offset()))
        deadline = time.monotonic() + delay
        while not stopping and time.monotonic() < deadline:
            time.sleep(0.05)

    redis_failures = 0
    previous = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, stop)
    except ValueError:  # not the main thread: the caller stops us by max_messages/idle
        previous = {}
    last_message = last_sweep = last_check = time.monotonic()
    try:
        if recovery is not None:
            check_recovery()  # at start: a loss while no controller ran
        while not stopping and (max_messages is None or stats.consumed < max_messages):
            if recovery is not None and (
                recovery.pending or time.monotonic() - last_check >= sweep_interval_s
            ):
                last_check = time.monotonic()
                check_recovery()
            if (
                config is not None
                and time.monotonic() - last_sweep >= sweep_interval_s
                and not (recovery is not None and recovery.pending)
            ):
                last_sweep = time.monotonic()
                try:
                    events = sweep_and_reassign(store, config, clock())
                except REDIS_UNAVAILABLE as e:  # the next sweep tries again
                    log.warning("sweep skipped: Redis unavailable (%s)", e)
                    events = []
                else:
                    expired = sum(1 for e in events if e.event == "expired")
                    stats.sweeps += 1
                    stats.expired += expired
                    metrics.CONTROL_SWEEPS.inc()
                    metrics.CONTROL_LEASES_EXPIRED.inc(expired)
                deliver(events)
            msg = consumer.poll(0.5)
            if msg is None:
                if idle_timeout_s is not None and time.monotonic() - last_message > idle_timeout_s:
                    break
                continue
            if msg.error():
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    log.warning("consumer error: %s", msg.error())
                continue
            last_message = time.monotonic()
            if recovery is not None:
                try:
                    if not recovery.pending and recovery.suspect():
                        check_recovery()  # a loss since the last check: before this decision
                except REDIS_UNAVAILABLE:
                    pass  # _handle meets the outage below and backs off
                if recovery.pending:
                    log.debug("recovery pending: record %s/%s held", msg.partition(), msg.offset())
                    hold(msg, RECOVERY_HOLD_S)
                    continue
            started = time.perf_counter()
            now = clock()
            try:
                outcome_name = _handle(msg, now)
            except REDIS_UNAVAILABLE as e:
                # Nothing is committed: read the same record again after a bounded backoff.
                # The wait stays under max.poll.interval.ms, so the group keeps this consumer.
                delay = min(REDIS_BACKOFF_MAX_S, REDIS_BACKOFF_FIRST_S * 2**redis_failures)
                redis_failures += 1
                where = f"{msg.topic()}/{msg.partition()}/{msg.offset()}"
                log.warning("Redis unavailable (%s): record %s again in %.1f s", e, where, delay)
                hold(msg, delay)
                continue
            redis_failures = 0
            stats.consumed += 1
            if outcome_name == APPLIED:
                stats.applied += 1
            elif outcome_name == REJECTED:
                stats.rejected += 1
            else:
                stats.other += 1
            consumer.commit(message=msg, asynchronous=False)
            metrics.CONTROL_CYCLE_DURATION.observe(time.perf_counter() - started)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        consumer.close()
        if own_publisher:
            publisher.close()
    return stats


__all__ = ["LoopStats", "apply_with_events", "clear_outbox", "decision_events", "run_loop"]
