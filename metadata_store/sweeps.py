"""The callbacks of an expiry sweep (``sweep_expired`` of either ownership store).

Why callbacks: the controller must announce the leases a sweep removed before anything else can
fail (``on_expired``, called per batch as soon as the store removed it), and a key under the
lease prefix that holds no lease (a plain string, a hash without ``expires``, a name that is no
canonical bundle) must be named to the operator and passed over, never crash the sweep or stop it
from removing the other expired leases (``on_malformed``). Both stores take them, so the
controller's sweep runs on either.
"""

from __future__ import annotations

from collections.abc import Callable

from metadata_store.leases import Lease

__all__ = ["OnExpired", "OnMalformed"]

OnExpired = Callable[[list[Lease]], None]
"""Called with each batch of removed leases (sorted by bundle) before the next batch is judged."""

OnMalformed = Callable[[list[str]], None]
"""Called once per sweep, at its end, with the names (after the lease prefix, sorted) of the keys
that hold no lease, left as they are; an empty list when there is none."""
