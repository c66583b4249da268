"""ProjectedUsageShedder does not chase report noise: a broker a single report tips just over
the balance band (within ``noise_allowance`` of it) is shed only when the next report shows it
above the band too; a larger excess, or an overloaded broker, is shed at once. The brokers a
cycle leaves above the band travel in the shedder state, which the cycle state's JSON keeps."""

from __future__ import annotations

import json
from types import MappingProxyType

from loadbalance.cycle import CycleState
from loadbalance.model import NamespaceBundleStats
from loadbalance.strategies.move_search import Spread
from loadbalance.strategies.projected_usage_shedder import ProjectedShedderState, _worth_it
from loadbalance.strategies.shed_candidates import Candidate
from loadbalance.strategies.usage_projection import UsageModel, Weights
from loadbalance.values import SkipReason
from metadata_store.cycle_state import dump_cycle_state, load_cycle_state
from tests.unit.test_sim_strategies import BUNDLES, broker, loads_after, shed, view_of


def _cluster(hot_rate: float):
    """Four 8-core brokers of 4,000 msg/s bundles (0.04 each); ``a`` at ``hot_rate``, the
    others make the mean 0.50 with ``a`` at 56,000 (1.12 x mean)."""
    rates = {"a": hot_rate, "b": 50_000.0, "c": 47_000.0, "d": 47_000.0}
    brokers = []
    for i, (name, total) in enumerate(rates.items()):
        n = int(total // 4_000)
        bundles = {BUNDLES[16 * i + k]: 4_000.0 for k in range(n)}
        if total > 4_000.0 * n:
            bundles[BUNDLES[16 * i + n]] = total - 4_000.0 * n
        brokers.append(broker(name, 8, bundles))
    return view_of(*brokers)


def _ratio(view) -> float:
    loads = loads_after(view, ())
    return max(loads.values()) / (sum(loads.values()) / len(loads))


def test_a_marginal_excess_waits_for_the_next_report() -> None:
    view = _cluster(56_000.0)
    assert 1.10 < _ratio(view) < 1.13, "above the band, within the noise allowance"
    state, res = shed(view)
    assert not res.decisions
    assert [s.reason for s in res.skips] == [SkipReason.BALANCED]
    assert state.above_band == frozenset({"a"})
    state, res = shed(view, state)
    assert res.decisions, "seen above the band on two reports in a row: shed"
    assert {d.source_broker for d in res.decisions} == {"a"}
    assert state.above_band == frozenset()


def test_a_marginal_excess_that_was_noise_is_forgotten() -> None:
    state, _ = shed(_cluster(56_000.0))
    state, res = shed(_cluster(53_000.0), state)  # back inside the band
    assert not res.decisions and state.above_band == frozenset()
    _, res = shed(_cluster(56_000.0), state)
    assert not res.decisions, "above the band once more, but not twice in a row"


def test_a_large_excess_is_shed_at_once() -> None:
    view = _cluster(62_000.0)
    assert _ratio(view) > 1.13
    _, res = shed(view)
    assert {d.source_broker for d in res.decisions} == {"a"}


def test_an_overloaded_broker_is_shed_at_once() -> None:
    """The same marginal excess on a broker over the overload threshold is not waited for."""
    _, res = shed(_cluster(56_000.0), load_balancer_broker_overloaded_threshold_percentage=50)
    assert {d.source_broker for d in res.decisions} == {"a"}


def test_the_cycle_state_keeps_the_brokers_above_the_band() -> None:
    state = CycleState(
        shedder_state=ProjectedShedderState(MappingProxyType({}), frozenset({"b2", "b1"}))
    )
    doc = json.loads(dump_cycle_state(state))
    assert doc["shedderState"]["aboveBand"] == ["b1", "b2"]
    assert load_cycle_state(json.dumps(doc)) == state
    del doc["shedderState"]["aboveBand"]  # a document written before the field existed
    read = load_cycle_state(json.dumps(doc)).shedder_state
    assert read == ProjectedShedderState(MappingProxyType({}))


def _plan_state(rates: dict[str, float]):
    """A usage model and a spread over 8-core brokers (the moves judged carry their own rates)."""
    view = view_of(*(broker(name, 8, {BUNDLES[i]: r}) for i, (name, r) in enumerate(rates.items())))
    model = UsageModel(view, Weights())
    return view, model, Spread({b: model.load(b) for b in model.brokers})


def _candidate(view, src: str, rate: float) -> Candidate:
    bundle = next(iter(sorted(view.brokers[src].report.bundles)))
    st = NamespaceBundleStats(rate / 2, rate / 2, 0.0, 0.0, 1, 1, 1)
    return Candidate(rate, bundle, st)


def test_a_source_inside_the_band_is_taken_further_only_by_a_move_that_settles_it() -> None:
    """``a`` at 1.08 x mean (inside the band, above the 1.06 target): a 500 msg/s move leaves it
    at 1.07 and is not worth a move; a 4,000 msg/s one settles it. Above the band any move
    that lowers the source is worth it."""
    view, model, spread = _plan_state({"a": 54_000.0, "b": 46_000.0, "c": 50_000.0})
    ratios = (1.10, 1.06)
    assert not _worth_it(model, spread, "a", (_candidate(view, "a", 500.0), "b"), ratios)
    assert _worth_it(model, spread, "a", (_candidate(view, "a", 4_000.0), "b"), ratios)
    view, model, spread = _plan_state({"a": 58_000.0, "b": 42_000.0, "c": 50_000.0})
    assert _worth_it(model, spread, "a", (_candidate(view, "a", 500.0), "b"), ratios)
