"""Placement policies in Redis, ``P:policies``: namespace isolation policies, namespaces'
anti-affinity groups and failure domains, as one versioned document.

Layout (one hash): ``version`` (an integer every write raises by one), ``cluster`` (the name the
first cluster-scoped write gave) and ``doc``, the policies in Pulsar's admin JSON shapes
(``PlacementPolicies.to_admin_json``: ``namespaceIsolationPolicies``, ``localPolicies``,
``failureDomains``). Why one document: placement reads every policy on every lookup and every
policy cycle, and one ``HMGET`` of a small document is the cheapest consistent read; policies
are a handful of operator-written objects, not per-bundle state.

Every write is a compare-and-set on ``version`` in one Lua script (``_LUA_CAS``, named
outcomes): read the document, change it in Python (where the checks live, such as "a broker
belongs to at most one failure domain"), write it only if nobody wrote in between, else re-read
and try again. So two operators editing different policies at once both succeed, and a check
is never judged against a document another write has replaced.

**The cluster.** Pulsar keeps isolation policies and failure domains per cluster, and its verbs
name the cluster. One Redis prefix here serves one cluster, so the store records the cluster
name the first cluster-scoped write gives and refuses another name afterwards, the way Pulsar
answers "Cluster does not exist" for a cluster it does not know. Reads before any such write
see no policies under any name. Anti-affinity groups belong to the namespace (its local
policies) and name no cluster.

``read`` is what placement calls: it asks Redis for the version only and parses the document
again only when the version moved, so the cost per lookup is one tiny round trip.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from loadbalance.errors import Conflict, InvalidInput
from loadbalance.placement.policies import NamespaceIsolationPolicy, PlacementPolicies
from metadata_store.keys import Keys

__all__ = ["CAS_ATTEMPTS", "PlacementPoliciesStore", "StoredPolicies"]

CAS_ATTEMPTS = 8
"""How often a write re-reads and retries after losing the compare-and-set to another writer."""

# KEYS: policies hash; ARGV: expected version, new doc, cluster ('' = the write names none)
# -> {'ok', new version} | {'conflict', current version} | {'other-cluster', recorded name}
_LUA_CAS = """
local v = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
if v ~= tonumber(ARGV[1]) then return {'conflict', v} end
local c = redis.call('HGET', KEYS[1], 'cluster')
if ARGV[3] ~= '' then
  if c and c ~= ARGV[3] then return {'other-cluster', c} end
  if not c then redis.call('HSET', KEYS[1], 'cluster', ARGV[3]) end
end
redis.call('HSET', KEYS[1], 'version', v + 1, 'doc', ARGV[2])
return {'ok', v + 1}
"""


@dataclass(frozen=True)
class StoredPolicies:
    """The stored policies with the version a compare-and-set must name and the cluster name
    (None until a cluster-scoped write recorded one)."""

    version: int
    cluster: str | None
    policies: PlacementPolicies


_NONE = StoredPolicies(0, None, PlacementPolicies())


class PlacementPoliciesStore:
    """The ``P:policies`` repository: versioned reads and compare-and-set writes."""

    def __init__(self, client: Any, prefix: str = "lb") -> None:
        self._r = client
        self._key = Keys(prefix).policies()
        self._cas = client.register_script(_LUA_CAS)
        self._cached: StoredPolicies = _NONE

    # -- reads -----------------------------------------------------------------------------------
    def read_versioned(self) -> StoredPolicies:
        """Version, cluster and policies in one round trip (the base of every write)."""
        raw_version, raw_cluster, raw_doc = self._r.hmget(self._key, "version", "cluster", "doc")
        version = int(raw_version or 0)
        cluster = raw_cluster.decode() if raw_cluster is not None else None
        if version == self._cached.version and cluster == self._cached.cluster:
            return self._cached
        doc = json.loads(raw_doc) if raw_doc else None
        stored = StoredPolicies(version, cluster, PlacementPolicies.from_admin_json(doc))
        self._cached = stored
        return stored

    def read(self) -> PlacementPolicies:
        """Every policy, for placement: one ``HGET`` of the version while nothing changed."""
        raw_version = self._r.hget(self._key, "version")
        if int(raw_version or 0) == self._cached.version:
            return self._cached.policies
        return self.read_versioned().policies

    def version(self) -> int:
        return int(self._r.hget(self._key, "version") or 0)

    def cluster(self) -> str | None:
        """The cluster name recorded by the first cluster-scoped write, if any."""
        raw = self._r.hget(self._key, "cluster")
        return raw.decode() if raw is not None else None

    # -- the one write ---------------------------------------------------------------------------
    def compare_and_set(
        self, expected_version: int, policies: PlacementPolicies, cluster: str | None = None
    ) -> int:
        """Store ``policies`` if the version is still ``expected_version``; the new version.

        ``Conflict`` when another write came first; ``InvalidInput`` (field ``cluster``) when
        ``cluster`` is not the cluster this store serves."""
        doc = json.dumps(policies.to_admin_json(), sort_keys=True)
        outcome, value = self._cas(keys=[self._key], args=[expected_version, doc, cluster or ""])
        outcome = outcome.decode() if isinstance(outcome, bytes) else outcome
        if outcome == "ok":
            return int(value)
        if outcome == "conflict":
            raise Conflict(
                f"placement policies changed: version {int(value)}, not {expected_version}"
            )
        recorded = value.decode() if isinstance(value, bytes) else str(value)
        raise _other_cluster(cluster or "", recorded)

    def update(
        self,
        change: Callable[[PlacementPolicies], PlacementPolicies],
        *,
        cluster: str | None = None,
        attempts: int = CAS_ATTEMPTS,
    ) -> StoredPolicies:
        """Apply ``change`` to the current policies and store the result, re-reading and
        retrying when another write wins the compare-and-set. ``change`` may raise
        ``InvalidInput`` to refuse; it is judged against the document it will replace."""
        for _ in range(attempts):
            current = self.read_versioned()
            if cluster is not None:
                self._check_cluster(cluster, current)
            changed = change(current.policies)
            try:
                version = self.compare_and_set(current.version, changed, cluster)
            except Conflict:
                continue
            return StoredPolicies(version, current.cluster or cluster, changed)
        raise Conflict(f"placement policies: still changing after {attempts} attempts")

    # -- cluster ---------------------------------------------------------------------------------
    def check_cluster(self, cluster: str) -> StoredPolicies:
        """The stored policies, if ``cluster`` is the one this store serves (or none is
        recorded yet); ``InvalidInput`` naming the field otherwise."""
        current = self.read_versioned()
        self._check_cluster(cluster, current)
        return current

    @staticmethod
    def _check_cluster(cluster: str, current: StoredPolicies) -> None:
        if not cluster or not cluster.strip():
            raise InvalidInput("cluster", "a cluster name is required")
        if current.cluster is not None and current.cluster != cluster:
            raise _other_cluster(cluster, current.cluster)

    # -- namespace isolation policies ------------------------------------------------------------
    def set_isolation_policy(
        self, cluster: str, name: str, policy: NamespaceIsolationPolicy
    ) -> StoredPolicies:
        """Create or replace the policy ``name`` (``ns-isolation-policy set``)."""
        _require_name(name, "policyName")
        return self.update(
            lambda p: replace(p, isolation=_with(p.isolation, name, policy)), cluster=cluster
        )

    def isolation_policies(self, cluster: str) -> Mapping[str, NamespaceIsolationPolicy]:
        return self.check_cluster(cluster).policies.isolation

    def isolation_policy(self, cluster: str, name: str) -> NamespaceIsolationPolicy:
        """The policy ``name``; ``InvalidInput`` naming ``policyName`` when there is none."""
        policy = self.isolation_policies(cluster).get(name)
        if policy is None:
            raise InvalidInput(
                "policyName", f"namespace isolation policy {name} not found in cluster {cluster}"
            )
        return policy

    def delete_isolation_policy(self, cluster: str, name: str) -> bool:
        """Remove the policy ``name``; whether it existed (deleting none is not an error, as in
        Pulsar)."""
        existed = name in self.check_cluster(cluster).policies.isolation
        if existed:
            self.update(
                lambda p: replace(p, isolation=_without(p.isolation, name)), cluster=cluster
            )
        return existed

    # -- anti-affinity groups --------------------------------------------------------------------
    def set_anti_affinity_group(self, namespace: str, group: str) -> StoredPolicies:
        if not group or not group.strip():
            raise InvalidInput("group", "antiAffinityGroup can't be empty")
        group = group.strip()
        return self.update(
            lambda p: replace(
                p, anti_affinity_groups=_with(p.anti_affinity_groups, namespace, group)
            )
        )

    def anti_affinity_group(self, namespace: str) -> str | None:
        return self.read_versioned().policies.anti_affinity_group_of(namespace)

    def delete_anti_affinity_group(self, namespace: str) -> bool:
        """Remove the namespace's group; whether it had one."""
        had = namespace in self.read_versioned().policies.anti_affinity_groups
        if had:
            self.update(
                lambda p: replace(
                    p, anti_affinity_groups=_without(p.anti_affinity_groups, namespace)
                )
            )
        return had

    def anti_affinity_namespaces(self, cluster: str, group: str) -> list[str]:
        """The namespaces of ``group`` in ``cluster``, sorted."""
        if not group or not group.strip():
            raise InvalidInput("group", "anti-affinity group can't be empty")
        return sorted(self.check_cluster(cluster).policies.namespaces_in_group(group.strip()))

    # -- failure domains -------------------------------------------------------------------------
    def set_failure_domain(self, cluster: str, name: str, brokers: Iterable[str]) -> StoredPolicies:
        """Create or replace the domain ``name`` with ``brokers``; refused, naming ``brokers``,
        when one of them is already in another domain (Pulsar's 409)."""
        _require_name(name, "domainName")
        wanted = frozenset(b.strip() for b in brokers if b.strip())

        def change(p: PlacementPolicies) -> PlacementPolicies:
            for other in sorted(p.failure_domains):
                dup = sorted(wanted & p.failure_domains[other]) if other != name else []
                if dup:
                    raise InvalidInput("brokers", f"{dup} already exists in {other}")
            return replace(p, failure_domains=_with(p.failure_domains, name, wanted))

        return self.update(change, cluster=cluster)

    def failure_domains(self, cluster: str) -> Mapping[str, frozenset[str]]:
        return self.check_cluster(cluster).policies.failure_domains

    def failure_domain(self, cluster: str, name: str) -> frozenset[str]:
        brokers = self.failure_domains(cluster).get(name)
        if brokers is None:
            raise InvalidInput("domainName", f"Domain {name} for cluster {cluster} does not exist")
        return brokers

    def delete_failure_domain(self, cluster: str, name: str) -> None:
        """Remove the domain ``name``; ``InvalidInput`` naming ``domainName`` when there is none
        (Pulsar answers 404 here)."""

        def change(p: PlacementPolicies) -> PlacementPolicies:
            if name not in p.failure_domains:
                raise InvalidInput(
                    "domainName", f"Domain-name {name} or cluster {cluster} does not exist"
                )
            return replace(p, failure_domains=_without(p.failure_domains, name))

        self.update(change, cluster=cluster)


def _other_cluster(asked: str, recorded: str) -> InvalidInput:
    return InvalidInput(
        "cluster",
        f"cluster {asked} does not exist: this store serves cluster {recorded}",
    )


def _require_name(name: str, field: str) -> None:
    if not name or not name.strip():
        raise InvalidInput(field, "a name is required")


def _with(mapping: Mapping[str, Any], key: str, value: Any) -> Mapping[str, Any]:
    return MappingProxyType({**mapping, key: value})


def _without(mapping: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    return MappingProxyType({k: v for k, v in mapping.items() if k != key})
