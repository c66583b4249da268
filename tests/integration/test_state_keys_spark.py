"""The shard keys' partitions as a running Spark computes them (its hash and its shuffle)."""

from __future__ import annotations

import random
import string

from streaming.state_keys import shard_keys, spark_hash, spark_partition


def test_spark_hash_equals_sparks_own_for_many_strings(spark):
    rng = random.Random(7)
    alphabet = string.printable + "\u00e9\u00df\u65e5\u672c\U0001f600"
    texts = [f"s:{n}" for n in range(200)] + [f"s:{n}.{k}" for n in range(40) for k in range(9)]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60))) for _ in range(500)]
    rows = spark.createDataFrame([(t,) for t in texts], "k string").selectExpr("k", "hash(k) h")
    assert {r.k: r.h for r in rows.collect()} == {t: spark_hash(t) for t in texts}


def test_the_state_shuffle_puts_each_shard_key_in_the_partition_chosen_for_it(spark):
    from pyspark.sql import functions as F

    for n_shards, partitions in ((32, 2), (32, 3), (12, 8)):
        keys = shard_keys(n_shards, partitions)
        got = (
            spark.createDataFrame([(k,) for k in keys], "k string")
            .repartition(partitions, "k")  # the hash partitioning of a groupBy on the key
            .select("k", F.spark_partition_id().alias("p"))
            .collect()
        )
        assert {r.k: r.p for r in got} == {k: spark_partition(k, partitions) for k in keys}
        assert sorted(r.p for r in got) == sorted(n % partitions for n in range(n_shards))
