"""The live scoreboard plays a scenario through the real pipeline in lockstep.

Embedded Kafka and Redis, the Spark job and the controller as child processes, the simulator in
process (``lbctl.bench_live.play_live``). What must hold:

* lockstep: the decisions made from cycle 0's reports (hot_bundle's hot bundle is split at the
  first policy cycle) are applied before cycle 0 ends, and the split's children are looked up by
  cycle 1, as in the fast model;
* the recording is in the fast scoreboard's terms and agrees with what Redis holds: every applied
  split in the outcome stream is counted, the namespaces have grown by exactly that many bundles.
"""

from __future__ import annotations

from pathlib import Path

from lbctl import bench_live
from producers import scoreboard
from producers.fast_sim import simulate
from producers.scenarios import load_scenario

CYCLES = 4


def test_hot_bundle_in_lockstep_splits_from_the_first_reports_like_the_model(
    tmp_path: Path,
) -> None:
    opts = bench_live.LiveOptions(cycles=CYCLES)
    recorder, walls, _ = bench_live.play_live("hot_bundle", "ours", tmp_path, opts, print)
    run = recorder.run
    assert run.cycles == CYCLES and len(walls) == CYCLES and len(run.usage) == CYCLES

    # lockstep: cycle 0's policy cycle (the split of the hot bundle) applied within cycle 0
    assert any(c == 0 and kind == "split" for c, kind in recorder.applied_at), recorder.applied_at

    # the fast model splits in the same cycle from the same reports
    scenario = load_scenario("hot_bundle")
    fast = simulate(scenario, scoreboard.PAIRS["ours"].overrides, cycles=1)
    assert fast.splits >= 1
    assert sum(1 for c, k in recorder.applied_at if c == 0 and k == "split") == fast.splits

    # the recorded splits are what Redis holds: each split applied before the last cycle's
    # read added one bundle to its namespace
    scenario_bundles = sum(len(nb) for nb in scenario.namespaces.values())
    assert recorder.bundle_counts[0] == scenario_bundles
    before_last = sum(1 for c, k in recorder.applied_at if c < CYCLES - 1 and k == "split")
    assert recorder.bundle_counts[-1] - scenario_bundles == before_last
