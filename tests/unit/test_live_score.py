"""The live scoreboard's recorder and its knob plumbing (pure: no services).

The recorder must count exactly what the fast model counts for the same events: an applied
transfer is a move in its cycle, an applied unload becomes a move when a lookup places the
bundle, lookups nobody's decision caused are not moves, refused decisions change nothing, and a
departing broker's bundles are displaced.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lbctl import bench_live
from lbctl.run_cmd import _knob_sets
from loadbalance.config import LoadBalancerConfig, knob_text, load_config
from producers import scoreboard
from producers.live_score import LiveRunRecorder
from producers.live_sim import LiveCycle
from producers.scenarios import load_scenario


def _cycle(c: int, owners: dict[str, str], *, events=(), looked_up=()) -> LiveCycle:
    brokers = sorted(set(owners.values()))
    return LiveCycle(
        cycle=c,
        virtual_ms=c * 60_000,
        wall_ms=0,
        brokers=tuple(brokers),
        bundles=len(owners),
        owned=len(owners),
        assigned=len(looked_up),
        moved=0,
        published=len(brokers),
        events=tuple(events),
        usage={b: 0.5 for b in brokers},
        reports={},
        owners=owners,
        looked_up=tuple(looked_up),
    )


def _entry(kind: str, bundle: str, outcome: str, source: str = "", dest: str = "") -> dict:
    return {
        b"id": b"d",
        b"kind": kind.encode(),
        b"bundle": bundle.encode(),
        b"outcome": outcome.encode(),
        b"source": source.encode(),
        b"destination": dest.encode(),
    }


def _recorder(name: str = "crash") -> LiveRunRecorder:
    scenario = load_scenario(name)
    return LiveRunRecorder(scenario, LoadBalancerConfig(), 0)


def test_applied_transfers_are_moves_and_refused_ones_are_not() -> None:
    rec = _recorder()
    rec.cycle(_cycle(0, {"a": "b1", "b": "b2"}))
    rec.applied(
        0,
        [
            _entry("transfer", "a", "applied", "b1", "b2"),
            _entry("transfer", "b", "rejected", "b2", "b1"),
            _entry("split", "c", "applied"),
            _entry("split", "d", "conflict"),
        ],
    )
    run = rec.run
    assert [(m.cycle, m.bundle, m.source, m.destination, m.kind) for m in run.moves] == [
        (0, "a", "b1", "b2", "transfer")
    ]
    assert run.splits == 1
    assert run.outcomes == {"applied": 2, "rejected": 1, "conflict": 1}
    assert rec.decisions == 4


def test_an_unload_is_a_move_when_a_lookup_places_it_and_other_lookups_are_not() -> None:
    rec = _recorder()
    rec.cycle(_cycle(0, {"a": "b1", "b": "b2"}))
    rec.applied(0, [_entry("unload", "a", "applied", "b1")])
    assert rec.run.moves == []  # not yet placed
    # cycle 1: the lookup puts "a" on b3; "n" is a new bundle (a split child): not a move
    rec.cycle(_cycle(1, {"a": "b3", "b": "b2", "n": "b1"}, looked_up=("a", "n")))
    assert [(m.cycle, m.bundle, m.source, m.destination, m.kind) for m in rec.run.moves] == [
        (1, "a", "b1", "b3", "unload")
    ]


def test_moving_back_within_the_grace_period_is_an_oscillation() -> None:
    rec = _recorder()
    rec.cycle(_cycle(0, {"a": "b1"}))
    rec.applied(0, [_entry("transfer", "a", "applied", "b1", "b2")])
    rec.cycle(_cycle(1, {"a": "b2"}))
    rec.applied(1, [_entry("transfer", "a", "applied", "b2", "b1")])
    assert [m.oscillation for m in rec.run.moves] == [False, True]


def test_a_crashing_brokers_bundles_are_displaced_and_a_joining_broker_is_noted() -> None:
    rec = _recorder()
    rec.cycle(_cycle(0, {"a": "b1", "b": "b2", "c": "b1"}))
    rec.cycle(_cycle(1, {"b": "b2"}, events=("crash:b1", "up:b9")))
    assert rec.run.displaced == {"a", "c"}
    assert rec.run.joined == {"b9": 1}
    assert rec.run.cycles == 2 and len(rec.run.usage) == 2


def test_event_cycles_match_the_fast_models_so_balance_counts_from_the_same_cycle() -> None:
    scenario = load_scenario("crash")
    from producers.fast_sim import FastSim

    fast = FastSim(scenario, LoadBalancerConfig())
    assert _recorder("crash").run.event_cycles == fast.run_data.event_cycles


def test_a_recorded_run_scores_like_a_fast_one() -> None:
    rec = _recorder("steady")
    for c in range(8):
        rec.cycle(_cycle(c, {"a": "b1", "b": "b2"}))
    score = scoreboard.score_run(rec.run, scoreboard.PAIRS["ours"], set())
    assert score.balanced_after == 0 and score.moves == 0 and score.cycles == 8


def test_knob_text_round_trips_through_the_loader() -> None:
    knobs = {
        "loadBalancerMergeEnabled": True,
        "loadBalancerSheddingGracePeriodMinutes": 7,
        "loadBalancerBrokerOverloadedThresholdPercentage": 72.5,
    }
    config, _ = load_config(overrides={k: knob_text(v) for k, v in knobs.items()})
    assert config.load_balancer_merge_enabled is True
    assert config.load_balancer_shedding_grace_period_minutes == 7
    assert config.load_balancer_broker_overloaded_threshold_percentage == 72.5
    assert knob_text(False) == "false" and knob_text(["a", "b"]) == "a,b"


def _scenario_with_knobs(tmp_path: Path) -> Path:
    doc = json.loads(Path(load_scenario.__globals__["scenario_dir"]() / "steady.json").read_text())
    doc["config"] = {"loadBalancerSheddingGracePeriodMinutes": 7, "loadBalancerMergeEnabled": True}
    path = tmp_path / "knobbed.json"
    path.write_text(json.dumps(doc))
    return path


def test_lbctl_run_hands_the_scenarios_knobs_to_the_job_and_the_controller(tmp_path) -> None:
    path = _scenario_with_knobs(tmp_path)
    args = argparse.Namespace(scenario=str(path), seed=0, pair="ours", set=["x=1"])
    sets = _knob_sets(args)
    assert sets is not None
    assert "loadBalancerSheddingGracePeriodMinutes=7" in sets
    assert "loadBalancerMergeEnabled=true" in sets
    assert sets[-1] == "x=1"  # the user's --set still comes last and wins


def test_the_live_scoreboard_runs_with_scenario_then_pair_then_user_knobs(tmp_path) -> None:
    scenario = load_scenario(str(_scenario_with_knobs(tmp_path)))
    pair = scoreboard.PAIRS["ours"]
    sets = bench_live.knob_sets(scenario, pair, ["loadBalancerSheddingGracePeriodMinutes=9"])
    config = bench_live.config_from_sets(sets)
    assert config.load_balancer_merge_enabled is True
    assert config.load_balancer_shedding_grace_period_minutes == 9
    assert config.load_balancer_load_shedding_strategy == "ProjectedUsageShedder"


def test_targets_need_live_within_three_cycles_and_moves_within_fifteen_percent() -> None:
    assert bench_live.cycles_within(6, 3) and not bench_live.cycles_within(7, 3)
    assert bench_live.cycles_within(None, None) and bench_live.cycles_within(40, None)
    assert not bench_live.cycles_within(None, 3)
    assert bench_live.moves_within(46, 41) and not bench_live.moves_within(48, 41)
    assert bench_live.moves_within(0, 0) and not bench_live.moves_within(1, 0)


def test_the_side_by_side_outputs_carry_both_rows_the_verdict_and_the_traces(tmp_path) -> None:
    rec = _recorder("steady")
    for c in range(6):
        rec.cycle(_cycle(c, {"a": "b1", "b": "b2"}))
    rec.applied(2, [_entry("transfer", "a", "applied", "b1", "b2")])
    pair = scoreboard.PAIRS["ours"]
    live = scoreboard.score_run(rec.run, pair, set())
    fast = scoreboard.score_run(_recorder("steady").run, pair, set())
    result = bench_live.LiveResult(
        "steady", live, fast, 1.0, [0.5, 1.5], 1, {"applied": 1}, "lockstep",
        {"live": bench_live.trace(rec.run)},
    )  # fmt: skip
    md, js = bench_live.write_outputs([result], tmp_path, {"seed": 0})
    assert "| steady | lockstep |" in md.read_text()
    doc = json.loads(js.read_text())
    row = doc["results"][0]
    assert row["live"]["moves"] == 1 and row["fast"]["moves"] == 0
    assert row["traces"]["live"]["moves"] == [[2, "a", "b1", "b2", "transfer"]]
    assert row["withinTargets"] is False  # end max/mean 1.0 live against 0.0 for the empty fast run
