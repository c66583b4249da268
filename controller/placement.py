"""Assignment of unowned bundles, as Pulsar's lookup does it, over the load snapshot in Redis.

The streaming job writes the averaged view (per-broker report and history usage, per-bundle
short/long-term averages) to Redis; an assignment reads it, keeps only brokers that are live in
the registry, and runs the configured placement strategy through
``loadbalance.placement.pipeline.BrokerSelector``. Every lease granted here is an ownership
change, so it comes back as an ``assigned`` ``OwnershipEvent`` (``assign_with_event``,
``lookup_assign_event``); ``lookup_and_assign`` with a publisher and the control loop's sweep
(``controller.sweep``) put them on the ownership-events topic.

**No herding.** The load data lags the lookups by a report interval or more, so a placement
must count every assignment made before it, or a burst of lookups (a namespace unloaded, a
broker lost, clients reconnecting) sends every bundle to the same least-loaded broker. Two
records make an assignment count before any report shows it:

* its **preallocation** (``P:prealloc:<broker>``, bundle -> JSON averages, read with the
  snapshot parser's ``bundleData`` rules), written by the same script that takes the lease
  (``RedisStore.acquire_placed``), so no reader ever sees the lease without it. It counts in
  the strategy's load score and in the per-namespace bundle counts of
  ``loadBalancerDistributeBundlesEvenlyEnabled``. It ends when *its own* broker reports the
  bundle (Pulsar's ``updateBundleData``) or no longer holds the lease (unloaded or moved
  before it reported it); another broker's report listing the bundle does not end it, since
  after an unload the previous owner's report lists the bundle until its next report.
* the **leases of the namespace** being placed: the per-broker counts the distribute-evenly
  filter reads are the reports corrected by ownership. A bundle a broker's report lists but
  whose lease that broker no longer holds (unloaded, moved) is not counted there; a bundle it
  holds but neither reports nor has preallocated (a split's children kept by their owner, a
  transfer) is counted as preallocated. Pulsar's extensible manager counts ownership the same
  way (its service-unit channel, not the reports); the modular one serialises placement in
  one leader, whose in-memory state sees every assignment it made.

**Concurrent placements** (lookups in several processes, several controllers, a sweep) are
ordered by the placement version ``P:placement:version``: the preallocations are read together
with it, the broker is chosen, and the lease is taken only if no placement was recorded since
(``PlacementChanged`` otherwise: count again, choose again, up to
``MAX_PLACEMENT_ATTEMPTS``). Why an optimistic compare-and-set and not a Redis lock around
read-choose-record: a lookup never waits behind a stalled or killed process holding a lock
until it expires, and without contention a placement costs the round trips it cost before
plus none; under contention every round has a winner, so a burst of n placements makes at most
n rounds. The snapshot is parsed once per assignment (once per sweep), only the preallocations
and the namespace's leases are read again on a retry.

The load snapshot is read through its one reader (``metadata_store.load_snapshot``, format in
``docs/snapshot-format.md``), which yields the ``ClusterView`` with the rules of ``lbctl
decide``, and the operator's placement policies (``P:policies``) go into the view, which every
placement honours.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, TypeAlias

from controller.events import ASSIGNED, EventPublisher, OwnershipEvent
from infra import metrics
from loadbalance.bundles import bundle_namespace
from loadbalance.config import LoadBalancerConfig
from loadbalance.cycle import cycle_rng, weights_from_config
from loadbalance.errors import Conflict, InvalidInput, Transient
from loadbalance.placement.pipeline import BrokerSelector
from loadbalance.snapshot import bundle_data_from_document
from loadbalance.time_average import BundleData
from loadbalance.view import ClusterView
from metadata_store.leases import Lease
from metadata_store.load_snapshot import shards_from_docs
from metadata_store.ownership_redis import MalformedLease, RedisStore
from metadata_store.placement_state import PlacementChanged
from metadata_store.protocol import OwnershipStore


def _avg_doc(t: Any) -> dict[str, float]:
    return {
        "msgRateIn": t.msg_rate_in,
        "msgRateOut": t.msg_rate_out,
        "msgThroughputIn": t.msg_throughput_in,
        "msgThroughputOut": t.msg_throughput_out,
        "numSamples": t.num_samples,
    }


def bundle_data_doc(d: BundleData) -> dict[str, Any]:
    return {
        "shortTerm": _avg_doc(d.short_term),
        "longTerm": _avg_doc(d.long_term),
        "topics": d.topics,
    }


def put_load_snapshot(
    store: RedisStore, brokers: dict[str, dict[str, Any]], bundles: dict[str, BundleData]
) -> None:
    """Replace the snapshot with these brokers and bundles (tools and tests; the streaming job
    writes it with its progress)."""
    docs = {b: bundle_data_doc(d) for b, d in bundles.items()}
    store.load_snapshot.replace(
        {b: json.dumps(v) for b, v in brokers.items()}, shards_from_docs(docs) if docs else {}
    )


def base_view(store: RedisStore, config: LoadBalancerConfig, now_ms: int) -> ClusterView | None:
    """The snapshot as a ``ClusterView`` of live brokers, with the operator's placement
    policies (``P:policies``), which every placement honours; no preallocations yet
    (``count_assignments`` adds them). None when no live broker has load data."""
    live = set(store.live_brokers(now_ms))
    data = store.load_snapshot.read()
    snap = data.snapshot(now_ms, weights_from_config(config), brokers=live)
    if snap is None:
        return None
    return replace(snap.view, policies=store.placement_policies.read())


def count_assignments(
    store: RedisStore, view: ClusterView, now_ms: int, namespace: str | None = None
) -> tuple[ClusterView, int]:
    """``view`` with every assignment not reported yet counted, and the placement version the
    preallocations were read at (module docstring). With ``namespace``, its bundles' per-broker
    counts follow the leases. Preallocations found ended are deleted in Redis unless a
    placement was recorded meanwhile."""
    read = store.preallocations.read(sorted(view.brokers))
    nb = store.get_namespace(namespace) if namespace is not None else None
    ns_bundles = nb.bundle_names if nb is not None else []
    wanted = set(ns_bundles).union(*(set(e) for e in read.entries.values()))
    leases = store.read_leases(sorted(wanted)) if wanted else {}
    counted, ended = account_assignments(view, read.entries, leases, ns_bundles, now_ms)
    if ended:
        store.preallocations.forget_unless_changed(read.version, ended)
    return counted, read.version


def account_assignments(
    view: ClusterView,
    preallocations: Mapping[str, Mapping[str, Any]],
    leases: Mapping[str, Lease | None],
    ns_bundles: Sequence[str],
    now_ms: int,
) -> tuple[ClusterView, dict[str, set[str]]]:
    """The pure part of ``count_assignments``: ``view`` with the live preallocations (broker ->
    bundle -> stored document) and the namespace's bundles counted by their leases; and the
    preallocations that have ended (broker -> bundles).

    ``leases`` must hold every preallocated bundle and every bundle of ``ns_bundles`` (None:
    no lease). A lease that expired by ``now_ms`` is held by nobody."""
    held = {
        b: lease.broker
        for b, lease in leases.items()
        if lease is not None and lease.expires_at_ms > now_ms
    }
    brokers = view.brokers
    pre: dict[str, dict[str, BundleData]] = {}
    ended: dict[str, set[str]] = {}
    for broker, docs in preallocations.items():
        bv = brokers.get(broker)
        if bv is None:
            continue  # not live: counts nowhere, and is judged again if it comes back
        gone = {b for b in docs if b in bv.report.bundles or held.get(b) != broker}
        if gone:
            ended[broker] = gone
        kept = {b: d for b, d in docs.items() if b not in gone}
        if kept:
            known = bundle_data_from_document(kept)
            pre[broker] = {b: known.get(b, BundleData.new()) for b in kept}
    stale: dict[str, set[str]] = {}
    for b in ns_bundles:
        owner = held.get(b)
        for name, bv in brokers.items():
            if name != owner and b in bv.report.bundles:
                stale.setdefault(name, set()).add(b)
        if owner in brokers and b not in brokers[owner].report.bundles:
            mine = pre.setdefault(owner, {})
            if b not in mine:
                mine[b] = view.bundle(b)
    if not stale:
        return replace(view, preallocated=MappingProxyType(pre)), ended
    corrected = dict(brokers)
    for name, gone in stale.items():
        bv = brokers[name]
        report = replace(bv.report, bundles=bv.report.bundles - gone)
        corrected[name] = replace(bv, report=report)
    view = replace(view, brokers=MappingProxyType(corrected), preallocated=MappingProxyType(pre))
    return view, ended


def load_view(
    store: RedisStore, config: LoadBalancerConfig, now_ms: int, namespace: str | None = None
) -> ClusterView | None:
    """``base_view`` with the assignments not reported yet counted (``count_assignments``)."""
    view = base_view(store, config, now_ms)
    if view is None:
        return None
    return count_assignments(store, view, now_ms, namespace)[0]


def assign(
    store: RedisStore, bundle: str, config: LoadBalancerConfig, now_ms: int, *, seed: int = 0
) -> Lease | None:
    """Choose a broker for an unowned bundle and acquire its lease; None when no broker is live
    with load data. A concurrent assignment that wins first is returned as it is."""
    return assign_with_event(store, bundle, config, now_ms, seed=seed)[0]


MAX_PLACEMENT_ATTEMPTS = 64
"""Placements lost to concurrent ones before an assignment gives up with ``Conflict`` (every
lost round had a winner, so only a burst of this many placements at once can reach it)."""


def assign_with_event(
    store: RedisStore,
    bundle: str,
    config: LoadBalancerConfig,
    now_ms: int,
    *,
    seed: int = 0,
    reason: str = "lookup",
    view: ClusterView | None = None,
) -> tuple[Lease | None, OwnershipEvent | None]:
    """``assign``, plus the ``assigned`` event when *this* call took the lease.

    Why the distinction: when a concurrent assigner wins the race, its owner is returned but
    the event is the winner's to publish; publishing it here too would announce a lease this
    process never granted. ``view``: a ``base_view`` to reuse (a sweep places many bundles
    over one snapshot); the assignments are counted afresh for every placement regardless.
    """
    base = view if view is not None else base_view(store, config, now_ms)
    if base is None:
        return place(store, bundle, None, config, now_ms, seed=seed, reason=reason).lease, None
    namespace = bundle_namespace(bundle)
    for attempt in range(MAX_PLACEMENT_ATTEMPTS):
        counted, version = count_assignments(store, base, now_ms, namespace)

        def acquire(b: str, dest: str, at_ms: int, ttl_ms: int, data: BundleData) -> Lease:
            return store.acquire_placed(
                b,
                dest,
                at_ms,
                ttl_ms,
                placement_version=version,  # noqa: B023 - called before the loop moves on
                preallocation=bundle_data_doc(data),
            )

        try:
            placed = place(
                store, bundle, counted, config, now_ms, seed=seed, reason=reason, acquire=acquire
            )
        except PlacementChanged:
            metrics.ASSIGN_BROKER_BREAKDOWN_TOTAL.labels(result="Retry").inc()
            time.sleep(random.uniform(0, 0.0005 * min(attempt + 1, 8)))
            continue
        return placed.lease, placed.event
    raise Conflict(f"{bundle}: other placements kept coming first ({MAX_PLACEMENT_ATTEMPTS})")


Acquire: TypeAlias = Callable[[str, str, int, int, BundleData], Lease]
"""How ``place`` takes the lease: (bundle, broker, now_ms, ttl_ms, the bundle's averages)."""


@dataclass(frozen=True, slots=True)
class Placement:
    """What ``place`` did: the bundle's lease (None: no broker fits), the ``assigned`` event if
    this call granted it, and the bundle's data the new owner counts as preallocated."""

    lease: Lease | None
    event: OwnershipEvent | None = None
    preallocated: BundleData | None = None
    refusal: str = ""
    """Why no broker fits when ``lease`` is None (``BrokerSelector.last_reason``)."""


def place(
    store: OwnershipStore,
    bundle: str,
    view: ClusterView | None,
    config: LoadBalancerConfig,
    now_ms: int,
    *,
    seed: int = 0,
    reason: str = "lookup",
    acquire: Acquire | None = None,
) -> Placement:
    """Choose a broker for ``bundle`` over ``view`` and acquire the lease in any store.

    Why separate from ``assign``: only this part needs ownership, so it runs on the
    ``OwnershipStore`` interface (``MemoryStore`` in the fast simulator and unit tests), while
    reading the snapshot and recording preallocations stay Redis-specific (``acquire``, which
    ``assign_with_event`` gives; ``PlacementChanged`` from it goes to the caller).
    """
    if view is None:
        metrics.ASSIGN_BROKER_BREAKDOWN_TOTAL.labels(result="Empty").inc()
        return Placement(None)
    selector = BrokerSelector(view, config, cycle_rng(f"assign:{bundle}:{now_ms}", seed))
    dest = selector.select(bundle)
    if dest is None:
        metrics.ASSIGN_BROKER_BREAKDOWN_TOTAL.labels(result="Empty").inc()
        metrics.record_lookup_refused(selector.last_reason)
        return Placement(None, refusal=selector.last_reason)
    ttl_ms = int(config.load_balancer_ownership_lease_ttl_seconds * 1000)
    data = selector.preallocated.get(dest, {}).get(bundle, view.bundle(bundle))
    try:
        if acquire is None:
            lease = store.acquire(bundle, dest, now_ms, ttl_ms)
        else:
            lease = acquire(bundle, dest, now_ms, ttl_ms, data)
    except (PlacementChanged, MalformedLease):
        raise
    except Conflict:
        metrics.ASSIGN_BROKER_BREAKDOWN_TOTAL.labels(result="Skip").inc()
        return Placement(store.owner(bundle, now_ms))
    metrics.ASSIGN_BROKER_BREAKDOWN_TOTAL.labels(result="Success").inc()
    event = OwnershipEvent(
        ASSIGNED, bundle, now_ms, new_owner=lease.broker, new_token=lease.token, reason=reason
    )
    return Placement(lease, event, data)


def lookup_assign_event(
    store: RedisStore, topic: str, config: LoadBalancerConfig, now_ms: int
) -> tuple[str, Lease | None, OwnershipEvent | None]:
    """Pulsar's lookup: the topic's bundle and its owner, assigning a free bundle first; the
    third item is the ``assigned`` event when this lookup granted the lease.

    Two races are retried once with a fresh lookup and view, as the sweep survives them: the
    chosen broker's registration lapses before the acquire (``BrokerNotAlive``), or the bundle
    is split or merged between the namespace read and the acquire (``InvalidInput``). Lost
    twice, the lookup raises ``Transient``: the client looks up again. ``MalformedLease`` (a
    ``Conflict``) when the bundle's lease key holds no lease.
    """
    race = ""
    for _ in range(LOOKUP_ATTEMPTS):
        bundle, lease = store.lookup(topic, now_ms)
        if lease is not None:
            metrics.LOOKUPS.labels(result="owned").inc()
            return bundle, lease, None
        try:
            lease, event = assign_with_event(
                store, bundle, config, now_ms, reason=f"lookup of {topic}"
            )
        except InvalidInput as e:  # BrokerNotAlive is one
            race = e.reason
            continue
        metrics.LOOKUPS.labels(result="assigned" if event else "owned" if lease else "none").inc()
        return bundle, lease, event
    raise Transient(f"lookup of {topic} lost a placement race twice ({race}); look it up again")


LOOKUP_ATTEMPTS = 2
"""A lookup's placements before a race (broker lapsed, bundle split) becomes ``Transient``."""


def lookup_and_assign(
    store: RedisStore,
    topic: str,
    config: LoadBalancerConfig,
    now_ms: int,
    *,
    publisher: EventPublisher | None = None,
) -> tuple[str, Lease | None]:
    """``lookup_assign_event`` that publishes the ``assigned`` event (and waits for Kafka to
    have it) when a ``publisher`` is given, so followers learn the owner before the client."""
    bundle, lease, event = lookup_assign_event(store, topic, config, now_ms)
    if event is not None and publisher is not None:
        publisher.deliver([event])
    return bundle, lease


__all__ = [
    "MAX_PLACEMENT_ATTEMPTS",
    "Placement",
    "account_assignments",
    "assign",
    "assign_with_event",
    "base_view",
    "count_assignments",
    "load_view",
    "lookup_and_assign",
    "lookup_assign_event",
    "place",
    "put_load_snapshot",
]
