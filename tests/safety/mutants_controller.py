"""Mutants of the controller's guards: the applier's pre-checks, the placement's guards, the
sweep's order and the runner's classification of Redis faults.

Why: the store's scripts refuse most unsafe writes on their own, so a controller pre-check that
is gone often changes only the outcome the controller records (``rejected`` with its reason,
``already_satisfied``, ``conflict``), a dry run's answer, or a race the store cannot see (a
split computed from a namespace version that moved). Each mutant here removes one such check in
``controller/apply.py`` or ``controller/placement.py``; its killing tests assert that outcome,
that answer or that race (``tests/safety/test_controller_guards.py`` forces the races). The
hostile-decision oracle (``tests/fuzz/test_bad_decisions.py``, 1,500 stale decisions checked
against an outcome written from the documented rules) kills the applier's mutants too; it is
not in their lists because it takes tens of seconds.

The runner (``controller/loop.py``) holds a record it cannot apply and skips a sweep on any
fault; ``controller/redis_faults.py`` names which faults are passing ones (``READONLY``,
``OOM``, ``BUSY``, ``MASTERDOWN``, ``LOADING``, a dropped connection). Its mutants drop one
class from that set, or re-raise where the runner must hold on; the loop's are killed by the
running loop under a real ``READONLY`` (``tests/reliability/test_controller_ordinary_faults``).
The sweep's own check that a bundle is still current before placing it is not a mutant: the
store's acquire refuses a bundle that is not current with the same exception
(``redis.acquire.current_bundle``), so removing the sweep's copy alone changes nothing.
"""

from __future__ import annotations

from tests.safety.mutant import Mutant

APPLY = "controller/apply.py"
PLACEMENT = "controller/placement.py"
SWEEP = "controller/sweep.py"
FAULTS = "controller/redis_faults.py"
LOOP = "controller/loop.py"

T_APPLY = "tests/integration/test_apply.py"
T_DECIDER = "tests/integration/test_one_decider.py"
T_KNOBS = "tests/integration/test_apply_knobs.py"
T_ASSIGN = "tests/integration/test_assignment.py"
T_HERD = "tests/integration/test_placement_no_herding.py"
T_SWEEP = "tests/integration/test_sweep_faults.py"
T_FAULTS = "tests/unit/test_redis_faults.py"
T_ORDINARY = (
    "tests/reliability/test_controller_ordinary_faults.py::"
    "test_the_running_loop_survives_the_fault_and_loses_nothing"
)
GUARDS = "tests/safety/test_controller_guards.py"


def _g(test: str) -> str:
    return f"{GUARDS}::{test}"


APPLY_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "apply.replay.duplicate",
        "a decision whose id already has an outcome changes nothing (replay)",
        APPLY,
        "    if previous is not None and previous.outcome not in (DRY_RUN, CONFLICT):\n",
        "    if False:\n",
        (f"{T_APPLY}::test_transfer_then_same_decision_again_changes_nothing",),
        (),
    ),
    Mutant(
        "apply.decider_term",
        "a decision of a stale decider term is refused before anything is applied",
        APPLY,
        "    newer = None if terms is None else terms.admit(d.term, record=not dry_run)\n",
        "    newer = None\n",
        (f"{T_DECIDER}::test_a_decision_of_an_older_term_is_refused_and_recorded",),
        (),
    ),
    Mutant(
        "apply.bundle_gone",
        "an unload/transfer of a bundle that is no longer current is rejected",
        APPLY,
        "    if not nb.contains(r):\n"
        '        return Outcome(d.id, REJECTED, f"bundle gone: {d.bundle} is no longer current")\n'
        "    lease = store.owner(d.bundle, now_ms)",
        "    if False:\n"
        '        return Outcome(d.id, REJECTED, f"bundle gone: {d.bundle} is no longer current")\n'
        "    lease = store.owner(d.bundle, now_ms)",
        (f"{T_APPLY}::test_stale_decisions_are_rejected_with_a_reason",),
        (),
    ),
    Mutant(
        "apply.unload.owner",
        "an unload whose source no longer owns the bundle is rejected (owner mismatch)",
        APPLY,
        "        if d.source_broker and lease.broker != d.source_broker:\n"
        '            return Outcome(d.id, REJECTED, f"owner changed: now {lease.broker}")\n'
        "        if dry_run:\n"
        '            return Outcome(d.id, DRY_RUN, f"would release',
        "        if False:\n"
        '            return Outcome(d.id, REJECTED, f"owner changed: now {lease.broker}")\n'
        "        if dry_run:\n"
        '            return Outcome(d.id, DRY_RUN, f"would release',
        (f"{T_APPLY}::test_stale_decisions_are_rejected_with_a_reason",),
        (),
    ),
    Mutant(
        "apply.transfer.owner",
        "a transfer whose source no longer owns the bundle is rejected (owner mismatch)",
        APPLY,
        "        if lease is not None and d.source_broker and lease.broker != d.source_broker:\n",
        "        if False:\n",
        (),
        (_g("test_a_transfer_from_a_broker_that_lost_the_bundle_is_rejected"),),
    ),
    Mutant(
        "apply.transfer.dest_alive",
        "a transfer to a broker that is not live is rejected before any write or dry run",
        APPLY,
        "        if dest not in store.live_brokers(now_ms):\n",
        "        if False:\n",
        (),
        (_g("test_a_transfer_to_a_dead_broker_is_rejected_even_in_a_dry_run"),),
    ),
    Mutant(
        "apply.transfer.already_owned",
        "a transfer to the current owner is already satisfied (no new grant, no new token)",
        APPLY,
        "        if lease is not None and lease.broker == dest:\n",
        "        if False:\n",
        (),
        (_g("test_a_transfer_to_the_current_owner_grants_nothing"),),
    ),
    Mutant(
        "apply.split.current",
        "a split of a bundle that is no longer current is already satisfied or rejected",
        APPLY,
        "    if not nb.contains(r):\n        pieces = {r.lower, r.upper, *d.split_boundaries}",
        "    if False:\n        pieces = {r.lower, r.upper, *d.split_boundaries}",
        (f"{T_APPLY}::test_unload_split_and_merge_and_their_already_satisfied_forms",),
        (),
    ),
    Mutant(
        "apply.split.version",
        "a split is a compare-and-set on the namespace version the applier read",
        APPLY,
        "store.split_bundle(d.bundle, d.split_boundaries, expected_version=nb.version)",
        "store.split_bundle(d.bundle, d.split_boundaries)",
        (),
        (_g("test_a_reshape_computed_from_a_version_that_moved_is_a_conflict[split]"),),
    ),
    Mutant(
        "apply.merge.version",
        "a merge is a compare-and-set on the namespace version the applier read",
        APPLY,
        "store.merge_bundles(d.bundle, other.name, expected_version=nb.version)",
        "store.merge_bundles(d.bundle, other.name)",
        (),
        (_g("test_a_reshape_computed_from_a_version_that_moved_is_a_conflict[merge]"),),
    ),
    Mutant(
        "apply.merge.owners",
        "a merge of bundles with different owners is rejected",
        APPLY,
        "    if len(owners) > 1:\n",
        "    if False:\n",
        (),
        (_g("test_a_merge_of_differently_owned_bundles_is_rejected"),),
    ),
    Mutant(
        "apply.unload_timeout",
        "an unload/transfer held past namespaceBundleUnloadingTimeoutMs is given up",
        APPLY,
        "    if held_ms <= timeout_ms:\n        return None",
        "    if True:\n        return None",
        (f"{T_KNOBS}::test_an_unload_held_past_the_unloading_timeout_is_given_up_and_recorded",),
        (),
    ),
)

PLACEMENT_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "placement.live_brokers",
        "placement chooses only among live registered brokers (destination alive)",
        PLACEMENT,
        "snap = data.snapshot(now_ms, weights_from_config(config), brokers=live)",
        "snap = data.snapshot(now_ms, weights_from_config(config))",
        (f"{T_ASSIGN}::test_expired_leases_are_swept_and_reassigned_to_live_brokers",),
        (),
    ),
    Mutant(
        "placement.version_cas",
        "a placement takes its lease only if no placement was recorded since it counted",
        PLACEMENT,
        "placement_version=version,  # noqa: B023",
        "placement_version=store.preallocations.version(),  # noqa: B023",
        (f"{T_HERD}::test_a_placement_overtaken_by_another_counts_it_and_chooses_again",),
        (),
    ),
    Mutant(
        "placement.prealloc.own_lease",
        "a preallocation ends when its broker no longer holds the lease",
        PLACEMENT,
        "gone = {b for b in docs if b in bv.report.bundles or held.get(b) != broker}",
        "gone = {b for b in docs if b in bv.report.bundles}",
        (
            f"{T_HERD}::test_a_preallocation_outlives_another_brokers_stale_report_"
            "and_ends_with_its_lease",
        ),
        (),
    ),
)

SWEEP_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "sweep.expired.announced_first",
        "each batch's expired events are delivered before any placement (a fault loses none)",
        SWEEP,
        "        if publish is not None:\n            publish(batch)\n",
        "",
        (f"{T_SWEEP}::test_a_fault_after_the_sweep_script_loses_no_expiry_and_no_reassignment",),
        (),
    ),
    Mutant(
        "sweep.unplaced.kept",
        "a bundle whose destination lapsed before the acquire stays for the next sweep",
        SWEEP,
        "                view = None  # the live brokers changed: read them again\n",
        "                view = None  # the live brokers changed: read them again\n"
        "                del state.unplaced[bundle]\n",
        (),
        (_g("test_a_bundle_whose_destination_lapsed_is_placed_by_the_next_sweep"),),
    ),
)

FAULT_MUTANTS: tuple[Mutant, ...] = (
    *(
        Mutant(
            f"faults.{code.lower()}.transient",
            f"{code} replies are waited out as a passing fault (dropped from the transient set)",
            FAULTS,
            f'    "{code}",\n',
            "",
            (f"{T_FAULTS}::test_replies_that_mean_not_now_are_transient",),
            (),
        )
        for code in ("READONLY", "OOM", "BUSY", "MASTERDOWN", "LOADING")
    ),
    Mutant(
        "faults.connection.transient",
        "a dropped connection is waited out as a passing fault",
        FAULTS,
        '{"connection", "timeout", *(',
        '{"timeout", *(',
        (f"{T_FAULTS}::test_dropped_connections_and_timeouts_are_transient",),
        (),
    ),
    Mutant(
        "faults.script_wrapped",
        "a reply code wrapped in a script error (ERR ... -OOM ...) is still recognised",
        FAULTS,
        'if code == known or f"-{known} " in text:',
        "if code == known:",
        (f"{T_FAULTS}::test_replies_that_mean_not_now_are_transient",),
        (),
    ),
    Mutant(
        "loop.record_fault.held",
        "a fault while applying a record holds it and backs off (re-raised: the loop dies)",
        LOOP,
        '            self._fault(f"record {_where(msg)} held, read again in {delay:.1f} s", e)\n',
        '            self._fault(f"record {_where(msg)} held, read again in {delay:.1f} s", e)\n'
        "            raise\n",
        (f"{T_ORDINARY}[readonly]",),
        (),
    ),
    Mutant(
        "loop.sweep_fault.skipped",
        "a fault in the sweep skips it until the next one (re-raised: the loop dies)",
        LOOP,
        '            self._fault("sweep skipped", e)\n            return\n',
        '            self._fault("sweep skipped", e)\n            raise\n',
        (f"{T_ORDINARY}[readonly]",),
        (),
    ),
)

CONTROLLER_MUTANTS: tuple[Mutant, ...] = (
    APPLY_MUTANTS + PLACEMENT_MUTANTS + SWEEP_MUTANTS + FAULT_MUTANTS
)
