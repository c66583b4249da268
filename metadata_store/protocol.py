"""The ownership store interface: what the applier, placement, control loop and CLI may ask of
the metadata store (Pulsar keeps the same things in ZooKeeper).

Why a ``Protocol``: the policy and the controller should not care whether ownership lives in
Redis (``metadata_store.ownership_redis.RedisStore``, the product) or in process memory
(``metadata_store.ownership_memory.MemoryStore``, for unit tests and the fast simulator). Both
are checked by the same contract tests (``tests/integration/test_store_contract.py``), so a
behaviour written down here is a behaviour both keep.

The contract, in one place:

* **One clock per judgement.** Every lease and registration is judged against one clock,
  inside the atomic step that acts on the judgement, never by key expiry. ``MemoryStore`` and a
  ``RedisStore`` with ``clock="caller"`` use the caller's ``now_ms`` (epoch ms; tests and the
  simulator); the product's ``RedisStore`` (``clock="server"``) uses Redis's ``TIME`` and
  ignores ``now_ms``. A lease or registration with ``expires_at_ms <= now`` is expired.
* **One identity per bundle.** Bundles are ``BundleRange`` values or any spelling
  ``parse_bundle`` accepts; every key and every answer uses the canonical lower-case name.
* **History.** Given a ``recorder`` (``loadbalance.lease_history``), a store reports every claim
  it granted and every claim it ended, with its own clock, for ``loadbalance.lease_checker``.
* **Namespace versions.** Each namespace's boundaries carry a version that starts at 0 and
  grows by exactly one with every split or merge. A split or merge given ``expected_version``
  is a compare-and-set: a mismatch raises ``Conflict`` and changes nothing. Without it, a
  lost race re-reads and retries a bounded number of times.
* **The ring is always covered exactly.** Boundaries start at ``0x00000000``, end at
  ``0xffffffff`` and strictly increase after every operation, including racing ones: no
  overlapping or missing ranges ever become visible.
* **Fencing tokens only grow.** Every acquire or transfer takes a new token from one
  store-wide counter, so a new owner's token is larger than every token handed out before.
* **A broker that lost a lease can neither renew nor release it.** Renew, release and
  transfer need the holder's name *and* its current token *and* a live lease.
* **Splits and merges end the leases** of the bundles that disappear; the new bundles start
  unowned.
* **Only live registered brokers get leases**: acquire and transfer raise ``BrokerNotAlive``
  for an unknown or expired destination.
* **A move leaves a handover fence.** A live lease that ends by anything but expiry (transfer,
  release, split, merge) leaves a fence (its range, holder, token and expiry); a lease granted
  over a range with a live fence of another broker answers ``Lease.wait_ms`` (store ms until the
  latest such expiry), and so do its renewals until the old holder acknowledges
  (``ack_handover``, sent after it stopped serving) or the expiry passes
  (``metadata_store.handover``).

Errors follow ``loadbalance.errors``: ``InvalidInput`` (unknown namespace, a bundle that is not
current, bad boundaries, a bad name; ``BrokerNotAlive`` and ``InvalidBundle`` are subclasses),
``Conflict`` (someone else holds it, or a compare-and-set lost).

Not part of this interface: the load snapshot the streaming job writes, preallocations, the
event outbox and the recovery records. Those are Redis-only key families, each with its own
repository in this package (``metadata_store.keys`` lists them), reached from a ``RedisStore``.
The applier's outcome log is the one other family with an in-memory twin: ``DecisionStore``
is an ownership store that carries one (``outcomes``), so ``controller.apply`` runs the same
code over Redis and over ``MemoryStore`` (the fast simulator).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from loadbalance.bundles import NamespaceBundles
from metadata_store.handover import HandoverFence
from metadata_store.leases import Lease
from metadata_store.outcomes import OutcomeRecords
from metadata_store.sweeps import OnExpired, OnMalformed

__all__ = ["DecisionStore", "OwnershipStore"]


@runtime_checkable
class OwnershipStore(Protocol):
    """Bundle ranges, ownership leases and the broker registry (see the module docstring)."""

    # -- brokers -----------------------------------------------------------------------------
    def register_broker(
        self, broker: str, now_ms: int, ttl_ms: int, info: Mapping[str, Any] | None = None
    ) -> None:
        """Register or heartbeat ``broker``; it is live until ``now_ms + ttl_ms`` (exclusive).

        Registering again replaces the deadline and ``info``; it never touches leases.
        """
        ...

    def heartbeat(
        self, broker: str, now_ms: int, ttl_ms: int, info: Mapping[str, Any] | None = None
    ) -> None:
        """The same as ``register_broker`` (what the agent calls on every tick)."""
        ...

    def live_brokers(self, now_ms: int) -> list[str]:
        """Registered brokers whose registration has not expired at ``now_ms``, sorted."""
        ...

    # -- namespaces --------------------------------------------------------------------------
    def create_namespace(self, ns: str, num_bundles: int, *, exist_ok: bool = False) -> bool:
        """Create ``ns`` with Pulsar's initial equal partitions at version 0.

        Returns True when created. An existing namespace is left untouched: False with
        ``exist_ok``, else ``InvalidInput`` ("already exists").
        """
        ...

    def get_namespace(self, ns: str) -> NamespaceBundles | None:
        """The current boundaries and version of ``ns``, or None when it does not exist."""
        ...

    def list_namespaces(self) -> list[str]:
        """Every namespace, sorted."""
        ...

    def split_bundle(
        self,
        bundle: str,
        boundaries: Sequence[int],
        expected_version: int | None = None,
        *,
        now_ms: int | None = None,
    ) -> NamespaceBundles:
        """Split ``bundle`` at ``boundaries`` (strictly inside it); the parent's lease ends.

        Returns the namespace after the split (version + 1). ``Conflict`` when
        ``expected_version`` is given and differs; ``InvalidInput`` for an unknown namespace, a
        bundle that is not current, or bad boundaries.
        """
        ...

    def merge_bundles(
        self,
        first: str,
        second: str,
        expected_version: int | None = None,
        *,
        now_ms: int | None = None,
    ) -> NamespaceBundles:
        """Merge two adjacent current bundles into one (not a Pulsar operation).

        Both leases end; the merged bundle starts unowned. Same errors as ``split_bundle``.
        """
        ...

    # -- leases ------------------------------------------------------------------------------
    def acquire(self, bundle: str, broker: str, now_ms: int, ttl_ms: int) -> Lease:
        """Take a free or expired current bundle for a live broker, with a new fencing token.

        ``InvalidInput`` if the bundle is not current, ``BrokerNotAlive`` if the broker is not
        live (checked before ownership), ``Conflict`` if any live lease exists (even the
        caller's own: renew instead).
        """
        ...

    def renew_leases(
        self, broker: str, leases: Mapping[str, int], now_ms: int, ttl_ms: int
    ) -> dict[str, Lease | None]:
        """``renew_all`` answering with each renewed ``Lease`` (new expiry, the store's time of
        the renewal in ``granted_at_ms``) or None for a lease that was lost."""
        ...

    def renew_all(
        self, broker: str, leases: Mapping[str, int], now_ms: int, ttl_ms: int
    ) -> dict[str, bool]:
        """Extend each ``bundle -> token`` lease to ``now_ms + ttl_ms`` in one call.

        A lease is renewed only if ``broker`` holds it with exactly that token and it has not
        expired at ``now_ms``; the answer says which were (a lost lease stays lost).
        """
        ...

    def release(self, bundle: str, broker: str, token: int, now_ms: int) -> bool:
        """End a lease; only the live holder with the current token can (else False)."""
        ...

    def transfer(
        self, bundle: str, from_broker: str, token: int, to_broker: str, now_ms: int, ttl_ms: int
    ) -> Lease:
        """Move a live lease to another live broker atomically, with a new (larger) token.

        ``InvalidInput`` if source and destination are the same, ``Conflict`` if
        ``from_broker``/``token`` do not hold a live lease (checked first), ``BrokerNotAlive``
        if the destination is not live.
        """
        ...

    def ack_handover(self, broker: str, bundle: str, token: int) -> bool:
        """``broker`` stopped serving ``bundle``, which a move took from it while it held
        ``token``: end its handover fence (only its own; False if there was none)."""
        ...

    def handover_fences(self, ns: str, now_ms: int) -> list[HandoverFence]:
        """The handover fences of ``ns`` live at ``now_ms``, by token."""
        ...

    def owner(self, bundle: str, now_ms: int) -> Lease | None:
        """The live lease on ``bundle``, or None (free, expired, or not a bundle)."""
        ...

    def owners(self, ns: str, now_ms: int) -> dict[str, Lease]:
        """Live leases of the current bundles of ``ns`` (``InvalidInput`` if unknown)."""
        ...

    def sweep_expired(
        self,
        now_ms: int,
        *,
        on_expired: OnExpired | None = None,
        on_malformed: OnMalformed | None = None,
    ) -> list[Lease]:
        """Remove every lease expired at ``now_ms`` and return them sorted by bundle.

        Each removal is conditional on the lease read in the same atomic step, so a lease
        renewed or re-acquired concurrently is never removed, and each removed lease is written
        to the store's ``sweep_outbox`` in that step (``metadata_store.sweep_outbox``), so a
        caller killed before announcing it leaves it for the next sweep. ``on_expired`` gets
        each batch of removed leases (sorted by bundle) before the next batch is judged;
        ``on_malformed`` gets, once at the end, the names of the keys under the lease prefix
        that hold no lease, left as they are (``metadata_store.sweeps``).
        """
        ...

    # -- lookups -----------------------------------------------------------------------------
    def lookup(self, topic: str, now_ms: int) -> tuple[str, Lease | None]:
        """Topic -> (its current bundle, the live lease or None); never assigns.

        ``InvalidInput`` for an unknown namespace or a malformed topic.
        """
        ...

    def lookup_many(self, topics: Sequence[str], now_ms: int) -> list[tuple[str, Lease | None]]:
        """``[lookup(t, now_ms) for t in topics]``, batched; the same answers, in order."""
        ...


@runtime_checkable
class DecisionStore(OwnershipStore, Protocol):
    """An ownership store with the decision outcome log beside it: what the applier needs.

    ``RedisStore`` keeps the log in Redis (``OutcomeLog``), ``MemoryStore`` in memory
    (``MemoryOutcomeLog``); both follow ``OutcomeRecords``' rules.
    """

    @property
    def outcomes(self) -> OutcomeRecords:
        """The outcome log of decisions applied to this store."""
        ...
