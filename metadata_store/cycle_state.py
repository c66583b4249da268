"""The policy cycle's cross-cycle state (``loadbalance.cycle.CycleState``) as versioned JSON,
the ``cycle_state`` field of ``P:stream:progress`` (``metadata_store.progress``).

Why explicit JSON and not pickle: the field outlives the process that wrote it (a restarted or
upgraded job reads it), so it must not depend on the module paths of whoever wrote it, and an
operator must be able to read it. Every strategy state type is written with a ``type`` tag and
its fields by name; an unknown version, type or field is refused with ``InvalidInput`` rather
than read as something else. Mappings keep their order (a cycle iterates over some of them), and
floats are written with ``repr``, so a read gives back an equal state, bit for bit.

Document (version 2; a version-1 document is still read: its ProjectedShedderState's
``pending`` moves become the in-flight moves, as they were the same thing)::

    {"cycleStateVersion": 1, "lastSheddingMs": int|null, "lastSplitMs": int|null,
     "shedderState": null | {"type": "TransferShedderState", "hitCount": int,
                             "recentBrokers": {broker: ms}}
                          | {"type": "ProjectedShedderState", "cameFrom": {bundle: broker}},
     "splitState": null | {"type": "SplitState", "hitCounts": {bundle: int}},
     "placementState": null | {"type": "RoundRobinState", "counter": int}
                            | {"type": "LeastResourceUsageWithWeightState",
                               "brokerAvgResourceUsageWithWeight": {broker: float}},
     "recentlyUnloaded": {bundle: ms},
     "inFlight": {bundle: {"source": broker, "destination": broker|null, "atMs": int,
                           "load": [msgRate, thrIn, thrOut]}}}
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

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

__all__ = ["CYCLE_STATE_VERSION", "CycleStateJson", "dump_cycle_state", "load_cycle_state"]

CYCLE_STATE_VERSION = 2
_READABLE_VERSIONS = (1, 2)
_FIELD = "cycle state"


def _ro(d: dict) -> Mapping:
    return MappingProxyType(d)


def _dump_transfer(s: TransferShedderState) -> dict[str, Any]:
    return {"hitCount": s.hit_count, "recentBrokers": dict(s.recent_brokers)}


def _load_transfer(d: Mapping[str, Any]) -> TransferShedderState:
    return TransferShedderState(_int(d["hitCount"]), _ro(_int_map(d["recentBrokers"])))


def _dump_projected(s: ProjectedShedderState) -> dict[str, Any]:
    return {"cameFrom": dict(s.came_from)}


def _load_projected(d: Mapping[str, Any]) -> ProjectedShedderState:
    return ProjectedShedderState(_ro({b: _str(v) for b, v in _map(d["cameFrom"]).items()}))


def _dump_in_flight(moves: Mapping[str, InFlightMove]) -> dict[str, Any]:
    return {
        b: {
            "source": m.source,
            "destination": m.destination,
            "atMs": m.at_ms,
            "load": [m.msg_rate, m.throughput_in, m.throughput_out],
        }
        for b, m in moves.items()
    }


def _load_in_flight(d: Any) -> dict[str, InFlightMove]:
    out = {}
    for b, m in _map(d).items():
        m = _map(m)
        rate, thr_in, thr_out = (_float(x) for x in m["load"])
        dest = m["destination"]
        out[b] = InFlightMove(
            _str(m["source"]), None if dest is None else _str(dest), _int(m["atMs"]),
            rate, thr_in, thr_out,
        )  # fmt: skip
    return out


def _dump_split(s: SplitState) -> dict[str, Any]:
    return {"hitCounts": dict(s.hit_counts)}


def _load_split(d: Mapping[str, Any]) -> SplitState:
    return SplitState(_ro(_int_map(d["hitCounts"])))


def _dump_round_robin(s: RoundRobinState) -> dict[str, Any]:
    return {"counter": s.counter}


def _load_round_robin(d: Mapping[str, Any]) -> RoundRobinState:
    return RoundRobinState(_int(d["counter"]))


def _dump_lruww(s: LeastResourceUsageWithWeightState) -> dict[str, Any]:
    return {"brokerAvgResourceUsageWithWeight": dict(s.broker_avg_resource_usage_with_weight)}


def _load_lruww(d: Mapping[str, Any]) -> LeastResourceUsageWithWeightState:
    usage = {b: _float(v) for b, v in _map(d["brokerAvgResourceUsageWithWeight"]).items()}
    return LeastResourceUsageWithWeightState(_ro(usage))


# type -> (its tag, writer, reader, the fields the reader takes)
_TYPES: dict[type, tuple[str, Callable[[Any], dict], Callable[[Mapping], Any], frozenset]] = {
    TransferShedderState: (
        "TransferShedderState", _dump_transfer, _load_transfer,
        frozenset({"hitCount", "recentBrokers"}),
    ),
    ProjectedShedderState: (
        "ProjectedShedderState", _dump_projected, _load_projected, frozenset({"cameFrom"}),
    ),
    SplitState: ("SplitState", _dump_split, _load_split, frozenset({"hitCounts"})),
    RoundRobinState: (
        "RoundRobinState", _dump_round_robin, _load_round_robin, frozenset({"counter"}),
    ),
    LeastResourceUsageWithWeightState: (
        "LeastResourceUsageWithWeightState", _dump_lruww, _load_lruww,
        frozenset({"brokerAvgResourceUsageWithWeight"}),
    ),
}  # fmt: skip
_BY_TAG = {tag: (load, fields) for tag, _, load, fields in _TYPES.values()}
# which tags each slot of CycleState may hold
_SLOTS = {
    "shedderState": frozenset({"TransferShedderState", "ProjectedShedderState"}),
    "splitState": frozenset({"SplitState"}),
    "placementState": frozenset({"RoundRobinState", "LeastResourceUsageWithWeightState"}),
}
_KEYS = frozenset(
    {"cycleStateVersion", "lastSheddingMs", "lastSplitMs", "recentlyUnloaded", "inFlight", *_SLOTS}
)


def _fail(reason: str) -> InvalidInput:
    return InvalidInput(_FIELD, reason)


def _int(v: Any) -> int:
    if type(v) is not int:
        raise _fail(f"expected a whole number, got {type(v).__name__}")
    return v


def _float(v: Any) -> float:
    if type(v) not in (int, float):
        raise _fail(f"expected a number, got {type(v).__name__}")
    return float(v)


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise _fail(f"expected a string, got {type(v).__name__}")
    return v


def _map(v: Any) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise _fail(f"expected an object, got {type(v).__name__}")
    return v


def _int_map(v: Any) -> dict[str, int]:
    return {k: _int(x) for k, x in _map(v).items()}


def _dump_state(state: Any, slot: str) -> dict[str, Any] | None:
    if state is None:
        return None
    entry = _TYPES.get(type(state))
    if entry is None or entry[0] not in _SLOTS[slot]:
        raise TypeError(f"no JSON form for a {type(state).__name__} in {slot}")
    tag, dump, _, _ = entry
    return {"type": tag, **dump(state)}


def _load_state(doc: Any, slot: str) -> Any:
    if doc is None:
        return None
    doc = _map(doc)
    tag = doc.get("type")
    if tag not in _SLOTS[slot]:
        raise _fail(f"{slot}: unknown state type {tag!r}")
    load, fields = _BY_TAG[tag]
    if set(doc) - {"type"} != fields:
        raise _fail(f"{slot}: a {tag} has the fields {sorted(fields)}, got {sorted(doc)}")
    try:
        return load(doc)
    except (KeyError, TypeError, ValueError) as e:
        raise _fail(f"{slot}: malformed {tag}: {e}") from None


def dump_cycle_state(state: CycleState) -> str:
    """The state as its version-2 document."""
    return json.dumps(
        {
            "cycleStateVersion": CYCLE_STATE_VERSION,
            "lastSheddingMs": state.last_shedding_ms,
            "lastSplitMs": state.last_split_ms,
            "shedderState": _dump_state(state.shedder_state, "shedderState"),
            "splitState": _dump_state(state.split_state, "splitState"),
            "placementState": _dump_state(state.placement_state, "placementState"),
            "recentlyUnloaded": dict(state.recently_unloaded),
            "inFlight": _dump_in_flight(state.in_flight),
        },
        separators=(",", ":"),
    )


def load_cycle_state(text: str | bytes) -> CycleState:
    """The state a ``dump_cycle_state`` document holds; ``InvalidInput`` for anything else,
    including a document of another version."""
    try:
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        raise _fail("not a JSON document (a state written in another format?)") from None
    doc = _map(doc)
    version = doc.get("cycleStateVersion")
    if type(version) is not int or version not in _READABLE_VERSIONS:
        raise _fail(f"unsupported cycleStateVersion {version!r}, only {_READABLE_VERSIONS}")
    unknown = set(doc) - _KEYS
    if unknown:
        raise _fail(f"unknown fields {sorted(unknown)}")

    in_flight = doc.get("inFlight") or {}
    if version == 1:
        in_flight = _pending_of_version_1(doc)

    def opt_int(key: str) -> int | None:
        v = doc.get(key)
        return None if v is None else _int(v)

    return CycleState(
        last_shedding_ms=opt_int("lastSheddingMs"),
        last_split_ms=opt_int("lastSplitMs"),
        shedder_state=_load_state(doc.get("shedderState"), "shedderState"),
        split_state=_load_state(doc.get("splitState"), "splitState"),
        placement_state=_load_state(doc.get("placementState"), "placementState"),
        recently_unloaded=_ro(_int_map(doc.get("recentlyUnloaded") or {})),
        in_flight=_ro(_load_in_flight_field(in_flight)),
    )


def _load_in_flight_field(d: Any) -> dict[str, InFlightMove]:
    try:
        return _load_in_flight(d)
    except (KeyError, TypeError, ValueError) as e:
        raise _fail(f"inFlight: malformed move: {e}") from None


def _pending_of_version_1(doc: dict[str, Any]) -> Any:
    """A version-1 ProjectedShedderState's ``pending`` moves (taken out of the document, which
    then reads as version 2): they have the in-flight moves' form."""
    shedder = doc.get("shedderState")
    if isinstance(shedder, dict) and shedder.get("type") == "ProjectedShedderState":
        shedder = dict(shedder)
        pending = shedder.pop("pending", {})
        doc["shedderState"] = shedder
        return pending
    return {}


class CycleStateJson:
    """The ``CycleStateCodec`` of ``metadata_store.progress``: this module's document."""

    def dump(self, state: CycleState) -> str:
        return dump_cycle_state(state)

    def load(self, text: str | bytes) -> CycleState:
        return load_cycle_state(text)
