"""Placement policies an operator sets: namespace isolation, anti-affinity groups, failure domains.

These are Pulsar's admin objects, read in Pulsar's admin JSON shapes so that a document written
by ``pulsar-admin`` (or for it) is accepted as it is:

* ``namespaceIsolationPolicies``: policy name -> ``NamespaceIsolationData``::

      {"namespaces": ["tenant/ns.*"], "primary": ["broker-0[01].*"], "secondary": ["broker-.*"],
       "auto_failover_policy": {"policy_type": "min_available",
                                "parameters": {"min_limit": "1", "usage_threshold": "80"}}}

  ``namespaces``, ``primary`` and ``secondary`` are regular expressions matched against the whole
  text (Java's ``String.matches``), namespaces against ``tenant/namespace`` and brokers against
  the broker's host without the port, as ``LoadManagerShared.applyNamespacePolicies`` does.
* ``localPolicies``: namespace -> ``{"namespaceAntiAffinityGroup": GROUP}`` (Pulsar keeps the
  group in a namespace's local policies).
* ``failureDomains``: domain name -> ``{"brokers": [BROKER, ...]}``; a broker belongs to at most
  one domain (Pulsar's ``clusters create-failure-domain`` refuses a broker already in another).

``PlacementPolicies`` is the one parsed form the placement filters, the shedders' guards, the
metadata store and the command line share. Parsing never guesses: a wrong field raises
``InvalidInput`` naming the field's path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from loadbalance.errors import InvalidInput

__all__ = [
    "MIN_AVAILABLE",
    "NO_POLICIES",
    "AutoFailoverPolicy",
    "NamespaceIsolationPolicy",
    "PlacementPolicies",
    "broker_host",
]

MIN_AVAILABLE = "min_available"
"""The one ``auto_failover_policy.policy_type`` Pulsar defines (``AutoFailoverPolicyType``)."""

_EMPTY: Mapping[str, Any] = MappingProxyType({})


def broker_host(broker: str) -> str:
    """The broker's host without a trailing ``:port`` (what isolation regexes are matched to).

    Pulsar builds ``new URL("http://" + broker).getHost()``; a broker id without a port is its
    own host. Bracketed IPv6 hosts keep their brackets off, as ``URL.getHost`` does not.
    """
    if broker.startswith("["):
        end = broker.find("]")
        return broker[: end + 1] if end > 0 else broker
    host, sep, port = broker.rpartition(":")
    if sep and host and port.isdigit():
        return host
    return broker


def _fail(path: str, reason: str) -> InvalidInput:
    return InvalidInput(path, reason)


def _str_list(value: Any, path: str, *, regex: bool) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [v for v in value.split(",") if v.strip()]
    if not isinstance(value, list | tuple):
        raise _fail(path, f"expected a list of strings, got {type(value).__name__}")
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item.strip():
            raise _fail(f"{path}[{i}]", "expected a non-empty string")
        item = item.strip()
        if regex:
            try:
                re.compile(item)
            except re.error as exc:
                raise _fail(f"{path}[{i}]", f"not a valid regular expression: {exc}") from None
        out.append(item)
    return tuple(out)


def _full_match(patterns: tuple[re.Pattern[str], ...], text: str) -> bool:
    return any(p.fullmatch(text) for p in patterns)


@dataclass(frozen=True)
class AutoFailoverPolicy:
    """``min_available``: use the secondary brokers too when fewer than ``min_limit`` primary
    brokers are available, a primary being available while its usage is below
    ``usage_threshold`` percent (``MinAvailablePolicy``)."""

    policy_type: str = MIN_AVAILABLE
    min_limit: int = 1
    usage_threshold: float = 100.0

    @classmethod
    def from_admin_json(cls, doc: Any, path: str) -> AutoFailoverPolicy:
        if doc is None:
            return cls()
        if not isinstance(doc, Mapping):
            raise _fail(path, "expected an object with policy_type and parameters")
        policy_type = doc.get("policy_type", MIN_AVAILABLE)
        if policy_type != MIN_AVAILABLE:
            raise _fail(f"{path}.policy_type", f"unknown {policy_type!r}; use {MIN_AVAILABLE}")
        params = doc.get("parameters") or {}
        if not isinstance(params, Mapping):
            raise _fail(f"{path}.parameters", "expected an object")
        unknown = set(params) - {"min_limit", "usage_threshold"}
        if unknown:
            raise _fail(f"{path}.parameters", f"unknown parameter(s) {sorted(unknown)}")
        if "min_limit" not in params or "usage_threshold" not in params:
            raise _fail(f"{path}.parameters", "min_available needs min_limit and usage_threshold")
        try:
            min_limit = int(str(params["min_limit"]))
        except ValueError:
            raise _fail(f"{path}.parameters.min_limit", "expected a whole number") from None
        try:
            threshold = float(str(params["usage_threshold"]))
        except ValueError:
            raise _fail(f"{path}.parameters.usage_threshold", "expected a number") from None
        if min_limit < 0:
            raise _fail(f"{path}.parameters.min_limit", "must be >= 0")
        if not 0 <= threshold <= 100:
            raise _fail(f"{path}.parameters.usage_threshold", "must be a percentage 0-100")
        return cls(policy_type, min_limit, threshold)

    def to_admin_json(self) -> dict[str, Any]:
        threshold = self.usage_threshold
        shown = str(int(threshold)) if threshold == int(threshold) else str(threshold)
        return {
            "policy_type": self.policy_type,
            "parameters": {"min_limit": str(self.min_limit), "usage_threshold": shown},
        }

    def should_failover_to_secondary(self, available_primaries: int) -> bool:
        """``MinAvailablePolicy.shouldFailoverToSecondaries``."""
        return available_primaries < self.min_limit

    def is_broker_available(self, usage_percent: float) -> bool:
        """``MinAvailablePolicy.isBrokerAvailable``: a primary counts while below the threshold."""
        return usage_percent < self.usage_threshold


@dataclass(frozen=True)
class NamespaceIsolationPolicy:
    """One ``NamespaceIsolationData``: which namespaces it covers, where they may live."""

    namespaces: tuple[str, ...]
    primary: tuple[str, ...]
    secondary: tuple[str, ...] = ()
    auto_failover: AutoFailoverPolicy = field(default_factory=AutoFailoverPolicy)

    @classmethod
    def from_admin_json(cls, doc: Any, path: str = "") -> NamespaceIsolationPolicy:
        if not isinstance(doc, Mapping):
            raise _fail(path, "expected a NamespaceIsolationData object")
        namespaces = _str_list(doc.get("namespaces"), f"{path}.namespaces", regex=True)
        primary = _str_list(doc.get("primary"), f"{path}.primary", regex=True)
        if not namespaces:
            raise _fail(f"{path}.namespaces", "at least one namespace regex is required")
        if not primary:
            raise _fail(f"{path}.primary", "at least one primary broker regex is required")
        return cls(
            namespaces=namespaces,
            primary=primary,
            secondary=_str_list(doc.get("secondary"), f"{path}.secondary", regex=True),
            auto_failover=AutoFailoverPolicy.from_admin_json(
                doc.get("auto_failover_policy"), f"{path}.auto_failover_policy"
            ),
        )

    def to_admin_json(self) -> dict[str, Any]:
        return {
            "namespaces": list(self.namespaces),
            "primary": list(self.primary),
            "secondary": list(self.secondary),
            "auto_failover_policy": self.auto_failover.to_admin_json(),
        }

    def _compiled(self, which: str) -> tuple[re.Pattern[str], ...]:
        cache = self.__dict__.setdefault("_re", {})
        got = cache.get(which)
        if got is None:
            got = cache[which] = tuple(re.compile(p) for p in getattr(self, which))
        return got

    def applies_to(self, namespace: str) -> bool:
        return _full_match(self._compiled("namespaces"), namespace)

    def is_primary(self, broker: str) -> bool:
        return _full_match(self._compiled("primary"), broker_host(broker))

    def is_secondary(self, broker: str) -> bool:
        return _full_match(self._compiled("secondary"), broker_host(broker))


@dataclass(frozen=True)
class PlacementPolicies:
    """Every placement policy of one cluster; the empty value means "no policy at all"."""

    isolation: Mapping[str, NamespaceIsolationPolicy] = field(default_factory=lambda: _EMPTY)
    anti_affinity_groups: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    """namespace -> its ``namespaceAntiAffinityGroup``."""
    failure_domains: Mapping[str, frozenset[str]] = field(default_factory=lambda: _EMPTY)
    """domain name -> the brokers in it."""

    @property
    def empty(self) -> bool:
        return not (self.isolation or self.anti_affinity_groups or self.failure_domains)

    # ----- isolation -------------------------------------------------------------------------
    def isolation_policy_of(self, namespace: str) -> NamespaceIsolationPolicy | None:
        """The policy covering ``namespace`` (by name order when several match, so the answer
        does not depend on dict order; Pulsar takes the first in its map)."""
        for name in sorted(self.isolation):
            policy = self.isolation[name]
            if policy.applies_to(namespace):
                return policy
        return None

    def is_isolated(self, namespace: str) -> bool:
        return self.isolation_policy_of(namespace) is not None

    def is_shared_broker(self, broker: str) -> bool:
        """A broker that is neither primary nor secondary in any policy (Pulsar's
        ``NamespaceIsolationPolicies.isSharedBroker``)."""
        return not any(
            p.is_primary(broker) or p.is_secondary(broker) for p in self.isolation.values()
        )

    # ----- anti-affinity and failure domains --------------------------------------------------
    def anti_affinity_group_of(self, namespace: str) -> str | None:
        return self.anti_affinity_groups.get(namespace) or None

    def namespaces_in_group(self, group: str) -> frozenset[str]:
        return frozenset(ns for ns, g in self.anti_affinity_groups.items() if g == group)

    def domain_of(self, broker: str) -> str | None:
        for name in sorted(self.failure_domains):
            if broker in self.failure_domains[name]:
                return name
        return None

    # ----- admin JSON -----------------------------------------------------------------------
    @classmethod
    def from_admin_json(cls, doc: Any, path: str = "policies") -> PlacementPolicies:
        """Parse the snapshot's ``"policies"`` object (keys as in the module docstring)."""
        if doc is None:
            return cls()
        if not isinstance(doc, Mapping):
            raise _fail(path, "expected an object")
        known = {"namespaceIsolationPolicies", "localPolicies", "failureDomains"}
        unknown = set(doc) - known
        if unknown:
            raise _fail(path, f"unknown key(s) {sorted(unknown)}; known: {sorted(known)}")
        iso_doc = _mapping(
            doc.get("namespaceIsolationPolicies"), f"{path}.namespaceIsolationPolicies"
        )
        isolation = {
            str(name): NamespaceIsolationPolicy.from_admin_json(
                body, f"{path}.namespaceIsolationPolicies.{name}"
            )
            for name, body in iso_doc.items()
        }
        groups: dict[str, str] = {}
        for ns, local in _mapping(doc.get("localPolicies"), f"{path}.localPolicies").items():
            where = f"{path}.localPolicies.{ns}"
            _check_namespace(ns, where)
            if not isinstance(local, Mapping):
                raise _fail(where, "expected an object")
            group = local.get("namespaceAntiAffinityGroup")
            if group is None:
                continue
            if not isinstance(group, str) or not group.strip():
                raise _fail(f"{where}.namespaceAntiAffinityGroup", "expected a non-empty string")
            groups[ns] = group.strip()
        domains: dict[str, frozenset[str]] = {}
        seen: dict[str, str] = {}
        for name, body in _mapping(doc.get("failureDomains"), f"{path}.failureDomains").items():
            where = f"{path}.failureDomains.{name}"
            if not isinstance(body, Mapping):
                raise _fail(where, "expected an object with brokers")
            brokers = _str_list(body.get("brokers"), f"{where}.brokers", regex=False)
            for b in brokers:
                if b in seen and seen[b] != name:
                    raise _fail(f"{where}.brokers", f"{b} is already in domain {seen[b]}")
                seen[b] = name
            domains[str(name)] = frozenset(brokers)
        return cls(
            isolation=MappingProxyType(isolation),
            anti_affinity_groups=MappingProxyType(groups),
            failure_domains=MappingProxyType(domains),
        )

    def to_admin_json(self) -> dict[str, Any]:
        """The inverse of ``from_admin_json`` (keys sorted, so the text is stable)."""
        out: dict[str, Any] = {}
        if self.isolation:
            out["namespaceIsolationPolicies"] = {
                n: self.isolation[n].to_admin_json() for n in sorted(self.isolation)
            }
        if self.anti_affinity_groups:
            out["localPolicies"] = {
                ns: {"namespaceAntiAffinityGroup": self.anti_affinity_groups[ns]}
                for ns in sorted(self.anti_affinity_groups)
            }
        if self.failure_domains:
            out["failureDomains"] = {
                n: {"brokers": sorted(self.failure_domains[n])}
                for n in sorted(self.failure_domains)
            }
        return out


NO_POLICIES = PlacementPolicies()
"""The empty value (no policy at all): ``ClusterView``'s default, shared, never changed."""


def _mapping(value: Any, path: str) -> Mapping[str, Any]:
    if value is None:
        return _EMPTY
    if not isinstance(value, Mapping):
        raise _fail(path, "expected an object")
    return value


def _check_namespace(ns: Any, path: str) -> None:
    if not isinstance(ns, str) or ns.count("/") != 1 or not all(ns.split("/")):
        raise _fail(path, f"expected a namespace as tenant/namespace, got {ns!r}")
