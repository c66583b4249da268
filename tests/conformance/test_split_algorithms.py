"""Pulsar's bundle split algorithm tests (``common/naming``) restated on this model:
``NamespaceBundleSplitAlgorithmTest``, ``RangeEquallyDivideBundleSplitAlgorithmTest``,
``TopicCountEquallyDivideBundleSplitAlgorithmTest``, ``SpecifiedPositionsBundleSplitAlgorithmTest``
and ``FlowOrQpsEquallyDivideBundleSplitAlgorithmTest``.

Pulsar's algorithms ask the namespace service for the bundle's topics and hash them with the
bundle factory (Guava ``crc32`` of the name, UTF-8, ``padToLong``); here the caller passes the
hashes (``topic_hashes``) or per-topic loads (``TopicLoad``), and ``zlib.crc32`` is that hash.
Pulsar returns ``null`` for "no split"; here it is ``[]``.
"""

from __future__ import annotations

import itertools
import zlib

import pytest

from loadbalance.bundles import FULL_LOWER, FULL_UPPER, BundleRange, topic_hash
from loadbalance.errors import InvalidInput
from loadbalance.split_algorithms import (
    FLOW_OR_QPS_EQUALLY_DIVIDE,
    MBYTES,
    RANGE_EQUALLY_DIVIDE,
    SPECIFIED_POSITIONS_DIVIDE,
    TOPIC_COUNT_EQUALLY_DIVIDE,
    TopicLoad,
    flow_or_qps_equally_divide,
    range_equally_divide,
    specified_positions_divide,
    split_boundaries,
    topic_count_equally_divide,
)

FULL = BundleRange("pulsar/system", FULL_LOWER, FULL_UPPER)


def crc32(name: str) -> int:
    """``Hashing.crc32().hashString(name, UTF_8).padToLong()``"""
    return zlib.crc32(name.encode("utf-8"))


def test_of_method_return_correct_value() -> None:
    """NamespaceBundleSplitAlgorithmTest.testOfMethodReturnCorrectValue: each name gives its
    algorithm; an unknown name is refused (Pulsar: ``of`` returns ``null``)."""
    bundle = BundleRange("t/ns", 0, 0x8000)
    assert split_boundaries(RANGE_EQUALLY_DIVIDE, bundle) == [0x4000]
    assert split_boundaries(TOPIC_COUNT_EQUALLY_DIVIDE, bundle, topic_hashes=[0x10, 0x30]) == [0x20]
    assert split_boundaries(SPECIFIED_POSITIONS_DIVIDE, bundle, positions=[0x100]) == [0x100]
    loads = [TopicLoad(0x100, 20000.0, 0.0), TopicLoad(0x200, 20000.0, 0.0)]
    assert split_boundaries(FLOW_OR_QPS_EQUALLY_DIVIDE, bundle, topic_loads=loads) == [0x181]
    for name in ("whatever", "", "RANGE_EQUALLY_DIVIDE"):
        with pytest.raises(InvalidInput):
            split_boundaries(name, bundle)


def test_range_equally_divide_get_split_boundary() -> None:
    """RangeEquallyDivideBundleSplitAlgorithmTest.testGetSplitBoundaryMethodReturnCorrectResult:
    ``[10, 0xffffffff]`` splits at ``10 + (0xffffffff - 10) / 2``."""
    lower = 10
    assert range_equally_divide(BundleRange("pulsar/system", lower, FULL_UPPER)) == [
        lower + (FULL_UPPER - lower) // 2
    ]
    assert range_equally_divide(BundleRange("t/ns", 7, 8)) == []  # canSplitBundle: too narrow


def test_topic_count_topics_size_less_than_1() -> None:
    """TopicCountEquallyDivideBundleSplitAlgorithmTest.testTopicsSizeLessThan1: one topic, no
    split."""
    assert topic_count_equally_divide(FULL, [crc32("a")]) == []
    assert topic_count_equally_divide(FULL, []) == []


def test_topic_count_algorithm_return_correct_result() -> None:
    """TopicCountEquallyDivideBundleSplitAlgorithmTest.testAlgorithmReturnCorrectResult: topics
    ``a, b, c`` hashed with crc32; the boundary is the midpoint of the middle two hashes."""
    hashes = sorted(crc32(t) for t in ("a", "b", "c"))
    assert hashes == [0x06B9DF6F, 0x71BEEFF9, 0xE8B7BE43]  # crc32 of c, b, a
    start, end = hashes[max(len(hashes) // 2 - 1, 0)], hashes[len(hashes) // 2]
    assert topic_count_equally_divide(FULL, hashes) == [start + (end - start) // 2]
    assert topic_count_equally_divide(FULL, hashes) == [0x3C3C67B4]


def test_topic_hash_is_crc32_of_the_full_topic_name() -> None:
    """NamespaceBundleFactory.getLongHashCode on ``TopicName.toString()``: a short name is
    hashed in its full ``persistent://public/default/`` form."""
    name = "persistent://test-tenant1/test-namespace1/test1-partition-0"
    assert topic_hash(name) == crc32(name)
    assert topic_hash("a") == crc32("persistent://public/default/a") != crc32("a")


def test_specified_positions_algorithm_return_correct_result() -> None:
    """SpecifiedPositionsBundleSplitAlgorithmTest.testAlgorithmReturnCorrectResult: of
    ``-1, 0, 1, 100, 200, 500, 800, 1000, 1100`` only the positions strictly inside
    ``[1, 1000)`` are kept."""
    bundle = BundleRange("t/ns", 1, 1000)
    positions = [-1, 0, 1, 100, 200, 500, 800, 1000, 1100]
    assert specified_positions_divide(bundle, positions) == [100, 200, 500, 800]


def test_specified_positions_less_than_1() -> None:
    """SpecifiedPositionsBundleSplitAlgorithmTest.testSpecifiedPositionsLessThan1: no positions
    is no split. Pulsar throws ``IllegalArgumentException``; here the result is empty and the
    admin split (``lbctl split-bundle``) refuses it naming ``splitBoundaries``."""
    bundle = BundleRange("t/ns", 1, 1000)
    assert specified_positions_divide(bundle, []) == []
    assert specified_positions_divide(bundle, [0, 1, 1000]) == []  # none strictly inside


def topic_load(name: str, rate_in: float, thr_in: float, rate_out: float, thr_out: float):
    return TopicLoad(crc32(name), rate_in + rate_out, thr_in + thr_out)


def test_split_bundle_by_flow_or_qps() -> None:
    """FlowOrQpsEquallyDivideBundleSplitAlgorithmTest.testSplitBundleByFlowOrQps: 261 partitions
    (100 at 49.5 msg/s, 140 at 50.5, one at 60); every piece between two boundaries stays under
    1010 msg/s and 100 MB/s."""
    loads: list[TopicLoad] = []
    for i in range(1, 6):
        for j in range(20):
            name = f"persistent://test-tenant1/test-namespace1/test{i}-partition-{j}"
            loads.append(topic_load(name, 24.5, 1000, 25, 1000))
    for i in range(6, 13):
        for j in range(20):
            name = f"persistent://test-tenant1/test-namespace1/test{i}-partition-{j}"
            loads.append(topic_load(name, 25.5, 1000, 25, 1000))
    loads.append(
        topic_load(
            "persistent://test-tenant1/test-namespace1/test695-partition-0", 25, 1000, 35, 1000
        )
    )
    cuts = flow_or_qps_equally_divide(
        FULL,
        loads,
        max_msg_rate=1010,
        max_bandwidth_mbytes=100,
        difference_threshold_percentage=10,
    )
    total = sum(t.msg_rate for t in loads)
    assert len(cuts) >= total // 1010  # ~13,000 msg/s needs at least 12 cuts
    by_hash = sorted(loads, key=lambda t: t.hash)
    edges = [FULL_LOWER, *cuts, FULL_UPPER + 1]
    for lo, hi in itertools.pairwise(edges):
        piece = [t for t in by_hash if lo <= t.hash < hi]
        assert piece, "every piece holds a topic"
        assert sum(t.msg_rate for t in piece) < 1010
        assert sum(t.throughput for t in piece) < 100 * MBYTES


def test_first_position_is_over_load() -> None:
    """FlowOrQpsEquallyDivideBundleSplitAlgorithmTest.testFirstPositionIsOverLoad: the topic with
    the smallest hash alone carries 2000 msg/s; the first boundary falls right after it, at
    ``h0 + (h1 - h0) / 2 + 1``."""
    names = [f"persistent://test-tenant1/test-namespace1/test-partition-{i}" for i in range(5)]
    hashes = sorted(crc32(n) for n in names)
    loads = [TopicLoad(hashes[0], 2000.0, 2000.0)]
    loads += [TopicLoad(h, 49.5, 2000.0) for h in hashes[1:]]
    cuts = flow_or_qps_equally_divide(
        FULL, loads, max_msg_rate=1010, max_bandwidth_mbytes=100, difference_threshold_percentage=10
    )
    assert cuts[0] == hashes[0] + (hashes[1] - hashes[0]) // 2 + 1


def test_flow_or_qps_below_the_difference_threshold_does_not_split() -> None:
    """FlowOrQpsEquallyDivideBundleSplitAlgorithm: a bundle less than
    ``flowOrQpsDifferenceThresholdPercentage`` over both maxima is not split, and empty topics
    are left out (fewer than two loaded topics: no split)."""
    loads = [TopicLoad(0x1000, 550.0, 0.0), TopicLoad(0x2000, 550.0, 0.0)]  # 1100 < 1010 * 1.1
    kwargs = {"max_msg_rate": 1010, "max_bandwidth_mbytes": 100}
    assert (
        flow_or_qps_equally_divide(FULL, loads, **kwargs, difference_threshold_percentage=10) == []
    )
    assert flow_or_qps_equally_divide(FULL, loads, **kwargs, difference_threshold_percentage=5) == [
        0x1801
    ]
    lonely = [TopicLoad(0x1000, 5000.0, 0.0), TopicLoad(0x2000, 0.0, 0.0)]
    assert (
        flow_or_qps_equally_divide(FULL, lonely, **kwargs, difference_threshold_percentage=0) == []
    )
