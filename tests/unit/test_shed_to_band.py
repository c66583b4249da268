"""ProjectedUsageShedder sheds only what brings the cluster into the balance band.

Every move disconnects the moved bundle's clients, so the plan stops at the band
(``loadBalancerBalancedMaxOverMean`` less the shedder's margin), settles a pair in one move with
the smallest bundle that does it, and leaves alone a broker whose excess is a bundle the cycle is
splitting now (its load leaves with the split). Brokers here have 8 cores and CPU exactly
0.01 % of a core per msg/s, so a bundle of 2,000 msg/s is 0.025 of a broker's usage.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from loadbalance.bundles import NamespaceBundles
from loadbalance.config import LoadBalancerConfig
from loadbalance.cycle import CycleState, step
from loadbalance.decisions import SPLIT, TRANSFER
from loadbalance.model import LocalBrokerData, NamespaceBundleStats, ResourceUsage
from loadbalance.strategies.projected_usage_shedder import ProjectedUsageShedder
from loadbalance.strategies.usage_projection import BundleLoad, UsageModel, Weights
from loadbalance.time_average import BundleData, TimeAverageBrokerData
from loadbalance.view import BrokerView, ClusterView

NOW = 3_600_000
_NAMES = NamespaceBundles.initial("t/ns", 512).bundle_names
_LABELS: dict[str, str] = {}


def B(label: str) -> str:
    """A valid bundle name for a short label, the same one every time."""
    return _LABELS.setdefault(label, _NAMES[len(_LABELS)])


def _broker(name: str, bundles: dict[str, float]) -> BrokerView:
    rate = sum(bundles.values())
    report = LocalBrokerData(
        broker=name,
        cpu=ResourceUsage(rate * 0.01, 800.0),
        bandwidth_in=ResourceUsage(0.0, 1e6),
        bandwidth_out=ResourceUsage(0.0, 1e6),
        msg_rate_in=rate / 2,
        msg_rate_out=rate / 2,
        bundles=frozenset(bundles),
        last_stats={
            b: NamespaceBundleStats(r / 2, r / 2, 0.0, 0.0, topics=2) for b, r in bundles.items()
        },
    )
    return BrokerView(report, 0.0, 0.0, TimeAverageBrokerData(), 0)


def _view(brokers: dict[str, dict[str, float]], recent: dict[str, int] | None = None):
    views = {n: _broker(n, {B(k): r for k, r in b.items()}) for n, b in brokers.items()}
    held = {B(k): t for k, t in (recent or {}).items()}
    return ClusterView(brokers=views, bundle_data={}, recently_unloaded=held)


def _shed(view: ClusterView, **cfg: Any):
    config = LoadBalancerConfig(loadBalancerLoadPlacementStrategy="LeastProjectedUsage").model_copy(
        update=cfg
    )
    shedder = ProjectedUsageShedder()
    return shedder.find_bundles_for_unloading(
        view, config, shedder.initial_state(), now_ms=NOW, cycle="c"
    )[1]


def _after(view: ClusterView, decisions) -> dict[str, float]:
    model = UsageModel(view, Weights())
    for d in decisions:
        b = BundleLoad.of_stats(view.brokers[d.source_broker].report.last_stats[d.bundle])
        model.remove(d.source_broker, b)
        model.add(d.destination_broker, b)
    return {b: model.load(b) for b in model.brokers}


def _hot_and_three() -> ClusterView:
    """``hot`` at 0.40 (32 bundles of 0.0125), three brokers at 0.25 (20 each): mean 0.2875,
    23 bundles a broker."""
    brokers = {"hot": {f"h{i:02d}": 1_000.0 for i in range(32)}}
    for n in ("a", "b", "c"):
        brokers[n] = {f"{n}{i:02d}": 1_000.0 for i in range(20)}
    return _view(brokers)


def test_sheds_into_the_band_and_not_beyond() -> None:
    """Band 1.10 less the 0.04 margin: the busiest may end at 1.06 x mean (0.305), the idlest at
    0.9 x mean (0.259). Eight moves take ``hot`` to 24 bundles (0.30) and lift each other broker
    to 22 or 23; a ninth would only even the cluster further."""
    view = _hot_and_three()
    res = _shed(view)
    assert len(res.decisions) == 8
    assert {d.source_broker for d in res.decisions} == {"hot"}
    after = _after(view, res.decisions)
    mean = sum(after.values()) / len(after)
    assert max(after.values()) / mean <= 1.06 + 1e-9
    assert min(after.values()) / mean >= 0.90 - 1e-9
    assert max(after.values()) / mean > 1.03, "shed past the band: moves that buy nothing"


def test_the_band_is_the_knob() -> None:
    """A tighter band (1.05, so a stop at 1.01 x mean = 0.290) needs the ninth move: 23
    bundles on every broker."""
    view = _hot_and_three()
    res = _shed(view, load_balancer_balanced_max_over_mean=1.05)
    assert len(res.decisions) == 9
    after = _after(view, res.decisions)
    assert max(after.values()) / (sum(after.values()) / len(after)) <= 1.01 + 1e-9


def test_one_move_settles_a_pair_with_the_smallest_bundle_that_does() -> None:
    """``a`` 0.35, ``b`` 0.22, ``c`` and ``d`` 0.30 (mean 0.2925, stop at 0.310 and 0.263).
    Moving ``small`` (0.05) or ``mid`` (0.07) from ``a`` to ``b`` each settle the cluster in one
    move; evening the pair would take ``mid``, the smaller one is the cheaper move."""
    a = {"big": 8_000.0, "mid": 5_600.0, "small": 4_000.0}
    a.update({f"a{i:02d}": 800.0 for i in range(13)})
    view = _view(
        {
            "a": a,
            "b": {f"b{i:02d}": 2_000.0 for i in range(8)} | {"b99": 1_600.0},
            "c": {f"c{i:02d}": 2_000.0 for i in range(12)},
            "d": {f"d{i:02d}": 2_000.0 for i in range(12)},
        }
    )
    loads = _after(view, ())
    assert loads["a"] == pytest.approx(0.35) and loads["b"] == pytest.approx(0.22)
    res = _shed(view)
    assert [(d.bundle, d.source_broker, d.destination_broker) for d in res.decisions] == [
        (B("small"), "a", "b")
    ]


def _splitting(held_at_ms: int) -> ClusterView:
    """``hot`` at 0.60, of which 0.50 is ``HOT``; three brokers at 0.20 (mean 0.30)."""
    hot = {"HOT": 40_000.0} | {f"h{i}": 2_000.0 for i in range(4)}
    brokers = {"hot": hot} | {n: {f"{n}{i}": 2_000.0 for i in range(8)} for n in "abc"}
    return _view(brokers, recent={"HOT": held_at_ms})


def test_no_other_bundle_leaves_a_broker_whose_excess_is_being_split() -> None:
    """The cycle hands the bundles it splits now to the shedder as moved at ``now_ms``. Without
    ``HOT`` its broker would be at 0.10, far inside the band: shedding its four small bundles
    would move load that the split is about to take away."""
    res = _shed(_splitting(NOW))
    assert not [d for d in res.decisions if d.source_broker == "hot"]


def test_a_bundle_in_its_grace_period_is_not_a_split() -> None:
    """The same broker, its hot bundle moved a minute ago (grace period, not a split now): the
    load stays, and the broker sheds its other bundles toward the band."""
    res = _shed(_splitting(NOW - 60_000))
    moved = [d for d in res.decisions if d.source_broker == "hot"]
    assert moved and B("HOT") not in {d.bundle for d in moved}


def test_the_cycle_splits_the_hot_bundle_and_sheds_nothing_else_from_its_broker() -> None:
    """Through ``cycle.step``: ``HOT`` (40,000 msg/s over a long term) is over
    ``loadBalancerNamespaceBundleMaxMsgRate``, so the cycle splits it and our shedder moves
    nothing off its broker; with splitting off, the same cycle sheds the broker's small bundles."""
    view = _splitting(0)
    view = replace(view, recently_unloaded={})
    hot = view.brokers["hot"].report.last_stats[B("HOT")]
    view = replace(view, bundle_data={B("HOT"): BundleData().update(hot)})

    def decide(split: bool):
        config = LoadBalancerConfig(
            loadBalancerLoadSheddingStrategy="ProjectedUsageShedder",
            loadBalancerLoadPlacementStrategy="LeastProjectedUsage",
            loadBalancerAutoBundleSplitEnabled=split,
        )
        return step(CycleState(), view, config, now_ms=NOW, cycle="c")[1].decisions

    with_split = decide(True)
    assert [(d.kind, d.bundle) for d in with_split] == [(SPLIT, B("HOT"))]
    without = decide(False)
    assert without and all(d.kind == TRANSFER and d.source_broker == "hot" for d in without)
