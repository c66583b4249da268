"""A local checkpoint is written through Hadoop's FileSystem API: FileContext's rename runs a
``readlink`` process per file on a local disk (about 24 a second at a 1 s trigger)."""

from __future__ import annotations

import pytest

from streaming.job import (
    CHECKPOINT_FILE_MANAGER,
    FILE_SYSTEM_BASED,
    use_file_system_api_on_local_disk,
)


class _Conf:
    def __init__(self, values: dict[str, str] | None = None) -> None:
        self.values = dict(values or {})

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value


class _Spark:
    def __init__(self, values: dict[str, str] | None = None) -> None:
        self.conf = _Conf(values)


@pytest.mark.parametrize("checkpoint", ["/var/lib/lb/ckpt", "ckpt", "file:///var/lib/lb/ckpt"])
def test_a_local_checkpoint_uses_the_file_system_api(checkpoint):
    spark = _Spark()
    assert use_file_system_api_on_local_disk(spark, checkpoint)
    assert spark.conf.get(CHECKPOINT_FILE_MANAGER) == FILE_SYSTEM_BASED


@pytest.mark.parametrize("checkpoint", ["hdfs://nn:8020/lb/ckpt", "s3a://bucket/lb/ckpt"])
def test_a_distributed_checkpoint_keeps_sparks_default(checkpoint):
    spark = _Spark()
    assert not use_file_system_api_on_local_disk(spark, checkpoint)
    assert spark.conf.get(CHECKPOINT_FILE_MANAGER) is None


def test_the_operators_choice_is_kept():
    spark = _Spark({CHECKPOINT_FILE_MANAGER: "com.example.Manager"})
    assert not use_file_system_api_on_local_disk(spark, "/ckpt")
    assert spark.conf.get(CHECKPOINT_FILE_MANAGER) == "com.example.Manager"
