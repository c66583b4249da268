"""Per-shard bundle averages as arrays, and the vectorised form of Pulsar's update rule.

Why arrays: keying Spark state by individual bundle costs state-server round trips per key and a
Python call per row (too slow for the bundle samples a cluster sends, DESIGN.md §5), so the job
keys bundle state by *shard* (``shard_of(bundle)``) and keeps a whole shard as ONE value-state
blob. Inside a shard the update of ``TimeAverageMessageData`` runs as NumPy operations across
bundles.

The update rule is sequential per bundle (``n = min(n + 1, max)``, ``avg = ((n - 1) * avg +
sample) / n``), so samples are grouped by their rank within their bundle (the first sample of
every bundle in this batch, then the second, ...) and each rank is one vector step. The float
operations are the same as in ``loadbalance.time_average`` in the same order (multiply, add,
divide in float64), so the results are bit-for-bit equal to the pure fold; the tests check that.

Two binary layouts are used here, both versioned by a magic prefix:

* a **sample block** (``pack_samples``): one report's samples for one shard, written by the parse
  stage; names, float64 ``[m, 4]`` rates/throughputs, int64 ``[m, 3]`` counts; private to the job;
* a **shard blob** (``ShardState.to_bytes``): the state of every bundle of a shard, which is the
  load snapshot's published bundle-shard record (``metadata_store.load_snapshot`` owns and
  documents the layout), so the job stores its value state, hands it to the driver and writes it
  to Redis as the same bytes, with no conversion.

Column order of the float arrays is ``STAT_COLUMNS``: msgThroughputIn, msgThroughputOut,
msgRateIn, msgRateOut, the argument order of ``TimeAverageMessageData.update_values``.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, fields

import numpy as np

from loadbalance.time_average import (
    DEFAULT_MESSAGE_RATE,
    DEFAULT_MESSAGE_THROUGHPUT,
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
_DEFAULT_AVG = np.array(
    [
        DEFAULT_MESSAGE_THROUGHPUT,
        DEFAULT_MESSAGE_THROUGHPUT,
        DEFAULT_MESSAGE_RATE,
        DEFAULT_MESSAGE_RATE,
    ]
)
_SAMPLES_MAGIC = b"LBQ1"
_SEP = "\n"  # bundle names and broker ids are printable: a newline never occurs in them


def shard_of(bundle: str, n_shards: int) -> int:
    """Stable shard of a bundle (CRC32 of its name, as Pulsar hashes topics)."""
    return zlib.crc32(bundle.encode()) % n_shards


def _join(names: list[str]) -> bytes:
    return _SEP.join(names).encode()


def _split(raw: bytes) -> list[str]:
    return raw.decode().split(_SEP) if raw else []


def pack_samples(names: list[str], values: np.ndarray, counts: np.ndarray) -> bytes:
    """One report's samples of one shard: names, float64 ``[m, 4]``, int64 ``[m, 3]``."""
    encoded = _join(names)
    head = struct.pack("<4sII", _SAMPLES_MAGIC, len(names), len(encoded))
    return b"".join(
        (
            head,
            encoded,
            np.ascontiguousarray(values, dtype="<f8").tobytes(),
            np.ascontiguousarray(counts, dtype="<i8").tobytes(),
        )
    )


def unpack_samples(raw: bytes) -> tuple[list[str], np.ndarray, np.ndarray]:
    magic, m, names_len = struct.unpack_from("<4sII", raw)
    if magic != _SAMPLES_MAGIC:
        raise ValueError("not a sample block")
    pos = struct.calcsize("<4sII")
    names = _split(raw[pos : pos + names_len])
    pos += names_len
    values = np.frombuffer(raw, dtype="<f8", count=m * 4, offset=pos).reshape(m, 4)
    pos += m * 4 * 8
    counts = np.frombuffer(raw, dtype="<i8", count=m * 3, offset=pos).reshape(m, 3)
    return names, values, counts


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
        self._index = {n: i for i, n in enumerate(self.names)}

    def __len__(self) -> int:
        return len(self.names)

    def index_of(self, names: list[str]) -> np.ndarray:
        """Indices of ``names``, appending bundles never seen with Pulsar's defaults."""
        index = self._index
        fresh = [n for n in dict.fromkeys(names) if n not in index]
        if fresh:
            self._grow(fresh)
        return np.fromiter((index[n] for n in names), dtype=np.int64, count=len(names))

    def _grow(self, fresh: list[str]) -> None:
        k = len(fresh)
        for n in fresh:
            self._index[n] = len(self.names)
            self.names.append(n)
        self.owners.extend([""] * k)
        self.short_n = np.concatenate([self.short_n, np.zeros(k, dtype=np.int64)])
        self.long_n = np.concatenate([self.long_n, np.zeros(k, dtype=np.int64)])
        defaults = np.tile(_DEFAULT_AVG, (k, 1))
        self.short_avg = np.concatenate([self.short_avg, defaults])
        self.long_avg = np.concatenate([self.long_avg, defaults.copy()])
        self.last_values = np.concatenate([self.last_values, np.zeros((k, 4))])
        self.last_counts = np.concatenate([self.last_counts, np.zeros((k, 3), dtype=np.int64)])
        self.last_seen_ms = np.concatenate([self.last_seen_ms, np.zeros(k, dtype=np.int64)])

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
        idx = self.index_of(names)
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
            for i, s in zip(ids.tolist(), sel.tolist(), strict=True):
                self.owners[i] = owners[s]
        return np.unique(idx)

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
        self.__post_init__()
        return dropped

    def to_bytes(self) -> bytes:
        """The shard as a bundle-shard record of the load snapshot."""
        return encode_bundle_shard(self)

    @classmethod
    def from_bytes(cls, raw: bytes) -> ShardState:
        c = decode_bundle_shard(raw)
        return cls(**{f.name: getattr(c, f.name) for f in fields(BundleShard)})


def _step(
    avg: np.ndarray, num: np.ndarray, ids: np.ndarray, sample: np.ndarray, max_samples: int
) -> np.ndarray:
    """One ``TimeAverageMessageData.update`` for the bundles ``ids`` (distinct), in place."""
    n = np.minimum(num[ids] + 1, max_samples)
    avg[ids] = fold_mean(avg[ids], sample, n.astype(np.float64)[:, None])
    return n
