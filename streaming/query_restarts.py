"""A streaming query run until it ends, restarted in this process when it fails.

Why in process: a query that fails (typically Kafka away for longer than the client timeouts)
restarts from the same checkpoint with a fresh decision stage that re-seeds its view from Redis,
exactly as a new process would, and the restart is exact (``streaming.decide``). The wait before
a restart doubles from 1 s to 60 s while restarts keep failing and starts again at 1 s once a
restarted query has completed a batch; a failure that a restart would repeat (a checkpoint of an
older state layout) ends the job at once, and every failure is logged in one line that names
the actual error (``failure_summary``).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from infra.redaction import redact_text
from streaming.service_watch import ServiceWatch
from streaming.shard_store import OLDER_LAYOUT_MARK

__all__ = [
    "FINAL_FAILURES",
    "RESTART_BACKOFF_MAX_S",
    "RESTART_BACKOFF_S",
    "describe_failure",
    "failure_summary",
    "restart_delay",
    "restartable_errors",
    "run_with_restarts",
]

log = logging.getLogger("streaming.query_restarts")

RESTART_BACKOFF_S = 1.0
RESTART_BACKOFF_MAX_S = 60.0
_SUMMARY_MAX_CHARS = 500
# Spark's wrapper around every query failure; the cause after it names the error
_STREAM_FAILED = re.compile(r"\[STREAM_FAILED\] Query \[[^\]]*\] terminated with exception: ")


def restart_delay(
    failures: int, base_s: float = RESTART_BACKOFF_S, cap_s: float = RESTART_BACKOFF_MAX_S
) -> float:
    """Seconds to wait before restarting after the ``failures``-th failure in a row (1-based;
    a completed batch ends the row): ``base_s`` doubling up to ``cap_s``."""
    if failures < 1:
        raise ValueError(f"failures must be >= 1, got {failures}")
    return min(cap_s, base_s * 2.0 ** min(failures - 1, 64))


def failure_summary(text: str) -> str:
    """One line naming a query failure: the message's first line without Spark's
    ``[STREAM_FAILED] Query [ids] terminated with exception:`` wrapper, and when that line ends in
    a Python traceback (errors of the Kafka source or the decision stage reach the driver that
    way), the traceback's exception line, which names the actual error."""
    text = _STREAM_FAILED.sub("", text, count=1)
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "") or "unknown error"
    marker = "Traceback (most recent call last):"
    if marker in text:
        after = text.rsplit(marker, 1)[1].splitlines()  # the innermost: a worker's own error
        cause = next(
            (ln.strip() for ln in after if ln.strip() and not ln[:1].isspace()),
            "",
        )
        head = first.split(marker, 1)[0].rstrip(" :")
        first = f"{head}: {cause}" if head and cause else head or cause or first
    if len(first) > _SUMMARY_MAX_CHARS:
        first = first[: _SUMMARY_MAX_CHARS - 3] + "..."
    return first


def describe_failure(error: BaseException, secrets: Iterable[str] = ()) -> str:
    """``failure_summary`` of ``error`` with URL passwords and the configured ``secrets`` masked
    (the log filter does it too; this line must be safe wherever it is printed)."""

    return redact_text(failure_summary(str(error)), secrets)


def run_with_restarts(
    start: Callable[[Callable[[Any], None]], Any],
    *,
    max_restarts: int | None = None,
    restartable: tuple[type[BaseException], ...] = (Exception,),
    describe: Callable[[BaseException], str] = lambda e: failure_summary(str(e)),
    sleep: Callable[[float], None] = time.sleep,
    delay: Callable[[int], float] = restart_delay,
    watch: ServiceWatch | None = None,
) -> int:
    """Run a query until it ends, restarting it when it fails; the exit status.

    ``start(on_batch)`` starts a query (``awaitTermination()``, ``stop()``) that calls
    ``on_batch`` after each completed batch. A ``restartable`` error from the query (or from
    ``start`` when restarting) is logged in one line and the query restarted after
    ``delay(failures)`` s, ``failures`` counting the failures since a batch last completed.
    Returns 0 when the query ends by itself (``--available-now``), 1 after ``max_restarts``
    restarts (``None``: no limit), 130 on KeyboardInterrupt (Ctrl-C, or SIGTERM through the
    handler ``run_stream`` installs), also during the wait; other errors propagate.
    With ``watch``, the running query is probed every ``watch.every_s`` and after each
    failure: a service lost for longer than its window stops the query and returns 1 after
    one error line (restarts cannot help without the service).
    """
    completed = threading.Event()

    def on_batch(_stats: Any) -> None:
        completed.set()

    restarts = failures = 0
    query: Any = None
    try:
        query = start(on_batch)  # failing to start at all is not a restart case: it propagates
        while True:
            started = time.monotonic()
            try:
                if query is None:
                    query = start(on_batch)
                if _await(query, watch):
                    return 0
                _stop_quietly(query)
                query = None
                return 1
            except restartable as e:
                error: BaseException = e
            query = None  # terminated (or never started): nothing to stop
            if watch is not None and _verdict(watch):
                return 1
            if completed.is_set():
                failures = 0
            completed.clear()
            failures += 1
            ran_s = time.monotonic() - started
            wait_s = _restart_wait(error, ran_s, failures, restarts, max_restarts, describe, delay)
            if wait_s is None:
                return 1
            restarts += 1
            sleep(wait_s)
    except KeyboardInterrupt:
        _stop_quietly(query)
        return 130


def _await(query: Any, watch: ServiceWatch | None) -> bool:
    """Wait for ``query`` to end: True when it ended by itself, False when ``watch`` gave up
    on a lost service (after its line); a failure raises."""
    if watch is None:
        query.awaitTermination()
        return True
    while not query.awaitTermination(watch.every_s):
        if _verdict(watch):
            return False
    return True


def _verdict(watch: ServiceWatch) -> bool:
    """Ask ``watch``; True (after logging its one line) when the job must stop."""
    verdict = watch.check()
    if verdict is not None:
        log.error("streaming query %s", verdict)
    return verdict is not None


def _stop_quietly(query: Any) -> None:
    """Stop ``query`` if there is one; a JVM already going away (a group kill) is no error."""
    if query is not None:
        try:
            query.stop()
        except Exception:
            log.debug("stopping the query failed", exc_info=True)


FINAL_FAILURES = (OLDER_LAYOUT_MARK,)
"""What in a failed query's line means a restart would fail the same way (the checkpoint's
state is of an older layout): the job exits 1 at once instead of restarting with backoff."""


def _restart_wait(
    error: BaseException,
    ran_s: float,
    failures: int,
    restarts: int,
    max_restarts: int | None,
    describe: Callable[[BaseException], str],
    delay: Callable[[int], float],
) -> float | None:
    """Log a failed query in one line; the wait before the next restart, or None when
    ``max_restarts`` restarts are used up."""
    reason = _describe_safely(describe, error)
    log.debug("the query's error in full", exc_info=error)
    if any(mark in reason for mark in FINAL_FAILURES):
        log.error("streaming query failed after %.0f s: %s; not restarting", ran_s, reason)
        return None
    if max_restarts is not None and restarts >= max_restarts:
        log.error(
            "streaming query failed after %.0f s: %s; not restarting (%d restart%s, "
            "--max-restarts %d)",
            ran_s, reason, restarts, "" if restarts == 1 else "s", max_restarts,
        )  # fmt: skip
        return None
    wait_s = delay(failures)
    limit = "" if max_restarts is None else f"/{max_restarts}"
    log.warning(
        "streaming query failed after %.0f s: %s; restart %d%s from the checkpoint in "
        "%.0f s (%d failure%s in a row)",
        ran_s, reason, restarts + 1, limit, wait_s, failures, "" if failures == 1 else "s",
    )  # fmt: skip
    return wait_s


def _describe_safely(describe: Callable[[BaseException], str], error: BaseException) -> str:
    try:
        return describe(error)
    except Exception:  # e.g. the JVM went away while formatting the message
        return type(error).__name__


def restartable_errors() -> tuple[type[BaseException], ...]:
    """Errors raised by Spark for a failed query or a failed start (the JVM answered); a dead
    gateway (py4j network errors) is not among them, since a restart cannot help."""
    # pyspark and its py4j gateway: only a running query can raise these
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    return (PySparkException, Py4JJavaError)
