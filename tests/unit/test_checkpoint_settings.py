"""A checkpoint keeps the shard count it was started with; another count is refused."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from streaming.checkpoint_settings import (
    SETTINGS_FILE,
    CheckpointMismatch,
    check_shards,
    local_folder,
)


def test_first_start_records_the_count_and_the_same_count_starts_again(tmp_path):
    ckpt = tmp_path / "ckpt"
    check_shards(str(ckpt), 8)
    assert json.loads((ckpt / SETTINGS_FILE).read_text()) == {"shards": 8}
    check_shards(str(ckpt), 8)  # a restart with the same count
    check_shards(f"file://{ckpt}", 8)  # the same folder as a URL


def test_another_count_is_refused_naming_both_counts_and_the_way_out(tmp_path):
    check_shards(str(tmp_path), 32)
    with pytest.raises(CheckpointMismatch) as err:
        check_shards(str(tmp_path), 16)
    text = str(err.value)
    assert "--shards 32" in text and "asks for 16" in text and "new checkpoint folder" in text
    assert json.loads((tmp_path / SETTINGS_FILE).read_text()) == {"shards": 32}  # unchanged


def test_unreadable_settings_are_an_error_not_a_silent_reset(tmp_path):
    (tmp_path / SETTINGS_FILE).write_text("{not json")
    with pytest.raises(CheckpointMismatch, match="unreadable"):
        check_shards(str(tmp_path), 32)


def test_remote_checkpoints_are_not_checked_here():
    assert local_folder("s3a://bucket/ckpt") is None
    assert local_folder("hdfs://nn:8020/ckpt") is None
    check_shards("s3a://bucket/ckpt", 4)  # no error, no file: a warning says so


def test_lbctl_stream_refuses_a_changed_shard_count_before_starting_spark(tmp_path):
    check_shards(str(tmp_path / "ckpt"), 32)
    proc = subprocess.run(
        [
            sys.executable, "-m", "lbctl.main", "stream",
            "--bootstrap-servers", "127.0.0.1:1", "--checkpoint", str(tmp_path / "ckpt"),
            "--shards", "16",
        ],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "was started with --shards 32" in proc.stderr
