"""A shard folded from sample blocks through the rows it keeps per names part
(``ShardState.rows_of_block`` and ``apply_rows``, the state step's path) is the shard folded
from the names (``apply``), column for column, through new bundles, expiry and repeats."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from streaming.shard_state import ShardState, pack_samples, split_samples, unpack_samples

NAMES = [f"acme/ns/0x{i * 0x1000000:08x}_0x{(i + 1) * 0x1000000:08x}" for i in range(16)]
# a few fixed name lists, as brokers repeat theirs; a block is one report of one of them
LISTS = [NAMES[0:5], NAMES[3:9], NAMES[8:16], NAMES[0:1], [NAMES[15], NAMES[2], NAMES[7]]]
_rate = st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False)
_block = st.tuples(st.integers(0, len(LISTS) - 1), st.integers(0, 3), _rate)
_step = st.tuples(st.lists(_block, max_size=8), st.booleans())  # a batch, then expire or not
COLUMNS = ("short_n", "short_avg", "long_n", "long_avg", "last_values", "last_counts",
           "last_seen_ms")  # fmt: skip


def _pack(names: list[str], rate: float) -> bytes:
    m = len(names)
    values = np.array([[rate + i, rate * 2, rate / 3 + i, 1.0] for i in range(m)])
    return pack_samples(names, values, np.tile(np.array([1, 2, 3], dtype=np.int64), (m, 1)))


@settings(max_examples=80, deadline=None)
@given(st.lists(_step, min_size=1, max_size=12))
def test_folding_through_kept_block_rows_equals_folding_names(steps) -> None:
    by_names, by_blocks = ShardState(), ShardState()
    for t, (blocks, expire) in enumerate(steps):
        if blocks:
            raws = [_pack(LISTS[k], rate) for k, _, rate in blocks]
            owners = [f"b{b}" for _, b, _ in blocks for _ in range(1)]
            names, values, counts, owner_list, rows = [], [], [], [], []
            for raw, owner in zip(raws, owners, strict=True):
                n, v, c = unpack_samples(raw)
                names += n
                values.append(v)
                counts.append(c)
                owner_list += [owner] * len(n)
                rows.append(by_blocks.rows_of_block(split_samples(raw)[0]))
            events = np.full(len(names), t * 1000, dtype=np.int64)
            v, c = np.concatenate(values), np.concatenate(counts)
            a = by_names.apply(names, v, c, owner_list, events)
            b = by_blocks.apply_rows(np.concatenate(rows), v, c, owner_list, events)
            assert a.tolist() == b.tolist()
        if expire:
            cut = (t - 1) * 1000
            assert by_names.expire(cut) == by_blocks.expire(cut)
        assert by_blocks.names == by_names.names and by_blocks.owners == by_names.owners
        for col in COLUMNS:
            assert np.array_equal(getattr(by_blocks, col), getattr(by_names, col)), col


def test_a_bundle_is_owned_by_the_reporter_of_its_last_sample() -> None:
    state = ShardState()
    names = [NAMES[0], NAMES[1], NAMES[0], NAMES[2], NAMES[0], NAMES[1]]
    owners = ["b1", "b2", "b3", "b4", "b5", "b6"]
    values = np.ones((len(names), 4))
    touched = state.apply(names, values, np.zeros((len(names), 3), dtype=np.int64), owners,
                          np.arange(len(names), dtype=np.int64))  # fmt: skip
    assert touched.tolist() == [0, 1, 2]
    assert state.owners == ["b5", "b6", "b4"]
    assert state.last_seen_ms.tolist() == [4, 5, 3]
