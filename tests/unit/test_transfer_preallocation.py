"""A transfer decided by our shedder carries its bundle's averages; applying it preallocates the
bundle on the destination for the next lookups, in the fast model as the controller does, and
Pulsar's shedders carry nothing (their transfers preallocate nothing)."""

from __future__ import annotations

import math

import pytest

from loadbalance.decisions import TRANSFER, UNLOAD, decode_decision, encode_decision, make_decision
from loadbalance.time_average import BundleData, TimeAverageMessageData
from loadbalance.transfer_preallocation import (
    PREALLOCATION_KEYS,
    preallocation_inputs,
    preallocation_of,
)
from producers.fast_sim import FastSim, make_config
from producers.scenarios import load_scenario
from producers.scoreboard import PAIRS

DATA = BundleData(
    TimeAverageMessageData(10, 7, 1234.5, 2345.25, 12.125, 34.0),
    TimeAverageMessageData(1000, 640, 1000.0, 2000.0, 10.0, 30.000000001),
    topics=5,
)


def _transfer(inputs: dict) -> object:
    return make_decision(
        cycle="c",
        kind=TRANSFER,
        bundle="t/ns/0x00000000_0x40000000",
        source_broker="b1",
        destination_broker="b2",
        inputs=inputs,
    )


def test_the_averages_cross_the_wire_exactly() -> None:
    d = _transfer({"sourceLoad": 0.9, **preallocation_inputs(DATA)})
    back = decode_decision(encode_decision(d))
    assert preallocation_of(back) == DATA
    assert set(PREALLOCATION_KEYS) <= set(back.inputs)


def test_decisions_without_the_averages_preallocate_nothing() -> None:
    assert preallocation_of(_transfer({"sourceLoad": 0.9})) is None  # Pulsar's shedders
    unload = make_decision(
        cycle="c",
        kind=UNLOAD,
        bundle="t/ns/0x00000000_0x40000000",
        source_broker="b1",
        inputs=preallocation_inputs(DATA),
    )
    assert preallocation_of(unload) is None


@pytest.mark.parametrize(
    "bad",
    [-1.0, math.nan, math.inf, 1e300, "12", True, None],
)
def test_a_damaged_figure_records_nothing(bad: object) -> None:
    for key in PREALLOCATION_KEYS:
        inputs = {**preallocation_inputs(DATA), key: bad}
        assert preallocation_of(_transfer(inputs)) is None, key
    missing = preallocation_inputs(DATA)
    missing.pop(PREALLOCATION_KEYS[3])
    assert preallocation_of(_transfer(missing)) is None


def _mixed_fleet(pair: str) -> FastSim:
    scenario = load_scenario("mixed_fleet", 0)
    return FastSim(scenario, make_config(scenario, PAIRS[pair].overrides), seed=0)


def test_our_transfers_carry_their_bundles_averages_and_preallocate_the_destination() -> None:
    sim = _mixed_fleet("ours")
    for cycle in range(12):
        view = sim.view
        applied_before = len(sim.run_data.moves)
        sim.tick(cycle)
        moved = [m for m in sim.run_data.moves[applied_before:] if m.kind == TRANSFER]
        if not moved:
            continue
        assert view is not None or cycle == 0
        for m in moved:
            # counted on the destination until its report lists the bundle (the next tick)
            assert m.bundle in sim.preallocated.get(m.destination, {}), m
        transfers = [d for d in sim.run_data.decisions if d.kind == TRANSFER]
        assert all(preallocation_of(d) == sim.view.bundle_data[d.bundle] for d in transfers[-1:])
        sim.tick(cycle + 1)
        for m in moved:
            assert m.bundle not in sim.preallocated.get(m.destination, {}), m
        return
    pytest.fail("no transfer in the first cycles of mixed_fleet")


def test_pulsar_transfers_preallocate_nothing() -> None:
    sim = _mixed_fleet("extensible")
    for cycle in range(20):
        sim.tick(cycle)
    transfers = [d for d in sim.run_data.decisions if d.kind == TRANSFER]
    assert transfers, "TransferShedder must transfer something in mixed_fleet"
    assert all(preallocation_of(d) is None for d in transfers)
