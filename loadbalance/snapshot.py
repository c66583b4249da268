"""The offline cluster snapshot read by ``lbctl decide``: parse it into a ``ClusterView``.

A snapshot is one JSON document (documented in ``docs/snapshot-format.md``, example in
``examples/snapshot.json``)::

    {
      "snapshotVersion": 1,
      "nowMs": 1700000000000,
      "config": {"loadBalancerLoadSheddingStrategy": "OverloadShedder"},
      "namespaces": {"tenant/ns": ["0x00000000", "0x80000000", "0xffffffff"]},
      "brokers": {
        "broker-1:8080": {"report": {<LocalBrokerData JSON>}, "historyUsage": 0.72}
      },
      "bundleData": {"tenant/ns/0x00000000_0x80000000": {
          "shortTerm": {"msgRateIn": 1, "msgRateOut": 1, "msgThroughputIn": 1,
                        "msgThroughputOut": 1, "numSamples": 10},
          "longTerm": {...}, "topics": 3}},
      "recentlyUnloaded": {"tenant/ns/0x80000000_0xffffffff": 1699999990000},
      "topicHashes": {"tenant/ns/0x00000000_0x80000000": ["0x00000010", "0x00000020"]},
      "policies": {"namespaceIsolationPolicies": {...}, "localPolicies": {...},
                   "failureDomains": {...}}
    }

``policies`` holds the operator's placement policies in Pulsar's admin JSON shapes
(``PlacementPolicies.from_admin_json``), and becomes the view's ``policies``.

Only ``brokers`` is required. A broker without ``historyUsage`` starts from its report's
within-limit weighted usage, one without ``weightedMaxEma`` (TransferShedder's
``weightedMaxEMA``; documents written before the job kept it lack it) from its report's weighted
usage with every signal (the first-sample rule for both); a bundle without ``bundleData`` gets
one sample from the reports' ``lastStats``, as the first report would give it. Parsing is pure:
the shell reads the file and passes the bytes.

Validation: a snapshot is operator input (a file, or the load snapshot the streaming job keeps in
Redis), so every field is checked with the report codec's own rules (``report_codec._number``
and friends: finite, non-negative, at most 2^53, whole numbers where Pulsar has integers,
valid Unicode) instead of a second set that could drift from them. A number that reached the
policies as NaN or infinity would make every comparison false and let a shedder act on garbage,
so it is refused here, once. Every refusal is an ``InvalidInput`` whose ``field`` is the JSON
path from the document root (``snapshot.brokers["b1"].historyUsage``), cut to a bounded length
so that a hostile key cannot make the one-line message huge. Bundle names are canonicalised
(``parse_bundle(name).name``), and two spellings of one bundle are refused rather than merged.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar

from loadbalance.bundles import FULL_UPPER, NamespaceBundles, validate_namespace
from loadbalance.errors import InvalidInput
from loadbalance.placement.policies import PlacementPolicies
from loadbalance.report_codec import (
    _bundle,
    _cap,
    _count,
    _number,
    _text,
    report_from_dict,
)
from loadbalance.time_average import (
    NUM_LONG_SAMPLES,
    NUM_SHORT_SAMPLES,
    BundleData,
    TimeAverageMessageData,
)
from loadbalance.view import BrokerLoad, ClusterView, LoadState, UsageWeights, build_view

SNAPSHOT_VERSION = 1
ROOT = "snapshot"
TOP_LEVEL_KEYS = frozenset(
    {
        "snapshotVersion",
        "nowMs",
        "config",
        "namespaces",
        "brokers",
        "bundleData",
        "recentlyUnloaded",
        "topicHashes",
        "policies",
    }
)
# A key longer than this is shown cut in an error path (the path stays one short line).
MAX_KEY_CHARS_IN_PATH = 80
_HEX_RE = re.compile(r"^0x[0-9a-fA-F]{1,8}\Z")
_KNOB_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.\-]*\Z")
_RATES = (
    ("msgThroughputIn", "msg_throughput_in"),
    ("msgThroughputOut", "msg_throughput_out"),
    ("msgRateIn", "msg_rate_in"),
    ("msgRateOut", "msg_rate_out"),
)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A parsed snapshot: the view, its time, and the config overrides it carries."""

    view: ClusterView
    now_ms: int
    config_overrides: Mapping[str, str]


def key_path(path: str, key: str) -> str:
    """``path["key"]`` with the key JSON-escaped (one line, ASCII) and cut when very long."""
    shown = json.dumps(key)
    if len(shown) > MAX_KEY_CHARS_IN_PATH:
        shown = shown[: MAX_KEY_CHARS_IN_PATH - 4] + '..."'
    return f"{path}[{shown}]"


def _fail(path: str, reason: str) -> InvalidInput:
    return InvalidInput(_cap(path), _cap(reason))


def _checked(path: str, fn: Callable[..., T], *args: Any) -> T:
    """Run a validator; its refusal is re-raised under ``path``, the full JSON path (the bundle
    and namespace helpers name only a generic field such as ``bundle``)."""
    try:
        return fn(*args)
    except InvalidInput as e:
        raise _fail(path, e.reason) from None


def _object(value: Any, path: str, what: str = "an object") -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(path, f"must be {what}, got {_type(value)}")
    return value


def _type(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _key(key: str, path: str) -> str:
    """An object key as text: valid Unicode (JSON keys are strings, but may hold lone surrogate
    escapes that would break printing the error, or any encoder later)."""
    return _checked(path, _text, key, path)


def _num(value: Any, path: str) -> float:
    """The codec's number rule: finite, not negative, at most 2^53."""
    return _checked(path, _number, value, path)


def _int(value: Any, path: str) -> int:
    """The codec's count rule: ``_num`` and a whole number."""
    return _checked(path, _count, value, path)


def _num_field(doc: Mapping[str, Any], key: str, path: str, default: float) -> float:
    value = doc.get(key)
    return default if value is None else _num(value, f"{path}.{key}")


def _int_field(doc: Mapping[str, Any], key: str, path: str, default: int) -> int:
    value = doc.get(key)
    return default if value is None else _int(value, f"{path}.{key}")


def _bundle_name(name: str, path: str) -> str:
    """The canonical name of a bundle key (lower-case hex), via the codec's bundle check."""
    _key(name, path)
    return _checked(path, _bundle, name, path).name


def _bundle_map(doc: Mapping[str, Any], path: str) -> dict[str, tuple[str, Any]]:
    """Canonical bundle name -> (its path, value); two spellings of one bundle are refused."""
    out: dict[str, tuple[str, Any]] = {}
    for name, value in doc.items():
        p = key_path(path, name)
        canon = _bundle_name(name, p)
        if canon in out:
            raise _fail(p, f"the same bundle as {canon!r}, spelled twice")
        out[canon] = (p, value)
    return out


def _hash(value: Any, path: str) -> int:
    """A ring position: a hex string ``0x`` + 1 to 8 digits, or a whole number in the ring."""
    if isinstance(value, str):
        if not _HEX_RE.match(value):
            raise _fail(path, "must be a hash value like 0x0000abcd")
        return int(value, 16)
    v = _int(value, path)
    if v > FULL_UPPER:
        raise _fail(path, "outside the 32-bit ring")
    return v


def _average(doc: Any, max_samples: int, path: str) -> TimeAverageMessageData:
    doc = _object(doc, path)
    n = _int_field(doc, "numSamples", path, max_samples)
    if n > max_samples:
        raise _fail(f"{path}.numSamples", f"must be at most {max_samples}, got {n}")
    rates = {attr: _num_field(doc, key, path, 0.0) for key, attr in _RATES}
    return TimeAverageMessageData(max_samples=max_samples, num_samples=n, **rates)


def _bundle_data(doc: Any, path: str) -> BundleData:
    doc = _object(doc, path)
    short = doc.get("shortTerm")
    long = doc.get("longTerm")
    return BundleData(
        _average({} if short is None else short, NUM_SHORT_SAMPLES, f"{path}.shortTerm"),
        _average({} if long is None else long, NUM_LONG_SAMPLES, f"{path}.longTerm"),
        _int_field(doc, "topics", path, 0),
    )


def _config_value(value: Any, path: str) -> str:
    """A knob value as the text ``--set`` would carry: a string, a boolean or a finite number.
    A string spelling a non-finite number (``"inf"``, ``"NaN"``) is refused too, as the same
    number written as JSON would be."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        try:
            finite = math.isfinite(value)
        except OverflowError:
            finite = False
        if not finite:
            raise _fail(path, "must be a finite number")
        return str(value)
    if not isinstance(value, str):
        raise _fail(path, f"must be a string, a number or a boolean, got {_type(value)}")
    _checked(path, _text, value, path)
    try:
        as_number = float(value)
    except (ValueError, OverflowError):
        return value
    if not math.isfinite(as_number):
        raise _fail(path, "must be a finite number")
    return value


def load_snapshot_document(raw: bytes | str) -> dict[str, Any]:
    """Strict UTF-8, then JSON, then a JSON object: every failure is one ``InvalidInput``.

    ``RecursionError`` is caught because ``json`` refuses very deep nesting that way; a
    ``str`` is checked for lone surrogates by encoding it, as bytes are by decoding."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else raw
        text.encode("utf-8")
    except UnicodeError as e:
        raise _fail(ROOT, f"not valid UTF-8 (at position {e.start})") from None
    try:
        doc = json.loads(text)
    except RecursionError:
        raise _fail(ROOT, "not valid JSON: nested too deeply") from None
    except ValueError as e:
        raise _fail(ROOT, f"not valid JSON: {e}") from None
    doc = _object(doc, ROOT, "a JSON object")
    for key in doc:
        if key not in TOP_LEVEL_KEYS:
            raise _fail(
                key_path(ROOT, key), f"unknown key (known: {', '.join(sorted(TOP_LEVEL_KEYS))})"
            )
    version = doc.get("snapshotVersion", SNAPSHOT_VERSION)
    if type(version) is not int or version != SNAPSHOT_VERSION:
        raise _fail(f"{ROOT}.snapshotVersion", f"unsupported version, only {SNAPSHOT_VERSION}")
    return doc


def snapshot_config(doc: Mapping[str, Any]) -> dict[str, str]:
    """The snapshot's knob overrides, validated, as ``--set`` text (Pulsar knob names)."""
    path = f"{ROOT}.config"
    raw = doc.get("config")
    out: dict[str, str] = {}
    for knob, value in _object({} if raw is None else raw, path).items():
        p = key_path(path, knob)
        if not _KNOB_RE.match(_key(knob, p)):
            raise _fail(p, "not a knob name")
        out[knob] = _config_value(value, p)
    return out


def parse_snapshot(raw: bytes | str, weights: UsageWeights | None = None) -> Snapshot:
    """Parse snapshot JSON; raise ``InvalidInput`` naming the JSON path of the first problem."""
    doc = load_snapshot_document(raw)
    return snapshot_from_document(doc, snapshot_config(doc), weights)


def _section(doc: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = doc.get(key)
    return {} if value is None else _object(value, f"{ROOT}.{key}")


def bundle_data_from_document(
    section: Mapping[str, Any], path: str = f"{ROOT}.bundleData"
) -> dict[str, BundleData]:
    """A ``bundleData`` section (bundle -> ``{"shortTerm", "longTerm", "topics"}``) as canonical
    bundle name -> ``BundleData``, with every rule of the snapshot; placement reads the recorded
    preallocations with it too."""
    return {name: _bundle_data(bd, p) for name, (p, bd) in _bundle_map(section, path).items()}


def preallocations_from_documents(
    docs: Mapping[str, Mapping[str, Any]],
) -> tuple[dict[str, dict[str, BundleData]], list[str]]:
    """Recorded preallocations (broker -> bundle -> ``{shortTerm, longTerm, topics}``) as
    broker -> bundle -> ``BundleData``, and one line per broker whose entries were refused (that
    broker's preallocations are left out: a bad record must not stop the policy cycle)."""
    out: dict[str, dict[str, BundleData]] = {}
    refused: list[str] = []
    for broker in sorted(docs):
        try:
            out[broker] = bundle_data_from_document(docs[broker], f"preallocated.{broker}")
        except InvalidInput as e:
            refused.append(f"{broker}: {e}")
    return out, refused


def snapshot_from_document(
    doc: Mapping[str, Any],
    config_overrides: Mapping[str, str],
    weights: UsageWeights | None = None,
) -> Snapshot:
    """The view of a document from ``load_snapshot_document`` (null means absent)."""
    weights = weights or UsageWeights()
    path = f"{ROOT}.brokers"
    raw_brokers = doc.get("brokers")
    if not isinstance(raw_brokers, dict) or not raw_brokers:
        raise _fail(path, "must be a non-empty object of broker -> {report}")

    bundles = bundle_data_from_document(_section(doc, "bundleData"))

    reports = {}
    for broker in sorted(raw_brokers):
        p = key_path(path, broker)
        _key(broker, p)
        if not broker:
            raise _fail(p, "a broker id must not be empty")
        entry = _object(raw_brokers[broker], p, "an object with a 'report'")
        report_doc = _object(entry.get("report"), f"{p}.report")
        try:
            report = report_from_dict(report_doc, broker)
        except InvalidInput as e:
            where = p if e.field == "key" else f"{p}.report.{e.field}"
            raise _fail(where, e.reason) from None
        reports[broker] = (report, entry, p)
        for name, stats in report.last_stats.items():
            if name not in bundles:
                bundles[name] = BundleData.new().update(stats)

    brokers: dict[str, BrokerLoad] = {}
    for broker, (report, entry, p) in reports.items():
        usage = entry.get("historyUsage")
        brokers[broker] = BrokerLoad(
            report=report,
            history_usage=(
                weights.weighted_max(report) if usage is None else _num(usage, f"{p}.historyUsage")
            ),
            msg_throughput_ema=_num_field(entry, "msgThroughputEma", p, report.msg_throughput),
            received_at_ms=_int_field(entry, "updatedAtMs", p, report.last_update_ms),
            weighted_max_ema=_num_field(
                entry, "weightedMaxEma", p, weights.weighted_max_uncapped(report)
            ),
        )

    namespaces: dict[str, NamespaceBundles] = {}
    for ns, bounds in _section(doc, "namespaces").items():
        p = key_path(f"{ROOT}.namespaces", ns)
        _checked(p, validate_namespace, _key(ns, p))
        if not isinstance(bounds, list):
            raise _fail(p, f"must be a list of boundaries, got {_type(bounds)}")
        parsed = tuple(_hash(b, f"{p}[{i}]") for i, b in enumerate(bounds))
        namespaces[ns] = _checked(p, NamespaceBundles, ns, parsed)

    path = f"{ROOT}.recentlyUnloaded"
    recent = {
        name: _int(t, p)
        for name, (p, t) in _bundle_map(_section(doc, "recentlyUnloaded"), path).items()
    }
    hashes: dict[str, tuple[int, ...]] = {}
    for name, (p, hs) in _bundle_map(_section(doc, "topicHashes"), f"{ROOT}.topicHashes").items():
        if not isinstance(hs, list):
            raise _fail(p, f"must be a list of topic hashes, got {_type(hs)}")
        hashes[name] = tuple(_hash(h, f"{p}[{i}]") for i, h in enumerate(hs))

    policies = PlacementPolicies.from_admin_json(doc.get("policies"), f"{ROOT}.policies")
    newest = max((r.last_update_ms for r, _, _ in reports.values()), default=0)
    now_ms = _int_field(doc, "nowMs", ROOT, newest)
    view = build_view(
        LoadState(MappingProxyType(brokers), MappingProxyType(bundles)),
        namespaces=namespaces,
        recently_unloaded=recent,
        topic_hashes=hashes,
        policies=policies,
    )
    return Snapshot(view, now_ms, MappingProxyType(dict(config_overrides)))
