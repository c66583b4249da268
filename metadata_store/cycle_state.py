"""The policy cycle's cross-cycle state (``loadbalance.cycle.CycleState``) as versioned JSON,
the ``cycle_state`` field of ``P:stream:progress`` (``metadata_store.progress``).

Why explicit JSON and not pickle: the field outlives the process that wrote it (a restarted or
upgraded job reads it), so it must not depend on the module paths of whoever wrote it, and an
operator must be able to read it. Every strategy state type is written with a ``type`` tag and
its fields by name; an unknown version, type or field is refused with ``InvalidInput`` rather
than read as something else. Mappings keep their order (a cycle iterates over some of them), and
floats are written with ``repr``, so a read gives back an equal state, bit for bit.

Document (version 1)::

    {"cycleStateVersion": 1, "lastSheddingMs": int|null, "lastSplitMs": int|null,
     "shedderState": null | {"type": "TransferShedderState", "hitCount": int,
                             "recentBrokers": {broker: ms}}
                          | {"type": "ProjectedShedderState",
                             "pending": {bundle: {"source", "destination", "atMs",
                                                 "load": [msgRate, thrIn, thrOut]}},
                             "cameFrom": {bundle: broker}},
     "splitState": null | {"type": "SplitState", "hitCounts": {bundle: int}},
     "placementState": null | {"type": "RoundRobinState", "counter": int}
                            | {"type": "LeastResourceUsageWithWeightState",
                               "brokerAvgResourceUsageWithWeight": {broker: float}},
     "recentlyUnloaded": {bundle: ms}}
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
from loadbalance.strategies.projected_usage_shedder import PendingMove, ProjectedShedderState
from loadbalance.strategies.usage_projection import BundleLoad

__all__ = ["CYCLE_STATE_VERSION", "CycleStateJson", "dump_cycle_state", "load_cycle_state"]

CYCLE_STATE_VERSION = 1
_FIELD = "cycle state"


def _ro(d: dict) -> Mapping:
    return MappingProxyType(d)


def _dump_transfer(s: TransferShedderState) -> dict[str, Any]:
    return {"hitCount": s.hit_count, "recentBrokers": dict(s.recent_brokers)}


def _load_transfer(d: Mapping[str, Any]) -> TransferShedderState:
    return TransferShedderState(_int(d["hitCount"]), _ro(_int_map(d["recentBrokers"])))


def _dump_projected(s: ProjectedShedderState) -> dict[str, Any]:
    pending = {
        b: {
            "source": m.source,
            "destination": m.destination,
            "atMs": m.at_ms,
            "load": [
                m.load.msg_rate_per_s,
                m.load.throughput_in_bytes_per_s,
                m.load.throughput_out_bytes_per_s,
            ],
        }
        for b, m in s.pending.items()
    }
    return {"pending": pending, "cameFrom": dict(s.came_from)}


def _load_projected(d: Mapping[str, Any]) -> ProjectedShedderState:
    pending = {}
    for b, m in _map(d["pending"]).items():
        rate, thr_in, thr_out = (_float(x) for x in m["load"])
        pending[b] = PendingMove(
            _str(m["source"]), _str(m["destination"]), _int(m["atMs"]),
            BundleLoad(rate, thr_in, thr_out),
        )  # fmt: skip
    came = {b: _str(v) for b, v in _map(d["cameFrom"]).items()}
    return ProjectedShedderState(_ro(pending), _ro(came))


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
        "ProjectedShedderState", _dump_projected, _load_projected,
        frozenset({"pending", "cameFrom"}),
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
    {"cycleStateVersion", "lastSheddingMs", "lastSplitMs", "recentlyUnloaded", *_SLOTS}
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
    """The state as its version-1 document."""
    return json.dumps(
        {
            "cycleStateVersion": CYCLE_STATE_VERSION,
            "lastSheddingMs": state.last_shedding_ms,
            "lastSplitMs": state.last_split_ms,
            "shedderState": _dump_state(state.shedder_state, "shedderState"),
            "splitState": _dump_state(state.split_state, "splitState"),
            "placementState": _dump_state(state.placement_state, "placementState"),
            "recentlyUnloaded": dict(state.recently_unloaded),
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
    if type(version) is not int or version != CYCLE_STATE_VERSION:
        raise _fail(f"unsupported cycleStateVersion {version!r}, only {CYCLE_STATE_VERSION}")
    unknown = set(doc) - _KEYS
    if unknown:
        raise _fail(f"unknown fields {sorted(unknown)}")

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
    )


class CycleStateJson:
    """The ``CycleStateCodec`` of ``metadata_store.progress``: this module's document."""

    def dump(self, state: CycleState) -> str:
        return dump_cycle_state(state)

    def load(self, text: str | bytes) -> CycleState:
        return load_cycle_state(text)
