"""The state step's per-worker copies of shard states, lent out one shard at a time.

Why a cache: reading a shard's whole record and its deltas back from the state server is a copy
of hundreds of KB or more, once per shard per batch, and Spark reuses the Python worker across
micro-batches, so each worker keeps the states it wrote (``streaming.state``). A copy is only
right while the store holds what it was written as: the step checks the copy's tag against the
stored one before trusting it, and the cache must never hold a state the store may not have.

That is the discipline this type enforces: a shard's copy is taken *out* of the cache when the
step starts on the shard (``checkout``), so a state being changed is never in the cache, and it
goes back only when the block ends normally *and* the step said, after writing the state, which
state and tag to keep (``Checkout.keep``). A batch that fails half way (an exception, or a
generator closed early) leaves nothing for the shard, and the next batch reads the store.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streaming.shard_state import ShardState

Entry = tuple[str, "ShardState"]
"""(the stored tag the state was written under, the state)."""


class Checkout:
    """One shard lent out of a ``ShardCache``: the copy it held, if any, and what to put back."""

    __slots__ = ("_closed", "_kept", "cached", "key")

    def __init__(self, key: str, cached: Entry | None) -> None:
        self.key = key
        self.cached = cached
        self._kept: Entry | None = None
        self._closed = False

    def keep(self, tag: str, state: ShardState) -> None:
        """Put ``state`` back under ``tag`` when the block ends normally. Call it only once the
        state is written to the store under that tag (or the store already holds it)."""
        if self._closed:
            raise RuntimeError(f"shard {self.key} was returned already; keep() came too late")
        self._kept = (tag, state)


class ShardCache:
    """shard key -> (tag, state), for one Python worker process; see the module docstring."""

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}
        self._out: set[str] = set()

    @contextmanager
    def checkout(self, key: str) -> Iterator[Checkout]:
        """Take ``key``'s copy out for the block; put back what ``keep`` named if the block
        ends normally, nothing otherwise."""
        if key in self._out:
            raise RuntimeError(f"shard {key} is checked out already")
        slot = Checkout(key, self._entries.pop(key, None))
        self._out.add(key)
        try:
            yield slot
        except BaseException:
            slot._kept = None
            raise
        finally:
            self._out.discard(key)
            slot._closed = True
        if slot._kept is not None:
            self._entries[key] = slot._kept

    def peek(self, key: str) -> Entry | None:
        """The copy held for ``key`` (for tests and diagnostics; the step uses ``checkout``)."""
        return self._entries.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every copy (a test starting from a cold worker)."""
        self._entries.clear()


WORKER_SHARD_CACHE = ShardCache()
"""This process's cache: module level, because Spark ships the stateful processor to a worker
pickled with each task, while the worker process lives across micro-batches."""
