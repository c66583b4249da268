"""Where the decision stage's results go: Kafka (decisions, dead letters) and Redis (the view).

Why these shapes:

* ``KafkaSink`` lives on the driver (never shipped to executors), owned by the decision stage
  across batches: a new producer per batch paid its connection and idempotent producer id
  before the first decision left, about 0.5 s of every deciding batch on Apache Kafka. It
  flushes at the end of every batch; a record that cannot be delivered raises ``Transient``,
  which fails the batch before it is marked complete, so Spark retries it and nothing is lost.
  A failed batch's producer purges what it still holds (``discard``) and is replaced, so only a
  request the broker already had can give a second copy (same id, same content).

The view and the cross-cycle ``CycleState`` go to Redis with the job's progress, through
``metadata_store.progress.RedisProgress``, in the formats that package publishes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import Producer

from infra.topics import kafka_client_config
from loadbalance.errors import Transient


class KafkaSink:
    """A producer for decisions and dead letters; ``flush`` raises if anything failed."""

    def __init__(self, bootstrap_servers: str, client_config: Mapping[str, Any] | None = None):
        conf = kafka_client_config(bootstrap_servers, client_config)
        conf.setdefault("linger.ms", 5)
        # every in-sync replica has a decision before it counts as sent, and a retry after a
        # leader change never writes it twice (Kafka's min.insync.replicas needs acks=all)
        conf.setdefault("acks", "all")
        conf.setdefault("enable.idempotence", True)
        conf.setdefault("message.max.bytes", 4 * 1024 * 1024)
        self._producer = Producer(conf)
        self._bootstrap = bootstrap_servers
        self._topics: set[str] = set()
        self._errors: list[str] = []

    def _on_delivery(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self._errors.append(str(err))

    def send(self, topic: str, key: str | bytes | None, value: bytes) -> None:
        self._topics.add(topic)
        while True:
            try:
                self._producer.produce(topic, value=value, key=key, on_delivery=self._on_delivery)
                break
            except BufferError:  # local queue full: let it drain
                self._producer.poll(0.1)
        self._producer.poll(0)

    def pending(self) -> int:
        """Records (and requests) the producer still holds."""
        return len(self._producer)

    def discard(self) -> None:
        """Drop every record still held, undelivered: the batch that sent them failed and is
        replayed with a new producer, whose copies must not meet these ones later."""
        self._producer.purge(in_queue=True, in_flight=True, blocking=False)
        self._producer.poll(0)  # serves the purged records' reports ...
        self._errors = []  # ... which are ours, not news
        self._topics = set()

    def flush(self, timeout_s: float = 30.0) -> None:
        left = self._producer.flush(timeout_s)
        errors, self._errors = self._errors, []
        topics, self._topics = sorted(self._topics), set()
        if left or errors:
            # This producer is abandoned with the failed batch, which is replayed with a new
            # one: drop what it still holds, so it does not deliver (or retry) these records
            # minutes later, beside the replay's copies. A produce request already sent may
            # still be appended by the broker; its copy has the same id and content, which the
            # controller records as a duplicate (the at-least-once case, streaming.decide).
            self.discard()
            # the operator reads this in the restart line: say it is Kafka, where, and what
            raise Transient(
                f"Kafka at {self._bootstrap}: {left} records to {', '.join(topics)} still "
                f"undelivered after a {timeout_s:g} s flush, {len(errors)} delivery errors"
                + (f": {'; '.join(errors[:3])}" if errors else "")
            )
