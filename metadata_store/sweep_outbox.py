"""The sweep outbox, ``P:sweep-outbox``: every lease the expiry sweep removed, kept until the
controller has announced its expiry and its bundle is placed again (or owned, or gone).

Why: the sweep's change (leases deleted in Redis) and its announcement (``expired`` events on
Kafka, then the bundles placed again) are two systems, so a controller can be killed between
them. The sweep script writes an entry for each lease in the same script that deletes it, so
no removal exists without its entry; any controller's next sweep re-delivers what it finds
(``controller.sweep``). Events are at least once; readers de-duplicate by
``(bundle, event, oldToken)``.

Format: field ``<bundle>|<token>`` -> JSON ``[broker, token, expiresMs, sweptAtMs]``. A field
names one removed lease exactly (tokens are never reused), so concurrent controllers clear by
exact field and never drop an entry another sweep wrote after they read.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from metadata_store.keys import Keys
from metadata_store.leases import Lease

__all__ = ["MemorySweepOutbox", "SweepOutbox", "SweptLease", "entry_field"]


def entry_field(bundle: str, token: int) -> str:
    """The outbox field of one removed lease (the sweep script builds the same string)."""
    return f"{bundle}|{int(token)}"


@dataclass(frozen=True, slots=True)
class SweptLease:
    """A lease the sweep removed, and the store's time of the removal."""

    lease: Lease
    swept_at_ms: int

    @property
    def field(self) -> str:
        return entry_field(self.lease.bundle, self.lease.token)


def _decode(name: bytes | str, raw: bytes | str) -> SweptLease | None:
    """One entry, or None for a field that is no entry (left for an operator to see)."""
    try:
        bundle = (name.decode() if isinstance(name, bytes) else name).rsplit("|", 1)[0]
        broker, token, expires, swept = json.loads(raw)
        return SweptLease(Lease(bundle, str(broker), int(token), int(expires)), int(swept))
    except (ValueError, TypeError):
        return None


class SweepOutbox:
    """The Redis sweep outbox (module docstring); written only by the sweep script."""

    def __init__(self, client: Any, prefix: str = "lb") -> None:
        self._r = client
        self._key = Keys(prefix).sweep_outbox()

    def pending(self) -> list[SweptLease]:
        """Every entry not cleared yet, by bundle then token."""
        found = (_decode(k, v) for k, v in self._r.hgetall(self._key).items())
        entries = [e for e in found if e is not None]
        return sorted(entries, key=lambda e: (e.lease.bundle, e.lease.token))

    def clear(self, fields: Iterable[str]) -> int:
        """Drop exactly these entries (their expiry announced, their bundle settled)."""
        names = sorted(set(fields))
        return int(self._r.hdel(self._key, *names)) if names else 0


class MemorySweepOutbox:
    """``SweepOutbox`` for ``MemoryStore``: written by its sweep under the store's lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, SweptLease] = {}

    def record(self, leases: Iterable[Lease], swept_at_ms: int) -> None:
        with self._lock:
            for lease in leases:
                entry = SweptLease(lease, swept_at_ms)
                self._entries[entry.field] = entry

    def pending(self) -> list[SweptLease]:
        with self._lock:
            return sorted(self._entries.values(), key=lambda e: (e.lease.bundle, e.lease.token))

    def clear(self, fields: Iterable[str]) -> int:
        with self._lock:
            return sum(1 for f in set(fields) if self._entries.pop(f, None) is not None)
