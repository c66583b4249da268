"""How many records the Python source's reader asks the consumer for at a time."""

from __future__ import annotations

from streaming import kafka_reads
from streaming.kafka_reads import _how_many


def test_asks_for_no_more_than_the_range_holds_nor_the_cap() -> None:
    assert _how_many(remaining=3, room=10**9, read_records=0, read_bytes=0) == 3
    assert _how_many(10**6, 10**9, 0, 0) == kafka_reads._CONSUME_ROWS
    assert _how_many(0, 10**9, 0, 0) == 1  # never zero: consume() would return at once


def test_asks_for_about_what_fills_the_chunk_at_the_mean_record_size() -> None:
    # 10 records of 640 KB read so far; 8 MB of room left: 12 records (12.8, rounded down)
    assert _how_many(10**6, 8 * 2**20, read_records=10, read_bytes=10 * 640 * 1024) == 12
    assert _how_many(10**6, 100, read_records=10, read_bytes=10 * 640 * 1024) == 1
    assert _how_many(5, 8 * 2**20, read_records=10, read_bytes=10) == 5  # tiny records
