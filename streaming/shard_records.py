"""Each shard's whole record also kept in a local file, for a worker that has never held it.

Why: Spark hands a shard's state partition to whichever pooled Python worker is free (a
first-in, first-out queue), so after a start each worker meets every shard once without a
copy of its own (``streaming.shard_cache``), and reads the whole record back through the
state server: 60-190 ms of task wall for a shard of 31,000 bundles (6 MB), 32 of them in one
batch at a million bundles, which made the tail of the first live seconds (docs/benchmarks.md,
"Where the tail falls"). The same bytes from a local file, with the shard's few delta records
still read from the store, take under 10 ms.

What makes it safe: a file is named by the shard and the id its whole record was stored under
(the first part of the shard's tag, ``streaming.shard_store.tag``: a fresh random id per whole
write), and it is read only for the tag the store holds now. A file of a write the store rolled
back (a failed batch) names an id no stored tag will carry, so it is never read; the deltas
after the record come from the store as always. The file is written whole to a temporary name
and renamed, so a reader sees all of it or nothing, and a shard's files of older ids are
removed. Any error (no such folder on an executor's host, a full disk) leaves the store's read
in charge: this is a shortcut, never a second source of truth.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path


class LocalRecords:
    """Whole shard records in one local folder, by (shard key, record id)."""

    def __init__(self, root: str) -> None:
        self.root = Path(root)
        self.broken = False  # an error turned it off for this worker

    def _path(self, key: str, record_id: str) -> Path:
        return self.root / f"{key.replace('/', '_')}.{record_id}"

    def put(self, key: str, record_id: str, record: bytes) -> None:
        """Keep ``record`` as ``key``'s whole record ``record_id``; older ones of ``key`` go."""
        if self.broken:
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            final = self._path(key, record_id)
            tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex[:8]}")
            tmp.write_bytes(record)
            os.replace(tmp, final)
            mine = key.replace("/", "_")
            for old in self.root.iterdir():
                # "<key>.<id>": a salted key ("s:1.3") is never taken for another's ("s:1")
                if old.name.rsplit(".", 1)[0] == mine and old.name != final.name:
                    old.unlink(missing_ok=True)
        except OSError:
            self.broken = True

    def get(self, key: str, record_id: str) -> bytes | None:
        """``key``'s whole record ``record_id``, or None when this host has no file of it."""
        if self.broken:
            return None
        try:
            return self._path(key, record_id).read_bytes()
        except FileNotFoundError:
            return None
        except OSError:
            self.broken = True
            return None
