"""Fast mode: the closed loop is deterministic, moves and splits move traffic, no herding, and
decisions are applied by the controller's applier with the ownership store's rules."""

from __future__ import annotations

import random

import pytest

from controller.apply import APPLIED, DUPLICATE, REJECTED
from loadbalance.bundles import BundleRange, parse_bundle
from loadbalance.decisions import MERGE, SPLIT, TRANSFER, make_decision
from producers.fast_sim import FastSim, make_config, simulate
from producers.scenarios import load_scenario
from producers.scoreboard import PAIRS

OURS = PAIRS["ours"].overrides


def _sim(name: str, seed: int = 0, pair: str = "ours", **kw) -> FastSim:
    scenario = load_scenario(name, seed)
    return FastSim(scenario, make_config(scenario, PAIRS[pair].overrides), seed=seed, **kw)


def test_same_seed_gives_identical_reports_and_decisions() -> None:
    a = simulate(load_scenario("steady", 4), OURS, seed=4, cycles=12, keep_reports=True)
    b = simulate(load_scenario("steady", 4), OURS, seed=4, cycles=12, keep_reports=True)
    assert a.reports == b.reports
    assert [d.id for d in a.decisions] == [d.id for d in b.decisions]
    assert a.decisions, "the random start must give the policies something to do"


def test_different_seeds_differ() -> None:
    a = simulate(load_scenario("steady", 1), OURS, seed=1, cycles=6, keep_reports=True)
    b = simulate(load_scenario("steady", 2), OURS, seed=2, cycles=6, keep_reports=True)
    assert a.reports != b.reports


def test_a_transfer_moves_the_bundles_traffic_to_the_destination() -> None:
    sim = _sim("scale_in", keep_reports=True)
    sim.tick(0)
    before = sim.run_data.reports[-1]
    src, dst = "broker-00", "broker-01"
    bundle = max(before[src].last_stats, key=lambda b: before[src].last_stats[b].msg_rate)
    rate = before[src].last_stats[bundle].msg_rate
    sim.apply(
        make_decision(
            cycle="t", kind="transfer", bundle=bundle, source_broker=src, destination_broker=dst
        ),
        0,
    )
    sim.tick(1)
    after = sim.run_data.reports[-1]
    assert bundle in after[dst].bundles and bundle not in after[src].bundles
    noise = 0.05 * before[src].msg_rate  # the namespaces' traffic wobbles a little per cycle
    assert after[src].msg_rate == pytest.approx(before[src].msg_rate - rate, abs=noise)
    assert after[dst].msg_rate == pytest.approx(before[dst].msg_rate + rate, abs=noise)
    assert any(m.bundle == bundle and m.destination == dst for m in sim.run_data.moves)


def test_a_split_in_the_loop_divides_the_bundles_topics_by_hash() -> None:
    sim = _sim("hot_bundle", keep_reports=True)
    sim.tick(0)
    splits = [d for d in sim.run_data.decisions if d.kind == SPLIT]
    assert splits, "the hot bundle is over loadBalancerNamespaceBundleMaxMsgRate"
    parent = splits[0]
    ns = sim.namespaces["public/hot"]
    children = ns.children_of_split(parent.bundle, parent.split_boundaries)
    assert all(ns.contains(c) for c in children) and not ns.contains(parent.bundle)
    sim.tick(1)
    reports = sim.run_data.reports[-1]
    served = {b: s for r in reports.values() for b, s in r.last_stats.items()}
    parent_stats = sim.run_data.reports[0]
    parent_topics = next(
        r.last_stats[parent.bundle] for r in parent_stats.values() if parent.bundle in r.bundles
    ).topics
    child_topics = [served[c].topics for c in children if c in served]
    assert sum(child_topics) == parent_topics
    topics = sim.scenario.model.traffic["public/hot"].topics
    cut = parent.split_boundaries[0]
    low_lower = int(children[0].rsplit("/", 1)[1].split("_")[0], 16)
    expect_low = sum(1 for t in topics if low_lower <= t.hash < cut)
    if children[0] in served:
        assert served[children[0]].topics == expect_low


def test_herding_case_no_broker_passes_85_percent_with_our_default_pair() -> None:
    run = simulate(load_scenario("herding", 0), OURS, seed=0, cycles=40)
    removed_at = run.event_cycles[0]
    assert len(run.usage[removed_at]) == 8
    peak = max(max(u.values()) for u in run.usage[removed_at:])
    assert peak < 0.85
    assert len(run.displaced) > 20


def test_a_crashed_brokers_bundles_wait_for_their_lease_then_move() -> None:
    sim = _sim("crash")
    crash_at = sim.run_data.event_cycles[0]
    for c in range(crash_at + 1):
        sim.tick(c)
    orphaned = [b for b, o in sim.owners.items() if o == "broker-03"]
    assert orphaned, "the lease has not expired yet"
    for c in range(crash_at + 1, crash_at + 1 + sim.lease_cycles + 1):
        sim.tick(c)
    assert "broker-03" not in sim.owners.values()
    assert all(b in sim.owners for b in orphaned)


def test_scale_out_brokers_join_and_receive_bundles() -> None:
    run = simulate(load_scenario("scale_out", 0), OURS, seed=0, cycles=25)
    assert set(run.joined) == {f"new-{i:02d}" for i in range(5)}
    assert any(m.destination in run.joined for m in run.moves)


def test_runner_draws_randomness_only_from_its_seeded_generator() -> None:
    random.seed(123)
    a = simulate(load_scenario("rolling_restart", 0), OURS, seed=0, cycles=20)
    random.seed(456)
    b = simulate(load_scenario("rolling_restart", 0), OURS, seed=0, cycles=20)
    assert a.usage == b.usage and a.moves == b.moves


def _same_owner_pair(sim: FastSim) -> tuple[str, str, str]:
    """Two adjacent bundles of one namespace, both moved onto one broker through the applier."""
    ns = sorted(sim.namespaces)[0]
    first, second = sim.namespaces[ns].bundle_names[:2]
    owner = sim.owners[first]
    if sim.owners[second] != owner:
        src = sim.owners[second]
        move = make_decision(cycle="t", kind=TRANSFER, bundle=second, source_broker=src,
                             destination_broker=owner)  # fmt: skip
        assert sim.apply(move, 0).outcome == APPLIED
    return ns, first, second


def test_a_merged_bundle_starts_unowned_and_is_placed_by_the_next_lookup() -> None:
    sim = _sim("steady")
    sim.tick(0)
    ns, first, second = _same_owner_pair(sim)
    merge = make_decision(cycle="t", kind=MERGE, bundle=first, merge_bundle=second,
                          source_broker=sim.owners[first])  # fmt: skip
    assert sim.apply(merge, 0).outcome == APPLIED
    merged = BundleRange(ns, parse_bundle(first).lower, parse_bundle(second).upper).name
    assert sim.namespaces[ns].contains(merged)
    assert merged not in sim.owners, "the store contract: a merged bundle starts unowned"
    assert first not in sim.owners and second not in sim.owners
    assert sim.run_data.merges == 1
    assert sim.store.outcomes.get(merge.id)["outcome"] == APPLIED
    sim.tick(1)
    assert merged in sim.owners, "the lookup of the next cycle places it"


def test_decisions_keep_the_appliers_rules_duplicates_and_stale_owners() -> None:
    sim = _sim("steady")
    sim.tick(0)
    ns = sorted(sim.namespaces)[0]
    first, second = sim.namespaces[ns].bundle_names[:2]
    if sim.owners[first] == sim.owners[second]:
        second = next(
            b for b in sim.namespaces[ns].bundle_names if sim.owners[b] != sim.owners[first]
        )
        first = sim.namespaces[ns].bundle_names[sim.namespaces[ns].bundle_names.index(second) - 1]
    merge = make_decision(cycle="t", kind=MERGE, bundle=first, merge_bundle=second,
                          source_broker=sim.owners[first])  # fmt: skip
    version = sim.namespaces[ns].version
    assert sim.apply(merge, 0).outcome == REJECTED, "the bundles have different owners"
    assert sim.namespaces[ns].version == version and sim.run_data.merges == 0
    src = sim.owners[first]
    dst = next(b for b in sorted(sim.live) if b != src)
    move = make_decision(cycle="t", kind=TRANSFER, bundle=first, source_broker=src,
                         destination_broker=dst)  # fmt: skip
    assert sim.apply(move, 0).outcome == APPLIED
    moves = len(sim.run_data.moves)
    assert sim.apply(move, 0).outcome == DUPLICATE
    assert sim.owners[first] == dst and len(sim.run_data.moves) == moves
    stale = make_decision(cycle="u", kind=TRANSFER, bundle=first, source_broker=src,
                          destination_broker=src)  # fmt: skip
    assert sim.apply(stale, 0).outcome == REJECTED, "the owner changed since the decision"
    assert sim.owners[first] == dst
