"""The event outbox, ``P:event-outbox``: per decision id, the leases its bundles had before the
controller applied it, kept until the decision's ownership events are delivered.

Why: a controller killed after the Redis change but before Kafka had the events replays the
decision and finds the change made; the saved entry says its events may be unannounced, and
gives the old owners and tokens to announce them with. Format: decision id -> JSON
``{bundle: [broker, token, expiresMs] | null}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from metadata_store.keys import Keys
from metadata_store.leases import Lease

__all__ = ["EventOutbox"]


def _encode(before: Mapping[str, Lease | None]) -> str:
    return json.dumps(
        {b: [x.broker, x.token, x.expires_at_ms] if x else None for b, x in before.items()}
    )


def _decode(raw: bytes) -> dict[str, Lease | None]:
    return {
        b: Lease(b, v[0], int(v[1]), int(v[2])) if v else None for b, v in json.loads(raw).items()
    }


class EventOutbox:
    """Saved pre-change leases by decision id (see the module docstring)."""

    def __init__(self, client: Any, prefix: str = "lb") -> None:
        self._r = client
        self._keys = Keys(prefix)

    def get(self, decision_id: str) -> dict[str, Lease | None] | None:
        """The leases saved for ``decision_id``, or None when nothing is pending for it."""
        raw = self._r.hget(self._keys.event_outbox(), decision_id)
        return None if raw is None else _decode(raw)

    def put(self, decision_id: str, before: Mapping[str, Lease | None]) -> None:
        self._r.hset(self._keys.event_outbox(), decision_id, _encode(before))

    def clear(self, decision_id: str) -> None:
        """Forget a decision's entry once its events are delivered (or it had none)."""
        self._r.hdel(self._keys.event_outbox(), decision_id)
