"""Named mutants of the ownership guards: each one breaks exactly one guard on purpose.

Why: a safety test proves something only if it fails when the guard it protects is gone. Each
mutant (``tests.safety.mutant.Mutant``) is an exact-text replacement (file, a snippet that must
occur exactly once, its replacement) that removes or weakens one guard. This module holds the
store's: ``metadata_store.ownership_redis`` (the Lua scripts and their Python pre-checks),
``metadata_store.ownership_memory``, ``metadata_store.recovery_state`` (the fence floor) and
``controller.recovery``; ``tests.safety.mutants_controller`` the applier's pre-checks and the
placement's guards; ``tests.safety.mutants_agent`` the agent's lease keeper and the clock.
``MUTANTS`` is all of them. ``tests.safety.run_mutants`` applies each one to a copy of the
repository and runs the tests named for it; a mutant that no test kills is a guard nothing
protects.

The snippets are checked before anything runs: a snippet that no longer occurs, or occurs
twice, raises ``MutantRot`` naming the mutant, so the table cannot silently stop testing a
guard when the code around it changes. Fix the snippet (keep it breaking the same guard) and
run the harness again.

``tests`` names the existing tests expected to kill the mutant, ``guard_tests`` a test written
for the guard (``tests/safety/test_*guards.py``); a run executes ``run_ids()`` (existing tests
first, so the table credits them, then the guard's own test as a second line of defence), and
``run_mutants --guard-tests`` runs ``guard_tests`` alone to prove each one kills its mutant
without help.
"""

from __future__ import annotations

from pathlib import Path

from tests.safety.mutant import Mutant, MutantRot
from tests.safety.mutants_agent import AGENT_MUTANTS
from tests.safety.mutants_controller import CONTROLLER_MUTANTS

REDIS = "metadata_store/ownership_redis.py"
MEMORY = "metadata_store/ownership_memory.py"
RECOVERY = "controller/recovery.py"
RECOVERY_STATE = "metadata_store/recovery_state.py"

CONTRACT = "tests/integration/test_store_contract.py"
GUARDS = "tests/safety/test_guards.py"


def _c(test: str) -> tuple[str, str]:
    """A contract test run against both stores (redis first)."""
    return f"{CONTRACT}::{test}[redis]", f"{CONTRACT}::{test}[memory]"


def _g(test: str) -> str:
    return f"{GUARDS}::{test}"


STORE_MUTANTS: tuple[Mutant, ...] = (
    # -- acquire ---------------------------------------------------------------------------
    Mutant(
        "redis.acquire.live_lease",
        "acquire refuses a bundle whose lease is live (Lua): takes over live leases",
        REDIS,
        "if cur[1] and tonumber(cur[3]) > now then\n  return {0, cur[1]",
        "if false then\n  return {0, cur[1]",
        (_c("test_acquire_needs_a_live_broker_and_a_free_current_bundle")[0],),
        (_g("test_acquire_never_takes_over_a_live_lease[redis]"),),
    ),
    Mutant(
        "memory.acquire.live_lease",
        "acquire refuses a bundle whose lease is live (MemoryStore)",
        MEMORY,
        "cur = self._live_lease(bundle, now_ms)\n            if cur is not None:\n"
        '                raise Conflict(f"{bundle} is owned by',
        "cur = self._live_lease(bundle, now_ms)\n            if False:\n"
        '                raise Conflict(f"{bundle} is owned by',
        (_c("test_acquire_needs_a_live_broker_and_a_free_current_bundle")[1],),
        (_g("test_acquire_never_takes_over_a_live_lease[memory]"),),
    ),
    Mutant(
        "redis.acquire.broker_alive",
        "acquire needs a registered, unexpired broker (Lua registry check)",
        REDIS,
        "local bexp = redis.call('HGET', KEYS[3], 'expires')\n"
        "if not bexp or tonumber(bexp) <= now then return {-2} end\n",
        "",
        (_c("test_acquire_needs_a_live_broker_and_a_free_current_bundle")[0],),
        (_g("test_acquire_needs_a_live_registration[redis]"),),
    ),
    Mutant(
        "memory.acquire.broker_alive",
        "acquire needs a registered, unexpired broker (MemoryStore)",
        MEMORY,
        "            if not self._alive(broker, now_ms):\n"
        '                raise BrokerNotAlive("broker", f"broker {broker} is not',
        "            if False:\n"
        '                raise BrokerNotAlive("broker", f"broker {broker} is not',
        (_c("test_acquire_needs_a_live_broker_and_a_free_current_bundle")[1],),
        (_g("test_acquire_needs_a_live_registration[memory]"),),
    ),
    Mutant(
        "redis.live_brokers.expiry",
        "the live-broker list leaves out expired registrations (Lua)",
        REDIS,
        "if e and tonumber(e) > now then table.insert(out, b) end",
        "if e then table.insert(out, b) end",
        (f"{CONTRACT}::test_broker_registry_is_judged_against_now[redis]",),
        (_g("test_acquire_needs_a_live_registration[redis]"),),
    ),
    Mutant(
        "redis.acquire.current_bundle",
        "acquire only takes a current bundle (Python pre-check nb.contains)",
        REDIS,
        "            if not nb.contains(r):\n"
        '                raise InvalidInput("bundle", f"{r.name} is not a current bundle',
        "            if False:\n"
        '                raise InvalidInput("bundle", f"{r.name} is not a current bundle',
        (_c("test_split_bumps_the_version_ends_the_parent_lease_and_is_compare_and_set")[0],),
        (_g("test_a_split_parent_cannot_be_acquired_over_its_children[redis]"),),
    ),
    # -- renew -----------------------------------------------------------------------------
    Mutant(
        "redis.renew.token",
        "renewal needs the holder's current fencing token (Lua)",
        REDIS,
        "if cur[1] == ARGV[1] and tonumber(cur[2]) == tonumber(ARGV[3 + i])\n     and",
        "if cur[1] == ARGV[1]\n     and",
        (_c("test_renew_all_renews_only_what_the_broker_still_holds")[0],),
        (_g("test_a_swept_token_is_never_renewed[redis]"),),
    ),
    Mutant(
        "memory.renew.token",
        "renewal needs the holder's current fencing token (MemoryStore)",
        MEMORY,
        "ok = cur is not None and cur.broker == broker and cur.token == leases[given]",
        "ok = cur is not None and cur.broker == broker",
        (_c("test_renew_all_renews_only_what_the_broker_still_holds")[1],),
        (_g("test_a_swept_token_is_never_renewed[memory]"),),
    ),
    Mutant(
        "redis.renew.expiry",
        "renewal refuses an expired lease (Lua): a lost lease stays lost",
        REDIS,
        "     and tonumber(cur[3]) > now then\n    redis.call('HSET', key, 'expires', exp)",
        "     then\n    redis.call('HSET', key, 'expires', exp)",
        (_c("test_renew_all_renews_only_what_the_broker_still_holds")[0],),
        (_g("test_an_expired_lease_is_not_revived_by_renewal[redis]"),),
    ),
    # -- sweep -----------------------------------------------------------------------------
    Mutant(
        "redis.sweep.expiry",
        "the sweep removes only leases expired when the script runs (Lua)",
        REDIS,
        "    elseif exp <= now then\n      local owned",
        "    elseif true then\n      local owned",
        (_c("test_expired_leases_are_swept_and_the_old_owner_is_fenced_out")[0],),
        (_g("test_the_sweep_keeps_live_and_just_renewed_leases[redis]"),),
    ),
    Mutant(
        "memory.sweep.expiry",
        "the sweep removes only expired leases (MemoryStore)",
        MEMORY,
        "x for x in self._leases.values() if x.expires_at_ms <= now_ms",
        "x for x in self._leases.values()",
        (_c("test_expired_leases_are_swept_and_the_old_owner_is_fenced_out")[1],),
        (_g("test_the_sweep_keeps_live_and_just_renewed_leases[memory]"),),
    ),
    # -- transfer --------------------------------------------------------------------------
    Mutant(
        "redis.transfer.fence",
        "transfer needs the source's current fencing token (Lua)",
        REDIS,
        "if cur[1] ~= ARGV[2] or tonumber(cur[2]) ~= tonumber(ARGV[3])\n   or",
        "if cur[1] ~= ARGV[2]\n   or",
        (_c("test_transfer_moves_a_live_lease_atomically_with_a_new_token")[0],),
        (_g("test_a_stale_token_cannot_move_a_lease[redis]"),),
    ),
    Mutant(
        "redis.transfer.source_live",
        "transfer moves only a live lease (Lua source-expiry check)",
        REDIS,
        "\n   or tonumber(cur[3]) <= now then return {0} end",
        " then return {0} end",
        (_c("test_transfer_moves_a_live_lease_atomically_with_a_new_token")[0],),
        (_g("test_an_expired_lease_cannot_be_moved[redis]"),),
    ),
    Mutant(
        "redis.transfer.dest_alive",
        "transfer needs a registered, unexpired destination (Lua)",
        REDIS,
        "local bexp = redis.call('HGET', KEYS[4], 'expires')\n"
        "if not bexp or tonumber(bexp) <= now then return {-2} end\n",
        "",
        (_c("test_transfer_moves_a_live_lease_atomically_with_a_new_token")[0],),
        (_g("test_a_lease_never_moves_to_an_expired_broker[redis]"),),
    ),
    Mutant(
        "memory.transfer.fence",
        "transfer needs the source's current fencing token (MemoryStore)",
        MEMORY,
        "if cur is None or cur.broker != from_broker or cur.token != token:\n"
        '                raise Conflict(f"{bundle}: {from_broker} with token',
        "if cur is None or cur.broker != from_broker:\n"
        '                raise Conflict(f"{bundle}: {from_broker} with token',
        (_c("test_transfer_moves_a_live_lease_atomically_with_a_new_token")[1],),
        (_g("test_a_stale_token_cannot_move_a_lease[memory]"),),
    ),
    # -- release ---------------------------------------------------------------------------
    Mutant(
        "redis.release.owner",
        "release only by the holder (Lua owner check)",
        REDIS,
        "if cur[1] ~= ARGV[2] or tonumber(cur[2]) ~= tonumber(ARGV[3]) then return {0} end",
        "if tonumber(cur[2]) ~= tonumber(ARGV[3]) then return {0} end",
        (_c("test_release_only_by_the_live_holder_with_its_token")[0],),
        (_g("test_release_needs_the_holder_and_its_token[redis]"),),
    ),
    Mutant(
        "redis.release.token",
        "release only with the holder's current token (Lua token check)",
        REDIS,
        "if cur[1] ~= ARGV[2] or tonumber(cur[2]) ~= tonumber(ARGV[3]) then return {0} end",
        "if cur[1] ~= ARGV[2] then return {0} end",
        (_c("test_release_only_by_the_live_holder_with_its_token")[0],),
        (_g("test_release_needs_the_holder_and_its_token[redis]"),),
    ),
    # -- split / merge ---------------------------------------------------------------------
    Mutant(
        "redis.reshape.version_cas",
        "split/merge script compares the namespace version it was computed from (Lua CAS)",
        REDIS,
        "if tonumber(v) ~= tonumber(ARGV[1]) then return {0, tonumber(v)} end\n",
        "",
        # test_redis_store's racing test kills it only when its threads happen to interleave
        # between a namespace read and the script; the guard test forces that interleaving
        (),
        (_g("test_a_split_computed_from_a_stale_version_never_overwrites_a_newer_one"),),
    ),
    Mutant(
        "redis.split.expected_version",
        "split with expected_version is a compare-and-set (RedisStore pre-check)",
        REDIS,
        "            if expected_version is not None and nb.version != expected_version:\n"
        '                raise Conflict(f"{r.namespace}: version is',
        '            if False:\n                raise Conflict(f"{r.namespace}: version is',
        (_c("test_split_bumps_the_version_ends_the_parent_lease_and_is_compare_and_set")[0],),
        (_g("test_a_split_with_a_stale_expected_version_changes_nothing[redis]"),),
    ),
    Mutant(
        "memory.reshape.version_cas",
        "split/merge with expected_version is a compare-and-set (MemoryStore)",
        MEMORY,
        "if expected_version is not None and nb.version != expected_version:",
        "if False:",
        (_c("test_split_bumps_the_version_ends_the_parent_lease_and_is_compare_and_set")[1],),
        (_g("test_a_split_with_a_stale_expected_version_changes_nothing[memory]"),),
    ),
    Mutant(
        "redis.reshape.end_leases",
        "split/merge ends the leases of the bundles that vanish (Lua DEL)",
        REDIS,
        "    redis.call('DEL', KEYS[i])\n    table.insert(out, i - 1)",
        "    table.insert(out, i - 1)",
        (_c("test_split_bumps_the_version_ends_the_parent_lease_and_is_compare_and_set")[0],),
        (_g("test_a_split_then_merge_never_revives_the_parents_lease[redis]"),),
    ),
    Mutant(
        "memory.reshape.end_leases",
        "split/merge ends the leases of the bundles that vanish (MemoryStore)",
        MEMORY,
        "lease = self._leases.pop(b.name, None)",
        "lease = self._leases.get(b.name)",
        (_c("test_split_bumps_the_version_ends_the_parent_lease_and_is_compare_and_set")[1],),
        (_g("test_a_split_then_merge_never_revives_the_parents_lease[memory]"),),
    ),
    # -- fencing counter -------------------------------------------------------------------
    Mutant(
        "redis.fence.acquire_get",
        "acquire takes its token from INCR of the fence counter (replaced by GET + 1)",
        REDIS,
        "local token = redis.call('INCR', KEYS[5])\nlocal exp = now + tonumber(ARGV[5])",
        "local token = tonumber(redis.call('GET', KEYS[5]) or '0') + 1\n"
        "local exp = now + tonumber(ARGV[5])",
        (_c("test_fencing_tokens_only_grow_across_bundles_and_owners")[0],),
        (_g("test_every_grant_gets_a_larger_token[redis]"),),
    ),
    Mutant(
        "redis.fence.transfer_constant",
        "transfer takes a new token from INCR (replaced by the source's token, a constant)",
        REDIS,
        "local token = redis.call('INCR', KEYS[5])\nlocal exp = now + tonumber(ARGV[6])",
        "local token = tonumber(ARGV[3])\nlocal exp = now + tonumber(ARGV[6])",
        (_c("test_transfer_moves_a_live_lease_atomically_with_a_new_token")[0],),
        (_g("test_every_grant_gets_a_larger_token[redis]"),),
    ),
    Mutant(
        "memory.fence.counter",
        "the MemoryStore fence counter grows with every grant",
        MEMORY,
        "self._fence += 1\n        return self._fence",
        "return self._fence + 1",
        (_c("test_fencing_tokens_only_grow_across_bundles_and_owners")[1],),
        (_g("test_every_grant_gets_a_larger_token[memory]"),),
    ),
    # -- one identity per bundle -----------------------------------------------------------
    Mutant(
        "redis.acquire.canonical_key",
        "acquire keys the lease by the canonical name, not the caller's spelling",
        REDIS,
        "                    self._lease(r),\n                    self._broker(broker),",
        '                    f"{self.p}:lease:{bundle if isinstance(bundle, str) else r.name}",\n'
        "                    self._broker(broker),",
        (),  # no existing test kills it
        (_g("test_two_spellings_of_one_bundle_are_one_lease[redis]"),),
    ),
    Mutant(
        "memory.acquire.canonical_key",
        "MemoryStore acquire keys the lease by the canonical name",
        MEMORY,
        "r = canonical_bundle(bundle)\n        bundle = r.name\n",
        "r = canonical_bundle(bundle)\n"
        "        bundle = bundle if isinstance(bundle, str) else r.name\n",
        (),  # no existing test kills it
        (_g("test_two_spellings_of_one_bundle_are_one_lease[memory]"),),
    ),
    # -- recovery --------------------------------------------------------------------------
    Mutant(
        "recovery.fence_floor",
        "recovery raises the fence counter to the token floor before granting",
        RECOVERY_STATE,
        "\"if tonumber(raw) < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end \"",
        "\"if false then redis.call('SET', KEYS[1], ARGV[1]) end \"",
        (),  # no existing test kills it
        (_g("test_recovery_grants_only_tokens_above_the_floor"),),
    ),
    Mutant(
        "recovery.trusted_floor",
        "the token floor is the largest trusted token on the events topic (not the smallest)",
        RECOVERY,
        "        if below is None or t - below <= MAX_TOKEN_GAP:\n"
        "            return t, sorted(ignored)",
        "        if below is None or t - below <= MAX_TOKEN_GAP:\n"
        "            return distinct[-1], sorted(ignored)",
        (
            "tests/unit/test_events.py::"
            "test_trusted_floor_ignores_a_token_far_above_the_others_and_keeps_dense_ones",
        ),
        (_g("test_the_trusted_floor_is_the_top_of_the_dense_tokens"),),
    ),
)

MUTANTS: tuple[Mutant, ...] = STORE_MUTANTS + CONTROLLER_MUTANTS + AGENT_MUTANTS
"""Every mutant the harness runs, in the order of the kill table."""


def by_name() -> dict[str, Mutant]:
    """The mutants by name; duplicate names are a broken table."""
    out: dict[str, Mutant] = {}
    for m in MUTANTS:
        if m.name in out:
            raise MutantRot(f"mutant name {m.name!r} is used twice")
        out[m.name] = m
    return out


def check_table(root: Path) -> None:
    """Raise ``MutantRot`` naming the first mutant whose snippet is missing or not unique in
    the files under ``root``, or that changes nothing."""
    by_name()
    for m in MUTANTS:
        if m.old == m.new:
            raise MutantRot(f"mutant {m.name!r} replaces its snippet with itself")
        count = m.count_in(root)
        if count != 1:
            raise m.rot(count)
