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


def test_a_failed_flush_names_kafka_and_topics_and_drops_what_the_producer_held():
    bootstrap = f"127.0.0.1:{_closed_port()}"
    sink = KafkaSink(bootstrap, {"message.timeout.ms": 300_000, "log_level": 0})
    sink.send("decisions-x", b"k", b"v")
    sink.send("dead-x", None, b"v")
    with pytest.raises(Transient) as err:
        sink.flush(timeout_s=0.3)
    text = str(err.value)
    assert f"Kafka at {bootstrap}" in text
    assert "2 records to dead-x, decisions-x still undelivered" in text
    # the failed producer is abandoned with its batch: it must not deliver these records
    # later beside the replay's copies, so it holds nothing any more
    assert sink.pending() == 0
    sink.flush(timeout_s=1)  # nothing left, no stale error reports
    del err, sink  # the ExceptionInfo holds flush()'s frame, and so the sink
    gc.collect()  # the producer goes now, not at exit, still calling the closed port


def test_the_decision_stage_keeps_one_producer_and_replaces_it_after_a_failed_batch():
    """A producer per batch cost its connection and producer id before the first decision left
    (about 0.5 s of every deciding batch); a failed batch must still not reuse the producer
    that holds its records."""
    from loadbalance.config import LoadBalancerConfig
    from streaming.decide import DecisionStage

    bootstrap = f"127.0.0.1:{_closed_port()}"
    stage = DecisionStage(LoadBalancerConfig(), bootstrap, client_config={"log_level": 0})
    first = stage._producer()
    assert stage._producer() is first
    first.send("decisions-x", b"k", b"v")

    class FailingBatch:
        def toPandas(self):
            raise RuntimeError("executor lost")

    with pytest.raises(RuntimeError):
        stage(FailingBatch(), 7)
    assert first.pending() == 0  # what the failed batch sent is dropped, not delivered later
    second = stage._producer()
    assert second is not first
    stage.close()
    assert stage._sink is None
    del first, second, stage
    gc.collect()
