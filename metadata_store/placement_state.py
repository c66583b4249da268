"""Preallocations, ``P:prealloc:<broker>``: bundles placement assigned to a broker that has not
reported them yet, with the averages they brought (bundle -> JSON ``{shortTerm, longTerm,
topics}``), so the next assignments count them (Pulsar's ``preallocatedBundleData``).

A preallocation ends once a report lists its bundle (``forget``; the placement path prunes them
as it reads them), as Pulsar's ``updateBundleData`` drops it: kept, it would count the bundle on
a broker it may have left since, and send the bundle back there on its next lookup.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from metadata_store.keys import Keys

__all__ = ["Preallocations"]


class Preallocations:
    """Per-broker preallocated bundles and their averages."""

    def __init__(self, client: Any, prefix: str = "lb") -> None:
        self._r = client
        self._keys = Keys(prefix)

    def of(self, broker: str) -> dict[str, Any]:
        """bundle -> its recorded document, for one broker (empty when none)."""
        entries = self._r.hgetall(self._keys.prealloc(broker))
        return {k.decode(): json.loads(v) for k, v in entries.items()}

    def record(self, broker: str, bundle: str, doc: Mapping[str, Any]) -> None:
        self._r.hset(self._keys.prealloc(broker), bundle, json.dumps(doc))

    def forget(self, broker: str, bundles: Iterable[str]) -> int:
        """End these preallocations of ``broker`` (their bundles are reported now); how many
        there were."""
        names = sorted(bundles)
        return int(self._r.hdel(self._keys.prealloc(broker), *names)) if names else 0
