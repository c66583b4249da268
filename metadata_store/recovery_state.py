"""What the rebuild after a Redis data loss reads and writes beside the ownership store: the
dataset epoch ``P:epoch``, the fencing counter's floor ``P:fence``, namespaces written with a
chosen version, and the report (``P:recovery:last``, streamed to ``P:recovery-log``).

Why apart from ``RedisStore``: these writes bypass the store's normal rules on purpose (a
namespace created at an arbitrary version, a counter raised by hand), and only
``controller.recovery`` may make them, after validating everything it will write.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from metadata_store.formats import boundaries_csv
from metadata_store.keys import Keys

__all__ = ["RECOVERY_LOG_MAXLEN", "RecoveryState"]

RECOVERY_LOG_MAXLEN = 1000


class RecoveryState:
    """The epoch, the fence floor, rebuilt namespaces and recovery reports under one prefix."""

    def __init__(self, client: Any, prefix: str = "lb") -> None:
        self._r = client
        self._keys = Keys(prefix)

    def epoch(self) -> str | None:
        """The id of this dataset, or None when it is gone (Redis lost its data)."""
        raw = self._r.get(self._keys.epoch())
        return raw.decode() if raw is not None else None

    def raise_fence(self, floor: int, ceiling: int) -> None:
        """Raise the fencing counter to at least ``floor``. A counter that is not an integer in
        range (written by hand) or above ``ceiling`` is refused with ``redis.ResponseError``
        before any write."""
        fenced = self._r.eval(
            "local raw = redis.call('GET', KEYS[1]) or '0' "
            "if not string.match(raw, '^%d+$') or string.len(raw) > 16 "
            "or tonumber(raw) > tonumber(ARGV[2]) then "
            "return redis.error_reply('fence counter holds ' .. string.sub(raw, 1, 40)) end "
            "if tonumber(raw) < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end "
            "return 1",
            1,
            self._keys.fence(),
            floor,
            ceiling,
        )
        assert fenced == 1

    def write_namespace(self, ns: str, bounds: Sequence[int], version: int) -> bool:
        """Create ``ns`` with ``bounds`` at ``version`` unless it exists (a racing creator wins);
        True when this call created it."""
        created = self._r.eval(
            "if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end "
            "redis.call('HSET', KEYS[1], 'boundaries', ARGV[1], 'version', ARGV[2]) "
            "redis.call('SADD', KEYS[2], ARGV[3]) return 1",
            2,
            self._keys.ns(ns),
            self._keys.namespaces(),
            boundaries_csv(bounds),
            version,
            ns,
        )
        return bool(created)

    def finish(self, epoch: str, report_json: str) -> None:
        """The new epoch and the report, atomically: the last thing a recovery writes."""
        pipe = self._r.pipeline(transaction=True)
        pipe.set(self._keys.epoch(), epoch)
        pipe.set(self._keys.recovery_last(), report_json)
        pipe.xadd(self._keys.recovery_log(), {"report": report_json}, maxlen=RECOVERY_LOG_MAXLEN)
        pipe.execute()

    def last_report(self) -> dict[str, Any] | None:
        raw = self._r.get(self._keys.recovery_last())
        return json.loads(raw) if raw is not None else None
