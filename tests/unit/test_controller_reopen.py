"""A controller whose consumer has not reached Kafka for a while opens a new one.

Why: after a broker was frozen and resumed under load, one consumer's requests kept timing out
for minutes while every new client was answered at once; the controller then waited forever.
"""

from __future__ import annotations

import threading
import time

from controller.loop import REOPEN_AFTER_S, Runner


class _Consumer:
    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()


def _runner() -> tuple[Runner, list[_Consumer]]:
    opened: list[_Consumer] = []

    def reopen() -> _Consumer:
        opened.append(_Consumer(f"new-{len(opened)}"))
        return opened[-1]

    runner = Runner(_Consumer("first"), publisher=None, clock=lambda: 0)  # type: ignore[arg-type]
    runner.reopen = reopen
    return runner, opened


def test_a_consumer_lost_longer_than_the_bound_is_replaced_and_closed() -> None:
    runner, opened = _runner()
    first = runner.consumer
    runner._reopen_if_stuck(REOPEN_AFTER_S + 1)
    assert runner.consumer is opened[0]
    assert first.closed.wait(5), "the stuck consumer was not closed"


def test_no_new_consumer_while_kafka_answers_or_the_loss_is_short() -> None:
    runner, opened = _runner()
    runner._reopen_if_stuck(None)
    runner._reopen_if_stuck(REOPEN_AFTER_S - 1)
    assert opened == [] and runner.consumer.name == "first"


def test_at_most_one_new_consumer_per_bound_while_the_loss_lasts() -> None:
    runner, opened = _runner()
    runner._reopen_if_stuck(REOPEN_AFTER_S + 1)
    runner._reopen_if_stuck(REOPEN_AFTER_S + 2)
    assert len(opened) == 1
    runner._reopened_at = time.monotonic() - REOPEN_AFTER_S - 0.1
    runner._reopen_if_stuck(2 * REOPEN_AFTER_S + 5)
    assert len(opened) == 2 and runner.consumer is opened[1]
