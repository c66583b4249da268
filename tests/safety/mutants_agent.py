"""Mutants of the broker side and of the clock: the agent's lease keeper and Redis's time.

Why: the store judges leases by Redis's clock (``TIME`` inside each script), and a broker keeps
its leases by renewing them. A clock that drops the milliseconds of ``TIME`` grants every
lease up to 999 ms shorter in real time than its TTL, and a keeper that renews the wrong leases
or dies when Redis is away breaks what the broker may believe. Caller-clock tests cannot see a
broken server clock: its killers are the real-time serving check
(``tests/reliability/test_realtime_serving.py``: a broker renews 0.9 s into a second of Redis's
clock and is cut off, another takes the bundle as soon as the store lets it, and the checker
finds both serving at once if the lease lapsed early) and ``tests/safety/test_clock_guards.py``,
which reads Redis's own ``TIME`` around each grant and read.
"""

from __future__ import annotations

from tests.safety.mutant import Mutant

AGENT = "producers/agent.py"
SERVING = "loadbalance/serving.py"
REDIS = "metadata_store/ownership_redis.py"

T_AGENT = "tests/integration/test_agent_redis.py"
T_RESILIENCE = "tests/unit/test_agent_resilience.py"
T_SERVING = "tests/unit/test_serving.py"
T_SERVING_AGENT = "tests/unit/test_serving_agent.py"
T_HANDOVER = "tests/unit/test_serving_handover.py"
REALTIME = (
    "tests/reliability/test_realtime_serving.py::"
    "test_a_lease_the_store_ends_early_is_caught_in_real_time"
)
GUARDS = "tests/safety/test_guards.py"
AGENT_GUARDS = "tests/safety/test_agent_guards.py"
CLOCK_GUARDS = "tests/safety/test_clock_guards.py"
KEEPS = f"{T_AGENT}::test_agent_heartbeats_and_renews_only_the_leases_it_holds"


def _a(test: str) -> str:
    return f"{AGENT_GUARDS}::{test}"


def _k(test: str) -> str:
    return f"{CLOCK_GUARDS}::{test}"


KEEPER_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "agent.keeper.own_only",
        "the keeper renews only leases its broker holds, never another broker's",
        AGENT,
        "if lease is not None and lease.broker == self.broker_id:",
        "if lease is not None:",
        (),
        (_a("test_the_keeper_renews_only_what_its_broker_holds"),),
    ),
    Mutant(
        "agent.keeper.token",
        "the keeper renews with the token the store holds the lease by",
        AGENT,
        "held[b] = lease.token",
        "held[b] = lease.token - 1",
        (KEEPS,),
        (),
    ),
    Mutant(
        "agent.keeper.register",
        "every check heartbeats the broker's registration before renewing",
        AGENT,
        "        self.store.register_broker(self.broker_id, now_ms, self.registration_ttl_ms, "
        "self.info)\n",
        "",
        (KEEPS,),
        (),
    ),
    Mutant(
        "agent.keeper.lease_ttl",
        "renewals extend by the lease TTL, not the registration TTL",
        AGENT,
        "self.lease_ttl_ms = lease_ttl_ms",
        "self.lease_ttl_ms = registration_ttl_ms",
        (),
        (_a("test_the_keeper_renews_only_what_its_broker_holds"),),
    ),
    Mutant(
        "agent.unreachable.lapse",
        "an unreachable broker (provider Transient) renews nothing, so its leases lapse",
        AGENT,
        '            log.warning("bundle stats unreachable, skipping this check: %s", e)\n',
        '            log.warning("bundle stats unreachable, skipping this check: %s", e)\n'
        "            kept = self.last_good_stats.bundles if self.last_good_stats else ()\n"
        "            self._keep_leases(kept, now_ms)\n",
        (f"{T_RESILIENCE}::test_a_garbage_provider_never_stops_heartbeats_and_lease_renewal",),
        (),
    ),
    Mutant(
        "agent.renew_failure.survives",
        "a failed heartbeat/renewal (Redis away) is counted and retried, not fatal",
        AGENT,
        '            metrics.LEASE_RENEWALS.labels(result="failed").inc()\n            return\n',
        '            metrics.LEASE_RENEWALS.labels(result="failed").inc()\n            raise\n',
        (),
        (_a("test_a_failed_renewal_is_counted_and_the_agent_keeps_reporting"),),
    ),
)

SERVING_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "serving.t0.reply",
        "serve-until counts from the renewal's send time t0, not from its reply",
        SERVING,
        "until = self.rule.serve_until(requested_at)",
        "until = self.rule.serve_until(replied_at)",
        (
            f"{T_SERVING}::test_a_bundle_is_served_from_the_reply_until_the_deadline_of_the_send_time",
        ),
        (),
    ),
    Mutant(
        "agent.serving.t0.reply",
        "the keeper stamps t0 before sending the renewal (not with the reply's time)",
        AGENT,
        "table.renewed(b, held[b], requested_at, replied_at",
        "table.renewed(b, held[b], replied_at, replied_at",
        (
            f"{T_SERVING_AGENT}::test_the_deadline_counts_from_when_the_renewal_was_sent_not_answered",
        ),
        (_a("test_the_keeper_serves_from_the_reply_until_the_deadline_of_the_send_time"),),
    ),
    Mutant(
        "serving.drift_factor",
        "serve-until shortens the TTL by the drift bound: ttl * (1 - rho)",
        SERVING,
        "return requested_at + self.ttl_s * (1.0 - self.drift_bound) - self.stop_margin_s",
        "return requested_at + self.ttl_s - self.stop_margin_s",
        (
            f"{T_SERVING}::test_serve_until_is_the_send_time_plus_the_shortened_ttl_minus_the_margin",
        ),
        (),
    ),
    Mutant(
        "serving.stop_margin",
        "serve-until leaves the stop margin before the lease can lapse",
        SERVING,
        "return requested_at + self.ttl_s * (1.0 - self.drift_bound) - self.stop_margin_s",
        "return requested_at + self.ttl_s * (1.0 - self.drift_bound)",
        (
            f"{T_SERVING}::test_serve_until_is_the_send_time_plus_the_shortened_ttl_minus_the_margin",
        ),
        (),
    ),
    Mutant(
        "serving.handover_wait",
        "a lease granted with a handover wait is served only after the stretched wait + margin",
        SERVING,
        "return replied_at + wait_s * (1.0 + 2.0 * self.drift_bound) + self.stop_margin_s",
        "return replied_at",
        (f"{T_HANDOVER}::test_serve_from_is_the_reply_plus_the_stretched_wait_plus_the_margin",),
        (),
    ),
    Mutant(
        "serving.deadline",
        "a bundle is served only until its serve-until (no renewal: the broker stops)",
        SERVING,
        "cur.start <= now < cur.until",
        "cur.start <= now",
        (
            f"{T_SERVING}::test_a_bundle_is_served_from_the_reply_until_the_deadline_of_the_send_time",
        ),
        (),
    ),
    Mutant(
        "serving.late_reply",
        "a renewal whose reply came after its own deadline serves nothing",
        SERVING,
        "if until > replied_at and until > start:",
        "if True:",
        (f"{T_SERVING}::test_a_reply_after_its_own_deadline_serves_nothing",),
        (),
    ),
    Mutant(
        "agent.serving.refused_stops",
        "a renewal the store refuses stops serving the bundle at once",
        AGENT,
        "table.lost(b, replied_at)",
        "pass",
        (f"{T_SERVING_AGENT}::test_a_refused_renewal_or_another_owner_stops_serving_at_once",),
        (_a("test_a_refused_renewal_stops_serving_at_once"),),
    ),
    Mutant(
        "agent.serving.not_held_stops",
        "a bundle the store gives to another broker stops being served at the next check",
        AGENT,
        "if b not in held:  # another owner",
        "if False:  # another owner",
        (f"{T_SERVING_AGENT}::test_a_refused_renewal_or_another_owner_stops_serving_at_once",),
        (_a("test_a_bundle_moved_away_stops_being_served_at_the_next_check"),),
    ),
)

CLOCK_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "clock.lua.truncate_ms",
        "Lua clock() keeps the milliseconds of TIME (truncated: leases lapse <= 999 ms early)",
        REDIS,
        "    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n",
        "    return tonumber(t[1]) * 1000\n",
        (REALTIME,),
        (_k("test_a_server_clock_grant_lasts_its_ttl_from_the_redis_time_it_was_sent"),),
    ),
    Mutant(
        "clock.lua.seconds",
        "Lua clock() is in milliseconds (seconds only: every TTL judged 1000 times too long)",
        REDIS,
        "    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n",
        "    return tonumber(t[1])\n",
        (REALTIME,),
        (_k("test_a_server_clock_grant_lasts_its_ttl_from_the_redis_time_it_was_sent"),),
    ),
    Mutant(
        "clock.read.truncate_ms",
        "reads judge leases at the full TIME (truncated: expired leases read live <= 999 ms)",
        REDIS,
        "return int(seconds) * 1000 + int(micros) // 1000",
        "return int(seconds) * 1000",
        (),
        (_k("test_a_server_clock_read_sees_a_lease_expire_at_its_expiry"),),
    ),
    Mutant(
        "clock.acquire.ttl_off_by_one",
        "an acquired lease expires at now + ttl (one millisecond short)",
        REDIS,
        "local exp = now + tonumber(ARGV[5])",
        "local exp = now + tonumber(ARGV[5]) - 1",
        (f"{GUARDS}::test_acquire_never_takes_over_a_live_lease[redis]",),
        (),
    ),
    Mutant(
        "clock.renew.ttl_off_by_one",
        "a renewed lease expires at now + ttl (one millisecond short)",
        REDIS,
        "local exp = now + tonumber(ARGV[3])\nlocal out = {now, exp}",
        "local exp = now + tonumber(ARGV[3]) - 1\nlocal out = {now, exp}",
        (KEEPS,),
        (),
    ),
    Mutant(
        "clock.transfer.ttl_off_by_one",
        "a transferred lease expires at now + ttl (one millisecond short)",
        REDIS,
        "local exp = now + tonumber(ARGV[6])",
        "local exp = now + tonumber(ARGV[6]) - 1",
        (),
        (_k("test_every_grant_expires_exactly_its_ttl_after_the_script_ran"),),
    ),
    Mutant(
        "clock.register.ttl_off_by_one",
        "a registration expires at now + ttl (one millisecond short)",
        REDIS,
        "'expires', now + tonumber(ARGV[2])",
        "'expires', now + tonumber(ARGV[2]) - 1",
        (f"{GUARDS}::test_acquire_needs_a_live_registration[redis]",),
        (),
    ),
    Mutant(
        "clock.acquire.expiry_inclusive",
        "a lease is expired at its expiry instant (>= instead of >: held one ms too long)",
        REDIS,
        "if cur[1] and tonumber(cur[3]) > now then\n  return {0, cur[1]",
        "if cur[1] and tonumber(cur[3]) >= now then\n  return {0, cur[1]",
        (f"{GUARDS}::test_acquire_never_takes_over_a_live_lease[redis]",),
        (),
    ),
)

AGENT_MUTANTS: tuple[Mutant, ...] = KEEPER_MUTANTS + SERVING_MUTANTS + CLOCK_MUTANTS
