"""Where the decision stage's results go: Kafka (decisions, dead letters) and Redis (the view).

Why these shapes:

* ``KafkaSink`` is created on the driver inside ``foreachBatch`` (never shipped to executors)
  and flushes at the end of every batch; a record that cannot be delivered raises ``Transient``,
  which fails the batch before it is marked complete, so Spark retries it and nothing is lost.
  The failed producer purges what it still holds, so only a request the broker already had can
  give a second copy (same id, same content).
* ``RedisProgress`` writes, in ONE ``MULTI`` transaction, the changed part of the load snapshot,
  the cross-cycle ``CycleState``, the job's event-time clock and the id of the completed batch.
  The view, the policy state and the batch id therefore always agree, which is what makes a
  replayed batch exact (see ``streaming.decide``). ``CycleState`` holds frozen dataclasses and
  read-only mappings of the policy modules; it is stored pickled (base64): internal state,
  written and read only by this job, never by anything a user can reach.

Keys (prefix ``P``): ``P:load:brokers`` and ``P:load:shards`` (the snapshot, layout in
``streaming.driver_view`` and ``streaming.snapshot_docs``), ``P:stream:progress`` (hash
``batch``, ``now_ms``, ``cycle_state``, ``cycle_pending``) and ``P:stream:pending`` (hash
``batch``, ``namespaces``: the namespaces a batch's policy cycle reads, kept until that cycle's
decisions are published, so a replay of the cycle reads the same ones).
"""

from __future__ import annotations

import base64
import copyreg
import io
import json
import pickle
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from loadbalance.bundles import NamespaceBundles
from loadbalance.cycle import CycleState
from loadbalance.errors import Transient
from streaming.snapshot_docs import shards_key


class KafkaSink:
    """A producer for decisions and dead letters; ``flush`` raises if anything failed."""

    def __init__(self, bootstrap_servers: str, client_config: Mapping[str, Any] | None = None):
        from confluent_kafka import Producer

        from infra.topics import kafka_client_config

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


@dataclass
class Progress:
    """The last completed batch, the job's event-time clock, and the policy state.

    ``cycle_pending``: the batch's view is committed but the policy cycle it made due has not
    published its decisions yet (``streaming.decide`` runs it after the commit, inside the
    batch or beside the next one). Whoever reads such a progress first completes that cycle,
    over the view committed with the batch, before anything else.
    """

    batch: int = -1
    now_ms: int = 0
    cycle_state: CycleState = field(default_factory=CycleState)
    cycle_pending: bool = False


def namespaces_to_json(namespaces: Mapping[str, NamespaceBundles]) -> str:
    return json.dumps({ns: list(nb.boundaries) for ns, nb in sorted(namespaces.items())})


def namespaces_from_json(text: str | bytes) -> dict[str, NamespaceBundles]:
    return {ns: NamespaceBundles(ns, tuple(b)) for ns, b in json.loads(text).items()}


class RedisProgress:
    """The job's durable progress and the load snapshot, in Redis."""

    def __init__(self, client: Any, prefix: str) -> None:
        self.r = client
        self.p = prefix

    @classmethod
    def from_url(cls, url: str, prefix: str, **kwargs: Any) -> RedisProgress:
        """``kwargs`` go to redis-py beside the URL (ACL user, password, TLS files)."""
        import redis

        return cls(redis.Redis.from_url(url, **kwargs), prefix)

    def read(self) -> Progress:
        doc = self.r.hgetall(f"{self.p}:stream:progress")
        if not doc:
            return Progress()
        return Progress(
            int(doc[b"batch"]),
            int(doc[b"now_ms"]),
            load_cycle_state(doc[b"cycle_state"]),
            doc.get(b"cycle_pending", b"0") == b"1",  # absent in snapshots of older versions
        )

    def read_snapshot(self) -> tuple[dict[str, bytes], dict[str, bytes]]:
        def read(key: str) -> dict[str, bytes]:
            return {k.decode(): v for k, v in self.r.hgetall(key).items()}

        return read(f"{self.p}:load:brokers"), read(shards_key(self.p))

    def pending_namespaces(self, batch: int) -> dict[str, NamespaceBundles] | None:
        doc = self.r.hgetall(f"{self.p}:stream:pending")
        if doc and int(doc[b"batch"]) == batch:
            return namespaces_from_json(doc[b"namespaces"])
        return None

    def set_pending(self, batch: int, namespaces: Mapping[str, NamespaceBundles]) -> None:
        self.r.hset(
            f"{self.p}:stream:pending",
            mapping={"batch": batch, "namespaces": namespaces_to_json(namespaces)},
        )

    def read_namespaces(self) -> dict[str, NamespaceBundles]:
        """Current boundaries, read through the controller's store (one layout, one reader)."""
        from metadata_store.ownership_redis import RedisStore

        store = RedisStore(self.r, self.p)
        out: dict[str, NamespaceBundles] = {}
        for ns in store.list_namespaces():
            nb = store.get_namespace(ns)
            if nb is not None:
                out[ns] = nb
        return out

    def commit(
        self,
        progress: Progress,
        brokers: Mapping[str, str],
        removed_brokers: Iterable[str],
        shards: Mapping[str, bytes],
        removed_shards: Iterable[str],
    ) -> None:
        """Snapshot changes and progress, atomically; the pending record (the namespaces the
        batch's cycle reads) ends here unless that cycle is still to run."""
        pipe = self.r.pipeline(transaction=True)
        bkey, skey = f"{self.p}:load:brokers", shards_key(self.p)
        gone = list(removed_brokers)
        if gone:
            pipe.hdel(bkey, *gone)
        if brokers:
            pipe.hset(bkey, mapping=dict(brokers))
        gone = list(removed_shards)
        if gone:
            pipe.hdel(skey, *gone)
        if shards:
            pipe.hset(skey, mapping=dict(shards))
        self._write_progress(pipe, progress)
        pipe.execute()

    def commit_cycle(self, progress: Progress) -> None:
        """A pending cycle's outcome (its ``CycleState``, ``cycle_pending`` off) and the end of
        the pending record, atomically; the snapshot is the one its batch committed."""
        pipe = self.r.pipeline(transaction=True)
        self._write_progress(pipe, progress)
        pipe.execute()

    def _write_progress(self, pipe: Any, progress: Progress) -> None:
        pipe.hset(
            f"{self.p}:stream:progress",
            mapping={
                "batch": progress.batch,
                "now_ms": progress.now_ms,
                "cycle_state": dump_cycle_state(progress.cycle_state),
                "cycle_pending": int(progress.cycle_pending),
            },
        )
        if not progress.cycle_pending:
            pipe.delete(f"{self.p}:stream:pending")


class MemoryProgress(RedisProgress):
    """Progress kept in this process only (no Redis given): not crash-safe, for local runs."""

    def __init__(self) -> None:
        self._progress = Progress()

    def read(self) -> Progress:
        return self._progress

    def read_snapshot(self) -> tuple[dict[str, bytes], dict[str, bytes]]:
        return {}, {}

    def pending_namespaces(self, batch: int) -> dict[str, NamespaceBundles] | None:
        return None

    def set_pending(self, batch: int, namespaces: Mapping[str, NamespaceBundles]) -> None:
        pass

    def read_namespaces(self) -> dict[str, NamespaceBundles]:
        return {}

    def commit(self, progress: Progress, *_args: Any) -> None:
        self._progress = progress

    def commit_cycle(self, progress: Progress) -> None:
        self._progress = progress
