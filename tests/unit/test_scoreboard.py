"""The balance-quality scoreboard: scoring rules, and a tiny run that writes all three files."""

from __future__ import annotations

import json
from pathlib import Path

from loadbalance.model import LocalBrokerData, NamespaceBundleStats
from producers.cli import register
from producers.fast_sim import Move, SimRun
from producers.scenarios import ADD_BROKERS, REMOVE_BROKERS
from producers.scoreboard import (
    COLUMNS,
    PAIRS,
    balanced_after,
    max_moves_in_window,
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


def _report(broker: str, **stats: NamespaceBundleStats) -> LocalBrokerData:
    return LocalBrokerData(broker=broker, bundles=frozenset(stats), last_stats=stats)


def test_bytes_moved_and_connections_disturbed_use_the_bundle_on_the_broker_it_left() -> None:
    # x: 1 MB/s in + 3 MB/s out, 2 producers + 5 consumers; y: 0.5 + 0.5 MB/s, 1 + 1 clients.
    # y grows to 9 MB/s on its new broker, which must not count: the move cut over 1 MB/s.
    x = NamespaceBundleStats(
        msg_throughput_in=1e6, msg_throughput_out=3e6, producer_count=2, consumer_count=5
    )
    y = NamespaceBundleStats(
        msg_throughput_in=5e5, msg_throughput_out=5e5, producer_count=1, consumer_count=1
    )
    y_later = NamespaceBundleStats(msg_throughput_in=9e6, producer_count=50)
    reports = [
        {"a": _report("a", x=x, y=y), "b": _report("b")},
        {"a": _report("a", x=x, y=y), "b": _report("b")},  # cycle 1: both shed from a
        {"a": _report("a"), "b": _report("b", x=x)},  # x transferred at cycle 1
        {"a": _report("a"), "b": _report("b", x=x), "c": _report("c", y=y_later)},
    ]
    # A transfer of x at cycle 1; y unloaded at cycle 1 and placed by the lookup of cycle 3.
    moves = [Move(1, "x", "a", "b", "transfer", False), Move(3, "y", "a", "c", "unload", False)]
    run = _run(moves, reports=reports)
    s = score_run(run, PAIRS["ours"], set(), tick_seconds=60.0)
    # (4 MB/s + 1 MB/s) x 60 s = 300 MB; clients 7 + 2.
    assert s.bytes_moved_gb == 0.3
    assert s.connections_disturbed == 9
    s = score_run(run, PAIRS["ours"], set(), tick_seconds=120.0)
    assert s.bytes_moved_gb == 0.6
    assert score_run(_run(moves), PAIRS["ours"], set()).bytes_moved_gb is None  # no reports


def test_max_moves_of_one_bundle_counts_inside_60_cycles_and_skips_displaced_bundles() -> None:
    def moved(bundle: str, *cycles: int) -> list[Move]:
        return [Move(c, bundle, "a", "b", "transfer", False) for c in cycles]

    # x: 0, 10, 60, 65 -> cycles 10..69 hold three; y twice; d (displaced) five times.
    moves = moved("x", 0, 10, 60, 65) + moved("y", 3, 4) + moved("d", 1, 2, 3, 4, 5)
    assert max_moves_in_window(moves, {"d"}) == 3
    assert max_moves_in_window(moves, set()) == 5
    assert max_moves_in_window(moved("x", 0, 60, 120), set()) == 1  # 60 apart: two windows
    assert max_moves_in_window(moved("x", 0, 59), set()) == 2
    assert max_moves_in_window([], set()) == 0
    run = _run(moves, displaced={"d"})
    assert score_run(run, PAIRS["ours"], set()).max_moves_one_bundle_60 == 3


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
    moved = [r for r in doc["rows"] if r["moves"] > 0]
    assert moved, "a pair moved bundles in 15 cycles"
    for r in moved:
        assert r["bytes_moved_gb"] > 0 and r["connections_disturbed"] > 0
        assert r["max_moves_one_bundle_60"] >= 1
    assert len(row["series_max_pct"]) == 15
    md = paths["md"].read_text()
    assert md.startswith("| " + " | ".join(t for _, t in COLUMNS))
    assert md.count("\n| steady |") == 2
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sum(1 for line in to_markdown(scores).splitlines() if line.startswith("|---")) == 1


def test_cli_registers_bench_balance_and_simulate() -> None:
    import argparse

    from lbctl.bench_cmd import register as register_bench

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    register(sub)
    register_bench(sub)
    args = parser.parse_args(
        ["bench", "balance", "--scenarios", "steady,crash", "--cycles", "5", "--json"]
    )
    assert args.scenarios == ["steady", "crash"] and args.cycles == 5 and args.json
    assert not args.live
    args = parser.parse_args(["bench", "balance", "--live", "--cycle-seconds", "2"])
    assert args.live and args.cycle_seconds == 2.0 and args.trigger_seconds == 0.5
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


def test_bench_balance_plays_reports_a_cycle_late_when_asked(tmp_path: Path, capsys) -> None:
    """``--report-lag-cycles 1``: brokers report the ownership of the cycle before, as a paced
    live run's reports lag its decisions; each split of ``hot_bundle``'s chain then waits a
    cycle more for its children's first report, so the run balances later than with prompt
    reports, and the JSON says which lag it played."""
    from lbctl.main import main

    runs = {}
    for lag in (0, 1):
        argv = ["bench", "balance", "--scenarios", "hot_bundle", "--pairs", "ours", "--json"]
        argv += ["--workers", "1", "--out", str(tmp_path / str(lag))]
        argv += ["--report-lag-cycles", str(lag)]
        assert main(argv) == 0
        runs[lag] = json.loads(capsys.readouterr().out)
    assert [runs[lag]["meta"]["reportLagCycles"] for lag in (0, 1)] == [0, 1]
    prompt, late = runs[0]["rows"][0], runs[1]["rows"][0]
    assert late["balanced_after"] > prompt["balanced_after"]
    assert main(["bench", "balance", "--live", "--report-lag-cycles", "1"]) == 2
    assert "fast model only" in capsys.readouterr().err
