"""Moves in flight (``loadbalance.in_flight``): a cycle's moves stay in its state until the reports
show them, and the next cycles' projected usage counts them, so a lagging report never makes our
pair move the same load twice."""

from __future__ import annotations

from dataclasses import replace

from loadbalance.config import LoadBalancerConfig
from loadbalance.cycle import CycleState, step
from loadbalance.decisions import SPLIT, TRANSFER
from loadbalance.in_flight import record_moves, retire_moves
from loadbalance.snapshot import parse_snapshot
from loadbalance.strategies.usage_projection import UsageModel, Weights
from loadbalance.view import ClusterView, InFlightMove
from tests.unit.test_cycle import EXAMPLE
from tests.unit.test_sim_strategies import BUNDLES, broker, view_of

MIN = 60_000
CONFIG = LoadBalancerConfig(
    loadBalancerLoadSheddingStrategy="ProjectedUsageShedder",
    loadBalancerLoadPlacementStrategy="LeastProjectedUsage",
    loadBalancerDistributeBundlesEvenlyEnabled=False,
    loadBalancerAutoBundleSplitEnabled=False,
    loadBalancerSheddingGracePeriodMinutes=0,  # only the in-flight set holds the moved bundles
)


def _hot() -> ClusterView:
    """``a`` with twelve bundles at 0.045 each on 8 cores, ``b`` and ``c`` nearly idle."""
    return view_of(
        broker("a", 8, {b: 3_000.0 for b in BUNDLES[:12]}),
        broker("b", 8, {BUNDLES[20]: 500.0}),
        broker("c", 8, {BUNDLES[21]: 500.0}),
    )


def _after(view: ClusterView, moves: dict[str, str]) -> ClusterView:
    """The view once every broker reports the moves (bundle -> destination)."""
    owned = {n: dict(v.report.last_stats) for n, v in view.brokers.items()}
    for bundle, dest in moves.items():
        src = next(n for n, s in owned.items() if bundle in s)
        owned[dest][bundle] = owned[src].pop(bundle)
    brokers = [broker(n, 8, {b: s.msg_rate for b, s in st.items()}) for n, st in owned.items()]
    return view_of(*brokers)


def test_stale_reports_do_not_move_the_same_load_twice() -> None:
    view = _hot()
    state, first = step(CycleState(), view, CONFIG, now_ms=0, cycle="0")
    moved = {d.bundle: d.destination_broker for d in first.decisions if d.kind == TRANSFER}
    assert moved and set(state.in_flight) == set(moved)
    state, second = step(state, view, CONFIG, now_ms=MIN, cycle="1")
    assert not second.decisions, "the reports lag: the first cycle's moves are still in flight"
    assert set(state.in_flight) == set(moved)


def test_the_same_stale_reports_without_the_in_flight_set_move_again() -> None:
    """The control: the state without its in-flight moves decides the same load again."""
    view = _hot()
    state, first = step(CycleState(), view, CONFIG, now_ms=0, cycle="0")
    assert first.decisions
    _, second = step(replace(state, in_flight={}), view, CONFIG, now_ms=MIN, cycle="1")
    assert second.decisions


def test_a_move_retires_when_both_reports_show_it() -> None:
    view = _hot()
    state, first = step(CycleState(), view, CONFIG, now_ms=0, cycle="0")
    moved = {d.bundle: d.destination_broker or "" for d in first.decisions}
    shown = _after(view, moved)
    assert not retire_moves(state.in_flight, shown, now_ms=MIN, max_age_ms=10 * MIN)
    one = next(iter(moved))
    half = _after(view, {one: moved[one]})  # only one move reported so far
    assert set(retire_moves(state.in_flight, half, now_ms=MIN, max_age_ms=10 * MIN)) == (
        set(moved) - {one}
    )


def test_a_move_never_shown_retires_after_the_timeout() -> None:
    view = _hot()
    state, _ = step(CycleState(), view, CONFIG, now_ms=0, cycle="0")
    timeout_ms = int(CONFIG.load_balancer_in_flight_move_timeout_seconds * 1000)
    assert retire_moves(state.in_flight, view, now_ms=timeout_ms, max_age_ms=timeout_ms)
    assert not retire_moves(state.in_flight, view, now_ms=timeout_ms + 1, max_age_ms=timeout_ms)
    _, later = step(state, view, CONFIG, now_ms=timeout_ms + MIN, cycle="later")
    assert later.decisions, "a move the reports never showed did not happen: balance again"


def test_each_side_is_projected_only_while_its_report_does_not_show_it() -> None:
    view = _hot()
    bundle = BUNDLES[0]
    move = InFlightMove("a", "b", 0, 3_000.0, 0.0, 0.0)
    plain = UsageModel(view, Weights())
    flying = UsageModel(replace(view, in_flight={bundle: move}), Weights())
    assert flying.load("a") < plain.load("a") and flying.load("b") > plain.load("b")
    shown = _after(view, {bundle: "b"})
    both = UsageModel(replace(shown, in_flight={bundle: move}), Weights())
    again = UsageModel(shown, Weights())
    assert both.load("a") == again.load("a") and both.load("b") == again.load("b")


def test_an_unload_counts_on_its_source_only() -> None:
    view = _hot()
    unloading = CONFIG.model_copy(update={"load_balancer_transfer_enabled": False})
    d = step(CycleState(), view, unloading, now_ms=0, cycle="0")[1].decisions[0]
    flying = record_moves({}, [d], view, 0)
    assert flying[d.bundle].destination is None
    model = UsageModel(replace(view, in_flight=flying), Weights())
    plain = UsageModel(view, Weights())
    assert model.load("a") < plain.load("a")
    assert model.load("b") == plain.load("b") and model.load("c") == plain.load("c")


def test_a_split_whose_children_are_left_free_leaves_its_owner_until_the_report_shows_it() -> None:
    """With ``loadBalancerAutoUnloadSplitBundlesEnabled`` the children are placed by lookups:
    the parent's load leaves its owner as an unload's does, and the next cycle must not shed the
    owner's other bundles for it. Kept by the owner (the knob off), the load stays: nothing is
    recorded. On the example snapshot, whose hot bundle the cycle splits."""
    snap = parse_snapshot(EXAMPLE.read_text())
    config = LoadBalancerConfig(loadBalancerLoadSheddingStrategy="OverloadShedder")
    state, result = step(CycleState(), snap.view, config, now_ms=snap.now_ms, cycle="c1")
    split = next(d for d in result.decisions if d.kind == SPLIT)
    owner = split.source_broker
    assert state.in_flight[split.bundle].source == owner
    assert state.in_flight[split.bundle].destination is None
    stats = snap.view.brokers[owner].report.last_stats[split.bundle]
    assert state.in_flight[split.bundle].msg_rate == stats.msg_rate
    model = UsageModel(replace(snap.view, in_flight=state.in_flight), Weights())
    assert model.load(owner) < UsageModel(snap.view, Weights()).load(owner)

    kept = config.model_copy(update={"load_balancer_auto_unload_split_bundles_enabled": False})
    state = step(CycleState(), snap.view, kept, now_ms=snap.now_ms, cycle="c1")[0]
    assert split.bundle not in state.in_flight
    assert record_moves({}, [split], snap.view, 0) == {}
