"""Where the agent gets a broker's per-bundle stats: pluggable providers.

Why pluggable: the host figures come from psutil, but which bundles a broker serves and how busy
each one is only the broker knows. A real Pulsar broker already computes both for its own load
manager and serves them at ``GET /admin/v2/broker-stats/load-report``; other brokers (or a test
rig) can write the same JSON to a file or serve it over HTTP. All three speak one document: a
Pulsar ``LocalBrokerData`` JSON, of which only ``bundles`` and ``lastStats`` are kept (the host
figures are the agent's own). Every document goes through ``report_from_dict``, so a provider
rejects exactly what the report codec would.

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
from loadbalance.model import NamespaceBundleStats
from loadbalance.report_codec import DEFAULT_MAX_REPORT_BYTES, report_from_dict

PULSAR_LOAD_REPORT_PATH = "/admin/v2/broker-stats/load-report"
# report_from_dict wants a broker id; the provider's document is not trusted to name ours
_PLACEHOLDER_BROKER = "provider"


@dataclass(frozen=True, slots=True)
class BundleStatsSnapshot:
    """The bundles a broker serves and the latest stats of each."""

    bundles: frozenset[str] = frozenset()
    last_stats: Mapping[str, NamespaceBundleStats] = field(
        default_factory=lambda: MappingProxyType({})
    )


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
    try:
        report = report_from_dict(doc, _PLACEHOLDER_BROKER)
    except InvalidReport as e:
        raise InvalidReport(f"{source}: {e.field}", e.reason) from None
    return BundleStatsSnapshot(bundles=report.bundles, last_stats=report.last_stats)


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
