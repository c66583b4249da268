"""bench_optimum's episodes: runs of cycles above the band on one fleet.

The optimum of an episode is solved at its first cycle, on the brokers that cycle had. A broker
that joins later is never filled by that optimum, so an episode running across a join would
charge ours with the join's rebalance against an optimum that had none: the episode ends where
the fleet changes, and the next one is judged against its own optimum.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from bench_optimum import OPTIMAL, Row, _episodes


def _row(cycle: int, ours: int, optimum: int, fleet: int) -> Row:
    return Row(
        scenario="s", cycle=cycle, brokers=3, bundles=9, ratio=1.3, needed=True, ours=ours,
        ours_after=None, optimum=optimum, optimum_lower=optimum, status=OPTIMAL, solve_s=0.0,
        optimum_bytes_per_s=0.0, ours_bytes_per_s=0.0, fleet=fleet,
    )  # fmt: skip


def test_a_join_ends_an_episode_and_the_next_is_judged_on_its_own_optimum() -> None:
    rows = [_row(5, 2, 2, fleet=1), _row(6, 0, 0, fleet=1), _row(7, 4, 4, fleet=2)]
    episodes = _episodes(rows)
    assert [[r.cycle for r in e] for e in episodes] == [[5, 6], [7]]
    assert [(sum(r.ours for r in e), e[0].optimum_lower) for e in episodes] == [(2, 2), (4, 4)]


def test_one_fleet_keeps_one_episode_across_cycles_in_which_ours_waited() -> None:
    rows = [_row(5, 2, 3, fleet=1), _row(6, 0, 0, fleet=1), _row(7, 1, 1, fleet=1)]
    assert [[r.cycle for r in e] for e in _episodes(rows)] == [[5, 6, 7]]
