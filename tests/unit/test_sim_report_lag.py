"""The fast model with lagging reports (``FastSim(report_lag_cycles=...)``): brokers report the
ownership of two cycles ago, as a live broker may for minutes after a move. The cycle's in-flight
moves keep our pair from moving the same load again while the reports catch up."""

from __future__ import annotations

from producers.fast_sim import FastSim, make_config
from producers.scenarios import load_scenario
from producers.scoreboard import PAIRS, max_moves_in_window

LAG = 2


def _run(lag: int):
    scenario = load_scenario("heterogeneous", 0)
    config = make_config(scenario, PAIRS["ours"].overrides)
    return FastSim(scenario, config, seed=0, report_lag_cycles=lag).run(60)


def test_lagging_reports_cost_no_extra_moves() -> None:
    prompt, lagging = _run(0), _run(LAG)
    assert prompt.moves and lagging.moves
    assert len(lagging.moves) <= len(prompt.moves) + 3, (len(lagging.moves), len(prompt.moves))
    assert max_moves_in_window(lagging.moves, set()) <= 1
    assert lagging.outcomes.get("stale", 0) == 0, lagging.outcomes


def test_reports_lag_by_the_cycles_asked_for() -> None:
    """A transfer applied at the end of cycle 0 shows in the reports of cycle 1 + LAG."""
    scenario = load_scenario("heterogeneous", 0)
    config = make_config(scenario, PAIRS["ours"].overrides)
    sim = FastSim(scenario, config, keep_reports=True, report_lag_cycles=LAG)
    run = sim.run(LAG + 2)
    first = [m for m in run.moves if m.cycle == 0]
    assert first
    for m in first:
        for c in range(1, LAG + 1):
            assert m.bundle in run.reports[c][m.source].bundles, (m, c)
        assert m.bundle in run.reports[LAG + 1][m.destination].bundles
