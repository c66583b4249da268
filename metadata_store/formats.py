"""Stored formats shared by more than one repository: namespace boundaries and lease hashes.

A namespace's ``boundaries`` field is its bundle boundaries as comma-separated ``0x%08x`` hex
(``0x00000000,0x40000000,...,0xffffffff``); a lease hash holds ``broker``, ``token`` and
``expires`` (epoch ms). The Redis store, the recovery rebuild and the lookup cache's reads
all go through these, so the layout is written down once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from metadata_store.leases import Lease

__all__ = ["LEASE_FIELDS", "NS_FIELDS", "boundaries_csv", "lease_from_fields", "parse_boundaries"]

NS_FIELDS = ("boundaries", "version")
LEASE_FIELDS = ("broker", "token", "expires")


def boundaries_csv(bounds: Sequence[int]) -> str:
    """The ``boundaries`` field of a namespace hash."""
    return ",".join(f"0x{b:08x}" for b in bounds)


def parse_boundaries(raw: bytes | str) -> tuple[int, ...]:
    """The inverse of ``boundaries_csv``."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    return tuple(int(x, 16) for x in text.split(","))


def lease_from_fields(bundle: str, raw: Sequence[Any]) -> Lease | None:
    """A lease hash's ``LEASE_FIELDS`` (as ``HMGET`` answers) as a ``Lease``, or None if absent;
    not judged against any clock."""
    if raw[0] is None:
        return None
    return Lease(bundle, raw[0].decode(), int(raw[1]), int(raw[2]))
