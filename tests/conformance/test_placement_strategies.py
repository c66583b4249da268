"""Pulsar's placement-strategy tests restated on this model:
``LeastResourceUsageWithWeightTest`` (``extensions/strategy``) and
``ModularLoadManagerStrategyTest`` (``loadbalance``).

``LeastResourceUsageWithWeight`` is Pulsar's modular strategy: its history map
(``brokerAvgResourceUsageWithWeight``) is the strategy state, and every selection folds each
candidate's current reading into it. Pulsar's "``createBrokerData`` / ``initBrokerData``" and
"``updateLoad``" are a new report of the broker (``Brokers.report``); a broker without load
data is one that is not in the view. The extensible test's strategy reads
``BrokerLoadData.weightedMaxEMA`` instead, folded per report; it selects once after each new
reading, so the modular fold meets the same readings and the same answers are expected.

Pulsar picks among the best brokers at random; these tests run every selection under 20 seeds
from the same state and expect one answer, which holds only when the best set is exactly that
broker (the state a selection leaves does not depend on the seed).
"""

from __future__ import annotations

import random
from types import MappingProxyType
from typing import Any

import pytest

from loadbalance.config import LoadBalancerConfig
from loadbalance.model import LocalBrokerData, ResourceUsage
from loadbalance.placement.least_long_term_message_rate import LeastLongTermMessageRate
from loadbalance.placement.least_resource_usage_with_weight import (
    LeastResourceUsageWithWeight,
    LeastResourceUsageWithWeightState,
)
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
    """The leader's load data (``LoadData.getBrokerData`` / the broker load data store) and the
    strategy with its state: ``report`` is a broker's newest reading (``None``: no load data),
    ``select`` one ``selectBroker`` call."""

    def __init__(self) -> None:
        self.state = LoadState()
        self.strategy = LeastResourceUsageWithWeight()
        self.history = self.strategy.initial_state()

    def report(self, broker: str, usage: float | None, *, serving: bool = True) -> None:
        self.state = forget_brokers(self.state, [broker])
        if usage is not None:
            self.state = ingest(
                self.state,
                usage_report(broker, usage, serving=serving),
                history_percentage=0.5,
                weights=WEIGHTS,
                received_at_ms=0,
            )

    def view(self) -> ClusterView:
        return build_view(self.state)

    def select(self, candidates: set[str]) -> set[str | None]:
        """The brokers one selection may give (over all seeds); the history moves once."""
        self.history, picks = select_all_seeds(
            self.strategy, candidates, self.view(), LRUWW_CONFIG, self.history
        )
        return picks

    def histories(self) -> dict[str, float]:
        """``brokerAvgResourceUsageWithWeight``, rounded."""
        usage = self.history.broker_avg_resource_usage_with_weight
        return {b: round(v, 6) for b, v in usage.items()}


def select_all_seeds(
    strategy: Any,
    candidates: set[str],
    view: ClusterView,
    config: LoadBalancerConfig,
    state: Any = None,
) -> tuple[Any, set[str | None]]:
    """(the state one selection leaves, the brokers it picks under ``SEEDS``)."""
    states, picks = [], set()
    for seed in SEEDS:
        after, chosen = strategy.select_broker(
            sorted(candidates),
            "t/ns/0x00000000_0xffffffff",
            BundleData.new(),
            view,
            {},
            config,
            random.Random(seed),
            state,
        )
        states.append(after)
        picks.add(chosen)
    assert all(s == states[0] for s in states)
    return states[0], picks


def picks_of(
    strategy: Any, candidates: set[str], view: ClusterView, config: LoadBalancerConfig
) -> set[str | None]:
    return select_all_seeds(strategy, candidates, view, config)[1]


def setup_context() -> Brokers:
    """``setupContext`` / the start of ``testLeastResourceUsageWithWeight``: brokers 1-4 at
    10, 30, 60, 5 %."""
    brokers = Brokers()
    for name, usage in (("1", 10), ("2", 30), ("3", 60), ("4", 5)):
        brokers.report(name, usage)
    return brokers


def report_all(brokers: Brokers, usage: tuple[float, float, float]) -> None:
    for name, value in zip(("1", "2", "3"), usage, strict=True):
        brokers.report(name, value)


def test_lruww_folds_its_history_at_every_selection() -> None:
    """ModularLoadManagerStrategyTest.testLeastResourceUsageWithWeight: the strategy's map is
    folded once per ``selectBroker`` call (h = 0.5), whether or not a new reading came in;
    the same readings twice in a row move the history (0.225 -> 0.2625 for broker 1)."""
    brokers = setup_context()
    candidates = {"1", "2", "3"}
    assert brokers.select({"1", "2", "3", "4"}) <= {"1", "4"}  # the map now holds broker 4
    assert brokers.histories() == {"1": 0.1, "2": 0.3, "3": 0.6, "4": 0.05}
    assert brokers.select(candidates) == {"1"}  # 0.1, 0.3, 0.6: avg 0.333

    report_all(brokers, (20, 30, 50))
    assert brokers.select(candidates) == {"1"}
    assert brokers.histories() == {"1": 0.15, "2": 0.3, "3": 0.55, "4": 0.05}

    report_all(brokers, (30, 30, 40))
    assert brokers.select(candidates) == {"1"}
    assert brokers.histories() == {"1": 0.225, "2": 0.3, "3": 0.475, "4": 0.05}

    report_all(brokers, (30, 30, 40))
    assert brokers.select(candidates) == {"1"}  # 0.2625 + 0.05 <= 0.333
    assert brokers.histories() == {"1": 0.2625, "2": 0.3, "3": 0.4375, "4": 0.05}

    report_all(brokers, (35, 20, 45))
    assert brokers.select(candidates) == {"2"}
    assert brokers.histories() == {"1": 0.30625, "2": 0.25, "3": 0.44375, "4": 0.05}

    # "test restart broker can load bundle as one of the best brokers"
    brokers.report("1", 35)
    brokers.report("2", 20)
    brokers.report("3", 0, serving=False)
    assert brokers.select(candidates) == {"3"}
    assert brokers.histories() == {"1": 0.328125, "2": 0.225, "3": 0.0, "4": 0.05}


def test_lruww_select() -> None:
    """LeastResourceUsageWithWeightTest.testSelect (the extensible strategy, on
    ``weightedMaxEMA``): one selection after each new reading, the same brokers."""
    brokers = setup_context()
    candidates = {"1", "2", "3"}
    brokers.select({"1", "2", "3", "4"})
    assert brokers.select(candidates) == {"1"}
    report_all(brokers, (20, 30, 50))
    brokers.report("4", None)  # pushAsync("broker4", null)
    assert brokers.select(candidates) == {"1"}
    for usage, expected in (((30, 30, 40), "1"), ((30, 30, 40), "1"), ((35, 20, 45), "2")):
        report_all(brokers, usage)  # BrokerLoadData.update
        assert brokers.select(candidates) == {expected}
    assert "4" not in brokers.histories()  # onActiveBrokersChange: gone brokers leave the map


def test_lruww_repeated_selections_without_a_report_move_the_history() -> None:
    """(the per-selection fold, ``updateAndGetMaxResourceUsageWithWeight``) Broker a's history
    is 0 and its reading 40 %, b and c steady at 30 %: the first selection folds a to 0.2, the
    only broker 0.05 below the average; the second, over the same reports, folds it to 0.3,
    level with the others, so none qualifies and any broker may be chosen."""
    brokers = Brokers()
    for name, usage in (("a", 40), ("b", 30), ("c", 30)):
        brokers.report(name, usage)
    brokers.history = LeastResourceUsageWithWeightState(
        MappingProxyType({"a": 0.0, "b": 0.3, "c": 0.3})
    )
    assert brokers.select({"a", "b", "c"}) == {"a"}
    assert brokers.histories()["a"] == 0.2
    assert brokers.select({"a", "b", "c"}) == {"a", "b", "c"}
    assert brokers.histories()["a"] == 0.3


def test_lruww_reading_includes_signals_above_100_percent() -> None:
    """``LocalBrokerData.getMaxResourceUsageWithWeight`` (what the strategy folds) keeps a
    reading above its limit: a broker at 150 % CPU is the busiest, not an idle one."""
    brokers = Brokers()
    saturated = LocalBrokerData(
        broker="hot",
        cpu=ResourceUsage(150, 100),
        bandwidth_in=ResourceUsage(10, 100),
        msg_rate_in=100.0,
        bundles=frozenset({"t/hot/0x00000000_0xffffffff"}),
    )
    brokers.state = ingest(
        brokers.state, saturated, history_percentage=0.5, weights=WEIGHTS, received_at_ms=0
    )
    brokers.report("a", 40)
    brokers.report("b", 40)
    assert brokers.select({"hot", "a", "b"}) == {"a", "b"}
    assert brokers.histories()["hot"] == 1.5


def reporting(**usage: float) -> ClusterView:
    """Brokers reporting ``usage`` (a fraction) on every resource."""
    views = {}
    for name, value in usage.items():
        report = usage_report(name, value * 100)
        views[name] = BrokerView(report, value, 0.0, TimeAverageBrokerData(), 0)
    return ClusterView(brokers=MappingProxyType(views), bundle_data=MappingProxyType({}))


def test_lruww_arithmetic_exception() -> None:
    """LeastResourceUsageWithWeightTest.testArithmeticException /
    ModularLoadManagerStrategyTest.testLeastResourceUsageWithWeightWithArithmeticException:
    histories 0.1, 0.3 (and broker 4 at 0.05, not a candidate), broker 3 not in the map and
    reading 60 %: broker 1."""
    view = reporting(**{"1": 0.1, "2": 0.3, "3": 0.6, "4": 0.05})
    # set directly, as Pulsar writes brokerAvgResourceUsageWithWeight by reflection
    state = LeastResourceUsageWithWeightState(MappingProxyType({"1": 0.1, "2": 0.3, "4": 0.05}))
    strategy = LeastResourceUsageWithWeight()
    after, picks = select_all_seeds(strategy, {"1", "2", "3"}, view, LRUWW_CONFIG, state)
    assert picks == {"1"}
    assert dict(after.broker_avg_resource_usage_with_weight) == {
        "1": 0.1,
        "2": 0.3,
        "3": 0.6,
        "4": 0.05,
    }


def test_lruww_no_load_data_brokers() -> None:
    """LeastResourceUsageWithWeightTest.testNoLoadDataBrokers: brokers without load data are
    left out of the average and of the best set, but not of the random fallback."""
    brokers = setup_context()
    brokers.report("1", 50)
    brokers.report("2", 100)
    brokers.report("3", None)
    brokers.report("4", None)
    candidates = {"1", "2", "5"}
    assert brokers.select(candidates) == {"1"}  # avg over 1 and 2 only: 0.75

    brokers.history = brokers.strategy.initial_state()  # strategy = new ...()
    brokers.report("1", 100)
    picks = brokers.select(candidates)
    assert picks <= {"1", "2", "5"} and len(picks) > 1  # none qualifies: at random

    brokers.report("1", None)
    brokers.report("2", None)
    assert brokers.select(candidates) == {"1", "2", "5"}


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
    assert picks_of(strategy, set(rates), view, config) == {"1"}
    rates["1"] = 400.0
    assert picks_of(strategy, set(rates), lltmr_view(rates, {}), config) == {"2"}
    overloaded = {"2": ResourceUsage(90, 100)}  # 90 % > 85 %: scored +inf
    view = lltmr_view(rates, overloaded)
    assert picks_of(strategy, set(rates), view, config) == {"3"}


def test_least_long_term_message_rate_all_overloaded() -> None:
    """LeastLongTermMessageRate.selectBroker: when every candidate is overloaded they all tie
    at +inf and one is chosen at random."""
    config = LoadBalancerConfig()
    rates = {"1": 100.0, "2": 200.0, "3": 300.0}
    view = lltmr_view(rates, dict.fromkeys(rates, ResourceUsage(90, 100)))
    assert picks_of(LeastLongTermMessageRate(), set(rates), view, config) == set(rates)


def round_robin(strategy: RoundRobinBrokerSelector, state: RoundRobinState, brokers: list[str]):
    return strategy.select_broker(
        brokers,
        "",
        BundleData.new(),
        reporting(),
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
