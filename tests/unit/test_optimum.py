"""The offline optimizer: its usage model against the simulator's reports, and its integer
program on hand-made snapshots whose fewest moves are worked out in the comments."""

from __future__ import annotations

import importlib.util
import random

import pytest

from loadbalance.model import NamespaceBundleStats
from loadbalance.view import UsageWeights
from producers.optimum import (
    INFEASIBLE,
    OPTIMAL,
    BrokerCapacity,
    BundleLoad,
    Snapshot,
    broker_usage,
    fewest_moves,
    from_reports,
    max_over_mean,
)
from producers.sim_model import BrokerSpec, CostModel, broker_report

needs_highs = pytest.mark.skipif(
    importlib.util.find_spec("highspy") is None,
    reason="highspy (the 'bench' extra) is not installed: pip install -e '.[bench]'",
)


def test_the_model_gives_each_broker_the_usage_its_report_shows() -> None:
    """Same bundles, same hardware: the snapshot's usage equals the report's weighted max, and
    moving a bundle gives the usage the destination would report."""
    cost = CostModel()
    specs = {
        "small": BrokerSpec("small", cores=4, nic_kbytes_per_s=125_000.0),
        "big": BrokerSpec("big", cores=32, nic_kbytes_per_s=3_125_000.0),
    }
    stats = {
        "ns/0x0_0x8": NamespaceBundleStats(2000, 6000, 2e7, 6e7, 12, 40, 5),
        "ns/0x8_0xf": NamespaceBundleStats(500, 500, 1e6, 1e6, 30, 30, 30),
    }
    weights = UsageWeights(1.0, 1.0, 1.0, 1.0, 1.0)
    rng = random.Random(3)
    reports = {
        "small": broker_report(specs["small"], sorted(stats), stats, cost, 0, rng),
        "big": broker_report(specs["big"], [], stats, cost, 0, rng),
    }
    snap = from_reports(reports, specs, cost, weights)
    usage = broker_usage(snap)
    for name, report in reports.items():
        assert usage[name] == pytest.approx(weights.weighted_max(report), rel=1e-9)
    moved = broker_usage(snap, {"ns/0x0_0x8": "big"})
    after = {
        "small": broker_report(specs["small"], ["ns/0x8_0xf"], stats, cost, 0, random.Random(3)),
        "big": broker_report(specs["big"], ["ns/0x0_0x8"], stats, cost, 0, random.Random(3)),
    }
    # Bandwidth out dominates both (no noise in it), so the projection is exact.
    for name, report in after.items():
        assert moved[name] == pytest.approx(weights.weighted_max(report), rel=1e-9)


def _one_resource(owners: dict[str, list[tuple[str, float, float]]], copies: int = 1) -> Snapshot:
    """Brokers whose usage is the sum of their bundles' loads; bundles (name, load, bytes/s).
    ``copies`` > 1 repeats that resource (as bandwidth in and out with one subscription)."""
    brokers = tuple(BrokerCapacity(b, (0.0,) * copies, (1.0,) * copies) for b in owners)
    bundles = tuple(
        BundleLoad(name, b, (load,) * copies, bytes_per_s)
        for b, lst in owners.items()
        for name, load, bytes_per_s in lst
    )
    return Snapshot(brokers, bundles)


@needs_highs
@pytest.mark.parametrize("copies", [1, 2])
def test_fewest_moves_then_fewest_bytes_on_a_hand_made_snapshot(copies: int) -> None:
    # A: 0.3 + 0.2 + 0.1 + 0.1 = 0.7, B: 0.2, C: 0. Mean 0.3, band 1.1 -> every broker <= 0.33.
    # One move cannot do it (a1 out leaves A at 0.4). Two moves: A must shed >= 0.37, so a1 and
    # one more; a1 + a2 leaves 0.5 for B and C, which one broker cannot take without passing
    # 0.33 on B (0.2 + 0.2) or C (0.3 + 0.2). a1 -> C with a3 or a4 -> B both fit, and a4 moves
    # fewer bytes: the optimum is {a1: C, a4: B}.
    snap = _one_resource(
        {
            "A": [("a1", 0.3, 100.0), ("a2", 0.2, 100.0), ("a3", 0.1, 500.0), ("a4", 0.1, 100.0)],
            "B": [("b1", 0.2, 100.0)],
            "C": [],
        },
        copies,
    )
    assert max_over_mean(broker_usage(snap)) == pytest.approx(0.7 / 0.3)
    plan = fewest_moves(snap, 1.1)
    assert plan.status == OPTIMAL
    assert dict(plan.moves) == {"a1": "C", "a4": "B"}
    assert plan.lower_bound == 2 and plan.bytes_per_s == 200.0
    assert max_over_mean(broker_usage(snap, plan.moves)) <= 1.1 + 1e-9


@needs_highs
def test_a_balanced_snapshot_needs_no_move_and_a_lone_giant_cannot_be_balanced() -> None:
    even = _one_resource({"A": [("a", 0.3, 1.0)], "B": [("b", 0.31, 1.0)], "C": [("c", 0.29, 1.0)]})
    plan = fewest_moves(even, 1.1)
    assert (plan.status, plan.count) == (OPTIMAL, 0)
    giant = _one_resource({"A": [("g", 0.9, 1.0)], "B": [], "C": []})
    assert fewest_moves(giant, 1.1).status == INFEASIBLE


@needs_highs
def test_the_band_reads_the_largest_resource_of_each_broker() -> None:
    """Two resources. A = max(0.1 + 0.1, 0.3 + 0.3) = 0.6, B = C = 0.3: mean 0.4, ratio 1.5.
    Reading the first resource only (0.2, 0.3, 0.3: ratio 1.125) would call it balanced within
    1.25. Moving x1 (fewer bytes than x2) to B or C gives 0.3, 0.4, 0.3: ratio 1.2, one move."""
    brokers = tuple(BrokerCapacity(b, (0.0, 0.0), (1.0, 1.0)) for b in ("A", "B", "C"))
    bundles = (
        BundleLoad("x1", "A", (0.1, 0.3), 10.0),
        BundleLoad("x2", "A", (0.1, 0.3), 20.0),
        BundleLoad("y", "B", (0.3, 0.0), 1.0),
        BundleLoad("z", "C", (0.3, 0.0), 1.0),
    )
    snap = Snapshot(brokers, bundles)
    assert broker_usage(snap) == {"A": pytest.approx(0.6), "B": 0.3, "C": 0.3}
    plan = fewest_moves(snap, 1.25)
    assert plan.status == OPTIMAL and set(plan.moves) == {"x1"}
    assert max_over_mean(broker_usage(snap, plan.moves)) == pytest.approx(1.2)
