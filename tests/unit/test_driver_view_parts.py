"""The driver view's parts on their own: the decoded shards' generation, the assembler's caches
dropped by it, the broker document's one encoder and decoder, and caches owned per view."""

from __future__ import annotations

import gc
import json

from loadbalance.bundles import NamespaceBundles
from metadata_store.load_snapshot import (
    decode_broker_docs,
    decode_broker_entry,
    encode_broker_entry,
)
from streaming.decoded_shards import DecodedShards
from streaming.driver_view import DriverView
from streaming.gc_pause import GcPause
from streaming.view_ledger import ViewLedger
from tests.unit.test_snapshot_docs import NS, _broker_rows, _shard_rows, _state


def test_the_generation_grows_only_when_bundles_are_renumbered():
    names = NamespaceBundles.initial(NS, 8).bundle_names
    ledger = ViewLedger()
    shards = DecodedShards(GcPause())
    seen = [shards.generation]

    def decode(blobs: dict[str, bytes]) -> None:
        ledger.apply(_shard_rows(blobs))
        shards.decode(ledger.records())
        seen.append(shards.generation)

    decode({"s:0": _state(names[:4], "b0", 5).to_bytes()})  # new bundles
    changed = _state(names[:4], "b0", 5)
    changed.short_avg[1] = [1.0, 2.0, 3.0, 4.0]
    decode({"s:0": changed.to_bytes()})  # same names, other values: the rows stay
    decode({"s:1": _state(names[4:], "b1", 5).to_bytes()})  # another shard
    decode({"s:1": _state(names[4:6], "b1", 5).to_bytes()})  # fewer bundles
    assert seen == [0, 1, 1, 2, 3]
    _, where, generation = shards.current()
    assert generation == 3 and set(where) == set(names[:6])


def test_a_renumbering_drops_the_assemblers_rows_and_the_view_equals_a_fresh_one():
    """The assembler keeps each broker's rows per generation: after bundles are renumbered
    (a shard grew) its view must be the one a fresh view builds from the same records."""
    names = NamespaceBundles.initial(NS, 8).bundle_names
    namespaces = {NS: NamespaceBundles.initial(NS, 8)}
    view = DriverView()
    view.apply(_shard_rows({"s:0": _state(names[:4], "b0", 5).to_bytes()}))
    view.apply(_broker_rows({"b0": {"bundles": names}}))
    before = view.cluster_view(namespaces)
    assert set(before.brokers["b0"].report.last_stats) == set(names[:4])
    view.apply(_shard_rows({"s:1": _state(names[4:], "b0", 5).to_bytes()}))
    after = view.cluster_view(namespaces)
    fresh = DriverView()
    fresh.apply(_shard_rows({k: b for k, (b, _) in view.ledger.records().items()}))
    fresh.apply(_broker_rows({"b0": {"bundles": names}}))
    want = fresh.cluster_view(namespaces)
    assert set(after.brokers["b0"].report.last_stats) == set(names)
    assert dict(after.brokers["b0"].report.last_stats) == dict(want.brokers["b0"].report.last_stats)
    assert after.brokers["b0"].time_average == want.brokers["b0"].time_average


def test_the_broker_document_reads_back_bit_for_bit():
    usage, wmax, ema = 0.1 + 0.2, 1 / 3, 2.5e-310  # long reprs and a subnormal
    raw = encode_broker_entry('{"cpu":{"usage":1.0,"limit":2.0}}', usage, wmax, ema, 42)
    entry = decode_broker_entry(raw)
    assert (entry.history_usage, entry.weighted_max_ema, entry.msg_throughput_ema) == (
        usage,
        wmax,
        ema,
    )
    assert entry.updated_at_ms == 42 and entry.report == {"cpu": {"usage": 1.0, "limit": 2.0}}
    older = json.loads(raw)
    del older["weightedMaxEma"]
    assert decode_broker_entry(json.dumps(older)).weighted_max_ema is None
    shown = decode_broker_docs({"a": raw, "b": b"not json", "c": b"[1]"}, skip_unreadable=True)
    assert list(shown) == ["a"]


def test_views_share_no_cache_and_pauses_count_their_own_freezes():
    names = NamespaceBundles.initial(NS, 4).bundle_names
    one, two = DriverView(), DriverView()
    one.apply(_shard_rows({"s:0": _state(names, "b0", 5).to_bytes()}))
    one.apply(_broker_rows({"b0": {"bundles": names}}))
    one.cluster_view({NS: NamespaceBundles.initial(NS, 4)})
    assert len(one) == 4 and one.shards.generation == 1
    assert len(two) == 0 and two.shards.generation == 0 and not two.shards.made
    assert two.cluster_view({}).brokers == {}
    assert one.gc is not two.gc
    counts = (one.gc.frozen, two.gc.frozen)
    with one.gc_paused():
        pass
    assert (one.gc.frozen, two.gc.frozen) == (counts[0] + 1, counts[1])
    gc.unfreeze()


def test_get_on_a_brokers_last_stats_makes_that_bundle_only_and_the_same_value():
    """A cycle records its moves with ``last_stats.get``; made through ``__getitem__`` that read
    built every bundle of the broker (0.7 s of a 16k-move cycle at a million bundles)."""
    names = NamespaceBundles.initial(NS, 8).bundle_names
    namespaces = {NS: NamespaceBundles.initial(NS, 8)}
    view = DriverView()
    view.apply(_shard_rows({"s:0": _state(names, "b0", 5).to_bytes()}))
    view.apply(_broker_rows({"b0": {"bundles": names}}))
    stats = view.cluster_view(namespaces).brokers["b0"].report.last_stats
    one = stats.get(names[3])
    made = {len(m.stats) for m in stats._made.values()}  # values made so far, per shard
    assert made == {1}, made
    assert stats.get("t/ns/0x00000000_0x00000001") is None and stats.get("x", 7) == 7
    fresh = view.cluster_view(namespaces).brokers["b0"].report.last_stats
    assert one == dict(fresh)[names[3]]
