"""``lbctl control``: consume the decisions topic and apply each decision to Redis.

At-least-once consumption made exactly-once in effect: the consumer group commits a record's
offset only after the decision's outcome is recorded in Redis, and the applier de-duplicates by
decision id, so a crash between the two replays the record harmlessly. A record that cannot be
decoded gets a ``rejected`` outcome keyed by its coordinates (topic/partition/offset), never a
crash. Every applied ownership change is published to the ownership-events topic, keyed by
bundle (as Pulsar's service-unit state channel lets other systems follow ownership).

Consumer settings follow DESIGN.md §6: ``session.timeout.ms=6000`` and
``max.poll.interval.ms=10000`` keep a group join on the embedded broker to a few seconds.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer

from controller.apply import APPLIED, REJECTED, Outcome, apply_decision
from controller.placement import sweep_and_reassign
from controller.redis_store import RedisStore
from loadbalance.config import LoadBalancerConfig
from loadbalance.decisions import MERGE, SPLIT, TRANSFER, UNLOAD, Decision, decode_decision
from loadbalance.errors import InvalidDecision

log = logging.getLogger("lbctl.control")

EVENT_NAMES = {UNLOAD: "released", TRANSFER: "transferred", SPLIT: "split", MERGE: "merged"}


@dataclass
class LoopStats:
    """What one run of the loop did."""

    consumed: int = 0
    applied: int = 0
    rejected: int = 0
    other: int = 0


def ownership_event(d: Decision, outcome: Outcome, now_ms: int) -> dict[str, Any]:
    return {
        "event": EVENT_NAMES.get(d.kind, d.kind),
        "bundle": d.bundle,
        "sourceBroker": d.source_broker,
        "destinationBroker": d.destination_broker,
        "splitBoundaries": [f"0x{b:08x}" for b in d.split_boundaries],
        "mergeBundle": d.merge_bundle,
        "decisionId": d.id,
        "outcome": outcome.outcome,
        "atMs": now_ms,
    }


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
) -> LoopStats:
    """Consume until stopped, ``max_messages`` records, or ``idle_timeout_s`` without one."""
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
    producer = Producer(dict(client_config))
    consumer.subscribe([decisions_topic])
    stats = LoopStats()
    stopping = False

    def stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    previous = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, stop)
    except ValueError:  # not the main thread: the caller stops us by max_messages/idle
        previous = {}
    last_message = last_sweep = time.monotonic()
    try:
        while not stopping and (max_messages is None or stats.consumed < max_messages):
            if config is not None and time.monotonic() - last_sweep >= sweep_interval_s:
                last_sweep = time.monotonic()
                for event in sweep_and_reassign(store, config, clock()):
                    value = json.dumps(event, sort_keys=True).encode()
                    producer.produce(events_topic, key=event["bundle"].encode(), value=value)
                    log.info("%s %s", event["event"], event["bundle"])
                producer.flush(10)
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
            stats.consumed += 1
            now = clock()
            try:
                d = decode_decision(msg.value() or b"", max_bytes=max_decision_bytes)
            except InvalidDecision as e:
                where = f"{msg.topic()}/{msg.partition()}/{msg.offset()}"
                store.r.hset(
                    f"{store.p}:outcomes",
                    f"record:{where}",
                    json.dumps({"outcome": REJECTED, "reason": str(e), "atMs": now}),
                )
                log.warning("rejected record %s: %s", where, e)
                stats.rejected += 1
                consumer.commit(message=msg, asynchronous=False)
                continue
            outcome = apply_decision(
                store, d, now_ms=now, lease_ttl_ms=lease_ttl_ms, dry_run=dry_run
            )
            log.info(
                "%s %s %s: %s %s", d.id[:12], d.kind, d.bundle, outcome.outcome, outcome.reason
            )
            if outcome.outcome == APPLIED:
                stats.applied += 1
                event = json.dumps(ownership_event(d, outcome, now), sort_keys=True)
                producer.produce(events_topic, key=d.bundle.encode(), value=event.encode())
                producer.flush(10)
            elif outcome.outcome == REJECTED:
                stats.rejected += 1
            else:
                stats.other += 1
            consumer.commit(message=msg, asynchronous=False)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        consumer.close()
        producer.flush(10)
    return stats
