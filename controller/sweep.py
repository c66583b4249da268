"""The periodic sweep: remove the leases that expired, announce each, place their bundles again.

Order, and why: each batch of leases the store removes is announced (``expired`` events,
delivered to Kafka by ``publish``) before anything else is tried, so no later failure can lose
an expiry that already happened in Redis. The bundles are then placed again over one view of
the load, and their ``assigned`` events are delivered even when a later placement fails.

**Not placed now.** A bundle that cannot be placed at this moment is passed over, counted
(``lbctl_control_sweep_skips_total{reason}``) and logged once while it lasts, and the sweep goes
on with the others:

* ``broker_not_alive``: the destination chosen over the view let its registration lapse before
  the acquire. The view is read again for the bundles after it, and the bundle is placed by the
  next sweep (``SweepState.unplaced`` keeps it).
* ``namespace_changed``: the bundle was split or merged meanwhile, so it no longer exists; its
  successors are free and are assigned by their first lookup, as any new bundle is.
* ``malformed_key``: a key under the lease prefix that holds no lease (the store names it and
  leaves it alone, ``metadata_store.sweeps``).

A Redis fault raised while placing leaves the bundles not yet placed in ``SweepState.unplaced``,
so the next sweep places them; the runner (``controller.loop``) decides what a fault means. A
bundle for which no broker fits (no live broker with load data) stays free, as in Pulsar, and
is assigned on its next lookup.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from controller.events import EXPIRED, OwnershipEvent
from controller.placement import assign_with_event, base_view
from infra import metrics
from loadbalance.bundles import bundle_namespace
from loadbalance.config import LoadBalancerConfig
from loadbalance.errors import Conflict, InvalidInput
from loadbalance.view import ClusterView
from metadata_store.leases import BrokerNotAlive, Lease
from metadata_store.ownership_redis import RedisStore

__all__ = [
    "BROKER_NOT_ALIVE",
    "MALFORMED_KEY",
    "NAMESPACE_CHANGED",
    "SweepState",
    "expired_event",
    "sweep_and_reassign",
]

log = logging.getLogger("lbctl.control")

BROKER_NOT_ALIVE = "broker_not_alive"
NAMESPACE_CHANGED = "namespace_changed"
MALFORMED_KEY = "malformed_key"
CONFLICT = "conflict"

Publish = Callable[[list[OwnershipEvent]], None]


@dataclass
class SweepState:
    """What one sweep leaves to the next: bundles announced ``expired`` and not placed again yet
    (bundle -> the reason its ``assigned`` event will carry), and the keys already logged as
    passed over, so each is logged once while it lasts."""

    unplaced: dict[str, str] = field(default_factory=dict)
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
    """Remove expired leases and place their bundles again; return the ownership events.

    Each swept lease gives an ``expired`` event (old owner and token), handed to ``publish``
    batch by batch as the store removes them; each bundle placed again gives an ``assigned``
    event (new owner and token), even on the same broker: its new token is what followers
    must fence with. ``state`` carries the bundles not placed yet from one sweep to the next
    (module docstring); without it, a bundle not placed now is left free.
    """
    state = state if state is not None else SweepState()
    events: list[OwnershipEvent] = []

    def announce(leases: list[Lease]) -> None:
        for lease in leases:
            state.unplaced[lease.bundle] = f"reassigned: {lease.broker} expired"
        batch = [expired_event(x, now_ms) for x in leases]
        if publish is not None:
            publish(batch)
        events.extend(batch)

    def malformed(names: list[str]) -> None:
        state.malformed(names, store.keys.lease_prefix())

    store.sweep_expired(now_ms, on_expired=announce, on_malformed=malformed)
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
    Redis fault ends the loop early (the bundles not placed stay in ``state.unplaced``)."""
    placed: list[OwnershipEvent] = []
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
            except Conflict as e:
                state.skip(bundle, CONFLICT, f"{e}; placed by the next sweep")
                continue
            else:
                if event is not None:
                    placed.append(event)
                state.settled(bundle)
            del state.unplaced[bundle]
    finally:
        if placed and publish is not None:
            publish(placed)
    return placed


def _place_one(
    store: RedisStore,
    config: LoadBalancerConfig,
    now_ms: int,
    bundle: str,
    reason: str,
    view: ClusterView | None,
) -> OwnershipEvent | None:
    """Place ``bundle`` over ``view``; its ``assigned`` event, or None (placed by someone
    else, or no broker fits). ``InvalidInput`` when the bundle no longer exists."""
    ns = store.get_namespace(bundle_namespace(bundle))
    if ns is None or not ns.contains(bundle):
        raise InvalidInput("bundle", f"{bundle} is not a current bundle")
    _, event = assign_with_event(store, bundle, config, now_ms, reason=reason, view=view)
    return event
