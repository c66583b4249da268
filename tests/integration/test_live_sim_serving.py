"""The live simulator's brokers obey the agent's serve-until rule, and what they served checks.

A broker that crashes stops renewing; by its own clock it may serve each bundle only until
``t0 + ttl * (1 - leaseClockDriftBound) - leaseStopMarginMs``, and the bundles it held are looked
up on other brokers only after their leases expired in Redis. The simulator records every
broker's serving intervals; ``loadbalance.serving_checker`` must find no two brokers serving
one range at once. Leases and serving both follow the test's fake wall clock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis

from controller.placement import put_load_snapshot
from loadbalance.lease_checker import Violation
from loadbalance.report_codec import report_to_dict
from loadbalance.serving import ServingRule
from loadbalance.serving_checker import ClockBound, check_serving
from tests.integration.test_live_sim import (
    NS,
    WALL_STEP_MS,
    FakeClock,
    load,
    make_sim,
    play,
)

VICTIM = "broker-01"
CRASH = [{"at_cycle": 1, "kind": "crash", "names": [VICTIM]}]


def _crash_run(
    redis_url: str, kafka_bootstrap: str, topic: str, prefix: str, rule: ServingRule | None
) -> tuple[Any, set[str], list[Violation]]:
    scenario = load(5, CRASH)
    clock = FakeClock()
    sim = make_sim(scenario, redis_url, kafka_bootstrap, topic, prefix, 5, clock)
    if rule is not None:
        sim.serving_rule = rule
    sim.setup()
    held = {b for b, lease in sim.store.owners(NS, clock()).items() if lease.broker == VICTIM}
    play(sim, clock, range(5))  # 10 s per cycle, 30 s TTL: the victim's leases expired
    # with a load snapshot (the streaming job's) the lookups place the freed bundles again
    reports = sim.last.reports if sim.last else {}
    snapshot = {b: {"report": report_to_dict(r), "updatedAtMs": 0} for b, r in reports.items()}
    put_load_snapshot(sim.store, snapshot, {})
    play(sim, clock, range(5, 7))
    sim.publisher.close()
    clocks = {b: ClockBound.skewed(0.0, 1.0) for b in scenario.initial_brokers}
    return sim, held, check_serving(sim.serving_intervals(), clocks)


def test_a_crashed_brokers_bundles_are_served_elsewhere_only_after_it_stopped(
    redis_url: str, kafka_bootstrap: str, unique_topic: Callable[..., str], fresh_redis: redis.Redis
) -> None:
    sim, held, found = _crash_run(
        redis_url, kafka_bootstrap, unique_topic(prefix="serve"), "srv", None
    )
    assert held, "the victim held bundles before it crashed"
    assert found == [], "\n".join(v.message for v in found)
    intervals = sim.serving_intervals()
    victim_end = max(i.end for i in intervals if i.broker == VICTIM)
    taken = [i for i in intervals if i.bundle in held and i.broker != VICTIM]
    assert taken, "the victim's bundles were served elsewhere after the crash"
    assert min(i.start for i in taken) >= victim_end
    assert sim.last is not None and all(o != VICTIM for o in sim.last.owners.values())


def test_a_broker_that_ignored_its_deadline_would_be_caught(
    redis_url: str, kafka_bootstrap: str, unique_topic: Callable[..., str], fresh_redis: redis.Redis
) -> None:
    never = ServingRule(ttl_s=1e6, drift_bound=0.0, stop_margin_s=0.0)
    _, held, found = _crash_run(
        redis_url, kafka_bootstrap, unique_topic(prefix="serve"), "srv2", never
    )
    assert held
    assert {v.kind for v in found} == {"real_time_overlap"}


def test_a_transfer_hands_over_in_the_next_cycle_and_never_serves_twice(
    redis_url: str, kafka_bootstrap: str, unique_topic: Callable[..., str], fresh_redis: redis.Redis
) -> None:
    """The controller moves a live lease while its holder serves: the old holder stops and
    acknowledges in the next cycle, and the new one serves from that cycle on (not after the
    old lease's 30 s, three cycles), never at the same time."""
    scenario = load(3)
    clock = FakeClock()
    sim = make_sim(scenario, redis_url, kafka_bootstrap, unique_topic(prefix="ho"), "ho", 3, clock)
    sim.setup()
    play(sim, clock, range(1))
    for bundle, lease in sorted(sim.store.owners(NS, clock()).items()):
        dest = next(b for b in sorted(scenario.initial_brokers, reverse=True) if b != lease.broker)
        moved = sim.store.transfer(bundle, lease.broker, lease.token, dest, clock(), 30_000)
        assert moved.wait_ms > 0  # the old holder still serves
    moved_at = clock() / 1000.0
    play(sim, clock, range(1, 3))
    sim.publisher.close()
    clocks = {b: ClockBound.skewed(0.0, 1.0) for b in scenario.initial_brokers}
    found = check_serving(sim.serving_intervals(), clocks)
    assert found == [], "\n".join(v.message for v in found)
    late = [i for i in sim.serving_intervals() if i.start >= moved_at]
    assert late and max(i.start for i in late) < moved_at + WALL_STEP_MS / 1000.0
    assert sim.last is not None and len(sim.last.owners) == len(late)
