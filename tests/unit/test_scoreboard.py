"""The balance-quality scoreboard: scoring rules, and a tiny run that writes all three files."""

from __future__ import annotations

import json
from pathlib import Path

from producers.cli import register
from producers.fast_sim import Move, SimRun
from producers.scenarios import ADD_BROKERS, REMOVE_BROKERS
from producers.scoreboard import (
    COLUMNS,
    PAIRS,
    balanced_after,
    run_scoreboard,
    score_run,
    to_markdown,
    verdicts,
    write_outputs,
)


def test_balanced_after_needs_five_cycles_in_the_band_from_the_start() -> None:
    ratios = [1.5, 1.2, 1.05, 1.05, 1.2, 1.05, 1.05, 1.05, 1.05, 1.05, 1.3]
    assert balanced_after(ratios, 0) == 5
    assert balanced_after(ratios, 6) is None
    assert balanced_after([1.0] * 5, 0) == 0


def _run(moves: list[Move], **kw) -> SimRun:
    run = SimRun("s", 0, 12)
    run.usage = [{"a": 0.6, "b": 0.4}] * 6 + [{"a": 0.5, "b": 0.5, "c": 0.5}] * 6
    run.moves = moves
    run.policy_ms = [1.0] * 12
    for k, v in kw.items():
        setattr(run, k, v)
    return run


def test_scale_out_counts_moves_onto_new_brokers_as_useful_and_the_rest_as_churn() -> None:
    moves = [
        Move(7, "x", "a", "c", "transfer", False),
        Move(8, "y", "a", "b", "transfer", False),
        Move(2, "z", "a", "b", "transfer", False),
    ]
    run = _run(moves, joined={"c": 6}, event_cycles=[6])
    s = score_run(run, PAIRS["ours"], {ADD_BROKERS})
    assert (s.useful, s.churn, s.moves) == (1, 1, 3)
    assert s.balanced_after == 0 and s.peak_after_event_pct == 50.0


def test_scale_in_counts_moves_of_bundles_that_were_not_displaced_as_churn() -> None:
    moves = [Move(7, "x", "a", "b", "transfer", True), Move(8, "d", "a", "b", "transfer", False)]
    run = _run(moves, displaced={"d"}, event_cycles=[6])
    s = score_run(run, PAIRS["ours"], {REMOVE_BROKERS})
    assert s.churn == 1 and s.useful is None and s.oscillations == 1


def test_verdict_compares_ours_with_the_best_pulsar_pair() -> None:
    run = _run([], event_cycles=[])
    run.usage = [{"a": 0.9, "b": 0.1}] * 3 + [{"a": 0.5, "b": 0.5}] * 9
    ours = score_run(run, PAIRS["ours"], set())
    slow = _run([], event_cycles=[])
    slow.usage = [{"a": 0.9, "b": 0.1}] * 6 + [{"a": 0.5, "b": 0.5}] * 6
    theirs = score_run(slow, PAIRS["classic"], set())
    assert verdicts([theirs, ours]) == [("s", "classic", "better")]
    assert verdicts([theirs, score_run(slow, PAIRS["ours"], set())])[0][2] == "no worse"


def test_a_tiny_scoreboard_writes_json_markdown_and_png(tmp_path: Path) -> None:
    scores = run_scoreboard(["steady", "scale_out"], ["classic", "ours"], cycles=15, workers=1)
    assert [(s.scenario, s.pair) for s in scores] == [
        ("steady", "classic"),
        ("steady", "ours"),
        ("scale_out", "classic"),
        ("scale_out", "ours"),
    ]
    paths = write_outputs(scores, tmp_path, {"seed": 0, "cycles": 15})
    doc = json.loads(paths["json"].read_text())
    assert doc["columns"] == [k for k, _ in COLUMNS]
    row = doc["rows"][0]
    for key in ("balanced_after", "moves", "splits", "oscillations", "useful", "churn"):
        assert key in row
    for key in ("peak_after_event_pct", "end_mad_pct", "policy_ms_mean", "series_max_pct"):
        assert key in row
    assert len(row["series_max_pct"]) == 15
    md = paths["md"].read_text()
    assert md.startswith("| " + " | ".join(t for _, t in COLUMNS))
    assert md.count("\n| steady |") == 2
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sum(1 for line in to_markdown(scores).splitlines() if line.startswith("|---")) == 1


def test_cli_registers_bench_balance_and_simulate() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["bench", "balance", "--scenarios", "steady,crash", "--cycles", "5", "--json"]
    )
    assert args.scenarios == ["steady", "crash"] and args.cycles == 5 and args.json
    args = parser.parse_args(["simulate", "herding", "--fast", "--pair", "classic"])
    assert args.fast and args.pair == "classic" and args.scenario == "herding"


def test_cli_simulate_fast_prints_a_line_per_cycle(capsys) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["simulate", "crash", "--fast", "--cycles", "3"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert out.count("cycle ") == 3 and "cycles to balance" in out
