"""Decisions and skips: the values the policies return, and their versioned JSON wire format.

A decision is a hint for the controller (split, unload, transfer, merge) with a reason in
Pulsar's vocabulary (``Overloaded``, ``Underloaded``, ``Topics``, ``Sessions``, ``MsgRate``,
``Bandwidth``, ``Admin``, ``Cold``) and the inputs that led to it. A skip is a result too
(``HitCount``, ``CoolDown``, ``NoBundles``, ...), never an error.

Ids are deterministic: a SHA-256 over the cycle key and the decision's content, so replaying the
same input batch yields the same ids and the controller can de-duplicate.

**Which decider made it.** A decision published by the streaming job carries ``deciderTerm``
(the term of the decider lease its job held, ``metadata_store.decider_lease``) and ``decider``
(that job's ``host:pid:random`` id). Neither is part of the id: a cycle replayed by a restarted
job under a newer term has the same ids, so the controller still de-duplicates it. Both keys
are optional on the wire, in schema version 1: a decision without them (an older job, or
``lbctl decide`` offline) reads as term 0 and decider ``""``, and the encoder leaves them out
for term 0, so those records keep their exact bytes. The controller refuses a decision whose
term is older than the newest term it knows of (``controller.apply``); so a term-0 decision is
applied only while no decider has ever held the lease in that Redis, and refused after.

``decode_decision`` is the controller's only gate for records from the decisions topic, so it
refuses anything the applier or Redis could choke on: the size limit before parsing,
wrong types, numbers outside their range, bundle names outside the ring (kept in their canonical
spelling), split boundaries that are not strictly inside the bundle, merges of bundles that are
not adjacent in one namespace, strings with lone surrogates (redis-py and Kafka encode UTF-8
strictly), and it cuts the ``field``/``reason`` of its errors to ``MAX_REASON_CHARS``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from loadbalance.bundles import BundleRange, canonical_bundle_name, parse_bundle
from loadbalance.errors import InvalidDecision, InvalidInput
from loadbalance.values import DecisionKind, DecisionReason, SkipReason

SCHEMA_VERSION = 1

SPLIT = DecisionKind.SPLIT
UNLOAD = DecisionKind.UNLOAD
TRANSFER = DecisionKind.TRANSFER
MERGE = DecisionKind.MERGE
KINDS: tuple[DecisionKind, ...] = tuple(DecisionKind)

DEFAULT_MAX_DECISION_BYTES = 65536
MAX_REASON_CHARS = 300
MAX_TIME_MS = 2**63 - 1

Scalar = float | int | str | bool | None

_EMPTY_INPUTS: Mapping[str, Scalar] = MappingProxyType({})

# ``json.dumps`` with any argument builds a new encoder per call; a policy cycle at a million
# bundles makes tens of thousands of ids and documents. These give the same text.
_ID_JSON = json.JSONEncoder(separators=(",", ":"))
_DECISION_JSON = json.JSONEncoder(separators=(",", ":"), sort_keys=True)


def decision_id(
    cycle: str,
    kind: str,
    bundle: str,
    source_broker: str | None,
    destination_broker: str | None,
    split_boundaries: tuple[int, ...] = (),
    merge_bundle: str | None = None,
) -> str:
    """Deterministic id: the same cycle and content always give the same id.

    The id hashes the JSON array of the arguments. An unload's or transfer's array is put
    together directly when JSON would write each string as it is (printable ASCII, no ``"``
    or backslash; the quote count finds a quote inside a string): the same characters as the
    encoder's, for about half its cost, and a cycle that moves thousands of bundles makes two
    ids for each."""
    if not split_boundaries and merge_bundle is None and source_broker is not None:
        try:
            if destination_broker is None:
                dest, quotes = "null", 8
            else:
                dest, quotes = '"' + destination_broker + '"', 10
            key = (
                '["' + cycle + '","' + kind + '","' + bundle + '","' + source_broker + '",'
                + dest + ",[],null]"
            )  # fmt: skip
        except TypeError:  # not all strings: the encoder writes them
            pass
        else:
            if key.isascii() and key.isprintable() and "\\" not in key and key.count('"') == quotes:
                return hashlib.sha256(key.encode()).hexdigest()[:32]
    key = _ID_JSON.encode(
        [
            cycle,
            kind,
            bundle,
            source_broker,
            destination_broker,
            list(split_boundaries),
            merge_bundle,
        ]
    )
    return hashlib.sha256(key.encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Decision:
    """One balancing action for the controller to apply."""

    id: str
    kind: DecisionKind
    bundle: str
    source_broker: str | None
    destination_broker: str | None = None
    split_boundaries: tuple[int, ...] = ()
    split_algorithm: str | None = None
    merge_bundle: str | None = None
    reason: DecisionReason | str = ""
    strategy: str = ""
    inputs: Mapping[str, Scalar] = field(default_factory=lambda: _EMPTY_INPUTS)
    cycle: str = ""
    decided_at_ms: int = 0
    schema_version: int = SCHEMA_VERSION
    # the decider lease's term and the id of the job that published it (0 and "": none):
    # provenance, not content, so equality ignores them (a replay by a restarted job, or the
    # same cycle decided by another process, is the same decision, as its id says)
    term: int = field(default=0, compare=False)
    decider: str = field(default="", compare=False)

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.reason}"


def _setters() -> tuple[Any, ...]:
    """The slot setters of ``Decision``'s fields, in field order (checked: a field added to
    ``Decision`` without one here fails at import)."""
    names = (
        "id", "kind", "bundle", "source_broker", "destination_broker", "split_boundaries",
        "split_algorithm", "merge_bundle", "reason", "strategy", "inputs", "cycle",
        "decided_at_ms", "schema_version", "term", "decider",
    )  # fmt: skip
    if names != tuple(f.name for f in fields(Decision)):
        raise TypeError("decisions._setters is out of date with Decision's fields")
    return tuple(getattr(Decision, n).__set__ for n in names)


(_SET_ID, _SET_KIND, _SET_BUNDLE, _SET_SOURCE, _SET_DESTINATION, _SET_BOUNDS, _SET_ALGORITHM,
 _SET_MERGE, _SET_REASON, _SET_STRATEGY, _SET_INPUTS, _SET_CYCLE, _SET_AT,
 _SET_VERSION, _SET_TERM, _SET_DECIDER) = _setters()  # fmt: skip


def _decision(
    id: str,
    kind: DecisionKind,
    bundle: str,
    source_broker: str | None,
    destination_broker: str | None,
    split_boundaries: tuple[int, ...],
    split_algorithm: str | None,
    merge_bundle: str | None,
    reason: DecisionReason | str,
    strategy: str,
    inputs: Mapping[str, Scalar],
    cycle: str,
    decided_at_ms: int,
) -> Decision:
    """``Decision(...)`` with every field given, set slot by slot.

    Why: a frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``,
    which looks the name up first; the slots' own setters do the same assignment in about half
    the time, and a cycle that moves thousands of bundles makes two decisions for each. The
    object is an ordinary ``Decision`` (the unit tests compare it with one built the usual
    way)."""
    d = object.__new__(Decision)
    _SET_ID(d, id)
    _SET_KIND(d, kind)
    _SET_BUNDLE(d, bundle)
    _SET_SOURCE(d, source_broker)
    _SET_DESTINATION(d, destination_broker)
    _SET_BOUNDS(d, split_boundaries)
    _SET_ALGORITHM(d, split_algorithm)
    _SET_MERGE(d, merge_bundle)
    _SET_REASON(d, reason)
    _SET_STRATEGY(d, strategy)
    _SET_INPUTS(d, inputs)
    _SET_CYCLE(d, cycle)
    _SET_AT(d, decided_at_ms)
    _SET_VERSION(d, SCHEMA_VERSION)
    _SET_TERM(d, 0)
    _SET_DECIDER(d, "")
    return d


def make_decision(
    *,
    cycle: str,
    kind: DecisionKind | str,
    bundle: str,
    source_broker: str | None,
    destination_broker: str | None = None,
    split_boundaries: tuple[int, ...] = (),
    split_algorithm: str | None = None,
    merge_bundle: str | None = None,
    reason: DecisionReason | str = "",
    strategy: str = "",
    inputs: Mapping[str, Scalar] | None = None,
    decided_at_ms: int = 0,
) -> Decision:
    """Build a decision and compute its deterministic id."""
    if kind not in KINDS:
        raise InvalidInput("kind", f"unknown decision kind {kind!r}")
    kind = DecisionKind(kind)
    bounds = tuple(sorted(split_boundaries))
    # one identity per bundle: the id, the store keys and the events all use the canonical name
    bundle = canonical_bundle_name(bundle)
    if merge_bundle is not None:
        merge_bundle = canonical_bundle_name(merge_bundle)
    return _decision(
        decision_id(cycle, kind, bundle, source_broker, destination_broker, bounds, merge_bundle),
        kind,
        bundle,
        source_broker,
        destination_broker,
        bounds,
        split_algorithm,
        merge_bundle,
        reason,
        strategy,
        MappingProxyType(dict(inputs or {})),
        cycle,
        decided_at_ms,
    )


def unload_of(
    *,
    cycle: str,
    bundle: str,
    source_broker: str,
    reason: DecisionReason | str,
    strategy: str,
    inputs: dict[str, Scalar],
    decided_at_ms: int,
) -> Decision:
    """``make_decision(kind=UNLOAD, ...)`` with these arguments: the same decision.

    Why not ``make_decision``: a shedder at a million bundles unloads tens of thousands of
    bundles in one cycle, and the kind needs no checking, there are no split boundaries, and
    ``inputs`` is the caller's own new dict, kept as it is rather than copied."""
    bundle = canonical_bundle_name(bundle)
    return _decision(
        decision_id(cycle, UNLOAD, bundle, source_broker, None),
        UNLOAD,
        bundle,
        source_broker,
        None,
        (),
        None,
        None,
        reason,
        strategy,
        MappingProxyType(inputs),
        cycle,
        decided_at_ms,
    )


def transfer_of(
    unload: Decision, *, cycle: str, destination: str, inputs: Mapping[str, Scalar]
) -> Decision:
    """The transfer of ``unload``'s bundle from its source to ``destination``: what
    ``make_decision`` gives for kind transfer with the unload's bundle, source, reason,
    strategy and decision time.

    Why not ``make_decision``: the unload was made by it, so its bundle name is already
    checked and canonical, and placement turns tens of thousands of unloads into transfers
    in one cycle at a million bundles."""
    bundle, source = unload.bundle, unload.source_broker
    return _decision(
        decision_id(cycle, TRANSFER, bundle, source, destination),
        TRANSFER,
        bundle,
        source,
        destination,
        (),
        None,
        None,
        unload.reason,
        unload.strategy,
        MappingProxyType(dict(inputs)),
        cycle,
        unload.decided_at_ms,
    )


@dataclass(frozen=True, slots=True)
class Skip:
    """A policy looked and chose not to act, with Pulsar's skip reason."""

    policy: str
    reason: SkipReason
    broker: str | None = None
    bundle: str | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class PolicyResult:
    """What one policy run produced: decisions and skips."""

    decisions: tuple[Decision, ...] = ()
    skips: tuple[Skip, ...] = ()


def _clean_inputs(inputs: Mapping[str, Scalar]) -> dict[str, Scalar]:
    out: dict[str, Scalar] = {}
    for k, v in inputs.items():
        if isinstance(v, float) and not math.isfinite(v):
            out[k] = str(v)
        else:
            out[k] = v
    return out


def decision_to_dict(d: Decision) -> dict[str, Any]:
    """The wire document; ``deciderTerm`` and ``decider`` only when set (module docstring)."""
    doc = {
        "schemaVersion": d.schema_version,
        "id": d.id,
        "kind": d.kind,
        "bundle": d.bundle,
        "sourceBroker": d.source_broker,
        "destinationBroker": d.destination_broker,
        "splitBoundaries": [f"0x{b:08x}" for b in d.split_boundaries],
        "splitAlgorithm": d.split_algorithm,
        "mergeBundle": d.merge_bundle,
        "reason": d.reason,
        "strategy": d.strategy,
        "inputs": _clean_inputs(d.inputs),
        "cycle": d.cycle,
        "decidedAtMs": d.decided_at_ms,
    }
    if d.term or d.decider:
        doc["deciderTerm"] = d.term
        doc["decider"] = d.decider
    return doc


def encode_decision(d: Decision, *, term: int | None = None, decider: str | None = None) -> bytes:
    """Compact, key-sorted JSON: identical decisions encode to identical bytes.

    ``term`` and ``decider`` stamp the decider lease's term and the job's id over ``d``'s own
    (the streaming job's decision stage stamps every decision it publishes; the policies that
    made ``d`` know nothing of leases)."""
    doc = decision_to_dict(d)
    if term is not None or decider is not None:
        doc["deciderTerm"] = d.term if term is None else term
        doc["decider"] = d.decider if decider is None else decider
    return _DECISION_JSON.encode(doc).encode()


def _unicode_ok(v: str) -> bool:
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _opt_str(doc: Mapping[str, Any], key: str) -> str | None:
    v = doc.get(key)
    if v is None:
        return None
    if not isinstance(v, str) or not v or len(v) > 1024:
        raise InvalidDecision(key, "must be a non-empty string of at most 1024 characters")
    if not _unicode_ok(v):
        raise InvalidDecision(key, "contains a lone surrogate (not valid Unicode)")
    return v


def _cap(text: str) -> str:
    if len(text) <= MAX_REASON_CHARS:
        return text
    suffix = f"...({len(text)} chars in all)"
    return text[: MAX_REASON_CHARS - len(suffix)] + suffix


def decode_decision(raw: bytes | str, *, max_bytes: int = DEFAULT_MAX_DECISION_BYTES) -> Decision:
    """Parse and validate a decision record; raise ``InvalidDecision`` naming the field."""
    if raw is None:
        raise InvalidDecision("record", "empty record value")
    try:
        return _decode(raw, max_bytes)
    except InvalidDecision as e:
        if len(e.field) <= MAX_REASON_CHARS and len(e.reason) <= MAX_REASON_CHARS:
            raise
        raise InvalidDecision(_cap(e.field), _cap(e.reason)) from None


def _decode(raw: bytes | str, max_bytes: int) -> Decision:
    doc = _document(raw, max_bytes)
    kind = doc.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        raise InvalidDecision("kind", f"must be one of {', '.join(KINDS)}, got {kind!r}")
    kind = DecisionKind(kind)
    rng, merge_bundle = _bundles(doc)
    bounds = _split_bounds(doc, rng)
    if kind == SPLIT and not bounds:
        raise InvalidDecision("splitBoundaries", "a split needs at least one boundary")
    if kind == MERGE and merge_bundle is None:
        raise InvalidDecision("mergeBundle", "a merge needs the second bundle")
    inputs = _inputs(doc)
    decided = doc.get("decidedAtMs", 0)
    if isinstance(decided, bool) or not isinstance(decided, int) or not 0 <= decided <= MAX_TIME_MS:
        raise InvalidDecision("decidedAtMs", "must be an integer from 0 to 2^63-1")
    did = doc.get("id")
    if not isinstance(did, str) or not (8 <= len(did) <= 128):
        raise InvalidDecision("id", "must be a string of 8 to 128 characters")
    if not did.isprintable() or not _unicode_ok(did):
        raise InvalidDecision("id", "must be printable, valid Unicode")
    src = _opt_str(doc, "sourceBroker")
    dst = _opt_str(doc, "destinationBroker")
    if kind == TRANSFER and dst is None:
        raise InvalidDecision("destinationBroker", "a transfer needs a destination")
    if src is not None and dst is not None and src == dst:
        raise InvalidDecision("destinationBroker", "destination is the source broker")
    cycle, reason, strategy, algo = _texts(doc)
    term, decider = _provenance(doc)
    return Decision(
        id=did,
        kind=kind,
        bundle=rng.name,  # canonical spelling: Redis keys and events use exactly this name
        source_broker=src,
        destination_broker=dst,
        split_boundaries=tuple(sorted(bounds)),
        split_algorithm=algo,
        merge_bundle=merge_bundle,
        reason=reason,
        strategy=strategy,
        inputs=MappingProxyType(inputs),
        cycle=cycle,
        decided_at_ms=decided,
        term=term,
        decider=decider,
    )


def _document(raw: bytes | str, max_bytes: int) -> dict[str, Any]:
    """The record as a JSON object of the supported schema version, within ``max_bytes``."""
    if len(raw) > max_bytes:
        raise InvalidDecision("record", f"{len(raw)} bytes exceeds the limit of {max_bytes}")
    try:
        # strict UTF-8 first: json.loads(bytes) would let encoded surrogates through
        text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else raw
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise InvalidDecision("record", f"not valid JSON: {type(e).__name__}") from None
    if not isinstance(doc, dict):
        raise InvalidDecision("record", "must be a JSON object")
    version = doc.get("schemaVersion")
    if type(version) is not int or version != SCHEMA_VERSION:
        raise InvalidDecision("schemaVersion", f"unsupported version {version!r}")
    return doc


def _bundles(doc: dict[str, Any]) -> tuple[BundleRange, str | None]:
    """The bundle's range and the canonical name of the merge partner, if any: printable,
    valid names, the partner adjacent and in the same namespace."""
    bundle = _opt_str(doc, "bundle")
    if bundle is None:
        raise InvalidDecision("bundle", "missing")
    merge_bundle = _opt_str(doc, "mergeBundle")
    for name, val in (("bundle", bundle), ("mergeBundle", merge_bundle)):
        # parse_bundle's patterns end in ``$``, which also matches before a final newline
        if val is not None and not val.isprintable():
            raise InvalidDecision(name, "bundle name contains unprintable characters")
    try:
        rng = parse_bundle(bundle)
        other = parse_bundle(merge_bundle) if merge_bundle is not None else None
    except InvalidInput as e:
        raise InvalidDecision(e.field, e.reason) from None
    if other is None:
        return rng, None
    if other.namespace != rng.namespace:
        raise InvalidDecision("mergeBundle", "must be in the same namespace as the bundle")
    if not (other.lower == rng.upper or other.upper == rng.lower):
        raise InvalidDecision("mergeBundle", "must be adjacent to the bundle (no overlap)")
    return rng, other.name


def _split_bounds(doc: dict[str, Any], rng: BundleRange) -> list[int]:
    """The split boundaries: at most 1024 distinct points strictly inside the bundle."""
    raw_bounds = doc.get("splitBoundaries") or []
    if not isinstance(raw_bounds, list) or len(raw_bounds) > 1024:
        raise InvalidDecision("splitBoundaries", "must be a list of at most 1024 boundaries")
    bounds: list[int] = []
    for b in raw_bounds:
        try:
            v = int(b, 16) if isinstance(b, str) else b
        except ValueError:
            raise InvalidDecision("splitBoundaries", f"not a hex number: {b!r}") from None
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 0xFFFFFFFF:
            raise InvalidDecision("splitBoundaries", f"outside the 32-bit ring: {b!r}")
        if not rng.lower < v < rng.upper:
            raise InvalidDecision("splitBoundaries", f"0x{v:08x} is not inside the bundle")
        bounds.append(v)
    if len(set(bounds)) != len(bounds):
        raise InvalidDecision("splitBoundaries", "boundaries repeat")
    return bounds


def _inputs(doc: dict[str, Any]) -> dict[str, Scalar]:
    """The inputs that led to the decision: at most 256 scalars, valid Unicode."""
    inputs = doc.get("inputs") or {}
    if not isinstance(inputs, dict) or len(inputs) > 256:
        raise InvalidDecision("inputs", "must be an object with at most 256 entries")
    clean: dict[str, Scalar] = {}
    for k, v in inputs.items():
        if not (v is None or isinstance(v, (str, int, float, bool))):
            raise InvalidDecision("inputs", f"value of {k!r} must be a scalar")
        if not _unicode_ok(k) or (isinstance(v, str) and not _unicode_ok(v)):
            raise InvalidDecision("inputs", "contains a lone surrogate (not valid Unicode)")
        clean[str(k)] = v
    return clean


def _texts(doc: dict[str, Any]) -> tuple[str, str, str, str | None]:
    """cycle, reason, strategy and split algorithm: strings of at most 256 characters."""
    cycle = doc.get("cycle", "")
    reason = doc.get("reason", "")
    strategy = doc.get("strategy", "")
    algo = doc.get("splitAlgorithm")
    for name, val in (
        ("cycle", cycle),
        ("reason", reason),
        ("strategy", strategy),
        ("splitAlgorithm", "" if algo is None else algo),
    ):
        if not isinstance(val, str) or len(val) > 256:
            raise InvalidDecision(name, "must be a string of at most 256 characters")
        if not _unicode_ok(val):
            raise InvalidDecision(name, "contains a lone surrogate (not valid Unicode)")
    return cycle, reason, strategy, algo


def _provenance(doc: dict[str, Any]) -> tuple[int, str]:
    """``deciderTerm`` (an integer from 0 to 2^63-1; absent: 0) and ``decider`` (a printable
    string of at most 256 characters; absent: "")."""
    term = doc.get("deciderTerm", 0)
    if isinstance(term, bool) or not isinstance(term, int) or not 0 <= term <= MAX_TIME_MS:
        raise InvalidDecision("deciderTerm", "must be an integer from 0 to 2^63-1")
    decider = doc.get("decider", "")
    if not isinstance(decider, str) or len(decider) > 256 or not decider.isprintable():
        raise InvalidDecision("decider", "must be a printable string of at most 256 characters")
    if not _unicode_ok(decider):
        raise InvalidDecision("decider", "contains a lone surrogate (not valid Unicode)")
    return term, decider
