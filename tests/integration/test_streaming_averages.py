"""The streaming job's vectorised shard update against the pure ``TimeAverageMessageData`` fold.

The job keeps a shard of bundles as arrays and applies a batch's samples rank by rank; these
properties say that is the same arithmetic as folding every sample in order with
``loadbalance.time_average`` - bit for bit, through the blob the state store keeps, and with
the parse stage's sample blocks in between.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from loadbalance.model import NamespaceBundleStats
from loadbalance.time_average import BundleData
from streaming.shard_state import ShardState, pack_samples, shard_of, unpack_samples

NAMES = [f"acme/ns/0x{i * 0x1000000:08x}_0x{(i + 1) * 0x1000000:08x}" for i in range(12)]
_rate = st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False)
_sample = st.tuples(st.sampled_from(NAMES), st.tuples(_rate, _rate, _rate, _rate),
                    st.integers(0, 10_000))  # fmt: skip
_batches = st.lists(st.lists(_sample, max_size=40), min_size=1, max_size=25)


def _pure_stats(values: tuple[float, ...], topics: int) -> NamespaceBundleStats:
    thr_in, thr_out, rate_in, rate_out = values
    return NamespaceBundleStats(rate_in, rate_out, thr_in, thr_out, topics, 1, 2)


@settings(max_examples=60, deadline=None)
@given(_batches)
def test_rank_by_rank_update_is_bit_for_bit_the_sequential_fold(batches) -> None:
    state, pure = ShardState(), {}
    for t, batch in enumerate(batches):
        for name, values, topics in batch:
            pure[name] = pure.get(name, BundleData.new()).update(_pure_stats(values, topics))
        if batch:
            block = pack_samples(
                [n for n, _, _ in batch],
                np.array([v for _, v, _ in batch], dtype=np.float64).reshape(-1, 4),
                np.array([(k, 1, 2) for _, _, k in batch], dtype=np.int64).reshape(-1, 3),
            )
            names, values, counts = unpack_samples(block)
            state.apply(names, values, counts, ["b:1"] * len(names), np.full(len(names), t))
        state = ShardState.from_bytes(state.to_bytes())
    assert sorted(state.names) == sorted(pure)
    for i, name in enumerate(state.names):
        data = pure[name]
        for n, avg, ref in (
            (state.short_n[i], state.short_avg[i], data.short_term),
            (state.long_n[i], state.long_avg[i], data.long_term),
        ):
            assert n == ref.num_samples
            expected = [ref.msg_throughput_in, ref.msg_throughput_out, ref.msg_rate_in,
                        ref.msg_rate_out]  # fmt: skip
            assert avg.tolist() == expected
        assert int(state.last_counts[i, 0]) == data.topics


def test_unseen_bundle_starts_from_pulsar_defaults_and_first_sample_replaces_them() -> None:
    state = ShardState()
    idx = state.index_of([NAMES[0]])
    assert state.short_avg[idx[0]].tolist() == [50000.0, 50000.0, 50.0, 50.0]
    state.apply([NAMES[0]], np.array([[1.0, 2.0, 3.0, 4.0]]), np.zeros((1, 3), dtype=np.int64),
                ["b"], np.array([5]))  # fmt: skip
    assert state.short_avg[0].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert state.long_n[0] == 1


def test_bundles_not_seen_for_the_ttl_are_dropped_and_the_rest_kept_intact() -> None:
    state = ShardState()
    for t, name in enumerate(NAMES[:4]):
        state.apply([name], np.full((1, 4), float(t)), np.zeros((1, 3), dtype=np.int64),
                    [f"b{t}"], np.array([t * 1000]))  # fmt: skip
    assert state.expire(older_than_ms=2000) == NAMES[:2]
    again = ShardState.from_bytes(state.to_bytes())
    assert again.names == NAMES[2:4] and again.owners == ["b2", "b3"]
    assert again.short_avg[:, 0].tolist() == [2.0, 3.0]
    assert again.index_of([NAMES[3]]).tolist() == [1]


def test_shard_of_is_stable_and_spreads_bundles() -> None:
    shards = {shard_of(n, 4) for n in NAMES}
    assert shard_of(NAMES[0], 4) == shard_of(NAMES[0], 4)
    assert len(shards) > 1
