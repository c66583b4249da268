"""The fast simulator honours a scenario's placement policies: the views it builds carry them,
so its lookups, initial placement and transfer destinations keep every isolation rule, also
after a crash inside the isolated pool."""

from __future__ import annotations

import json
import random

from producers.fast_sim import FastSim, make_config
from producers.scenarios import parse_scenario, scenario_dir
from producers.scoreboard import PAIRS

POOL = {"broker-00", "broker-01", "broker-02"}


def _scenario():
    doc = json.loads((scenario_dir() / "crash.json").read_text())
    doc["events"] = [{"at_cycle": 3, "kind": "crash", "names": ["broker-01"]}]
    doc["policies"] = {
        "namespaceIsolationPolicies": {
            "app-0": {
                "namespaces": ["public/app-0"],
                "primary": ["broker-0[012]"],
                "secondary": [],
                "auto_failover_policy": {
                    "policy_type": "min_available",
                    "parameters": {"min_limit": "1", "usage_threshold": "100"},
                },
            }
        }
    }
    return parse_scenario(doc, random.Random(0))


def test_isolation_holds_at_every_cycle_through_a_crash_in_the_pool() -> None:
    scenario = _scenario()
    assert scenario.policies.is_isolated("public/app-0")
    sim = FastSim(scenario, make_config(scenario, PAIRS["ours"].overrides), seed=0)
    for cycle in range(14):
        sim.tick(cycle)
        assert sim.view is not None and sim.view.policies is scenario.policies
        for bundle, owner in sim.owners.items():
            isolated = bundle.startswith("public/app-0/")
            assert (owner in POOL) == isolated, (cycle, bundle, owner)
    # after the crash, the pool's bundles were placed again, and only inside the pool
    owners = {o for b, o in sim.owners.items() if b.startswith("public/app-0/")}
    assert owners and owners <= POOL - {"broker-01"}
