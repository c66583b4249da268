"""How the Python source cuts a batch's partition ranges into reading tasks.

The cases are Spark's own ``KafkaOffsetRangeCalculatorSuite`` (the built-in Kafka source's
``minPartitions`` and ``maxRecordsPerPartition``), so the two sources plan the same tasks for the
same options; a property test adds that every offset is read exactly once, in order.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streaming.kafka_source import (
    KafkaOffsetRange,
    KafkaSourceConfig,
    LbKafkaStreamReader,
    divide_ranges,
)


def _r(topic: str, start: int, end: int) -> KafkaOffsetRange:
    return KafkaOffsetRange(topic, 1, start, end)


def _plan(ranges: list[tuple[str, int, int]], **kw: int) -> list[tuple[str, int, int]]:
    out = divide_ranges([_r(*r) for r in ranges], **kw)
    return [(p.topic, p.start, p.end) for p in out]


def test_without_options_each_nonempty_partition_is_one_task() -> None:
    assert _plan([("t1", 1, 2)]) == [("t1", 1, 2)]
    assert _plan([("t1", 1, 2), ("t2", 1, 1)]) == [("t1", 1, 2)]


@pytest.mark.parametrize(
    ("ranges", "min_partitions", "expected"),
    [
        # as many ranges as asked for: untouched
        ([("t1", 1, 2), ("t2", 1, 2), ("t3", 1, 2)], 3,
         [("t1", 1, 2), ("t2", 1, 2), ("t3", 1, 2)]),
        ([("t1", 1, 5)], 4, [("t1", 1, 2), ("t1", 2, 3), ("t1", 3, 4), ("t1", 4, 5)]),
        # skewed: the small range stays whole
        ([("t1", 1, 5), ("t2", 1, 21)], 4,
         [("t1", 1, 5), ("t2", 1, 7), ("t2", 7, 14), ("t2", 14, 21)]),
        # SPARK-30656: empty ranges are ignored and the rest split
        ([("t1", 1, 1), ("t2", 1, 21)], 4,
         [("t2", 1, 6), ("t2", 6, 11), ("t2", 11, 16), ("t2", 16, 21)]),
        ([("t1", 1, 2), ("t2", 1, 1001)], 4,
         [("t1", 1, 2), ("t2", 1, 334), ("t2", 334, 667), ("t2", 667, 1001)]),
        ([("t1", 1, 5), ("t2", 1, 21)], 1, [("t1", 1, 5), ("t2", 1, 21)]),
        # not a multiple: the last piece takes the remainder
        ([("t1", 1, 11)], 3, [("t1", 1, 4), ("t1", 4, 7), ("t1", 7, 11)]),
        ([("t1", 1, 5), ("t2", 1, 21), ("t3", 1, 1)], 4,
         [("t1", 1, 5), ("t2", 1, 7), ("t2", 7, 14), ("t2", 14, 21)]),
        # SPARK-28489: never drop offsets
        ([("t1", 0, 10), ("t2", 0, 10), ("t3", 0, 1)], 6,
         [("t1", 0, 3), ("t1", 3, 6), ("t1", 6, 10), ("t2", 0, 3), ("t2", 3, 6),
          ("t2", 6, 10), ("t3", 0, 1)]),
        # SPARK-36576: whole ranges are left out of the shares of the cut ones
        ([("t1", 0, 10000), ("t2", 0, 15000), ("t3", 0, 20000)], 9,
         [("t1", 0, 5000), ("t1", 5000, 10000), ("t2", 0, 5000), ("t2", 5000, 10000),
          ("t2", 10000, 15000), ("t3", 0, 5000), ("t3", 5000, 10000),
          ("t3", 10000, 15000), ("t3", 15000, 20000)]),
        ([("t1", 0, 500), ("t2", 0, 12000), ("t3", 0, 15001)], 6,
         [("t1", 0, 500), ("t2", 0, 6000), ("t2", 6000, 12000), ("t3", 0, 5000),
          ("t3", 5000, 10000), ("t3", 10000, 15001)]),
        ([("t1", 0, 1), ("t2", 0, 1), ("t3", 0, 10000)], 6,
         [("t1", 0, 1), ("t2", 0, 1), ("t3", 0, 2500), ("t3", 2500, 5000),
          ("t3", 5000, 7500), ("t3", 7500, 10000)]),
    ],
)  # fmt: skip
def test_min_partitions_cuts_as_sparks_calculator_does(ranges, min_partitions, expected) -> None:
    assert _plan(ranges, min_partitions=min_partitions) == expected


def test_max_records_per_partition_cuts_only_the_ranges_above_it() -> None:
    # SPARK-49259
    assert _plan([("t1", 1, 5)], max_records_per_partition=4) == [("t1", 1, 5)]
    assert _plan([("t1", 1, 2)], max_records_per_partition=4) == [("t1", 1, 2)]
    assert _plan([("t1", 1, 6)], max_records_per_partition=4) == [("t1", 1, 3), ("t1", 3, 6)]
    assert _plan([("t1", 1, 40), ("t2", 1, 50), ("t3", 1, 60)], max_records_per_partition=20) == [
        ("t1", 1, 20), ("t1", 20, 40), ("t2", 1, 17), ("t2", 17, 33), ("t2", 33, 50),
        ("t3", 1, 20), ("t3", 20, 40), ("t3", 40, 60),
    ]  # fmt: skip


def test_both_options_take_the_larger_number_of_tasks() -> None:
    assert _plan([("t1", 1, 40)], min_partitions=1, max_records_per_partition=20) == [
        ("t1", 1, 20),
        ("t1", 20, 40),
    ]
    assert _plan([("t1", 1, 40)], min_partitions=4, max_records_per_partition=20) == [
        ("t1", 1, 10),
        ("t1", 10, 20),
        ("t1", 20, 30),
        ("t1", 30, 40),
    ]


_RANGES = st.lists(
    st.tuples(st.integers(0, 10**6), st.integers(0, 3000)), min_size=1, max_size=6
).map(lambda xs: [KafkaOffsetRange("t", p, start, start + n) for p, (start, n) in enumerate(xs)])


@given(
    _RANGES,
    st.none() | st.integers(1, 40),
    st.none() | st.integers(1, 5000),
)
def test_every_offset_is_read_once_in_order_and_no_piece_is_empty_or_too_large(
    ranges, min_partitions, max_records
) -> None:
    out = divide_ranges(ranges, min_partitions, max_records)
    for r in ranges:
        pieces = [(p.start, p.end) for p in out if p.partition == r.partition]
        assert all(end > start for start, end in pieces)
        covered = [o for start, end in pieces for o in range(start, end)]
        assert covered == list(range(r.start, r.end))  # once each, in order
        if max_records is not None and not min_partitions:
            assert all(end - start <= max_records for start, end in pieces)
    if max_records is None and min_partitions is None:
        assert len(out) == sum(r.end > r.start for r in ranges)


def test_the_reader_plans_its_tasks_with_the_options() -> None:
    config = KafkaSourceConfig.from_options(
        {"kafka.bootstrap.servers": "x:1", "subscribe": "t", "maxRecordsPerPartition": "256"}
    )
    reader = LbKafkaStreamReader(config)
    tasks = reader.partitions({"t": {"0": 0, "1": 100}}, {"t": {"0": 512, "1": 130}})
    assert [(p.partition, p.start, p.end) for p in tasks] == [
        (0, 0, 256),
        (0, 256, 512),
        (1, 100, 130),
    ]


@pytest.mark.parametrize(
    "name",
    ["minPartitions", "maxRecordsPerPartition", "maxOffsetsPerTrigger", "lb.maxBytesPerTrigger"],
)
@pytest.mark.parametrize("value", ["0", "-3", "two"])
def test_a_bad_positive_option_is_refused_by_name(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=name):
        KafkaSourceConfig.from_options(
            {"kafka.bootstrap.servers": "x:1", "subscribe": "t", name.lower(): value}
        )


def _stream_args(*extra: str):
    from lbctl.main import build_parser

    return build_parser().parse_args(["stream", "--checkpoint", "/tmp/ck", *extra])


def test_lbctl_stream_passes_the_cut_to_the_job_and_keeps_one_task_per_partition_by_default():
    from streaming.cli import _stream_settings

    settings = _stream_settings(_stream_args("--max-records-per-partition", "64"), "k:1", "", {})
    assert settings.max_records_per_partition == 64
    assert _stream_settings(_stream_args(), "k:1", "", {}).max_records_per_partition is None


def test_lbctl_stream_refuses_a_cut_that_is_not_a_positive_number(capsys):
    with pytest.raises(SystemExit):
        _stream_args("--max-records-per-partition", "0")
    assert "--max-records-per-partition" in capsys.readouterr().err
