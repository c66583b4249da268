"""ProjectedUsageShedder moves as few bundles as it can: never inside the balance band, and each
move judged on the whole cluster after it (``move_search``), not on one broker pair."""

from __future__ import annotations

from loadbalance.decisions import TRANSFER
from loadbalance.values import SkipReason
from tests.unit.test_sim_strategies import BUNDLES, broker, loads_after, shed, view_of


def _uneven_inside_the_band():
    """Max/mean 1.08 (``a`` 0.54 over a mean of 0.5) and ``d`` at 0.8 x mean: uneven, but
    inside the 1.10 band. Brokers of 8 cores, bundles of 4,000 msg/s (0.05)."""
    rates = {"a": 54_000.0, "b": 54_000.0, "c": 52_000.0, "d": 40_000.0}
    brokers = []
    for i, (name, total) in enumerate(rates.items()):
        n = int(total // 4_000)
        bundles = {BUNDLES[16 * i + k]: 4_000.0 for k in range(n)}
        bundles[BUNDLES[16 * i + n]] = total - 4_000.0 * n
        brokers.append(broker(name, 8, bundles))
    return view_of(*brokers)


def test_no_move_inside_the_band_however_short_of_the_target() -> None:
    view = _uneven_inside_the_band()
    loads = loads_after(view, ())
    mean = sum(loads.values()) / len(loads)
    assert 1.06 < max(loads.values()) / mean <= 1.10, "between the target and the band"
    _, res = shed(view)
    assert not res.decisions
    assert [s.reason for s in res.skips] == [SkipReason.BALANCED]


def test_above_the_band_it_acts_and_the_band_is_the_knob() -> None:
    """The same cluster under a 1.05 band is out of it: the shedder acts, and stops inside it."""
    view = _uneven_inside_the_band()
    _, res = shed(view, load_balancer_balanced_max_over_mean=1.05)
    assert res.decisions
    after = loads_after(view, res.decisions)
    assert max(after.values()) / (sum(after.values()) / len(after)) <= 1.05


def test_the_destination_is_chosen_on_the_whole_cluster_not_the_idlest_broker() -> None:
    """``s`` (8 cores) at 0.60 sheds; the idlest broker ``weak`` (2 cores, 0.30) would be pushed
    to 0.90 by any of its bundles, ``strong`` (32 cores, 0.35) takes one for 0.0375: every move
    goes to ``strong``, none to the idlest broker, and the cluster's max/mean falls."""
    view = view_of(
        broker("s", 8, {b: 12_000.0 for b in BUNDLES[:4]}),
        broker("weak", 2, {BUNDLES[10]: 6_000.0}),
        broker("strong", 32, {BUNDLES[11]: 112_000.0}),
        broker("x", 8, {BUNDLES[12]: 14_000.0, BUNDLES[13]: 14_000.0}),
    )
    _, res = shed(view)
    assert res.decisions
    assert {(d.kind, d.source_broker, d.destination_broker) for d in res.decisions} == {
        (TRANSFER, "s", "strong")
    }
    before, after = loads_after(view, ()), loads_after(view, res.decisions)
    ratio = {
        n: max(x.values()) / (sum(x.values()) / len(x)) for n, x in (("b", before), ("a", after))
    }
    assert ratio["a"] < ratio["b"]


def test_one_large_move_rather_than_several_small_ones() -> None:
    """``hot`` 0.60, ``a`` 0.50, ``b`` 0.40 (mean 0.50, target 0.53): one 8,000 msg/s bundle
    (0.10) settles ``hot`` where two 4,000s would too; the plan takes the single move."""
    hot = {BUNDLES[0]: 8_000.0} | {b: 4_000.0 for b in BUNDLES[1:9]} | {BUNDLES[9]: 8_000.0}
    view = view_of(
        broker("hot", 8, hot),
        broker("a", 8, {b: 4_000.0 for b in BUNDLES[20:30]}),
        broker("b", 8, {b: 4_000.0 for b in BUNDLES[30:38]}),
    )
    _, res = shed(view)
    assert [(d.bundle, d.destination_broker) for d in res.decisions] == [(BUNDLES[0], "b")]
