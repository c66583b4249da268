"""Decode Pulsar ``LocalBrokerData`` JSON load reports, with validation.

Field names are Pulsar's (as written under ``/loadbalance/brokers/<broker>`` and printed by
``pulsar-admin broker-stats load-report``); unknown fields are ignored so a real broker's report
is accepted as it is. Every rejection raises ``InvalidReport`` whose ``field`` names the JSON path
and whose ``reason`` says what is wrong; the size limit is checked before parsing. ``encode_report``
writes the same format, for the agent and the simulator.

Hostile input (issue 6) is answered here, once, for the job and the tools alike: numbers must be
finite, non-negative and below ``MAX_NUMBER`` (so sums and averages downstream stay finite), a
usage above ``MAX_USAGE_OVER_LIMIT`` times its limit is a broken sensor, bundle names must lie
inside the ring and must not overlap within one report (a broker cannot own both a bundle and a
piece of it), strings must be valid Unicode (a lone surrogate escape would break Arrow and
Kafka encoders later), and an error's ``field`` and ``reason`` are cut to ``MAX_REASON_CHARS`` so
that a dead letter built from them stays small whatever the record held.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from loadbalance.bundles import BundleRange, parse_bundle
from loadbalance.errors import InvalidInput, InvalidReport
from loadbalance.model import LocalBrokerData, NamespaceBundleStats, ResourceUsage

DEFAULT_MAX_REPORT_BYTES = 1024 * 1024
MAX_BUNDLES_PER_REPORT = 100_000
MAX_BROKER_ID_CHARS = 256
# A reading above this multiple of its limit is a broken sensor, not an overload.
MAX_USAGE_OVER_LIMIT = 10.0
# Above 2^53 a float no longer holds every integer; no real rate, count or usage gets near it,
# and the cap keeps sums of up to MAX_BUNDLES_PER_REPORT values finite.
MAX_NUMBER = float(2**53)
MAX_REASON_CHARS = 300

_RESOURCES = (
    ("cpu", "cpu"),
    ("memory", "memory"),
    ("directMemory", "direct_memory"),
    ("bandwidthIn", "bandwidth_in"),
    ("bandwidthOut", "bandwidth_out"),
)
_RATES = (
    ("msgThroughputIn", "msg_throughput_in"),
    ("msgThroughputOut", "msg_throughput_out"),
    ("msgRateIn", "msg_rate_in"),
    ("msgRateOut", "msg_rate_out"),
)
_COUNTS = (
    ("numTopics", "num_topics"),
    ("numBundles", "num_bundles"),
    ("numConsumers", "num_consumers"),
    ("numProducers", "num_producers"),
)
_STATS_RATES = (
    ("msgRateIn", "msg_rate_in"),
    ("msgRateOut", "msg_rate_out"),
    ("msgThroughputIn", "msg_throughput_in"),
    ("msgThroughputOut", "msg_throughput_out"),
)
_STATS_COUNTS = (
    ("topics", "topics"),
    ("consumerCount", "consumer_count"),
    ("producerCount", "producer_count"),
)


def _number(value: Any, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidReport(path, f"must be a number, got {type(value).__name__}")
    try:
        v = float(value)
    except OverflowError:  # an integer literal beyond the float range
        raise InvalidReport(path, "number out of range") from None
    if not math.isfinite(v):
        raise InvalidReport(path, "must be a finite number")
    if v < 0:
        raise InvalidReport(path, f"must not be negative, got {v:g}")
    if v > MAX_NUMBER:
        raise InvalidReport(path, f"implausibly large: {v:g} is above 2^53")
    return v


def _count(value: Any, path: str) -> int:
    v = _number(value, path)
    if v != int(v):
        raise InvalidReport(path, f"must be a whole number, got {v:g}")
    return int(v)


def _resource(doc: Any, path: str) -> ResourceUsage:
    if not isinstance(doc, dict):
        raise InvalidReport(
            path, f"must be an object with usage and limit, got {type(doc).__name__}"
        )
    if "usage" in doc and "limit" not in doc:
        raise InvalidReport(f"{path}.limit", "usage given without limit")
    usage = _number(doc.get("usage", 0.0), f"{path}.usage")
    limit = _number(doc.get("limit", 0.0), f"{path}.limit")
    if limit > 0 and usage > limit * MAX_USAGE_OVER_LIMIT:
        raise InvalidReport(
            f"{path}.usage", f"{usage:g} is more than {MAX_USAGE_OVER_LIMIT:g}x its limit {limit:g}"
        )
    return ResourceUsage(usage, limit)


def _cap(text: str) -> str:
    """Cut a field path or reason so a dead letter built from it stays small."""
    if len(text) <= MAX_REASON_CHARS:
        return text
    suffix = f"...({len(text)} chars in all)"
    return text[: MAX_REASON_CHARS - len(suffix)] + suffix


def _text(value: Any, path: str) -> str:
    """A string field: must be a string of valid Unicode (no lone surrogate escapes)."""
    if not isinstance(value, str):
        raise InvalidReport(path, f"must be a string, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidReport(path, "contains a lone surrogate (not valid Unicode)") from None
    return value


def _bundle(name: Any, path: str) -> BundleRange:
    if isinstance(name, str) and not name.isprintable():
        raise InvalidReport(path, "bundle name contains unprintable characters")
    try:
        return parse_bundle(name)
    except InvalidInput as e:
        raise InvalidReport(path, e.reason) from None


def _check_no_overlap(ranges: set[BundleRange]) -> None:
    """Bundles of one namespace in one report must be disjoint ranges of the ring."""
    previous: BundleRange | None = None
    for r in sorted(ranges):
        if previous is not None and previous.namespace == r.namespace and r.lower < previous.upper:
            raise InvalidReport("bundles", f"{previous.name} and {r.name} overlap")
        previous = r


def _stats(doc: Any, path: str) -> NamespaceBundleStats:
    if not isinstance(doc, dict):
        raise InvalidReport(path, f"must be an object, got {type(doc).__name__}")
    kw: dict[str, Any] = {}
    for key, attr in _STATS_RATES:
        kw[attr] = _number(doc.get(key, 0.0), f"{path}.{key}")
    for key, attr in _STATS_COUNTS:
        kw[attr] = _count(doc.get(key, 0), f"{path}.{key}")
    return NamespaceBundleStats(**kw)


def _broker_from_url(url: str) -> str:
    rest = url.split("://", 1)[-1]
    return rest.split("/", 1)[0]


def decode_report(
    raw: bytes | str,
    broker_id: str | None = None,
    *,
    max_bytes: int = DEFAULT_MAX_REPORT_BYTES,
) -> LocalBrokerData:
    """Decode one report; ``broker_id`` is the record key, else ``webServiceUrl``'s host:port."""
    return report_from_document(load_report_document(raw, max_bytes=max_bytes), broker_id)


def load_report_document(
    raw: bytes | str, *, max_bytes: int = DEFAULT_MAX_REPORT_BYTES
) -> dict[str, Any]:
    """The first steps of ``decode_report``: size limit, strict UTF-8, JSON, a JSON object."""
    if raw is None:
        raise InvalidReport("record", "empty record value")
    if len(raw) > max_bytes:
        raise InvalidReport("record", f"{len(raw)} bytes exceeds the limit of {max_bytes}")
    try:
        # strict UTF-8 first: json.loads(bytes) would let encoded surrogates through
        text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else raw
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise InvalidReport("record", f"not valid JSON ({type(e).__name__})") from None
    if not isinstance(doc, dict):
        raise InvalidReport("record", f"must be a JSON object, got {type(doc).__name__}")
    return doc


def report_from_document(doc: dict[str, Any], broker_id: str | None = None) -> LocalBrokerData:
    """The last step of ``decode_report``: ``report_from_dict`` with field and reason capped."""
    try:
        return report_from_dict(doc, broker_id)
    except InvalidReport as e:
        if len(e.field) <= MAX_REASON_CHARS and len(e.reason) <= MAX_REASON_CHARS:
            raise
        raise InvalidReport(_cap(e.field), _cap(e.reason)) from None


def report_from_dict(doc: Mapping[str, Any], broker_id: str | None = None) -> LocalBrokerData:
    """Validate an already-parsed report document."""
    web = _text(doc.get("webServiceUrl") or "", "webServiceUrl")
    broker = broker_id or (_broker_from_url(web) if web else "")
    if not broker:
        raise InvalidReport("key", "no broker id: the record has no key and no webServiceUrl")
    if len(broker) > MAX_BROKER_ID_CHARS or not broker.isprintable() or broker != broker.strip():
        raise InvalidReport("key", "broker id must be printable, trimmed, at most 256 characters")
    kw: dict[str, Any] = {}
    for key, attr in _RESOURCES:
        if key in doc and doc[key] is not None:
            kw[attr] = _resource(doc[key], key)
    for key, attr in _RATES:
        kw[attr] = _number(doc.get(key, 0.0), key)
    for key, attr in _COUNTS:
        kw[attr] = _count(doc.get(key, 0), key)
    raw_stats = doc.get("lastStats") or {}
    if not isinstance(raw_stats, dict):
        raise InvalidReport("lastStats", "must be an object of bundle -> stats")
    if len(raw_stats) > MAX_BUNDLES_PER_REPORT:
        raise InvalidReport("lastStats", f"more than {MAX_BUNDLES_PER_REPORT} bundles")
    ranges: set[BundleRange] = set()
    stats: dict[str, NamespaceBundleStats] = {}
    for name, s in raw_stats.items():
        r = _bundle(name, f"lastStats[{name!r}]")
        ranges.add(r)
        stats[r.name] = _stats(s, f"lastStats[{name!r}]")
    raw_bundles = doc.get("bundles")
    if raw_bundles is None:
        bundles = frozenset(stats)
    else:
        if not isinstance(raw_bundles, list):
            raise InvalidReport("bundles", "must be a list of bundle names")
        if len(raw_bundles) > MAX_BUNDLES_PER_REPORT:
            raise InvalidReport("bundles", f"more than {MAX_BUNDLES_PER_REPORT} bundles")
        listed = {_bundle(b, f"bundles[{i}]") for i, b in enumerate(raw_bundles)}
        ranges |= listed
        bundles = frozenset(r.name for r in listed) | frozenset(stats)
    _check_no_overlap(ranges)
    last_update = _count(doc.get("lastUpdate", 0), "lastUpdate")
    version = _text(doc.get("brokerVersionString") or "", "brokerVersionString")
    pulsar_url = _text(doc.get("pulsarServiceUrl") or "", "pulsarServiceUrl")
    return LocalBrokerData(
        broker=broker,
        bundles=bundles,
        last_stats=MappingProxyType(stats),
        last_update_ms=last_update,
        web_service_url=web,
        pulsar_service_url=pulsar_url,
        broker_version=version,
        **kw,
    )


def _resource_doc(r: ResourceUsage) -> dict[str, float]:
    return {"usage": r.usage, "limit": r.limit}


def report_to_dict(r: LocalBrokerData) -> dict[str, Any]:
    """The report as Pulsar writes it (``LocalBrokerData`` JSON field names)."""
    return {
        "webServiceUrl": r.web_service_url,
        "pulsarServiceUrl": r.pulsar_service_url,
        "cpu": _resource_doc(r.cpu),
        "memory": _resource_doc(r.memory),
        "directMemory": _resource_doc(r.direct_memory),
        "bandwidthIn": _resource_doc(r.bandwidth_in),
        "bandwidthOut": _resource_doc(r.bandwidth_out),
        "msgThroughputIn": r.msg_throughput_in,
        "msgThroughputOut": r.msg_throughput_out,
        "msgRateIn": r.msg_rate_in,
        "msgRateOut": r.msg_rate_out,
        "numTopics": r.num_topics,
        "numBundles": r.num_bundles,
        "numConsumers": r.num_consumers,
        "numProducers": r.num_producers,
        "bundles": sorted(r.bundles),
        "lastStats": {
            name: {
                "msgRateIn": s.msg_rate_in,
                "msgRateOut": s.msg_rate_out,
                "msgThroughputIn": s.msg_throughput_in,
                "msgThroughputOut": s.msg_throughput_out,
                "topics": s.topics,
                "consumerCount": s.consumer_count,
                "producerCount": s.producer_count,
            }
            for name, s in sorted(r.last_stats.items())
        },
        "lastUpdate": r.last_update_ms,
        "brokerVersionString": r.broker_version,
        "loadReportType": "LocalBrokerData",
    }


def encode_report(r: LocalBrokerData) -> bytes:
    return json.dumps(report_to_dict(r), separators=(",", ":")).encode()
