"""State keys of the bundle shards, chosen so that Spark's state partitions get equal shares.

Why: the state step runs one task per state partition, and Spark puts a key in partition
``pmod(murmur3(key, seed 42), partitions)`` (``HashPartitioning``). With 32 shards keyed
``s:0`` ... ``s:31`` on the default 2 partitions, that is 19 shards in one task and 13 in the
other, so every batch waits for the task with 46 % more bundles. Each shard's key is therefore
``s:<n>``, or ``s:<n>.<salt>`` with the smallest salt that puts it in partition ``n % partitions``:
the shards are dealt out evenly. The record a shard publishes keeps the name ``s:<n>``
(``shard_name``), so the load snapshot does not change.

A checkpoint is bound to the keys it started with (Spark stores the keys, not how they were
made): ``streaming.checkpoint_settings`` records the partition count the keys were chosen for,
and a checkpoint that recorded none (one started before, or a remote folder it cannot write)
keeps the plain ``s:<n>``.

Pure: the hash is Spark's ``Murmur3_x86_32.hashUnsafeBytes`` (with its per-byte tail) on the
UTF-8 bytes, checked against Spark's own ``hash()`` by the tests.
"""

from __future__ import annotations

from metadata_store.load_snapshot import shard_key
from streaming.schema import SHARD_PREFIX

SALT_SEP = "."
"""Between a shard's name and the salt of its key (a shard name is ``s:`` and digits)."""

_SEED = 42  # HashPartitioning's seed
_M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def _mix_k1(k1: int) -> int:
    k1 = (k1 * 0xCC9E2D51) & _M32
    return (_rotl(k1, 15) * 0x1B873593) & _M32


def _mix_h1(h1: int, k1: int) -> int:
    h1 = _rotl(h1 ^ k1, 13)
    return (h1 * 5 + 0xE6546B64) & _M32


def _fmix(h1: int, length: int) -> int:
    h1 ^= length
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _M32
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _M32
    return h1 ^ (h1 >> 16)


def spark_hash(text: str, seed: int = _SEED) -> int:
    """Spark's ``hash(text)`` for a string column (a signed 32-bit integer)."""
    data = text.encode()
    h1 = seed & _M32
    aligned = len(data) - len(data) % 4
    for i in range(0, aligned, 4):
        h1 = _mix_h1(h1, _mix_k1(int.from_bytes(data[i : i + 4], "little")))
    for b in data[aligned:]:  # Spark mixes each tail byte alone, as a signed int
        h1 = _mix_h1(h1, _mix_k1((b - 256 if b > 127 else b) & _M32))
    h = _fmix(h1, len(data))
    return h - (1 << 32) if h & 0x80000000 else h


def spark_partition(key: str, partitions: int) -> int:
    """The shuffle partition Spark's hash partitioning gives a string key."""
    return spark_hash(key) % partitions  # Python's % of a positive divisor is pmod


def shard_keys(n_shards: int, partitions: int | None) -> tuple[str, ...]:
    """The state key of each shard ``0 .. n_shards - 1``: balanced over ``partitions`` (see the
    module docstring), or plain ``s:<n>`` when ``partitions`` is None."""
    if partitions is None:
        return tuple(shard_key(n) for n in range(n_shards))
    if partitions < 1:
        raise ValueError(f"state partitions must be at least 1, not {partitions}")
    keys = []
    for n in range(n_shards):
        want, key, salt = n % partitions, shard_key(n), 0
        while spark_partition(key, partitions) != want:
            salt += 1
            key = f"{shard_key(n)}{SALT_SEP}{salt}"
        keys.append(key)
    return tuple(keys)


def shard_name(key: str) -> str:
    """The published name ``s:<n>`` of a shard's state key."""
    return key.split(SALT_SEP, 1)[0]


def shard_number(key: str) -> int:
    """The shard number of a shard's state key (or of its name)."""
    return int(shard_name(key)[len(SHARD_PREFIX) :])
