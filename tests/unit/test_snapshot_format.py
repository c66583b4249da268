"""The published load-snapshot format (``metadata_store.load_snapshot``, docs/snapshot-format.md):
the bundle-shard record's documented layout, its refusals, and the one reader, which must give
the same ``ClusterView`` as ``lbctl decide``'s parser over the same documents, bit for bit."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from loadbalance.bundles import NamespaceBundles
from loadbalance.errors import InvalidInput
from loadbalance.snapshot import parse_snapshot
from loadbalance.view import UsageWeights
from metadata_store.load_snapshot import (
    LoadSnapshotData,
    decode_bundle_shard,
    shard_docs,
)
from streaming.shard_state import ShardState

NS = "t/ns"


def _shard(names: list[str], owner: str, seed: int = 7) -> ShardState:
    state = ShardState()
    rng = np.random.default_rng(seed)
    for r in range(3):
        values = rng.uniform(0, 1e6, size=(len(names), 4)) / 3.0  # long reprs
        counts = rng.integers(0, 50, size=(len(names), 3))
        state.apply(names, values, counts, [owner] * len(names), np.full(len(names), 100 + r))
    return state


def _report(broker: str, bundles: list[str], cpu: float) -> dict:
    return {
        "cpu": {"usage": cpu, "limit": 100.0},
        "memory": {"usage": 1000.0, "limit": 8000.0},
        "bandwidthIn": {"usage": 100.0, "limit": 1000.0},
        "bandwidthOut": {"usage": 200.0, "limit": 1000.0},
        "msgRateIn": 10.0,
        "bundles": bundles,
        "lastUpdate": 1_700_000_000_000,
    }


def _data() -> LoadSnapshotData:
    names = NamespaceBundles.initial(NS, 16).bundle_names
    a, b = names[:8], names[8:]
    shards = {"s:0": _shard(a, "b1:8080").to_bytes(), "s:1": _shard(b, "b2:8080", 9).to_bytes()}
    brokers = {
        "b1:8080": {"report": _report("b1:8080", a, 70.0), "historyUsage": 0.7 / 3},
        "b2:8080": {
            "report": _report("b2:8080", b, 20.0),
            "historyUsage": 0.1,
            "msgThroughputEma": 12.5,
            "updatedAtMs": 1_700_000_000_001,
        },
    }
    return LoadSnapshotData({k: json.dumps(v).encode() for k, v in brokers.items()}, shards)


def test_the_reader_gives_the_view_of_decides_parser_bit_for_bit():
    data = _data()
    weights = UsageWeights(cpu=1.0, memory=0.5)
    got = data.snapshot(1_700_000_000_500, weights)
    assert got is not None
    doc = {"nowMs": 1_700_000_000_500, "brokers": data.brokers, "bundleData": data.bundle_docs()}
    want = parse_snapshot(json.dumps(doc), weights)
    assert got.now_ms == want.now_ms
    assert got.view == want.view
    for name, bd in want.view.bundle_data.items():
        mine = got.view.bundle_data[name]
        assert mine.short_term.msg_rate_in.hex() == bd.short_term.msg_rate_in.hex()
        assert mine.long_term.msg_throughput_out.hex() == bd.long_term.msg_throughput_out.hex()
    assert len(got.view.bundle_data) == 16


def test_the_reader_keeps_only_the_brokers_asked_for():
    data = _data()
    snap = data.snapshot(None, brokers={"b2:8080", "gone:1"})
    assert snap is not None and set(snap.view.brokers) == {"b2:8080"}
    assert data.snapshot(None, brokers={"gone:1"}) is None


def test_the_reader_applies_decides_rules_to_the_stored_values():
    names = NamespaceBundles.initial(NS, 2).bundle_names
    bad = _shard(names, "b1:8080")
    bad.short_avg[1, 2] = float("nan")
    data = LoadSnapshotData(
        {"b1:8080": json.dumps({"report": _report("b1:8080", names, 5.0)}).encode()},
        {"s:0": bad.to_bytes()},
    )
    with pytest.raises(InvalidInput, match=r"shortTerm.msgRateIn: must be a finite number"):
        data.snapshot(None)


def test_the_record_layout_is_the_documented_one():
    """Built by hand from docs/snapshot-format.md, not with the encoder."""
    names, owners = ["t/ns/0x00000000_0xffffffff", "t/x/0x00000000_0xffffffff"], ["b1", ""]
    nb, ob = "\n".join(names).encode(), "\n".join(owners).encode()
    raw = struct.pack("<4sIII", b"LBS1", 2, len(nb), len(ob)) + nb + ob
    raw += struct.pack("<2q", 10, 3)  # short_n
    raw += struct.pack("<8d", 1, 2, 3, 4, 5, 6, 7, 8)  # short_avg: thrIn, thrOut, rateIn, rateOut
    raw += struct.pack("<2q", 100, 30)  # long_n
    raw += struct.pack("<8d", *range(11, 19))  # long_avg
    raw += struct.pack("<8d", *range(21, 29))  # last_values
    raw += struct.pack("<6q", 4, 5, 6, 7, 8, 9)  # last_counts: topics, consumers, producers
    raw += struct.pack("<2q", 1000, 2000)  # last_seen
    doc = shard_docs(decode_bundle_shard(raw))[names[0]]
    assert doc == {
        "shortTerm": {"msgThroughputIn": 1.0, "msgThroughputOut": 2.0, "msgRateIn": 3.0,
                      "msgRateOut": 4.0, "numSamples": 10},
        "longTerm": {"msgThroughputIn": 11.0, "msgThroughputOut": 12.0, "msgRateIn": 13.0,
                     "msgRateOut": 14.0, "numSamples": 100},
        "topics": 4,
        "broker": "b1",
        "lastStats": {"msgThroughputIn": 21.0, "msgThroughputOut": 22.0, "msgRateIn": 23.0,
                      "msgRateOut": 24.0, "topics": 4, "consumerCount": 5, "producerCount": 6},
        "updatedAtMs": 1000,
    }  # fmt: skip
    assert shard_docs(decode_bundle_shard(raw))[names[1]]["broker"] == ""
    # and the job's own encoder writes exactly these bytes
    assert ShardState.from_bytes(raw).to_bytes() == raw


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda raw: b"LBS2" + raw[4:], "not a version-1 bundle-shard record"),
        (lambda raw: raw[:-8], "expected"),
        (lambda raw: raw + b"\0" * 8, "expected"),
        (lambda raw: raw[:10], "shorter than its header"),
    ],
)
def test_a_record_of_another_version_or_cut_is_refused(mutate, message):
    raw = _shard(NamespaceBundles.initial(NS, 3).bundle_names, "b1").to_bytes()
    with pytest.raises(InvalidInput, match=message):
        decode_bundle_shard(mutate(raw))
