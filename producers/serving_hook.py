"""The agent's serving file: the one hook a broker integration reads to know what it may serve.

Why a file: the agent keeps, per bundle, the local time until which the broker may serve it
(``loadbalance.serving``), and the broker is another process. The agent rewrites one JSON file
atomically (write to a temporary file, then ``os.replace``) after every check. Its times are
seconds of the host's ``CLOCK_MONOTONIC`` (Python's ``time.monotonic``), which every process on
the host shares, so a reader compares ``servingUntil`` with its own monotonic clock. A broker
therefore stops at the deadline even when the agent is frozen, killed, or stuck waiting for
Redis: the deadline in the file only moves forward when a renewal succeeds. A missing or
unreadable file means: serve nothing.

The broker's rule, for each bundle before serving it (docs/ownership.md, "Serving in real
time"): serve iff the bundle is listed and ``servingFrom <= time.monotonic() < servingUntil``
(``servingFrom`` lies ahead while a handover wait runs; null: not at all).
``lbctl agent status`` reads the same file with the same rule.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from infra import metrics
from loadbalance.serving import ServingTable


def default_serving_file() -> str:
    """Where the agent writes its serving state unless told otherwise (one agent per host)."""
    return os.path.join(tempfile.gettempdir(), "lbctl-agent-serving.json")


def serving_document(table: ServingTable, now: float) -> dict[str, Any]:
    """The file's content at local monotonic time ``now``."""
    rule = table.rule
    return {
        "broker": table.broker,
        "clock": "CLOCK_MONOTONIC",
        "writtenAt": now,
        "pid": os.getpid(),
        "leaseTtlSeconds": rule.ttl_s,
        "leaseClockDriftBound": rule.drift_bound,
        "leaseStopMarginMs": round(rule.stop_margin_s * 1000),
        "bundles": [
            {
                "bundle": s.bundle,
                "token": s.token,
                "servingFrom": s.serve_from,
                "servingUntil": s.serve_until,
                "renewRequestedAt": s.renew_requested_at,
            }
            for s in table.status(now)
        ],
    }


def write_serving_file(path: str | Path, doc: Mapping[str, Any]) -> None:
    """Replace ``path`` atomically: a reader sees the old file or the new one, never half."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=".serving-", dir=target.parent or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, separators=(",", ":"))
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_serving_file(path: str | Path, now: float) -> dict[str, Any]:
    """The file judged at ``now`` (the reader's monotonic clock): each bundle gains
    ``serving`` and ``secondsLeft``. Raises ``OSError`` or ``ValueError`` if unreadable."""
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(doc, dict) or not isinstance(doc.get("bundles"), list):
        raise ValueError(f"{path} is not an agent serving file")
    for b in doc["bundles"]:
        until = float(b["servingUntil"])
        start = b.get("servingFrom", -math.inf)  # null: no start ahead (a late reply)
        b["serving"] = start is not None and float(start) <= now < until
        b["secondsLeft"] = max(0.0, until - now)
    return doc


class ServingHook:
    """Publishes a ``ServingTable``: the serving file and the per-bundle gauges."""

    def __init__(self, path: str | Path | None, monotonic: Callable[[], float]) -> None:
        self.path = path
        self.monotonic = monotonic
        self._shown: set[str] = set()

    def publish(self, table: ServingTable) -> None:
        now = self.monotonic()
        status = table.status(now)
        for s in status:
            metrics.set_agent_serving(s.bundle, s.serving, s.seconds_left)
        gone = self._shown - {s.bundle for s in status}
        metrics.forget_agent_serving(gone)
        self._shown = {s.bundle for s in status}
        if self.path:
            write_serving_file(self.path, serving_document(table, now))
