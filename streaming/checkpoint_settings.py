"""Settings a checkpoint is bound to, kept beside Spark's own files and checked at every start.

Why: the bundle state is keyed by state shard (``crc32(bundle) % shards``, see
``streaming.parse``). Spark stores the keys, not how they were made, so a restart from the same
checkpoint with another ``--shards`` would put a bundle's new samples in a new shard while its
old averages stay in the old one until they expire: two entries for one bundle in the view and
in ``P:load:shards``, each with half of the history. Nothing in Spark notices. So the count is
written to ``lbctl-stream.json`` in the checkpoint folder when the query first starts, and a
start that asks for another count is refused with the numbers and the ways out.

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


class CheckpointMismatch(ValueError):
    """The checkpoint was started with other settings than this run asks for."""


def local_folder(checkpoint: str) -> Path | None:
    """The checkpoint as a local folder, or ``None`` for a remote file system."""
    parsed = urlparse(checkpoint)
    if parsed.scheme in ("", "file") or len(parsed.scheme) == 1:  # 1: a Windows drive letter
        return Path(parsed.path if parsed.scheme == "file" else checkpoint)
    return None


def check_shards(checkpoint: str, shards: int) -> None:
    """Record ``shards`` for a new checkpoint; raise ``CheckpointMismatch`` if it had another."""
    folder = local_folder(checkpoint)
    if folder is None:
        log.warning(
            "checkpoint %s is not a local folder: not checking that it was started with "
            "--shards %d (a different count would split bundles' state)",
            checkpoint,
            shards,
        )
        return
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
        return
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{SETTINGS_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps({"shards": shards}) + "\n")
    os.replace(tmp, path)  # atomic: a reader sees the whole file or none
