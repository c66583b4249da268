"""Applying a shard's delta records: ``BundleShard.merge_all`` against one delta at a time.

A reader of the load snapshot, the state step on a cache miss and the streaming driver's view
before a policy cycle all rebuild a shard from its whole record and the delta records after
it. At a million bundles a shard (31,250 bundles in 32 shards) takes a delta every batch, so a
driver's view decoded once a minute applies about 35 of them. The baseline here is the code
that applied them one at a time (look each name up, write each column, then each owner in a
Python loop), kept in this script; ``merge_all`` looks every name up in one C loop and writes
each row once. Both run in the same process on the same records, alternately, and the figures
are medians of ``time.process_time``; the script checks that both leave the same shard.

Run: ``.venv/bin/python benchmarks/bench_shard_merge.py`` (``--rows``, ``--deltas``,
``--delta-rows``, ``--reps``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from metadata_store.load_snapshot import (
    BundleShard,
    decode_bundle_shard,
    encode_bundle_shard,
)

_COLUMNS = ("short_n", "short_avg", "long_n", "long_avg", "last_values", "last_counts",
            "last_seen_ms")  # fmt: skip


def one_at_a_time(shard: BundleShard, delta: BundleShard) -> np.ndarray:
    """The baseline: how a delta was applied before ``merge_all``."""
    rows = shard.index_of(delta.names)
    for col in _COLUMNS:
        getattr(shard, col)[rows] = getattr(delta, col)
    owners = shard.owners
    for i, owner in zip(rows.tolist(), delta.owners, strict=True):
        owners[i] = owner
    return rows


def record(rng: np.random.Generator, names: list[str]) -> bytes:
    n = len(names)
    return encode_bundle_shard(
        BundleShard(
            names=names,
            owners=[f"broker-{int(b)}:8080" for b in rng.integers(0, 400, n)],
            short_n=rng.integers(0, 10, n),
            short_avg=rng.random((n, 4)) * 1e4,
            long_n=rng.integers(0, 1000, n),
            long_avg=rng.random((n, 4)) * 1e4,
            last_values=rng.random((n, 4)) * 1e4,
            last_counts=rng.integers(0, 100, (n, 3)),
            last_seen_ms=rng.integers(0, 2**40, n),
        )
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=31_250, help="bundles in the shard")
    ap.add_argument("--deltas", type=int, default=35, help="delta records applied")
    ap.add_argument("--delta-rows", type=int, default=1_400, help="bundles in each delta")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    names = [f"tenant-{i % 50}/ns-{i % 997}/0x{i:08x}_0x{i + 1:08x}" for i in range(args.rows)]
    base = record(rng, names)
    deltas = []
    for _ in range(args.deltas):
        rows = np.sort(rng.choice(args.rows, args.delta_rows, replace=False))
        deltas.append(record(rng, [names[r] for r in rows.tolist()]))
    times: dict[str, list[float]] = {"one at a time": [], "merge_all": []}
    for _ in range(args.reps):
        for label in times:
            shard = decode_bundle_shard(base)
            decoded = [decode_bundle_shard(d) for d in deltas]
            started = time.process_time()
            if label == "merge_all":
                shard.merge_all(decoded)
            else:
                for d in decoded:
                    one_at_a_time(shard, d)
            times[label].append((time.process_time() - started) * 1000)
            if label == "merge_all":
                reference = decode_bundle_shard(base)
                for d in [decode_bundle_shard(d) for d in deltas]:
                    one_at_a_time(reference, d)
                assert shard.owners == reference.owners and all(
                    np.array_equal(getattr(shard, c), getattr(reference, c)) for c in _COLUMNS
                ), "merge_all left a different shard"
    base_ms, new_ms = (statistics.median(v) for v in times.values())
    print(
        f"{args.deltas} deltas of {args.delta_rows:,} bundles onto a shard of {args.rows:,} "
        f"(index included), median CPU ms over {args.reps}: one at a time {base_ms:.1f}, "
        f"merge_all {new_ms:.1f}; ratio {new_ms / base_ms:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
