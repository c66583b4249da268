"""Pulsar's placement-strategy tests restated on this model:
``LeastResourceUsageWithWeightTest`` (``extensions/strategy``) and
``ModularLoadManagerStrategyTest`` (``loadbalance``).

Pulsar keeps a broker's history usage in different places: the extensible strategy reads
``BrokerLoadData.weightedMaxEMA``, which each report updates; the modular strategy keeps its own
map, updated at each ``selectBroker`` call for the candidates. Here the view's
``history_usage`` is folded per report (``loadbalance.view.ingest``), so Pulsar's
"``createBrokerData`` / ``initBrokerData``" is a report and "``updateLoad``" is another one;
a fresh ``BrokerLoadData`` object (a restarted broker) is ``forget_brokers`` then a report. In
both Pulsar tests every selection follows one new reading per candidate, so both fold the same
sequence of readings and expect the same brokers.

Pulsar picks among the best brokers at random; these tests run every selection under 20 seeds
and expect one answer, which holds only when the best set is exactly that broker.
"""

from __future__ import annotations

import random
from types import MappingProxyType
from typing import Any

import pytest

from loadbalance.config import LoadBalancerConfig
from loadbalance.model import LocalBrokerData, ResourceUsage
from loadbalance.placement.least_long_term_message_rate import LeastLongTermMessageRate
from loadbalance.placement.least_resource_usage_with_weight import LeastResourceUsageWithWeight
from loadbalance.placement.round_robin import (
    JAVA_INT_MAX,
    RoundRobinBrokerSelector,
    RoundRobinState,
)
from loadbalance.time_average import BundleData, TimeAverageBrokerData
from loadbalance.view import (
    BrokerView,
    ClusterView,
    LoadState,
    UsageWeights,
    build_view,
    forget_brokers,
    ingest,
)

SEEDS = range(20)
#: ``getContext()`` / ``testLeastResourceUsageWithWeight``'s configuration.
LRUWW_KNOBS: dict[str, Any] = {
    "load_balancer_cpu_resource_weight": 1.0,
    "load_balancer_memory_resource_weight": 0.1,
    "load_balancer_direct_memory_resource_weight": 0.1,
    "load_balancer_bandwidth_in_resource_weight": 1.0,
    "load_balancer_bandwidth_out_resource_weight": 1.0,
    "load_balancer_history_resource_percentage": 0.5,
    "load_balancer_average_resource_usage_difference_threshold_percentage": 5,
}
LRUWW_CONFIG = LoadBalancerConfig(**LRUWW_KNOBS)
WEIGHTS = UsageWeights(1.0, 0.1, 0.1, 1.0, 1.0)


def usage_report(broker: str, usage: float, *, serving: bool = True) -> LocalBrokerData:
    """Pulsar's ``createUsage(usage, 100)``: all five resources at ``usage`` %, a broker that
    serves a bundle and moves messages (``initBrokerData``'s "msgRate and bundle"), or, with
    ``serving=False``, one that serves nothing yet (a restarted broker)."""
    r = ResourceUsage(usage, 100)
    return LocalBrokerData(
        broker=broker,
        cpu=r,
        memory=r,
        direct_memory=r,
        bandwidth_in=r,
        bandwidth_out=r,
        msg_rate_in=100.0 if serving else 0.0,
        msg_rate_out=100.0 if serving else 0.0,
        bundles=frozenset({f"t/{broker}/0x00000000_0xffffffff"}) if serving else frozenset(),
    )


class Brokers:
    """The brokers' load data store: ``push`` is a fresh ``BrokerLoadData`` (Pulsar's
    ``pushAsync(createBrokerData)``), ``update`` one more reading (``updateLoad``)."""

    def __init__(self) -> None:
        self.state = LoadState()

    def push(self, broker: str, usage: float | None, *, serving: bool = True) -> None:
        self.state = forget_brokers(self.state, [broker])
        if usage is not None:
            self.update(broker, usage, serving=serving)

    def update(self, broker: str, usage: float, *, serving: bool = True) -> None:
        self.state = ingest(
            self.state,
            usage_report(broker, usage, serving=serving),
            history_percentage=0.5,
            weights=WEIGHTS,
            received_at_ms=0,
        )

    def view(self) -> ClusterView:
        return build_view(self.state)


def select_all_seeds(
    strategy: Any, candidates: set[str], view: ClusterView, config: LoadBalancerConfig
) -> set[str | None]:
    return {
        strategy.select_broker(
            sorted(candidates),
            "t/ns/0x00000000_0xffffffff",
            BundleData.new(),
            view,
            {},
            config,
            random.Random(seed),
            None,
        )[1]
        for seed in SEEDS
    }


def lruww(candidates: set[str], view: ClusterView) -> set[str | None]:
    return select_all_seeds(LeastResourceUsageWithWeight(), candidates, view, LRUWW_CONFIG)


def history(view: ClusterView) -> dict[str, float]:
    return {b: round(v.history_usage, 6) for b, v in view.brokers.items()}


def setup_context() -> Brokers:
    """``LeastResourceUsageWithWeightTest.setupContext``: brokers 1-4 at 10, 30, 60, 5 %."""
    brokers = Brokers()
    for name, usage in (("1", 10), ("2", 30), ("3", 60), ("4", 5)):
        brokers.push(name, usage)
    return brokers


def test_lruww_select() -> None:
    """LeastResourceUsageWithWeightTest.testSelect (and, the same readings,
    ModularLoadManagerStrategyTest.testLeastResourceUsageWithWeight)."""
    brokers = setup_context()
    candidates = {"1", "2", "3"}
    assert lruww(candidates, brokers.view()) == {"1"}  # 0.1, 0.3, 0.6: avg 0.333

    for name, usage in (("1", 20), ("2", 30), ("3", 50)):
        brokers.push(name, usage)
    assert lruww(candidates, brokers.view()) == {"1"}

    for name, usage in (("1", 30), ("2", 30), ("3", 40)):
        brokers.update(name, usage)
    assert history(brokers.view()) == {"1": 0.25, "2": 0.3, "3": 0.45, "4": 0.05}
    assert lruww(candidates, brokers.view()) == {"1"}

    for name, usage in (("1", 30), ("2", 30), ("3", 40)):
        brokers.update(name, usage)
    assert lruww(candidates, brokers.view()) == {"1"}  # 0.275 + 0.05 <= 0.333

    for name, usage in (("1", 35), ("2", 20), ("3", 45)):
        brokers.update(name, usage)
    assert history(brokers.view()) == {"1": 0.3125, "2": 0.25, "3": 0.4375, "4": 0.05}
    assert lruww(candidates, brokers.view()) == {"2"}

    # A restarted broker is judged on its fresh reading and is the one best broker.
    brokers.update("1", 35)
    brokers.update("2", 20)
    brokers.push("3", 0)
    assert lruww(candidates, brokers.view()) == {"3"}


def test_lruww_restarted_broker_serving_nothing() -> None:
    """ModularLoadManagerStrategyTest.testLeastResourceUsageWithWeight, last step: Pulsar's
    modular strategy keeps the old history of broker 3 but judges a broker with no bundles on
    its current reading; here the history runs on and the empty report decides the same."""
    brokers = setup_context()
    candidates = {"1", "2", "3"}
    for step in ((20, 30, 50), (30, 30, 40), (30, 30, 40), (35, 20, 45)):
        for name, usage in zip(("1", "2", "3"), step, strict=True):
            brokers.update(name, usage)
    brokers.update("1", 35)
    brokers.update("2", 20)
    brokers.update("3", 0, serving=False)
    assert brokers.view().brokers["3"].history_usage > 0.2  # the history alone would not pick it
    assert lruww(candidates, brokers.view()) == {"3"}


def preset_history(**usage: float) -> ClusterView:
    """Brokers whose history usage is set directly (Pulsar writes ``weightedMaxEMA`` /
    ``brokerAvgResourceUsageWithWeight`` by reflection)."""
    views = {}
    for name, value in usage.items():
        report = usage_report(name, value * 100)
        views[name] = BrokerView(report, value, 0.0, TimeAverageBrokerData(), 0)
    return ClusterView(brokers=MappingProxyType(views), bundle_data=MappingProxyType({}))


def test_lruww_arithmetic_exception() -> None:
    """LeastResourceUsageWithWeightTest.testArithmeticException /
    ModularLoadManagerStrategyTest.testLeastResourceUsageWithWeightWithArithmeticException:
    histories 0.1, 0.3, 0.6 (and broker 4 at 0.05, not a candidate): broker 1."""
    view = preset_history(**{"1": 0.1, "2": 0.3, "3": 0.6, "4": 0.05})
    assert lruww({"1", "2", "3"}, view) == {"1"}


def test_lruww_no_load_data_brokers() -> None:
    """LeastResourceUsageWithWeightTest.testNoLoadDataBrokers: brokers without load data are
    left out of the average and of the best set, but not of the random fallback."""
    brokers = setup_context()
    brokers.push("1", 50)
    brokers.push("2", 100)
    brokers.push("3", None)
    brokers.push("4", None)
    candidates = {"1", "2", "5"}
    assert lruww(candidates, brokers.view()) == {"1"}  # avg over 1 and 2 only: 0.75

    brokers.push("1", 100)
    picks = lruww(candidates, brokers.view())
    assert picks <= {"1", "2", "5"} and len(picks) > 1  # none qualifies: at random

    brokers.push("1", None)
    brokers.push("2", None)
    assert lruww(candidates, brokers.view()) == {"1", "2", "5"}


def lltmr_view(rates: dict[str, float], cpu: dict[str, ResourceUsage]) -> ClusterView:
    """``initBrokerData()``: empty readings, a long-term msgRateIn per broker."""
    views = {}
    for name, rate in rates.items():
        report = LocalBrokerData(broker=name, cpu=cpu.get(name, ResourceUsage()))
        ta = TimeAverageBrokerData(long_term_msg_rate_in=rate)
        views[name] = BrokerView(report, 0.0, 0.0, ta, 0)
    return ClusterView(brokers=MappingProxyType(views), bundle_data=MappingProxyType({}))


def test_least_long_term_message_rate() -> None:
    """ModularLoadManagerStrategyTest.testLeastLongTermMessageRate"""
    config = LoadBalancerConfig()
    strategy = LeastLongTermMessageRate()
    rates = {"1": 100.0, "2": 200.0, "3": 300.0}
    view = lltmr_view(rates, {})
    assert select_all_seeds(strategy, set(rates), view, config) == {"1"}
    rates["1"] = 400.0
    assert select_all_seeds(strategy, set(rates), lltmr_view(rates, {}), config) == {"2"}
    overloaded = {"2": ResourceUsage(90, 100)}  # 90 % > 85 %: scored +inf
    view = lltmr_view(rates, overloaded)
    assert select_all_seeds(strategy, set(rates), view, config) == {"3"}


def test_least_long_term_message_rate_all_overloaded() -> None:
    """LeastLongTermMessageRate.selectBroker: when every candidate is overloaded they all tie
    at +inf and one is chosen at random."""
    config = LoadBalancerConfig()
    rates = {"1": 100.0, "2": 200.0, "3": 300.0}
    view = lltmr_view(rates, dict.fromkeys(rates, ResourceUsage(90, 100)))
    assert select_all_seeds(LeastLongTermMessageRate(), set(rates), view, config) == set(rates)


def round_robin(strategy: RoundRobinBrokerSelector, state: RoundRobinState, brokers: list[str]):
    return strategy.select_broker(
        brokers,
        "",
        BundleData.new(),
        preset_history(),
        {},
        LoadBalancerConfig(),
        random.Random(0),
        state,
    )


def test_round_robin_broker_selector() -> None:
    """ModularLoadManagerStrategyTest.testRoundRobinBrokerSelector"""
    strategy = RoundRobinBrokerSelector()
    state = strategy.initial_state()
    state, chosen = round_robin(strategy, state, [])
    assert chosen is None
    n = 3
    i = 0
    for i in range(10):
        state, chosen = round_robin(strategy, state, ["1", "2", "3"])
        assert chosen == str(i % n + 1)
    for i in range(10, 20):
        state, chosen = round_robin(strategy, state, ["2", "3", "1"])
        assert chosen == str(i % n + 1)
    picks = []
    for _ in range(6):
        state, chosen = round_robin(strategy, state, ["1", "2", "4"])
        picks.append(chosen)
    assert picks == ["4", "1", "2", "4", "1", "2"]
    picks = []
    for _ in range(4):
        state, chosen = round_robin(strategy, state, ["2", "4"])
        picks.append(chosen)
    assert picks == ["2", "4", "2", "4"]

    state, chosen = round_robin(strategy, RoundRobinState(JAVA_INT_MAX), ["1", "2", "3"])
    assert chosen == str(JAVA_INT_MAX % n + 1)
    assert state == RoundRobinState(0)  # the counter wraps as Pulsar's AtomicInteger update does


@pytest.mark.parametrize("start", [0, 7])
def test_round_robin_state_survives_a_restart(start: int) -> None:
    """(ours) The counter is the persisted state: a new strategy object continues the rotation."""
    state, first = round_robin(RoundRobinBrokerSelector(), RoundRobinState(start), ["a", "b", "c"])
    _, second = round_robin(RoundRobinBrokerSelector(), state, ["a", "b", "c"])
    assert [first, second] == [["a", "b", "c"][start % 3], ["a", "b", "c"][(start + 1) % 3]]
