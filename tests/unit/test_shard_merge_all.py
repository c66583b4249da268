"""``BundleShard.merge_all`` applies a run of delta records in one pass and must leave exactly
what applying them one after another, row by row, leaves: the same names in the same order,
the same values bit for bit, the same owners, and the same rows reported for each delta.

The reference here writes one row at a time in plain Python, so it has no vectorised shortcut
in common with the code under test (repeated names, in one delta or across several, are where
a one-pass write could pick the wrong value).
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from metadata_store.load_snapshot import (
    BundleShard,
    decode_bundle_shard,
    encode_bundle_shard,
    merged_shards,
)
from streaming.shard_state import ShardState

_COLUMNS = ("short_n", "short_avg", "long_n", "long_avg", "last_values", "last_counts",
            "last_seen_ms")  # fmt: skip


def _record(rng: random.Random, names: list[str]) -> BundleShard:
    n = len(names)
    nprng = np.random.default_rng(rng.randrange(2**32))
    return BundleShard(
        names=list(names),
        owners=[rng.choice(["", "b-1:8080", "b-2:8080", "b-3:8080"]) for _ in names],
        short_n=nprng.integers(0, 10, n),
        short_avg=nprng.random((n, 4)),
        long_n=nprng.integers(0, 1000, n),
        long_avg=nprng.random((n, 4)),
        last_values=nprng.random((n, 4)),
        last_counts=nprng.integers(0, 100, (n, 3)),
        last_seen_ms=nprng.integers(0, 2**40, n),
    )


def _reference_merge(shard: BundleShard, delta: BundleShard) -> np.ndarray:
    """One delta, one entry at a time: a held name's row takes the entry's values, a new name
    gets a fresh row (the values ``_grow`` gives) and then the entry's."""
    rows = []
    for i, name in enumerate(delta.names):
        if name not in shard.names:
            shard._grow([name])
        row = shard.names.index(name)
        rows.append(row)
        for col in _COLUMNS:
            getattr(shard, col)[row] = getattr(delta, col)[i]
        shard.owners[row] = delta.owners[i]
    return np.array(rows, dtype=np.int64)


def _same(a: BundleShard, b: BundleShard) -> None:
    assert a.names == b.names
    assert a.owners == b.owners
    for col in _COLUMNS:
        x, y = getattr(a, col), getattr(b, col)
        assert x.dtype == y.dtype and x.shape == y.shape, col
        assert np.array_equal(x.view(np.int64), y.view(np.int64)), col


@pytest.mark.parametrize("seed", range(60))
def test_merge_all_is_the_deltas_applied_one_by_one(seed: int) -> None:
    rng = random.Random(seed)
    pool = [f"t/ns/0x{i:08x}_0x{i + 1:08x}" for i in range(40)]
    base = _record(rng, rng.sample(pool, rng.randint(0, 25)))
    deltas = []
    for _ in range(rng.randint(0, 6)):
        names = [rng.choice(pool) for _ in range(rng.randint(0, 15))]  # repeats on purpose
        deltas.append(_record(rng, names))
    got = decode_bundle_shard(encode_bundle_shard(base))
    want = decode_bundle_shard(encode_bundle_shard(base))
    got_rows = got.merge_all(deltas)
    want_rows = [_reference_merge(want, d) for d in deltas]
    _same(got, want)
    assert len(got_rows) == len(want_rows)
    for g, w in zip(got_rows, want_rows, strict=True):
        assert g.tolist() == w.tolist()
    # the name index still answers for every row, appended ones included
    assert got.index_of(got.names).tolist() == list(range(len(got.names)))


def test_a_later_delta_wins_over_an_earlier_and_repeats_in_one_record_keep_the_last() -> None:
    shard = BundleShard(names=[], owners=[])
    first = _record(random.Random(1), ["a/b/0x00000000_0x80000000"] * 3)
    second = _record(random.Random(2), ["a/b/0x00000000_0x80000000"])
    shard.merge_all([first])
    assert shard.long_n.tolist() == [first.long_n[2]]
    assert shard.owners == [first.owners[2]]
    shard.merge_all([first, second])
    assert shard.long_n.tolist() == [second.long_n[0]]
    assert np.array_equal(shard.short_avg[0], second.short_avg[0])


def test_shard_state_counts_deltas_and_their_rows_and_readers_agree() -> None:
    rng = random.Random(7)
    pool = [f"t/ns/0x{i:08x}_0x{i + 1:08x}" for i in range(30)]
    base = _record(rng, pool[:20])
    deltas = [_record(rng, rng.sample(pool, 8)) for _ in range(4)]
    raw = encode_bundle_shard(base)
    raws = [encode_bundle_shard(d) for d in deltas]
    state = ShardState.from_bytes(raw, raws)
    assert (state.deltas, state.delta_rows, state.stored) == (4, 32, True)
    want = decode_bundle_shard(raw)
    for d in deltas:
        _reference_merge(want, d)
    _same(state, want)
    fields = {"s:0": raw, **{f"s:0+{k}": r for k, r in enumerate(raws, start=1)}}
    _same(merged_shards(fields)["s:0"], want)
