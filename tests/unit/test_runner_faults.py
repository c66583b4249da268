"""The runner holds a record it cannot apply, whatever the error, and ends only when the event
publisher gives up (pure unit test: a fake consumer and reconciler; the real loop under real
faults is ``tests/reliability/test_controller_ordinary_faults.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from redis._parsers.base import BaseParser

from controller import loop
from controller.loop import Runner
from infra import metrics
from loadbalance.decisions import UNLOAD, encode_decision, make_decision
from loadbalance.errors import Transient


class _Msg:
    def __init__(self, value: bytes) -> None:
        self._value = value

    def value(self) -> bytes:
        return self._value

    def topic(self) -> str:
        return "decisions"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return 7


class _Consumer:
    def __init__(self) -> None:
        self.seeks: list[int] = []
        self.commits = 0

    def seek(self, tp: Any) -> None:
        self.seeks.append(tp.offset)

    def commit(self, **_: Any) -> None:
        self.commits += 1


class _Reconciler:
    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.recovery = None

    def reconcile(self, *_: Any) -> Any:
        raise self.error


def _runner(error: BaseException) -> tuple[Runner, _Consumer]:
    consumer = _Consumer()
    runner = Runner(consumer, publisher=None, clock=lambda: 0)  # type: ignore[arg-type]
    runner.reconciler = _Reconciler(error)  # type: ignore[assignment]
    return runner, consumer


def _record() -> _Msg:
    d = make_decision(cycle="1", kind=UNLOAD, bundle="a/b/0x00000000_0xffffffff",
                      source_broker="b1", reason="Overloaded")  # fmt: skip
    return _Msg(encode_decision(d))


def _count(kind: str) -> float:
    return metrics.CONTROL_REDIS_FAULTS.labels(kind=kind)._value.get()


@pytest.mark.parametrize(
    "error,kind",
    [
        (BaseParser.parse_error("READONLY You can't write against a read only replica."),
         "readonly"),
        (BaseParser.parse_error("BUSY Redis is busy running a script."), "busy"),
        (BaseParser.parse_error("WRONGTYPE Operation against a key holding the wrong kind"),
         "reply"),
        (KeyError("a bug"), "error"),
    ],
)  # fmt: skip
def test_a_record_that_meets_any_error_is_held_uncommitted_and_counted(
    error: BaseException, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loop, "REDIS_BACKOFF_FIRST_S", 0.0)
    runner, consumer = _runner(error)
    before = _count(kind)
    for _ in range(3):
        runner._process(_record())
    assert consumer.seeks == [7, 7, 7] and consumer.commits == 0
    assert _count(kind) - before == 3 and runner.redis_failures == 3


def test_the_publisher_giving_up_ends_the_loop_uncommitted() -> None:
    runner, consumer = _runner(Transient("Kafka: 3 events undelivered"))
    with pytest.raises(Transient):
        runner._process(_record())
    assert consumer.commits == 0
