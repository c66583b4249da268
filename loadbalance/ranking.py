"""Ordering many bundles by a float and then by name, in numpy, as Python's sort of tuples does.

The shedders rank a broker's bundles by a metric with ties going to the bundle name, so that a
replay picks the same bundles. At a million bundles a shedding broker holds thousands of them
and Python's sort of ``(value, name)`` tuples is a visible part of a cycle; the same order
comes from one stable ``argsort`` of the values and a name sort of each run of equal values.
The values must not be NaN (a NaN has no place in either order; callers rank those the Python
way). As in the tuples' comparison, 0.0 and -0.0 are equal and go by name.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def order_by_value_then_name(
    values: np.ndarray, names: Sequence[str], *, descending: bool = False
) -> list[int]:
    """Positions of ``values`` (float64, no NaN) in the order of ``sorted(zip(values, names))``,
    or with ``descending`` of ``sorted(zip(-values, names))``: by value, ties by name."""
    keys = -values if descending else values
    order = np.argsort(keys, kind="stable")
    ranked = keys[order]
    positions: list[int] = order.tolist()
    ties = np.flatnonzero(ranked[1:] == ranked[:-1]).tolist()
    at = 0
    while at < len(ties):
        start = end = ties[at]
        while at + 1 < len(ties) and ties[at + 1] == end + 1:
            at += 1
            end += 1
        positions[start : end + 2] = sorted(positions[start : end + 2], key=names.__getitem__)
        at += 1
    return positions
