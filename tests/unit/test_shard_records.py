"""A shard's whole record kept in a local file (``streaming.shard_records``) for a worker with
no copy of its own: read from the file only for the record id the store's tag names, with the
store's deltas applied, and the store's read whenever the file is missing, of another write,
or the folder is unusable.

Unit test with the in-memory stand-in for Spark's state handle of ``test_state_shard_cache``.
"""

from __future__ import annotations

from pathlib import Path

from streaming.shard_cache import ShardCache
from streaming.shard_records import LocalRecords
from streaming.shard_store import record_id
from streaming.state import LoadStateProcessor
from tests.unit.test_state_shard_cache import FakeHandle, _empty_cache, _run  # noqa: F401


def _processor(handle: FakeHandle, root: Path | None, cache: ShardCache) -> LoadStateProcessor:
    proc = LoadStateProcessor(
        0.9, 10_000, 3_600_000, records_dir=None if root is None else str(root)
    )
    proc.cache = cache
    proc.init(handle)
    return proc


def test_a_worker_without_a_copy_reads_the_local_record_and_the_stores_deltas(tmp_path: Path):
    handle = FakeHandle()
    first = _processor(handle, tmp_path, ShardCache())
    _run(first, 10.0, 1_000)  # a new shard: its whole record is written, and kept locally
    _run(first, 20.0, 2_000)  # a delta after it, in the store only
    tag = handle.values["shard_tag"].value[0]
    assert (tmp_path / f"s:0.{record_id(tag)}").exists()
    text = handle.values["shard_text"]
    reads = text.gets
    second = _processor(handle, tmp_path, ShardCache())  # another worker: no copy
    got = _run(second, 30.0, 3_000)
    assert text.gets == reads, "the whole record crossed the state server again"
    assert got.short_n.tolist() == [3, 3], "the record, the stored delta and this batch"
    # the same three batches with the store's read only
    plain = FakeHandle()
    p1 = _processor(plain, None, ShardCache())
    _run(p1, 10.0, 1_000)
    _run(p1, 20.0, 2_000)
    expected = _run(_processor(plain, None, ShardCache()), 30.0, 3_000)
    assert got.to_bytes() == expected.to_bytes()


def test_a_file_of_a_write_the_store_does_not_hold_is_never_read(tmp_path: Path):
    handle = FakeHandle()
    first = _processor(handle, tmp_path, ShardCache())
    _run(first, 10.0, 1_000)
    committed = handle.commit_point()
    # a whole write whose batch then fails: its file stays, the store rolls back
    LocalRecords(str(tmp_path)).put("s:0", "rolled-back-id", b"not a record")
    handle.roll_back(committed)
    text = handle.values["shard_text"]
    reads = text.gets
    got = _run(_processor(handle, tmp_path, ShardCache()), 20.0, 2_000)
    assert got.short_n.tolist() == [2, 2], "the committed record and this batch"
    # the failed write's put removed the committed record's file, so the store's is read
    assert text.gets == reads + 1


def test_a_missing_file_or_an_unusable_folder_falls_back_to_the_store(tmp_path: Path):
    handle = FakeHandle()
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    first = _processor(handle, blocked, ShardCache())
    _run(first, 10.0, 1_000)  # the put fails: no exception, the records turn themselves off
    assert first.records is not None and first.records.broken
    text = handle.values["shard_text"]
    reads = text.gets
    got = _run(_processor(handle, tmp_path / "empty", ShardCache()), 20.0, 2_000)
    assert text.gets == reads + 1, "no file: the store's record is read"
    assert got.short_n.tolist() == [2, 2]


def test_a_new_whole_record_replaces_the_older_file(tmp_path: Path):
    records = LocalRecords(str(tmp_path))
    records.put("s:0", "a", b"one")
    records.put("s:1", "x", b"other shard")
    records.put("s:0.3", "y", b"a salted key's")
    records.put("s:0", "b", b"two")
    assert records.get("s:0", "a") is None
    assert records.get("s:0", "b") == b"two"
    assert records.get("s:1", "x") == b"other shard"
    assert records.get("s:0.3", "y") == b"a salted key's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s:0.3.y", "s:0.b", "s:1.x"]
