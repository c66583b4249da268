"""Topic lookups answered from process memory, kept fresh by Redis server-assisted invalidation.

Pulsar's brokers do not ask ZooKeeper on every lookup: ``OwnershipCache`` and the
``NamespaceService`` bundle cache hold ownership and bundle ranges in memory and watches keep
them fresh. ``LookupCache`` does the same in front of ``RedisStore``: it keeps each namespace's
boundaries (and bundle names) and each looked-up bundle's lease (holder, fencing token, expiry)
in dicts, and a background thread keeps them fresh with Redis **client-side caching in
broadcasting mode**: one RESP3 connection runs
``CLIENT TRACKING ON BCAST PREFIX <p>:ns: PREFIX <p>:lease:``, so Redis pushes an
``invalidate`` message for every key under those prefixes that any client modifies (the store's
Lua scripts included; no store change is needed). Why broadcasting rather than the default
per-read tracking: reads then go through the store's ordinary connection pool and the tracking
connection only listens, so a lost read connection cannot silently lose tracking state.

What an invalidation does:

* ``<p>:ns:<tenant/ns>`` changed (split or merge): the namespace's boundaries are dropped and
  re-read on the next lookup into it.
* ``<p>:lease:<bundle>`` changed (acquire, renew, transfer, release, sweep, or a reshape that
  deleted it): a cached entry is **re-read by the tracking thread** (one pipelined ``HMGET``
  per burst of messages) and replaced, or forgotten if the lease is gone; entries not cached
  are ignored. Re-reading instead of dropping matters because every lease renewal is a write:
  dropping would turn each renewal into a miss on the lookup path
  (``refresh_on_invalidate=False`` drops instead, for clusters where lookups are rare).
* A ``null`` invalidation (``FLUSHALL``/``FLUSHDB``) or a lost tracking connection: everything
  is dropped; after reconnecting and re-enabling tracking the cache fills again from Redis.

**How stale an answer can be, and why that is safe.** The tracking thread sends ``PING`` every
``heartbeat_ms`` on the tracking connection. Redis answers in order, so when the ``PONG`` of a
``PING`` sent at time ``s`` has been read, every invalidation for writes Redis executed before
that ``PING`` has been read *and applied* (re-reads included). A lookup is answered from memory
only if such an ``s`` lies within ``max_staleness_ms`` of the lookup's start; otherwise (tracking
connection lost, Redis slow, the thread starved) it goes to Redis directly through
``RedisStore.lookup``/``lookup_many``. So an answer reflects every ownership and boundary change
that completed at Redis at least ``max_staleness_ms`` (default 500 ms) before the lookup began.
In practice a change shows up within one message delivery, well under a millisecond on loopback,
plus up to a few 5 ms GIL switch intervals when the caller's thread keeps the interpreter busy.
An answer is never stale for longer than the bound: there is no "serve from cache forever"
mode. Leases are judged against the caller's ``now_ms`` on every lookup, exactly as the
store does, so a lease that expired is never reported as live even if no message arrived; a
renewal not seen yet can make a live lease look expired for at most the bound, which is
reported as "no owner" and leads to an ``acquire`` that fails with ``Conflict``.

Staleness within the bound is safe for the same reasons it is in Pulsar: a lookup is a hint
about where to connect, not a grant. Every ownership write (renew, release, transfer) is fenced
by the holder's token in a Lua script, so nothing a stale reader does can overwrite the new
owner; and a Pulsar client sent to a broker that no longer owns the bundle is redirected (or
looks up again) when that broker refuses the topic.

Concurrency: lookups run on the caller's thread and read the dicts without a lock (single dict
reads are atomic under the GIL); fills and invalidations take one lock. A fill registers a
placeholder for its Redis key before reading; an invalidation of that key removes the
placeholder, and the fill then does not store what it read, because it may predate the change
(the classic client-side-caching race between a read reply and an invalidation that travel on
different connections).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis

from loadbalance.bundles import bundle_index, topic_namespace, topic_namespace_and_hash
from loadbalance.errors import InvalidInput
from metadata_store.leases import Lease
from metadata_store.ownership_redis import RedisStore

log = logging.getLogger(__name__)

_MISS = object()  # not cached (a cached ``None`` means: no lease key, the bundle is free)
_PUSH = object()  # what the push handler returns, to tell pushes from the PONG reply


class _TrackingLost(Exception):
    """The tracking connection stopped confirming freshness (no PONG in time)."""


@dataclass(frozen=True, slots=True)
class _NsEntry:
    """One namespace's boundaries and bundle names at one version."""

    boundaries: tuple[int, ...]
    names: list[str]
    version: int


@dataclass(slots=True)
class CacheStats:
    """Counters for tests, benchmarks and logs (hits are not counted: the hot path stays lean)."""

    misses: int = 0  # lease or namespace entries read from Redis on the lookup path
    fallbacks: int = 0  # lookups sent to RedisStore because freshness was not confirmed
    invalidated_keys: int = 0  # keys named by invalidation messages
    refreshed: int = 0  # cached leases re-read by the tracking thread
    flushes: int = 0  # whole-cache drops (connection lost, resync, FLUSHALL)
    connects: int = 0  # tracking connections established (more than 1 means a resync)
    connection_losses: int = 0


class LookupCache:
    """Topic -> (bundle, live lease or None) from memory, answering as ``RedisStore.lookup``.

    ``max_staleness_ms`` bounds how old the newest confirmed invalidation may be before lookups
    go to Redis instead; ``heartbeat_ms`` is how often freshness is confirmed (keep it well
    below the bound). Use as a context manager or call ``start()``/``close()``.
    """

    def __init__(
        self,
        store: RedisStore,
        *,
        max_staleness_ms: int = 500,
        heartbeat_ms: int = 50,
        refresh_on_invalidate: bool = True,
    ) -> None:
        if heartbeat_ms <= 0 or max_staleness_ms <= heartbeat_ms:
            raise ValueError("need 0 < heartbeat_ms < max_staleness_ms")
        self.store = store
        self.max_staleness_s = max_staleness_ms / 1000
        self.heartbeat_s = heartbeat_ms / 1000
        self.refresh_on_invalidate = refresh_on_invalidate
        self.stats = CacheStats()
        self.tracking_client_id: int | None = None
        self._keys = store.keys
        self._ns_prefix = store.keys.ns_prefix()
        self._lease_prefix = store.keys.lease_prefix()
        self._ns: dict[str, _NsEntry] = {}
        self._leases: dict[str, Lease | None] = {}
        self._pending: dict[bytes, object] = {}  # Redis key -> placeholder of a fill in flight
        self._inbox: list[list[bytes] | None] = []
        self._lock = threading.Lock()
        self._fresh_as_of = -math.inf  # monotonic send time of the last PING answered
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, wait_s: float = 5.0) -> LookupCache:
        """Start the tracking thread; wait up to ``wait_s`` for the first confirmation.

        Not being confirmed in time is not an error: lookups then go to Redis until it is.
        """
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="lookup-cache", daemon=True)
            self._thread.start()
        deadline = time.monotonic() + wait_s
        while not self.fresh and time.monotonic() < deadline:
            time.sleep(0.005)
        return self

    def close(self) -> None:
        """Stop the tracking thread and drop everything cached."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self._fresh_as_of = -math.inf
        self._flush()

    def __enter__(self) -> LookupCache:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def fresh(self) -> bool:
        """True when lookups are answered from memory (freshness confirmed within the bound)."""
        return time.monotonic() - self._fresh_as_of <= self.max_staleness_s

    # -- lookups -----------------------------------------------------------------------------
    def lookup(self, topic: str, now_ms: int) -> tuple[str, Lease | None]:
        """Topic -> (bundle, live lease or None); raises ``InvalidInput`` for unknown namespaces."""
        if time.monotonic() - self._fresh_as_of > self.max_staleness_s:
            self.stats.fallbacks += 1
            return self.store.lookup(topic, now_ms)
        ns, h = topic_namespace_and_hash(topic)
        entry = self._ns.get(ns)
        if entry is None:
            entry = self._fill_namespaces([ns])[ns]
        bundle = entry.names[bundle_index(entry.boundaries, h)]
        lease = self._leases.get(bundle, _MISS)
        if lease is _MISS:
            lease = self._fill_leases([bundle])[bundle]
        if lease is not None and lease.expires_at_ms <= now_ms:
            return bundle, None
        return bundle, lease  # type: ignore[return-value]

    def lookup_many(self, topics: Sequence[str], now_ms: int) -> list[tuple[str, Lease | None]]:
        """Batch lookups: at most one round trip for missing namespaces and one for leases."""
        if time.monotonic() - self._fresh_as_of > self.max_staleness_s:
            self.stats.fallbacks += len(topics)
            return self.store.lookup_many(topics, now_ms)
        ns_map, leases = self._ns, self._leases
        filled_ns: dict[str, _NsEntry] = {}  # namespaces read during this call
        out: list[tuple[str, Lease | None]] = []
        misses: list[int] = []
        for topic in topics:
            ns, h = topic_namespace_and_hash(topic)
            entry = ns_map.get(ns) or filled_ns.get(ns)
            if entry is None:
                # read every namespace of the batch that is missing now, in one round trip
                wanted = {topic_namespace(t) for t in topics} - ns_map.keys() - filled_ns.keys()
                filled_ns.update(self._fill_namespaces(sorted(wanted | {ns})))
                entry = filled_ns[ns]
            bundle = entry.names[bundle_index(entry.boundaries, h)]
            lease = leases.get(bundle, _MISS)
            if lease is _MISS:
                misses.append(len(out))
                out.append((bundle, None))
            elif lease is not None and lease.expires_at_ms > now_ms:  # type: ignore[union-attr]
                out.append((bundle, lease))  # type: ignore[arg-type]
            else:
                out.append((bundle, None))
        if misses:
            got = self._fill_leases(sorted({out[k][0] for k in misses}))
            for k in misses:
                bundle = out[k][0]
                lease = got[bundle]
                if lease is not None and lease.expires_at_ms > now_ms:
                    out[k] = (bundle, lease)
        return out

    # -- fills (lookup path, caller's thread) ------------------------------------------------
    def _fill_namespaces(self, namespaces: Sequence[str]) -> dict[str, _NsEntry]:
        keys = [self._keys.ns(ns).encode() for ns in namespaces]
        marks = self._mark_pending(keys)
        try:
            read = self.store.read_namespaces(namespaces)
        except BaseException:
            self._unmark_pending(keys, marks)
            raise
        self.stats.misses += len(keys)
        out: dict[str, _NsEntry] = {}
        for ns, nb in zip(namespaces, read):
            if nb is None:
                self._unmark_pending(keys, marks)
                raise InvalidInput("namespace", f"unknown namespace {ns}")
            bounds = nb.boundaries
            out[ns] = _NsEntry(bounds, nb.bundle_names, nb.version)
        with self._lock:
            for ns, k, m in zip(namespaces, keys, marks):
                if self._pending.get(k) is m:
                    del self._pending[k]
                    self._ns[ns] = out[ns]
        return out

    def _fill_leases(self, bundles: Sequence[str]) -> dict[str, Lease | None]:
        keys = [self._keys.lease(b).encode() for b in bundles]
        marks = self._mark_pending(keys)
        try:
            got = self._read_leases(bundles)
        except BaseException:
            self._unmark_pending(keys, marks)
            raise
        self.stats.misses += len(keys)
        with self._lock:
            for b, k, m in zip(bundles, keys, marks):
                if self._pending.get(k) is m:
                    del self._pending[k]
                    self._leases[b] = got[b]
        return got

    def _read_leases(self, bundles: Sequence[str]) -> dict[str, Lease | None]:
        return self.store.read_leases(bundles)

    def _mark_pending(self, keys: Sequence[bytes]) -> list[object]:
        marks = [object() for _ in keys]
        with self._lock:
            for k, m in zip(keys, marks):
                self._pending[k] = m
        return marks

    def _unmark_pending(self, keys: Sequence[bytes], marks: Sequence[object]) -> None:
        with self._lock:
            for k, m in zip(keys, marks):
                if self._pending.get(k) is m:
                    del self._pending[k]

    def _flush(self) -> None:
        with self._lock:
            self._ns.clear()
            self._leases.clear()
            self._pending.clear()
            self.stats.flushes += 1  # under the lock: _apply_inbox uses it as an epoch

    # -- tracking thread ---------------------------------------------------------------------
    def _run(self) -> None:
        """Connect, enable tracking, resync, serve; on any loss drop everything and retry."""
        backoff_s = 0.05
        while not self._stop.is_set():
            conn = None
            try:
                conn = self._connect_tracking()
                backoff_s = 0.05
                self._serve(conn)
            except (redis.RedisError, OSError, _TrackingLost) as exc:
                self.stats.connection_losses += 1
                log.warning("lookup cache: tracking connection lost (%s); using Redis", exc)
            except Exception:  # a bug must not leave a cache that nobody invalidates
                self.stats.connection_losses += 1
                log.exception("lookup cache: tracking thread failed; using Redis")
            finally:
                self._fresh_as_of = -math.inf
                self._flush()
                if conn is not None:
                    conn.disconnect()
            self._stop.wait(backoff_s)
            backoff_s = min(backoff_s * 2, 2.0)

    def _connect_tracking(self) -> Any:
        # a frozen server must end in an error, not a read that blocks this thread forever
        # (redis-py's default is 5 s; None, if the caller chose it, would mean never)
        limit_s = max(1.0, 2 * self.max_staleness_s)
        conn, self.tracking_client_id = self.store.open_tracking_connection(self._on_push, limit_s)
        # Whatever was cached before tracking was on may have missed invalidations.
        self._flush()
        self.stats.connects += 1
        return conn

    def _on_push(self, message: list[Any]) -> object:
        """Parser callback for ``invalidate`` pushes: queue the keys (``None`` = flush all)."""
        self._inbox.append(message[1])
        return _PUSH

    def _serve(self, conn: Any) -> None:
        sock = conn._sock
        ping_sent = time.monotonic()
        conn.send_command("PING")
        awaiting = True
        poll_s = min(self.heartbeat_s, 0.05)
        while not self._stop.is_set():
            if conn._sock is not sock:
                # redis-py reconnects on its own in send/can_read; a new socket has no tracking
                raise _TrackingLost("tracking connection was replaced")
            if conn.can_read(timeout=poll_s):
                pong = False
                while True:
                    if conn.read_response(push_request=True) is not _PUSH:
                        pong = True
                    if not conn.can_read(timeout=0):
                        break
                self._apply_inbox()
                if pong and awaiting:
                    # everything Redis sent before this PONG has been applied above
                    self._fresh_as_of = ping_sent
                    awaiting = False
            now = time.monotonic()
            if awaiting and now - ping_sent > self.max_staleness_s:
                raise _TrackingLost(f"no PONG within {self.max_staleness_s * 1000:.0f} ms")
            if not awaiting and now - ping_sent >= self.heartbeat_s:
                ping_sent = now
                conn.send_command("PING")
                awaiting = True

    def _apply_inbox(self) -> None:
        inbox, self._inbox = self._inbox, []
        if not inbox:
            return
        if any(keys is None for keys in inbox):
            self._flush()
            return
        refresh: list[str] = []
        np, lp = self._ns_prefix, self._lease_prefix
        with self._lock:
            for keys in inbox:
                self.stats.invalidated_keys += len(keys)  # type: ignore[arg-type]
                for k in keys:  # type: ignore[union-attr]
                    self._pending.pop(k, None)
                    name = k.decode()
                    if name.startswith(lp):
                        bundle = name[len(lp) :]
                        if bundle in self._leases:
                            if self.refresh_on_invalidate:
                                refresh.append(bundle)
                            else:
                                del self._leases[bundle]
                    elif name.startswith(np):
                        self._ns.pop(name[len(np) :], None)
            flushes = self.stats.flushes
        if not refresh:
            return
        # Re-read after the invalidation: what we read is at least as new as the write. Only
        # this thread removes lease entries, so none of them vanished meanwhile, barring a flush.
        got = self._read_leases(sorted(set(refresh)))
        with self._lock:
            if self.stats.flushes == flushes:
                for bundle, lease in got.items():
                    if lease is None:
                        # released, swept or split away: forget it (a lookup re-reads it), so
                        # bundles that no longer exist do not pile up
                        self._leases.pop(bundle, None)
                    else:
                        self._leases[bundle] = lease
        self.stats.refreshed += len(got)
