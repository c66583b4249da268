"""Bundle split algorithms, one function each, named as Pulsar names them.

Mirrors ``org.apache.pulsar.common.naming.*BundleSplitAlgorithm``:

* ``range_equally_divide``: ``lower + (upper - lower) / 2`` (integer division).
* ``topic_count_equally_divide``: sort the topics' hashes; the boundary is the midpoint between the
  hashes at ``n/2 - 1`` and ``n/2``. Needs at least two topics.
* ``specified_positions_divide``: the operator's positions that lie strictly inside the range.
* ``flow_or_qps_equally_divide`` (PIP-169): only when the bundle's rate or throughput exceeds the
  maximum by ``flowOrQpsDifferenceThresholdPercentage``; walk topics in hash order and cut at
  ``prev + (cur - prev) / 2 + 1`` whenever the running sum would pass the maximum. It may return
  several boundaries.

Every function returns a sorted list of boundaries strictly inside the range (possibly empty,
meaning "no split"), so the result can go straight to ``NamespaceBundles.split``.

Deliberate differences (``tests/conformance/test_split_algorithms.py`` ports Pulsar's tests):

* Pulsar returns ``null`` for "no split"; we return ``[]``, and we drop any boundary that would
  not lie strictly inside the range (``topic_count`` with equal middle hashes, or ``flow_or_qps``,
  could produce one, and ``NamespaceBundles.split`` would refuse it).
* ``specified_positions_divide`` with no positions returns ``[]`` where Pulsar throws
  ``IllegalArgumentException``; the admin split refuses an empty result naming
  ``splitBoundaries``, and the split policy records a ``NoBoundary`` skip instead of failing.
* ``specified_positions_divide`` does not look at the bundle's topics (Pulsar gives no split for
  a bundle with at most one topic): the operator's explicit cut is honoured, and the automatic
  split policy never considers a bundle with fewer than two topics anyway.
* An unknown algorithm name is refused (``InvalidInput``) where ``NamespaceBundleSplitAlgorithm.of``
  returns ``null``; the configuration validates the name before any split is asked for.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from loadbalance.bundles import BundleRange
from loadbalance.errors import InvalidInput

RANGE_EQUALLY_DIVIDE = "range_equally_divide"
TOPIC_COUNT_EQUALLY_DIVIDE = "topic_count_equally_divide"
SPECIFIED_POSITIONS_DIVIDE = "specified_positions_divide"
FLOW_OR_QPS_EQUALLY_DIVIDE = "flow_or_qps_equally_divide"
ALL_ALGORITHMS = (
    RANGE_EQUALLY_DIVIDE,
    TOPIC_COUNT_EQUALLY_DIVIDE,
    SPECIFIED_POSITIONS_DIVIDE,
    FLOW_OR_QPS_EQUALLY_DIVIDE,
)

MBYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class TopicLoad:
    """What ``flow_or_qps_equally_divide`` needs to know about one topic."""

    hash: int
    msg_rate: float
    throughput: float


def _inside(bundle: BundleRange, points: Iterable[int]) -> list[int]:
    return sorted({p for p in points if bundle.lower < p < bundle.upper})


def range_equally_divide(bundle: BundleRange) -> list[int]:
    if not bundle.can_split():
        return []
    return [bundle.lower + (bundle.upper - bundle.lower) // 2]


def topic_count_equally_divide(bundle: BundleRange, topic_hashes: Iterable[int]) -> list[int]:
    hashes = sorted(topic_hashes)
    if len(hashes) <= 1:
        return []
    start = hashes[max(len(hashes) // 2 - 1, 0)]
    end = hashes[len(hashes) // 2]
    return _inside(bundle, [start + (end - start) // 2])


def specified_positions_divide(bundle: BundleRange, positions: Iterable[int]) -> list[int]:
    return _inside(bundle, positions)


def flow_or_qps_equally_divide(
    bundle: BundleRange,
    topics: Iterable[TopicLoad],
    *,
    max_msg_rate: float,
    max_bandwidth_mbytes: float,
    difference_threshold_percentage: float,
) -> list[int]:
    max_bytes = max_bandwidth_mbytes * MBYTES
    diff = difference_threshold_percentage / 100.0
    by_hash: dict[int, TopicLoad] = {}
    for t in topics:
        if t.msg_rate <= 0 and t.throughput <= 0:
            continue
        by_hash[t.hash] = t
    rate = sum(t.msg_rate for t in by_hash.values())
    thr = sum(t.throughput for t in by_hash.values())
    if len(by_hash) < 2 or (rate < max_msg_rate * (1 + diff) and thr < max_bytes * (1 + diff)):
        return []
    hashes = sorted(by_hash)
    run_rate, run_thr = by_hash[hashes[0]].msg_rate, by_hash[hashes[0]].throughput
    cuts: list[int] = []
    for prev, cur in itertools.pairwise(hashes):
        t = by_hash[cur]
        if (
            run_rate > max_msg_rate
            or run_thr > max_bytes
            or run_rate + t.msg_rate > max_msg_rate
            or run_thr + t.throughput > max_bytes
        ):
            cuts.append(prev + (cur - prev) // 2 + 1)
            run_rate, run_thr = t.msg_rate, t.throughput
        else:
            run_rate += t.msg_rate
            run_thr += t.throughput
    return _inside(bundle, cuts)


def split_boundaries(
    algorithm: str,
    bundle: BundleRange,
    *,
    topic_hashes: Iterable[int] = (),
    positions: Iterable[int] = (),
    topic_loads: Iterable[TopicLoad] = (),
    knobs: Mapping[str, float] | None = None,
) -> list[int]:
    """Dispatch by Pulsar's algorithm name; ``knobs`` carries the flow_or_qps maxima."""
    if algorithm == RANGE_EQUALLY_DIVIDE:
        return range_equally_divide(bundle)
    if algorithm == TOPIC_COUNT_EQUALLY_DIVIDE:
        return topic_count_equally_divide(bundle, topic_hashes)
    if algorithm == SPECIFIED_POSITIONS_DIVIDE:
        return specified_positions_divide(bundle, positions)
    if algorithm == FLOW_OR_QPS_EQUALLY_DIVIDE:
        k = dict(knobs or {})
        return flow_or_qps_equally_divide(
            bundle,
            topic_loads,
            max_msg_rate=float(k.get("max_msg_rate", 30000)),
            max_bandwidth_mbytes=float(k.get("max_bandwidth_mbytes", 100)),
            difference_threshold_percentage=float(k.get("difference_threshold_percentage", 10)),
        )
    raise InvalidInput("splitAlgorithm", f"unknown split algorithm {algorithm!r}")
