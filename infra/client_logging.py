"""Kafka client libraries' own messages, through the product's logging, de-duplicated.

Why: librdkafka retries a lost broker every few milliseconds and, left to itself, writes each
failure to the terminal (``%3|...|FAIL|rdkafka#producer-1|...``): an unreachable Kafka meant
hundreds of identical lines a minute that buried the product's own message. Every
confluent-kafka client gets the logger ``client_logger()`` in its configuration (through
``infra.topics.kafka_client_config``), so librdkafka's lines become ordinary log records of
``lbctl.kafka.client``: formatted, redacted and levelled like the rest, and passed through a
``RepeatFilter`` that lets the same message through at most once per ``interval_s`` seconds and
says how many repeats it held back.

The error callback (``KafkaErrorReporter``) turns librdkafka's error events into the product's
words: a refused login or handshake raises ``KafkaAuthError`` (permanent: the command ends with
one line), "all brokers down" is one warning naming the bootstrap servers (rate-limited by the
same filter), and the rest (a single broker's transport failure, which the log line already
says) stays at debug level.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError

from infra.kafka_auth import raise_on_auth_error

__all__ = [
    "CLIENT_LOGGER",
    "KAFKA_LOGGER",
    "KafkaErrorReporter",
    "RepeatFilter",
    "client_logger",
    "kafka_logger",
]

CLIENT_LOGGER = "lbctl.kafka.client"
"""librdkafka's own log lines."""
KAFKA_LOGGER = "lbctl.kafka"
"""The product's lines about Kafka clients (their error callbacks)."""
REPEAT_INTERVAL_S = 30.0

# Parts of a librdkafka line that change between repeats of the same failure
_VOLATILE = (
    re.compile(r"\s*\(after \d+ms[^)]*\)"),
    re.compile(r"rdkafka#[a-z]+-\d+"),
    re.compile(r"\d+ identical error\(s\) suppressed"),
)


def _key(record: logging.LogRecord) -> tuple[str, int, str]:
    try:
        text = record.getMessage()
    except Exception:  # a bad format string: judge by the template
        text = str(record.msg)
    for pattern in _VOLATILE:
        text = pattern.sub("", text)
    return record.name, record.levelno, text


class RepeatFilter(logging.Filter):
    """The same message (name, level and text, with counters and client names ignored) at
    most once per ``interval_s`` seconds; the next one that passes carries the count of the
    repeats held back meanwhile. Thread-safe: librdkafka logs from its own threads when a
    client is polled from several."""

    def __init__(
        self, interval_s: float = REPEAT_INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.interval_s = interval_s
        self.clock = clock
        self._last: dict[tuple[str, int, str], float] = {}
        self._held: dict[tuple[str, int, str], int] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = _key(record)
        now = self.clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval_s:
                self._held[key] = self._held.get(key, 0) + 1
                return False
            self._last[key] = now
            held = self._held.pop(key, 0)
            if len(self._last) > 1024:  # a long run meets many distinct lines: forget old ones
                cutoff = now - self.interval_s
                self._last = {k: t for k, t in self._last.items() if t >= cutoff}
        if held:
            record.msg = (
                f"{record.getMessage()} ({held} repeat{'s' if held != 1 else ''} in the last "
                f"{self.interval_s:g} s not shown)"
            )
            record.args = None
        return True


def _filtered_logger(name: str) -> logging.Logger:
    logger = logging.getLogger(name)
    if not any(isinstance(f, RepeatFilter) for f in logger.filters):
        logger.addFilter(RepeatFilter())
    return logger


def client_logger() -> logging.Logger:
    """The logger every confluent-kafka client is given (``"logger"`` in its configuration),
    with its ``RepeatFilter`` installed once per process."""
    return _filtered_logger(CLIENT_LOGGER)


def kafka_logger() -> logging.Logger:
    """The product's logger for Kafka client trouble, rate-limited like librdkafka's lines."""
    return _filtered_logger(KAFKA_LOGGER)


class KafkaErrorReporter:
    """librdkafka ``error_cb`` for clients of ``bootstrap_servers``: a refusal raises
    ``KafkaAuthError``; all brokers down is one product warning naming the address; other
    events are debug lines. A module-level class, so a client configuration stays picklable
    (Spark ships the Python source's settings to its workers)."""

    def __init__(self, bootstrap_servers: str) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.last_error: str = ""

    def __call__(self, err: KafkaError) -> None:
        raise_on_auth_error(err)
        self.last_error = err.str()
        if err.code() == KafkaError._ALL_BROKERS_DOWN:
            kafka_logger().warning(
                "Kafka at %s unreachable (%s); the client keeps retrying",
                self.bootstrap_servers,
                err.str(),
            )
        else:
            kafka_logger().debug("Kafka client event: %s", err.str())

    def __reduce__(self) -> tuple[Any, ...]:
        return (KafkaErrorReporter, (self.bootstrap_servers,))
