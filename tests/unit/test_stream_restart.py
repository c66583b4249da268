"""``lbctl stream``'s in-process restart of a failed query (``streaming.query_restarts``): the
backoff schedule, the one-line failure description, and the restart loop over stand-in queries
(plain objects with ``awaitTermination`` / ``stop``; the real query is exercised by
``tests/reliability/test_stream_kafka_outage.py``)."""

from __future__ import annotations

import logging
import signal
import threading
import time

import pytest

from streaming.cli import _raise_keyboard_interrupt
from streaming.query_restarts import (
    describe_failure,
    failure_summary,
    restart_delay,
    run_with_restarts,
)

SPARK_TEXT = (
    "[STREAM_FAILED] Query [id = 440f6480, runId = 94ccd564] terminated with exception: "
    "[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed when Python streaming data source "
    "perform latestOffset: Traceback (most recent call last):\n"
    '  File "/work/main/streaming/kafka_source.py", line 226, in latestOffset\n'
    "    end = {t: self._latest(t, start.get(t)) for t in self.config.topics}\n"
    "          ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
    "cimpl.KafkaException: KafkaError{code=_TRANSPORT,val=-195,"
    'str="Failed to get metadata: Local: Broker transport failure"}\n'
    " SQLSTATE: 38000\n\nJVM stacktrace:\norg.apache.spark.sql.streaming.StreamingQueryException\n"
    "\tat org.apache.spark.sql.execution.streaming.StreamExecution.run(StreamExecution.scala:1)\n"
)


def test_backoff_doubles_from_one_second_to_a_one_minute_cap():
    assert [restart_delay(n) for n in range(1, 10)] == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert restart_delay(10_000) == 60.0
    assert restart_delay(3, base_s=0.5, cap_s=1.5) == 1.5
    with pytest.raises(ValueError):
        restart_delay(0)


def test_failure_summary_is_one_line_naming_the_cause():
    assert failure_summary(SPARK_TEXT) == (
        "[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed when Python streaming data source "
        "perform latestOffset: cimpl.KafkaException: KafkaError{code=_TRANSPORT,val=-195,"
        'str="Failed to get metadata: Local: Broker transport failure"}'
    )
    assert failure_summary("\n  plain message  \nmore") == "plain message"
    assert failure_summary("") == "unknown error"
    assert len(failure_summary("x" * 5000)) == 500


def test_describe_failure_masks_url_passwords_and_configured_secrets():
    error = RuntimeError(
        "Traceback (most recent call last):\n  File 'x'\n"
        "ConnectionError: redis://ops:hunter2@redis:6379 refused, sasl s3cr3t"
    )
    line = describe_failure(error, secrets=["s3cr3t"])
    assert "hunter2" not in line and "s3cr3t" not in line
    assert "redis://ops:******@redis:6379" in line and "ConnectionError" in line


class Failed(Exception):
    """Stands for Spark's StreamingQueryException."""


class Query:
    """A stand-in query: optionally completes a batch, then fails with ``error`` or ends."""

    def __init__(self, on_batch, error: BaseException | None, batch: bool) -> None:
        self.on_batch, self.error, self.batch = on_batch, error, batch
        self.stopped = False

    def awaitTermination(self) -> None:
        if self.batch:
            self.on_batch(object())
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        self.stopped = True


def starter(plan: list[tuple[BaseException | None, bool]], queries: list[Query]):
    """``start`` for ``run_with_restarts`` that plays ``plan``: (error, batch) per query; an
    error that is a ``StartError`` is raised by ``start`` itself."""

    def start(on_batch):
        error, batch = plan.pop(0)
        if isinstance(error, StartError):
            raise error
        queries.append(Query(on_batch, error, batch))
        return queries[-1]

    return start


class StartError(Failed):
    pass


def test_failed_queries_are_restarted_with_backoff_until_one_ends(caplog):
    sleeps: list[float] = []
    plan = [(Failed("kafka away"), False), (Failed("still away"), False), (None, True)]
    with caplog.at_level(logging.WARNING, logger="streaming.query_restarts"):
        status = run_with_restarts(starter(plan, []), restartable=(Failed,), sleep=sleeps.append)
    assert status == 0 and sleeps == [1.0, 2.0] and not plan
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "kafka away; restart 1 from the checkpoint in 1 s (1 failure in a row)" in lines[0]
    assert "still away; restart 2 from the checkpoint in 2 s (2 failures in a row)" in lines[1]


def test_a_completed_batch_resets_the_backoff_and_a_failed_restart_counts_as_a_failure():
    sleeps: list[float] = []
    plan = [
        (Failed("a"), True),  # ran a batch, then failed: 1 s
        (StartError("b"), False),  # the restart itself failed: 2 s
        (Failed("c"), False),  # 4 s
        (Failed("d"), True),  # a batch again: back to 1 s
        (None, False),
    ]
    assert run_with_restarts(starter(plan, []), restartable=(Failed,), sleep=sleeps.append) == 0
    assert sleeps == [1.0, 2.0, 4.0, 1.0]


def test_max_restarts_bounds_the_restarts_and_zero_exits_on_the_first_failure(caplog):
    sleeps: list[float] = []
    plan = [(Failed("x"), False)] * 3 + [(None, False)]
    run = run_with_restarts(
        starter(list(plan), []), max_restarts=2, restartable=(Failed,), sleep=sleeps.append
    )
    assert run == 1 and sleeps == [1.0, 2.0]
    sleeps.clear()
    with caplog.at_level(logging.ERROR, logger="streaming.query_restarts"):
        run = run_with_restarts(
            starter(list(plan), []), max_restarts=0, restartable=(Failed,), sleep=sleeps.append
        )
    assert run == 1 and sleeps == []
    assert "x; not restarting (0 restarts, --max-restarts 0)" in caplog.records[-1].getMessage()


def test_other_errors_and_a_failing_first_start_propagate():
    with pytest.raises(ValueError):
        run_with_restarts(starter([(ValueError("bug"), False)], []), restartable=(Failed,))
    with pytest.raises(StartError):
        run_with_restarts(starter([(StartError("no"), False)], []), restartable=(Failed,))


def test_interrupt_while_running_stops_the_query_with_130():
    queries: list[Query] = []
    status = run_with_restarts(starter([(KeyboardInterrupt(), False)], queries))
    assert status == 130 and queries[0].stopped


class DeadJvmQuery(Query):
    def stop(self) -> None:
        raise RuntimeError("An error occurred while calling o130.stop")


def test_interrupt_still_exits_130_when_stopping_the_query_fails():
    """A SIGTERM to the whole process group reaches the JVM too, so ``stop`` may fail."""

    def start(on_batch):
        return DeadJvmQuery(on_batch, KeyboardInterrupt(), False)

    assert run_with_restarts(start) == 130


def test_sigterm_during_the_backoff_wait_exits_promptly_with_130():
    """The real signal and the real sleep: the handler ``run_stream`` falls back to raises
    KeyboardInterrupt, which ends a 30 s wait at once."""
    previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    main = threading.main_thread().ident
    timer = threading.Timer(0.3, signal.pthread_kill, args=(main, signal.SIGTERM))
    try:
        began = time.monotonic()
        timer.start()
        status = run_with_restarts(
            starter([(Failed("away"), False), (None, False)], []),
            restartable=(Failed,),
            delay=lambda failures: 30.0,
        )
        took = time.monotonic() - began
    finally:
        timer.cancel()
        signal.signal(signal.SIGTERM, previous)
    assert status == 130 and took < 5.0


def test_a_checkpoint_of_an_older_state_layout_is_not_restarted(caplog):
    """A restart reads the same checkpoint and is refused the same way: the job exits 1 at once
    with the refusal's line instead of retrying with backoff forever."""
    from streaming.shard_store import OlderStateLayout

    refusal = Failed(f"Python worker: {OlderStateLayout('s:3', 'shard:v1')}")
    sleeps: list[float] = []
    plan = [(refusal, False), (None, False)]
    with caplog.at_level(logging.ERROR, logger="streaming.query_restarts"):
        status = run_with_restarts(starter(plan, []), restartable=(Failed,), sleep=sleeps.append)
    assert status == 1 and sleeps == [] and len(plan) == 1
    (line,) = [r.getMessage() for r in caplog.records]
    assert "older layout" in line and "not restarting" in line and "Upgrading a checkpoint" in line
