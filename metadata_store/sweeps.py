"""What one expiry sweep of an ownership store did: the leases it removed and the lease keys it
could not read as leases.

Why a report and not only the list of removed leases: a key under the lease prefix that holds
no lease (a plain string, a hash without ``expires``, a name that is no canonical bundle) must be
named to the operator and passed over, never crash the sweep or stop it from removing the
other expired leases. Both stores give this type, so the controller's sweep runs on either.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from metadata_store.leases import Lease

__all__ = ["OnExpired", "SweepReport"]

OnExpired = Callable[[list[Lease]], None]
"""Called with each group of leases as soon as the store removed them, before it judges the
next group: the controller announces them before anything else can fail."""


@dataclass(frozen=True, slots=True)
class SweepReport:
    """``expired``: the leases removed, sorted by bundle. ``malformed``: the names (after the
    lease prefix) of keys that hold no lease, left as they are, sorted."""

    expired: list[Lease] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)
