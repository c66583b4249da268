"""The state step's per-worker shard cache (``streaming.shard_cache``) and the one store layout.

Unit test with an in-memory stand-in for Spark's state handle (the real state server is
exercised by the Spark tests); what matters here is when the cache may be trusted.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from streaming.schema import PARSED_FIELDS, SAMPLES, frame
from streaming.shard_cache import WORKER_SHARD_CACHE, ShardCache
from streaming.shard_state import ShardState, pack_samples
from streaming.shard_store import OlderStateLayout
from streaming.shard_store import from_text as _bytes
from streaming.state import LoadStateProcessor

NAMES = ["t/ns/0x00000000_0x80000000", "t/ns/0x80000000_0xffffffff"]
MANY = [f"t/ns/0x{i:08x}_0x{i + 1:08x}" for i in range(40)]


class FakeValue:
    def __init__(self) -> None:
        self.value: tuple | None = None
        self.gets = 0

    def get(self) -> tuple | None:
        self.gets += 1
        return self.value

    def update(self, value: tuple) -> None:
        self.value = value

    def clear(self) -> None:
        self.value = None


class FakeList:
    def __init__(self) -> None:
        self.items: list[tuple] = []
        self.gets = 0

    def get(self) -> list[tuple]:
        self.gets += 1
        return list(self.items)

    def appendValue(self, value: tuple) -> None:
        self.items.append(value)

    def clear(self) -> None:
        self.items = []


class FakeMap:
    def __init__(self) -> None:
        self.items: dict[tuple, tuple] = {}
        self.reads = 0  # values handed out (each a copy across the state server)

    def getValue(self, key: tuple) -> tuple | None:
        self.reads += key in self.items
        return self.items.get(key)

    def updateValue(self, key: tuple, value: tuple) -> None:
        self.items[key] = value

    def iterator(self):
        self.reads += len(self.items)
        return iter(list(self.items.items()))

    def clear(self) -> None:
        self.items = {}


class FakeHandle:
    def __init__(self) -> None:
        self.values: dict[str, FakeValue] = {}
        self.lists: dict[str, FakeList] = {}
        self.maps: dict[str, FakeMap] = {}

    def getValueState(self, name: str, _schema: str) -> FakeValue:
        return self.values.setdefault(name, FakeValue())

    def getListState(self, name: str, _schema: str) -> FakeList:
        return self.lists.setdefault(name, FakeList())

    def getMapState(self, name: str, _key_schema: str, _schema: str) -> FakeMap:
        return self.maps.setdefault(name, FakeMap())

    @property
    def deltas(self) -> list[bytes]:
        """The stored delta records, in order."""
        return [_bytes(v[0]) for _k, v in sorted(self.maps["shard_deltas"].items.items())]

    def stored(self) -> ShardState:
        """The shard as the store holds it: the whole record with its deltas applied."""
        base = self.values["shard_text"].value
        assert base is not None
        return ShardState.from_bytes(_bytes(base[0]), self.deltas)

    def commit_point(self) -> tuple:
        return (
            self.values["shard_text"].value,
            self.values["shard_tag"].value,
            dict(self.maps["shard_deltas"].items),
        )

    def roll_back(self, point: tuple) -> None:
        self.values["shard_text"].value, self.values["shard_tag"].value = point[0], point[1]
        self.maps["shard_deltas"].items = dict(point[2])


def _samples(rate: float, event_ms: int, names: list[str] = NAMES) -> pd.DataFrame:
    values = np.full((len(names), 4), rate)
    counts = np.ones((len(names), 3), dtype=np.int64)
    return frame(
        PARSED_FIELDS,
        1,
        key=np.array(["s:0"], dtype=object),
        kind=np.array([SAMPLES], dtype=object),
        broker=np.array(["b1"], dtype=object),
        event_ms=np.array([event_ms], dtype=np.int64),
        payload=np.array([pack_samples(names, values, counts)], dtype=object),
    )


def _run(
    proc: LoadStateProcessor, rate: float, event_ms: int, names: list[str] = NAMES
) -> ShardState:
    list(proc.handleInputRows(("s:0",), iter([_samples(rate, event_ms, names)]), None))
    return proc.handle.stored()


@pytest.fixture(autouse=True)
def _empty_cache():
    WORKER_SHARD_CACHE.clear()
    yield
    WORKER_SHARD_CACHE.clear()


def _processor(handle: FakeHandle) -> LoadStateProcessor:
    proc = LoadStateProcessor(0.9, 10_000, 3_600_000)
    proc.init(handle)
    return proc


def test_a_cached_shard_skips_the_blob_read_and_gives_the_same_averages():
    handle = FakeHandle()
    proc = _processor(handle)
    _run(proc, 10.0, 1_000)
    blob = handle.values["shard_text"]
    reads = blob.gets
    cached = _run(proc, 20.0, 2_000)
    assert blob.gets == reads, "the blob was read although the tag matched"
    WORKER_SHARD_CACHE.clear()  # the same two batches without the cache
    other = FakeHandle()
    proc2 = _processor(other)
    _run(proc2, 10.0, 1_000)
    WORKER_SHARD_CACHE.clear()
    fresh = _run(proc2, 20.0, 2_000)
    assert other.values["shard_text"].gets > 0
    assert cached.to_bytes() == fresh.to_bytes()


def test_a_store_rolled_back_to_an_older_tag_is_read_not_the_cache():
    handle = FakeHandle()
    proc = _processor(handle)
    _run(proc, 10.0, 1_000)
    committed = handle.commit_point()
    _run(proc, 20.0, 2_000)  # a batch whose state commit then fails: the store rolls back
    handle.roll_back(committed)
    reads = handle.values["shard_text"].gets
    replayed = _run(proc, 20.0, 2_000)
    assert handle.values["shard_text"].gets == reads + 1, "the rolled-back blob must be read"
    assert replayed.short_n.tolist() == [2, 2], "one sample from the store plus the replay"


def test_the_cache_entry_leaves_before_the_state_changes():
    handle = FakeHandle()
    proc = _processor(handle)
    _run(proc, 10.0, 1_000)
    assert "s:0" in WORKER_SHARD_CACHE
    bad = _samples(20.0, 2_000)
    bad.loc[0, "payload"] = b"not a sample block"
    with pytest.raises(ValueError):
        list(proc.handleInputRows(("s:0",), iter([bad]), None))
    assert "s:0" not in WORKER_SHARD_CACHE


def _two_workers() -> tuple[list[str], FakeHandle, LoadStateProcessor, ShardCache, ShardCache]:
    """Forty bundles, one store, its processor, and the shard caches of two Python workers."""
    handle = FakeHandle()
    return MANY, handle, _processor(handle), ShardCache(), ShardCache()


def _as_worker(
    cache: ShardCache,
    proc: LoadStateProcessor,
    rate: float,
    event_ms: int,
    names: list[str] = NAMES,
) -> ShardState:
    """A batch run by one of several Python workers: each has its own shard cache."""
    proc.cache = cache
    try:
        return _run(proc, rate, event_ms, names)
    finally:
        proc.cache = None


def test_a_worker_one_batch_behind_applies_the_deltas_since_instead_of_reading_the_record():
    handle = FakeHandle()
    proc = _processor(handle)
    a, b = ShardCache(), ShardCache()
    _as_worker(a, proc, 10.0, 1_000)  # the whole record
    _as_worker(b, proc, 20.0, 2_000)  # b reads the store; a delta
    reads = handle.values["shard_text"].gets
    caught_up = _as_worker(a, proc, 30.0, 3_000)  # a is one delta behind
    assert handle.values["shard_text"].gets == reads, "the whole record was read again"
    straight = FakeHandle()
    proc2 = _processor(straight)
    for rate, t in ((10.0, 1_000), (20.0, 2_000), (30.0, 3_000)):
        expected = _run(proc2, rate, t)
    assert caught_up.to_bytes() == expected.to_bytes()
    assert a.peek("s:0")[1].to_bytes() == expected.to_bytes()


def test_a_worker_several_batches_behind_applies_every_delta_it_missed():
    """Caught up over three deltas another worker wrote, in one pass: the same shard, and the
    same count of deltas and their rows, as the worker that wrote them."""
    many, handle, proc, a, b = _two_workers()
    _as_worker(a, proc, 10.0, 1_000, many)  # the whole record
    batches = [(20.0 + k, 2_000 + k, many[2 * k : 2 * k + 3]) for k in range(3)]
    for rate, t, part in batches:
        _as_worker(b, proc, rate, t, part)  # three small deltas a has not seen
    reads = handle.values["shard_text"].gets
    caught_up = _as_worker(a, proc, 30.0, 3_000, many[20:22])
    assert handle.values["shard_text"].gets == reads, "the whole record was read again"
    assert len(handle.deltas) == 4
    straight = FakeHandle()
    proc2 = _processor(straight)
    WORKER_SHARD_CACHE.clear()
    for rate, t, part in [(10.0, 1_000, many), *batches, (30.0, 3_000, many[20:22])]:
        expected = _run(proc2, rate, t, part)
    assert caught_up.to_bytes() == expected.to_bytes()
    # the worker's own copy counts the deltas since the record as the writer's copy does (the
    # count decides when the whole record is written again)
    mine, writers = a.peek("s:0")[1], WORKER_SHARD_CACHE.peek("s:0")[1]
    assert mine.to_bytes() == writers.to_bytes()
    assert (mine.deltas, mine.delta_rows) == (writers.deltas, writers.delta_rows) == (4, 11)


def test_a_cached_copy_the_store_rolled_back_past_is_not_caught_up():
    handle = FakeHandle()
    proc = _processor(handle)
    a, b = ShardCache(), ShardCache()
    _as_worker(a, proc, 10.0, 1_000)
    point = handle.commit_point()
    _as_worker(a, proc, 20.0, 2_000)  # a's copy holds this batch, whose commit then fails
    handle.roll_back(point)
    _as_worker(b, proc, 25.0, 2_000)  # the replay, by another worker, with other samples
    reads = handle.values["shard_text"].gets
    got = _as_worker(a, proc, 30.0, 3_000)
    assert handle.values["shard_text"].gets == reads + 1, "a copy off the store's history was used"
    assert got.short_n.tolist() == [3, 3]
    assert got.short_avg[0, 0] == pytest.approx((10.0 + 25.0 + 30.0) / 3)


def test_a_cached_copy_off_the_stores_history_is_not_caught_up_by_later_deltas():
    many, handle, proc, a, b = _two_workers()
    _as_worker(a, proc, 10.0, 1_000, many)
    point = handle.commit_point()
    _as_worker(a, proc, 20.0, 2_000, many[:4])  # a delta, whose commit then fails
    handle.roll_back(point)
    _as_worker(b, proc, 25.0, 2_000, many[:4])  # the replay by another worker: another delta
    _as_worker(b, proc, 27.0, 2_500, many[4:8])  # and one more after it
    assert len(handle.deltas) == 2
    reads = handle.values["shard_text"].gets
    got = _as_worker(a, proc, 30.0, 3_000, many[8:12])
    assert handle.values["shard_text"].gets == reads + 1, "a copy off the store's history was used"
    assert got.short_avg[0, 0] == pytest.approx(17.5)  # 10 then 25, never a's failed 20


def test_a_cached_copy_of_an_older_whole_record_is_not_caught_up():
    many, handle, proc, a, b = _two_workers()
    _as_worker(a, proc, 10.0, 1_000, many)  # a holds the whole record, no deltas
    late = 1_000 + 3_600_000 + 1
    _as_worker(b, proc, 20.0, late, many[:4])  # the rest expires: a new whole record
    _as_worker(b, proc, 30.0, late + 1, many[:2])  # and a delta on it
    assert len(handle.deltas) == 1
    reads = handle.values["shard_text"].gets
    got = _as_worker(a, proc, 40.0, late + 2, many[2:4])
    assert handle.values["shard_text"].gets == reads + 1, "deltas of another record were applied"
    assert got.names == many[:4]


@pytest.mark.parametrize(
    "tag",
    [
        "0123456789abcdef0123456789abcdef",  # a plain id: the binary record alone
        "0123456789abcdef0123456789abcdef:2:" + "2" * 32,  # deltas in a list state
    ],
)
def test_a_store_of_an_older_layout_is_refused_with_one_line(tag):
    """A tag that is not of this layout is refused when the shard is first read, by a worker
    with or without a copy: one line naming the shard and the upgrade step, and nothing
    written or cached."""
    handle = FakeHandle()
    proc = _processor(handle)
    _run(proc, 10.0, 1_000)  # a copy in this worker's cache, at a tag of this layout
    handle.values["shard_tag"].value = (tag,)  # the store holds another layout's tag
    text = handle.values["shard_text"].value
    with pytest.raises(OlderStateLayout) as refused:
        _run(proc, 20.0, 2_000)
    message = str(refused.value)
    assert "\n" not in message and "s:0" in message and "Upgrading a checkpoint" in message
    assert handle.values["shard_text"].value == text and handle.deltas == []
    assert "s:0" not in WORKER_SHARD_CACHE


def test_a_checked_out_shard_goes_back_only_when_kept_and_the_block_ends_normally():
    cache = ShardCache()
    state = ShardState()
    with cache.checkout("s:1") as slot:
        assert slot.cached is None
        with pytest.raises(RuntimeError, match="checked out already"), cache.checkout("s:1"):
            pass
        slot.keep("m:a:0:", state)
        assert "s:1" not in cache  # out for the whole block
    assert cache.peek("s:1") == ("m:a:0:", state)
    with pytest.raises(ValueError), cache.checkout("s:1") as slot:
        assert slot.cached == ("m:a:0:", state)
        slot.keep("m:b:0:", state)
        raise ValueError("the write failed")
    assert "s:1" not in cache  # neither the old copy nor the one kept before the failure
    with cache.checkout("s:1") as slot:
        pass  # nothing kept: nothing goes back
    assert "s:1" not in cache
    with pytest.raises(RuntimeError, match="too late"):
        slot.keep("m:c:0:", state)


def test_a_worker_reads_only_the_deltas_it_missed():
    """Catching up reads the entries after the cached copy's, by number; the tag alone says
    whether the store's history continues the copy."""
    many, handle, proc, a, b = _two_workers()
    _as_worker(a, proc, 10.0, 1_000, many)
    for k in range(4):  # four deltas written by a
        _as_worker(a, proc, 11.0 + k, 1_100 + k, many[k : k + 2])
    _as_worker(b, proc, 20.0, 2_000, many[10:12])  # b reads the store: a sixth delta
    deltas = handle.maps["shard_deltas"]
    reads = deltas.reads
    _as_worker(a, proc, 30.0, 3_000, many[12:14])  # a is one delta behind
    assert deltas.reads == reads + 1, "a caught-up worker read more than the delta it missed"
    assert len(handle.deltas) == 6
    straight = FakeHandle()
    proc2 = _processor(straight)
    WORKER_SHARD_CACHE.clear()
    for rate, t, part in (
        [(10.0, 1_000, many)]
        + [(11.0 + k, 1_100 + k, many[k : k + 2]) for k in range(4)]
        + [(20.0, 2_000, many[10:12]), (30.0, 3_000, many[12:14])]
    ):
        expected = _run(proc2, rate, t, part)
    assert a.peek("s:0")[1].to_bytes() == expected.to_bytes()


def test_the_refusal_is_the_line_lbctl_stream_logs_for_the_failed_query():
    """Spark wraps a worker's error in the foreachBatch proxy's traceback; the job's one-line
    summary names the worker's own error, the refusal, not the wrapper."""
    from streaming.query_restarts import failure_summary

    refusal = OlderStateLayout("s:0.3", "410c294d77e646439a819a0eb4606f86:1:3e6bf")
    text = (
        "[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function in "
        "foreach batch sink. Reason: An exception was raised by the Python Proxy. Return "
        "Message: Traceback (most recent call last):\n"
        '  File "/work/main/streaming/job.py", line 1, in call\n'
        "    batch.collect()\n"
        "pyspark.errors.exceptions.captured.PythonException: An exception was thrown from the "
        "Python worker:\nTraceback (most recent call last):\n"
        '  File "/work/main/streaming/shard_store.py", line 67, in read\n'
        "    raise OlderStateLayout(key_name, stored_tag)\n"
        f"streaming.shard_store.OlderStateLayout: {refusal}\n\n"
        "\tat py4j.Protocol.getReturnValue(Protocol.java:476)\n"
    )
    line = failure_summary(text)
    assert "\n" not in line and line.endswith(str(refusal)[-60:])
    assert "OlderStateLayout: the checkpoint's state of shard s:0 is of an older layout" in line
