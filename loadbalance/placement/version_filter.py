"""``preferLaterVersions``: place bundles on the brokers running the newest version first.

Pulsar's ``BrokerVersionFilter``, the filter pipeline step of
``ModularLoadManagerImpl.selectBroker``: each broker's report carries
``brokerVersionString``; with ``preferLaterVersions`` on, only the candidates whose version
equals the latest one are kept, so that during a rolling upgrade new bundles go to upgraded
brokers. Versions are Semantic Versioning 2.0 as ``java-semver``'s ``Version.valueOf`` parses
them (``MAJOR.MINOR.PATCH``, optional ``-pre.release`` and ``+build``; no leading zeros in
numbers), ordered by precedence (build metadata ignored, as ``Version.equals`` ignores it).

If any candidate's version is missing or cannot be parsed, Pulsar's filter raises
``BrokerFilterBadVersionException`` and the load manager restores the full candidate set, so
``latest_version_brokers`` returns every candidate unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

__all__ = ["SemanticVersion", "latest_version_brokers", "parse_version"]

_NUM = r"(?:0|[1-9]\d*)"
_IDENT = r"[0-9A-Za-z-]+"
_SEMVER = re.compile(
    rf"({_NUM})\.({_NUM})\.({_NUM})"
    rf"(?:-({_IDENT}(?:\.{_IDENT})*))?"
    rf"(?:\+({_IDENT}(?:\.{_IDENT})*))?\Z"
)

SemanticVersion = tuple[int, int, int, tuple[tuple[int, int | str], ...] | None]
"""(major, minor, patch, pre-release identifiers or ``None``); see ``_key`` for the order."""


def parse_version(text: str) -> SemanticVersion | None:
    """The version, or ``None`` when ``text`` is not a semantic version (Pulsar: invalid)."""
    m = _SEMVER.match(text)
    if m is None:
        return None
    pre = m.group(4)
    idents: tuple[tuple[int, int | str], ...] | None = None
    if pre is not None:
        parts = pre.split(".")
        if any(p.isdigit() and len(p) > 1 and p[0] == "0" for p in parts):
            return None  # numeric pre-release identifiers have no leading zeros
        # numeric identifiers sort before alphanumeric ones, numbers by value
        idents = tuple((0, int(p)) if p.isdigit() else (1, p) for p in parts)
    return int(m.group(1)), int(m.group(2)), int(m.group(3)), idents


def _key(v: SemanticVersion) -> tuple:
    """Precedence: a release sorts after every pre-release of the same numbers; pre-releases
    compare identifier by identifier, a shorter prefix first."""
    major, minor, patch, pre = v
    return (major, minor, patch, (1,) if pre is None else (0, pre))


def latest_version_brokers(candidates: Iterable[str], versions: Mapping[str, str]) -> list[str]:
    """The candidates running the latest version, sorted; every candidate when a version is
    missing or unparseable, or there is no candidate (Pulsar's fallback).

    ``versions``: broker -> its report's ``brokerVersionString``."""
    cands = sorted(set(candidates))
    parsed: dict[str, tuple] = {}
    for b in cands:
        v = parse_version(versions.get(b) or "")
        if v is None:
            return cands
        parsed[b] = _key(v)
    if not parsed:
        return cands
    latest = max(parsed.values())
    return [b for b in cands if parsed[b] == latest]
