"""Delta records: the state step stores and emits only the bundles a batch changed, and the
store, the driver's view and the load snapshot in Redis each rebuild the state step's shard
from the whole record and its deltas, bit for bit.

Unit tests with the in-memory state handle of ``test_state_shard_cache`` (the real state
server runs in the Spark tests) and a dict standing for the ``P:load:shards`` hash.
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pytest

from loadbalance.bundles import NamespaceBundles
from metadata_store.load_snapshot import (
    BundleShard,
    decode_bundle_shard,
    delta_key,
    encode_bundle_shard,
    merged_shards,
    split_field,
)
from streaming.decoded_shards import Made
from streaming.driver_view import DriverView
from streaming.schema import OUTPUT_FIELDS, PARSED_FIELDS, SAMPLES, SHARD, SHARD_DELTA, frame
from streaming.shard_cache import WORKER_SHARD_CACHE
from streaming.shard_state import (
    COMPACTION_ODDS,
    MAX_DELTA_ROWS,
    MAX_DELTAS,
    ShardState,
    compaction_due,
    pack_samples,
)
from streaming.state import LoadStateProcessor
from tests.unit.test_state_shard_cache import FakeHandle

POOL = NamespaceBundles.initial("t/ns", 256).bundle_names
TTL_MS = 9_000


@pytest.fixture(autouse=True)
def _empty_cache():
    WORKER_SHARD_CACHE.clear()
    yield
    WORKER_SHARD_CACHE.clear()


def _batch(key: str, rng: np.random.Generator, names: list[str], event_ms: int) -> pd.DataFrame:
    """One batch of a shard: two reports (brokers) with samples of ``names``."""
    half = len(names) // 2
    rows = []
    for broker, part in (("b1", names[:half]), ("b2", names[half:])):
        values = rng.uniform(0, 1e5, size=(len(part), 4)) / 3.0
        counts = rng.integers(0, 40, size=(len(part), 3))
        rows.append(
            frame(
                PARSED_FIELDS,
                1,
                key=np.array([key], dtype=object),
                kind=np.array([SAMPLES], dtype=object),
                broker=np.array([broker], dtype=object),
                event_ms=np.array([event_ms], dtype=np.int64),
                payload=np.array([pack_samples(part, values, counts)], dtype=object),
            )
        )
    return pd.concat(rows, ignore_index=True)


def _redis_apply(fields: dict[str, bytes], changes) -> None:
    """What ``LoadSnapshot.stage_changes`` does to the ``P:load:shards`` hash."""
    _brokers, _gone, shards, removed = changes
    for name in removed:
        fields.pop(name, None)
    fields.update(shards)


def test_store_view_and_snapshot_rebuild_the_state_steps_shards_bit_for_bit():
    rng = np.random.default_rng(11)
    keys = ["s:0", "s:1", "s:5"]
    handles = {k: FakeHandle() for k in keys}
    procs = {}
    for k in keys:
        procs[k] = LoadStateProcessor(0.9, 60_000, TTL_MS)
        procs[k].init(handles[k])
    view = DriverView()
    fields: dict[str, bytes] = {}
    kinds: list[str] = []
    live = {k: list(POOL[i * 40 : i * 40 + 30]) for i, k in enumerate(keys)}
    for batch in range(80):
        event_ms = 1_000 * (batch + 1)
        out = []
        for i, k in enumerate(keys):
            if batch % 17 == 5 + i:  # a split: two bundles leave for good, new ones come
                live[k] = live[k][2:] + list(POOL[150 + batch * 2 + i : 152 + batch * 2 + i])
            picked = [n for n in live[k] if rng.random() < 0.2] or live[k][:1]
            out += list(
                procs[k].handleInputRows((k,), iter([_batch(k, rng, picked, event_ms)]), None)
            )
        rows = pd.concat(out, ignore_index=True)
        kinds += rows["kind"].tolist()
        view.apply(rows)
        _redis_apply(fields, view.take_changes())
        if batch % 3 == 0:  # the view decodes now and then: new deltas onto an older decode
            view.shards.decode(view.ledger.records())
        merged = merged_shards(fields)
        seeded = DriverView.from_snapshot({}, fields)
        seeded.shards.decode(seeded.ledger.records())
        for k in keys:
            cached = WORKER_SHARD_CACHE.peek(k)[1]
            want = cached.to_bytes()
            assert handles[k].stored().to_bytes() == want, f"store, batch {batch}"
            assert encode_bundle_shard(merged[k]) == want, f"snapshot, batch {batch}"
            assert seeded.shards.made[k].state.to_bytes() == want, f"seeded view, batch {batch}"
            assert len(handles[k].deltas) <= MAX_DELTAS
        view.shards.decode(view.ledger.records())
        for k in keys:
            made = view.shards.made[k]
            assert made.state.to_bytes() == WORKER_SHARD_CACHE.peek(k)[1].to_bytes()
            # values made before and kept are those of the current rows (last samples made
            # alone included: they are what ``make`` gives for the same rows)
            fresh = Made(made.blob, made.state)
            fresh.make(sorted(set(made.data) | set(made.stats)))
            assert made.stats == fresh.stats, f"batch {batch}"
            assert made.data == {r: fresh.data[r] for r in made.data}, f"batch {batch}"
            # the next decode keeps the unchanged: half whole, half their last samples alone
            made.make(list(range(0, len(made.state), 2)))
            made.make_stats(list(range(1, len(made.state), 2)))
        assert len(view) == sum(len(WORKER_SHARD_CACHE.peek(k)[1]) for k in keys)
    # both layouts were exercised: deltas, and whole records after the first (compaction, expiry)
    assert kinds.count(SHARD_DELTA) > 100 and kinds.count(SHARD) > 3 * len(keys)


def test_a_batch_that_expires_bundles_writes_the_whole_record():
    handle = FakeHandle()
    proc = LoadStateProcessor(0.9, 60_000, TTL_MS)
    proc.init(handle)
    rng = np.random.default_rng(3)
    names = list(POOL[:12])
    first = list(proc.handleInputRows(("s:2",), iter([_batch("s:2", rng, names, 1_000)]), None))
    assert first[0]["kind"].iloc[0] == SHARD  # a new shard starts with its whole record
    second = list(
        proc.handleInputRows(("s:2",), iter([_batch("s:2", rng, names[:2], 2_000)]), None)
    )
    assert second[0]["kind"].iloc[0] == SHARD_DELTA
    assert second[0]["name"].iloc[0] == delta_key("s:2", 1)
    assert decode_bundle_shard(bytes(second[0]["payload"].iloc[0])).names == names[:2]
    late = 2_000 + TTL_MS + 1  # every bundle but the two reported now expires
    third = list(proc.handleInputRows(("s:2",), iter([_batch("s:2", rng, names[:2], late)]), None))
    assert third[0]["kind"].iloc[0] == SHARD
    assert decode_bundle_shard(bytes(third[0]["payload"].iloc[0])).names == names[:2]
    assert handle.deltas == []


def _whole_records_per_batch(n_shards: int, share: float, batches: int = 300) -> list[int]:
    """How many of ``n_shards`` shards write their whole record in each batch when every batch
    changes ``share`` of every shard's rows (reports spread evenly over the shards)."""
    rows = 31_250
    per_batch = max(1, int(rows * share))
    held = [(0, 0)] * n_shards  # each shard's (deltas, delta rows) since its whole record
    counts = []
    for batch in range(batches):
        whole = 0
        for shard, (deltas, delta_rows) in enumerate(held):
            deltas, delta_rows = deltas + 1, delta_rows + per_batch
            if compaction_due(shard, rows, delta_rows, deltas, 1_000 * batch + 371):
                deltas = delta_rows = 0
                whole += 1
            assert deltas <= MAX_DELTAS and delta_rows <= rows * MAX_DELTA_ROWS
            held[shard] = (deltas, delta_rows)
        counts.append(whole)
    return counts


@pytest.mark.parametrize("n_shards", [32, 128])
@pytest.mark.parametrize("share", [0.002, 0.01, 0.045])
def test_shards_with_small_deltas_do_not_write_their_whole_records_together(n_shards, share):
    # A million bundles on 32 shards, a broker in 30 reporting per second: a batch changes
    # about 4.5 % of each shard. Every shard falls due in the same batch; a sixth at most may
    # then write its whole record in any one batch (the bound on the number of deltas alone
    # once made half of them, or all, do it together, a batch as slow as a policy cycle's).
    counts = _whole_records_per_batch(n_shards, share)
    assert max(counts) <= n_shards // 6
    # and not more often than the deltas' rows or number call for
    assert sum(counts) / len(counts) <= 1.25 * n_shards / min(32, 1 / share)


@pytest.mark.parametrize("share", [0.1, 0.17, 0.25])
def test_shards_with_large_deltas_spread_their_whole_records(share):
    # a batch holding a sixth of the brokers' reports changes a sixth of every shard
    counts = _whole_records_per_batch(32, share)
    assert max(counts) <= 12
    assert sum(counts) / len(counts) <= 1.25 * 32 * share


def test_a_shard_is_not_compacted_before_its_deltas_hold_its_rows_or_number():
    for shard in range(64):
        for batch in range(50):
            assert not compaction_due(shard, 3_600, 3_599, 15, 1_000 * batch)
            assert not compaction_due(shard, 3_600, 3_600 * (8 + shard % 8) // 8 - 1, 15, batch)
    assert compaction_due(0, 10_000, 1, MAX_DELTAS + 1, 0)  # tiny deltas are bounded in number
    assert compaction_due(0, 10_000, 25_001, 2, 0)  # and large ones in rows
    # a due shard (21 deltas for shard 5) writes its record in some batches, not in all
    picked = sum(compaction_due(5, 3_600, 3_600, 21, t) for t in range(800))
    assert 800 / COMPACTION_ODDS / 2 < picked < 800 / COMPACTION_ODDS * 2


def test_a_delta_for_a_shard_the_view_lost_is_applied_and_the_next_record_heals_it(caplog):
    names = list(POOL[:6])
    base = ShardState()
    base.apply(names, np.ones((6, 4)), np.ones((6, 3), dtype=np.int64), ["b1"] * 6, np.ones(6))
    delta = encode_bundle_shard(base.rows(np.array([1, 4])))
    rows = frame(
        OUTPUT_FIELDS,
        1,
        kind=np.array([SHARD_DELTA], dtype=object),
        name=np.array([delta_key("s:0", 3)], dtype=object),
        payload=np.array([delta], dtype=object),
        bundles=np.array([6], dtype=np.int64),
    )
    view = DriverView()  # seeded from a snapshot that was lost
    with caplog.at_level(logging.WARNING, "streaming.view_ledger"):
        view.apply(rows)
    assert "does not follow" in caplog.text
    view.shards.decode(view.ledger.records())
    assert view.shards.made["s:0"].state.names == [names[1], names[4]]
    assert view.take_changes()[2] == {"s:0+3": delta}  # the snapshot gets what the view holds
    whole = frame(
        OUTPUT_FIELDS,
        1,
        kind=np.array([SHARD], dtype=object),
        name=np.array(["s:0"], dtype=object),
        payload=np.array([base.to_bytes()], dtype=object),
    )
    view.apply(whole)
    _brokers, _gone, shards, removed = view.take_changes()
    assert shards == {"s:0": base.to_bytes()} and removed == {"s:0+3"}
    view.shards.decode(view.ledger.records())
    assert view.shards.made["s:0"].state.to_bytes() == base.to_bytes()


def test_snapshot_fields_and_deltas_without_their_record():
    assert split_field("s:3") == ("s:3", 0)
    assert split_field("s:3+12") == ("s:3", 12)
    assert split_field("s:3+x") == ("s:3+x", 0) and split_field("s:3+0") == ("s:3+0", 0)
    one = BundleShard(names=["t/ns/0x00000000_0xffffffff"], owners=["b9"])
    for col in ("short_n", "long_n", "last_seen_ms"):
        setattr(one, col, np.array([7], dtype=np.int64))
    for col in ("short_avg", "long_avg", "last_values"):
        setattr(one, col, np.full((1, 4), 2.5))
    one.last_counts = np.array([[1, 2, 3]], dtype=np.int64)
    merged = merged_shards({"s:4+2": encode_bundle_shard(one)})
    assert merged["s:4"].names == one.names and merged["s:4"].owners == ["b9"]
    assert encode_bundle_shard(merged["s:4"]) == encode_bundle_shard(one)


def _broker_rows(lists: dict[str, list[str]], event_ms: int) -> pd.DataFrame:
    import json

    from streaming.schema import BROKER

    return frame(
        OUTPUT_FIELDS,
        len(lists),
        kind=np.array([BROKER] * len(lists), dtype=object),
        name=np.array(list(lists), dtype=object),
        event_ms=np.full(len(lists), event_ms, dtype=np.int64),
        history_usage=np.full(len(lists), 0.5),
        msg_throughput_ema=np.full(len(lists), 1.0),
        doc=np.array([json.dumps({"bundles": v}) for v in lists.values()], dtype=object),
    )


def _view_figures(view) -> dict:
    out = {}
    for broker, bv in view.brokers.items():
        d = view.report_digests.by_broker[broker]
        out[broker] = (
            bv.report.bundles,
            list(bv.report.last_stats),
            bv.time_average,
            (d.max_topics, d.max_sessions, d.max_long_term_msg_rate),
            d.namespace_counts,
        )
    return out


def test_a_long_lived_view_equals_one_rebuilt_from_the_snapshot_as_bundles_change_hands():
    """The view keeps what it took from each broker's bundle list between cycles, and the
    time average summed for each broker (by the last view or a warm-up since); bundles moving
    between brokers (a new last reporter), lists changing, values changing and namespaces
    splitting must all give the view a view rebuilt from the same records gives."""
    rng = np.random.default_rng(5)
    key = "s:0"
    handle = FakeHandle()
    proc = LoadStateProcessor(0.9, 60_000, 10**9)
    proc.init(handle)
    view = DriverView()
    fields: dict[str, bytes] = {}
    nb = NamespaceBundles.initial("t/ns", 64)
    lists = {"b1": list(nb.bundle_names[:32]), "b2": list(nb.bundle_names[32:]), "b3": []}
    for batch in range(40):
        event_ms = 1_000 * (batch + 1)
        if batch % 5 == 4:  # a few bundles change hands: the new owner reports them
            src, dst = ("b1", "b2") if batch % 10 == 4 else ("b2", "b3")
            moving = lists[src][:3]
            lists[src] = lists[src][3:]
            lists[dst] = lists[dst] + moving
        if batch == 23:  # a split: the bundle's halves replace it on its broker's list
            parent = nb.bundle_names[5]
            nb = nb.split(parent, [nb.boundaries[5] + (nb.boundaries[6] - nb.boundaries[5]) // 2])
            owner = next(b for b, names in lists.items() if parent in names)
            lists[owner] = [n for n in lists[owner] if n != parent] + nb.bundle_names[5:7]
        out = []
        for broker, names in lists.items():
            if not names or rng.random() < 0.4:
                continue
            batch_rows = _batch(key, rng, names, event_ms)
            batch_rows["broker"] = broker
            out += list(proc.handleInputRows((key,), iter([batch_rows]), None))
        rows = pd.concat([*out, _broker_rows(lists, event_ms)], ignore_index=True)
        view.apply(rows)
        _redis_apply(fields, view.take_changes())
        if batch % 2:
            if batch % 4 == 1:
                view.warm()  # the next view reuses the sums made ahead where nothing changed
            continue
        namespaces = {"t/ns": nb}
        got = view.cluster_view(namespaces)
        brokers = {b: json_doc(v) for b, v in lists.items()}
        fresh = DriverView.from_snapshot(brokers, fields).cluster_view(namespaces)
        assert _view_figures(got) == _view_figures(fresh), f"batch {batch}"


def json_doc(names: list[str]) -> str:
    import json

    doc = {"report": {"bundles": names}, "historyUsage": 0.5, "msgThroughputEma": 1.0}
    return json.dumps({**doc, "updatedAtMs": 1})


def test_a_bundle_two_brokers_list_follows_its_last_reporter_with_no_list_changing():
    """Two brokers list the same bundles (a transfer's old owner still reports them), and each
    batch only one of them reports: the bundles' last reporter flips while no broker's list
    changes, so only the moved bundles the view notes from the records can tell it which
    broker's lastStats each bundle is in now."""
    rng = np.random.default_rng(11)
    key = "s:0"
    handle = FakeHandle()
    proc = LoadStateProcessor(0.9, 60_000, 10**9)
    proc.init(handle)
    view = DriverView()
    fields: dict[str, bytes] = {}
    nb = NamespaceBundles.initial("t/ns", 32)
    shared = list(nb.bundle_names[:8])
    lists = {"b1": shared + list(nb.bundle_names[8:20]), "b2": shared + list(nb.bundle_names[20:])}
    namespaces = {"t/ns": nb}
    for batch in range(16):
        event_ms = 1_000 * (batch + 1)
        reporter = "b1" if batch % 3 else "b2"
        batch_rows = _batch(key, rng, lists[reporter], event_ms)
        batch_rows["broker"] = reporter
        out = list(proc.handleInputRows((key,), iter([batch_rows]), None))
        view.apply(pd.concat([*out, _broker_rows(lists, event_ms)], ignore_index=True))
        _redis_apply(fields, view.take_changes())
        if batch % 4 == 3:
            view.warm()
            view.wait_warm()
        got = view.cluster_view(namespaces)
        brokers = {b: json_doc(v) for b, v in lists.items()}
        fresh = DriverView.from_snapshot(brokers, fields).cluster_view(namespaces)
        assert _view_figures(got) == _view_figures(fresh), f"batch {batch}"
