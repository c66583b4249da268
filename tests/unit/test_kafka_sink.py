"""The decision sink's failure names Kafka, its address and the topics, for the restart line."""

from __future__ import annotations

import gc
import socket

import pytest

from loadbalance.errors import Transient
from streaming.sinks import KafkaSink


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_flush_to_an_unreachable_broker_raises_transient_naming_kafka_and_topics():
    bootstrap = f"127.0.0.1:{_closed_port()}"
    sink = KafkaSink(bootstrap, {"message.timeout.ms": 2_000, "log_level": 0})
    sink.send("decisions-x", b"k", b"v")
    sink.send("dead-x", None, b"v")
    with pytest.raises(Transient) as err:
        sink.flush(timeout_s=0.3)
    text = str(err.value)
    assert f"Kafka at {bootstrap}" in text
    assert "2 records to dead-x, decisions-x still undelivered" in text
    with pytest.raises(Transient, match=r"2 delivery errors: .*[Tt]imed out"):
        sink.flush(timeout_s=10)  # the messages' own timeout ends them: errors, not a hang
    del err, sink  # the ExceptionInfo holds flush()'s frame, and so the sink
    gc.collect()  # the producer goes now, not at exit, still calling the closed port
