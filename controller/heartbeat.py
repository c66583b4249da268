"""The controller's entry in the process registry (``metadata_store.processes``).

Why: ``lbctl monitor`` and ``lbctl health control`` must tell a working controller from one that
is stuck or gone, wherever it runs and whether or not it serves metrics. The loop reports what it
did (a poll of Kafka that answered, a consumer error, a record consumed, a sweep); this object
keeps the times and writes them to Redis at most once per ``interval_s``. A Redis that is away
costs the write, never the loop: the next beat tries again.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import redis

from infra import metrics
from metadata_store.processes import ProcessRegistry, process_id

ROLE = "control"
log = logging.getLogger("lbctl.control")


class ControllerHeartbeat:
    """Times of the controller's last poll, record, sweep and consumer error, written to the
    registry every ``interval_s``."""

    def __init__(
        self,
        registry: ProcessRegistry,
        *,
        group: str,
        interval_s: float = 1.0,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.registry = registry
        self.id = process_id()
        self.interval_s = interval_s
        self.wall_ms = wall_ms
        now = wall_ms()
        self.doc: dict[str, Any] = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "group": group,
            "startedAtMs": now,
            "lastPollMs": None,
            "lastRecordMs": None,
            "lastSweepMs": None,
            "lastErrorMs": None,
            "lastError": None,
            "consumed": 0,
            "metricsUrl": next(iter(metrics.served_urls()), None),
            "stoppedAtMs": None,
        }
        self._written = 0.0

    def polled(self, error: str | None = None) -> None:
        """A poll returned: the loop is alive. ``error``: the consumer reported one (Kafka
        away, for instance); whether Kafka delivers is judged from the group's offsets."""
        now = self.wall_ms()
        if error is None:
            self.doc["lastPollMs"] = now
        else:
            self.doc["lastErrorMs"], self.doc["lastError"] = now, error[:300]
        self.tick()

    def consumed(self) -> None:
        self.doc["lastRecordMs"] = self.wall_ms()
        self.doc["consumed"] += 1

    def swept(self) -> None:
        self.doc["lastSweepMs"] = self.wall_ms()

    def tick(self, *, force: bool = False) -> None:
        """Write the entry if ``interval_s`` passed since the last write (or ``force``)."""
        if not force and time.monotonic() - self._written < self.interval_s:
            return
        self._written = time.monotonic()
        try:
            self.registry.beat(ROLE, self.id, {**self.doc, "beatAtMs": self.wall_ms()})
        except redis.RedisError as e:  # READONLY, OOM, ... as well: the next beat tries again
            log.debug("registry beat skipped: Redis unavailable (%s)", e)

    def stopped(self) -> None:
        """A clean stop: the entry says so, so the monitor shows it stopped, not stale."""
        self.doc["stoppedAtMs"] = self.wall_ms()
        self.tick(force=True)
