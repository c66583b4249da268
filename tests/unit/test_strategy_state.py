"""Each strategy's cross-cycle state is a typed, frozen value: the cycle keeps the right type for
the configured shedder and placement strategy (replacing one another strategy left), and the
whole ``CycleState`` survives the streaming job's persistence deterministically, so a replay
from the stored state decides exactly what the running job decided."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from loadbalance.config import LoadBalancerConfig
from loadbalance.cycle import CycleState, step
from loadbalance.placement.pipeline import BrokerSelector, make_placement
from loadbalance.placement.round_robin import RoundRobinState
from loadbalance.shedding.registry import make_shedder, shedder_names
from loadbalance.shedding.transfer_shedder import TransferShedderState
from loadbalance.snapshot import parse_snapshot
from loadbalance.split_policy import SplitState
from loadbalance.strategies.projected_usage_shedder import ProjectedShedderState
from metadata_store.cycle_state import dump_cycle_state, load_cycle_state

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "snapshot.json"
MINUTE = 60_000


def _run(state: CycleState, cfg: LoadBalancerConfig, cycles: int, start: int = 0):
    snap = parse_snapshot(EXAMPLE.read_text())
    results = []
    for i in range(start, start + cycles):
        state, res = step(state, snap.view, cfg, now_ms=snap.now_ms + i * MINUTE, cycle=str(i))
        results.append(res)
    return state, results


def _config(shedder: str, **knobs: object) -> LoadBalancerConfig:
    return LoadBalancerConfig(
        loadBalancerLoadSheddingStrategy=shedder,
        loadBalancerLoadPlacementStrategy="RoundRobinBrokerSelector",
        loadBalancerSplitDebounceEnabled=True,
        **knobs,
    )


@pytest.mark.parametrize("shedder", shedder_names())
def test_each_shedder_keeps_its_own_state_type_and_the_state_replays_exactly(shedder: str):
    cfg = _config(shedder)
    state, _ = _run(CycleState(), cfg, 3)
    assert type(state.shedder_state) is make_shedder(shedder).state_type
    assert isinstance(state.split_state, SplitState)
    assert state.placement_state is None or isinstance(state.placement_state, RoundRobinState)

    stored = dump_cycle_state(state)
    assert dump_cycle_state(state) == stored, "the stored form is deterministic"
    restored = load_cycle_state(stored)
    assert restored == state
    assert dump_cycle_state(restored) == stored

    live = _run(state, cfg, 4, start=3)
    replayed = _run(restored, cfg, 4, start=3)
    assert replayed == live


def test_round_robin_counter_is_a_frozen_value_in_the_cycle_state():
    state, results = _run(CycleState(), _config("OverloadShedder"), 1)
    transfers = [d for r in results for d in r.decisions if d.kind == "transfer"]
    assert transfers, "the example sheds off its overloaded broker"
    assert state.placement_state == RoundRobinState(len(transfers))
    with pytest.raises(AttributeError):
        state.placement_state.counter = 0  # type: ignore[misc, union-attr]


@pytest.mark.parametrize(
    ("shedder", "left_over"),
    [
        ("TransferShedder", ProjectedShedderState()),
        ("ProjectedUsageShedder", TransferShedderState(hit_count=2)),
        ("OverloadShedder", TransferShedderState(hit_count=2)),
        ("ThresholdShedder", ProjectedShedderState()),
    ],
)
def test_a_state_left_by_another_shedder_is_replaced_by_a_fresh_one(shedder, left_over):
    """The strategy was reconfigured between runs: the stored state is not this shedder's."""
    fresh, expected = _run(CycleState(), _config(shedder), 1)
    state, results = _run(CycleState(shedder_state=left_over), _config(shedder), 1)
    assert type(state.shedder_state) is make_shedder(shedder).state_type
    assert state == fresh and results == expected


def test_a_placement_state_of_another_strategy_is_replaced():
    snap = parse_snapshot(EXAMPLE.read_text())
    cfg = LoadBalancerConfig()
    rng = random.Random(0)
    llt = make_placement("LeastLongTermMessageRate")
    stale = BrokerSelector(snap.view, cfg, rng, llt, strategy_state=RoundRobinState(7))
    assert stale.strategy_state is None
    rr = BrokerSelector(snap.view, cfg, rng, make_placement("RoundRobinBrokerSelector"))
    assert rr.strategy_state == RoundRobinState(0)
