"""TransferShedder (PIP-220): the motivating clusters, the debounce, cool-down, outdated and
missing data, the pair limit, swaps, and transfer-off unloads."""

from __future__ import annotations

import math
from dataclasses import replace
from types import MappingProxyType

import pytest

from loadbalance.decisions import TRANSFER, UNLOAD
from loadbalance.shedding.transfer_shedder import TransferShedderState, top_bundles
from tests.unit.test_shedders import MB, NOW_MS, B, bundle, cluster, once, reasons, run

MOTIVATING = {
    "12-2-1-1": [0.12, 0.02, 0.01, 0.01],  # avg 4 %: ThresholdShedder's trigger is 14 %
    "50x5-0": [0.5] * 5 + [0.0],  # avg 41.7 %: ThresholdShedder's trigger is 51.7 %
}


def motivating(usages: list[float]):
    """Bundles sized so each broker's throughput follows its usage (6 bundles on busy ones)."""
    return cluster(*[B(u, [u * 100 * MB / 6] * 6 if u else [MB, MB]) for u in usages])


@pytest.mark.parametrize("usages", MOTIVATING.values(), ids=MOTIVATING.keys())
def test_threshold_shedder_never_sheds_the_motivating_clusters(usages: list[float]) -> None:
    _, results = run("ThresholdShedder", motivating(usages), 6)
    assert all(r.decisions == () for r in results)


@pytest.mark.parametrize("usages", MOTIVATING.values(), ids=MOTIVATING.keys())
def test_transfer_shedder_moves_load_from_max_to_min_on_the_4th_consecutive_hit(
    usages: list[float],
) -> None:
    view = motivating(usages)
    state, results = run("TransferShedder", view, 4)
    assert [reasons(r) for r in results[:3]] == [["HitCount"]] * 3
    assert all(r.decisions == () for r in results[:3])
    decisions = results[3].decisions
    assert decisions, "threshold 3: the 4th consecutive hit sheds"
    by_load = sorted(view.brokers.values(), key=lambda b: (b.history_usage, b.broker))
    low, high = by_load[0].broker, by_load[-1].broker
    forward = [d for d in decisions if d.source_broker == high]
    assert forward and all(d.destination_broker == low for d in forward)
    assert all(d.kind == TRANSFER and d.destination_broker != d.source_broker for d in decisions)
    assert {d.reason for d in decisions} == {"Underloaded"}  # std < 0.25, the min is starved
    moved = sum(d.inputs["bundleThroughputBytesPerS"] for d in forward)
    back = sum(d.inputs["bundleThroughputBytesPerS"] for d in decisions if d.source_broker == low)
    assert moved - back > 0
    assert state.hit_count == 0, "reset after a decision"
    assert set(state.recent_brokers) == {low, high}


def test_hit_count_threshold_is_hits_greater_than_threshold() -> None:
    view = motivating([0.12, 0.02, 0.01, 0.01])
    _, results = run("TransferShedder", view, 1, loadBalancerSheddingConditionHitCountThreshold=0)
    assert results[0].decisions, "threshold 0: the first hit sheds"
    _, results = run("TransferShedder", view, 3, loadBalancerSheddingConditionHitCountThreshold=2)
    assert [bool(r.decisions) for r in results] == [False, False, True]


def test_a_balanced_cycle_resets_the_hit_count() -> None:
    balanced = cluster(B(0.5, [MB, MB]), B(0.5, [MB, MB]))
    state, results = run("TransferShedder", balanced, state=TransferShedderState(3))
    assert reasons(results[0]) == ["Balanced"] and state.hit_count == 0


def test_after_a_move_the_next_cycle_cools_down_until_both_brokers_report_again() -> None:
    view = motivating([0.12, 0.02, 0.01, 0.01])
    state, results = run("TransferShedder", view, 5)
    assert results[3].decisions
    assert reasons(results[4]) == ["CoolDown"]
    moved_at = NOW_MS + 3 * 60_000
    assert set(state.recent_brokers.values()) == {moved_at}
    # both brokers report 180 s after the move: the cool-down is over and they are forgotten
    later = cluster(
        *[B(u, [u * 100 * MB / 6] * 6, updated_at_ms=moved_at + 180_000) for u in (0.2, 0.2)]
    )
    state, results = run("TransferShedder", later, state=state)
    assert "CoolDown" not in reasons(results[0]) and state.recent_brokers == {}


def test_cool_down_keeps_the_hit_count_and_ignores_outdated_or_departed_brokers() -> None:
    view = motivating([0.12, 0.02, 0.01, 0.01])
    just_moved = TransferShedderState(2, MappingProxyType({"b01": NOW_MS - 1000}))
    state, results = run("TransferShedder", view, state=just_moved)
    assert reasons(results[0]) == ["CoolDown"] and results[0].skips[0].broker == "b01"
    assert state.hit_count == 2
    gone = TransferShedderState(0, MappingProxyType({"b99": NOW_MS - 1000}))
    state, results = run("TransferShedder", view, state=gone)
    assert reasons(results[0]) == ["HitCount"] and state.recent_brokers == {}


def test_outdated_brokers_are_left_out_and_too_few_fresh_ones_stop_the_cycle() -> None:
    old_ms = NOW_MS - 1_801_000  # older than loadBalancerBrokerLoadDataTTLInSeconds = 1800
    view = cluster(B(0.9, [30 * MB] * 3, updated_at_ms=old_ms), B(0.5, [MB, MB]), B(0.1, [MB, MB]))
    res = once("TransferShedder", view, loadBalancerSheddingConditionHitCountThreshold=0)
    assert reasons(res)[0] == "OutDatedData" and res.skips[0].broker == "b00"
    assert all(d.source_broker != "b00" and d.destination_broker != "b00" for d in res.decisions)
    view = cluster(B(0.9, [30 * MB] * 3, updated_at_ms=old_ms), B(0.1, [MB, MB]))
    state, results = run("TransferShedder", view, state=TransferShedderState(2))
    assert reasons(results[0]) == ["OutDatedData", "NoBrokers"] and state.hit_count == 2


def test_missing_load_data_stops_the_cycle() -> None:
    view = cluster(B(0.9, [30 * MB] * 3), B(0.1, [MB, MB]))
    nan = replace(view.brokers["b01"], weighted_max_ema=math.nan)
    res = once("TransferShedder", replace(view, brokers={**view.brokers, "b01": nan}))
    assert reasons(res) == ["NoLoadData"]


def test_a_max_broker_without_bundle_stats_is_passed_over_as_no_load_data() -> None:
    view = cluster(B(0.9, [30 * MB] * 3), B(0.1, [MB, MB]))
    hot = view.brokers["b00"]
    unmeasured = replace(hot, report=replace(hot.report, last_stats=MappingProxyType({})))
    data = {b: d for b, d in view.bundle_data.items() if b not in hot.bundles}
    view = replace(view, brokers={**view.brokers, "b00": unmeasured}, bundle_data=data)
    res = once("TransferShedder", view, loadBalancerSheddingConditionHitCountThreshold=0)
    assert res.decisions == () and reasons(res) == ["NoLoadData", "NoLoadData"]
    assert res.skips[0].broker == "b00"


def test_at_most_n_broker_pairs_per_cycle() -> None:
    usages = [0.9, 0.9, 0.9, 0.1, 0.1, 0.1]
    view = cluster(*[B(u, [u * 10 * MB] * 10) for u in usages])
    knobs = {"loadBalancerSheddingConditionHitCountThreshold": 0}
    pairs = once("TransferShedder", view, loadBalancerMaxNumberOfBrokerSheddingPerCycle=2, **knobs)
    forward = [d for d in pairs.decisions if not d.inputs["swap"]]
    assert {(d.source_broker, d.destination_broker) for d in forward} == {
        ("b02", "b03"),
        ("b01", "b04"),
    }
    three = once("TransferShedder", view, **knobs)
    assert len({d.source_broker for d in three.decisions if not d.inputs["swap"]}) == 3


def test_transfer_disabled_gives_plain_unloads_without_swaps() -> None:
    # offload 110 MB x 0.4 / 0.9 = 48.9 MB: the smaller top bundle (50 MB) already overshoots
    view = cluster(B(0.9, [60 * MB, 50 * MB]), B(0.1, [30 * MB, 10 * MB, 5 * MB, 5 * MB]))
    _, results = run("TransferShedder", view, 4, loadBalancerTransferEnabled=False)
    assert results[3].decisions == () and reasons(results[3])[-1] == "NoBundles"
    view = cluster(B(0.9, [30 * MB] * 3), B(0.1, [5 * MB, 5 * MB]))
    _, results = run("TransferShedder", view, 4, loadBalancerTransferEnabled=False)
    (d,) = results[3].decisions
    assert (d.kind, d.source_broker, d.destination_broker) == (UNLOAD, "b00", None)


def test_a_bundle_that_would_overshoot_is_swapped_against_a_min_broker_bundle() -> None:
    # max 60 + 50 MB at 0.9, min 30 + 10 + 5 + 5 MB at 0.1: offload (0.9 - 0.1) / 2 = 0.4 of
    # load is 110 MB x 0.4 / 0.9 = 48.9 MB. The top bundles are walked smallest first, as
    # Pulsar's TopKBundles stores them: the 50 MB bundle overshoots, so the min broker's
    # bundles go back smallest first (5, 5, 10 MB) until the two sides read 80 / 80 MB
    # (min <= max, 80 < 0.75 x 110): accepted; the 60 MB bundle stays (the last top bundle).
    view = cluster(B(0.9, [60 * MB, 50 * MB]), B(0.1, [30 * MB, 10 * MB, 5 * MB, 5 * MB]))
    res = run("TransferShedder", view, 4)[1][3]
    moves = [
        (d.bundle, d.source_broker, d.destination_broker, d.inputs["swap"]) for d in res.decisions
    ]
    assert moves == [
        (bundle(5), "b01", "b00", True),
        (bundle(4), "b01", "b00", True),
        (bundle(3), "b01", "b00", True),
        (bundle(1), "b00", "b01", False),
    ]


def test_a_swap_never_takes_the_min_brokers_last_bundle() -> None:
    view = cluster(B(0.9, [60 * MB, 50 * MB]), B(0.1, [32 * MB]))
    res = run("TransferShedder", view, 4)[1][3]
    assert res.decisions == () and reasons(res)[-1] == "NoBundles"


def test_max_broker_bundles_are_ranked_by_their_latest_stats_within_the_top_k() -> None:
    # lastStats: bundle 0 is small now, although its short-term average is large
    view = cluster(
        B(0.9, [5 * MB, 20 * MB, 20 * MB, 20 * MB]),
        B(0.1, [MB, MB]),
        short_term={bundle(0): 500 * MB},
    )
    # the two largest (20 MB ties go by name), stored smallest first as Pulsar's TopKBundles
    assert [b for b, _ in top_bundles(view, view.brokers["b00"], 2)] == [bundle(2), bundle(1)]
    assert len(top_bundles(view, view.brokers["b00"], -1)) == 4
    res = once("TransferShedder", view, loadBalancerSheddingConditionHitCountThreshold=0)
    # smallest first by lastStats: the 5 MB bundle moves first (by its 500 MB short-term
    # average it would have been the largest and overshot the 28.9 MB target)
    assert res.decisions[0].bundle == bundle(0)
    with_k2 = once(
        "TransferShedder",
        view,
        loadBalancerSheddingConditionHitCountThreshold=0,
        loadBalancerMaxNumberOfBundlesInBundleLoadReport=2,
    )
    assert [d.bundle for d in with_k2.decisions] == [bundle(2)]
    # a top-K of one bundle cannot be shed from (Pulsar: "Sole namespace bundle")
    res = once(
        "TransferShedder",
        view,
        loadBalancerSheddingConditionHitCountThreshold=0,
        loadBalancerMaxNumberOfBundlesInBundleLoadReport=1,
    )
    assert res.decisions == () and reasons(res) == ["NoBundles", "NoBundles"]


def test_recently_unloaded_bundles_stay_put() -> None:
    view = cluster(
        B(0.9, [30 * MB] * 3), B(0.1, [5 * MB, 5 * MB]), recently={bundle(0): NOW_MS - 60_000}
    )
    res = once("TransferShedder", view, loadBalancerSheddingConditionHitCountThreshold=0)
    assert res.decisions and bundle(0) not in {d.bundle for d in res.decisions}
