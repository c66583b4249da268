"""Settings a checkpoint is bound to, kept beside Spark's own files and checked at every start.

Why: the bundle state is keyed by state shard (``crc32(bundle) % shards``, see
``streaming.parse``). Spark stores the keys, not how they were made, so a restart from the same
checkpoint with another ``--shards`` would put a bundle's new samples in a new shard while its
old averages stay in the old one until they expire: two entries for one bundle in the view and
in ``P:load:shards``, each with half of the history. Nothing in Spark notices. So the count is
written to ``lbctl-stream.json`` in the checkpoint folder when the query first starts, and a
start that asks for another count is refused with the numbers and the ways out. The same
file records the state partitions the shards' keys were balanced over (``streaming.state_keys``).

Only local checkpoint folders (a path, or a ``file:`` URL) are checked; for a remote one
(``s3a://``, ``hdfs://``) the check is skipped with a warning, since this process cannot write
there without Hadoop's file system.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from urllib.parse import urlparse

log = logging.getLogger("streaming.checkpoint_settings")

SETTINGS_FILE = "lbctl-stream.json"
DEFAULT_SHARDS = 32  # bundle state shards of a new checkpoint (``--shards``)
KEY_PARTITIONS = "stateKeyPartitions"  # the partitions the shard keys are balanced over


class CheckpointMismatch(ValueError):
    """The checkpoint was started with other settings than this run asks for."""


def local_folder(checkpoint: str) -> Path | None:
    """The checkpoint as a local folder, or ``None`` for a remote file system."""
    parsed = urlparse(checkpoint)
    if parsed.scheme in ("", "file") or len(parsed.scheme) == 1:  # 1: a Windows drive letter
        return Path(parsed.path if parsed.scheme == "file" else checkpoint)
    return None


def has_batches(folder: Path) -> bool:
    """Whether Spark has logged a batch in the checkpoint folder (its ``offsets`` log)."""
    offsets = folder / "offsets"
    return offsets.is_dir() and any(offsets.iterdir())


def check_shards(checkpoint: str, shards: int, key_partitions: int | None = None) -> int | None:
    """Check ``shards`` against the checkpoint's (``CheckpointMismatch`` if it had another);
    return the state partitions its shard keys are balanced over (``streaming.state_keys``),
    or None for the plain keys.

    A new checkpoint is recorded by the call that gives ``key_partitions`` (the query's start:
    the shuffle partitions Spark will fix for it), with its keys balanced over that many
    partitions; a call without (the command line's check before Spark starts) records nothing.
    A folder that already holds Spark's offsets but no settings (a checkpoint older than this
    file) is recorded with the plain keys its state has."""
    folder = local_folder(checkpoint)
    if folder is None:
        log.warning(
            "checkpoint %s is not a local folder: not checking that it was started with "
            "--shards %d (a different count would split bundles' state)",
            checkpoint,
            shards,
        )
        return None
    path = folder / SETTINGS_FILE
    try:
        recorded = json.loads(path.read_text())
    except FileNotFoundError:
        recorded = None
    except (OSError, ValueError) as e:
        raise CheckpointMismatch(f"checkpoint settings {path} are unreadable: {e}") from e
    if recorded is not None:
        had = recorded.get("shards") if isinstance(recorded, dict) else None
        if had != shards:
            raise CheckpointMismatch(
                f"checkpoint {checkpoint} was started with --shards {had}; this run asks for "
                f"{shards}. A bundle's state lives in one shard chosen by that count, so it "
                f"cannot change under a checkpoint: run with --shards {had}, or start a new "
                "checkpoint folder (the averages then start again from the next reports)"
            )
        partitions = recorded.get(KEY_PARTITIONS)
        return int(partitions) if partitions is not None else None
    if key_partitions is None:
        return None
    if has_batches(folder):
        settings: dict[str, int] = {"shards": shards}  # state of plain keys already there
    else:
        settings = {"shards": shards, KEY_PARTITIONS: key_partitions}
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{SETTINGS_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps(settings) + "\n")
    os.replace(tmp, path)  # atomic: a reader sees the whole file or none
    return settings.get(KEY_PARTITIONS)
