"""A bundle that changes owner keeps its averages, in the core's fold and in the job's shards.

Averages are keyed by bundle, not by (broker, bundle): the new owner's first report continues
the bundle's history instead of starting from Pulsar's defaults, so placement and shedding see
a moved bundle's real load at once. Both folds must agree to the bit.
"""

from __future__ import annotations

import numpy as np

from loadbalance.model import LocalBrokerData, NamespaceBundleStats
from loadbalance.view import LoadState, UsageWeights, build_view, ingest
from streaming.shard_state import ShardState

BUNDLE = "t/ns/0x00000000_0x80000000"
RATES = [(100.0 + i, 300.0 + i, 1e5 + i, 3e5 + i) for i in range(6)]


def _report(broker: str, i: int) -> LocalBrokerData:
    rin, rout, tin, tout = RATES[i]
    stats = NamespaceBundleStats(rin, rout, tin, tout, topics=3)
    return LocalBrokerData(broker=broker, bundles=frozenset({BUNDLE}), last_stats={BUNDLE: stats})


def test_a_moved_bundle_keeps_its_history_in_the_core_and_in_the_shards() -> None:
    state = LoadState()
    shard = ShardState()
    owners = ["a", "a", "a", "b", "b", "b"]  # moved from a to b after three reports
    for i, owner in enumerate(owners):
        state = ingest(
            state, _report(owner, i), history_percentage=0.9, weights=UsageWeights(),
            received_at_ms=i,
        )  # fmt: skip
        rin, rout, tin, tout = RATES[i]
        values = np.array([[tin, tout, rin, rout]])
        shard.apply([BUNDLE], values, np.array([[3, 0, 0]]), [owner], np.array([i]))
    data = build_view(state).bundle_data[BUNDLE]
    assert data.short_term.num_samples == len(owners), "the move must not restart the history"
    mean_rate = sum(r[0] + r[1] for r in RATES) / len(RATES)
    assert abs(data.short_term.msg_rate - mean_rate) < 1e-9
    i = shard.index_of([BUNDLE])[0]
    assert shard.short_n[i] == len(owners) and shard.owners[i] == "b"
    assert shard.short_avg[i].tolist() == [
        data.short_term.msg_throughput_in,
        data.short_term.msg_throughput_out,
        data.short_term.msg_rate_in,
        data.short_term.msg_rate_out,
    ]
