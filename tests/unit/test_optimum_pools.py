"""bench_optimum judges balance per isolation pool, as the shedder and the scoreboard do: a
pool above the band against its own mean needs balancing even when the cluster as a whole is
inside it, and the optimum moves bundles only inside their pool."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from producers.optimum import (
    OPTIMAL,
    BrokerCapacity,
    BundleLoad,
    Snapshot,
    broker_usage,
    max_over_mean,
)
from producers.scoreboard import pooled_max_over_mean

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_optimum import pooled_fewest, split_snapshot

needs_highs = pytest.mark.skipif(
    importlib.util.find_spec("highspy") is None,
    reason="highspy (the 'bench' extra) is not installed: pip install -e '.[bench]'",
)


def _broker(name: str) -> BrokerCapacity:
    """Usage = the sum of its bundles' one resource (no base)."""
    return BrokerCapacity(name, (0.0,), (1.0,))


def _snapshot() -> tuple[Snapshot, dict[str, str]]:
    """Pool ``iso``: i0 0.48, i1 0.36 (1.143 x its mean 0.42); pool ``shared``: s0..s3 at
    0.46. Cluster-wide max/mean 1.075, inside the band; ``iso`` alone is above it. The fewest
    moves: one 0.04 bundle i0 -> i1 (i0 at 1.048 x 0.42), and never to a shared broker."""
    bundles = [
        BundleLoad("iso/a", "i0", (0.40,)),
        BundleLoad("iso/b", "i0", (0.04,)),
        BundleLoad("iso/c", "i0", (0.04,)),
        BundleLoad("iso/d", "i1", (0.36,)),
        *(BundleLoad(f"sh/{i}", f"s{i}", (0.46,)) for i in range(4)),
    ]
    snap = Snapshot(tuple(_broker(b) for b in ("i0", "i1", "s0", "s1", "s2", "s3")), tuple(bundles))
    pools = {"i0": "iso", "i1": "iso", **{f"s{i}": "shared" for i in range(4)}}
    return snap, pools


def test_a_pool_above_its_own_band_needs_balancing_though_the_cluster_is_inside() -> None:
    snap, pools = _snapshot()
    usage = broker_usage(snap)
    assert max_over_mean(usage) <= 1.10 < pooled_max_over_mean(usage, pools)
    parts = split_snapshot(snap, pools)
    assert sorted(len(p.brokers) for p in parts) == [2, 4]
    assert sum(len(p.bundles) for p in parts) == len(snap.bundles)


@needs_highs
def test_the_optimum_balances_each_pool_inside_it() -> None:
    snap, pools = _snapshot()
    plan = pooled_fewest(snap, pools, 1.10, 10.0)
    assert plan.status == OPTIMAL
    assert plan.count == 1
    assert all(pools[d] == "iso" for d in plan.moves.values())
    assert pooled_max_over_mean(broker_usage(snap, plan.moves), pools) <= 1.10
    assert pooled_fewest(snap, {}, 1.10, 10.0).count == 0, "pool-blind: nothing to do"
