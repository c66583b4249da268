"""How long the streaming job has been without a service it needs, and when to give up.

Why: a query whose Kafka or Redis is gone fails batch after batch (or hangs in a client
timeout), and restarting it for ever hid the cause under thousands of lines of Java and Python
traces. The job's driver probes the services it needs (``infra.preflight``: a metadata request
to Kafka, a PING to Redis, each with a short timeout) while the query runs and after each
failure; a lost service is logged once when it is first seen, again when it is back, and once
it has been gone for ``window_s`` seconds the verdict is one line naming the service, its
address and what to check, and the job stops (``lbctl stream --restart-window-s``). A query
that fails while every service answers is not this module's business: ``--max-restarts``
bounds those.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["DEFAULT_WINDOW_S", "ServiceWatch"]

DEFAULT_WINDOW_S = 120.0
DEFAULT_EVERY_S = 10.0

log = logging.getLogger("streaming.cli")


class ServiceWatch:
    """Judges the services ``probe`` checks (None when all answer, else a one-line reason
    naming the lost one). ``check()`` returns the final verdict once one has been lost for
    ``window_s`` seconds without a break; ``every_s`` is how often a running query is probed."""

    def __init__(
        self,
        probe: Callable[[], str | None],
        window_s: float = DEFAULT_WINDOW_S,
        every_s: float = DEFAULT_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.probe = probe
        self.window_s = window_s
        self.every_s = every_s
        self.clock = clock
        self.lost_since: float | None = None

    def check(self) -> str | None:
        """Probe now; None while every service answers or the loss is younger than the
        window, else the verdict line."""
        lost = self.probe()
        now = self.clock()
        if lost is None:
            if self.lost_since is not None:
                log.info("services reachable again after %.0f s", now - self.lost_since)
            self.lost_since = None
            return None
        if self.lost_since is None:
            self.lost_since = now
            log.warning(
                "%s; the job stops if this lasts %g s (--restart-window-s)", lost, self.window_s
            )
        gone_s = now - self.lost_since
        if gone_s < self.window_s:
            return None
        return (
            f"stopped after {gone_s:.0f} s without the service "
            f"(--restart-window-s {self.window_s:g}): {lost}"
        )
