"""The controller's logic: bring Redis to what a decision asks, and say what changed.

``Reconciler.reconcile(decision) -> Outcome`` re-reads the store, checks that the transition is
still valid and applies it fenced and idempotently (``controller.apply``), records the outcome,
and hands the resulting ownership events to the ``publish`` callable it was given. ``sweep``
is the periodic reconcile of what no decision names: leases that expired, and the bundles
they leave free, are placed again. ``recover`` rebuilds a store that lost its data.

The reconciler does no Kafka, no signal handling, no timing and no back-off: the runner
(``controller.loop``) owns those, and decides when each of these is called. Redis being away
raises out of every method, so the runner can hold the record and try again.

Why the event outbox (``metadata_store.outbox``): the Redis change and the Kafka delivery of
its events are two systems, so a process can be killed between them. The leases read before
applying are saved in the outbox first and cleared only after ``publish`` returned; the
replayed decision (found ``already_satisfied`` or ``duplicate``) publishes its events from the
saved entry. Sweeps have their own outbox (``metadata_store.sweep_outbox``): the sweep script
records each lease it removes in the step that deletes it, and the entry is cleared only after
its ``expired`` event was delivered and its bundle placed again (``assigned`` delivered) or
found owned or gone; every sweep first re-delivers what a killed controller left there, so a
sweep killed before its delivery loses neither its events nor its bundles' placement
(``controller.sweep``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from itertools import pairwise
from typing import Any

from controller.apply import (
    ALREADY_SATISFIED,
    APPLIED,
    DUPLICATE,
    REJECTED,
    Outcome,
    TermGate,
    apply_decision,
    apply_knobs,
    outcome_of,
)
from controller.events import ASSIGNED, MERGED, RELEASED, TRANSFERRED, OwnershipEvent
from controller.events import SPLIT as SPLIT_EVENT
from controller.placement import bundle_data_doc
from controller.recovery import AutoRecovery, RecoveryReport, recovery_events, summary
from controller.sweep import SweepState, sweep_and_reassign
from loadbalance.bundles import format_range, parse_bundle
from loadbalance.config import LoadBalancerConfig
from loadbalance.decisions import MERGE, SPLIT, TRANSFER, UNLOAD, Decision
from loadbalance.transfer_preallocation import preallocation_of
from metadata_store.decider_lease import DeciderLease
from metadata_store.leases import Lease
from metadata_store.ownership_redis import RedisStore
from metadata_store.protocol import OwnershipStore

__all__ = ["Reconciler", "apply_knobs", "apply_with_events", "clear_outbox", "decision_events"]

log = logging.getLogger("lbctl.control")

Publish = Callable[[list[OwnershipEvent]], None]
"""Delivers ownership events; returns only once they are delivered (or raises)."""


def _bundles_of(d: Decision) -> list[str]:
    return [d.bundle, d.merge_bundle] if d.kind == MERGE and d.merge_bundle else [d.bundle]


def _kept_children_events(
    store: OwnershipStore,
    d: Decision,
    children: tuple[str, ...],
    parent: Lease,
    now_ms: int,
) -> list[OwnershipEvent]:
    """An ``assigned`` event for each child of the split ``d`` that the parent's broker holds
    now (read after applying): the children kept by the parent's owner are new bundles, so
    the event stream must say who owns them."""
    events: list[OwnershipEvent] = []
    for child in children:
        lease = store.owner(child, now_ms)
        if lease is not None and lease.broker == parent.broker:
            events.append(
                OwnershipEvent(
                    ASSIGNED, child, now_ms, new_owner=lease.broker,
                    new_token=lease.token, decision_id=d.id,
                    reason=f"split of {d.bundle}",
                )
            )  # fmt: skip
    return events


def decision_events(
    store: OwnershipStore,
    d: Decision,
    before: dict[str, Lease | None],
    now_ms: int,
    *,
    kept_children: bool = False,
) -> list[OwnershipEvent]:
    """The ownership events of an *applied* decision.

    ``before`` holds the leases read just before applying; the new lease of a transfer is read
    after. A transfer of a free bundle is an ``assigned`` event; a merge gives one ``merged``
    event per bundle that ended (each keyed by its own bundle, so a compacted topic forgets
    both), with the merged bundle as the only child. With ``kept_children`` (the split's
    children stay with the parent's owner), each child that broker holds now is also an
    ``assigned`` event.
    """

    def ev(kind: str, bundle: str, **kw: Any) -> OwnershipEvent:
        old = before.get(bundle)
        return OwnershipEvent(
            kind,
            bundle,
            now_ms,
            old_owner=old.broker if old else None,
            old_token=old.token if old else None,
            decision_id=d.id,
            reason=d.reason,
            **kw,
        )

    if d.kind == UNLOAD:
        return [ev(RELEASED, d.bundle)]
    if d.kind == TRANSFER:
        new = store.owner(d.bundle, now_ms)
        kind = TRANSFERRED if before.get(d.bundle) else ASSIGNED
        return [
            ev(kind, d.bundle, new_owner=new.broker if new else d.destination_broker,
               new_token=new.token if new else None)
        ]  # fmt: skip
    if d.kind == SPLIT:
        r = parse_bundle(d.bundle)
        points = [r.lower, *sorted(set(d.split_boundaries)), r.upper]
        children = tuple(f"{r.namespace}/{format_range(a, b)}" for a, b in pairwise(points))
        events = [ev(SPLIT_EVENT, d.bundle, children=children)]
        parent = before.get(d.bundle) if kept_children else None
        if parent is not None:
            events.extend(_kept_children_events(store, d, children, parent, now_ms))
        return events
    if d.kind == MERGE:
        a, b = parse_bundle(d.bundle), parse_bundle(d.merge_bundle or "")
        merged = f"{a.namespace}/{format_range(min(a.lower, b.lower), max(a.upper, b.upper))}"
        return [ev(MERGED, x, children=(merged,)) for x in _bundles_of(d)]
    return []


def _effect_holds(store: RedisStore, outcome: Outcome) -> bool:
    """Whether the decision's change is in Redis: applied now, found made, or a duplicate of
    one that was applied or found made."""
    if outcome.outcome in (APPLIED, ALREADY_SATISFIED):
        return True
    if outcome.outcome == DUPLICATE:
        first = outcome_of(store, outcome.decision_id)
        return first is not None and first.outcome in (APPLIED, ALREADY_SATISFIED)
    return False


def apply_with_events(
    store: RedisStore,
    d: Decision,
    *,
    now_ms: int,
    lease_ttl_ms: int,
    dry_run: bool = False,
    outbox: bool = False,
    config: LoadBalancerConfig | None = None,
    terms: TermGate | None = None,
) -> tuple[Outcome, list[OwnershipEvent]]:
    """``apply_decision``, plus the events to publish when it was applied.

    With ``outbox``, the leases read before applying are first saved in the event outbox and
    stay there until ``clear_outbox`` after the events are delivered (module docstring): a
    replay that finds the change made or recorded announces it from the saved entry.
    ``config`` gives the knobs of ``apply_knobs``; ``terms`` refuses stale decider terms.
    """
    knobs = {**apply_knobs(config), "terms": terms}
    if dry_run:
        return apply_decision(
            store, d, now_ms=now_ms, lease_ttl_ms=lease_ttl_ms, dry_run=True, **knobs
        ), []
    saved = store.outbox.get(d.id) if outbox else None
    if saved is not None:
        before = saved
    else:
        before = {b: store.owner(b, now_ms) for b in _bundles_of(d)}
        if outbox:
            store.outbox.put(d.id, before)
    outcome = apply_decision(store, d, now_ms=now_ms, lease_ttl_ms=lease_ttl_ms, **knobs)
    if outcome.outcome == APPLIED or (saved is not None and _effect_holds(store, outcome)):
        preallocate_transfer(store, d)
        kept = bool(knobs.get("keep_split_children"))
        return outcome, decision_events(store, d, before, now_ms, kept_children=kept)
    return outcome, []


def preallocate_transfer(store: RedisStore, d: Decision) -> None:
    """Record an applied transfer's bundle as a preallocation of its destination, when the
    decision carries the bundle's averages (``loadbalance.transfer_preallocation``): the next
    lookups count it there until the destination reports it. Written after the transfer, not in
    its script: a crash between the two loses only this hint, and the lease is what matters."""
    data = preallocation_of(d)
    if data is not None and d.destination_broker:
        store.preallocations.record(d.destination_broker, d.bundle, bundle_data_doc(data))


def clear_outbox(store: RedisStore, decision_id: str) -> None:
    """Forget a decision's saved leases once its events are delivered (or it had none)."""
    store.outbox.clear(decision_id)


class Reconciler:
    """Reconciles the store with decisions, expired leases and a lost store (module docstring).

    ``config`` enables ``sweep``; ``recovery`` enables ``recover``. A dry run changes nothing,
    so it neither keeps an outbox nor rebuilds a lost store.
    """

    def __init__(
        self,
        store: RedisStore,
        *,
        publish: Publish,
        clock: Callable[[], int],
        lease_ttl_ms: int = 30_000,
        dry_run: bool = False,
        config: LoadBalancerConfig | None = None,
        recovery: AutoRecovery | None = None,
    ) -> None:
        self.store = store
        self.publish = publish
        self.clock = clock
        self.lease_ttl_ms = lease_ttl_ms
        self.dry_run = dry_run
        self.config = config
        self.recovery = None if dry_run else recovery
        self.sweep_state = SweepState()
        # decisions from the topic are admitted by their decider term (controller.apply)
        self.terms = DeciderLease.of(store)

    def reconcile(self, d: Decision, now_ms: int | None = None) -> Outcome:
        """Apply one decision, record its outcome and publish its events; the outcome.

        The events are usually an applied decision's, or a replay's unannounced ones; the
        outbox entry is cleared only after they are published.
        """
        now = self.clock() if now_ms is None else now_ms
        outcome, events = apply_with_events(
            self.store, d, now_ms=now, lease_ttl_ms=self.lease_ttl_ms, dry_run=self.dry_run,
            outbox=True, config=self.config, terms=self.terms,
        )  # fmt: skip
        log.info("%s %s %s: %s %s", d.id[:12], d.kind, d.bundle, outcome.outcome, outcome.reason)
        self.publish(events)
        if not self.dry_run:
            clear_outbox(self.store, d.id)
        return outcome

    def reject(self, where: str, reason: str, now_ms: int | None = None) -> Outcome:
        """Record a ``rejected`` outcome for a record that is no decision, keyed by ``where``
        (its topic/partition/offset), so a bad record is visible and never retried."""
        now = self.clock() if now_ms is None else now_ms
        self.store.outcomes.record_unreadable(where, REJECTED, reason, now)
        log.warning("rejected record %s: %s", where, reason)
        return Outcome(f"record:{where}", REJECTED, reason)

    def sweep(self) -> list[OwnershipEvent]:
        """Expire lapsed leases, place their bundles again; publish and return the events.

        Entries a previous (possibly killed) controller left in the sweep outbox are
        re-delivered first; the ``expired`` events are published as the store removes the
        leases, before any placement is tried; bundles not placed now stay in the outbox and
        are placed by a later sweep (``controller.sweep``)."""
        if self.config is None:
            return []
        return sweep_and_reassign(
            self.store, self.config, self.clock(), publish=self.publish, state=self.sweep_state
        )

    @property
    def holding(self) -> bool:
        """True from the detection of a data loss until its recovery: decisions and sweeps
        wait, since either would hand out tokens below the floor or use a half-rebuilt ring."""
        return self.recovery is not None and self.recovery.pending

    def loss_suspected(self) -> bool:
        """One cheap read (the epoch key): whether a loss may have happened since the last
        ``recover`` and it should run before the next decision."""
        return self.recovery is not None and not self.recovery.pending and self.recovery.suspect()

    def recover(self) -> RecoveryReport | None:
        """Detect or progress a data loss; after a recovery, log it and publish its events.

        Raises when Redis is away or the token floor is unknown (``Transient``); the caller
        tries again later.
        """
        if self.recovery is None:
            return None
        report = self.recovery.check(self.clock())
        if report is None:
            return None
        log.warning("%s", summary(report, self.store.keys.recovery_last()))
        self.publish(recovery_events(report))
        return report
