"""An in-process ``OwnershipStore``: the same contract as ``RedisStore``, held in dicts.

Why: unit tests and the fast simulator need ownership semantics (versions, fencing tokens,
leases judged against ``now_ms``) without a Redis server, and a second implementation keeps the
interface honest: ``tests/integration/test_store_contract.py`` runs the same assertions against
both. One lock makes every method atomic, which is what a Lua script gives ``RedisStore``, so
racing threads see the same all-or-nothing changes. Nothing here reads a clock unless given one
(``clock=``, the analogue of ``RedisStore(clock="server")``): it is then read under the lock, so
a judgement and the action on it share one instant and callers' stale times cannot matter.

The decision outcome log beside it (``outcomes``, a ``MemoryOutcomeLog``) makes it a
``DecisionStore``, as ``RedisStore`` is: ``controller.apply`` runs unchanged over either.
"""

from __future__ import annotations

import copy
import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from loadbalance.bundles import BundleRange, NamespaceBundles, topic_namespace
from loadbalance.errors import Conflict, InvalidInput
from loadbalance.lease_history import NamespaceVersion, Recorder, Revocation
from metadata_store.handover import HandoverFence, ranges_overlap
from metadata_store.leases import BrokerNotAlive, Lease, canonical_bundle, claim_of
from metadata_store.outcomes import MemoryOutcomeLog
from metadata_store.sweep_outbox import MemorySweepOutbox
from metadata_store.sweeps import OnExpired, OnMalformed

__all__ = ["MemoryStore"]


@dataclass
class _Broker:
    heartbeat_ms: int
    expires_at_ms: int
    info: dict[str, Any] = field(default_factory=dict)


class MemoryStore:
    """Bundle ranges, leases and broker registrations in memory, thread-safe with one lock."""

    def __init__(
        self, *, recorder: Recorder | None = None, clock: Callable[[], int] | None = None
    ) -> None:
        self.recorder = recorder
        self._clock = clock  # when given, the store's own clock: ``now_ms`` arguments are ignored
        self._last_now_ms = 0  # the latest time a caller gave; stamps splits and merges
        self._lock = threading.RLock()
        self._namespaces: dict[str, NamespaceBundles] = {}
        self._leases: dict[str, Lease] = {}
        self._brokers: dict[str, _Broker] = {}
        self._fence = 0  # the last fencing token handed out; only grows
        # handover fences per namespace, by the old holder's token (metadata_store.handover)
        self._handover: dict[str, dict[int, HandoverFence]] = {}
        self._not_before: dict[str, int] = {}  # bundle -> its lease's ``notbefore`` (ms)

    @functools.cached_property
    def sweep_outbox(self) -> MemorySweepOutbox:
        """The leases the sweep removed, until announced and placed again (``RedisStore``'s)."""
        return MemorySweepOutbox()

    @functools.cached_property
    def outcomes(self) -> MemoryOutcomeLog:
        """How each decision applied to this store ended (``controller.apply`` records here)."""
        return MemoryOutcomeLog()

    # -- brokers -----------------------------------------------------------------------------
    def register_broker(
        self, broker: str, now_ms: int, ttl_ms: int, info: Mapping[str, Any] | None = None
    ) -> None:
        """Register or heartbeat a broker; it is alive until ``now_ms + ttl_ms``."""
        with self._lock:
            now_ms = self._time(now_ms)
            self._brokers[broker] = _Broker(now_ms, now_ms + ttl_ms, dict(info or {}))

    heartbeat = register_broker

    def broker_info(self, broker: str) -> dict[str, Any] | None:
        """What the broker registered with (a copy), or None if it never registered."""
        with self._lock:
            b = self._brokers.get(broker)
            return copy.deepcopy(b.info) if b else None

    def live_brokers(self, now_ms: int) -> list[str]:
        with self._lock:
            now_ms = self._time(now_ms)
            return sorted(b for b, r in self._brokers.items() if r.expires_at_ms > now_ms)

    def _time(self, now_ms: Any) -> Any:
        """The time a judgement uses: the store's clock, read under the lock, or the caller's."""
        return self._seen(self._clock()) if self._clock is not None else now_ms

    def _seen(self, now_ms: int) -> int:
        self._last_now_ms = max(self._last_now_ms, now_ms)
        return now_ms

    def _claim(self, lease: Lease, kind: str) -> None:
        if self.recorder is not None:
            self.recorder.record(claim_of(lease, kind))

    def _revoke(self, lease: Lease, at_ms: int, kind: str) -> None:
        if self.recorder is not None:
            r = canonical_bundle(lease.bundle)
            self.recorder.record(
                Revocation(lease.broker, r.namespace, r.lower, r.upper, lease.token, at_ms, kind)
            )

    def _alive(self, broker: str, now_ms: int) -> bool:
        r = self._brokers.get(broker)
        return r is not None and r.expires_at_ms > now_ms

    # -- namespaces --------------------------------------------------------------------------
    def create_namespace(self, ns: str, num_bundles: int, *, exist_ok: bool = False) -> bool:
        nb = NamespaceBundles.initial(ns, num_bundles)
        with self._lock:
            if ns in self._namespaces:
                if exist_ok:
                    return False
                raise InvalidInput("namespace", f"namespace {ns} already exists")
            self._namespaces[ns] = nb
            return True

    def get_namespace(self, ns: str) -> NamespaceBundles | None:
        with self._lock:
            return self._namespaces.get(ns)  # frozen: safe to hand out

    def list_namespaces(self) -> list[str]:
        with self._lock:
            return sorted(self._namespaces)

    def _require_ns(self, ns: str) -> NamespaceBundles:
        nb = self._namespaces.get(ns)
        if nb is None:
            raise InvalidInput("namespace", f"unknown namespace {ns}")
        return nb

    def _reshape(
        self,
        ns: str,
        expected_version: int | None,
        new_of: Any,
        gone: Sequence[BundleRange],
        kind: str,
        now_ms: int | None,
    ) -> NamespaceBundles:
        """Replace ``ns``'s boundaries with ``new_of(current)`` and end the ``gone`` leases,
        all under the lock (the compare-and-set RedisStore's script does)."""
        with self._lock:
            now_ms = self._time(now_ms)
            nb = self._require_ns(ns)
            if expected_version is not None and nb.version != expected_version:
                raise Conflict(f"{ns}: version is {nb.version}, not {expected_version}")
            new = new_of(nb)  # raises InvalidBundle when the bundle is gone or bad
            at_ms = self._last_now_ms if now_ms is None else self._seen(now_ms)
            for b in gone:
                lease = self._leases.pop(b.name, None)
                if lease is not None:
                    if lease.expires_at_ms > at_ms:  # live: it ends by the move
                        self._fence_handover(lease, at_ms)
                    self._revoke(lease, at_ms, kind)
            self._namespaces[ns] = new
            if self.recorder is not None:
                self.recorder.record(NamespaceVersion(ns, new.version, new.boundaries, at_ms))
            return new

    def split_bundle(
        self,
        bundle: BundleRange | str,
        boundaries: Sequence[int],
        expected_version: int | None = None,
        *,
        now_ms: int | None = None,
    ) -> NamespaceBundles:
        r = canonical_bundle(bundle)
        points = list(boundaries)
        return self._reshape(
            r.namespace, expected_version, lambda nb: nb.split(r, points), [r], "split", now_ms
        )

    def merge_bundles(
        self,
        first: BundleRange | str,
        second: BundleRange | str,
        expected_version: int | None = None,
        *,
        now_ms: int | None = None,
    ) -> NamespaceBundles:
        a, b = canonical_bundle(first), canonical_bundle(second)
        return self._reshape(
            a.namespace, expected_version, lambda nb: nb.merge(a, b), [a, b], "merge", now_ms
        )

    # -- leases ------------------------------------------------------------------------------
    def _next_token(self) -> int:
        self._fence += 1
        return self._fence

    def _fence_handover(self, lease: Lease, now_ms: int) -> None:
        """A live ``lease`` ends by a move: its holder may serve on until it checks."""
        r = canonical_bundle(lease.bundle)
        self._wait_until(r, lease.broker, now_ms)  # prunes passed fences
        fences = self._handover.setdefault(r.namespace, {})
        fences[lease.token] = HandoverFence(
            r.namespace, r.lower, r.upper, lease.broker, lease.token, lease.expires_at_ms
        )

    def _wait_until(self, r: BundleRange, who: str, now_ms: int) -> int:
        """The latest expiry of live fences of other brokers than ``who`` over ``r`` (0: none);
        passed fences are removed."""
        fences = self._handover.get(r.namespace, {})
        nb = 0
        for token, f in list(fences.items()):
            if f.expires_at_ms <= now_ms:
                del fences[token]
            elif f.broker != who and ranges_overlap(f.lower, f.upper, r.lower, r.upper):
                nb = max(nb, f.expires_at_ms)
        return nb

    def _grant(self, bundle: str, broker: str, now_ms: int, ttl_ms: int) -> Lease:
        """A new lease with a new token, waiting for the live fences over its range."""
        nb = self._wait_until(canonical_bundle(bundle), broker, now_ms)
        self._not_before[bundle] = nb
        lease = Lease(bundle, broker, self._next_token(), now_ms + ttl_ms, now_ms)
        self._leases[bundle] = lease
        return Lease(*_fields(lease), max(0, nb - now_ms))

    def _renewal_wait(self, bundle: str, broker: str, now_ms: int) -> int:
        nb = self._not_before.get(bundle, 0)
        if nb > now_ms:
            nb = self._wait_until(canonical_bundle(bundle), broker, now_ms)
            self._not_before[bundle] = nb
        return max(0, nb - now_ms)

    def ack_handover(self, broker: str, bundle: BundleRange | str, token: int) -> bool:
        """``RedisStore.ack_handover``: the old holder stopped; its own fence goes."""
        r = canonical_bundle(bundle)
        with self._lock:
            fences = self._handover.get(r.namespace, {})
            f = fences.get(int(token))
            if f is None or f.broker != broker:
                return False
            del fences[int(token)]
            return True

    def handover_fences(self, ns: str, now_ms: int) -> list[HandoverFence]:
        """``RedisStore.handover_fences``."""
        with self._lock:
            now_ms = self._time(now_ms)
            fences = self._handover.get(ns, {}).values()
            return sorted((f for f in fences if f.expires_at_ms > now_ms), key=lambda f: f.token)

    def _live_lease(self, bundle: str, now_ms: int) -> Lease | None:
        self._seen(now_ms)
        lease = self._leases.get(bundle)
        return lease if lease is not None and lease.expires_at_ms > now_ms else None

    def acquire(self, bundle: BundleRange | str, broker: str, now_ms: int, ttl_ms: int) -> Lease:
        r = canonical_bundle(bundle)
        bundle = r.name
        with self._lock:
            now_ms = self._time(now_ms)
            nb = self._require_ns(r.namespace)
            if not nb.contains(r):
                raise InvalidInput("bundle", f"{bundle} is not a current bundle of {r.namespace}")
            if not self._alive(broker, now_ms):
                raise BrokerNotAlive("broker", f"broker {broker} is not registered or expired")
            cur = self._live_lease(bundle, now_ms)
            if cur is not None:
                raise Conflict(f"{bundle} is owned by {cur.broker} (token {cur.token})")
            lease = self._grant(bundle, broker, now_ms, ttl_ms)
            self._claim(lease, "acquire")
            return lease

    def renew_all(
        self, broker: str, leases: Mapping[str, int], now_ms: int, ttl_ms: int
    ) -> dict[str, bool]:
        renewed = self.renew_leases(broker, leases, now_ms, ttl_ms)
        return {b: lease is not None for b, lease in renewed.items()}

    def renew_leases(
        self, broker: str, leases: Mapping[str, int], now_ms: int, ttl_ms: int
    ) -> dict[str, Lease | None]:
        """``renew_all`` answering with each renewed lease, or None for a lost one."""
        out: dict[str, Lease | None] = {}
        with self._lock:
            now_ms = self._time(now_ms)
            for given in sorted(leases):
                bundle = canonical_bundle(given).name
                cur = self._live_lease(bundle, now_ms)
                ok = cur is not None and cur.broker == broker and cur.token == leases[given]
                if ok:
                    lease = Lease(bundle, broker, cur.token, now_ms + ttl_ms, now_ms)
                    self._leases[bundle] = lease
                    self._claim(lease, "renew")
                    wait = self._renewal_wait(bundle, broker, now_ms)
                    out[given] = Lease(*_fields(lease), wait)
                else:
                    out[given] = None
        return out

    def release(self, bundle: BundleRange | str, broker: str, token: int, now_ms: int) -> bool:
        bundle = canonical_bundle(bundle).name
        with self._lock:
            now_ms = self._time(now_ms)
            cur = self._live_lease(bundle, now_ms)
            if cur is None or cur.broker != broker or cur.token != token:
                return False
            del self._leases[bundle]
            self._fence_handover(cur, now_ms)
            self._revoke(cur, now_ms, "release")
            return True

    def transfer(
        self,
        bundle: BundleRange | str,
        from_broker: str,
        token: int,
        to_broker: str,
        now_ms: int,
        ttl_ms: int,
    ) -> Lease:
        if from_broker == to_broker:
            raise InvalidInput("destinationBroker", "destination is the source broker")
        bundle = canonical_bundle(bundle).name
        with self._lock:
            now_ms = self._time(now_ms)
            cur = self._live_lease(bundle, now_ms)
            if cur is None or cur.broker != from_broker or cur.token != token:
                raise Conflict(f"{bundle}: {from_broker} with token {token} does not hold it")
            if not self._alive(to_broker, now_ms):
                raise BrokerNotAlive("broker", f"broker {to_broker} is not registered or expired")
            self._fence_handover(cur, now_ms)
            lease = self._grant(bundle, to_broker, now_ms, ttl_ms)
            self._revoke(cur, now_ms, "transfer")
            self._claim(lease, "transfer")
            return lease

    def owner(self, bundle: BundleRange | str, now_ms: int) -> Lease | None:
        bundle = canonical_bundle(bundle).name
        with self._lock:
            now_ms = self._time(now_ms)
            return self._live_lease(bundle, now_ms)

    def owners(self, ns: str, now_ms: int) -> dict[str, Lease]:
        with self._lock:
            now_ms = self._time(now_ms)
            nb = self._require_ns(ns)
            out = {}
            for b in nb.bundle_names:
                lease = self._live_lease(b, now_ms)
                if lease is not None:
                    out[b] = lease
            return out

    def owned_by(self, broker: str, now_ms: int) -> dict[str, Lease]:
        """The live leases one broker holds (what RedisStore keeps in ``P:owned:<broker>``)."""
        with self._lock:
            now_ms = self._time(now_ms)
            return {
                b: lease
                for b, lease in sorted(self._leases.items())
                if lease.broker == broker and lease.expires_at_ms > now_ms
            }

    def sweep_expired(
        self,
        now_ms: int,
        *,
        on_expired: OnExpired | None = None,
        on_malformed: OnMalformed | None = None,
    ) -> list[Lease]:
        """``RedisStore.sweep_expired``: one batch, judged whole under the lock before any
        removal, each removal written to ``sweep_outbox`` in the same step; nothing is ever
        malformed, since this store holds only ``Lease`` values."""
        with self._lock:
            now_ms = self._time(now_ms)
            self._seen(now_ms)
            gone = [x for x in self._leases.values() if x.expires_at_ms <= now_ms]
            gone.sort(key=lambda x: x.bundle)
            for lease in gone:
                del self._leases[lease.bundle]
                self._revoke(lease, now_ms, "sweep")
            self.sweep_outbox.record(gone, now_ms)
        if gone and on_expired is not None:
            on_expired(list(gone))
        if on_malformed is not None:
            on_malformed([])
        return gone

    # -- lookup ------------------------------------------------------------------------------
    def lookup(self, topic: str, now_ms: int) -> tuple[str, Lease | None]:
        ns = topic_namespace(topic)
        with self._lock:
            now_ms = self._time(now_ms)
            bundle = self._require_ns(ns).find_bundle(topic).name
            return bundle, self._live_lease(bundle, now_ms)

    def lookup_many(self, topics: Sequence[str], now_ms: int) -> list[tuple[str, Lease | None]]:
        with self._lock:  # one consistent view, as RedisStore's pipelined reads aim for
            return [self.lookup(t, now_ms) for t in topics]


def _fields(lease: Lease) -> tuple[str, str, int, int, int]:
    return (lease.bundle, lease.broker, lease.token, lease.expires_at_ms, lease.granted_at_ms)
