"""Ownership events: every change of who serves a bundle, as JSON records on a Kafka topic.

Why a topic: Pulsar's extensible load manager keeps bundle ownership in a service-unit state
channel (a compacted topic) so that anything can follow it without polling the metadata store.
Redis is our source of truth; this topic is the follow-along feed. Records are keyed by bundle,
so one bundle's history stays in one partition and in order, and a compacted topic keeps the
latest state per bundle. Each record carries the old and new owner with their fencing tokens,
so a reader can drop a stale record (a smaller token than one it has already seen).

Event kinds: ``assigned`` (a free bundle got an owner), ``released`` (an unload ended a lease),
``transferred`` (a lease moved straight to another broker), ``split`` (the parent ended and its
``children`` exist, unowned), ``merged`` (two bundles became ``children[0]``), ``expired`` (a
lease ran out and the sweep removed it).

Who publishes what: the control loop (``controller.loop``) for applied decisions and for its
sweep of expired leases (``expired`` then ``assigned``); lookups that assign a free bundle
(``controller.placement.lookup_and_assign`` with a publisher, ``lbctl lookup``); and the admin
verbs ``lbctl unload`` / ``split-bundle``, when Kafka is configured.

Publishing is at least once: ``EventPublisher.deliver`` re-publishes after a failed flush, the
controller commits a decision's offset only after its events are delivered, and a Redis outbox
lets a replay announce a change a killed process made. A consumer de-duplicates by
``(bundle, newToken)`` (or ``(bundle, event, oldToken)`` for events without a new owner) or by
``decisionId``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Producer

from infra.topics import kafka_client_config
from loadbalance.bundles import parse_bundle
from loadbalance.errors import InvalidInput, Transient

log = logging.getLogger("lbctl.events")

EVENT_SCHEMA_VERSION = 1

ASSIGNED = "assigned"
RELEASED = "released"
TRANSFERRED = "transferred"
SPLIT = "split"
MERGED = "merged"
EXPIRED = "expired"
EVENT_KINDS = (ASSIGNED, RELEASED, TRANSFERRED, SPLIT, MERGED, EXPIRED)


@dataclass(frozen=True, slots=True)
class OwnershipEvent:
    """One ownership change of one bundle (tokens are ``None`` where no lease exists)."""

    event: str
    bundle: str
    at_ms: int
    old_owner: str | None = None
    new_owner: str | None = None
    old_token: int | None = None
    new_token: int | None = None
    decision_id: str | None = None
    children: tuple[str, ...] = field(default=())
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "schemaVersion": EVENT_SCHEMA_VERSION,
            "event": self.event,
            "bundle": self.bundle,
            "oldOwner": self.old_owner,
            "newOwner": self.new_owner,
            "oldToken": self.old_token,
            "newToken": self.new_token,
            "decisionId": self.decision_id,
            "children": list(self.children),
            "reason": self.reason,
            "atMs": self.at_ms,
        }


def encode_event(e: OwnershipEvent) -> bytes:
    """Compact, key-sorted JSON, so the same event always gives the same bytes."""
    return json.dumps(e.to_dict(), separators=(",", ":"), sort_keys=True).encode()


# Tokens come from Redis ``INCR`` and are read by JSON consumers: above 2**53 - 1 a JavaScript
# reader rounds them, and a value past 2**63 - 1 overflows the counter itself.
MAX_TOKEN = 2**53 - 1
MAX_EVENT_BYTES = 1024 * 1024
_MAX_TEXT_CHARS = 1024


class InvalidEvent(InvalidInput):
    """An ownership-events record that is not a valid event; ``reason`` says why."""


def _text(doc: Mapping[str, Any], key: str, *, required: bool = False) -> str | None:
    value = doc.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise InvalidEvent(key, f"expected a string, got {type(value).__name__}")
    if len(value) > _MAX_TEXT_CHARS:
        raise InvalidEvent(key, f"longer than {_MAX_TEXT_CHARS} characters")
    return value


def _bundle(value: Any, key: str) -> str:
    try:
        return parse_bundle(value).name
    except InvalidInput as e:
        raise InvalidEvent(key, e.reason) from None


def _token(doc: Mapping[str, Any], key: str) -> int | None:
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidEvent(key, f"expected an integer token, got {type(value).__name__}")
    if not 1 <= value <= MAX_TOKEN:
        raise InvalidEvent(key, f"token out of range 1..2**53-1 ({len(str(value))} digits)")
    return value


def decode_event(raw: bytes | str, *, max_bytes: int = MAX_EVENT_BYTES) -> OwnershipEvent:
    """The inverse of ``encode_event``; raises ``InvalidEvent`` (and nothing else) for a record
    that is not a valid event.

    Why so strict: recovery trusts the tokens on this topic as the fence floor, and anything
    with write access can put a record there. So the record must be UTF-8 JSON of bounded size
    and nesting, an object with the known keys of the right types, tokens in 1..2**53-1, a
    known event kind, and bundle names that parse; bundle names come back canonical
    (``parse_bundle(name).name``: lower-case hex), so a spelling never makes a second bundle.
    """
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    if len(raw) > max_bytes:
        raise InvalidEvent("record", f"{len(raw)} bytes exceeds {max_bytes}")
    try:
        text = raw.decode("utf-8")
        doc = json.loads(text)
    except UnicodeDecodeError as e:
        raise InvalidEvent("record", f"not UTF-8 at byte {e.start}") from None
    except RecursionError:
        raise InvalidEvent("record", "JSON nested too deeply") from None
    except ValueError as e:
        raise InvalidEvent("record", f"not JSON: {str(e)[:120]}") from None
    if not isinstance(doc, dict):
        raise InvalidEvent("record", f"expected a JSON object, got {type(doc).__name__}")
    version = doc.get("schemaVersion", EVENT_SCHEMA_VERSION)
    if version != EVENT_SCHEMA_VERSION or isinstance(version, bool):
        raise InvalidEvent("schemaVersion", f"unsupported version {str(version)[:20]}")
    kind = doc.get("event")
    if kind not in EVENT_KINDS:
        raise InvalidEvent("event", f"unknown event kind {str(kind)[:40]!r}")
    if "bundle" not in doc:
        raise InvalidEvent("bundle", "missing")
    at_ms = doc.get("atMs")
    if not isinstance(at_ms, int) or isinstance(at_ms, bool) or not 0 <= at_ms <= MAX_TOKEN:
        raise InvalidEvent("atMs", "expected a non-negative integer of milliseconds")
    children = doc.get("children") or []
    if not isinstance(children, list) or len(children) > 64:
        raise InvalidEvent("children", "expected a list of at most 64 bundle names")
    reason = doc.get("reason", "")
    if not isinstance(reason, str):
        raise InvalidEvent("reason", f"expected a string, got {type(reason).__name__}")
    return OwnershipEvent(
        event=kind,
        bundle=_bundle(doc["bundle"], "bundle"),
        at_ms=at_ms,
        old_owner=_text(doc, "oldOwner"),
        new_owner=_text(doc, "newOwner"),
        old_token=_token(doc, "oldToken"),
        new_token=_token(doc, "newToken"),
        decision_id=_text(doc, "decisionId"),
        children=tuple(_bundle(c, "children") for c in children),
        reason=reason[:_MAX_TEXT_CHARS],
    )


class EventPublisher:
    """A confluent-kafka producer for the ownership-events topic.

    ``client_config`` passes SASL/SSL (or any librdkafka) settings through unchanged. Delivery
    failures are collected by the delivery callback and raised from ``flush`` as ``Transient``,
    so the caller retries before it commits the decision's offset.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        client_config: Mapping[str, Any] | None = None,
    ) -> None:

        self.topic = topic
        conf = kafka_client_config(bootstrap_servers, client_config)
        conf.setdefault("acks", "all")  # every in-sync replica has an event before it is sent
        conf.setdefault("enable.idempotence", True)  # and a retry never writes it twice
        self._producer = Producer(conf)
        self._failed: list[str] = []

    def _on_delivery(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self._failed.append(str(err))

    def publish(self, events: Iterable[OwnershipEvent]) -> int:
        """Queue events (keyed by bundle); returns how many. Call ``flush`` to deliver."""
        n = 0
        for e in events:
            self._produce(e)
            n += 1
        return n

    def _produce(self, e: OwnershipEvent) -> None:
        while True:
            try:
                self._producer.produce(
                    self.topic,
                    key=e.bundle.encode(),
                    value=encode_event(e),
                    on_delivery=self._on_delivery,
                )
                return
            except BufferError:  # local queue full: let deliveries drain, then retry
                self._producer.poll(0.5)

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait for every queued event; raise ``Transient`` if any was not delivered."""
        remaining = self._producer.flush(timeout_s)
        failed, self._failed = self._failed, []
        if remaining or failed:
            detail = failed[0] if failed else f"{remaining} events still queued"
            raise Transient(f"ownership events not delivered to {self.topic}: {detail}")

    def deliver(
        self,
        events: Sequence[OwnershipEvent],
        *,
        attempts: int | None = 5,
        backoff_s: float = 1.0,
        flush_timeout_s: float = 10.0,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> int:
        """Publish ``events`` and wait until Kafka has every one; return how many.

        A failed flush re-publishes all of them after ``backoff_s`` (doubling up to 30 s):
        duplicates are harmless to readers that de-duplicate as the module docstring says, a
        lost event is not. Gives up with ``Transient`` after ``attempts`` tries (``None``: until
        ``should_stop()`` says so), so the caller does not commit what it could not announce.
        """
        if not events:
            return 0
        tries = 0
        delay = backoff_s
        while True:
            tries += 1
            self.publish(events)
            try:
                self.flush(flush_timeout_s)
                return len(events)
            except Transient as e:
                if (attempts is not None and tries >= attempts) or should_stop():
                    raise
                log.warning("retrying %d ownership events in %.1f s: %s", len(events), delay, e)
                time.sleep(delay)
                delay = min(delay * 2, 30.0)

    def close(self, timeout_s: float = 10.0) -> None:
        """Best-effort final flush at shutdown: a failure here is swallowed, not raised."""
        with contextlib.suppress(Transient):
            self.flush(timeout_s)


__all__ = [
    "ASSIGNED",
    "EVENT_KINDS",
    "EXPIRED",
    "MAX_TOKEN",
    "MERGED",
    "RELEASED",
    "SPLIT",
    "TRANSFERRED",
    "EventPublisher",
    "InvalidEvent",
    "OwnershipEvent",
    "decode_event",
    "encode_event",
]
