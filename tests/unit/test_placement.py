"""Placement: Pulsar's strategies, filters and preallocation, as ``selectBrokerForAssignment``."""

from __future__ import annotations

import random
from collections import Counter
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadbalance.bundles import NamespaceBundles
from loadbalance.config import LoadBalancerConfig
from loadbalance.errors import InvalidInput
from loadbalance.model import LocalBrokerData, NamespaceBundleStats, ResourceUsage
from loadbalance.placement.filters import (
    filter_brokers_with_large_topic_count,
    live_candidates,
    remove_most_servicing_brokers_for_namespace,
)
from loadbalance.placement.least_long_term_message_rate import LeastLongTermMessageRate
from loadbalance.placement.least_resource_usage_with_weight import (
    LeastResourceUsageWithWeight,
    LeastResourceUsageWithWeightState,
)
from loadbalance.placement.pipeline import BrokerSelector, make_placement
from loadbalance.placement.round_robin import RoundRobinBrokerSelector, RoundRobinState
from loadbalance.time_average import BundleData, TimeAverageBrokerData, TimeAverageMessageData
from loadbalance.view import BrokerView, ClusterView

NS = "t/ns"
BUNDLES = NamespaceBundles.initial(NS, 64).bundle_names


def make_config(**overrides: Any) -> LoadBalancerConfig:
    """Pulsar's defaults with overrides by attribute name, validated like a real config."""
    return LoadBalancerConfig(**overrides)


def bundle_data(long_term_msg_rate: float, topics: int = 1) -> BundleData:
    half = long_term_msg_rate / 2
    lt = TimeAverageMessageData(1000, 1, 1000.0, 1000.0, half, half)
    st_ = TimeAverageMessageData(10, 1, 1000.0, 1000.0, half, half)
    return BundleData(st_, lt, topics)


def broker(
    name: str,
    *,
    msg_rate: float = 0.0,
    usage_pct: float = 10.0,
    bundles: tuple[str, ...] = (),
    num_topics: int = 0,
    history: float | None = None,
    updated_at_ms: int = 0,
) -> BrokerView:
    report = LocalBrokerData(
        broker=name,
        cpu=ResourceUsage(usage_pct, 100.0),
        msg_rate_in=msg_rate,
        num_topics=num_topics,
        bundles=frozenset(bundles),
        last_stats={b: NamespaceBundleStats(msg_rate_in=1.0, topics=1) for b in bundles},
    )
    ta = TimeAverageBrokerData(long_term_msg_rate_in=msg_rate)
    usage = usage_pct / 100 if history is None else history
    return BrokerView(report, usage, 0.0, ta, updated_at_ms)


def view_of(*brokers: BrokerView, **kw: Any) -> ClusterView:
    return ClusterView(brokers={b.broker: b for b in brokers}, bundle_data=kw.pop("data", {}), **kw)


def selector(view: ClusterView, seed: int = 1, strategy: Any = None, **cfg: Any) -> BrokerSelector:
    return BrokerSelector(
        view, make_config(**cfg), random.Random(seed), strategy or LeastLongTermMessageRate()
    )


# --- LeastLongTermMessageRate and preallocation ----------------------------------------------


def test_preallocation_sends_the_second_new_bundle_to_the_other_broker() -> None:
    """The source document's example, in msg/s: brokers at 100 and 110, two bundles of 20."""
    first, second = BUNDLES[0], BUNDLES[1]
    view = view_of(
        broker("broker-1", msg_rate=100.0),
        broker("broker-2", msg_rate=110.0),
        data={first: bundle_data(20.0), second: bundle_data(20.0)},
    )
    sel = selector(view, load_balancer_distribute_bundles_evenly_enabled=False)
    assert sel.select(first) == "broker-1"
    # broker-1 now scores 100 + 20 = 120 > 110, although its report has not changed
    assert sel.select(second) == "broker-2"
    assert dict(sel.preallocated["broker-1"]) == {first: view.bundle(first)}
    assert set(sel.preallocated["broker-2"]) == {second}


def test_without_preallocation_both_bundles_would_herd_on_one_broker() -> None:
    first, second = BUNDLES[0], BUNDLES[1]
    view = view_of(broker("broker-1", msg_rate=100.0), broker("broker-2", msg_rate=110.0))
    cfg = {"load_balancer_distribute_bundles_evenly_enabled": False}
    assert selector(view, **cfg).select(first) == "broker-1"
    assert selector(view, **cfg).select(second) == "broker-1"


@pytest.mark.parametrize("evenly", [False, True])
def test_one_cycle_of_thirty_equal_bundles_spreads_over_eight_equal_brokers(evenly: bool) -> None:
    view = view_of(*(broker(f"broker-{i}", msg_rate=500.0) for i in range(8)))
    sel = selector(view, seed=7, load_balancer_distribute_bundles_evenly_enabled=evenly)
    counts = Counter(sel.select(b) for b in BUNDLES[:30])
    assert sum(counts.values()) == 30 and len(counts) == 8
    assert max(counts.values()) - min(counts.values()) <= 1


def test_least_long_term_message_rate_skips_brokers_above_85_percent() -> None:
    view = view_of(
        broker("idle-but-hot", msg_rate=0.0, usage_pct=90.0),
        broker("busy-but-cool", msg_rate=5000.0, usage_pct=50.0),
    )
    picks = {selector(view, seed=s).select(BUNDLES[0]) for s in range(20)}
    assert picks == {"busy-but-cool"}


def test_least_long_term_message_rate_picks_randomly_when_all_are_overloaded() -> None:
    view = view_of(
        broker("a", msg_rate=0.0, usage_pct=90.0),
        broker("b", msg_rate=9000.0, usage_pct=95.0),
    )
    strategy = LeastLongTermMessageRate()
    picks = {
        strategy.select_broker(
            ["a", "b"], BUNDLES[0], BundleData.new(), view, {}, make_config(),
            random.Random(s), None,
        )[1]
        for s in range(30)
    }  # fmt: skip
    assert picks == {"a", "b"}


def test_overloaded_choice_after_filters_reruns_on_the_full_set() -> None:
    """The even-spread filter leaves only an overloaded broker; Pulsar retries on all brokers."""
    view = view_of(
        broker("hot", msg_rate=0.0, usage_pct=90.0),
        broker("cool", msg_rate=100.0, usage_pct=10.0, bundles=(BUNDLES[5],)),
    )
    assert selector(view).select(BUNDLES[0]) == "cool"


# --- determinism, exclusion, unknown brokers ---------------------------------------------------


def test_same_seed_gives_the_same_placements_and_seeds_break_ties_differently() -> None:
    view = view_of(*(broker(f"b{i}", msg_rate=10.0) for i in range(4)))

    def run(seed: int) -> list[str | None]:
        sel = selector(view, seed=seed, load_balancer_distribute_bundles_evenly_enabled=False)
        return [sel.select(b) for b in BUNDLES[:6]]

    assert run(3) == run(3)
    assert len({run(s)[0] for s in range(20)}) > 1


@settings(max_examples=60, deadline=None)
@given(
    n_brokers=st.integers(0, 6),
    excluded=st.sets(st.integers(0, 7)),
    picks=st.lists(st.integers(0, 63), min_size=1, max_size=12),
    seed=st.integers(0, 1000),
    strategy=st.sampled_from(
        ["LeastLongTermMessageRate", "LeastResourceUsageWithWeight", "RoundRobinBrokerSelector"]
    ),
)
def test_select_never_returns_an_excluded_or_unknown_broker(
    n_brokers: int, excluded: set[int], picks: list[int], seed: int, strategy: str
) -> None:
    names = [f"b{i}" for i in range(n_brokers)]
    view = view_of(
        *(broker(n, msg_rate=10.0 * i, usage_pct=30.0 + 12 * i) for i, n in enumerate(names)),
        preallocated={"ghost": {BUNDLES[0]: BundleData.new()}, **{n: {} for n in names}},
    )
    exclude = {f"b{i}" for i in excluded}
    sel = selector(view, seed=seed, strategy=make_placement(strategy))
    for p in picks:
        chosen = sel.select(BUNDLES[p], exclude=exclude)
        allowed = set(names) - exclude
        if allowed:
            assert chosen in allowed
        else:
            assert chosen is None
    assert "ghost" not in sel.preallocated


def test_no_broker_means_none() -> None:
    assert selector(view_of()).select(BUNDLES[0]) is None
    view = view_of(broker("only"))
    assert selector(view).select(BUNDLES[0], exclude=["only"]) is None


def test_a_preallocated_bundle_goes_to_the_same_broker_again() -> None:
    view = view_of(broker("a", msg_rate=1.0), broker("b", msg_rate=2.0))
    sel = selector(view)
    assert sel.select(BUNDLES[0]) == "a"
    assert sel.select(BUNDLES[0]) == "a"
    assert sel.select(BUNDLES[0], exclude=["a"]) == "b"  # exclusion wins over preallocation
    assert BUNDLES[0] not in sel.preallocated.get("a", {})


def test_inherited_preallocations_are_pruned_once_reported_or_broker_gone() -> None:
    view = view_of(
        broker("a", bundles=(BUNDLES[0],)),
        broker("b"),
        preallocated={
            "a": {BUNDLES[0]: bundle_data(1.0), BUNDLES[1]: bundle_data(1.0)},
            "gone": {BUNDLES[2]: bundle_data(1.0)},
        },
    )
    sel = selector(view)
    assert {b: set(m) for b, m in sel.preallocated.items()} == {"a": {BUNDLES[1]}}
    assert sel.select(BUNDLES[1]) == "a"  # still preallocated there


def test_brokers_with_stale_reports_are_not_candidates_when_now_is_given() -> None:
    view = view_of(broker("old", updated_at_ms=0), broker("fresh", updated_at_ms=2_000_000))
    sel = BrokerSelector(
        view, make_config(), random.Random(1), LeastLongTermMessageRate(), now_ms=2_000_000
    )
    assert sel.select(BUNDLES[0]) == "fresh"
    assert live_candidates(view) == ["fresh", "old"]


# --- filters -------------------------------------------------------------------------------------


def test_max_topics_filter_counts_preallocated_topics_and_restores_when_all_are_over() -> None:
    view = view_of(broker("a", num_topics=49_990), broker("b", num_topics=100))
    pre = {"b": {BUNDLES[0]: bundle_data(1.0, topics=60_000)}}
    assert filter_brokers_with_large_topic_count(["a", "b"], view, {}, 50_000) == ["a", "b"]
    assert filter_brokers_with_large_topic_count(["a", "b"], view, pre, 50_000) == ["a"]
    assert filter_brokers_with_large_topic_count(["a", "b"], view, {}, 10) == ["a", "b"]


def test_max_topics_filter_applies_in_the_selector() -> None:
    view = view_of(broker("full", num_topics=60_000), broker("roomy", msg_rate=1e6))
    assert selector(view).select(BUNDLES[0]) == "roomy"


def test_distribute_evenly_keeps_brokers_with_fewest_bundles_of_the_namespace() -> None:
    counts = {"a": {NS: 2, "x/y": 0}, "b": {NS: 1}, "c": {"x/y": 5}}
    assert remove_most_servicing_brokers_for_namespace(BUNDLES[0], ["a", "b", "c"], counts) == ["c"]
    assert remove_most_servicing_brokers_for_namespace(BUNDLES[0], ["a", "b"], counts) == ["b"]
    assert remove_most_servicing_brokers_for_namespace(BUNDLES[0], [], counts) == []


def test_distribute_evenly_can_be_switched_off() -> None:
    """PR #16059: with the switch off the message-rate score decides alone."""
    view = view_of(
        broker("light", msg_rate=1.0, bundles=(BUNDLES[1], BUNDLES[2])),
        broker("heavy", msg_rate=1e6),
    )
    assert selector(view).select(BUNDLES[0]) == "heavy"
    off = selector(view, load_balancer_distribute_bundles_evenly_enabled=False)
    assert off.select(BUNDLES[0]) == "light"


# --- LeastResourceUsageWithWeight ----------------------------------------------------------------


def _lruww_picks(usages: list[float], seeds: int = 60) -> set[str | None]:
    """A fresh strategy's picks: each history starts at the broker's reading (cpu ``u``)."""
    brokers = [
        broker(f"b{i}", msg_rate=10.0, usage_pct=u * 100, bundles=(BUNDLES[40 + i],))
        for i, u in enumerate(usages)
    ]
    view = view_of(*brokers)
    names = [b.broker for b in brokers]
    strategy = LeastResourceUsageWithWeight()
    state = strategy.initial_state()
    return {
        strategy.select_broker(
            names, BUNDLES[0], BundleData.new(), view, {}, make_config(), random.Random(s), state
        )[1]
        for s in range(seeds)
    }


def test_least_resource_usage_picks_among_brokers_clearly_below_average() -> None:
    # avg = 0.5; usage + 0.10 <= 0.5 holds for 0.2 and 0.4 only
    assert _lruww_picks([0.2, 0.4, 0.45, 0.8, 0.65]) == {"b0", "b1"}


def test_least_resource_usage_pip364_weakness_random_fallback_can_pick_the_busiest() -> None:
    # 40,40,40,40,69,70: avg 49.8, nobody is 10 points below it, so any broker may be chosen
    picks = _lruww_picks([0.40, 0.40, 0.40, 0.40, 0.69, 0.70])
    assert picks == {f"b{i}" for i in range(6)}


def test_least_resource_usage_uses_the_current_reading_for_a_broker_without_bundles() -> None:
    restarted = broker("restarted", usage_pct=0.0)  # no bundles: its history is ignored
    busy = broker("busy", msg_rate=10.0, usage_pct=60.0, bundles=("x/y/0x00000000_0x80000000",))
    other = broker("other", msg_rate=10.0, usage_pct=60.0, bundles=("x/y/0x80000000_0xffffffff",))
    view = view_of(restarted, busy, other)
    history = {"restarted": 0.9, "busy": 0.6, "other": 0.6}
    state = LeastResourceUsageWithWeightState(MappingProxyType(history))
    sel = BrokerSelector(
        view, make_config(), random.Random(1), LeastResourceUsageWithWeight(), state
    )
    assert sel.select(BUNDLES[0]) == "restarted"
    assert sel.strategy_state == LeastResourceUsageWithWeightState(
        MappingProxyType({"restarted": 0.0, "busy": 0.6, "other": 0.6})
    )


# --- RoundRobinBrokerSelector and the registry ------------------------------------------------


def test_round_robin_rotates_over_sorted_candidates_and_persists_its_counter() -> None:
    view = view_of(broker("c"), broker("a"), broker("b"))
    cfg = {"load_balancer_distribute_bundles_evenly_enabled": False}
    sel = selector(view, strategy=RoundRobinBrokerSelector(), **cfg)
    assert [sel.select(b) for b in BUNDLES[:4]] == ["a", "b", "c", "a"]
    assert sel.strategy_state == RoundRobinState(4)
    nxt = BrokerSelector(
        view,
        make_config(**cfg),
        random.Random(0),
        RoundRobinBrokerSelector(),
        strategy_state=RoundRobinState(4),
    )
    assert nxt.select(BUNDLES[10]) == "b"


def test_make_placement_knows_pulsar_names() -> None:
    assert isinstance(make_placement("LeastLongTermMessageRate"), LeastLongTermMessageRate)
    qualified = "org.apache.pulsar.broker.loadbalance.impl.LeastResourceUsageWithWeight"
    assert isinstance(make_placement(qualified), LeastResourceUsageWithWeight)
    assert isinstance(make_placement("RoundRobinBrokerSelector"), RoundRobinBrokerSelector)
    assert make_placement("LeastProjectedUsage").name == "LeastProjectedUsage"
    with pytest.raises(InvalidInput):
        make_placement("BestBroker")


def test_selector_uses_the_configured_strategy_by_default() -> None:
    view = view_of(broker("a"), broker("b"))
    cfg = make_config()
    sel = BrokerSelector(view, cfg, random.Random(0))
    assert sel.strategy.name == cfg.placement_strategy_name
