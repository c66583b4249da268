"""Ranking many bundles by a figure in numpy gives Python's order of (figure, name) tuples.

``loadbalance.ranking.order_by_value_then_name`` is what the shedders rank a broker's bundles
with when a view offers its figures as columns, and ProjectedUsageShedder's candidate list
(``_Candidates``) searches and removes by (work, name) keys: both must agree with the list
operations they replace, on ties, on 0.0 beside -0.0 and on infinities.
"""

from __future__ import annotations

import bisect

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from loadbalance.model import NamespaceBundleStats
from loadbalance.ranking import order_by_value_then_name
from loadbalance.strategies.shed_candidates import Candidate as _Candidate
from loadbalance.strategies.shed_candidates import Candidates as _Candidates

_VALUES = st.lists(
    st.sampled_from([0.0, -0.0, 1.0, 2.5, 1e300, float("inf"), -float("inf"), -3.0]),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(values=_VALUES, data=st.data())
def test_the_order_is_pythons_sort_of_tuples(values, data) -> None:
    names = data.draw(st.permutations([f"t/ns/{i:03d}" for i in range(len(values))]))
    arr = np.array(values, dtype=np.float64)
    up = order_by_value_then_name(arr, names)
    assert [(values[i], names[i]) for i in up] == sorted(zip(values, names, strict=True))
    down = order_by_value_then_name(arr, names, descending=True)
    want = sorted((-v, n) for v, n in zip(values, names, strict=True))
    assert [(-values[i], names[i]) for i in down] == want


@settings(max_examples=300, deadline=None)
@given(
    works=st.lists(st.sampled_from([0.5, 1.0, 1.0, 2.0, 3.0, float("inf")]), max_size=30),
    probe=st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, float("inf"), float("nan")]),
    drop=st.integers(0, 29),
)
def test_candidates_search_and_remove_as_a_sorted_list_does(works, probe, drop) -> None:
    keys = sorted((w, f"b{i:02d}") for i, w in enumerate(works))
    stats = {b: NamespaceBundleStats(msg_rate_in=w) for w, b in keys}
    cands = _Candidates(list(keys), stats.__getitem__)
    plain = [_Candidate(w, b, stats[b]) for w, b in keys]
    assert cands.first_at_least(probe) == bisect.bisect_left(plain, probe, key=lambda c: c.work)
    assert list(cands) == plain and len(cands) == len(plain)
    assert cands.window(max(0, drop - 3), drop + 5) == plain[max(0, drop - 3) : drop + 5]
    if plain:
        pick = plain[drop % len(plain)]
        cands.remove(pick)
        plain.remove(pick)
        assert list(cands) == plain
