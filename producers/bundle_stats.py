"""Where the agent gets a broker's per-bundle stats: pluggable providers.

Why pluggable: the host figures come from psutil, but which bundles a broker serves and how busy
each one is only the broker knows. A real Pulsar broker already computes both for its own load
manager and serves them at ``GET /admin/v2/broker-stats/load-report``; other brokers (or a test
rig) can write the same JSON to a file or serve it over HTTP. All three speak the documents of
Pulsar's three load managers (``LocalBrokerData``, the simple manager's ``LoadReport``, the
extensible manager's ``BrokerLoadData``), of which only what the agent uses is read and judged:
the bundles and their stats, and the broker's own resource readings (JVM heap and direct memory,
the broker's CPU and NIC view), which the agent prefers to its psutil host readings. Broker
totals and fields the agent does not use are not validated, so a fault there cannot cost the
broker its report. What is read goes through ``report_from_dict`` with the codec's rules: a
broken reading or bundle entry is ignored and listed in ``issues``.

Errors: bad content raises ``InvalidReport`` (it will stay bad; fix the source); an unreachable
file or endpoint raises ``Transient`` (the agent skips that check and tries again).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

from loadbalance.errors import InvalidReport, Transient
from loadbalance.model import (
    BROKER_LOAD_DATA,
    LOAD_REPORT,
    LOCAL_BROKER_DATA,
    NamespaceBundleStats,
    ReportIssue,
    ResourceUsage,
)
from loadbalance.report_codec import DEFAULT_MAX_REPORT_BYTES, report_from_dict, report_type_of

PULSAR_LOAD_REPORT_PATH = "/admin/v2/broker-stats/load-report"
# report_from_dict wants a broker id; the provider's document is not trusted to name ours
_PLACEHOLDER_BROKER = "provider"
_RESOURCE_FIELDS = ("cpu", "memory", "directMemory", "bandwidthIn", "bandwidthOut")
_USAGE_ATTRS = ("cpu", "memory", "direct_memory", "bandwidth_in", "bandwidth_out")
# What the agent reads of each document kind; everything else is not looked at.
_USED_FIELDS = {
    LOCAL_BROKER_DATA: ("lastStats", "bundles", *_RESOURCE_FIELDS),
    LOAD_REPORT: ("bundleStats", "systemResourceUsage", *_RESOURCE_FIELDS),
    BROKER_LOAD_DATA: _RESOURCE_FIELDS,
}


@dataclass(frozen=True, slots=True)
class BundleStatsSnapshot:
    """The bundles a broker serves and the latest stats of each."""

    bundles: frozenset[str] = frozenset()
    last_stats: Mapping[str, NamespaceBundleStats] = field(
        default_factory=lambda: MappingProxyType({})
    )
    usage: Mapping[str, ResourceUsage] = field(default_factory=lambda: MappingProxyType({}))
    """The broker's own known readings by ``LocalBrokerData`` attribute (``cpu``, ``memory``,
    ``direct_memory``, ``bandwidth_in``, ``bandwidth_out``); unknown ones are left out."""
    report_type: str = LOCAL_BROKER_DATA
    issues: tuple[ReportIssue, ...] = ()
    issue_counts: tuple[tuple[str, int], ...] = ()


class BundleStatsProvider(Protocol):
    """Anything the agent can ask for the current bundle stats."""

    def fetch(self) -> BundleStatsSnapshot: ...


def parse_stats_document(raw: bytes | str, source: str) -> BundleStatsSnapshot:
    """Parse a load-report JSON; ``source`` names the file or URL in every error."""
    if len(raw) > DEFAULT_MAX_REPORT_BYTES:
        raise InvalidReport(source, f"{len(raw)} bytes exceeds {DEFAULT_MAX_REPORT_BYTES}")
    try:
        doc: Any = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidReport(source, f"not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise InvalidReport(source, f"must be a JSON object, got {type(doc).__name__}")
    kind = report_type_of(doc)
    used = _USED_FIELDS[kind]
    try:
        report = report_from_dict(
            {k: doc[k] for k in used if k in doc}, _PLACEHOLDER_BROKER, report_type=kind
        )
    except InvalidReport as e:
        raise InvalidReport(f"{source}: {e.field}", e.reason) from None
    usage = {attr: r for attr in _USAGE_ATTRS if (r := getattr(report, attr)).known}
    return BundleStatsSnapshot(
        bundles=report.bundles,
        last_stats=report.last_stats,
        usage=MappingProxyType(usage),
        report_type=report.report_type,
        issues=report.issues,
        issue_counts=report.issue_counts,
    )


class FileStatsProvider:
    """Reads the JSON document from a file on every fetch (a broker rewrites it in place)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def fetch(self) -> BundleStatsSnapshot:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            raise Transient(f"bundle stats file {self.path} does not exist (yet)") from None
        except OSError as e:
            raise Transient(f"cannot read bundle stats file {self.path}: {e.strerror}") from None
        return parse_stats_document(raw, str(self.path))


class HttpStatsProvider:
    """GETs the JSON document from a URL; optional headers carry e.g. an auth token."""

    def __init__(
        self, url: str, timeout_s: float = 5.0, headers: Mapping[str, str] | None = None
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.url = url
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})

    def fetch(self) -> BundleStatsSnapshot:
        request = urllib.request.Request(
            self.url, headers={"Accept": "application/json", **self.headers}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                raw = response.read(DEFAULT_MAX_REPORT_BYTES + 1)
        except urllib.error.HTTPError as e:
            if 400 <= e.code < 500 and e.code not in (408, 429):
                raise InvalidReport(self.url, f"HTTP {e.code} {e.reason}") from None
            raise Transient(f"{self.url}: HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise Transient(f"{self.url}: {reason}") from None
        return parse_stats_document(raw, self.url)


class PulsarStatsProvider(HttpStatsProvider):
    """Reads a Pulsar broker's own load report from its admin endpoint.

    ``url`` is the broker's web service URL (``http://broker:8080``); the admin path is added.
    A token for a broker with authentication on goes in ``Authorization: Bearer ...``.
    """

    def __init__(self, web_service_url: str, timeout_s: float = 5.0, token: str = "") -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else None
        super().__init__(web_service_url.rstrip("/") + PULSAR_LOAD_REPORT_PATH, timeout_s, headers)


class EmptyStatsProvider:
    """No bundles: a broker that serves nothing yet still reports its host usage."""

    def fetch(self) -> BundleStatsSnapshot:
        return BundleStatsSnapshot()


def provider_from_spec(spec: str | None, token: str = "") -> BundleStatsProvider:
    """``file:PATH``, ``http:URL`` or ``pulsar:URL`` (``None``/empty: no bundles)."""
    if not spec:
        return EmptyStatsProvider()
    if spec.startswith(("http://", "https://")):  # a bare URL: forgive the missing prefix
        return HttpStatsProvider(spec)
    kind, sep, rest = spec.partition(":")
    if not sep or not rest:
        raise ValueError(f"provider must be file:PATH, http:URL or pulsar:URL, got {spec!r}")
    if kind == "file":
        return FileStatsProvider(rest)
    if kind == "http":
        return HttpStatsProvider(rest)
    if kind == "pulsar":
        return PulsarStatsProvider(rest, token=token)
    raise ValueError(f"unknown provider kind {kind!r}: use file, http or pulsar")
