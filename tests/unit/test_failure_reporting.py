"""Repeated client lines are held back with a count; a lost service stops the stream job only
after its window; the window is judged by the watch, not by query failures alone."""

from __future__ import annotations

import logging

import pytest

from infra.client_logging import RepeatFilter
from streaming.query_restarts import run_with_restarts
from streaming.service_watch import ServiceWatch

FAIL = (
    "FAIL [rdkafka#consumer-{n}] [thrd:b]: 127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 "
    "failed: Connection refused (after {ms}ms in state CONNECT)"
)


def _record(text: str) -> logging.LogRecord:
    return logging.LogRecord("lbctl.kafka.client", logging.ERROR, __file__, 1, text, None, None)


def test_the_same_client_line_passes_once_per_interval_then_with_its_count():
    now = [0.0]
    flt = RepeatFilter(interval_s=30.0, clock=lambda: now[0])
    passed = []
    for i in range(40):  # a retry every 0.5 s for 20 s; client names and timings vary
        now[0] = i * 0.5
        rec = _record(FAIL.format(n=i % 3, ms=i))
        if flt.filter(rec):
            passed.append(rec.getMessage())
    assert len(passed) == 1
    now[0] = 31.0
    rec = _record(FAIL.format(n=9, ms=0))
    assert flt.filter(rec)
    assert rec.getMessage().endswith("(39 repeats in the last 30 s not shown)")


def test_different_client_lines_are_not_merged():
    flt = RepeatFilter(interval_s=30.0, clock=lambda: 0.0)
    assert flt.filter(_record("FAIL a"))
    assert flt.filter(_record("FAIL b"))


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_service_is_given_up_only_after_the_window_without_a_break(caplog):
    clock = _Clock()
    answers: list[str | None] = ["kafka gone", "kafka gone", None, "kafka gone", "kafka gone"]
    watch = ServiceWatch(lambda: answers.pop(0), window_s=30.0, clock=clock)
    assert watch.check() is None  # t=0: lost, the window starts
    clock.now = 20.0
    assert watch.check() is None
    clock.now = 25.0
    assert watch.check() is None  # back: the window is reset
    clock.now = 26.0
    assert watch.check() is None
    clock.now = 56.0
    verdict = watch.check()
    assert verdict is not None and "kafka gone" in verdict and "--restart-window-s 30" in verdict


class _HangingQuery:
    """A query whose batches hang (a dead broker): it never ends or fails by itself."""

    def __init__(self) -> None:
        self.stopped = False
        self.waits = 0

    def awaitTermination(self, timeout: float | None = None) -> bool:
        self.waits += 1
        return False

    def stop(self) -> None:
        self.stopped = True


def test_a_hanging_query_is_stopped_once_the_watch_gives_up():
    clock = _Clock()
    query = _HangingQuery()

    def probe() -> str:
        clock.now += 10.0  # each probe is one probe period later
        return "cannot reach Kafka at 127.0.0.1:1"

    watch = ServiceWatch(probe, window_s=30.0, clock=clock)
    status = run_with_restarts(lambda on_batch: query, watch=watch)
    assert status == 1 and query.stopped
    assert query.waits == 4  # lost at 10 s, given up at 40 s


def test_failing_restarts_end_once_the_watch_gives_up():
    clock = _Clock()
    started = []

    class Failed(Exception):
        pass

    class FailingQuery(_HangingQuery):
        def awaitTermination(self, timeout: float | None = None) -> bool:
            raise Failed("Kafka away")

    def start(on_batch):
        started.append(1)
        return FailingQuery()

    def probe() -> str:
        clock.now += 10.0
        return "cannot reach Kafka at 127.0.0.1:1"

    status = run_with_restarts(
        start,
        restartable=(Failed,),
        sleep=lambda s: None,
        watch=ServiceWatch(probe, window_s=30.0, clock=clock),
    )
    assert status == 1 and len(started) == 4


@pytest.mark.parametrize("answer", [None])
def test_a_query_whose_services_answer_is_never_stopped_by_the_watch(answer):
    ends = iter([False, False, False, True])

    class Query(_HangingQuery):
        def awaitTermination(self, timeout: float | None = None) -> bool:
            return next(ends)

    query = Query()
    status = run_with_restarts(lambda on_batch: query, watch=ServiceWatch(lambda: answer))
    assert status == 0 and not query.stopped
