"""Where the decision stage's results go: Kafka (decisions, dead letters) and Redis (the view).

Why these shapes:

* ``KafkaSink`` is created on the driver inside ``foreachBatch`` (never shipped to executors)
  and flushes at the end of every batch; a record that cannot be delivered raises ``Transient``,
  which fails the batch before it is marked complete, so Spark retries it and nothing is lost.
  The failed producer purges what it still holds, so only a request the broker already had can
  give a second copy (same id, same content).
* The cross-cycle ``CycleState`` goes to Redis with the job's progress
  (``metadata_store.progress.RedisProgress``) through ``CYCLE_STATE_CODEC``. It holds frozen
  dataclasses and read-only mappings of the policy modules and is stored pickled (base64):
  internal state, written and read only by this job, never by anything a user can reach.
  Unpickling names ``streaming.sinks.read_only``, so that helper stays here.
"""

from __future__ import annotations

import base64
import copyreg
import io
import pickle
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from confluent_kafka import Producer

from infra.topics import kafka_client_config
from loadbalance.cycle import CycleState
from loadbalance.errors import Transient


class KafkaSink:
    """A producer for decisions and dead letters; ``flush`` raises if anything failed."""

    def __init__(self, bootstrap_servers: str, client_config: Mapping[str, Any] | None = None):
        conf = kafka_client_config(bootstrap_servers, client_config)
        conf.setdefault("linger.ms", 5)
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
            self._producer.purge(in_queue=True, in_flight=True, blocking=False)
            self._producer.poll(0)  # serves the purged records' reports ...
            self._errors = []  # ... which are ours, not news
            # the operator reads this in the restart line: say it is Kafka, where, and what
            raise Transient(
                f"Kafka at {self._bootstrap}: {left} records to {', '.join(topics)} still "
                f"undelivered after a {timeout_s:g} s flush, {len(errors)} delivery errors"
                + (f": {'; '.join(errors[:3])}" if errors else "")
            )


def read_only(d: dict) -> MappingProxyType:
    """Unpickling helper: the read-only mapping around ``d``."""
    return MappingProxyType(d)


class _Pickler(pickle.Pickler):
    """``MappingProxyType`` is not picklable; store it as the dict it wraps."""

    dispatch_table = copyreg.dispatch_table.copy()
    dispatch_table[MappingProxyType] = lambda m: (read_only, (dict(m),))


def dump_cycle_state(state: CycleState) -> str:
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(state)
    return base64.b64encode(buf.getvalue()).decode()


def load_cycle_state(text: str | bytes) -> CycleState:
    return pickle.loads(base64.b64decode(text))


class _PickleCodec:
    """The ``CycleStateCodec`` the job stores its cycle state with (``metadata_store.progress``)."""

    def dump(self, state: CycleState) -> str:
        return dump_cycle_state(state)

    def load(self, text: str | bytes) -> CycleState:
        return load_cycle_state(text)


CYCLE_STATE_CODEC = _PickleCodec()
