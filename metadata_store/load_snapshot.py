"""The load snapshot the streaming job commits and placement, recovery and the CLI read:
``P:load:brokers`` (broker -> JSON document) and ``P:load:shards`` (state shard -> ``LBS1``
blob of that shard's bundle averages).

This repository moves the stored values as they are; what is inside them is written down with
their writers (``streaming.driver_view`` for the broker documents, ``streaming.snapshot_docs``
for the blobs).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from metadata_store.keys import Keys

__all__ = ["LoadSnapshot"]


class LoadSnapshot:
    """Reads and replaces the load snapshot under one key prefix."""

    def __init__(self, client: Any, prefix: str = "lb") -> None:
        self._r = client
        self._keys = Keys(prefix)

    def broker_docs_raw(self) -> dict[str, bytes]:
        """broker -> its stored JSON document, unparsed."""
        return {k.decode(): v for k, v in self._r.hgetall(self._keys.load_brokers()).items()}

    def broker_docs(self) -> dict[str, Any]:
        """broker -> its document, parsed."""
        return {b: json.loads(v) for b, v in self.broker_docs_raw().items()}

    def broker_doc_raw(self, broker: str) -> bytes | None:
        return self._r.hget(self._keys.load_brokers(), broker)

    def shard_blobs(self) -> dict[str, bytes]:
        """state shard key -> its blob."""
        return {k.decode(): v for k, v in self._r.hgetall(self._keys.load_shards()).items()}

    def replace(self, brokers: Mapping[str, str], shards: Mapping[str, bytes]) -> None:
        """Replace the whole snapshot, atomically: broker -> JSON text, shard -> blob."""
        pipe = self._r.pipeline(transaction=True)
        pipe.delete(self._keys.load_brokers(), self._keys.load_shards())
        if brokers:
            pipe.hset(self._keys.load_brokers(), mapping=dict(brokers))
        if shards:
            pipe.hset(self._keys.load_shards(), mapping=dict(shards))
        pipe.execute()

    def stage_changes(
        self,
        pipe: Any,
        brokers: Mapping[str, str],
        removed_brokers: Iterable[str],
        shards: Mapping[str, bytes],
        removed_shards: Iterable[str],
    ) -> None:
        """Queue a batch's changes on ``pipe`` (a transaction the caller executes, so they land
        with the job's progress; ``metadata_store.progress``)."""
        bkey, skey = self._keys.load_brokers(), self._keys.load_shards()
        gone = list(removed_brokers)
        if gone:
            pipe.hdel(bkey, *gone)
        if brokers:
            pipe.hset(bkey, mapping=dict(brokers))
        gone = list(removed_shards)
        if gone:
            pipe.hdel(skey, *gone)
        if shards:
            pipe.hset(skey, mapping=dict(shards))
