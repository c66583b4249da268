"""The simulator's world model: deterministic for a seed, closed-loop, split by topic hash."""

from __future__ import annotations

import random

import pytest

from loadbalance.bundles import NamespaceBundles
from producers.scenarios import (
    available_scenarios,
    initial_owners,
    load_scenario,
    parse_scenario,
)
from producers.sim_model import (
    BrokerSpec,
    ClusterModel,
    CostModel,
    NamespaceTraffic,
    Topic,
    broker_report,
    bundle_stats,
    reports_at,
)

NS = "public/sim"


def _world(noise: float = 0.0) -> tuple[ClusterModel, dict[str, NamespaceBundles]]:
    topics = tuple(
        sorted(
            (
                Topic(f"persistent://{NS}/t{i}", h, 100.0 + i, 1024, 2, 1, 2)
                for i, h in enumerate(range(7, 2**32, 2**32 // 40))
            ),
            key=lambda t: t.hash,
        )
    )
    ns = NamespaceTraffic(NS, topics, noise=noise)
    brokers = {n: BrokerSpec(n, cores=c) for n, c in (("a", 4.0), ("b", 8.0), ("c", 8.0))}
    model = ClusterModel(brokers, {NS: ns}, cost=CostModel(cpu_noise_fraction=0.0))
    return model, {NS: NamespaceBundles.initial(NS, 4)}


def _owners(bundles: NamespaceBundles, *brokers: str) -> dict[str, str]:
    return {b: brokers[i % len(brokers)] for i, b in enumerate(bundles.bundle_names)}


def test_same_seed_gives_identical_reports_and_different_seeds_differ() -> None:
    scenario = load_scenario("rolling_restart", seed=3)
    owners = initial_owners(scenario, random.Random(3))

    def sequence(seed: int) -> list[dict]:
        rng = random.Random(seed)
        return [
            reports_at(
                scenario.model, scenario.namespaces, owners, scenario.initial_brokers, t, rng
            )[0]
            for t in range(0, 10 * 60_000, 60_000)
        ]

    assert sequence(1) == sequence(1)
    assert sequence(1) != sequence(2)


def test_loading_a_scenario_twice_with_one_seed_gives_the_same_world() -> None:
    a, b = load_scenario("steady", seed=5), load_scenario("steady", seed=5)
    assert a.model.traffic == b.model.traffic and a.model.bursts == b.model.bursts
    assert initial_owners(a, random.Random(1)) == initial_owners(b, random.Random(1))
    assert load_scenario("steady", seed=6).model.traffic != a.model.traffic


def test_moving_a_bundle_moves_exactly_its_traffic() -> None:
    model, layout = _world()
    owners = _owners(layout[NS], "a", "b")
    before, stats = reports_at(model, layout, owners, ["a", "b", "c"], 0, random.Random(1))
    moved = next(b for b, o in owners.items() if o == "a")
    after, _ = reports_at(
        model, layout, {**owners, moved: "c"}, ["a", "b", "c"], 0, random.Random(1)
    )
    rate = stats[moved].msg_rate
    assert rate > 0
    assert after["a"].msg_rate == pytest.approx(before["a"].msg_rate - rate)
    assert after["c"].msg_rate == pytest.approx(before["c"].msg_rate + rate)
    assert after["b"].msg_rate == pytest.approx(before["b"].msg_rate)
    assert moved in after["c"].bundles and moved not in after["a"].bundles
    assert after["c"].cpu.usage > before["c"].cpu.usage
    assert after["a"].cpu.usage < before["a"].cpu.usage


def test_a_split_divides_the_bundles_topics_by_hash() -> None:
    model, layout = _world()
    parent = layout[NS].bundles[1]
    mid = parent.lower + (parent.upper - parent.lower) // 2
    split = {NS: layout[NS].split(parent, [mid])}
    whole = bundle_stats(model, layout, 0, random.Random(0))[parent.name]
    halves = bundle_stats(model, split, 0, random.Random(0))
    low, high = split[NS].children_of_split(parent, [mid])
    expect_low = [t for t in model.traffic[NS].topics if parent.lower <= t.hash < mid]
    expect_high = [t for t in model.traffic[NS].topics if mid <= t.hash < parent.upper]
    assert halves[low].topics == len(expect_low) and halves[high].topics == len(expect_high)
    assert halves[low].msg_rate_in == pytest.approx(sum(t.rate_in_per_s for t in expect_low))
    assert halves[low].msg_rate + halves[high].msg_rate == pytest.approx(whole.msg_rate)


def test_a_broker_with_twice_the_cores_shows_about_half_the_cpu_percentage() -> None:
    model, layout = _world()
    stats = bundle_stats(model, layout, 0, random.Random(0))
    owned = layout[NS].bundle_names[:2]
    small = broker_report(model.brokers["a"], owned, stats, model.cost, 0, random.Random(0))
    big = broker_report(model.brokers["b"], owned, stats, model.cost, 0, random.Random(0))
    assert small.msg_rate == big.msg_rate
    idle_pct = model.cost.idle_cpu_fraction * 100
    assert small.cpu.percent_usage() - idle_pct == pytest.approx(
        2 * (big.cpu.percent_usage() - idle_pct)
    )
    assert small.cpu.limit == 400.0 and big.cpu.limit == 800.0


def test_bundles_of_a_dead_broker_are_served_by_nobody() -> None:
    model, layout = _world()
    owners = _owners(layout[NS], "a", "b")
    reports, _ = reports_at(model, layout, owners, ["b", "c"], 0, random.Random(0))
    assert set(reports) == {"b", "c"}
    assert not reports["c"].bundles
    served = set().union(*(r.bundles for r in reports.values()))
    assert served == {b for b, o in owners.items() if o == "b"}


def test_report_carries_every_owned_bundle_and_pulsar_units() -> None:
    model, layout = _world()
    owners = _owners(layout[NS], "a")
    report = reports_at(model, layout, owners, ["a"], 120_000, random.Random(0))[0]["a"]
    assert report.bundles == frozenset(layout[NS].bundle_names)
    assert set(report.last_stats) == set(report.bundles)
    assert report.num_topics == len(model.traffic[NS].topics) and report.last_update_ms == 120_000
    assert report.msg_rate_out == pytest.approx(2 * report.msg_rate_in)
    assert 0 < report.max_resource_usage() <= 1.0
    assert report.bandwidth_in.usage == pytest.approx(report.msg_throughput_in / 1024)


def test_diurnal_wave_and_bursts_change_traffic_over_time() -> None:
    doc = {
        "name": "wave",
        "brokers": [{"count": 2}],
        "namespaces": [
            {
                "name": NS,
                "bundles": 4,
                "topics": 50,
                "rate_in_per_s": 1000,
                "pattern": "diurnal",
                "diurnal_amplitude": 0.5,
                "diurnal_period_minutes": 60,
            }
        ],
        "bursts": {"per_hour": 30, "duration_minutes": 5, "factor": 10},
        "cycles": 60,
    }
    scenario = parse_scenario(doc, random.Random(1))
    totals = [
        sum(
            s.msg_rate_in
            for s in bundle_stats(scenario.model, scenario.namespaces, t, random.Random(0)).values()
        )
        for t in range(0, 60 * 60_000, 5 * 60_000)
    ]
    assert max(totals) > 1.3 * min(totals)
    assert scenario.model.bursts


def test_hot_topics_land_in_the_chosen_bundle() -> None:
    scenario = load_scenario("hot_bundle", seed=0)
    stats = bundle_stats(scenario.model, scenario.namespaces, 0, random.Random(0))
    hot = scenario.namespaces["public/hot"].bundle_names[0]
    assert stats[hot].msg_rate > 30_000
    assert max(stats.values(), key=lambda s: s.msg_rate) is stats[hot]


@pytest.mark.parametrize("name", available_scenarios())
def test_every_bundled_scenario_loads_and_starts_with_every_bundle_owned(name: str) -> None:
    scenario = load_scenario(name, seed=0)
    owners = initial_owners(scenario, random.Random(0))
    every = {b for ns in scenario.namespaces.values() for b in ns.bundle_names}
    assert set(owners) == every
    assert set(owners.values()) <= set(scenario.initial_brokers)
