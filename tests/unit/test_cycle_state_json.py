"""The cycle state's stored form (``metadata_store.cycle_state``): versioned JSON that gives back
an equal state for every strategy state type, and refuses what it does not know."""

from __future__ import annotations

import base64
import json
import pickle
from types import MappingProxyType

import pytest

from loadbalance.cycle import CycleState
from loadbalance.errors import InvalidInput
from loadbalance.placement.least_resource_usage_with_weight import (
    LeastResourceUsageWithWeightState,
)
from loadbalance.placement.round_robin import RoundRobinState
from loadbalance.shedding.transfer_shedder import TransferShedderState
from loadbalance.split_policy import SplitState
from loadbalance.strategies.projected_usage_shedder import ProjectedShedderState
from loadbalance.view import InFlightMove
from metadata_store.cycle_state import CYCLE_STATE_VERSION, dump_cycle_state, load_cycle_state

B1, B2 = "t/ns/0x00000000_0x80000000", "t/ns/0x80000000_0xffffffff"
RO = MappingProxyType

STATES = {
    "empty": CycleState(),
    "TransferShedderState": CycleState(
        last_shedding_ms=1_700_000_000_000,
        shedder_state=TransferShedderState(3, RO({"b2:8080": 17, "b1:8080": 5})),
        recently_unloaded=RO({B2: 9, B1: 10}),
    ),
    "ProjectedShedderState": CycleState(
        shedder_state=ProjectedShedderState(RO({B1: "b1:8080"})),
        in_flight=RO(
            {
                B1: InFlightMove("b1:8080", "b2:8080", 42, 0.1, 1 / 3, 2.5e300),
                B2: InFlightMove("b2:8080", None, 43, 1.0, 2.0, 3.0),
            }
        ),
    ),
    "SplitState": CycleState(last_split_ms=7, split_state=SplitState(RO({B2: 2, B1: 1}))),
    "RoundRobinState": CycleState(placement_state=RoundRobinState(2**40 + 1)),
    "LeastResourceUsageWithWeightState": CycleState(
        placement_state=LeastResourceUsageWithWeightState(RO({"b2:8080": 1 / 3, "b1:8080": 1.5}))
    ),
}


@pytest.mark.parametrize("name", sorted(STATES))
def test_every_state_type_round_trips_equal_and_in_order(name):
    state = STATES[name]
    text = dump_cycle_state(state)
    back = load_cycle_state(text)
    assert back == state
    assert type(back.shedder_state) is type(state.shedder_state)
    assert type(back.split_state) is type(state.split_state)
    assert type(back.placement_state) is type(state.placement_state)
    # mapping order survives (a cycle iterates over some of them), and the text is stable
    assert list(back.recently_unloaded) == list(state.recently_unloaded)
    assert list(back.in_flight) == list(state.in_flight)
    for part in (
        "recent_brokers",
        "pending",
        "came_from",
        "hit_counts",
        "broker_avg_resource_usage_with_weight",
    ):
        for old, new in ((state.shedder_state, back.shedder_state),
                         (state.split_state, back.split_state),
                         (state.placement_state, back.placement_state)):  # fmt: skip
            if hasattr(old, part):
                assert list(getattr(new, part)) == list(getattr(old, part))
    assert dump_cycle_state(back) == text
    doc = json.loads(text)
    assert doc["cycleStateVersion"] == CYCLE_STATE_VERSION


def test_floats_come_back_bit_for_bit():
    state = STATES["ProjectedShedderState"]
    move = load_cycle_state(dump_cycle_state(state)).in_flight[B1]
    assert move.throughput_in.hex() == (1 / 3).hex()
    assert move.throughput_out == 2.5e300


def test_a_version_1_document_reads_its_pending_moves_as_in_flight():
    """A job upgraded over a stored version-1 state keeps projecting the moves it had made."""
    v1 = {
        "cycleStateVersion": 1,
        "lastSheddingMs": 5,
        "lastSplitMs": None,
        "shedderState": {
            "type": "ProjectedShedderState",
            "pending": {B1: {"source": "a", "destination": "b", "atMs": 4, "load": [1, 2, 3]}},
            "cameFrom": {B1: "a"},
        },
        "splitState": None,
        "placementState": None,
        "recentlyUnloaded": {B1: 4},
    }
    state = load_cycle_state(json.dumps(v1))
    assert state.in_flight == {B1: InFlightMove("a", "b", 4, 1.0, 2.0, 3.0)}
    assert state.shedder_state == ProjectedShedderState(RO({B1: "a"}))


def test_a_malformed_in_flight_move_is_refused():
    doc = json.loads(dump_cycle_state(STATES["ProjectedShedderState"]))
    del doc["inFlight"][B1]["source"]
    with pytest.raises(InvalidInput, match="inFlight"):
        load_cycle_state(json.dumps(doc))


def test_the_stored_form_is_json_naming_the_type():
    doc = json.loads(dump_cycle_state(STATES["TransferShedderState"]))
    assert doc["shedderState"] == {
        "type": "TransferShedderState",
        "hitCount": 3,
        "recentBrokers": {"b2:8080": 17, "b1:8080": 5},
    }


@pytest.mark.parametrize("version", [None, 0, 3, "1", True])
def test_an_unknown_version_is_refused(version):
    doc = json.loads(dump_cycle_state(STATES["SplitState"]))
    doc["cycleStateVersion"] = version
    with pytest.raises(InvalidInput, match="unsupported cycleStateVersion"):
        load_cycle_state(json.dumps(doc))


def test_a_pickled_state_is_refused_not_unpickled():
    # the shape of a state stored pickled and base64-encoded
    text = base64.b64encode(pickle.dumps({"last_shedding_ms": 1})).decode()
    with pytest.raises(InvalidInput, match="not a JSON document"):
        load_cycle_state(text)


def test_an_unknown_state_type_or_field_is_refused():
    doc = json.loads(dump_cycle_state(STATES["RoundRobinState"]))
    doc["placementState"]["type"] = "TransferShedderState"  # a shedder's state in placement
    with pytest.raises(InvalidInput, match="unknown state type"):
        load_cycle_state(json.dumps(doc))
    doc = json.loads(dump_cycle_state(STATES["RoundRobinState"]))
    doc["placementState"]["extra"] = 1
    with pytest.raises(InvalidInput, match="has the fields"):
        load_cycle_state(json.dumps(doc))
    doc = json.loads(dump_cycle_state(STATES["RoundRobinState"]))
    doc["placementState"]["counter"] = 1.5
    with pytest.raises(InvalidInput, match="whole number"):
        load_cycle_state(json.dumps(doc))


def test_a_state_without_a_json_form_is_not_written():
    with pytest.raises(TypeError, match="no JSON form"):
        dump_cycle_state(CycleState(placement_state=SplitState()))  # type: ignore[arg-type]
