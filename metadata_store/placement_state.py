"""Preallocations, ``P:prealloc:<broker>``: bundles placement assigned to a broker that has not
reported them yet, with the averages they brought (bundle -> JSON ``{shortTerm, longTerm,
topics}``), so the next assignments count them (Pulsar's ``preallocatedBundleData``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
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
