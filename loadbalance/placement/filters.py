"""Broker filters that narrow the candidate set before a placement strategy scores it.

Each filter mirrors one step of ``ModularLoadManagerImpl.selectBrokerForAssignment`` (helpers in
Pulsar's ``LoadManagerShared``) and is a pure function from a candidate list to a smaller one.
Candidates are always returned sorted, so that a seeded random choice downstream is reproducible
regardless of dict order.

* ``live_candidates``: only brokers present in the view (i.e. that report), minus the caller's
  exclude list, minus brokers whose report is older than
  ``loadBalancerBrokerLoadDataTTLInSeconds`` when the caller gives a ``now_ms``. Pulsar gets the
  live set from its broker registry; here the view *is* the registry of reporting brokers.
* ``filter_brokers_with_large_topic_count``: ``loadBalancerBrokerMaxTopics``, counting the topics
  of preallocated bundles too; if every broker is over the limit the input is returned unchanged,
  as Pulsar does, because refusing to place at all is worse than placing on a busy broker.
* ``remove_most_servicing_brokers_for_namespace``: keep the brokers serving the fewest bundles of
  the bundle's namespace (``loadBalancerDistributeBundlesEvenlyEnabled``). Counts include
  preallocations, so several placements in one cycle spread over the namespace.

The operator's placement rules (heartbeat pinning, namespace isolation, anti-affinity groups
and failure domains, the broker-version filter) read ``view.policies`` and live beside these, in
``placement.heartbeat``, ``placement.isolation``, ``placement.anti_affinity`` and
``placement.version_filter``, composed in Pulsar's order by ``placement.policy_filters``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping

from loadbalance.bundles import bundle_namespace
from loadbalance.placement.base import pending_topics
from loadbalance.time_average import BundleData
from loadbalance.view import ClusterView, digest_of

MS_PER_S = 1000


def live_candidates(
    view: ClusterView,
    *,
    exclude: Collection[str] = (),
    now_ms: int | None = None,
    load_data_ttl_s: float | None = None,
) -> list[str]:
    """Reporting brokers that may receive a bundle, sorted."""
    excluded = set(exclude)
    check_age = now_ms is not None and load_data_ttl_s is not None and load_data_ttl_s > 0
    out = []
    for name, broker in view.brokers.items():
        if name in excluded:
            continue
        if check_age and now_ms - broker.updated_at_ms > load_data_ttl_s * MS_PER_S:
            continue
        out.append(name)
    return sorted(out)


def filter_brokers_with_large_topic_count(
    candidates: Iterable[str],
    view: ClusterView,
    preallocated: Mapping[str, Mapping[str, BundleData]],
    max_topics: int,
) -> list[str]:
    """Drop brokers whose reported plus preallocated topics exceed ``max_topics``.

    Returns the input unchanged when every candidate is over the limit.
    """
    cands = sorted(candidates)
    kept = []
    brokers = view.brokers
    for name in cands:
        broker = brokers.get(name)
        if broker is None:
            continue
        pre = preallocated.get(name)
        total = broker.report.num_topics + (pending_topics(pre) if pre else 0)
        if total <= max_topics:
            kept.append(name)
    return kept if kept else cands


def namespace_bundle_counts(
    view: ClusterView, preallocated: Mapping[str, Mapping[str, BundleData]]
) -> dict[str, Counter[str]]:
    """broker -> namespace -> number of bundles served or preallocated (Pulsar's
    ``brokerToNamespaceToBundleRange``)."""
    counts: dict[str, Counter[str]] = {}
    for name, broker in view.brokers.items():
        bundles = set(broker.report.bundles) | set(preallocated.get(name, {}))
        counts[name] = Counter(bundle_namespace(b) for b in bundles)
    return counts


class NamespaceCounts:
    """``namespace_bundle_counts`` kept by a ``BrokerSelector`` through one cycle's placements.

    A broker's served bundles are counted by its report's digest (``view.digest_of``) when it
    has one: counting a million bundle names per cycle would be most of a placement batch's
    cost. A broker's counts are the digest's, shared, until a placement changes them; then the
    broker gets its own copy (copy on write), so a count stays one lookup."""

    def __init__(
        self, view: ClusterView, preallocated: Mapping[str, Mapping[str, BundleData]]
    ) -> None:
        self._counts: dict[str, Mapping[str, int]] = {}
        self._own: dict[str, Counter[str]] = {}
        for name, broker in view.brokers.items():
            pre = preallocated.get(name, {})
            digest = digest_of(view, name)
            if digest is None:
                counts = Counter(bundle_namespace(b) for b in set(broker.report.bundles) | set(pre))
                self._counts[name] = self._own[name] = counts
                continue
            self._counts[name] = digest.namespace_counts
            served = broker.report.bundles
            for b in pre:
                if b not in served:
                    self._writable(name)[bundle_namespace(b)] += 1

    def _writable(self, broker: str) -> Counter[str]:
        own = self._own.get(broker)
        if own is None:
            own = self._own[broker] = Counter(self._counts.get(broker, _NONE))
            self._counts[broker] = own
        return own

    def count(self, broker: str, namespace: str) -> int:
        return self._counts.get(broker, _NONE).get(namespace, 0)

    def add(self, broker: str, namespace: str) -> None:
        self._writable(broker)[namespace] += 1

    def remove(self, broker: str, namespace: str) -> None:
        """One fewer, never below zero (a broker not in the view has nothing to lose)."""
        if broker in self._counts and self.count(broker, namespace) > 0:
            self._writable(broker)[namespace] -= 1

    def fewest(self, bundle: str, candidates: Iterable[str]) -> list[str]:
        """``remove_most_servicing_brokers_for_namespace`` over these counts."""
        cands = sorted(candidates)
        if not cands:
            return cands
        ns = bundle_namespace(bundle)
        get = self._counts.get
        per = [get(b, _NONE).get(ns, 0) for b in cands]
        least = min(per)
        return [b for b, n in zip(cands, per) if n == least]


_NONE: Mapping[str, int] = {}


def remove_most_servicing_brokers_for_namespace(
    bundle: str,
    candidates: Iterable[str],
    counts: Mapping[str, Mapping[str, int]],
) -> list[str]:
    """Keep only the candidates serving the fewest bundles of ``bundle``'s namespace."""
    cands = sorted(candidates)
    if not cands:
        return cands
    ns = bundle_namespace(bundle)
    per = {b: counts.get(b, {}).get(ns, 0) for b in cands}
    least = min(per.values())
    return [b for b in cands if per[b] == least]
