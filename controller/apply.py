"""Apply decisions to the ownership store: level-based, idempotent, fenced.

A decision is a hint. The applier re-reads the store, checks that the change is still valid,
returns early when it already holds, and makes every write conditional (the namespace version
for splits and merges, the owner's fencing token for unloads and transfers), so a stale or
replayed decision can never undo a newer change. Every decision ends with exactly one recorded
outcome (a hash keyed by decision id, plus a stream for tailing), and a decision whose id
already has an outcome changes nothing: replaying the decisions topic is safe.

Outcomes: ``applied``, ``already_satisfied``, ``conflict`` (a compare-and-set kept losing),
``rejected`` (with a reason: bundle gone, owner changed, broker gone), ``duplicate`` (the id was
applied before; nothing changes, and the hash keeps the first outcome, but the stream gets a
``duplicate`` entry so replays and a second controller are visible), and ``dry_run``.

**One decider.** A decision from the decisions topic is first admitted by its decider term
(``terms``, the shared gate of ``metadata_store.decider_lease``; the reconciler passes it, the
admin verbs, which build their own decisions, do not): a term older than the newest any
decider has held, or than any decision a controller accepted, is refused and recorded as
``rejected`` with ``refused: stale decider term T < N``, so a second decider, or one that
lost its lease, cannot get a decision applied, and every decision still has exactly one
outcome. A decision without a term reads as term 0 (``loadbalance.decisions``). The check
comes after de-duplication: a copy of a decision already applied stays a ``duplicate``.
A refused id keeps its ``rejected`` outcome, so a copy of it published again under a newer
term (a cycle replayed by a restarted decider, read only after the refusal) is a
``duplicate``; the next cycle decides again on fresh load.

The Redis change and the outcome are two writes, so a crash can fall between them; the replay
then finds the change already made and records ``already_satisfied``. ``fault_point`` lets the
reliability suite (``tests/reliability``) kill the process exactly there.

Two knobs shape what an applied decision does (the controller passes them from its
configuration; the defaults are Pulsar's):

* ``loadBalancerAutoUnloadSplitBundlesEnabled`` (``keep_split_children=False`` when on): a
  split ends the parent's lease and leaves the children free, to be placed on their next
  lookup, as Pulsar's ``splitAndOwnBundle`` with ``unload=true``. Off, each child is leased to
  the parent's owner right after the split, fenced with a new token, as Pulsar keeps the
  children with the broker that split them; a child placed meanwhile, or an owner that is gone,
  is left as it is.
* ``namespaceBundleUnloadingTimeoutMs`` (``unload_timeout_ms``): how long an unload or
  transfer may hold its bundle before it is applied, counted from the decision's
  ``decided_at_ms``. Pulsar bounds by it the owner's unload (closing the bundle's topics); here
  the release is one atomic script that never waits, so what can take long is the wait before
  it (Redis away, a recovery pending, a backlog of decisions). Past the bound the controller
  gives up: the outcome is ``rejected`` with ``unload timed out``, the bundle stays with its
  owner, and the next shedding cycle decides again on fresh load instead of applying a move
  chosen on load that is gone.

The applier asks only the ``DecisionStore`` protocol (``metadata_store.protocol``: ownership
plus the outcome log), so the controller applies to ``RedisStore`` and the fast simulator
(``producers.fast_sim``) to ``MemoryStore`` with this same code: the scoreboard measures the
product's semantics.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from loadbalance.bundles import BundleRange, NamespaceBundles, parse_bundle
from loadbalance.decisions import MERGE, SPLIT, TRANSFER, UNLOAD, Decision
from loadbalance.errors import Conflict, InvalidInput
from loadbalance.values import OutcomeKind
from metadata_store.leases import BrokerNotAlive
from metadata_store.protocol import DecisionStore

if TYPE_CHECKING:
    from loadbalance.config import LoadBalancerConfig

APPLIED = OutcomeKind.APPLIED
ALREADY_SATISFIED = OutcomeKind.ALREADY_SATISFIED
CONFLICT = OutcomeKind.CONFLICT
REJECTED = OutcomeKind.REJECTED
DUPLICATE = OutcomeKind.DUPLICATE
DRY_RUN = OutcomeKind.DRY_RUN
FAULT_POINT_ENV = "LBCTL_FAULT_POINT"


def fault_point(name: str) -> None:
    """Die at once (exit status 137, like SIGKILL) if ``$LBCTL_FAULT_POINT`` equals ``name``.

    Why: "killed in the middle of applying a split" has to be hit deterministically by the
    fault-injection tests, not by a lucky timer. ``os._exit`` runs no ``finally`` block, no
    flush and no commit, as a real kill. Points: ``after-<kind>-script`` (the Redis change is
    made, its outcome is not recorded) and ``after-outcome`` (recorded, offset not committed).
    Unset, it costs one environment lookup per decision.
    """
    if os.environ.get(FAULT_POINT_ENV) == name:
        os._exit(137)


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one decision ended, and why."""

    decision_id: str
    outcome: str
    reason: str = ""


def outcome_of(store: DecisionStore, decision_id: str) -> Outcome | None:
    doc = store.outcomes.get(decision_id)
    if doc is None:
        return None
    return Outcome(decision_id, doc["outcome"], doc.get("reason", ""))


def _record(store: DecisionStore, d: Decision, outcome: Outcome, now_ms: int) -> Outcome:
    """Record the outcome in the log's hash and stream, atomically; report a lost race.

    Why atomically (``metadata_store.outcomes``): two controllers run by mistake can both pass
    the de-duplication check for the same decision; the hash keeps the first outcome (the
    loser's would otherwise overwrite an ``applied`` with ``already_satisfied`` and hide who
    changed Redis), and the loser's outcome is returned and streamed as ``conflict`` so the
    mistake is visible. When the loser recorded first (it found the change the other had made
    but not yet recorded), the ``applied`` replaces its ``already_satisfied``, and its stream
    entry says so.
    """
    won = store.outcomes.record(d, outcome.outcome, outcome.reason, now_ms)
    if won:
        return Outcome(
            d.id, CONFLICT, f"raced with another controller, which recorded {won}; "
            f"this one found {outcome.outcome} {outcome.reason}".rstrip()
        )  # fmt: skip
    return outcome


def _report_duplicate(store: DecisionStore, d: Decision, outcome: Outcome, now_ms: int) -> None:
    """Stream (never hash) a duplicate, so a replay or a second controller shows in the tail."""
    store.outcomes.stream_only(d, outcome.outcome, outcome.reason, now_ms)


STALE_TERM = "refused: stale decider term"
"""How the reason of a decision refused for its decider term starts."""


class TermGate(Protocol):
    """The decider-term check (``metadata_store.decider_lease.DeciderLease.admit``): None when
    a decision of ``term`` may be applied (recording the term when ``record``), else the newer
    term that makes it stale."""

    def admit(self, term: int, *, record: bool = True) -> int | None: ...


UNLOAD_TIMED_OUT = "unload timed out"
"""How the reason of an unload or transfer given up by ``namespaceBundleUnloadingTimeoutMs``
starts."""


def apply_decision(
    store: DecisionStore,
    d: Decision,
    *,
    now_ms: int,
    lease_ttl_ms: int,
    dry_run: bool = False,
    keep_split_children: bool = False,
    unload_timeout_ms: int | None = None,
    terms: TermGate | None = None,
) -> Outcome:
    """Apply one decision and record its outcome (see the module docstring); with ``terms``,
    a decision of a stale decider term is refused first."""
    previous = outcome_of(store, d.id)
    if previous is not None and previous.outcome not in (DRY_RUN, CONFLICT):
        duplicate = Outcome(d.id, DUPLICATE, f"already {previous.outcome}")
        _report_duplicate(store, d, duplicate, now_ms)
        return duplicate
    newer = None if terms is None else terms.admit(d.term, record=not dry_run)
    if newer is not None:
        refusal = f"{STALE_TERM} {d.term} < {newer}"
        if dry_run:  # a dry run's outcome never takes the hash from the real one
            return _record(store, d, Outcome(d.id, DRY_RUN, f"would be {refusal}"), now_ms)
        return _record(store, d, Outcome(d.id, REJECTED, refusal), now_ms)
    try:
        timed_out = _unload_timed_out(d, now_ms, unload_timeout_ms)
        if timed_out is not None:
            outcome = timed_out
        elif d.kind == SPLIT and keep_split_children and not dry_run:
            outcome = _apply_split_keeping_children(store, d, now_ms, lease_ttl_ms)
        else:
            outcome = _apply(store, d, now_ms, lease_ttl_ms, dry_run)
    except Conflict as e:
        outcome = Outcome(d.id, CONFLICT, str(e))
    except BrokerNotAlive as e:
        outcome = Outcome(d.id, REJECTED, f"broker gone: {e.reason}")
    except InvalidInput as e:
        outcome = Outcome(d.id, REJECTED, str(e))
    if outcome.outcome == APPLIED:
        fault_point(f"after-{d.kind}-script")
    recorded = _record(store, d, outcome, now_ms)
    fault_point("after-outcome")
    return recorded


def _unload_timed_out(d: Decision, now_ms: int, timeout_ms: int | None) -> Outcome | None:
    """A ``rejected`` outcome when an unload or transfer waited longer than ``timeout_ms``
    since it was decided (``namespaceBundleUnloadingTimeoutMs``); None otherwise."""
    if timeout_ms is None or d.kind not in (UNLOAD, TRANSFER) or d.decided_at_ms <= 0:
        return None
    held_ms = now_ms - d.decided_at_ms
    if held_ms <= timeout_ms:
        return None
    return Outcome(
        d.id,
        REJECTED,
        f"{UNLOAD_TIMED_OUT}: decided {held_ms} ms ago, over namespaceBundleUnloadingTimeoutMs "
        f"{timeout_ms}; the bundle stays with its owner",
    )


def _apply_split_keeping_children(
    store: DecisionStore, d: Decision, now_ms: int, ttl_ms: int
) -> Outcome:
    """A split whose children stay with the parent's owner
    (``loadBalancerAutoUnloadSplitBundlesEnabled=false``): split, then lease each child to
    that broker; a child placed meanwhile, or an owner gone, is left as it is."""
    before = store.owner(d.bundle, now_ms)
    outcome = _apply(store, d, now_ms, ttl_ms, False)
    if outcome.outcome != APPLIED or before is None:
        return outcome
    r = parse_bundle(d.bundle)
    points = [r.lower, *sorted(set(d.split_boundaries)), r.upper]
    kept = 0
    for lower, upper in itertools.pairwise(points):
        try:
            store.acquire(BundleRange(r.namespace, lower, upper), before.broker, now_ms, ttl_ms)
        except (Conflict, BrokerNotAlive, InvalidInput):
            continue  # placed meanwhile, the owner is gone, or split again meanwhile
        kept += 1
    return Outcome(d.id, APPLIED, f"{kept} of {len(points) - 1} children kept by {before.broker}")


def _apply(store: DecisionStore, d: Decision, now_ms: int, ttl_ms: int, dry_run: bool) -> Outcome:
    r = parse_bundle(d.bundle)
    nb = store.get_namespace(r.namespace)
    if nb is None:
        return Outcome(d.id, REJECTED, f"unknown namespace {r.namespace}")

    if d.kind == SPLIT:
        return _apply_split(store, d, r, nb, dry_run)
    if d.kind == MERGE:
        return _apply_merge(store, d, r, nb, now_ms, dry_run)

    if not nb.contains(r):
        return Outcome(d.id, REJECTED, f"bundle gone: {d.bundle} is no longer current")
    lease = store.owner(d.bundle, now_ms)
    if d.kind == UNLOAD:
        if lease is None:
            return Outcome(d.id, ALREADY_SATISFIED, "the bundle is not owned")
        if d.source_broker and lease.broker != d.source_broker:
            return Outcome(d.id, REJECTED, f"owner changed: now {lease.broker}")
        if dry_run:
            return Outcome(d.id, DRY_RUN, f"would release from {lease.broker}")
        if not store.release(d.bundle, lease.broker, lease.token, now_ms):
            raise Conflict(f"{d.bundle}: lease changed while releasing")
        return Outcome(d.id, APPLIED)

    if d.kind == TRANSFER:
        dest = d.destination_broker or ""
        if lease is not None and lease.broker == dest:
            return Outcome(d.id, ALREADY_SATISFIED, f"already owned by {dest}")
        if lease is not None and d.source_broker and lease.broker != d.source_broker:
            return Outcome(d.id, REJECTED, f"owner changed: now {lease.broker}")
        if dest not in store.live_brokers(now_ms):
            return Outcome(d.id, REJECTED, f"broker gone: {dest} is not live")
        if dry_run:
            return Outcome(d.id, DRY_RUN, f"would move to {dest}")
        if lease is None:
            store.acquire(d.bundle, dest, now_ms, ttl_ms)
        else:
            store.transfer(d.bundle, lease.broker, lease.token, dest, now_ms, ttl_ms)
        return Outcome(d.id, APPLIED)

    return Outcome(d.id, REJECTED, f"unknown decision kind {d.kind}")


def _apply_split(
    store: DecisionStore, d: Decision, r: BundleRange, nb: NamespaceBundles, dry_run: bool
) -> Outcome:
    """Split at the decision's boundaries, guarded by the namespace version."""
    if not nb.contains(r):
        pieces = {r.lower, r.upper, *d.split_boundaries}
        if pieces <= set(nb.boundaries):
            return Outcome(d.id, ALREADY_SATISFIED, "the split already happened")
        return Outcome(d.id, REJECTED, f"bundle gone: {d.bundle} is no longer current")
    if dry_run:
        return Outcome(d.id, DRY_RUN, f"would split at {len(d.split_boundaries)} points")
    store.split_bundle(d.bundle, d.split_boundaries, expected_version=nb.version)
    return Outcome(d.id, APPLIED)


def _apply_merge(
    store: DecisionStore,
    d: Decision,
    r: BundleRange,
    nb: NamespaceBundles,
    now_ms: int,
    dry_run: bool,
) -> Outcome:
    """Merge two adjacent bundles with one owner (or none), guarded by the namespace version."""
    other = parse_bundle(d.merge_bundle or "")
    lo, hi = min(r.lower, other.lower), max(r.upper, other.upper)
    if not (nb.contains(r) and nb.contains(other)):
        merged = f"{r.namespace}/0x{lo:08x}_0x{hi:08x}"
        if nb.contains(merged):
            return Outcome(d.id, ALREADY_SATISFIED, "the merge already happened")
        return Outcome(d.id, REJECTED, "bundle gone: a merged bundle is no longer current")
    owners = {
        x.broker if x else None
        for x in (store.owner(d.bundle, now_ms), store.owner(other.name, now_ms))
    }
    if len(owners) > 1:
        return Outcome(d.id, REJECTED, "owner changed: the bundles have different owners")
    if dry_run:
        return Outcome(d.id, DRY_RUN, "would merge")
    store.merge_bundles(d.bundle, other.name, expected_version=nb.version)
    return Outcome(d.id, APPLIED)


def apply_knobs(config: LoadBalancerConfig | None) -> dict[str, Any]:
    """The ``apply_decision`` arguments the configuration sets
    (``loadBalancerAutoUnloadSplitBundlesEnabled``, ``namespaceBundleUnloadingTimeoutMs``);
    none without one (Pulsar's defaults, no timeout)."""
    if config is None:
        return {}
    return {
        "keep_split_children": not config.load_balancer_auto_unload_split_bundles_enabled,
        "unload_timeout_ms": config.namespace_bundle_unloading_timeout_ms,
    }
