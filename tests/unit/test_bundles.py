"""Hash-ring bundles and split algorithms behave like Pulsar's, including its worked examples."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadbalance.bundles import (
    FULL_UPPER,
    BundleRange,
    NamespaceBundles,
    canonical_bundle_name,
    check_boundaries,
    normalize_topic,
    parse_bundle,
    topic_hash,
)
from loadbalance.errors import InvalidBundle, InvalidInput
from loadbalance.split_algorithms import (
    FLOW_OR_QPS_EQUALLY_DIVIDE,
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

NS = "public/default"


# --- worked examples of the source documents ---------------------------------------------------


def test_range_equally_divide_halves_the_range() -> None:
    assert range_equally_divide(BundleRange(NS, 0x0000, 0x8000)) == [0x4000]


def test_range_equally_divide_refuses_a_range_one_hash_wide() -> None:
    assert range_equally_divide(BundleRange(NS, 7, 8)) == []
    assert not BundleRange(NS, 7, 8).can_split()
    assert BundleRange(NS, 7, 9).can_split()


def test_topic_count_equally_divide_six_topic_example_cuts_at_0x12() -> None:
    hashes = [0x0025, 0x0000, 0x0010, 0x0005, 0x0020, 0x0015]  # order must not matter
    assert topic_count_equally_divide(BundleRange(NS, 0x0000, 0x8000), hashes) == [0x0012]


def test_topic_count_equally_divide_needs_two_topics() -> None:
    bundle = BundleRange(NS, 0, 0x8000)
    assert topic_count_equally_divide(bundle, []) == []
    assert topic_count_equally_divide(bundle, [0x10]) == []


def test_specified_positions_keep_only_points_strictly_inside() -> None:
    bundle = BundleRange(NS, 0x100, 0x200)
    assert specified_positions_divide(bundle, [0x100, 0x180, 0x150, 0x200, 0x300]) == [
        0x150,
        0x180,
    ]


def test_initial_four_bundles_match_pulsar_partitions() -> None:
    bundles = NamespaceBundles.initial(NS, 4)
    assert bundles.boundaries == (0, 0x40000000, 0x80000000, 0xC0000000, 0xFFFFFFFF)
    assert bundles.bundle_names == [
        "public/default/0x00000000_0x40000000",
        "public/default/0x40000000_0x80000000",
        "public/default/0x80000000_0xc0000000",
        "public/default/0xc0000000_0xffffffff",
    ]
    assert len(bundles) == 4 and bundles.version == 0


def test_short_topic_names_are_normalised_like_pulsar() -> None:
    assert normalize_topic("my-topic") == "persistent://public/default/my-topic"
    assert normalize_topic("t/ns/my-topic") == "persistent://t/ns/my-topic"
    full = "non-persistent://t/ns/x"
    assert normalize_topic(full) == full
    with pytest.raises(InvalidBundle):
        normalize_topic("ftp://t/ns/x")
    with pytest.raises(InvalidBundle):
        normalize_topic("t/ns")


def test_topic_maps_to_the_bundle_holding_its_crc32() -> None:
    expected = zlib.crc32(b"persistent://public/default/my-topic") & 0xFFFFFFFF
    assert topic_hash("my-topic") == expected
    bundles = NamespaceBundles.initial(NS, 4)
    found = bundles.find_bundle("my-topic")
    assert found.contains_hash(expected)
    assert found == bundles.bundles[expected // 0x40000000]


def test_binary_search_edges_last_hash_and_boundaries() -> None:
    bundles = NamespaceBundles.initial(NS, 4)
    assert bundles.find_bundle_by_hash(0xFFFFFFFF).name == "public/default/0xc0000000_0xffffffff"
    assert bundles.find_bundle_by_hash(0).name == "public/default/0x00000000_0x40000000"
    # a hash equal to a boundary belongs to the upper bundle ([lower, upper))
    assert bundles.find_bundle_by_hash(0x40000000).name == "public/default/0x40000000_0x80000000"
    assert bundles.find_bundle_by_hash(0x3FFFFFFF).name == "public/default/0x00000000_0x40000000"
    with pytest.raises(InvalidBundle):
        bundles.find_bundle_by_hash(1 << 32)


def test_find_bundle_rejects_a_topic_of_another_namespace() -> None:
    with pytest.raises(InvalidBundle):
        NamespaceBundles.initial(NS, 4).find_bundle("persistent://t/other/x")


def test_flow_or_qps_cuts_between_topics_and_may_return_several_boundaries() -> None:
    bundle = BundleRange(NS, 0, 0x10000)
    topics = [TopicLoad(h, 60.0, 1.0) for h in (0x1000, 0x2000, 0x3000, 0x4000)]
    cuts = flow_or_qps_equally_divide(
        bundle, topics, max_msg_rate=100, max_bandwidth_mbytes=100,
        difference_threshold_percentage=10,
    )  # fmt: skip
    # each cut is prev + (cur - prev) // 2 + 1
    assert cuts == [0x1801, 0x2801, 0x3801]


def test_flow_or_qps_does_nothing_below_max_plus_difference_threshold() -> None:
    bundle = BundleRange(NS, 0, 0x10000)
    topics = [TopicLoad(0x1000, 50.0, 1.0), TopicLoad(0x2000, 59.0, 1.0)]  # 109 < 110
    assert flow_or_qps_equally_divide(
        bundle, topics, max_msg_rate=100, max_bandwidth_mbytes=100,
        difference_threshold_percentage=10,
    ) == []  # fmt: skip


def test_split_boundaries_dispatches_by_pulsar_name() -> None:
    bundle = BundleRange(NS, 0, 0x8000)
    assert split_boundaries(RANGE_EQUALLY_DIVIDE, bundle) == [0x4000]
    assert split_boundaries(TOPIC_COUNT_EQUALLY_DIVIDE, bundle, topic_hashes=[0x10, 0x20]) == [0x18]
    assert split_boundaries(SPECIFIED_POSITIONS_DIVIDE, bundle, positions=[0x10]) == [0x10]
    loads = [TopicLoad(0x100, 20000.0, 1.0), TopicLoad(0x200, 20000.0, 1.0)]
    assert split_boundaries(FLOW_OR_QPS_EQUALLY_DIVIDE, bundle, topic_loads=loads) == [0x181]
    with pytest.raises(InvalidInput):
        split_boundaries("half_and_half", bundle)


@pytest.mark.parametrize(
    "name",
    [
        "public/default",
        "public/default/0x00000000",
        "public/default/00000000_40000000",
        "public/default/0x0000000g_0x40000000",
        "public/default/0x40000000_0x00000000",
        "public/default/0x40000000_0x40000000",
        "public/default/0x000000000_0x40000000",
        "a/b/c/0x00000000_0x40000000",
        "pub lic/default/0x00000000_0x40000000",
    ],
)
def test_parse_bundle_rejects_malformed_names(name: str) -> None:
    with pytest.raises(InvalidBundle):
        parse_bundle(name)


def test_parse_bundle_rejects_non_strings_and_round_trips_names() -> None:
    with pytest.raises(InvalidBundle):
        parse_bundle(42)  # type: ignore[arg-type]
    name = "t/ns/0x40000000_0x80000000"
    assert parse_bundle(name).name == name
    assert parse_bundle("t/ns/0x4000000A_0x8000000B").name == "t/ns/0x4000000a_0x8000000b"


def test_split_and_merge_reject_invalid_arguments() -> None:
    bundles = NamespaceBundles.initial(NS, 4)
    first, _, third, _ = bundles.bundles
    with pytest.raises(InvalidBundle):
        bundles.split(first, [first.upper])  # not strictly inside
    with pytest.raises(InvalidBundle):
        bundles.split(first, [])
    with pytest.raises(InvalidBundle):
        bundles.split("public/default/0x00000000_0x20000000", [0x100])  # not a current bundle
    with pytest.raises(InvalidBundle):
        bundles.merge(first, third)  # not adjacent
    with pytest.raises(InvalidBundle):
        check_boundaries([0, 5, 5, FULL_UPPER])


def test_children_of_split_name_the_new_ranges_in_order() -> None:
    bundles = NamespaceBundles.initial(NS, 1)
    children = bundles.children_of_split(bundles.bundles[0], [0x80000000])
    assert children == [
        "public/default/0x00000000_0x80000000",
        "public/default/0x80000000_0xffffffff",
    ]
    assert bundles.split(bundles.bundles[0], [0x80000000]).bundle_names == children


# --- properties ----------------------------------------------------------------------------------

_OPS = st.lists(
    st.tuples(st.sampled_from(["split", "merge"]), st.integers(0, 10_000), st.integers(0, 2**32)),
    min_size=1,
    max_size=40,
)


def _assert_partition(bundles: NamespaceBundles, probes: list[int]) -> None:
    check_boundaries(bundles.boundaries)
    ranges = bundles.bundles
    for h in probes:
        holders = [r for r in ranges if r.contains_hash(h)]
        assert len(holders) == 1, f"hash 0x{h:08x} is held by {len(holders)} bundles"
        assert bundles.find_bundle_by_hash(h) == holders[0]


@settings(max_examples=150, deadline=None)
@given(
    initial=st.integers(1, 8), ops=_OPS, probes=st.lists(st.integers(0, FULL_UPPER), max_size=20)
)
def test_random_splits_and_merges_keep_the_ring_covered_exactly(
    initial: int, ops: list[tuple[str, int, int]], probes: list[int]
) -> None:
    bundles = NamespaceBundles.initial(NS, initial)
    for op, pick, point in ops:
        ranges = bundles.bundles
        before = bundles.version
        if op == "split":
            target = ranges[pick % len(ranges)]
            if not target.can_split():
                continue
            inside = target.lower + 1 + point % (target.upper - target.lower - 1)
            bundles = bundles.split(target, [inside])
        else:
            if len(ranges) < 2:
                continue
            i = pick % (len(ranges) - 1)
            bundles = bundles.merge(ranges[i], ranges[i + 1])
        assert bundles.version == before + 1
        edges = [b for x in bundles.boundaries for b in (x - 1, x) if 0 <= b <= FULL_UPPER]
        _assert_partition(bundles, [*probes, *edges, FULL_UPPER])


def test_a_trailing_newline_is_not_a_valid_bundle_name() -> None:
    import pytest

    from loadbalance.bundles import parse_bundle
    from loadbalance.errors import InvalidBundle

    assert parse_bundle("acme/ns/0x00000000_0x80000000").lower == 0
    with pytest.raises(InvalidBundle):
        parse_bundle("acme/ns/0x00000000_0x80000000\n")


_NAME_PARTS = st.sampled_from(
    ["t", "ns", "my-tenant", "a.b", "x=y", "host:8080", "pulsar", "sla-monitor", "", "a b", "é"]
)
_HEX = st.one_of(
    st.integers(0, 0xFFFFFFFF).map(lambda v: f"{v:08x}"),
    st.integers(0, 0xFFFFFFFF).map(lambda v: f"{v:08X}"),
    st.sampled_from(["00000000", "ffffffff", "7fffffff", "0000000", "000000000", "0000000g"]),
)


@settings(max_examples=400, deadline=None)
@given(
    parts=st.lists(_NAME_PARTS, min_size=1, max_size=4),
    lower=_HEX,
    upper=_HEX,
    tail=st.sampled_from(["", "\n", " ", "/"]),
)
def test_canonical_bundle_name_is_parse_bundle_name(parts, lower, upper, tail) -> None:
    """The shortcut for names already canonical gives what ``parse_bundle(name).name`` gives,
    and refuses what it refuses with the same error: uppercase hex, bounds not increasing,
    three-part system namespaces, bad parts, a trailing newline."""
    name = "/".join([*parts, f"0x{lower}_0x{upper}"]) + tail
    try:
        want = parse_bundle(name).name
    except InvalidBundle as e:
        with pytest.raises(InvalidBundle) as got:
            canonical_bundle_name(name)
        assert str(got.value) == str(e)
        return
    assert canonical_bundle_name(name) == want


def test_canonical_bundle_name_examples() -> None:
    """Fixed cases of the property above, including the ones the shortcut must not take."""
    assert canonical_bundle_name("t/ns/0x00000000_0xffffffff") == "t/ns/0x00000000_0xffffffff"
    assert canonical_bundle_name("t/ns/0x0000000A_0xFFFFFFFF") == "t/ns/0x0000000a_0xffffffff"
    for bad in ("t/ns/0x00000002_0x00000002", "t/ns/0x00000003_0x00000002", "t/ns/0x0_0x1\n"):
        with pytest.raises(InvalidBundle):
            canonical_bundle_name(bad)
    v1 = "pulsar/c1/host:8080/0x00000000_0xffffffff"
    assert canonical_bundle_name(v1) == parse_bundle(v1).name
