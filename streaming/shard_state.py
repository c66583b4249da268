"""Per-shard bundle averages as arrays, and the vectorised form of Pulsar's update rule.

Why arrays: keying Spark state by individual bundle costs state-server round trips per key and a
Python call per row (too slow for the bundle samples a cluster sends), so the job
keys bundle state by *shard* (``shard_of(bundle)``) and keeps a whole shard as one record plus
the delta records of the batches since (``streaming.state``). Inside a shard the update of
``TimeAverageMessageData`` runs as NumPy operations across bundles.

The update rule is sequential per bundle (``n = min(n + 1, max)``, ``avg = ((n - 1) * avg +
sample) / n``), so samples are grouped by their rank within their bundle (the first sample of
every bundle in this batch, then the second, ...) and each rank is one vector step. The float
operations are the same as in ``loadbalance.time_average`` in the same order (multiply, add,
divide in float64), so the results are bit-for-bit equal to the pure fold; the tests check that.

Two binary layouts are used here, both versioned by a magic prefix:

* a **sample block** (``pack_samples``): one report's samples for one shard, written by the parse
  stage; names, float64 ``[m, 4]`` rates/throughputs, int64 ``[m, 3]`` counts; private to the job;
* a **shard record** (``ShardState.to_bytes``): the state of every bundle of a shard, and a
  **delta record** (``ShardState.delta_bytes``) of the bundles one batch changed, both the load
  snapshot's published bundle-shard record (``metadata_store.load_snapshot`` owns and documents
  the layout), so the job stores its state, hands it to the driver and writes it to Redis as the
  same bytes, with no conversion.

Column order of the float arrays is ``STAT_COLUMNS``: msgThroughputIn, msgThroughputOut,
msgRateIn, msgRateOut, the argument order of ``TimeAverageMessageData.update_values``.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, fields

import numpy as np

from loadbalance.time_average import (
    NUM_LONG_SAMPLES,
    NUM_SHORT_SAMPLES,
    fold_mean,
)
from metadata_store.load_snapshot import (
    BundleShard,
    decode_bundle_shard,
    encode_bundle_shard,
    shard_bundle_count,
)

STAT_COLUMNS = ("msg_throughput_in", "msg_throughput_out", "msg_rate_in", "msg_rate_out")
COUNT_COLUMNS = ("topics", "consumer_count", "producer_count")
_SAMPLES_MAGIC = b"LBQ1"
_SEP = "\n"  # bundle names and broker ids are printable: a newline never occurs in them


MAX_DELTAS = 48
"""Delta records a shard keeps at most before the state step writes its whole record again."""

MAX_DELTA_ROWS = 2.5
"""Rows the deltas of a shard hold at most, as a multiple of the shard's rows, before its whole
record is written again."""

COMPACTION_ODDS = 8
"""Once a shard's deltas are due to be folded into a whole record, the record is written in
about one batch in this many (``compaction_due``)."""


def compaction_due(shard: int, rows: int, delta_rows: int, deltas: int, event_ms: int) -> bool:
    """Whether the state step writes a shard's whole record (dropping its deltas) rather than
    appending one more delta, given the shard's rows, the rows and number of its deltas with
    this batch's counted in, and the newest event time of the shard's samples in the batch.

    Why: a delta costs what the batch changed, a whole record what the shard holds; reading the
    state back (a worker that does not have the shard cached, the driver, a reader of the
    snapshot) costs the record plus every delta. So the record is written again once the deltas
    hold about as many rows as it does (1 to 1.875 times, by shard number) or number 16 to 31
    (by shard number): it is then *due*. Every shard receives about the same share of each
    batch's reports, so shards fall due together; a due shard writes its record in the batches
    whose hash of (shard, ``event_ms``) falls on one value in ``COMPACTION_ODDS``, which spreads
    the shards that fell due together over the next batches, and lets their next records fall
    due at different times. Without it, at a million bundles the deltas' count bound made half
    the shards write their 6 MB records in the same batch, every 33 batches, a batch as slow
    as one with a policy cycle. The hash is of the batch's input alone, so a replayed batch
    decides the same. ``MAX_DELTAS`` and ``MAX_DELTA_ROWS`` bound what a due shard may still
    add."""
    if deltas > MAX_DELTAS or delta_rows > rows * MAX_DELTA_ROWS:
        return True
    due = deltas >= 16 + shard % 16 or delta_rows * 8 >= rows * (8 + shard % 8)
    return due and zlib.crc32(f"{shard}:{event_ms}".encode()) % COMPACTION_ODDS == 0


def shard_of(bundle: str, n_shards: int) -> int:
    """Stable shard of a bundle (CRC32 of its name, as Pulsar hashes topics)."""
    return zlib.crc32(bundle.encode()) % n_shards


def _join(names: list[str]) -> bytes:
    return _SEP.join(names).encode()


def _split(raw: bytes) -> list[str]:
    return raw.decode().split(_SEP) if raw else []


def pack_samples(names: list[str], values: np.ndarray, counts: np.ndarray) -> bytes:
    """One report's samples of one shard: names, float64 ``[m, 4]``, int64 ``[m, 3]``."""
    return pack_encoded_samples(samples_names(names), values, counts)


def samples_names(names: list[str]) -> tuple[bytes, int]:
    """The names part of a sample block (``pack_encoded_samples``), which a reader of many
    reports with the same names can keep."""
    encoded = _join(names)
    return struct.pack("<4sII", _SAMPLES_MAGIC, len(names), len(encoded)) + encoded, len(names)


def pack_encoded_samples(
    encoded_names: tuple[bytes, int], values: np.ndarray, counts: np.ndarray
) -> bytes:
    """``pack_samples`` with the names part already made by ``samples_names``."""
    part, m = encoded_names
    if values.shape != (m, 4) or counts.shape != (m, 3):
        raise ValueError(f"{m} names, values {values.shape}, counts {counts.shape}")
    return b"".join(
        (
            part,
            np.ascontiguousarray(values, dtype="<f8").tobytes(),
            np.ascontiguousarray(counts, dtype="<i8").tobytes(),
        )
    )


def unpack_samples(raw: bytes) -> tuple[list[str], np.ndarray, np.ndarray]:
    names_part, values, counts = split_samples(raw)
    return _split(names_part), values, counts


def split_samples(raw: bytes) -> tuple[bytes, np.ndarray, np.ndarray]:
    """A sample block's names part (the names, encoded) and its values and counts."""
    magic, m, names_len = struct.unpack_from("<4sII", raw)
    if magic != _SAMPLES_MAGIC:
        raise ValueError("not a sample block")
    pos = struct.calcsize("<4sII")
    names_part = raw[pos : pos + names_len]
    pos += names_len
    values = np.frombuffer(raw, dtype="<f8", count=m * 4, offset=pos).reshape(m, 4)
    pos += m * 4 * 8
    counts = np.frombuffer(raw, dtype="<i8", count=m * 3, offset=pos).reshape(m, 3)
    return names_part, values, counts


_BLOCK_ROWS_MAX = 4096
"""Names parts a shard keeps the rows of (``ShardState.rows_of_block``): a few per broker
reporting into the shard; each holds its names' encoding and their rows (about 30 bytes per
name)."""


def bundle_count(blob: bytes) -> int:
    """Bundles in a shard blob (``ShardState.to_bytes``), from its header, without decoding."""
    return shard_bundle_count(blob)


@dataclass
class ShardState(BundleShard):
    """Every bundle of one shard: averages, last sample, owner and last-seen event time.

    The columns are the load snapshot's bundle-shard record (``BundleShard``), so the state the
    job keeps and the record it publishes are one layout; this class adds the folding.
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        # how the stored state stands (streaming.state): whether a whole record is stored, and
        # the delta records appended after it and their rows
        self.stored = False
        self.deltas = 0
        self.delta_rows = 0
        self.tag = ""  # the stored tag this state is at (it names the whole record and deltas)
        self._block_rows: dict[bytes, np.ndarray] = {}  # rows_of_block's
        self._block_index: dict[str, int] | None = None

    def apply(
        self,
        names: list[str],
        values: np.ndarray,
        counts: np.ndarray,
        owners: list[str],
        event_ms: np.ndarray,
    ) -> np.ndarray:
        """Fold samples in, in the order given (report order); return the touched indices."""
        if not names:
            return np.zeros(0, dtype=np.int64)
        return self.apply_rows(self.index_of(names), values, counts, owners, event_ms)

    def rows_of_block(self, names_part: bytes) -> np.ndarray:
        """``index_of`` the names of a sample block's names part (``split_samples``).

        Why kept: a broker's report names the same bundles of a shard in every report, so
        the state step meets the same names part about once per report of each broker, and
        decoding the names and looking each one up costs more than the rest of the fold. The
        rows stay right while the name index does (rows are only appended); when the index is
        built anew (``expire`` moves rows), what was kept is dropped."""
        index = self._rows_by_name()
        if self._block_index is not index:
            self._block_rows = {}
            self._block_index = index
        rows = self._block_rows.get(names_part)
        if rows is None:
            rows = self.index_of(_split(names_part))
            if len(self._block_rows) >= _BLOCK_ROWS_MAX:
                self._block_rows.clear()
            self._block_rows[names_part] = rows
        return rows

    def apply_rows(
        self,
        idx: np.ndarray,
        values: np.ndarray,
        counts: np.ndarray,
        owners: list[str],
        event_ms: np.ndarray,
    ) -> np.ndarray:
        """``apply`` with the names' rows already found (``index_of``, ``rows_of_block``)."""
        if not len(idx):
            return np.zeros(0, dtype=np.int64)
        order = np.argsort(idx, kind="stable")
        sorted_idx = idx[order]
        starts = np.r_[True, sorted_idx[1:] != sorted_idx[:-1]]
        group_start = np.maximum.accumulate(np.where(starts, np.arange(len(idx)), 0))
        rank = np.empty(len(idx), dtype=np.int64)
        rank[order] = np.arange(len(idx)) - group_start
        for r in range(int(rank.max()) + 1):
            sel = np.flatnonzero(rank == r)
            ids = idx[sel]
            sample = values[sel]
            self.short_n[ids] = _step(self.short_avg, self.short_n, ids, sample, NUM_SHORT_SAMPLES)
            self.long_n[ids] = _step(self.long_avg, self.long_n, ids, sample, NUM_LONG_SAMPLES)
            self.last_values[ids] = sample
            self.last_counts[ids] = counts[sel]
            self.last_seen_ms[ids] = event_ms[sel]
        # each touched row's owner is the reporter of its last sample
        touched, from_end = np.unique(idx[::-1], return_index=True)
        for i, s in zip(touched.tolist(), (len(idx) - 1 - from_end).tolist(), strict=True):
            self.owners[i] = owners[s]
        return touched

    def expire(self, older_than_ms: int) -> list[str]:
        """Drop bundles whose last sample is older than ``older_than_ms``; return their names."""
        keep = self.last_seen_ms >= older_than_ms
        if keep.all():
            return []
        dropped = [n for n, k in zip(self.names, keep.tolist(), strict=True) if not k]
        kept = np.flatnonzero(keep)
        self.names = [self.names[i] for i in kept.tolist()]
        self.owners = [self.owners[i] for i in kept.tolist()]
        for name in ("short_n", "short_avg", "long_n", "long_avg", "last_values"):
            setattr(self, name, getattr(self, name)[kept])
        self.last_counts = self.last_counts[kept]
        self.last_seen_ms = self.last_seen_ms[kept]
        self._index = None  # rows moved: built again when next needed
        return dropped

    def to_bytes(self) -> bytes:
        """The shard as a bundle-shard record of the load snapshot."""
        return encode_bundle_shard(self)

    def delta_bytes(self, rows: np.ndarray) -> bytes:
        """The record of ``rows`` alone (a delta record of the load snapshot)."""
        return encode_bundle_shard(self.rows(rows))

    @classmethod
    def from_bytes(cls, raw: bytes, deltas: Iterable[bytes] = ()) -> ShardState:
        """The shard of a whole record with its delta records (in order) applied."""
        c = decode_bundle_shard(raw)
        state = cls(**{f.name: getattr(c, f.name) for f in fields(BundleShard)})
        state.add_deltas(deltas)
        state.stored = True
        return state

    def add_deltas(self, raws: Iterable[bytes]) -> None:
        """Apply stored delta records (in order, in one pass) and count them against the whole
        record they follow."""
        written = self.merge_all([decode_bundle_shard(raw) for raw in raws])
        self.delta_rows += sum(len(rows) for rows in written)
        self.deltas += len(written)


def _step(
    avg: np.ndarray, num: np.ndarray, ids: np.ndarray, sample: np.ndarray, max_samples: int
) -> np.ndarray:
    """One ``TimeAverageMessageData.update`` for the bundles ``ids`` (distinct), in place."""
    n = np.minimum(num[ids] + 1, max_samples)
    avg[ids] = fold_mean(avg[ids], sample, n.astype(np.float64)[:, None])
    return n
