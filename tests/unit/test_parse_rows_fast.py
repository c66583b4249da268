"""The parse stage's fast helpers give exactly what the plain forms give."""

from __future__ import annotations

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
