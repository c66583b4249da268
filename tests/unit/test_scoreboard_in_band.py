"""The scoreboard's in-band moves: moves decided while the cluster was already within the band
(target 0), counted per cycle from the decisions' times, and 0 for our pair on a fast run."""

from __future__ import annotations

from loadbalance.decisions import SPLIT, TRANSFER, UNLOAD, make_decision
from producers.scoreboard import BALANCE_RATIO, in_band_moves, run_one

B = "t/ns/0x00000000_0x80000000"
MIN = 60_000


def _d(kind: str, at_ms: int):
    dest = "b" if kind == TRANSFER else None
    bounds = (0x40000000,) if kind == SPLIT else ()
    return make_decision(cycle="c", kind=kind, bundle=B, source_broker="a",
                         destination_broker=dest, split_boundaries=bounds,
                         decided_at_ms=at_ms)  # fmt: skip


def test_moves_are_counted_in_the_cycles_inside_the_band_only() -> None:
    ratios = [1.5, BALANCE_RATIO, 1.02, 1.2]
    decisions = [
        _d(TRANSFER, 0),  # above the band: needed
        _d(TRANSFER, MIN),  # at the band: inside
        _d(UNLOAD, 2 * MIN + 5),  # inside
        _d(SPLIT, 2 * MIN),  # a split is not a move
        _d(TRANSFER, 3 * MIN),  # above
    ]
    assert in_band_moves(decisions, ratios, MIN) == 2


def test_our_pair_makes_no_move_inside_the_band_on_steady() -> None:
    score = run_one("steady", "ours", 0, None)
    assert score.moves > 0 and score.in_band_moves == 0
