"""The decoded shards: every state shard's records decoded into arrays, the bundle index over
them, and the warm-up that decodes ahead of a policy cycle in a background thread.

Records are decoded only when a cycle (or the warm-up before one) needs them, and then only
what changed since the previous decode: the new deltas applied to a copy of the shard decoded
before, or a new whole record. A shard keeps the values already made for its unchanged rows.

``generation`` numbers the bundle index (bundle -> shard and row): it grows by one each time
the index is replaced (a shard's bundle list changed) and never decreases, so whoever keeps
something per row (``ViewAssembler``) compares generations to know whether rows moved.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

import numpy as np

from loadbalance.model import NamespaceBundleStats
from loadbalance.time_average import (
    NUM_LONG_SAMPLES,
    NUM_SHORT_SAMPLES,
    BundleData,
    TimeAverageMessageData,
)
from metadata_store.load_snapshot import decode_bundle_shard
from streaming.gc_pause import GcPause, lower_thread_priority
from streaming.shard_state import ShardState

log = logging.getLogger("streaming.decoded_shards")

Where = Mapping[str, tuple[str, int]]  # bundle -> (state shard key, row)
Records = Mapping[str, tuple[bytes, tuple[bytes, ...]]]  # shard -> (whole record, its deltas)


class Made:
    """One decoded shard blob and the core's values made from it so far (by row).

    Never changed once a view may read it, except that its caches fill: a changed blob gets a
    new ``Made`` (keeping the cached values of the rows that did not change), so a view taken
    before keeps reading the state it was taken from."""

    __slots__ = ("blob", "data", "deltas", "state", "stats")

    def __init__(
        self,
        blob: bytes,
        state: ShardState,
        deltas: int = 0,
        data: dict[int, BundleData] | None = None,
        stats: dict[int, NamespaceBundleStats] | None = None,
    ) -> None:
        # the whole record decoded, and how many of its delta records are applied
        self.blob, self.state, self.deltas = blob, state, deltas
        self.data: dict[int, BundleData] = data if data is not None else {}
        self.stats: dict[int, NamespaceBundleStats] = stats if stats is not None else {}

    def make(self, rows: list[int]) -> None:
        """The values of ``rows`` not made yet, in one vectorised pass (float columns in
        ``STAT_COLUMNS`` order): the averages here, the last samples by ``make_stats``."""
        todo = [r for r in rows if r not in self.data]
        if not todo:
            return
        st, data = self.state, self.data
        for i, s, sn, lg, ln, topics in zip(
            todo,
            st.short_avg[todo].tolist(),
            st.short_n[todo].tolist(),
            st.long_avg[todo].tolist(),
            st.long_n[todo].tolist(),
            st.last_counts[todo, 0].tolist(),
            strict=True,
        ):
            data[i] = BundleData(
                TimeAverageMessageData(NUM_SHORT_SAMPLES, sn, *s),
                TimeAverageMessageData(NUM_LONG_SAMPLES, ln, *lg),
                topics,
            )
        self.make_stats(todo)

    def make_stats(self, rows: list[int]) -> None:
        """The last samples (``lastStats`` values) of ``rows`` not made yet, without their
        averages: a policy that ranks a broker's bundles by its report (ProjectedUsageShedder
        reads every bundle of each broker it may shed from) needs only these, and the averages
        are two thirds of what ``make`` builds."""
        todo = [r for r in rows if r not in self.stats]
        if not todo:
            return
        stats = self.stats
        for i, la, c in zip(
            todo,
            self.state.last_values[todo].tolist(),
            self.state.last_counts[todo].tolist(),
            strict=True,
        ):
            stats[i] = NamespaceBundleStats(la[2], la[3], la[0], la[1], *c)


def _changed_rows(old: ShardState, new: ShardState) -> np.ndarray:
    """Rows of ``new`` whose values differ from ``old`` (same bundles in the same order), bit
    for bit (so 0.0 and -0.0 differ, as they would in a fresh materialisation)."""

    def differ(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        d = a.view(np.int64) != b.view(np.int64)
        return d.any(axis=1) if d.ndim == 2 else d

    changed = differ(old.short_avg, new.short_avg) | differ(old.long_avg, new.long_avg)
    changed |= differ(old.last_values, new.last_values) | differ(old.last_counts, new.last_counts)
    changed |= (old.short_n != new.short_n) | (old.long_n != new.long_n)
    if old.owners != new.owners:
        changed |= np.array(old.owners, dtype=object) != np.array(new.owners, dtype=object)
    return np.flatnonzero(changed)


def _kept(old: Made, blob: bytes, state: ShardState, deltas: int, changed: np.ndarray) -> Made:
    """A new ``Made`` for ``state`` keeping ``old``'s values of the rows not in ``changed``
    (the rows keep their numbers: a shard only grows at its end between whole records)."""
    drop = set(changed.tolist())
    data = {r: v for r, v in old.data.items() if r not in drop}
    stats = {r: v for r, v in old.stats.items() if r not in drop}
    return Made(blob, state, deltas, data, stats)


class DecodedShards:
    """Each shard's decoded state (``Made``) and the bundle index over them, with the lock that
    a cycle and the warm-up thread decode under. Rows are replaced, never changed, so a view
    taken before keeps reading what it was taken from."""

    def __init__(self, gc: GcPause) -> None:
        self._gc = gc
        self._made: dict[str, Made] = {}
        # bundle -> (shard key, row) in ``_made``; replaced, never changed, when names change
        self._where: dict[str, tuple[str, int]] = {}
        self.generation = 0  # of ``_where``: one more each time it is replaced
        # bundles whose last reporter changed since ``take_moved`` (they may join or leave a
        # broker's lastStats)
        self._moved: set[str] = set()
        self._lock = threading.Lock()
        self._warming: threading.Thread | None = None

    @property
    def made(self) -> Mapping[str, Made]:
        """shard -> its decoded state, as of the last decode."""
        return self._made

    def current(self) -> tuple[dict[str, Made], Where, int]:
        """What a view is taken from: the decoded shards, the index and its generation."""
        with self._lock:
            return dict(self._made), self._where, self.generation

    def take_moved(self) -> set[str]:
        """The bundles whose last reporter changed since the last call; resets them."""
        with self._lock:
            moved, self._moved = self._moved, set()
        return moved

    def decode(self, records: Records) -> None:
        """Decode the records that changed since they were last decoded (see the module
        docstring); the bundle index is replaced when a shard's bundle list changed."""
        with self._lock, self._gc.paused():
            made = self._made
            renamed = False
            for key in sorted(set(made) - set(records)):
                del made[key]
                renamed = True
            for key in sorted(records):
                renamed |= self._decode_shard(key, *records[key])
            if renamed:
                self._where = {
                    name: (key, i)
                    for key in sorted(made)
                    for i, name in enumerate(made[key].state.names)
                }
                self.generation += 1

    def _decode_shard(self, key: str, blob: bytes, deltas: tuple[bytes, ...]) -> bool:
        """Decode one shard's records into ``_made``; whether its bundle list changed."""
        made = self._made
        old = made.get(key)
        # compared by value (an identical object compares in no time; another differs early)
        if old is not None and old.blob == blob and old.deltas <= len(deltas):
            if old.deltas == len(deltas):
                return False
            # the same whole record: apply the new deltas to a copy (a view taken before keeps
            # reading the old state)
            state = old.state.copy()
            written = state.merge_all([decode_bundle_shard(d) for d in deltas[old.deltas :]])
            rows = np.concatenate(written)
            self._note_moved(old.state, state, rows[rows < len(old.state)])
            made[key] = _kept(old, blob, state, len(deltas), rows)
            return len(state) != len(old.state)
        new = ShardState.from_bytes(blob, deltas)
        if old is None or old.state.names != new.names:
            made[key] = Made(blob, new, len(deltas))
            return True
        changed = _changed_rows(old.state, new)
        self._note_moved(old.state, new, changed)
        if len(changed) < len(new):
            made[key] = _kept(old, blob, new, len(deltas), changed)
        else:
            made[key] = Made(blob, new, len(deltas))
        return False

    def _note_moved(self, old: ShardState, new: ShardState, rows: np.ndarray) -> None:
        """Add the bundles of ``rows`` (rows of both, same names) whose last reporter differs."""
        if not len(rows):
            return
        picked = rows.tolist()  # only these rows: a batch changes a small part of a shard
        was = np.array(list(map(old.owners.__getitem__, picked)), dtype=object)
        now = np.array(list(map(new.owners.__getitem__, picked)), dtype=object)
        self._moved.update(new.names[r] for r in rows[was != now].tolist())

    def warm(self, records: Records, after: Callable[[], None]) -> None:
        """Decode ``records`` in a background thread, then run ``after`` there (the assembler
        sums ahead), so that the next cycle decodes only the shards that change in between.
        The view a cycle sees does not depend on it. At most one warm-up runs at a time."""
        if self._warming is not None and self._warming.is_alive():
            return

        def run() -> None:
            lower_thread_priority()
            wall, cpu = time.monotonic(), time.thread_time()
            try:
                self.decode(records)
                after()
            except Exception:  # the cycle decodes again; a warm-up must never fail a batch
                log.warning("view warm-up failed", exc_info=True)
            log.debug(
                "view warm-up of %d shards: %.0f ms, %.0f ms of its CPU",
                len(records),
                (time.monotonic() - wall) * 1000,
                (time.thread_time() - cpu) * 1000,
            )

        self._warming = threading.Thread(target=run, name="view-warm-up", daemon=True)
        self._warming.start()

    def wait_warm(self) -> None:
        """Wait for a warm-up still running (a cycle's view needs it done)."""
        if self._warming is not None:
            self._warming.join()
            self._warming = None
