"""Live simulator against the embedded Kafka and Redis: same model as fast mode, closed loop.

The simulator is driven cycle by cycle with a fake wall clock (leases and registrations in
Redis are judged against it), so lease expiry needs no sleeping; the reports are read back from
Kafka and decoded, never taken from the simulator's memory.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from prometheus_client import REGISTRY

from controller.placement import put_load_snapshot
from infra import metrics
from loadbalance.model import LocalBrokerData
from loadbalance.report_codec import decode_report, report_to_dict
from metadata_store.ownership_redis import RedisStore
from producers import cli
from producers.fast_sim import make_config, simulate
from producers.live_sim import LiveSim, TimestampedReportPublisher
from producers.scenarios import Scenario, parse_scenario

pytestmark = pytest.mark.integration

START_MS = 1_700_000_000_000
WALL_START_MS = 5_000_000
WALL_STEP_MS = 10_000  # fake wall time per cycle; the lease TTL is 30 s (3 cycles)
NS = "public/live"


def scenario_doc(events: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A small world that still exercises every random draw: a random initial assignment,
    per-tick noise, a diurnal wave and bursts."""
    return {
        "name": "live-test",
        "cycles": 20,
        "brokers": [{"prefix": "broker", "count": 3, "cores": 8, "nic_gbps": 10}],
        "namespaces": [
            {
                "name": NS,
                "bundles": 8,
                "topics": 60,
                "rate_in_per_s": 30000,
                "noise": 0.05,
                "zipf_exponent": 0.6,
                "pattern": "diurnal",
                "diurnal_amplitude": 0.3,
                "diurnal_period_minutes": 10,
            }
        ],
        "bursts": {"per_hour": 30, "duration_minutes": 2, "factor": 3},
        "initial_assignment": "random",
        "events": events or [],
    }


def load(seed: int, events: list[dict[str, Any]] | None = None) -> Scenario:
    return parse_scenario(scenario_doc(events), random.Random(seed))


class FakeClock:
    def __init__(self) -> None:
        self.now_ms = WALL_START_MS

    def __call__(self) -> int:
        return self.now_ms


def make_sim(
    scenario: Scenario,
    redis_url: str,
    bootstrap: str,
    topic: str,
    prefix: str,
    seed: int,
    clock: FakeClock,
) -> LiveSim:
    store = RedisStore.from_url(redis_url, prefix=prefix, clock="caller")  # a fake wall clock
    publisher = TimestampedReportPublisher(bootstrap, topic)
    return LiveSim(
        scenario, make_config(scenario), store, publisher, seed=seed, start_ms=START_MS, clock=clock
    )


def play(sim: LiveSim, clock: FakeClock, cycles: range) -> None:
    for c in cycles:
        sim.tick(c)
        clock.now_ms += WALL_STEP_MS


def read_reports(bootstrap: str, topic: str, expected: int) -> list[tuple[int, str, Any]]:
    """(record timestamp, key, value) of the first ``expected`` records of partition 0."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "live-sim-test", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    out: list[tuple[int, str, Any]] = []
    try:
        deadline = time.monotonic() + 20
        while len(out) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                out.append((msg.timestamp()[1], msg.key().decode(), msg.value()))
    finally:
        consumer.close()
    assert len(out) == expected, f"read {len(out)} of {expected} records"
    return out


def decoded(records: list[tuple[int, str, Any]]) -> list[tuple[int, str, LocalBrokerData]]:
    return [(ts, key, decode_report(value, key)) for ts, key, value in records]


def cycle_of(ts: int, scenario: Scenario) -> int:
    assert (ts - START_MS) % scenario.tick_ms == 0, "timestamps sit on the virtual tick grid"
    return (ts - START_MS) // scenario.tick_ms


def test_live_reports_equal_the_fast_models_for_the_same_seed_and_ownership(
    redis_url: str, kafka_bootstrap: str, unique_topic: Callable[..., str], fresh_redis: redis.Redis
) -> None:
    seed, cycles = 7, 5
    scenario = load(seed)
    fast = simulate(scenario, seed=seed, cycles=cycles, keep_reports=True)
    assert not fast.decisions, "the fast run must keep its ownership for the comparison"
    topic = unique_topic(prefix="live-eq")
    clock = FakeClock()
    sim = make_sim(scenario, redis_url, kafka_bootstrap, topic, "eq", seed, clock)
    assert sim.setup() == 8  # every bundle acquired for its initial owner
    play(sim, clock, range(cycles))
    sim.publisher.close()

    records = decoded(read_reports(kafka_bootstrap, topic, cycles * 3))
    seen = set()
    for ts, key, report in records:
        c = cycle_of(ts, scenario)
        assert report.last_update_ms == ts  # lastUpdate is the record's virtual time
        expected = replace(fast.reports[c][key], last_update_ms=ts)
        assert report == expected, f"cycle {c} broker {key} differs from fast mode"
        seen.add((c, key))
    assert seen == {(c, b) for c in range(cycles) for b in scenario.initial_brokers}
    # traffic really changes cycle to cycle (noise, diurnal, bursts), so equality is not trivial
    rates = {r.msg_rate_in for _, k, r in records if k == "broker-00"}
    assert len(rates) == cycles


def test_a_transfer_in_redis_moves_the_bundle_in_the_next_reports(
    redis_url: str, kafka_bootstrap: str, unique_topic: Callable[..., str], fresh_redis: redis.Redis
) -> None:
    scenario = load(3)
    topic = unique_topic(prefix="live-loop")
    clock = FakeClock()
    sim = make_sim(scenario, redis_url, kafka_bootstrap, topic, "loop", 3, clock)
    sim.setup()
    play(sim, clock, range(1))
    store = sim.store
    leases = store.owners(NS, clock())
    bundle, lease = sorted(leases.items())[0]
    dest = next(b for b in scenario.initial_brokers if b != lease.broker)
    store.transfer(bundle, lease.broker, lease.token, dest, clock(), 30_000)
    transfer_expiry_ms = clock() + 30_000
    assert sim.tick(1).moved == 1  # the simulator saw the owner change in Redis
    clock.now_ms += WALL_STEP_MS
    play(sim, clock, range(2, 3))
    sim.publisher.close()

    by_cycle: dict[int, dict[str, LocalBrokerData]] = {}
    for ts, key, report in decoded(read_reports(kafka_bootstrap, topic, 9)):
        by_cycle.setdefault(cycle_of(ts, scenario), {})[key] = report
    before, after = by_cycle[0], by_cycle[1]
    assert bundle in before[lease.broker].bundles and bundle not in before[dest].bundles
    assert bundle in after[dest].bundles and bundle in after[dest].last_stats
    assert bundle not in after[lease.broker].bundles
    assert after[lease.broker].num_bundles == before[lease.broker].num_bundles - 1
    # the new owner renews the moved lease (with its new token) past the transfer's expiry
    assert store.owner(bundle, transfer_expiry_ms).broker == dest


def test_a_crashed_broker_stops_reporting_and_renewing_and_its_leases_expire(
    redis_url: str, kafka_bootstrap: str, unique_topic: Callable[..., str], fresh_redis: redis.Redis
) -> None:
    crash_at, victim = 2, "broker-01"
    scenario = load(5, [{"at_cycle": crash_at, "kind": "crash", "names": [victim]}])
    topic = unique_topic(prefix="live-crash")
    clock = FakeClock()
    sim = make_sim(scenario, redis_url, kafka_bootstrap, topic, "crash", 5, clock)
    sim.setup()
    store = sim.store
    held = sorted(b for b, le in store.owners(NS, clock()).items() if le.broker == victim)
    assert held, "the victim must own something for the test to mean anything"
    play(sim, clock, range(crash_at))
    last_renewal_ms = clock() - WALL_STEP_MS
    play(sim, clock, range(crash_at, crash_at + 3))  # 30 s of wall time without renewals
    now = clock()
    assert now >= last_renewal_ms + 30_000
    assert all(store.owner(b, now) is None for b in held), "the victim's leases expired"
    assert victim not in store.live_brokers(now), "its registration expired too"
    others = set(scenario.initial_brokers) - {victim}
    assert all(store.owner(b, now).broker in others for b in store.owners(NS, now))
    assert sorted(le.bundle for le in store.sweep_expired(now)) == held  # what the sweep frees

    # With a load snapshot in Redis (the streaming job's), the next lookups place the freed
    # bundles on live brokers and their reports carry them again.
    put_load_snapshot(
        store,
        {b: {"report": report_to_dict(r), "updatedAtMs": 0} for b, r in sim.last.reports.items()},
        {},
    )
    result = sim.tick(crash_at + 3)
    sim.publisher.close()
    assert result.assigned == len(held)
    assert result.owned == result.bundles == 8

    records = decoded(read_reports(kafka_bootstrap, topic, crash_at * 3 + 4 * 2))
    victim_cycles = sorted(cycle_of(ts, scenario) for ts, k, _ in records if k == victim)
    assert victim_cycles == list(range(crash_at)), "no report from the victim after its crash"
    last = {k: r for ts, k, r in records if cycle_of(ts, scenario) == crash_at + 3}
    assert set(last) == others
    assert set(held) <= set().union(*(r.bundles for r in last.values()))


def test_a_graceful_leave_releases_at_once_and_a_join_registers_and_reports(
    redis_url: str, kafka_bootstrap: str, unique_topic: Callable[..., str], fresh_redis: redis.Redis
) -> None:
    leaver = "broker-02"
    events = [
        {"at_cycle": 1, "kind": "remove_brokers", "names": [leaver]},
        {"at_cycle": 2, "kind": "add_brokers", "brokers": [{"prefix": "broker", "start": 3}]},
    ]
    scenario = load(9, events)
    topic = unique_topic(prefix="live-leave")
    clock = FakeClock()
    sim = make_sim(scenario, redis_url, kafka_bootstrap, topic, "leave", 9, clock)
    sim.setup()
    store = sim.store
    held = [b for b, le in store.owners(NS, clock()).items() if le.broker == leaver]
    assert held
    play(sim, clock, range(1))
    left = sim.tick(1)
    now = left.wall_ms
    assert left.events == (f"down:{leaver}",)
    assert all(store.owner(b, now) is None for b in held), "released, not left to expire"
    assert leaver not in store.live_brokers(now)
    assert left.owned == 8 - len(held)  # no load snapshot: nobody to place them on yet
    clock.now_ms += WALL_STEP_MS
    joined = sim.tick(2)
    sim.publisher.close()
    assert "broker-03" in store.live_brokers(joined.wall_ms)
    assert joined.brokers == ("broker-00", "broker-01", "broker-03")

    by_cycle: dict[int, dict[str, LocalBrokerData]] = {}
    for ts, key, report in decoded(read_reports(kafka_bootstrap, topic, 3 + 2 + 3)):
        by_cycle.setdefault(cycle_of(ts, scenario), {})[key] = report
    assert set(by_cycle[1]) == {"broker-00", "broker-01"}
    assert set(by_cycle[2]) == {"broker-00", "broker-01", "broker-03"}
    assert by_cycle[2]["broker-03"].num_bundles == 0


def test_two_runs_with_one_seed_publish_the_same_reports(
    redis_url: str, kafka_bootstrap: str, unique_topic: Callable[..., str], fresh_redis: redis.Redis
) -> None:
    runs = []
    for prefix, seed in (("det-a", 11), ("det-b", 11), ("det-c", 12)):
        scenario = load(seed)
        topic = unique_topic(prefix=prefix)
        clock = FakeClock()
        sim = make_sim(scenario, redis_url, kafka_bootstrap, topic, prefix, seed, clock)
        sim.setup()
        play(sim, clock, range(4))
        sim.publisher.close()
        runs.append(read_reports(kafka_bootstrap, topic, 12))
    assert runs[0] == runs[1], "same seed, same records (keys, values, timestamps)"
    assert runs[0] != runs[2], "the seed matters"


def test_lbctl_simulate_live_publishes_one_json_line_per_cycle(
    redis_url: str,
    kafka_bootstrap: str,
    unique_topic: Callable[..., str],
    fresh_redis: redis.Redis,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "live.json"
    path.write_text(json.dumps(scenario_doc()))
    topic = unique_topic(prefix="live-cli")
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    argv = ["simulate", str(path), "--bootstrap-servers", kafka_bootstrap]
    argv += ["--redis-url", redis_url, "--cycle-seconds", "0", "--cycles", "3", "--json"]
    argv += ["--set", f"loadReportsTopic={topic}", "--set", "redisKeyPrefix=cli"]
    argv += ["--metrics-port", "0"]
    args = parser.parse_args(argv)
    cycles = "lbctl_simulator_cycles_total"
    cycles_before = REGISTRY.get_sample_value(cycles) or 0.0
    try:
        assert args.func(args) == 0
        out, err = capsys.readouterr()
        port = int(err.split("metrics on port ", 1)[1].split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            exposition = resp.read().decode()
    finally:
        metrics.stop_all()
    assert REGISTRY.get_sample_value(cycles) - cycles_before == 3
    assert 'pulsar_lb_cpu_usage{broker="broker-02"}' in exposition
    assert "lbctl_simulator_reports_published_total" in exposition
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["cycle"] for r in rows] == [0, 1, 2]
    assert all(r["reportsPublished"] == 3 and r["ownedBundles"] == 8 for r in rows)
    records = read_reports(kafka_bootstrap, topic, 9)
    stamps = sorted({ts for ts, _, _ in records})
    assert [b - a for a, b in itertools.pairwise(stamps)] == [60_000, 60_000]
    assert fresh_redis.scard("cli:brokers") == 3

    # A second run on the same topic continues virtual time after the newest report (which is
    # minutes ahead of the wall clock), so the streaming job never sees time go backwards.
    argv[argv.index("--cycles") + 1] = "1"
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    again = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["virtualMs"] for r in again] == [stamps[-1] + 60_000]


def test_lbctl_simulate_live_stops_cleanly_on_sigterm(
    redis_url: str, kafka_bootstrap: str, unique_topic: Callable[..., str], fresh_redis: redis.Redis
) -> None:
    topic = unique_topic(prefix="live-sig")
    argv = [sys.executable, "-m", "lbctl.main", "simulate", "steady"]
    argv += ["--bootstrap-servers", kafka_bootstrap, "--redis-url", redis_url]
    argv += ["--cycle-seconds", "5", "--set", f"loadReportsTopic={topic}"]
    argv += ["--set", "redisKeyPrefix=sig"]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        text=True,
    )
    try:
        first = proc.stdout.readline()  # type: ignore[union-attr]
        assert first.startswith("cycle    0"), first
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)  # mid-wait: the next cycle is 5 s away
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - t0 < 2.0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_setup_stores_the_scenarios_placement_policies_where_placement_reads_them(
    redis_url: str, fresh_redis: redis.Redis, kafka_bootstrap: str, unique_topic
) -> None:
    """A scenario with policies played live: the controller's lookups and the job's cycles
    read the policies from Redis, so the simulator must put them there."""
    doc = scenario_doc()
    doc["policies"] = {
        "namespaceIsolationPolicies": {
            "pool": {"namespaces": ["public/live"], "primary": ["broker-0"]}
        }
    }
    scenario = parse_scenario(doc, random.Random(0))
    sim = make_sim(scenario, redis_url, kafka_bootstrap, unique_topic(), "lp", 0, FakeClock())
    sim.setup()
    stored = RedisStore.from_url(redis_url, prefix="lp").placement_policies.read()
    assert stored == scenario.policies
    assert stored.isolation_policy_of(NS) is not None
