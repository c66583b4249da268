"""Pulsar's ``NamespaceBundlesTest`` and ``NamespaceBundleTest`` (``common/naming``), and the
partition and hash arithmetic of ``NamespaceBundleFactory``, restated on
``loadbalance.bundles``.

Pulsar's tests use v1 namespaces (``pulsar/global/ns1``, ``pulsar/use/ns1``); this model
accepts only ``tenant/namespace`` names plus the v1 heartbeat and SLA-monitor namespaces, so the
same scenarios run on ``pulsar/ns1`` and ``pulsar/ns2``. ``factory.splitBundles(bundle, n,
null)`` cuts a range into ``n`` segments of ``(upper - lower) / n``; that arithmetic is the
fixture here (``pulsar_split_points``), and ``NamespaceBundles.split`` applies the points.

Not ported: ``NamespaceBundleTest.testCompareTo`` (Pulsar refuses to compare overlapping
bundles; bundle ranges here are plain values ordered by namespace and bounds) and
``testGetBundle`` (a cache identity).
"""

from __future__ import annotations

import itertools

import pytest

from loadbalance.bundles import (
    FULL_LOWER,
    FULL_UPPER,
    BundleRange,
    NamespaceBundles,
    parse_bundle,
    topic_hash,
)
from loadbalance.errors import InvalidBundle
from loadbalance.split_algorithms import range_equally_divide

NS1 = "pulsar/ns1"
NS2 = "pulsar/ns2"
TOPIC1 = "persistent://pulsar/ns1/topic-1"


def pulsar_split_points(bundle: BundleRange, n: int) -> list[int]:
    """``NamespaceBundleFactory.splitBundles(target, n, null)``: ``n - 1`` inner partitions."""
    seg = (bundle.upper - bundle.lower) // n
    return [bundle.lower + i * seg for i in range(1, n)]


def split(bundles: NamespaceBundles, bundle: BundleRange, n: int) -> tuple[NamespaceBundles, list]:
    points = pulsar_split_points(bundle, n)
    after = bundles.split(bundle, points)
    children = [parse_bundle(c) for c in bundles.children_of_split(bundle, points)]
    return after, children


def assert_spans(parent: BundleRange, children: list[BundleRange]) -> None:
    """``validateSplitBundlesRange``: the children cover the parent exactly, in order."""
    assert children[0].lower == parent.lower and children[-1].upper == parent.upper
    assert all(a.upper == b.lower for a, b in itertools.pairwise(children))


def test_constructor() -> None:
    """NamespaceBundlesTest.testConstructor: partitions 0, 0x10000000, 0x40000000, 0xffffffff
    are three bundles, the last one closed at 0xffffffff."""
    bundles = NamespaceBundles("pulsar/ns2", (0, 0x10000000, 0x40000000, 0xFFFFFFFF))
    assert bundles.namespace == "pulsar/ns2" and len(bundles) == 3
    assert bundles.bundle_names == [
        "pulsar/ns2/0x00000000_0x10000000",
        "pulsar/ns2/0x10000000_0x40000000",
        "pulsar/ns2/0x40000000_0xffffffff",
    ]
    last = bundles.bundles[-1]
    assert last.contains_hash(0xFFFFFFFF) and not bundles.bundles[0].contains_hash(0x10000000)


PARTITIONS = (0, 0x40000000, 0xA0000000, 0xB0000000, 0xC0000000, 0xFFFFFFFF)


def test_find_bundle() -> None:
    """NamespaceBundlesTest.testFindBundle: a topic's bundle includes it; a topic of another
    namespace is refused; boundaries that do not cover the ring are refused (Pulsar builds them
    and fails the lookup with ``IndexOutOfBoundsException``; here construction refuses them)."""
    bundles = NamespaceBundles(NS1, PARTITIONS)
    bundle = bundles.find_bundle(TOPIC1)
    assert bundle.contains_hash(topic_hash(TOPIC1))
    assert sum(b.contains_hash(topic_hash(TOPIC1)) for b in bundles.bundles) == 1
    with pytest.raises(InvalidBundle):
        bundles.find_bundle("persistent://pulsar/ns2/topic-2")
    h = topic_hash("persistent://pulsar/ns2/topic-2")
    tail = sorted({p for p in PARTITIONS if p >= h} | {h})
    with pytest.raises(InvalidBundle):
        NamespaceBundles(NS2, tuple(tail[1:]))


def test_find_bundle_by_hash_at_boundaries() -> None:
    """``NamespaceBundles.findBundle``: lower bounds are closed, upper bounds open, except
    0xffffffff, which the last bundle holds."""
    bundles = NamespaceBundles(NS1, PARTITIONS)
    assert bundles.find_bundle_by_hash(0).range_name == "0x00000000_0x40000000"
    assert bundles.find_bundle_by_hash(0x3FFFFFFF).range_name == "0x00000000_0x40000000"
    assert bundles.find_bundle_by_hash(0x40000000).range_name == "0x40000000_0xa0000000"
    assert bundles.find_bundle_by_hash(0xFFFFFFFF).range_name == "0xc0000000_0xffffffff"


def test_split_bundles() -> None:
    """NamespaceBundlesTest.testSplitBundles: the full bundle in 4, then the first child in 4,
    then the second child in 3; each split leaves ``bundles + n - 1`` bundles and children that
    span their parent."""
    bundles = NamespaceBundles.initial(NS1, 1)
    bundle = bundles.find_bundle(TOPIC1)
    bundles2, children = split(bundles, bundle, 4)
    assert len(bundles2) == len(bundles) + 4 - 1
    assert_spans(bundle, children)
    assert bundles2.version == bundles.version + 1

    child = bundles2.bundles[0]
    bundles3, grandchildren = split(bundles2, child, 4)
    assert len(bundles3) == len(bundles2) + 4 - 1
    assert_spans(child, grandchildren)

    child2 = bundles2.bundles[1]
    bundles4, grandchildren2 = split(bundles2, child2, 3)
    assert len(bundles4) == len(bundles2) + 3 - 1
    assert_spans(child2, grandchildren2)


def assert_divide_in_two(bundle: BundleRange, children: list[BundleRange]) -> None:
    """``assertBundleDivideInTwo``"""
    middle = (bundle.upper - bundle.lower) // 2 + bundle.lower
    assert [c.range_name for c in children] == [
        f"0x{bundle.lower:08x}_0x{middle:08x}",
        f"0x{middle:08x}_0x{bundle.upper:08x}",
    ]


def halve(bundles: NamespaceBundles, bundle: BundleRange) -> tuple[NamespaceBundles, list]:
    points = range_equally_divide(bundle)
    children = [parse_bundle(c) for c in bundles.children_of_split(bundle, points)]
    return bundles.split(bundle, points), children


def test_split_bundle_in_two() -> None:
    """NamespaceBundlesTest.testSplitBundleInTwo: halving three levels deep gives Pulsar's
    ranges (``0x00000000_0x7fffffff``, ``0x7fffffff_0xffffffff``, then ``...0x3fffffff``,
    ``...0xbfffffff``, ``...0x1fffffff``, ``...0xdfffffff``)."""
    bundles = NamespaceBundles.initial(NS1, 1)
    bundle = bundles.find_bundle(TOPIC1)
    level1, halves = halve(bundles, bundle)
    assert_divide_in_two(bundle, halves)
    assert [h.range_name for h in halves] == ["0x00000000_0x7fffffff", "0x7fffffff_0xffffffff"]
    for half in halves:
        level2, quarters = halve(level1, half)
        assert_divide_in_two(half, quarters)
        for quarter in quarters:
            _, eighths = halve(level2, quarter)
            assert_divide_in_two(quarter, eighths)
    names = {c.range_name for h in halves for c in halve(level1, h)[1]}
    assert names == {
        "0x00000000_0x3fffffff",
        "0x3fffffff_0x7fffffff",
        "0x7fffffff_0xbfffffff",
        "0xbfffffff_0xffffffff",
    }


def test_split_bundle_by_fix_boundary() -> None:
    """NamespaceBundlesTest.testSplitBundleByFixBoundary: a boundary at the bundle's lower or
    upper end is refused; ``lower + 10`` gives children ``[lower, lower+10)`` and
    ``[lower+10, upper)``."""
    bundles = NamespaceBundles.initial(NS1, 4)
    target = bundles.bundles[0]
    for bad in (target.lower, target.upper):
        with pytest.raises(InvalidBundle):
            bundles.split(target, [bad])
    fix = target.lower + 10
    after = bundles.split(target, [fix])
    children = [parse_bundle(c) for c in bundles.children_of_split(target, [fix])]
    assert [c.lower for c in children] == [target.lower, target.lower + fix]
    assert after.bundles[:2] == children


@pytest.mark.parametrize(
    ("n", "partitions"),
    [
        (1, [0, 0xFFFFFFFF]),
        (3, [0, 0x55555555, 0xAAAAAAAA, 0xFFFFFFFF]),
        (4, [0, 0x40000000, 0x80000000, 0xC0000000, 0xFFFFFFFF]),
        (16, [i * 0x10000000 for i in range(16)] + [0xFFFFFFFF]),
    ],
)
def test_factory_partitions(n: int, partitions: list[int]) -> None:
    """``NamespaceBundleFactory`` / ``Policies.getBundles(numBundles)``: ``2^32 / n`` segments,
    the last partition ``0xffffffff``."""
    assert list(NamespaceBundles.initial(NS1, n).boundaries) == partitions


def test_bundle_constructor() -> None:
    """NamespaceBundleTest.testConstructor: an empty or inverted range, or one past
    0xffffffff, is refused; ``[0, 1)`` is a bundle of its namespace."""
    for lower, upper in ((0, 0), (1, 1), (2, 1), (0, FULL_UPPER + 1)):
        with pytest.raises(InvalidBundle):
            BundleRange(NS1, lower, upper)
    bundle = BundleRange("pulsar/ns", 0, 1)
    assert (bundle.lower, bundle.upper, bundle.namespace) == (0, 1, "pulsar/ns")
    assert bundle.contains_hash(0) and not bundle.contains_hash(1)


def test_bundle_includes() -> None:
    """NamespaceBundleTest.testIncludes: ``[h / 2, 0xffffffff]`` includes the topic of hash
    ``h``; a range above it does not (Pulsar's one-hash ``[0xffffffff, 0xffffffff]`` is not a
    bundle here, so the range starts at ``h + 1``), nor does one ending at ``h`` (open upper
    bound); a topic of ``ns1`` is in no bundle of ``ns2``."""
    h = topic_hash(TOPIC1)
    assert 0 < h < FULL_UPPER
    assert BundleRange(NS1, h // 2, FULL_UPPER).contains_hash(h)
    assert not BundleRange(NS1, h + 1, FULL_UPPER).contains_hash(h)
    assert not BundleRange(NS1, 0, h).contains_hash(h)
    other = NamespaceBundles(NS2, (FULL_LOWER, 0x40000000, FULL_UPPER))
    with pytest.raises(InvalidBundle):
        other.find_bundle(TOPIC1)


def test_bundle_to_string() -> None:
    """NamespaceBundleTest.testToString"""
    assert str(BundleRange(NS1, 0, 0x10000000)) == "pulsar/ns1/0x00000000_0x10000000"
    assert BundleRange(NS1, 0x10000000, FULL_UPPER).name == "pulsar/ns1/0x10000000_0xffffffff"


def test_bundle_equals() -> None:
    """NamespaceBundleTest.testEquals"""
    bundle = BundleRange(NS1, 0, 0x40000000)
    assert bundle != BundleRange(NS1, 0x20000000, 0x40000000)
    assert bundle == BundleRange(NS1, 0, 0x40000000)
    assert bundle != BundleRange(NS2, 0, 0x40000000)
    assert parse_bundle("pulsar/ns1/0x00000000_0x40000000") == bundle
    # Pulsar's names may carry upper-case hex (``0xFFFFFFFF``); the parsed bundle is the same.
    full = BundleRange(NS1, 0, FULL_UPPER)
    assert parse_bundle("pulsar/ns1/0x00000000_0xFFFFFFFF") == full
    assert full.name == "pulsar/ns1/0x00000000_0xffffffff"
