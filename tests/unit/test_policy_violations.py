"""The scoreboard's policy check: each rule judged from the ownership alone, the policies
scenario kept by every strategy pair at every cycle, a violation failing the run, and balance
judged per isolation pool."""

from __future__ import annotations

from dataclasses import replace

from loadbalance.placement.policies import PlacementPolicies
from producers.fast_sim import SimRun, simulate
from producers.policy_violations import (
    ANTI_AFFINITY,
    FAILURE_DOMAIN,
    HEARTBEAT,
    ISOLATION,
    Violation,
    find_violations,
    isolation_pools,
)
from producers.scenarios import load_scenario
from producers.scoreboard import (
    ALL_PAIR_KEYS,
    PAIRS,
    failures,
    pooled_max_over_mean,
    score_run,
    verdicts,
)

R = "0x00000000_0xffffffff"
POLICIES = PlacementPolicies.from_admin_json(
    {
        "namespaceIsolationPolicies": {
            "pool": {"namespaces": ["iso/.*"], "primary": ["b-0[01]"], "secondary": []}
        },
        "localPolicies": {f"s/n{i}": {"namespaceAntiAffinityGroup": "svc"} for i in range(4)},
        "failureDomains": {
            "za": {"brokers": ["b-02", "b-03"]},
            "zb": {"brokers": ["b-04", "b-05"]},
        },
    }
)
LIVE = [f"b-0{i}" for i in range(6)]
SPREAD = {f"s/n0/{R}": "b-02", f"s/n1/{R}": "b-04", f"s/n2/{R}": "b-03", f"s/n3/{R}": "b-05"}


def _rules(owners: dict[str, str], live=LIVE, domains: bool = True) -> list[str]:
    return [v.rule for v in find_violations(owners, live, POLICIES, domains_enabled=domains)]


def test_an_isolated_bundle_off_its_pool_is_a_violation_while_its_pool_is_live() -> None:
    assert _rules({f"iso/a/{R}": "b-00", **SPREAD}) == []
    assert _rules({f"iso/a/{R}": "b-02", **SPREAD}) == [ISOLATION]
    assert _rules({f"p/a/{R}": "b-01", **SPREAD}) == [ISOLATION]  # a shared namespace inside
    # on a crashed pool broker (leases not yet run out): where it was put, not a violation
    assert _rules({f"iso/a/{R}": "b-01", **SPREAD}, live=[*LIVE[2:], "b-00"]) == []
    # no pool broker live: nowhere better to be
    assert _rules({f"iso/a/{R}": "b-02", **SPREAD}, live=LIVE[2:]) == []


def test_an_anti_affinity_group_that_could_be_spread_further_is_a_violation() -> None:
    bunched = {**SPREAD, f"s/n2/{R}": "b-02"}  # b-02 serves two, b-03 none
    assert _rules(bunched, domains=False) == [ANTI_AFFINITY]
    # two namespaces of the group, both in za: one per broker, but zb serves none of them
    lopsided = {f"s/n0/{R}": "b-02", f"s/n1/{R}": "b-03"}
    assert _rules(lopsided, domains=False) == []
    assert _rules(lopsided, domains=True) == [FAILURE_DOMAIN]
    assert _rules(SPREAD) == []


def test_a_heartbeat_bundle_belongs_to_its_live_broker() -> None:
    hb = f"pulsar/b-03:8080/{R}"
    assert _rules({hb: "b-03", **SPREAD}) == []
    assert _rules({hb: "b-02", **SPREAD}) == [HEARTBEAT]
    assert _rules({hb: "b-02", **SPREAD}, live=[b for b in LIVE if b != "b-03"]) == []


def test_pools_split_the_brokers_by_isolation() -> None:
    pools = isolation_pools(LIVE, POLICIES)
    assert pools["b-00"] == pools["b-01"] == "pool" and pools["b-05"] == "shared"
    usage = {"b-00": 0.9, "b-01": 0.88, "b-02": 0.3, "b-03": 0.31}
    assert pooled_max_over_mean(usage, pools) < 1.05  # each pool is even
    assert pooled_max_over_mean(usage, {}) > 1.4  # cluster-wide it never could be


def test_every_pair_keeps_every_policy_at_every_cycle_of_the_policies_scenario() -> None:
    scenario = load_scenario("policies", 0)
    for key in ALL_PAIR_KEYS:
        run = simulate(scenario, PAIRS[key].overrides, seed=0, cycles=70)
        assert len(run.violations) == 70
        assert sum(run.violations) == 0, (key, run.violation_examples[:3])


def test_ours_balances_each_pool_of_the_policies_scenario() -> None:
    scenario = load_scenario("policies", 0)
    run = simulate(scenario, PAIRS["ours"].overrides, seed=0)
    score = score_run(run, PAIRS["ours"], scenario.kinds)
    assert score.policy_violations == 0
    assert set(score.pools_balanced_after) == {"iso-pool", "shared"}
    assert all(v is not None for v in score.pools_balanced_after.values())
    assert score.balanced_after is not None and score.end_max_over_mean <= 1.10


def test_a_run_with_a_violation_fails_and_ours_is_then_worse() -> None:
    def run_with(violations: list[int]) -> SimRun:
        run = SimRun("s", 0, 6)
        run.usage = [{"a": 0.5, "b": 0.5}] * 6
        run.policy_ms = [1.0] * 6
        run.violations = violations
        run.violation_examples = [(2, Violation(ISOLATION, "x", "on a"))] if any(violations) else []
        return run

    ours = score_run(run_with([0, 0, 1, 0, 0, 0]), PAIRS["ours"], set())
    theirs = score_run(run_with([0] * 6), PAIRS["classic"], set())
    assert ours.policy_violations == 1 and theirs.policy_violations == 0
    assert failures([theirs, ours]) == [
        ("s", "ours", "1 policy violations (cycle 2: isolation x: on a)")
    ]
    assert verdicts([theirs, ours]) == [("s", "classic", "worse")]
    assert failures([theirs]) == []
    assert verdicts([theirs, replace(theirs, pair="ours")])[0][2] != "worse"
