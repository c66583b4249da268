"""Preallocations, ``P:prealloc:<broker>``: bundles placement assigned to a broker that has not
reported them yet, with the averages they brought (bundle -> JSON ``{shortTerm, longTerm,
topics}``), so the next assignments count them (Pulsar's ``preallocatedBundleData``); and the
placement version, ``P:placement:version``, that orders placements made by several processes.

A preallocation is written by the script that takes the bundle's lease
(``RedisStore.acquire_placed``), in the same step, and that script also bumps the placement
version; so no reader can see the lease without the preallocation, and a placement that read
the preallocations at version ``v`` can check, in the script that would record it, that no
other placement was recorded since (``PlacementChanged`` otherwise: read again, choose again).
The controller also records one for the destination of a transfer that carries its bundle's
averages (``record``, after the transfer; ``loadbalance.transfer_preallocation``). It does not
bump the version: a placement that read before it only counts the destination as the reports
show it, as before the transfer, and a burst of transfers does not turn concurrent lookups
into retries.

A preallocation ends once the broker it was made for reports the bundle, as Pulsar's
``updateBundleData`` drops it, or once that broker no longer holds the bundle's lease (unloaded
or moved before it reported it): kept, it would count the bundle on a broker it has left.
Readers end them with ``forget_unless_changed``, which deletes nothing when a placement was
recorded after the read: the entry may be a new preallocation of the same bundle.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from loadbalance.errors import Conflict
from metadata_store.keys import Keys

__all__ = ["PlacementChanged", "PlacementRead", "Preallocations"]

# KEYS: placement version key, prealloc keys...; ARGV: expected version, then per prealloc key
# the number of bundles followed by the bundles -> 1 (deleted) | 0 (a placement came between)
_LUA_FORGET = """
local v = tonumber(redis.call('GET', KEYS[1]) or '0')
if v ~= tonumber(ARGV[1]) then return 0 end
local i = 2
for k = 2, #KEYS do
  local n = tonumber(ARGV[i])
  for j = 1, n do redis.call('HDEL', KEYS[k], ARGV[i + j]) end
  i = i + n + 1
end
return 1
"""


class PlacementChanged(Conflict):
    """Another placement was recorded after this one read the preallocations: the choice was
    made on an old view and is not recorded (a lost compare-and-set: the caller reads again
    and chooses again)."""

    def __init__(self, expected: int, found: int) -> None:
        super().__init__(f"placement version {found}, read at {expected}")
        self.expected = expected
        self.found = found


class PlacementRead:
    """The preallocations of some brokers and the placement version they were read at."""

    __slots__ = ("entries", "version")

    def __init__(self, version: int, entries: dict[str, dict[str, Any]]) -> None:
        self.version = version
        self.entries = entries


class Preallocations:
    """Per-broker preallocated bundles and their averages, and the placement version."""

    def __init__(self, client: Any, prefix: str = "lb") -> None:
        self._r = client
        self._keys = Keys(prefix)
        self._forget = client.register_script(_LUA_FORGET)

    def of(self, broker: str) -> dict[str, Any]:
        """bundle -> its recorded document, for one broker (empty when none)."""
        entries = self._r.hgetall(self._keys.prealloc(broker))
        return {k.decode(): json.loads(v) for k, v in entries.items()}

    def read(self, brokers: Sequence[str]) -> PlacementRead:
        """The placement version and these brokers' preallocations, in one transaction (so the
        entries are exactly those recorded up to that version)."""
        pipe = self._r.pipeline(transaction=True)
        pipe.get(self._keys.placement_version())
        for b in brokers:
            pipe.hgetall(self._keys.prealloc(b))
        version, *raw = pipe.execute()
        entries = {
            b: {k.decode(): json.loads(v) for k, v in got.items()}
            for b, got in zip(brokers, raw, strict=True)
            if got
        }
        return PlacementRead(int(version or 0), entries)

    def version(self) -> int:
        """Placements recorded so far (0 before the first)."""
        return int(self._r.get(self._keys.placement_version()) or 0)

    def record(self, broker: str, bundle: str, doc: Mapping[str, Any]) -> None:
        """Write one preallocation outside a placement (a transfer's destination, tools and
        tests; placements write theirs with the lease, ``RedisStore.acquire_placed``)."""
        self._r.hset(self._keys.prealloc(broker), bundle, json.dumps(doc))

    def forget(self, broker: str, bundles: Iterable[str]) -> int:
        """End these preallocations of ``broker`` unconditionally; how many there were."""
        names = sorted(bundles)
        return int(self._r.hdel(self._keys.prealloc(broker), *names)) if names else 0

    def forget_unless_changed(self, version: int, ended: Mapping[str, Iterable[str]]) -> bool:
        """End these preallocations (broker -> bundles) if no placement was recorded since
        ``version``; False (nothing deleted) otherwise, and the next reader judges again."""
        keys = [self._keys.placement_version()]
        args: list[Any] = [int(version)]
        for broker in sorted(ended):
            names = sorted(ended[broker])
            if names:
                keys.append(self._keys.prealloc(broker))
                args += [len(names), *names]
        if len(keys) == 1:
            return True
        return bool(self._forget(keys=keys, args=args))
