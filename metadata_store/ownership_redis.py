"""Bundle ranges and ownership leases in Redis, the way Pulsar keeps them in ZooKeeper.

Every multi-key change is one Lua script, so it is atomic, and every change is guarded:
namespace boundaries by their version (compare-and-set, like Pulsar's versioned metadata
writes), leases by their owner and **fencing token**. Tokens come from one counter that only
grows (``INCR``), so a broker that lost a lease holds a smaller token than the new owner forever
and can neither renew nor release what it no longer owns.

**One clock per judgement.** Every decision about a lease's or a registration's expiry is taken
inside the script that acts on it: acquire, renew, release, transfer and the expiry sweep each
read the lease and judge it in one atomic step, never "read, then act" over two round trips.
The clock is Redis's own ``TIME`` (``clock="server"``, what ``from_url`` and every process of
the product use), so broker and controller clock skew cannot make two brokers believe they own
one bundle; tests and the fast simulator inject the time instead (``clock="caller"``, the
``now_ms`` argument). Key expiry is never used: the sweep decides what expired.
``docs/ownership.md`` states the invariants and the clock argument.

**One identity per bundle.** Every method takes a ``BundleRange`` or any spelling of a bundle
name that ``parse_bundle`` accepts (upper- or lower-case hex) and builds keys only from the
canonical name (``tenant/ns/0x%08x_0x%08x``, lower case), so a spelling cannot create a
second lease.

Keys: ``P:namespaces``, ``P:ns:<tenant/ns>``, ``P:lease:<bundle>``, ``P:owned:<broker>``,
``P:fence``, ``P:broker:<id>``, ``P:brokers`` and ``P:epoch``, with their formats in the table of
``metadata_store.keys``. The other families that controller code reads over the same connection
are reached through this store's repositories (``outcomes``, ``outbox``, ``load_snapshot``,
``preallocations``, ``recovery_state``, ``placement_policies``).
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import redis

from loadbalance.bundles import (
    BundleRange,
    NamespaceBundles,
    check_boundaries,
    parse_bundle,
    topic_namespace,
    topic_namespace_and_hash,
)
from loadbalance.errors import Conflict, InvalidInput
from loadbalance.lease_history import Event, NamespaceVersion, Recorder, Revocation
from metadata_store.formats import (
    LEASE_FIELDS,
    NS_FIELDS,
    boundaries_csv,
    lease_from_fields,
    parse_boundaries,
)
from metadata_store.handover import LUA_ACK, LUA_HANDOVER, HandoverFence, parse_fence
from metadata_store.keys import Keys
from metadata_store.leases import BrokerNotAlive, Lease, canonical_bundle, claim_of
from metadata_store.load_snapshot import LoadSnapshot
from metadata_store.outbox import EventOutbox
from metadata_store.outcomes import OutcomeLog
from metadata_store.placement_policies import PlacementPoliciesStore
from metadata_store.placement_state import PlacementChanged, Preallocations
from metadata_store.processes import ProcessRegistry
from metadata_store.recovery_state import RecoveryState
from metadata_store.sweep_outbox import SweepOutbox
from metadata_store.sweeps import OnExpired, OnMalformed

# Every lease script starts with this: ``now`` is the caller's ARGV value, or Redis's own clock
# (``TIME``) when the store runs with ``clock="server"`` and passes an empty string. Judging a
# lease and acting on the judgement happen in the same script, so no read-then-act race exists.
LUA_CLOCK = """
local function clock(arg)
  if arg == '' then
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return tonumber(arg)
end
"""

# KEYS: ns key, namespaces set, epoch key; ARGV: boundaries, namespace, a new epoch
_LUA_CREATE_NS = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'boundaries', ARGV[1], 'version', 0)
redis.call('SADD', KEYS[2], ARGV[2])
redis.call('SETNX', KEYS[3], ARGV[3])
return 1
"""

# KEYS: ns key, lease keys of the bundles that disappear..., handover key of the namespace
# ARGV: expected version, new boundaries, prefix, now, bundle names...
# -> {1, new version, now, i1, broker1, token1, i2, ...} (the leases it ended) | {0, v} | {-1}
# A live lease it ends leaves a handover fence (``metadata_store.handover``).
_LUA_RESHAPE = (
    LUA_CLOCK
    + LUA_HANDOVER
    + """
local now = clock(ARGV[4])
local v = redis.call('HGET', KEYS[1], 'version')
if not v then return {-1} end
if tonumber(v) ~= tonumber(ARGV[1]) then return {0, tonumber(v)} end
local out = {1, tonumber(v) + 1, now}
local ho = KEYS[#KEYS]
for i = 2, #KEYS - 1 do
  local cur = redis.call('HMGET', KEYS[i], 'broker', 'token', 'expires')
  if cur[1] then
    if tonumber(cur[3]) > now then ho_record(ho, ARGV[3 + i], cur[1], cur[2], cur[3], now) end
    redis.call('SREM', ARGV[3] .. ':owned:' .. cur[1], ARGV[3 + i])
    redis.call('DEL', KEYS[i])
    table.insert(out, i - 1)
    table.insert(out, cur[1])
    table.insert(out, tonumber(cur[2]))
  end
end
redis.call('HSET', KEYS[1], 'boundaries', ARGV[2], 'version', tonumber(v) + 1)
return out
"""
)

# KEYS: broker key, brokers set; ARGV: now, ttl, info, broker -> now
_LUA_REGISTER = (
    LUA_CLOCK
    + """
local now = clock(ARGV[1])
redis.call('HSET', KEYS[1], 'heartbeat', now, 'expires', now + tonumber(ARGV[2]), 'info', ARGV[3])
redis.call('SADD', KEYS[2], ARGV[4])
return now
"""
)

# KEYS: brokers set; ARGV: now, prefix -> {now, live broker ids...}
_LUA_LIVE_BROKERS = (
    LUA_CLOCK
    + """
local now = clock(ARGV[1])
local out = {now}
for _, b in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local e = redis.call('HGET', ARGV[2] .. ':broker:' .. b, 'expires')
  if e and tonumber(e) > now then table.insert(out, b) end
end
return out
"""
)

# KEYS: ns key, lease key, broker key, owned key, fence key, handover key of the namespace
#       [, placement version key, prealloc key of the broker: a placement's acquire]
# ARGV: bundle, expected ns version, broker, now, ttl, prefix
#       [, expected placement version, preallocation document]
# -> {1, broker, token, expires, now, wait} | {0, owner, token, expires, now} | {-1} | {-2}
#    | {-3, placement version} (a placement's acquire: another placement was recorded since)
#    | {-4} (the lease key holds no lease: left alone, as the sweep leaves it)
# A placement's acquire also records the preallocation and bumps the placement version in the
# step that takes the lease (``metadata_store.placement_state``). The new lease's ``notbefore``
# is the latest live handover fence over its range (``wait``: how long from now).
_LUA_ACQUIRE = (
    LUA_CLOCK
    + LUA_HANDOVER
    + """
local now = clock(ARGV[4])
if KEYS[7] then
  local pv = tonumber(redis.call('GET', KEYS[7]) or '0')
  if pv ~= tonumber(ARGV[7]) then return {-3, pv} end
end
local v = redis.call('HGET', KEYS[1], 'version')
if not v or tonumber(v) ~= tonumber(ARGV[2]) then return {-1} end
local bexp = redis.call('HGET', KEYS[3], 'expires')
if not bexp or tonumber(bexp) <= now then return {-2} end
local lk = redis.call('TYPE', KEYS[2])['ok']
if lk ~= 'none' and lk ~= 'hash' then return {-4} end
local cur = redis.call('HMGET', KEYS[2], 'broker', 'token', 'expires')
if lk == 'hash' and not (cur[1] and tonumber(cur[2]) and tonumber(cur[3])) then return {-4} end
if cur[1] and tonumber(cur[3]) > now then
  return {0, cur[1], tonumber(cur[2]), tonumber(cur[3]), now}
end
if cur[1] then redis.call('SREM', ARGV[6] .. ':owned:' .. cur[1], ARGV[1]) end
local token = redis.call('INCR', KEYS[5])
local exp = now + tonumber(ARGV[5])
local nb = ho_not_before(KEYS[6], ARGV[1], ARGV[3], now)
redis.call('HSET', KEYS[2], 'broker', ARGV[3], 'token', token, 'expires', exp, 'notbefore', nb)
redis.call('SADD', KEYS[4], ARGV[1])
if KEYS[7] then
  redis.call('HSET', KEYS[8], ARGV[1], ARGV[8])
  redis.call('INCR', KEYS[7])
end
return {1, ARGV[3], token, exp, now, math.max(0, nb - now)}
"""
)

# KEYS: lease keys..., then the handover key of each lease's namespace
# ARGV: broker, now, ttl, token1, token2, ...
# -> {now, new expiry, ok1, ok2, ..., wait1, wait2, ...}
# A lease still before its ``notbefore`` is judged again against the live fences (an
# acknowledged or passed fence no longer counts); ``wait`` is how long from now (0: serve).
_LUA_RENEW_ALL = (
    LUA_CLOCK
    + LUA_HANDOVER
    + """
local now = clock(ARGV[2])
local exp = now + tonumber(ARGV[3])
local out = {now, exp}
local n = #KEYS / 2
for i = 1, n do
  local key = KEYS[i]
  local wait = 0
  local cur = redis.call('HMGET', key, 'broker', 'token', 'expires')
  if cur[1] == ARGV[1] and tonumber(cur[2]) == tonumber(ARGV[3 + i])
     and tonumber(cur[3]) > now then
    redis.call('HSET', key, 'expires', exp)
    out[i + 2] = 1
    local nb = tonumber(redis.call('HGET', key, 'notbefore') or '0') or 0
    if nb > now then
      nb = ho_not_before(KEYS[n + i], key, ARGV[1], now)
      redis.call('HSET', key, 'notbefore', nb)
      wait = math.max(0, nb - now)
    end
  else
    out[i + 2] = 0
  end
  out[n + i + 2] = wait
end
return out
"""
)

# KEYS: lease key, owned key, handover key; ARGV: bundle, broker, token, now -> {1, now} | {0}
# The live lease it ends leaves a handover fence.
_LUA_RELEASE = (
    LUA_CLOCK
    + LUA_HANDOVER
    + """
local now = clock(ARGV[4])
local cur = redis.call('HMGET', KEYS[1], 'broker', 'token', 'expires')
if cur[1] ~= ARGV[2] or tonumber(cur[2]) ~= tonumber(ARGV[3]) then return {0} end
if tonumber(cur[3]) <= now then return {0} end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[1])
ho_record(KEYS[3], ARGV[1], ARGV[2], cur[2], cur[3], now)
return {1, now}
"""
)

# KEYS: sweep outbox key, lease keys...; ARGV: now, prefix, prefix length
# Removes each lease that is expired *now* (judged here, not by an earlier read), so a renewal
# that lands between a scan and this script keeps its lease. Two passes: the first judges every
# key and only reads, the second deletes; a key that holds no lease (not a hash, a field missing
# or not a finite number, its broker's owned set not a set) is reported and left alone, so no
# error can stop the script after it deleted some leases (Redis does not undo a failed script).
# Each lease removed is written to the sweep outbox in the same step, so a controller killed
# before announcing it leaves the entry for the next sweep (``metadata_store.sweep_outbox``).
# -> {now, #bad, bad name1, ..., bundle1, broker1, token1, expires1, ...} (the leases removed)
_LUA_SWEEP = (
    LUA_CLOCK
    + """
local now = clock(ARGV[1])
local plen = tonumber(ARGV[3])
local function num(x)
  local n = tonumber(x)
  if n == nil or n ~= n or n == math.huge or n == -math.huge then return nil end
  return n
end
local doomed, bad = {}, {}
for i = 2, #KEYS do
  local key = KEYS[i]
  local kind = redis.call('TYPE', key)['ok']
  local bundle = string.sub(key, plen + 1)
  if kind == 'hash' then
    local cur = redis.call('HMGET', key, 'broker', 'token', 'expires')
    local token, exp = num(cur[2]), num(cur[3])
    if not cur[1] or not token or not exp then
      table.insert(bad, bundle)
    elseif exp <= now then
      local owned = ARGV[2] .. ':owned:' .. cur[1]
      local okind = redis.call('TYPE', owned)['ok']
      if okind == 'set' or okind == 'none' then
        table.insert(doomed, {key, bundle, cur[1], token, exp, owned})
      else
        table.insert(bad, bundle)
      end
    end
  elseif kind ~= 'none' then
    table.insert(bad, bundle)
  end
end
local out = {now, #bad}
for _, name in ipairs(bad) do table.insert(out, name) end
for _, d in ipairs(doomed) do
  redis.call('DEL', d[1])
  redis.call('SREM', d[6], d[2])
  local entry = cjson.encode({d[3], d[4], d[5], now})
  redis.call('HSET', KEYS[1], d[2] .. '|' .. string.format('%d', d[4]), entry)
  table.insert(out, d[2])
  table.insert(out, d[3])
  table.insert(out, d[4])
  table.insert(out, d[5])
end
return out
"""
)

# KEYS: lease, from owned, to owned, to broker key, fence, handover key
# ARGV: bundle, from, token, to, now, ttl -> {1, token, expires, now, wait} | {0} | {-2}
# The old lease leaves a handover fence; the new one waits for it (``notbefore``).
_LUA_TRANSFER = (
    LUA_CLOCK
    + LUA_HANDOVER
    + """
local now = clock(ARGV[5])
local cur = redis.call('HMGET', KEYS[1], 'broker', 'token', 'expires')
if cur[1] ~= ARGV[2] or tonumber(cur[2]) ~= tonumber(ARGV[3])
   or tonumber(cur[3]) <= now then return {0} end
local bexp = redis.call('HGET', KEYS[4], 'expires')
if not bexp or tonumber(bexp) <= now then return {-2} end
local token = redis.call('INCR', KEYS[5])
local exp = now + tonumber(ARGV[6])
ho_record(KEYS[6], ARGV[1], ARGV[2], cur[2], cur[3], now)
local nb = ho_not_before(KEYS[6], ARGV[1], ARGV[4], now)
redis.call('HSET', KEYS[1], 'broker', ARGV[4], 'token', token, 'expires', exp, 'notbefore', nb)
redis.call('SREM', KEYS[2], ARGV[1])
redis.call('SADD', KEYS[3], ARGV[1])
return {1, token, exp, now, math.max(0, nb - now)}
"""
)

MAX_RETRIES = 5


class MalformedLease(Conflict):
    """A lease key holds no lease (not a hash, or a field missing or not a number): nothing
    takes the bundle until an operator repairs or deletes the key."""

    def __init__(self, key: str) -> None:
        super().__init__(f"{key} holds no lease; repair or delete it (redis-cli DEL {key})")
        self.key = key


SWEEP_BATCH = 500  # lease keys judged per sweep script (bounds the time Redis is busy)
CLOCKS = ("caller", "server")


class RedisStore:
    """The metadata store over one Redis connection.

    ``clock="caller"`` judges leases and registrations against the ``now_ms`` each method is
    given (tests and the simulator inject time); ``clock="server"`` ignores ``now_ms`` and
    judges them against Redis's own ``TIME`` inside the script that acts, which is what the
    product runs (``docs/ownership.md`` argues why). ``recorder`` receives every claim and
    revocation as the scripts reported them (``loadbalance.lease_history``).
    """

    def __init__(
        self,
        client: redis.Redis,
        prefix: str = "lb",
        *,
        clock: str = "caller",
        recorder: Recorder | None = None,
    ) -> None:
        if clock not in CLOCKS:
            raise InvalidInput("clock", f"must be one of {', '.join(CLOCKS)}, got {clock!r}")
        self.r = client
        self.p = prefix
        self.keys = Keys(prefix)
        self.clock = clock
        self.recorder = recorder
        self._create = client.register_script(_LUA_CREATE_NS)
        self._reshape = client.register_script(_LUA_RESHAPE)
        self._register = client.register_script(_LUA_REGISTER)
        self._live = client.register_script(_LUA_LIVE_BROKERS)
        self._acquire = client.register_script(_LUA_ACQUIRE)
        self._renew = client.register_script(_LUA_RENEW_ALL)
        self._release = client.register_script(_LUA_RELEASE)
        self._sweep = client.register_script(_LUA_SWEEP)
        self._transfer = client.register_script(_LUA_TRANSFER)
        self._ack = client.register_script(LUA_ACK)
        self._ns_cache: dict[str, NamespaceBundles] = {}
        self._names_cache: dict[tuple[str, int], list[str]] = {}

    @classmethod
    def from_url(
        cls,
        url: str,
        prefix: str = "lb",
        *,
        clock: str = "server",
        recorder: Recorder | None = None,
        **kwargs: Any,
    ) -> RedisStore:
        """A store for a running deployment: Redis's clock judges leases unless told otherwise."""
        return cls(redis.Redis.from_url(url, **kwargs), prefix, clock=clock, recorder=recorder)

    # -- keys (built only from canonical names) ------------------------------------------------
    def _ns(self, ns: str) -> str:
        return self.keys.ns(ns)

    def _lease(self, bundle: BundleRange) -> str:
        return self.keys.lease(bundle.name)

    def _owned(self, broker: str) -> str:
        return self.keys.owned(broker)

    def _broker(self, broker: str) -> str:
        return self.keys.broker(broker)

    def _now(self, now_ms: int | None) -> int | str:
        """The script argument for "now": the caller's time, or '' for Redis's TIME."""
        if self.clock == "server":
            return ""
        if now_ms is None:
            raise InvalidInput("now_ms", "a store with clock='caller' needs the time")
        return int(now_ms)

    def _record(self, event: Event) -> None:
        if self.recorder is not None:
            self.recorder.record(event)

    def _claim(self, lease: Lease, kind: str) -> None:
        if self.recorder is not None:
            self.recorder.record(claim_of(lease, kind))

    def _revoke(self, r: BundleRange, broker: str, token: int, at_ms: int, kind: str) -> None:
        if self.recorder is not None:
            self.recorder.record(
                Revocation(broker, r.namespace, r.lower, r.upper, token, at_ms, kind)
            )

    def _server_time_ms(self, pipe_result: Sequence[int]) -> int:
        seconds, micros = pipe_result
        return int(seconds) * 1000 + int(micros) // 1000

    def _read_now(self, now_ms: int | None, reads: Any) -> tuple[int, list[Any]]:
        """Run ``reads(pipe)`` and return (now, results); with the server clock, TIME is read in
        the same MULTI so the judgement and the data belong to one instant."""
        if self.clock == "server":
            pipe = self.r.pipeline(transaction=True)
            pipe.time()
            reads(pipe)
            res = pipe.execute()
            return self._server_time_ms(res[0]), res[1:]
        if now_ms is None:
            raise InvalidInput("now_ms", "a store with clock='caller' needs the time")
        pipe = self.r.pipeline(transaction=False)
        reads(pipe)
        return int(now_ms), pipe.execute()

    # -- brokers -----------------------------------------------------------------------------
    def register_broker(
        self, broker: str, now_ms: int, ttl_ms: int, info: Mapping[str, Any] | None = None
    ) -> None:
        """Register or heartbeat a broker; it is alive until ``now + ttl_ms``."""
        self._register(
            keys=[self._broker(broker), self.keys.brokers()],
            args=[self._now(now_ms), int(ttl_ms), json.dumps(dict(info or {})), broker],
        )

    heartbeat = register_broker

    def live_brokers(self, now_ms: int) -> list[str]:
        res = self._live(keys=[self.keys.brokers()], args=[self._now(now_ms), self.p])
        return sorted(b.decode() if isinstance(b, bytes) else b for b in res[1:])

    # -- namespaces --------------------------------------------------------------------------
    def create_namespace(self, ns: str, num_bundles: int, *, exist_ok: bool = False) -> bool:
        nb = NamespaceBundles.initial(ns, num_bundles)
        created = self._create(
            keys=[self._ns(ns), self.keys.namespaces(), self.keys.epoch()],
            args=[boundaries_csv(nb.boundaries), ns, uuid.uuid4().hex],
        )
        if not created and not exist_ok:
            raise InvalidInput("namespace", f"namespace {ns} already exists")
        return bool(created)

    def get_namespace(self, ns: str) -> NamespaceBundles | None:
        raw = self.r.hmget(self._ns(ns), *NS_FIELDS)
        if raw[0] is None:
            return None
        bounds = parse_boundaries(raw[0])
        nb = NamespaceBundles(ns, bounds, int(raw[1]))
        self._ns_cache[ns] = nb
        return nb

    def list_namespaces(self) -> list[str]:
        return sorted(n.decode() for n in self.r.smembers(self.keys.namespaces()))

    def _require_ns(self, ns: str) -> NamespaceBundles:
        nb = self.get_namespace(ns)
        if nb is None:
            raise InvalidInput("namespace", f"unknown namespace {ns}")
        return nb

    def _reshape_ns(
        self,
        expected: int,
        new: NamespaceBundles,
        gone: Sequence[BundleRange],
        kind: str,
        now_ms: int | None,
    ) -> int:
        check_boundaries(new.boundaries)
        ns = new.namespace
        now_arg = "" if self.clock == "server" or now_ms is None else int(now_ms)
        res = self._reshape(
            keys=[self._ns(ns), *[self._lease(b) for b in gone], self.keys.handover(ns)],
            args=[
                expected,
                boundaries_csv(new.boundaries),
                self.p,
                now_arg,
                *[b.name for b in gone],
            ],
        )
        if res[0] == -1:
            raise InvalidInput("namespace", f"unknown namespace {ns}")
        if res[0] == 0:
            raise Conflict(f"{ns}: version is {res[1]}, expected {expected}")
        at_ms = int(res[2])
        for i in range(3, len(res), 3):
            broker = res[i + 1].decode() if isinstance(res[i + 1], bytes) else res[i + 1]
            self._revoke(gone[int(res[i]) - 1], broker, int(res[i + 2]), at_ms, kind)
        self._record(NamespaceVersion(ns, int(res[1]), new.boundaries, at_ms))
        return int(res[1])

    def split_bundle(
        self,
        bundle: BundleRange | str,
        boundaries: Sequence[int],
        expected_version: int | None = None,
        *,
        now_ms: int | None = None,
    ) -> NamespaceBundles:
        """Split at ``boundaries`` with CAS on the namespace version; the parent's lease ends.

        With ``expected_version=None`` a lost race re-reads and retries up to ``MAX_RETRIES``
        times (the bundle must still exist); with a version, a mismatch raises ``Conflict``.
        ``now_ms`` only stamps the recorded history (the split itself judges no lease).
        """
        r = canonical_bundle(bundle)
        for _ in range(MAX_RETRIES):
            nb = self._require_ns(r.namespace)
            if expected_version is not None and nb.version != expected_version:
                raise Conflict(f"{r.namespace}: version is {nb.version}, not {expected_version}")
            new = nb.split(r, boundaries)  # raises InvalidBundle if the bundle is gone
            try:
                self._reshape_ns(nb.version, new, [r], "split", now_ms)
            except Conflict:
                if expected_version is not None:
                    raise
                continue
            return new
        raise Conflict(f"{r.name}: split lost {MAX_RETRIES} races")

    def merge_bundles(
        self,
        first: BundleRange | str,
        second: BundleRange | str,
        expected_version: int | None = None,
        *,
        now_ms: int | None = None,
    ) -> NamespaceBundles:
        """Merge two adjacent bundles (not a Pulsar operation); both leases end."""
        a, b = canonical_bundle(first), canonical_bundle(second)
        for _ in range(MAX_RETRIES):
            nb = self._require_ns(a.namespace)
            if expected_version is not None and nb.version != expected_version:
                raise Conflict(f"{a.namespace}: version is {nb.version}, not {expected_version}")
            new = nb.merge(a, b)
            try:
                self._reshape_ns(nb.version, new, [a, b], "merge", now_ms)
            except Conflict:
                if expected_version is not None:
                    raise
                continue
            return new
        raise Conflict(f"{a.name}+{b.name}: merge lost {MAX_RETRIES} races")

    # -- leases ------------------------------------------------------------------------------
    def acquire(self, bundle: BundleRange | str, broker: str, now_ms: int, ttl_ms: int) -> Lease:
        """Take a free or expired bundle; raise ``Conflict`` if someone else holds it."""
        return self._acquire_lease(bundle, broker, now_ms, ttl_ms, ())

    def acquire_placed(
        self,
        bundle: BundleRange | str,
        broker: str,
        now_ms: int,
        ttl_ms: int,
        *,
        placement_version: int,
        preallocation: Mapping[str, Any],
    ) -> Lease:
        """``acquire`` for a placement chosen over the preallocations read at
        ``placement_version``: in the same script, refuse with ``PlacementChanged`` if another
        placement was recorded since, else take the lease, record ``preallocation`` (the
        bundle's averages) for ``broker`` and bump the placement version
        (``metadata_store.placement_state``)."""
        placed = (int(placement_version), json.dumps(preallocation))
        return self._acquire_lease(bundle, broker, now_ms, ttl_ms, placed)

    def _acquire_lease(
        self,
        bundle: BundleRange | str,
        broker: str,
        now_ms: int,
        ttl_ms: int,
        placed: tuple[int, str] | tuple[()],
    ) -> Lease:
        r = canonical_bundle(bundle)
        extra_keys = [self.keys.placement_version(), self.keys.prealloc(broker)] if placed else []
        for _ in range(MAX_RETRIES):
            nb = self._require_ns(r.namespace)
            if not nb.contains(r):
                raise InvalidInput("bundle", f"{r.name} is not a current bundle of {r.namespace}")
            res = self._acquire(
                keys=[
                    self._ns(r.namespace),
                    self._lease(r),
                    self._broker(broker),
                    self._owned(broker),
                    self.keys.fence(),
                    self.keys.handover(r.namespace),
                    *extra_keys,
                ],
                args=[r.name, nb.version, broker, self._now(now_ms), int(ttl_ms), self.p, *placed],
            )
            if res[0] == -3:
                raise PlacementChanged(placed[0], int(res[1]))
            if res[0] == -4:
                raise MalformedLease(self._lease(r))
            if res[0] == -1:
                continue  # boundaries changed between the read and the script: re-read
            if res[0] == -2:
                raise BrokerNotAlive("broker", f"broker {broker} is not registered or expired")
            owner = res[1].decode() if isinstance(res[1], bytes) else res[1]
            if res[0] == 0:
                raise Conflict(f"{r.name} is owned by {owner} (token {int(res[2])})")
            lease = Lease(r.name, owner, int(res[2]), int(res[3]), int(res[4]), int(res[5]))
            self._claim(lease, "acquire")
            return lease
        raise Conflict(f"{r.name}: namespace kept changing")

    def renew_all(
        self, broker: str, leases: Mapping[str, int], now_ms: int, ttl_ms: int
    ) -> dict[str, bool]:
        """Renew all of a broker's leases in one call: bundle -> token; stale ones are not."""
        renewed = self.renew_leases(broker, leases, now_ms, ttl_ms)
        return {b: lease is not None for b, lease in renewed.items()}

    def renew_leases(
        self, broker: str, leases: Mapping[str, int], now_ms: int, ttl_ms: int
    ) -> dict[str, Lease | None]:
        """``renew_all`` that answers with each renewed lease (its new expiry and the store's
        time of the renewal), or None for a lease that was lost. Keys are as the caller gave."""
        names = sorted(leases)
        if not names:
            return {}
        ranges = [canonical_bundle(b) for b in names]
        res = self._renew(
            keys=[
                *[self._lease(r) for r in ranges],
                *[self.keys.handover(r.namespace) for r in ranges],
            ],
            args=[broker, self._now(now_ms), int(ttl_ms), *[int(leases[b]) for b in names]],
        )
        at_ms, expires = int(res[0]), int(res[1])
        n = len(names)
        out: dict[str, Lease | None] = {}
        for b, r, ok, wait in zip(names, ranges, res[2 : 2 + n], res[2 + n :], strict=True):
            if ok:
                lease = Lease(r.name, broker, int(leases[b]), expires, at_ms, int(wait))
                self._claim(lease, "renew")
                out[b] = lease
            else:
                out[b] = None
        return out

    def release(self, bundle: BundleRange | str, broker: str, token: int, now_ms: int) -> bool:
        """Give a bundle up; only the live holder with the current token can."""
        r = canonical_bundle(bundle)
        res = self._release(
            keys=[self._lease(r), self._owned(broker), self.keys.handover(r.namespace)],
            args=[r.name, broker, int(token), self._now(now_ms)],
        )
        if not res[0]:
            return False
        self._revoke(r, broker, int(token), int(res[1]), "release")
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
        """Move a live lease to another live broker atomically, with a new token."""
        if from_broker == to_broker:
            raise InvalidInput("destinationBroker", "destination is the source broker")
        r = canonical_bundle(bundle)
        res = self._transfer(
            keys=[
                self._lease(r),
                self._owned(from_broker),
                self._owned(to_broker),
                self._broker(to_broker),
                self.keys.fence(),
                self.keys.handover(r.namespace),
            ],
            args=[r.name, from_broker, int(token), to_broker, self._now(now_ms), int(ttl_ms)],
        )
        if res[0] == -2:
            raise BrokerNotAlive("broker", f"broker {to_broker} is not registered or expired")
        if res[0] == 0:
            raise Conflict(f"{r.name}: {from_broker} with token {token} does not hold it")
        lease = Lease(r.name, to_broker, int(res[1]), int(res[2]), int(res[3]), int(res[4]))
        self._revoke(r, from_broker, int(token), lease.granted_at_ms, "transfer")
        self._claim(lease, "transfer")
        return lease

    def ack_handover(self, broker: str, bundle: BundleRange | str, token: int) -> bool:
        """``broker`` stopped serving ``bundle``, which it held with ``token`` until a move
        ended the lease: its handover fence goes, so the next holder's renewal answers no wait.
        Only the old holder's own fence; False if there was none (acknowledged, or passed)."""
        r = canonical_bundle(bundle)
        res = self._ack(keys=[self.keys.handover(r.namespace)], args=[broker, int(token)])
        return bool(res)

    def handover_fences(self, ns: str, now_ms: int) -> list[HandoverFence]:
        """The handover fences of ``ns`` still live at ``now_ms`` (Redis's clock with
        ``clock="server"``), by token; for tools and tests."""
        now, (raw,) = self._read_now(now_ms, lambda p: p.hgetall(self.keys.handover(ns)))
        fences = (parse_fence(ns, k, v) for k, v in raw.items())
        live = [f for f in fences if f is not None and f.expires_at_ms > now]
        return sorted(live, key=lambda f: f.token)

    def owner(self, bundle: BundleRange | str, now_ms: int) -> Lease | None:
        """The live lease of ``bundle``, or None: no lease, an expired one, or a key that holds
        no lease (the sweep names it; ``acquire`` refuses it with ``MalformedLease``)."""
        r = canonical_bundle(bundle)
        try:
            now, (raw,) = self._read_now(now_ms, lambda p: p.hmget(self._lease(r), *LEASE_FIELDS))
        except redis.ResponseError as e:
            if "WRONGTYPE" in str(e):  # a pipeline's error names its command first
                return None
            raise
        lease = _stored_lease(r.name, raw)
        return lease if lease is not None and lease.expires_at_ms > now else None

    def owners(self, ns: str, now_ms: int) -> dict[str, Lease]:
        nb = self._require_ns(ns)
        names = nb.bundle_names

        def reads(pipe: Any) -> None:
            for b in names:
                pipe.hmget(self.keys.lease(b), *LEASE_FIELDS)

        now, raws = self._read_now(now_ms, reads)
        out = {}
        for b, raw in zip(names, raws):
            lease = _live_lease(b, raw, now)
            if lease is not None:
                out[b] = lease
        return out

    def sweep_expired(
        self,
        now_ms: int,
        *,
        on_expired: OnExpired | None = None,
        on_malformed: OnMalformed | None = None,
    ) -> list[Lease]:
        """Remove the leases that are expired when the sweep script judges them; return them
        sorted by bundle.

        The scan only finds candidates; the script re-reads each lease and removes it only if
        it is still expired at that moment, so a renewal that lands in between is kept. A key
        that holds no lease is left alone and named to ``on_malformed``; one whose name is no
        canonical bundle is not even judged. ``on_expired`` gets each batch's removed leases
        before the next batch is judged (``metadata_store.sweeps``).
        """
        gone: list[Lease] = []
        bad: list[str] = []
        batch: list[bytes] = []
        prefix = self.keys.lease_prefix()
        prefix_len = len(prefix.encode())
        now_arg = self._now(now_ms)

        def flush() -> None:
            outbox = self.keys.sweep_outbox()
            res = self._sweep(keys=[outbox, *batch], args=[now_arg, self.p, prefix_len])
            batch.clear()
            at_ms, n_bad = int(res[0]), int(res[1])
            bad.extend(_text(x) for x in res[2 : 2 + n_bad])
            removed = []
            for i in range(2 + n_bad, len(res), 4):
                lease = Lease(_text(res[i]), _text(res[i + 1]), int(res[i + 2]), int(res[i + 3]))
                removed.append(lease)
                self._revoke(parse_bundle(lease.bundle), lease.broker, lease.token, at_ms, "sweep")
            gone.extend(removed)
            if removed and on_expired is not None:
                on_expired(sorted(removed, key=lambda x: x.bundle))

        for key in self.r.scan_iter(match=f"{prefix}*", count=1000):
            name = key[prefix_len:].decode("utf-8", "replace")
            if not _canonical(name):
                bad.append(name)
                continue
            batch.append(key)
            if len(batch) >= SWEEP_BATCH:
                flush()
        if batch:
            flush()
        if on_malformed is not None:
            on_malformed(sorted(set(bad)))
        return sorted(gone, key=lambda x: x.bundle)

    # -- lookup ------------------------------------------------------------------------------
    def lookup(self, topic: str, now_ms: int) -> tuple[str, Lease | None]:
        """Topic -> (bundle, live lease or None), with boundaries cached per namespace version."""
        ns = topic_namespace(topic)
        nb = self._ns_cache.get(ns)
        version = self.r.hget(self._ns(ns), "version")
        if version is None:
            raise InvalidInput("namespace", f"unknown namespace {ns}")
        if nb is None or nb.version != int(version):
            nb = self._require_ns(ns)
        bundle = nb.find_bundle(topic)
        return bundle.name, self.owner(bundle, now_ms)

    def _bundle_of(self, topic: str) -> str:
        """Hot path of lookups: hash, binary search, and a cached name per bundle index."""
        ns, h = topic_namespace_and_hash(topic)
        nb = self._ns_cache[ns]
        names = self._names_cache.get((ns, nb.version))
        if names is None:
            names = nb.bundle_names
            self._names_cache[(ns, nb.version)] = names
        return names[nb.find_index(h)]

    def lookup_many(self, topics: Sequence[str], now_ms: int) -> list[tuple[str, Lease | None]]:
        """Pipelined lookups: one round trip for the namespace versions, one for the leases."""
        namespaces = sorted({topic_namespace(t) for t in topics})
        pipe = self.r.pipeline(transaction=False)
        for ns in namespaces:
            pipe.hget(self._ns(ns), "version")
        for ns, version in zip(namespaces, pipe.execute()):
            if version is None:
                raise InvalidInput("namespace", f"unknown namespace {ns}")
            cached = self._ns_cache.get(ns)
            if cached is None or cached.version != int(version):
                self._require_ns(ns)
        bundles = [self._bundle_of(t) for t in topics]

        def reads(pipe: Any) -> None:
            for b in bundles:
                pipe.hmget(self.keys.lease(b), *LEASE_FIELDS)

        now, raws = self._read_now(now_ms, reads)
        return [(b, _live_lease(b, raw, now)) for b, raw in zip(bundles, raws)]

    # -- reads for tools and caches ---------------------------------------------------------
    def server_time_ms(self) -> int:
        """Redis's own clock (``TIME``), epoch ms: what ``clock="server"`` judges leases by."""
        return self._server_time_ms(self.r.time())

    def registrations(self) -> dict[str, tuple[int | None, int | None]]:
        """Every registered broker id -> (last heartbeat, registration expiry) in ms, None for a
        field that is missing; not judged against any clock (``live_brokers`` is)."""
        registered = sorted(b.decode() for b in self.r.smembers(self.keys.brokers()))
        pipe = self.r.pipeline(transaction=False)
        for b in registered:
            pipe.hmget(self.keys.broker(b), "heartbeat", "expires")
        out: dict[str, tuple[int | None, int | None]] = {}
        for b, (beat, expires) in zip(registered, pipe.execute(), strict=True):
            out[b] = (
                int(beat) if beat is not None else None,
                int(expires) if expires is not None else None,
            )
        return out

    def read_namespaces(self, namespaces: Sequence[str]) -> list[NamespaceBundles | None]:
        """The boundaries of several namespaces in one round trip (None: no such namespace)."""
        pipe = self.r.pipeline(transaction=False)
        for ns in namespaces:
            pipe.hmget(self._ns(ns), *NS_FIELDS)
        return [
            None if raw[0] is None else NamespaceBundles(ns, parse_boundaries(raw[0]), int(raw[1]))
            for ns, raw in zip(namespaces, pipe.execute())
        ]

    def read_leases(self, bundles: Sequence[str]) -> dict[str, Lease | None]:
        """The lease hashes of canonical bundle names in one round trip, as stored: not judged
        against any clock (None: no lease key, or a key that holds no lease, which the sweep
        names: a placement counting a namespace's leases must not fail on it)."""
        pipe = self.r.pipeline(transaction=False)
        for b in bundles:
            pipe.hmget(self.keys.lease(b), *LEASE_FIELDS)
        raws = pipe.execute(raise_on_error=False)
        return {b: _stored_lease(b, raw) for b, raw in zip(bundles, raws)}

    def open_tracking_connection(self, on_push: Any, timeout_s: float) -> tuple[Any, int]:
        """A new RESP3 connection (outside the pool) with broadcasting client tracking on for
        every namespace and lease key, invalidations going to ``on_push``; with its client id.

        Why here: the prefixes tracked are key families of this store. ``timeout_s`` replaces a
        socket timeout of None, so a frozen server ends in an error, not a read that blocks
        forever.
        """
        pool = self.r.connection_pool
        kwargs = dict(pool.connection_kwargs)
        kwargs["protocol"] = 3
        kwargs["health_check_interval"] = 0  # the caller's own PINGs are the health check
        for k in ("socket_timeout", "socket_connect_timeout"):
            if k in kwargs and kwargs[k] is None:
                kwargs[k] = timeout_s
        conn = pool.connection_class(**kwargs)
        conn.connect()
        conn._parser.set_invalidation_push_handler(on_push)
        conn.send_command("CLIENT", "ID")
        client_id = int(conn.read_response())
        conn.send_command(
            "CLIENT", "TRACKING", "ON", "BCAST",
            "PREFIX", self.keys.ns_prefix(), "PREFIX", self.keys.lease_prefix(),
        )  # fmt: skip
        conn.read_response()
        return conn, client_id

    def close(self) -> None:
        """Close the connection pool of this store's client."""
        self.r.close()

    # -- the other key families over the same connection -------------------------------------
    @functools.cached_property
    def outcomes(self) -> OutcomeLog:
        return OutcomeLog(self.r, self.p)

    @functools.cached_property
    def outbox(self) -> EventOutbox:
        return EventOutbox(self.r, self.p)

    @functools.cached_property
    def sweep_outbox(self) -> SweepOutbox:
        return SweepOutbox(self.r, self.p)

    @functools.cached_property
    def load_snapshot(self) -> LoadSnapshot:
        return LoadSnapshot(self.r, self.p)

    @functools.cached_property
    def preallocations(self) -> Preallocations:
        return Preallocations(self.r, self.p)

    @functools.cached_property
    def recovery_state(self) -> RecoveryState:
        return RecoveryState(self.r, self.p)

    @functools.cached_property
    def placement_policies(self) -> PlacementPoliciesStore:
        return PlacementPoliciesStore(self.r, self.p)

    @functools.cached_property
    def processes(self) -> ProcessRegistry:
        return ProcessRegistry(self.r, self.p)


def _text(x: bytes | str) -> str:
    return x.decode() if isinstance(x, bytes) else x


def _stored_lease(bundle: str, raw: Any) -> Lease | None:
    """``lease_from_fields``, with a key that holds no lease (``WRONGTYPE``, a field missing or
    not a number) read as None; any other error is raised."""
    if isinstance(raw, redis.ResponseError) and str(raw).startswith("WRONGTYPE"):
        return None
    if isinstance(raw, Exception):
        raise raw
    try:
        return lease_from_fields(bundle, raw)
    except (TypeError, ValueError):
        return None


def _canonical(name: str) -> bool:
    """Whether ``name`` is a bundle's canonical name, the only name lease keys are built from."""
    try:
        return parse_bundle(name).name == name
    except InvalidInput:
        return False


def _live_lease(bundle: str, raw: Sequence[Any], now_ms: int) -> Lease | None:
    """A lease hash's fields as a live ``Lease``, or None if absent or expired at ``now_ms``."""
    if raw[0] is None or int(raw[2]) <= now_ms:
        return None
    return Lease(bundle, raw[0].decode(), int(raw[1]), int(raw[2]))
