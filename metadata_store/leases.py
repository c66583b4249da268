"""The values every ownership store hands out: a ``Lease``, the ``BrokerNotAlive`` refusal, the
one canonical identity of a bundle, and the history claim a granted lease becomes.

They live apart from the stores so the protocol (``metadata_store.protocol``), the Redis store
and the in-memory store all depend on them, and not on each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loadbalance.bundles import BundleRange, parse_bundle
from loadbalance.errors import InvalidInput
from loadbalance.lease_history import Claim

__all__ = ["BrokerNotAlive", "Lease", "canonical_bundle", "claim_of"]


@dataclass(frozen=True, slots=True)
class Lease:
    """A bundle's ownership: who, with which fencing token, until when (epoch ms).

    ``granted_at_ms`` is the store's clock when it granted or last renewed the lease (0 where
    unknown, e.g. a lease read back); it does not take part in equality. ``wait_ms`` is, in a
    grant's or renewal's answer, how long (store ms from ``granted_at_ms``) the holder must
    still wait before it may serve: a handover fence of the previous holder is still live
    (``metadata_store.ownership_redis``, docs/ownership.md "Serving in real time"); 0 elsewhere.
    """

    bundle: str
    broker: str
    token: int
    expires_at_ms: int
    granted_at_ms: int = field(default=0, compare=False)
    wait_ms: int = field(default=0, compare=False)


class BrokerNotAlive(InvalidInput):
    """The broker is not registered, or its registration expired."""


def claim_of(lease: Lease, kind: str) -> Claim:
    """The history event for a lease the store just granted or renewed."""
    r = parse_bundle(lease.bundle)
    return Claim(
        lease.broker,
        r.namespace,
        r.lower,
        r.upper,
        lease.token,
        lease.granted_at_ms,
        lease.expires_at_ms,
        kind,
    )


def canonical_bundle(bundle: BundleRange | str) -> BundleRange:
    """The one identity of a bundle, whatever spelling (hex case) the caller used."""
    return bundle if isinstance(bundle, BundleRange) else parse_bundle(bundle)
