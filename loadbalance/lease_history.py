"""What an ownership store told its clients, recorded as plain values for an independent check.

Why: "a bundle never has two live owners" cannot be shown by reading the store's keys, because a
broken guard writes keys that look fine one at a time. A history can show it: every claim the
store granted (who, which hash range, which fencing token, valid from when until when, by the
store's own clock) and every moment the store ended a claim early (release, transfer, split,
merge, sweep). ``loadbalance.lease_checker`` then checks the whole history by hash interval.

A store records here only what its atomic operations returned, never what a caller hoped for:
the times are the store's clock at the moment the script ran (Redis ``TIME`` in production).

Ranges are a bundle's ``[lower, upper)`` on the 32-bit ring, except that a range whose upper
bound is ``0xffffffff`` also covers ``0xffffffff`` (Pulsar's closed last bundle).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Claim:
    """The store granted ``broker`` a range with ``token``, valid in ``[valid_from_ms,
    valid_until_ms)`` by the store's clock. ``kind``: ``acquire``, ``transfer`` (this broker is
    the destination) or ``renew`` (an extension of a claim with the same token)."""

    broker: str
    namespace: str
    lower: int
    upper: int
    token: int
    valid_from_ms: int
    valid_until_ms: int
    kind: str


@dataclass(frozen=True, slots=True)
class Revocation:
    """The store ended the claim with ``token`` on a range at ``at_ms`` (store clock), before
    or after its expiry. ``kind``: ``release``, ``transfer`` (the source's claim), ``split``,
    ``merge`` or ``sweep``."""

    broker: str
    namespace: str
    lower: int
    upper: int
    token: int
    at_ms: int
    kind: str


@dataclass(frozen=True, slots=True)
class NamespaceVersion:
    """The store reported ``namespace`` at ``version`` with these boundaries at ``at_ms``."""

    namespace: str
    version: int
    boundaries: tuple[int, ...]
    at_ms: int


Event = Claim | Revocation | NamespaceVersion


class Recorder(Protocol):
    """Where a store sends what it granted; must be safe to call from many threads."""

    def record(self, event: Event) -> None: ...


@dataclass
class HistoryRecorder:
    """Keeps events in the order they were recorded. ``deque.append`` is documented as
    thread-safe, so many store clients may share one recorder without a lock."""

    events: deque[Event] = field(default_factory=deque)

    def record(self, event: Event) -> None:
        self.events.append(event)

    def snapshot(self) -> list[Event]:
        return list(self.events)
