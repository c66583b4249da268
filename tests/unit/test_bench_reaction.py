"""The pure helpers of ``benchmarks/bench_reaction.py``: how its figures are computed from what
it observed (percentiles, the stage split, which round decided, the stream log's batch spans)."""

from __future__ import annotations

import importlib.util
import sys
from datetime import datetime
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_reaction.py"
_spec = importlib.util.spec_from_file_location("bench_reaction", _PATH)
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
sys.modules["bench_reaction"] = bench
_spec.loader.exec_module(bench)


def _trial(**kw):
    base = dict(
        index=0,
        target="b",
        hot_bundles=("x",),
        factor=2.0,
        hot_usage=0.95,
        hot_round=10,
        hot_pub_ms=1_000.0,
    )
    return bench.Trial(**{**base, **kw})


def test_percentile_is_nearest_rank_so_p99_of_twenty_is_the_maximum():
    values = [float(v) for v in range(1, 21)]  # 1..20
    assert bench.percentile(values, 50) == 10.0
    assert bench.percentile(values, 99) == 20.0
    assert bench.percentile(values, 95) == 19.0
    assert bench.percentile([7.0], 99) == 7.0


def test_percentile_of_nothing_is_nan():
    assert bench.percentile([], 50) != bench.percentile([], 50)


def test_stages_split_the_pipeline_and_add_up_to_it():
    t = _trial(
        hot_round=10,
        decide_round=12,
        decide_pub_ms=5_000.0,
        stage_start_ms=5_300.0,
        commit_ms=6_100.0,
        decision_ms=6_400.0,
        applied_ms=6_700.0,
        visible_ms=6_720.0,
    )
    s = bench.stages(t)
    assert s == {
        "report_to_stage": 300.0,
        "stage_to_decision": 1_100.0,
        "decision_to_applied": 300.0,
        "applied_to_visible": 20.0,
    }
    assert sum(s.values()) == t.pipeline_ms == 1_720.0
    assert t.policy_rounds == 2
    assert t.reaction_ms == 5_720.0
    assert bench.commit_to_decision_ms(t) == 300.0


def test_a_stage_with_an_unseen_end_is_unknown_not_zero():
    t = _trial(decide_pub_ms=5_000.0, decision_ms=6_400.0, visible_ms=6_720.0)
    s = bench.stages(t)
    assert s["report_to_stage"] is None and s["stage_to_decision"] is None
    assert s["decision_to_applied"] is None and s["applied_to_visible"] is None
    assert bench.commit_to_decision_ms(t) is None
    assert t.pipeline_ms == 1_720.0


def test_round_of_maps_the_decision_clock_to_the_round_that_carried_it():
    assert bench.round_of(1_000 + 3 * 60_000, 1_000, 60_000) == 3
    assert bench.round_of(1_000, 1_000, 60_000) == 0
    assert bench.round_of(1_000 + 3 * 60_000 + 5, 1_000, 60_000) is None
    assert bench.round_of(0, 1_000, 60_000) is None


def test_batch_lines_give_each_batch_its_start_and_end():
    lines = [
        "2026-11-25 17:16:34,470 INFO streaming.decide: batch 7: 36 rows, 0 dead letters, "
        "2 decisions, 1820 ms",
        "2026-11-25 17:16:35,000 INFO streaming.decide: seeded from Redis: last batch 3",
        "2026-11-25 17:16:36,000 INFO other.module: batch 8: 1 rows, 5 ms",
    ]
    spans = bench.parse_batch_lines(lines)
    end = datetime(2026, 11, 25, 17, 16, 34, 470_000).timestamp() * 1000
    assert spans == {7: (pytest.approx(end - 1820), pytest.approx(end))}


def test_summary_counts_only_trials_that_reacted_and_adds_report_intervals():
    reacted = [
        _trial(
            index=i,
            hot_round=5,
            decide_round=5 + r,
            decide_pub_ms=0.0,
            visible_ms=p,
            decision_kind="transfer",
        )
        for i, (r, p) in enumerate([(0, 1_000.0), (1, 3_000.0), (0, 2_000.0)])
    ]
    s = bench.summarize([*reacted, _trial(index=9)], interval_s=60.0, gate_s=60.0)
    assert (s["trials"], s["reacted"]) == (4, 3)
    assert s["pipelineMs"]["p50"] == 2_000.0 and s["pipelineMs"]["p99"] == 3_000.0
    assert s["policyRounds"]["max"] == 1.0
    assert s["realClusterMs"]["p99"] == 63_000.0  # one round of 60 s plus its 3 s pipeline
    assert s["moves"] == {"transfer": 3}
