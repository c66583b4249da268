"""ProjectedUsageShedder judges a plan on the mean it ends at, not only the mean it starts from.

Work moved onto a strong broker costs it less usage than it cost the weak source, so the
cluster's mean usage falls with every such move, and every broker not moved lifts against it:
a plan that aims at the band on the mean it starts from leaves brokers above the band on the
mean it ends at, and sheds them again at its end or in the next cycle."""

from __future__ import annotations

import pytest

import loadbalance.strategies.projected_usage_shedder as shedder_module
from tests.unit.test_sim_strategies import BUNDLES, broker, loads_after, shed, view_of

BAND = 1.10


def _max_over_mean(loads: dict[str, float]) -> float:
    return max(loads.values()) / (sum(loads.values()) / len(loads))


def test_two_hot_weak_brokers_side_by_side_are_both_shed() -> None:
    """``weak1`` 0.80 and ``weak2`` 0.796 (2 cores each) over a mean of 0.52: a move off either
    onto ``strong`` (32 cores) lowers the mean, so the other one's max/mean rises for a moment.
    That is no reason to stop: the other is the plan's next source. Both are shed, and the
    cluster ends inside the band."""
    view = view_of(
        broker("weak1", 2, {b: 2_000.0 for b in BUNDLES[0:8]}),
        broker("weak2", 2, {b: 1_990.0 for b in BUNDLES[8:16]}),
        broker("strong", 32, {b: 8_000.0 for b in BUNDLES[16:24]}),
        broker("mid1", 8, {b: 4_000.0 for b in BUNDLES[24:32]}),
        broker("mid2", 8, {b: 4_000.0 for b in BUNDLES[32:40]}),
    )
    assert _max_over_mean(loads_after(view, ())) > 1.5
    _, res = shed(view)
    assert {"weak1", "weak2"} <= {d.source_broker for d in res.decisions}
    assert _max_over_mean(loads_after(view, res.decisions)) <= BAND


def _fleet() -> object:
    """Two 2-core brokers, a 4-core, two 8-core and a 32-core, bundles 10 % apart in size."""
    spec = [(2, 7, 4_000.0), (2, 3, 2_000.0), (4, 3, 4_000.0), (8, 4, 1_000.0), (8, 8, 2_000.0)]
    spec.append((32, 6, 4_000.0))
    brokers, k = [], 0
    for i, (cores, n, rate) in enumerate(spec):
        bundles = {BUNDLES[k + j]: rate * (1 + 0.1 * j) for j in range(n)}
        brokers.append(broker(f"b{i}", cores, bundles))
        k += n
    return view_of(*brokers)


def test_a_plan_replanned_on_its_end_mean_balances_in_fewer_moves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Planned once on the starting mean, the plan fills the middle brokers to the band, the
    mean then falls below what they were filled for, and the plan spends its whole budget
    (12 moves) shedding them on without reaching the band. Planned again with the band taken
    on the mean the first pass ended at, it balances in fewer moves."""
    view = _fleet()
    monkeypatch.setattr(shedder_module, "PLAN_PASSES", 1)
    _, once = shed(view)
    monkeypatch.undo()
    _, replanned = shed(view)
    assert len(once.decisions) == 12, "one pass runs out of its budget"
    assert _max_over_mean(loads_after(view, once.decisions)) > BAND
    assert _max_over_mean(loads_after(view, replanned.decisions)) <= BAND
    assert len(replanned.decisions) < len(once.decisions)


def test_where_one_pass_balances_more_passes_plan_the_same_moves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where one pass already balances, the extra passes change nothing: the plan with more
    passes allowed is the same plan."""
    view = view_of(
        broker("hot", 8, {b: 4_000.0 for b in BUNDLES[0:16]}),
        broker("a", 8, {b: 4_000.0 for b in BUNDLES[16:26]}),
        broker("b", 8, {b: 4_000.0 for b in BUNDLES[26:34]}),
    )
    monkeypatch.setattr(shedder_module, "PLAN_PASSES", 1)
    _, once = shed(view)
    monkeypatch.undo()
    _, replanned = shed(view)
    assert once.decisions
    assert [(d.bundle, d.destination_broker) for d in replanned.decisions] == [
        (d.bundle, d.destination_broker) for d in once.decisions
    ]
