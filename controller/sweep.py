"""The periodic sweep: remove the leases that expired, announce each, place their bundles again.

Order, and why: each batch of leases the store removes is announced (``expired`` events,
delivered to Kafka by ``publish``) before anything else is tried, so no later failure can lose
an expiry that already happened in Redis. The bundles are then placed again over one view of
the load, and their ``assigned`` events are delivered even when a later placement fails.

**The sweep outbox** (``metadata_store.sweep_outbox``). The sweep script writes each lease it
removes to ``P:sweep-outbox`` in the step that deletes it, and an entry is cleared only after
its ``expired`` event was delivered and its bundle was placed again (``assigned`` delivered),
found owned, or found gone (split or merged away). Every sweep first re-delivers the entries
this process has not delivered itself (all of them, in a controller just started), so a
controller killed between the sweep script and Kafka loses neither the ``expired`` events nor
the bundles' placement: the next sweep of any controller announces and places them. A bundle
found owned when its entry is settled is announced ``assigned`` with its current lease (a
controller killed after placing it and before delivering that event). Events are at least
once; readers de-duplicate (``controller.events``). Concurrent controllers are safe: each lease
is removed, and its entry written, by exactly one script; each controller clears only the
exact entries it delivered, after their bundle settled.

**Not placed now.** A bundle that cannot be placed at this moment is passed over, counted
(``lbctl_control_sweep_skips_total{reason}``) and logged once while it lasts, and the sweep goes
on with the others; its entry stays, so the next sweep tries again:

* ``broker_not_alive``: the destination chosen over the view let its registration lapse before
  the acquire. The view is read again for the bundles after it.
* ``conflict``: other placements kept coming first.
* ``no_broker``: no broker fits (no live broker with load data, or the placement policies
  leave none); as in Pulsar the bundle stays free and a lookup may assign it meanwhile.
* ``malformed_key``: a key under the lease prefix that holds no lease (the store names it and
  leaves it alone, ``metadata_store.sweeps``).

A bundle split or merged meanwhile (``namespace_changed``) no longer exists: its entry is
cleared and its successors are assigned by their first lookup, as any new bundle is. A Redis
fault raised while placing leaves the entries not settled in the outbox (and in
``SweepState.unplaced``), so the next sweep places them; the runner (``controller.loop``)
decides what a fault means.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from controller.events import ASSIGNED, EXPIRED, OwnershipEvent
from controller.placement import assign_with_event, base_view
from infra import metrics
from loadbalance.bundles import bundle_namespace
from loadbalance.config import LoadBalancerConfig
from loadbalance.errors import Conflict, InvalidInput
from loadbalance.view import ClusterView
from metadata_store.leases import BrokerNotAlive, Lease
from metadata_store.ownership_redis import MalformedLease, RedisStore
from metadata_store.sweep_outbox import SweptLease

__all__ = [
    "BROKER_NOT_ALIVE",
    "MALFORMED_KEY",
    "NAMESPACE_CHANGED",
    "NO_BROKER",
    "SweepState",
    "expired_event",
    "sweep_and_reassign",
]

log = logging.getLogger("lbctl.control")

BROKER_NOT_ALIVE = "broker_not_alive"
NAMESPACE_CHANGED = "namespace_changed"
MALFORMED_KEY = "malformed_key"
CONFLICT = "conflict"
NO_BROKER = "no_broker"

Publish = Callable[[list[OwnershipEvent]], None]


@dataclass
class SweepState:
    """What one sweep leaves to the next in this process: bundles announced ``expired`` and
    not placed again yet (bundle -> the reason its ``assigned`` event will carry), their outbox
    entries (bundle -> fields), the entries whose ``expired`` event this process delivered,
    and the keys already logged as passed over, so each is logged once while it lasts."""

    unplaced: dict[str, str] = field(default_factory=dict)
    entries: dict[str, set[str]] = field(default_factory=dict)
    delivered: set[str] = field(default_factory=set)
    logged: set[str] = field(default_factory=set)

    def skip(self, key: str, reason: str, detail: str) -> None:
        """Count a key passed over; log it the first time."""
        metrics.CONTROL_SWEEP_SKIPS.labels(reason=reason).inc()
        if key not in self.logged:
            self.logged.add(key)
            log.warning("sweep: %s passed over (%s): %s", key, reason, detail)

    def settled(self, key: str) -> None:
        """``key`` is fine again: a new problem with it is logged again."""
        self.logged.discard(key)

    def malformed(self, names: list[str], prefix: str) -> None:
        """Count and log (once each) the lease keys that hold no lease; forget those gone."""
        keys = {f"{prefix}{n}" for n in names}
        for key in sorted(keys):
            self.skip(key, MALFORMED_KEY, "not a lease; left as it is, repair or delete it")
        self.logged -= {k for k in self.logged if k.startswith(prefix) and k not in keys}

    def pending(self, swept: list[SweptLease]) -> list[SweptLease]:
        """Take ``swept`` (outbox entries) as unplaced; those this process has not delivered."""
        for s in swept:
            self.unplaced.setdefault(s.lease.bundle, f"reassigned: {s.lease.broker} expired")
            self.entries.setdefault(s.lease.bundle, set()).add(s.field)
        return [s for s in swept if s.field not in self.delivered]

    def done(self, bundle: str) -> set[str]:
        """Forget a settled bundle; the outbox fields to clear for it."""
        del self.unplaced[bundle]
        fields = self.entries.pop(bundle, set())
        self.delivered -= fields
        return fields


def expired_event(lease: Lease, now_ms: int) -> OwnershipEvent:
    return OwnershipEvent(
        EXPIRED,
        lease.bundle,
        now_ms,
        old_owner=lease.broker,
        old_token=lease.token,
        reason=f"lease expired at {lease.expires_at_ms}",
    )


def sweep_and_reassign(
    store: RedisStore,
    config: LoadBalancerConfig,
    now_ms: int,
    *,
    publish: Publish | None = None,
    state: SweepState | None = None,
) -> list[OwnershipEvent]:
    """Re-deliver the outbox, remove expired leases and place their bundles again; return the
    ownership events.

    Each swept lease gives an ``expired`` event (old owner and token), handed to ``publish``
    batch by batch as the store removes them, after the outbox entries a previous (possibly
    killed) sweep left undelivered; each bundle placed again gives an ``assigned`` event (new
    owner and token), even on the same broker: its new token is what followers must fence
    with. ``state`` carries what this process delivered and has not placed yet from one sweep
    to the next (module docstring); without it, every entry left in the outbox is delivered
    again.
    """
    state = state if state is not None else SweepState()
    events: list[OwnershipEvent] = []

    def announce(swept: list[SweptLease]) -> None:
        fresh = state.pending(swept)
        batch = [expired_event(x.lease, x.swept_at_ms) for x in fresh]
        if not batch:
            return
        if publish is not None:
            publish(batch)
        state.delivered.update(x.field for x in fresh)
        events.extend(batch)

    def swept_now(leases: list[Lease]) -> None:
        announce([SweptLease(x, now_ms) for x in leases])

    def malformed(names: list[str]) -> None:
        state.malformed(names, store.keys.lease_prefix())

    left = store.sweep_outbox.pending()
    state.delivered &= {x.field for x in left}  # cleared elsewhere: forgotten here
    announce(left)
    store.sweep_expired(now_ms, on_expired=swept_now, on_malformed=malformed)
    events.extend(_place_again(store, config, now_ms, state, publish))
    return events


def _place_again(
    store: RedisStore,
    config: LoadBalancerConfig,
    now_ms: int,
    state: SweepState,
    publish: Publish | None,
) -> list[OwnershipEvent]:
    """Place every bundle of ``state.unplaced``; publish the ``assigned`` events, also when a
    Redis fault ends the loop early (the bundles not placed stay in ``state.unplaced``), and
    only then clear the outbox entries of the bundles settled."""
    placed: list[OwnershipEvent] = []
    cleared: set[str] = set()
    view: ClusterView | None = None
    try:
        for bundle, reason in sorted(state.unplaced.items()):
            if view is None:
                view = base_view(store, config, now_ms)
            try:
                event = _place_one(store, config, now_ms, bundle, reason, view)
            except BrokerNotAlive as e:
                state.skip(bundle, BROKER_NOT_ALIVE, f"{e.reason}; placed by the next sweep")
                view = None  # the live brokers changed: read them again
                continue
            except InvalidInput as e:  # split, merged or its namespace deleted meanwhile
                state.skip(bundle, NAMESPACE_CHANGED, f"{e.reason}; it no longer exists")
                state.settled(bundle)  # dropped: never judged again
            except MalformedLease as e:
                state.skip(bundle, MALFORMED_KEY, f"{e}; placed once repaired")
                continue
            except Conflict as e:
                state.skip(bundle, CONFLICT, f"{e}; placed by the next sweep")
                continue
            else:
                if event is None:
                    state.skip(bundle, NO_BROKER, "no broker fits; placed by a later sweep")
                    continue
                placed.append(event)
                state.settled(bundle)
            cleared |= state.done(bundle)
    finally:
        if placed and publish is not None:
            publish(placed)
        store.sweep_outbox.clear(cleared)  # skipped when the publish raised
    return placed


def _place_one(
    store: RedisStore,
    config: LoadBalancerConfig,
    now_ms: int,
    bundle: str,
    reason: str,
    view: ClusterView | None,
) -> OwnershipEvent | None:
    """Place ``bundle`` over ``view``; its ``assigned`` event, or None when no broker fits.
    A bundle owned already (placed by a lookup, another controller, or this one before it was
    killed) is announced with its current lease. ``InvalidInput`` when it no longer exists."""
    ns = store.get_namespace(bundle_namespace(bundle))
    if ns is None or not ns.contains(bundle):
        raise InvalidInput("bundle", f"{bundle} is not a current bundle")
    lease = store.owner(bundle, now_ms)
    event = None
    if lease is None:
        lease, event = assign_with_event(store, bundle, config, now_ms, reason=reason, view=view)
    if event is None and lease is not None:
        return OwnershipEvent(
            ASSIGNED, bundle, now_ms, new_owner=lease.broker, new_token=lease.token,
            reason=f"{reason}; owner found by the sweep",
        )  # fmt: skip
    return event
