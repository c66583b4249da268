"""Assignment of unowned bundles, as Pulsar's lookup does it, over the load snapshot in Redis.

The streaming job writes the averaged view (per-broker report and history usage, per-bundle
short/long-term averages) to Redis; an assignment reads it, keeps only brokers that are live in
the registry, and runs the configured placement strategy through
``loadbalance.placement.pipeline.BrokerSelector`` with the preallocations recorded in Redis, so
bundles assigned before the destination's next report do not all land on one broker. The choice
is recorded as a preallocation until a report lists the bundle (``load_view`` deletes it then, as
the fast model drops it and Pulsar's ``updateBundleData`` does), and the lease is acquired with a
fencing token.

Every lease granted here is an ownership change, so it comes back as an ``assigned``
``OwnershipEvent`` (``assign_with_event``, ``lookup_assign_event``); ``lookup_and_assign`` with a
publisher and the control loop's sweep put them on the ownership-events topic.

The load snapshot is read through its one reader (``metadata_store.load_snapshot``, format in
``docs/snapshot-format.md``), which yields the ``ClusterView`` with the rules of ``lbctl
decide``; preallocations (``P:prealloc:<broker>``, bundle -> JSON averages) are read with the
same parser's ``bundleData`` rules.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from controller.events import ASSIGNED, EXPIRED, EventPublisher, OwnershipEvent
from infra import metrics
from loadbalance.bundles import bundle_namespace
from loadbalance.config import LoadBalancerConfig
from loadbalance.cycle import cycle_rng, weights_from_config
from loadbalance.errors import Conflict
from loadbalance.placement.pipeline import BrokerSelector
from loadbalance.snapshot import bundle_data_from_document
from loadbalance.time_average import BundleData
from loadbalance.view import ClusterView
from metadata_store.leases import Lease
from metadata_store.load_snapshot import shards_from_docs
from metadata_store.ownership_redis import RedisStore
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


def load_view(store: RedisStore, config: LoadBalancerConfig, now_ms: int) -> ClusterView | None:
    """The snapshot as a ``ClusterView`` of live brokers, with the recorded preallocations and
    the operator's placement policies (``P:policies``), which every placement honours."""
    live = set(store.live_brokers(now_ms))
    data = store.load_snapshot.read()
    snap = data.snapshot(now_ms, weights_from_config(config), brokers=live)
    if snap is None:
        return None
    served = set().union(*(bv.report.bundles for bv in snap.view.brokers.values()))
    pre: dict[str, dict[str, BundleData]] = {}
    for b in data.brokers:
        entries = store.preallocations.of(b) if b in live else None
        if not entries:
            continue
        reported = served.intersection(entries)
        if reported:  # the bundle is served and reported now: its preallocation has ended
            store.preallocations.forget(b, reported)
            entries = {k: v for k, v in entries.items() if k not in reported}
        if entries:
            known = bundle_data_from_document(entries)
            pre[b] = {k: known.get(k, BundleData.new()) for k in entries}
    return replace(
        snap.view,
        preallocated=MappingProxyType(pre),
        policies=store.placement_policies.read(),
    )


def assign(
    store: RedisStore, bundle: str, config: LoadBalancerConfig, now_ms: int, *, seed: int = 0
) -> Lease | None:
    """Choose a broker for an unowned bundle and acquire its lease; None when no broker is live
    with load data. A concurrent assignment that wins first is returned as it is."""
    return assign_with_event(store, bundle, config, now_ms, seed=seed)[0]


def assign_with_event(
    store: RedisStore,
    bundle: str,
    config: LoadBalancerConfig,
    now_ms: int,
    *,
    seed: int = 0,
    reason: str = "lookup",
) -> tuple[Lease | None, OwnershipEvent | None]:
    """``assign``, plus the ``assigned`` event when *this* call took the lease.

    Why the distinction: when a concurrent assigner wins the race, its owner is returned but
    the event is the winner's to publish; publishing it here too would announce a lease this
    process never granted.
    """
    placed = place(
        store, bundle, load_view(store, config, now_ms), config, now_ms, seed=seed, reason=reason
    )
    if placed.event is not None and placed.preallocated is not None:
        doc = bundle_data_doc(placed.preallocated)
        store.preallocations.record(placed.event.new_owner, bundle, doc)
    return placed.lease, placed.event


@dataclass(frozen=True, slots=True)
class Placement:
    """What ``place`` did: the bundle's lease (None: no broker fits), the ``assigned`` event if
    this call granted it, and the bundle's data to record as the new owner's preallocation."""

    lease: Lease | None
    event: OwnershipEvent | None = None
    preallocated: BundleData | None = None


def place(
    store: OwnershipStore,
    bundle: str,
    view: ClusterView | None,
    config: LoadBalancerConfig,
    now_ms: int,
    *,
    seed: int = 0,
    reason: str = "lookup",
) -> Placement:
    """Choose a broker for ``bundle`` over ``view`` and acquire the lease in any store.

    Why separate from ``assign``: only this part needs ownership, so it runs on the
    ``OwnershipStore`` interface (``MemoryStore`` in the fast simulator and unit tests), while
    reading the snapshot and recording preallocations stay Redis-specific.
    """
    if view is None:
        metrics.ASSIGN_BROKER_BREAKDOWN_TOTAL.labels(result="Empty").inc()
        return Placement(None)
    selector = BrokerSelector(view, config, cycle_rng(f"assign:{bundle}:{now_ms}", seed))
    dest = selector.select(bundle)
    if dest is None:
        metrics.ASSIGN_BROKER_BREAKDOWN_TOTAL.labels(result="Empty").inc()
        return Placement(None)
    ttl_ms = int(config.load_balancer_ownership_lease_ttl_seconds * 1000)
    try:
        lease = store.acquire(bundle, dest, now_ms, ttl_ms)
    except Conflict:
        metrics.ASSIGN_BROKER_BREAKDOWN_TOTAL.labels(result="Skip").inc()
        return Placement(store.owner(bundle, now_ms))
    metrics.ASSIGN_BROKER_BREAKDOWN_TOTAL.labels(result="Success").inc()
    data = selector.preallocated.get(dest, {}).get(bundle, view.bundle(bundle))
    event = OwnershipEvent(
        ASSIGNED, bundle, now_ms, new_owner=lease.broker, new_token=lease.token, reason=reason
    )
    return Placement(lease, event, data)


def lookup_assign_event(
    store: RedisStore, topic: str, config: LoadBalancerConfig, now_ms: int
) -> tuple[str, Lease | None, OwnershipEvent | None]:
    """Pulsar's lookup: the topic's bundle and its owner, assigning a free bundle first; the
    third item is the ``assigned`` event when this lookup granted the lease."""
    bundle, lease = store.lookup(topic, now_ms)
    if lease is not None:
        metrics.LOOKUPS.labels(result="owned").inc()
        return bundle, lease, None
    lease, event = assign_with_event(store, bundle, config, now_ms, reason=f"lookup of {topic}")
    metrics.LOOKUPS.labels(result="assigned" if event else "owned" if lease else "none").inc()
    return bundle, lease, event


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


def sweep_and_reassign(
    store: RedisStore, config: LoadBalancerConfig, now_ms: int
) -> list[OwnershipEvent]:
    """Remove expired leases and place their bundles again; return the ownership events.

    Each swept lease gives an ``expired`` event (old owner and token); each bundle this call
    placed again gives an ``assigned`` event (new owner and token), even on the same broker:
    its new token is what followers must fence with. A bundle whose namespace no longer holds
    it (split or merged meanwhile) is not reassigned. A bundle that cannot be placed now (no
    live broker with load data) stays free and is assigned on its next lookup.
    """
    events: list[OwnershipEvent] = []
    for lease in store.sweep_expired(now_ms):
        events.append(
            OwnershipEvent(
                EXPIRED,
                lease.bundle,
                now_ms,
                old_owner=lease.broker,
                old_token=lease.token,
                reason=f"lease expired at {lease.expires_at_ms}",
            )
        )
        ns = store.get_namespace(bundle_namespace(lease.bundle))
        if ns is None or not ns.contains(lease.bundle):
            continue
        _, event = assign_with_event(
            store, lease.bundle, config, now_ms, reason=f"reassigned: {lease.broker} expired"
        )
        if event is not None:
            events.append(event)
    return events


__all__ = [
    "Placement",
    "assign",
    "assign_with_event",
    "load_view",
    "lookup_and_assign",
    "lookup_assign_event",
    "place",
    "put_load_snapshot",
    "sweep_and_reassign",
]
