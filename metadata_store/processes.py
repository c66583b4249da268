"""The process registry: ``P:processes``, one entry per running ``lbctl`` process that works.

Why a registry: an operator (``lbctl monitor``, ``lbctl health``) must find every controller and
the streaming job and tell whether each still makes progress, without knowing on which host or
metrics port it runs. Each process writes its own entry, keyed ``<role>/<id>`` (``id`` is
``host:pid``), as a JSON document::

    {"role": "control", "id": "host:4711", "host": "host", "pid": 4711,
     "startedAtMs": ..., "lastPollMs": ..., "lastSweepMs": ..., "beatAtMs": ...,
     "metricsUrl": "http://127.0.0.1:9402/metrics" | null, "group": "lb-controller",
     "stoppedAtMs": null}

Times are the writing process's own wall clock (ms since the epoch): the point is to see when
that process last did something, as it saw it. An entry stays after its process dies, so a dead
process shows as stale instead of vanishing; a clean stop sets ``stoppedAtMs``. ``prune`` drops
entries older than a bound, so restarts do not grow the hash forever.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from metadata_store.keys import Keys

__all__ = ["ProcessEntry", "ProcessRegistry", "process_id"]


def process_id() -> str:
    """``host:pid`` of this process: unique among live processes, readable by an operator."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class ProcessEntry:
    """One registered process as it last described itself."""

    role: str
    id: str
    doc: Mapping[str, Any]

    def ms(self, field: str) -> int | None:
        """A time field of the document, None where absent or not a number."""
        value = self.doc.get(field)
        return int(value) if isinstance(value, int | float) else None

    @property
    def beat_ms(self) -> int | None:
        return self.ms("beatAtMs")

    @property
    def stopped(self) -> bool:
        return self.ms("stoppedAtMs") is not None


class ProcessRegistry:
    """Reads and writes ``P:processes`` (a hash of ``role/id`` -> JSON document)."""

    def __init__(self, client: Any, prefix: str = "lb") -> None:
        self._r = client
        self._keys = Keys(prefix)

    @staticmethod
    def field(role: str, pid: str) -> str:
        return f"{role}/{pid}"

    def beat(self, role: str, pid: str, doc: Mapping[str, Any]) -> None:
        """Replace this process's entry (one HSET: the entry is small and only its writer
        changes it)."""
        body = {"role": role, "id": pid, **doc}
        self._r.hset(self._keys.processes(), self.field(role, pid), json.dumps(body))

    def entries(self, role: str | None = None) -> list[ProcessEntry]:
        """Every entry (of ``role`` if given), sorted by role then id; unreadable ones skipped."""
        raw = self._r.hgetall(self._keys.processes())
        out = []
        for key, value in raw.items():
            name = key.decode() if isinstance(key, bytes) else str(key)
            entry_role, _, pid = name.partition("/")
            if role is not None and entry_role != role:
                continue
            try:
                doc = json.loads(value)
            except ValueError:
                continue
            if isinstance(doc, dict):
                out.append(ProcessEntry(entry_role, pid, doc))
        return sorted(out, key=lambda e: (e.role, e.id))

    def remove(self, role: str, pid: str) -> None:
        self._r.hdel(self._keys.processes(), self.field(role, pid))

    def prune(self, now_ms: int, older_than_ms: int) -> int:
        """Drop entries whose last beat is older than ``older_than_ms``; how many."""
        old = [
            self.field(e.role, e.id)
            for e in self.entries()
            if (e.beat_ms or 0) < now_ms - older_than_ms
        ]
        if old:
            self._r.hdel(self._keys.processes(), *old)
        return len(old)
