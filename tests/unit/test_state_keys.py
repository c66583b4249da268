"""Shard state keys dealt out evenly over Spark's state partitions, published as ``s:<n>``."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from loadbalance.bundles import NamespaceBundles
from loadbalance.view import UsageWeights
from metadata_store.load_snapshot import delta_key
from streaming.parse import ParseSettings
from streaming.schema import SHARD, SHARD_DELTA
from streaming.shard_cache import WORKER_SHARD_CACHE
from streaming.state import LoadStateProcessor
from streaming.state_keys import (
    shard_keys,
    shard_name,
    shard_number,
    spark_hash,
    spark_partition,
)
from tests.unit.test_shard_deltas import _batch
from tests.unit.test_state_shard_cache import FakeHandle

# Spark's own ``hash()`` of these strings (``select hash(k)``, Spark 4.3): the tail of one to
# three bytes, a whole word, a negative hash and non-ASCII text; the integration test
# test_state_keys_spark.py checks hundreds more against a running Spark.
SPARK_HASHES = {
    "": 142593372,
    "s:0": 1522348994,
    "s:1.1": 1920060921,
    "abc": 1322437556,
    "abcd": -396302900,
    "h\u00e9llo": 1212979866,
    "b:broker-1:8080": 859336746,
}


@pytest.fixture(autouse=True)
def _empty_cache():
    WORKER_SHARD_CACHE.clear()
    yield
    WORKER_SHARD_CACHE.clear()


def test_the_hash_is_sparks():
    assert {k: spark_hash(k) for k in SPARK_HASHES} == SPARK_HASHES


@pytest.mark.parametrize("n_shards", [1, 4, 32, 100])
@pytest.mark.parametrize("partitions", [1, 2, 3, 4, 8, 200])
def test_shards_are_dealt_out_evenly_over_the_state_partitions(n_shards, partitions):
    keys = shard_keys(n_shards, partitions)
    per_partition = Counter(spark_partition(k, partitions) for k in keys)
    want = Counter(n % partitions for n in range(n_shards))
    assert per_partition == want  # shard n in partition n % partitions: counts differ by <= 1
    assert [shard_name(k) for k in keys] == [f"s:{n}" for n in range(n_shards)]
    assert [shard_number(k) for k in keys] == list(range(n_shards))
    assert len(set(keys)) == n_shards


def test_the_plain_keys_split_unevenly_which_is_why_keys_are_chosen():
    plain = shard_keys(32, None)
    assert plain == tuple(f"s:{n}" for n in range(32))
    counts = Counter(spark_partition(k, 2) for k in plain)
    assert sorted(counts.values()) == [13, 19]  # one task had 46 % more bundles
    assert shard_keys(32, 2)[0] == "s:0"  # a key already in its partition keeps no salt


def test_parse_settings_carry_the_keys_bit_for_bit_and_refuse_a_wrong_count():
    keys = shard_keys(8, 2)
    settings = ParseSettings(1 << 20, 8, UsageWeights(), keys)
    back = ParseSettings.from_json(settings.to_json())
    assert back == settings and back.shard_key(3) == keys[3]
    plain = ParseSettings(1 << 20, 8, UsageWeights())
    assert ParseSettings.from_json(plain.to_json()).shard_key(3) == "s:3"
    with pytest.raises(ValueError, match="7 shard keys for 8 shards"):
        ParseSettings(1 << 20, 8, UsageWeights(), keys[:7])


def test_a_salted_key_publishes_its_records_under_the_shard_name():
    (key,) = [k for k in shard_keys(32, 2) if "." in k][:1]
    name = shard_name(key)
    proc = LoadStateProcessor(0.9, 60_000, 9_000)
    proc.init(FakeHandle())
    rng = np.random.default_rng(5)
    names = list(NamespaceBundles.initial("t/ns", 64).bundle_names[:10])
    first = list(proc.handleInputRows((key,), iter([_batch(key, rng, names, 1_000)]), None))
    second = list(proc.handleInputRows((key,), iter([_batch(key, rng, names[:3], 2_000)]), None))
    assert (first[0]["kind"].iloc[0], first[0]["name"].iloc[0]) == (SHARD, name)
    assert (second[0]["kind"].iloc[0], second[0]["name"].iloc[0]) == (
        SHARD_DELTA,
        delta_key(name, 1),
    )
