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
    assert check_shards(str(ckpt), 8) is None  # the command line's check: nothing recorded
    assert not (ckpt / SETTINGS_FILE).exists()
    assert check_shards(str(ckpt), 8, 2) == 2  # the query's start: keys balanced over 2
    assert json.loads((ckpt / SETTINGS_FILE).read_text()) == {
        "shards": 8,
        "stateKeyPartitions": 2,
    }
    assert check_shards(str(ckpt), 8, 5) == 2  # a restart keeps the keys it started with
    assert check_shards(str(ckpt), 8) == 2
    assert check_shards(f"file://{ckpt}", 8, 2) == 2  # the same folder as a URL


def test_a_checkpoint_with_state_but_no_settings_keeps_the_plain_keys(tmp_path):
    # started before the settings file recorded key partitions: its state has s:<n> keys
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "0").write_text("v1\n")
    assert check_shards(str(tmp_path), 32, 2) is None
    assert json.loads((tmp_path / SETTINGS_FILE).read_text()) == {"shards": 32}
    assert check_shards(str(tmp_path), 32, 2) is None
    (tmp_path / SETTINGS_FILE).write_text(json.dumps({"shards": 4}))  # an older file
    assert check_shards(str(tmp_path), 4, 2) is None


def test_another_count_is_refused_naming_both_counts_and_the_way_out(tmp_path):
    check_shards(str(tmp_path), 32, 2)
    with pytest.raises(CheckpointMismatch) as err:
        check_shards(str(tmp_path), 16)
    text = str(err.value)
    assert "--shards 32" in text and "asks for 16" in text and "new checkpoint folder" in text
    assert json.loads((tmp_path / SETTINGS_FILE).read_text())["shards"] == 32  # unchanged


def test_unreadable_settings_are_an_error_not_a_silent_reset(tmp_path):
    (tmp_path / SETTINGS_FILE).write_text("{not json")
    with pytest.raises(CheckpointMismatch, match="unreadable"):
        check_shards(str(tmp_path), 32)


def test_remote_checkpoints_are_not_checked_here():
    assert local_folder("s3a://bucket/ckpt") is None
    assert local_folder("hdfs://nn:8020/ckpt") is None
    # no error, no file: a warning says so; plain keys, since no run could learn others
    assert check_shards("s3a://bucket/ckpt", 4, 2) is None


def test_lbctl_stream_refuses_a_changed_shard_count_before_starting_spark(tmp_path):
    check_shards(str(tmp_path / "ckpt"), 32, 2)
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
