"""The streaming job's durable progress: ``P:stream:progress`` (the last completed batch, the
job's event-time clock and the policy cycle's state) and ``P:stream:pending`` (the namespaces a
batch's policy cycle reads, kept until that cycle's decisions are published, so a replay of the
cycle reads the same ones); formats in ``metadata_store.keys``.

``RedisProgress.commit`` writes, in ONE ``MULTI`` transaction, the changed part of the load
snapshot (``metadata_store.load_snapshot``), the cross-cycle ``CycleState``, the clock and the
id of the completed batch, so the view, the policy state and the batch id always agree, which is
what makes a replayed batch exact (``streaming.decide``).

The cycle state is stored as versioned JSON (``metadata_store.cycle_state``); a document of
another version is refused when read, so a job never continues from a state it misreads.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from loadbalance.bundles import NamespaceBundles
from loadbalance.cycle import CycleState
from metadata_store.cycle_state import CycleStateJson
from metadata_store.keys import Keys
from metadata_store.load_snapshot import LoadSnapshot
from metadata_store.ownership_redis import RedisStore
from metadata_store.placement_state import Preallocations

__all__ = [
    "CycleStateCodec",
    "MemoryProgress",
    "Progress",
    "ProgressStore",
    "RedisProgress",
    "namespaces_from_json",
    "namespaces_to_json",
]


class CycleStateCodec(Protocol):
    """How the policy cycle's state becomes the ``cycle_state`` field and back."""

    def dump(self, state: CycleState) -> str: ...

    def load(self, text: str | bytes) -> CycleState: ...


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


@dataclass(frozen=True)
class PendingCycle:
    """What a batch recorded before committing ``cycle_pending``: the namespaces' boundaries
    and, when the job read them, the registry's live brokers (None: not recorded)."""

    namespaces: dict[str, NamespaceBundles]
    brokers: list[str] | None
    preallocated: dict[str, dict[str, Any]] = field(default_factory=dict)
    """broker -> bundle -> stored document: the lookups' placements its owner had not reported
    yet, whose lease it still held (``RedisProgress.read_preallocated``)."""


class ProgressStore(Protocol):
    """What the streaming job asks of its progress store (Redis, or memory for local runs)."""

    def read(self) -> Progress: ...

    def read_snapshot(self) -> tuple[dict[str, bytes], dict[str, bytes]]: ...

    def pending(self, batch: int) -> PendingCycle | None: ...

    def set_pending(
        self,
        batch: int,
        namespaces: Mapping[str, NamespaceBundles],
        brokers: Iterable[str] | None = None,
        preallocated: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None: ...

    def read_namespaces(self) -> dict[str, NamespaceBundles]: ...

    def read_live_brokers(self) -> list[str]: ...

    def read_preallocated(self, brokers: Iterable[str]) -> dict[str, dict[str, Any]]: ...

    def commit(
        self,
        progress: Progress,
        brokers: Mapping[str, str],
        removed_brokers: Iterable[str],
        shards: Mapping[str, bytes],
        removed_shards: Iterable[str],
    ) -> None: ...

    def commit_cycle(self, progress: Progress) -> None: ...


class RedisProgress:
    """The job's durable progress and the load snapshot, in Redis."""

    def __init__(self, client: Any, prefix: str, *, codec: CycleStateCodec | None = None) -> None:
        self._r = client
        self._prefix = prefix
        self._keys = Keys(prefix)
        self._codec: CycleStateCodec = codec or CycleStateJson()
        self.snapshot = LoadSnapshot(client, prefix)
        # the last state dumped and its text: every batch commits the state, which changes
        # only when a policy cycle runs, and at a million bundles its grace-period list takes
        # tens of ms to write out (the state is a frozen value, so the same object is the
        # same text)
        self._dumped: tuple[CycleState, str] | None = None
        # the state Redis holds as far as this instance knows (read or written by it): a batch
        # without a cycle commits the same state object, and after a cycle that moved 16k
        # bundles its text is 3-7 MB, 35-45 ms of HSET on every batch for nothing
        self._stored: CycleState | None = None

    def close(self) -> None:
        self._r.close()

    # -- what readers other than the job use -------------------------------------------------
    def last_batch(self) -> int | None:
        """The last committed batch id, or None before the first commit."""
        raw = self._r.hget(self._keys.stream_progress(), "batch")
        return None if raw is None else int(raw)

    def batch_and_clock(self) -> tuple[int | None, int | None]:
        """(last committed batch id, the job's event-time clock in ms); None where absent."""
        batch, now_ms = self._r.hmget(self._keys.stream_progress(), "batch", "now_ms")
        return (
            int(batch) if batch is not None else None,
            int(now_ms) if now_ms is not None else None,
        )

    def committed_wall_ms(self) -> int | None:
        """The job's own wall-clock time (ms) when it last committed; None before the first
        commit or from a job that did not record it. Readers judge a stopped job by this: the
        event-time clock follows the reports (a simulator runs it ahead of the wall clock)."""
        raw = self._r.hget(self._keys.stream_progress(), "wall_ms")
        return None if raw is None else int(raw)

    def cycle_pending(self) -> bool:
        """Whether the last committed batch made a policy cycle due that has not published its
        decisions yet (False before the first commit)."""
        return self._r.hget(self._keys.stream_progress(), "cycle_pending") == b"1"

    def forget(self) -> bool:
        """Drop the progress and the pending record (a new checkpoint starts from nothing);
        True if there was any."""
        self._stored = None
        return bool(self._r.delete(self._keys.stream_progress(), self._keys.stream_pending()))

    # -- the job -----------------------------------------------------------------------------
    def read(self) -> Progress:
        doc = self._r.hgetall(self._keys.stream_progress())
        if not doc:
            self._stored = None
            return Progress()
        progress = Progress(
            int(doc[b"batch"]),
            int(doc[b"now_ms"]),
            self._codec.load(doc[b"cycle_state"]),
            doc.get(b"cycle_pending", b"0") == b"1",  # absent in snapshots of older versions
        )
        self._stored = progress.cycle_state
        return progress

    def read_snapshot(self) -> tuple[dict[str, bytes], dict[str, bytes]]:
        """(broker -> JSON document, bundle shard -> record), as the last batch committed them."""
        data = self.snapshot.read()
        return dict(data.brokers_raw), dict(data.shards)

    def pending(self, batch: int) -> PendingCycle | None:
        """Batch ``batch``'s pending-cycle record, read in one round trip; None when the record
        is another batch's (or there is none)."""
        doc = self._r.hgetall(self._keys.stream_pending())
        if not doc or int(doc[b"batch"]) != batch:
            return None
        brokers = doc.get(b"brokers")  # absent when written by a job that did not record them
        preallocated = doc.get(b"preallocated")  # likewise
        return PendingCycle(
            namespaces_from_json(doc[b"namespaces"]),
            None if brokers is None else [str(b) for b in json.loads(brokers)],
            {} if preallocated is None else json.loads(preallocated),
        )

    def set_pending(
        self,
        batch: int,
        namespaces: Mapping[str, NamespaceBundles],
        brokers: Iterable[str] | None = None,
        preallocated: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        mapping: dict[str, Any] = {"batch": batch, "namespaces": namespaces_to_json(namespaces)}
        if brokers is not None:
            mapping["brokers"] = json.dumps(sorted(brokers))
        if preallocated:
            mapping["preallocated"] = json.dumps(preallocated, sort_keys=True)
        # replaced whole: a field of an earlier batch's record must not outlive it
        pipe = self._r.pipeline(transaction=True)
        pipe.delete(self._keys.stream_pending())
        pipe.hset(self._keys.stream_pending(), mapping=mapping)
        pipe.execute()

    def read_namespaces(self) -> dict[str, NamespaceBundles]:
        """Current boundaries, read through the ownership store (one layout, one reader)."""
        store = RedisStore(self._r, self._prefix)
        names = store.list_namespaces()
        return {ns: nb for ns, nb in zip(names, store.read_namespaces(names)) if nb is not None}

    def read_live_brokers(self) -> list[str]:
        """Brokers whose registration is live now, judged by Redis's own clock as the
        controller judges them (the registry is the ownership store's)."""
        return RedisStore(self._r, self._prefix, clock="server").live_brokers(0)

    def read_preallocated(self, brokers: Iterable[str]) -> dict[str, dict[str, Any]]:
        """These brokers' preallocations (broker -> bundle -> document) whose bundle's lease the
        same broker still holds, read as placement reads them (``Preallocations.read``, then
        ``RedisStore.read_leases``).

        For the policy cycle, which projects them (``UsageModel.project_preallocated``): an entry
        whose bundle was unloaded, moved or split before its broker reported it is not a load
        that broker carries. Ended entries are left for placement to delete, which checks the
        placement version (``forget_unless_changed``); a held lease's expiry is not judged here
        (the cycle's clock is the reports' event time, not the leases')."""
        entries = Preallocations(self._r, self._prefix).read(sorted(brokers)).entries
        bundles = sorted({b for docs in entries.values() for b in docs})
        if not bundles:
            return {}
        leases = RedisStore(self._r, self._prefix, clock="server").read_leases(bundles)
        out: dict[str, dict[str, Any]] = {}
        for broker in sorted(entries):
            for bundle, doc in entries[broker].items():
                lease = leases.get(bundle)
                if lease is not None and lease.broker == broker:
                    out.setdefault(broker, {})[bundle] = doc
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
        batch's cycle reads) ends here unless that cycle is still to run. The cycle state is
        written only when it is not the one Redis holds (a batch without a cycle carries the
        last cycle's state object on)."""
        same = progress.cycle_state is self._stored
        state = None if same else self._dump(progress.cycle_state)
        pipe = self._r.pipeline(transaction=True)
        self.snapshot.stage_changes(pipe, brokers, removed_brokers, shards, removed_shards)
        self._write_progress(pipe, progress, state)
        pipe.execute()
        self._stored = progress.cycle_state

    def commit_cycle(self, progress: Progress) -> None:
        """A pending cycle's outcome (its ``CycleState``, ``cycle_pending`` off) and the end of
        the pending record, atomically; the snapshot is the one its batch committed."""
        state = self._dump(progress.cycle_state)
        pipe = self._r.pipeline(transaction=True)
        self._write_progress(pipe, progress, state)
        pipe.execute()
        self._stored = progress.cycle_state

    def _dump(self, state: CycleState) -> str:
        dumped = self._dumped
        if dumped is not None and dumped[0] is state:
            return dumped[1]
        text = self._codec.dump(state)
        self._dumped = (state, text)
        return text

    def _write_progress(self, pipe: Any, progress: Progress, state: str | None) -> None:
        """``state``: the cycle state's text, or None to leave the stored one (the same)."""
        mapping: dict[str, Any] = {
            "batch": progress.batch,
            "now_ms": progress.now_ms,
            "cycle_pending": int(progress.cycle_pending),
            # when, by this process's clock: what "the job's last batch N s ago" is read from
            "wall_ms": int(time.time() * 1000),
        }
        if state is not None:
            mapping["cycle_state"] = state
        pipe.hset(self._keys.stream_progress(), mapping=mapping)
        if not progress.cycle_pending:
            pipe.delete(self._keys.stream_pending())


class MemoryProgress:
    """Progress kept in this process only (no Redis given): not crash-safe, for local runs."""

    def __init__(self) -> None:
        self._progress = Progress()

    def read(self) -> Progress:
        return self._progress

    def read_snapshot(self) -> tuple[dict[str, bytes], dict[str, bytes]]:
        return {}, {}

    def pending(self, batch: int) -> PendingCycle | None:
        return None

    def set_pending(
        self,
        batch: int,
        namespaces: Mapping[str, NamespaceBundles],
        brokers: Iterable[str] | None = None,
        preallocated: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        pass

    def read_namespaces(self) -> dict[str, NamespaceBundles]:
        return {}

    def read_live_brokers(self) -> list[str]:
        return []  # no registry: every reporting broker takes part

    def read_preallocated(self, brokers: Iterable[str]) -> dict[str, dict[str, Any]]:
        return {}  # no lookups without Redis

    def commit(self, progress: Progress, *_args: Any) -> None:
        self._progress = progress

    def commit_cycle(self, progress: Progress) -> None:
        self._progress = progress
