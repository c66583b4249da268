"""The parse stage's fast helpers give exactly what the plain forms give."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from streaming import parse
from streaming.shard_state import shard_of


@pytest.mark.parametrize(
    "values",
    [[], [None], [b""], [b"a", None, b"bc", b"", None], [b"x" * 1000] * 5, [None] * 9 + [b"z"]],
)
def test_binary_column_equals_pyarrows_own(values: list) -> None:
    built = parse._binary_array(pa, values)
    built.validate(full=True)
    assert built.equals(pa.array(values, type=pa.binary()))
    assert built.to_pylist() == values


def test_shards_come_from_the_cache_as_shard_of_computes_them(monkeypatch) -> None:
    monkeypatch.setattr(parse, "_shard_cache", {})
    names = [f"t/ns/0x{i:08x}_0x{i + 1:08x}" for i in range(500)]
    assert parse._shards_of(names, 32) == [shard_of(n, 32) for n in names]
    assert parse._shards_of(names[::-1], 32) == [shard_of(n, 32) for n in names[::-1]]
    assert parse._shards_of(names, 7) == [shard_of(n, 7) for n in names]  # per shard count
    monkeypatch.setattr(parse, "_SHARD_CACHE_MAX", 100)
    assert parse._shards_of(names, 32) == [shard_of(n, 32) for n in names]


def _report(names: list[str]) -> bytes:
    import random

    from loadbalance.model import LocalBrokerData, NamespaceBundleStats, ResourceUsage
    from loadbalance.report_codec import encode_report

    rng = random.Random(len(names))
    stats = {
        n: NamespaceBundleStats(
            rng.uniform(0, 9), rng.uniform(0, 9), rng.uniform(0, 9), 1.0, rng.randint(0, 5), 2, 3
        )
        for n in names
    }
    doc = json.loads(encode_report(
        LocalBrokerData(broker="b:8080", cpu=ResourceUsage(10.0, 100.0), num_bundles=len(stats),
                        bundles=frozenset(stats), last_stats=stats)
    ))  # fmt: skip
    doc["lastStats"] = {n: doc["lastStats"][n] for n in names}  # in the order given
    return json.dumps(doc).encode()


def _expected_samples(raw: bytes, n_shards: int) -> list[tuple[str, bytes]]:
    """The sample rows as the plain forms make them: each shard's names in report order."""
    from loadbalance.report_codec import decode_report_columns
    from streaming.shard_state import pack_samples

    columns = decode_report_columns(raw, "b:8080")
    by_shard: dict[int, list[int]] = {}
    for i, name in enumerate(columns.names):
        by_shard.setdefault(shard_of(name, n_shards), []).append(i)
    return [
        (
            f"shard-{shard}",
            pack_samples(
                [columns.names[i] for i in rows], columns.values[rows], columns.counts[rows]
            ),
        )
        for shard, rows in sorted(by_shard.items())
    ]


@pytest.mark.parametrize("n_shards", [1, 7, 32])
def test_sample_blocks_from_a_kept_plan_equal_the_plain_ones(monkeypatch, n_shards) -> None:
    from loadbalance.view import UsageWeights

    monkeypatch.setattr(parse, "_plans", parse._ShardPlans(parse._PLANS_MAX_BYTES))
    names = [f"t/ns{i % 3}/0x{i:08x}_0x{i + 1:08x}" for i in range(300)]
    settings = parse.ParseSettings(1 << 20, n_shards, UsageWeights())
    for order in (names, names[::-1], names, names[:150]):  # new, new order, again, fewer
        raw = _report(order)
        for _ in range(2):  # the second from the kept plan
            rows = parse.parse_record(raw, b"b:8080", "t", 0, 1, 5, settings)
            got = [(r.key, r.payload) for r in rows if r.kind == "samples"]
            assert got == [
                (k.replace("shard-", parse.SHARD_PREFIX), v)
                for k, v in _expected_samples(raw, n_shards)
            ]
    assert len(parse._plans._plans) == 3
    other = parse.ParseSettings(1 << 20, n_shards + 1, UsageWeights())  # same names, more shards
    rows = parse.parse_record(_report(names), b"b:8080", "t", 0, 1, 5, other)
    assert [(r.key, r.payload) for r in rows if r.kind == "samples"] == [
        (k.replace("shard-", parse.SHARD_PREFIX), v)
        for k, v in _expected_samples(_report(names), n_shards + 1)
    ]


def test_the_kept_plans_are_bounded(monkeypatch) -> None:
    plans = parse._ShardPlans(max_bytes=20_000)
    for k in range(20):
        names = [f"t/ns{k}/0x{i:08x}_0x{i + 1:08x}" for i in range(100)]
        assert [s for s, _, _ in plans.plan(names, 4)] == sorted({shard_of(n, 4) for n in names})
        assert plans._bytes <= 20_000
