"""Heartbeat and SLA-monitor bundles: each belongs to the broker its namespace names.

Every Pulsar broker creates a heartbeat namespace, ``pulsar/<cluster>/<host:port>`` (v1) or
``pulsar/<host:port>`` (v2), and an SLA-monitor namespace ``sla-monitor/<cluster>/<host:port>``,
and checks its own health through them. A lookup never places them by load:
``NamespaceService.getHeartbeatOrSLAMonitorBrokerId`` (used by the extensible load manager's
``assign`` since Pulsar's PR 21213, and by the modular path's ``searchForCandidateBroker``)
answers with the broker the name holds, matched with Pulsar's patterns
(``HEARTBEAT_NAMESPACE_PATTERN``, ``HEARTBEAT_NAMESPACE_PATTERN_V2``, ``SLA_NAMESPACE_PATTERN``,
on the whole name). A broker whose heartbeat bundle another broker owns fails its own health
check, which is why placement pins these bundles before any filter runs.

Liveness, as in Pulsar: a heartbeat bundle names its broker whether or not that broker is live
(a lookup for a dead broker's heartbeat has no other owner to go to); an SLA-monitor bundle goes
to its broker only while that broker is live (Pulsar checks ``isBrokerActive`` for it), and is
placed like any other bundle otherwise. ``pinned_broker`` gives that answer.

Broker ids: Pulsar's broker id is ``host:port`` (``advertisedAddress:webServicePort``), which is
what the namespace holds, so the match is exact. A live broker id without a port matches the
host part too (ours: simulated brokers are often named without a port).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from loadbalance.bundles import (
    HEARTBEAT_NAMESPACE_RE,
    HEARTBEAT_NAMESPACE_V2_RE,
    SLA_NAMESPACE_RE,
)

__all__ = [
    "Pin",
    "heartbeat_broker_id",
    "heartbeat_broker_of",
    "is_heartbeat_namespace",
    "is_sla_monitor_namespace",
    "pinned_broker",
]

_RANGE_TAIL = re.compile(r"/0x[0-9a-fA-F]{8}_0x[0-9a-fA-F]{8}\Z")


def _namespace_of(bundle_or_namespace: str) -> str:
    """The namespace of a bundle name, or the name itself when it has no hash range."""
    m = _RANGE_TAIL.search(bundle_or_namespace)
    return bundle_or_namespace[: m.start()] if m else bundle_or_namespace


def _named_broker(namespace: str) -> tuple[str, bool] | None:
    """(``host:port`` the name holds, whether it is an SLA-monitor namespace), or ``None``."""
    for pattern, sla in (
        (HEARTBEAT_NAMESPACE_RE, False),
        (HEARTBEAT_NAMESPACE_V2_RE, False),
        (SLA_NAMESPACE_RE, True),
    ):
        m = pattern.match(namespace)
        if m is not None:
            return m.group(1), sla
    return None


def is_heartbeat_namespace(namespace: str) -> bool:
    """A heartbeat (v1 or v2) or SLA-monitor namespace (a bundle name is accepted too)."""
    return _named_broker(_namespace_of(namespace)) is not None


def is_sla_monitor_namespace(namespace: str) -> bool:
    """An SLA-monitor namespace (``sla-monitor/<cluster>/<host:port>``)."""
    found = _named_broker(_namespace_of(namespace))
    return found is not None and found[1]


def heartbeat_broker_id(bundle_or_namespace: str) -> str | None:
    """The ``host:port`` a heartbeat or SLA-monitor name holds, live or not."""
    found = _named_broker(_namespace_of(bundle_or_namespace))
    return found[0] if found is not None else None


def _match_live(named: str, live_brokers: Iterable[str]) -> str | None:
    live = live_brokers if isinstance(live_brokers, set | frozenset) else set(live_brokers)
    if named in live:
        return named
    host = named.rpartition(":")[0]
    return host if host in live else None


def heartbeat_broker_of(bundle_or_namespace: str, live_brokers: Iterable[str]) -> str | None:
    """The live broker a heartbeat or SLA-monitor bundle (or namespace) belongs to, or ``None``
    when the name is not one or its broker is not among ``live_brokers``."""
    named = heartbeat_broker_id(bundle_or_namespace)
    if named is None:
        return None
    return _match_live(named, live_brokers)


@dataclass(frozen=True, slots=True)
class Pin:
    """What pinning says about one bundle: ``broker`` to place it on, or ``None`` with
    ``reason`` when the bundle is pinned to a broker that is not live."""

    broker: str | None
    reason: str = ""


def pinned_broker(bundle: str, live_brokers: Iterable[str]) -> Pin | None:
    """``None`` for an ordinary bundle (place it by the filters and the strategy); else the
    ``Pin``: a heartbeat bundle goes to its broker, or nowhere while that broker is not live;
    an SLA-monitor bundle goes to its broker while live, else is placed as any other (``None``)."""
    found = _named_broker(_namespace_of(bundle))
    if found is None:
        return None
    named, sla = found
    broker = _match_live(named, live_brokers)
    if broker is not None:
        return Pin(broker)
    if sla:
        return None
    return Pin(None, f"heartbeat bundle of broker {named}, which is not live")
