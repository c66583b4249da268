"""Bundle ranges and ownership leases in Redis, the way Pulsar keeps them in ZooKeeper.

Every multi-key change is one Lua script, so it is atomic, and every change is guarded:
namespace boundaries by their version (compare-and-set, like Pulsar's versioned metadata
writes), leases by their owner and **fencing token**. Tokens come from one counter that only
grows (``INCR``), so a broker that lost a lease holds a smaller token than the new owner forever
and can neither renew nor release what it no longer owns. Time is an argument (``now_ms``):
leases are judged against it, never against Redis key expiry, so a sweep decides what expired
and tests need no sleeping.

Key layout (prefix ``P``, default ``lb``):

==============================  =====================================================
``P:namespaces``                set of namespace names
``P:ns:<tenant/ns>``            hash ``boundaries`` (comma-separated hex), ``version``
``P:lease:<bundle>``            hash ``broker``, ``token``, ``expires``
``P:owned:<broker>``            set of bundles the broker holds leases on
``P:fence``                     the fencing-token counter (only grows)
``P:broker:<id>``               hash ``heartbeat``, ``expires``, ``info`` (JSON)
``P:brokers``                   set of registered broker ids
``P:epoch``                     id of this dataset, set with the first namespace; its
                                absence tells ``controller.recovery`` Redis lost data
==============================  =====================================================
"""

from __future__ import annotations

import json
import uuid
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from loadbalance.bundles import (
    NamespaceBundles,
    check_boundaries,
    normalize_topic,
    parse_bundle,
    topic_namespace,
)
from loadbalance.errors import Conflict, InvalidInput

# KEYS: ns key, namespaces set, epoch key; ARGV: boundaries, namespace, a new epoch
_LUA_CREATE_NS = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'boundaries', ARGV[1], 'version', 0)
redis.call('SADD', KEYS[2], ARGV[2])
redis.call('SETNX', KEYS[3], ARGV[3])
return 1
"""

# KEYS: ns key, parent lease key; ARGV: expected version, new boundaries, prefix
_LUA_RESHAPE = """
local v = redis.call('HGET', KEYS[1], 'version')
if not v then return {-1} end
if tonumber(v) ~= tonumber(ARGV[1]) then return {0, tonumber(v)} end
for i = 2, #KEYS do
  local owner = redis.call('HGET', KEYS[i], 'broker')
  if owner then
    redis.call('SREM', ARGV[3] .. ':owned:' .. owner, ARGV[3 + i - 1])
    redis.call('DEL', KEYS[i])
  end
end
redis.call('HSET', KEYS[1], 'boundaries', ARGV[2], 'version', tonumber(v) + 1)
return {1, tonumber(v) + 1}
"""

# KEYS: ns key, lease key, broker key, owned key, fence key
# ARGV: bundle, expected ns version, broker, now, ttl
_LUA_ACQUIRE = """
local v = redis.call('HGET', KEYS[1], 'version')
if not v or tonumber(v) ~= tonumber(ARGV[2]) then return {-1} end
local bexp = redis.call('HGET', KEYS[3], 'expires')
if not bexp or tonumber(bexp) <= tonumber(ARGV[4]) then return {-2} end
local cur = redis.call('HMGET', KEYS[2], 'broker', 'token', 'expires')
if cur[1] and tonumber(cur[3]) > tonumber(ARGV[4]) then
  return {0, cur[1], tonumber(cur[2]), tonumber(cur[3])}
end
if cur[1] then redis.call('SREM', ARGV[6] .. ':owned:' .. cur[1], ARGV[1]) end
local token = redis.call('INCR', KEYS[5])
local exp = tonumber(ARGV[4]) + tonumber(ARGV[5])
redis.call('HSET', KEYS[2], 'broker', ARGV[3], 'token', token, 'expires', exp)
redis.call('SADD', KEYS[4], ARGV[1])
return {1, ARGV[3], token, exp}
"""

# KEYS: lease keys...; ARGV: broker, now, ttl, token1, token2, ...
_LUA_RENEW_ALL = """
local out = {}
local exp = tonumber(ARGV[2]) + tonumber(ARGV[3])
for i, key in ipairs(KEYS) do
  local cur = redis.call('HMGET', key, 'broker', 'token', 'expires')
  if cur[1] == ARGV[1] and tonumber(cur[2]) == tonumber(ARGV[3 + i])
     and tonumber(cur[3]) > tonumber(ARGV[2]) then
    redis.call('HSET', key, 'expires', exp)
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"""

# KEYS: lease key, owned key; ARGV: bundle, broker, token, now, require_live
_LUA_RELEASE = """
local cur = redis.call('HMGET', KEYS[1], 'broker', 'token', 'expires')
if cur[1] ~= ARGV[2] or tonumber(cur[2]) ~= tonumber(ARGV[3]) then return 0 end
if ARGV[5] == '1' and tonumber(cur[3]) <= tonumber(ARGV[4]) then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[1])
return 1
"""

# KEYS: lease, from owned, to owned, to broker key, fence
# ARGV: bundle, from, token, to, now, ttl
_LUA_TRANSFER = """
local cur = redis.call('HMGET', KEYS[1], 'broker', 'token', 'expires')
if cur[1] ~= ARGV[2] or tonumber(cur[2]) ~= tonumber(ARGV[3])
   or tonumber(cur[3]) <= tonumber(ARGV[5]) then return {0} end
local bexp = redis.call('HGET', KEYS[4], 'expires')
if not bexp or tonumber(bexp) <= tonumber(ARGV[5]) then return {-2} end
local token = redis.call('INCR', KEYS[5])
local exp = tonumber(ARGV[5]) + tonumber(ARGV[6])
redis.call('HSET', KEYS[1], 'broker', ARGV[4], 'token', token, 'expires', exp)
redis.call('SREM', KEYS[2], ARGV[1])
redis.call('SADD', KEYS[3], ARGV[1])
return {1, token, exp}
"""

MAX_RETRIES = 5


@dataclass(frozen=True, slots=True)
class Lease:
    """A bundle's ownership: who, with which fencing token, until when (epoch ms)."""

    bundle: str
    broker: str
    token: int
    expires_at_ms: int


class BrokerNotAlive(InvalidInput):
    """The broker is not registered, or its registration expired."""


class RedisStore:
    """The metadata store over one Redis connection; every method takes ``now_ms``."""

    def __init__(self, client: redis.Redis, prefix: str = "lb") -> None:
        self.r = client
        self.p = prefix
        self._create = client.register_script(_LUA_CREATE_NS)
        self._reshape = client.register_script(_LUA_RESHAPE)
        self._acquire = client.register_script(_LUA_ACQUIRE)
        self._renew = client.register_script(_LUA_RENEW_ALL)
        self._release = client.register_script(_LUA_RELEASE)
        self._transfer = client.register_script(_LUA_TRANSFER)
        self._ns_cache: dict[str, NamespaceBundles] = {}
        self._names_cache: dict[tuple[str, int], list[str]] = {}

    @classmethod
    def from_url(cls, url: str, prefix: str = "lb", **kwargs: Any) -> RedisStore:
        return cls(redis.Redis.from_url(url, **kwargs), prefix)

    # -- keys --------------------------------------------------------------------------------
    def _ns(self, ns: str) -> str:
        return f"{self.p}:ns:{ns}"

    def _lease(self, bundle: str) -> str:
        return f"{self.p}:lease:{bundle}"

    def _owned(self, broker: str) -> str:
        return f"{self.p}:owned:{broker}"

    def _broker(self, broker: str) -> str:
        return f"{self.p}:broker:{broker}"

    # -- brokers -----------------------------------------------------------------------------
    def register_broker(
        self, broker: str, now_ms: int, ttl_ms: int, info: Mapping[str, Any] | None = None
    ) -> None:
        """Register or heartbeat a broker; it is alive until ``now_ms + ttl_ms``."""
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(
            self._broker(broker),
            mapping={
                "heartbeat": now_ms,
                "expires": now_ms + ttl_ms,
                "info": json.dumps(dict(info or {})),
            },
        )
        pipe.sadd(f"{self.p}:brokers", broker)
        pipe.execute()

    heartbeat = register_broker

    def live_brokers(self, now_ms: int) -> list[str]:
        names = sorted(b.decode() for b in self.r.smembers(f"{self.p}:brokers"))
        pipe = self.r.pipeline(transaction=False)
        for b in names:
            pipe.hget(self._broker(b), "expires")
        return [b for b, e in zip(names, pipe.execute()) if e is not None and int(e) > now_ms]

    # -- namespaces --------------------------------------------------------------------------
    def create_namespace(self, ns: str, num_bundles: int, *, exist_ok: bool = False) -> bool:
        nb = NamespaceBundles.initial(ns, num_bundles)
        created = self._create(
            keys=[self._ns(ns), f"{self.p}:namespaces", f"{self.p}:epoch"],
            args=[_csv(nb.boundaries), ns, uuid.uuid4().hex],
        )
        if not created and not exist_ok:
            raise InvalidInput("namespace", f"namespace {ns} already exists")
        return bool(created)

    def get_namespace(self, ns: str) -> NamespaceBundles | None:
        raw = self.r.hmget(self._ns(ns), "boundaries", "version")
        if raw[0] is None:
            return None
        bounds = tuple(int(x, 16) for x in raw[0].decode().split(","))
        nb = NamespaceBundles(ns, bounds, int(raw[1]))
        self._ns_cache[ns] = nb
        return nb

    def list_namespaces(self) -> list[str]:
        return sorted(n.decode() for n in self.r.smembers(f"{self.p}:namespaces"))

    def _require_ns(self, ns: str) -> NamespaceBundles:
        nb = self.get_namespace(ns)
        if nb is None:
            raise InvalidInput("namespace", f"unknown namespace {ns}")
        return nb

    def _reshape_ns(
        self, ns: str, expected: int, new: NamespaceBundles, gone: Sequence[str]
    ) -> int:
        check_boundaries(new.boundaries)
        res = self._reshape(
            keys=[self._ns(ns), *[self._lease(b) for b in gone]],
            args=[expected, _csv(new.boundaries), self.p, *gone],
        )
        if res[0] == -1:
            raise InvalidInput("namespace", f"unknown namespace {ns}")
        if res[0] == 0:
            raise Conflict(f"{ns}: version is {res[1]}, expected {expected}")
        return int(res[1])

    def split_bundle(
        self, bundle: str, boundaries: Sequence[int], expected_version: int | None = None
    ) -> NamespaceBundles:
        """Split at ``boundaries`` with CAS on the namespace version; the parent's lease ends.

        With ``expected_version=None`` a lost race re-reads and retries up to ``MAX_RETRIES``
        times (the bundle must still exist); with a version, a mismatch raises ``Conflict``.
        """
        r = parse_bundle(bundle)
        for _ in range(MAX_RETRIES):
            nb = self._require_ns(r.namespace)
            if expected_version is not None and nb.version != expected_version:
                raise Conflict(f"{r.namespace}: version is {nb.version}, not {expected_version}")
            new = nb.split(r, boundaries)  # raises InvalidBundle if the bundle is gone
            try:
                self._reshape_ns(r.namespace, nb.version, new, [r.name])
            except Conflict:
                if expected_version is not None:
                    raise
                continue
            return new
        raise Conflict(f"{bundle}: split lost {MAX_RETRIES} races")

    def merge_bundles(
        self, first: str, second: str, expected_version: int | None = None
    ) -> NamespaceBundles:
        """Merge two adjacent bundles (not a Pulsar operation); both leases end."""
        a = parse_bundle(first)
        for _ in range(MAX_RETRIES):
            nb = self._require_ns(a.namespace)
            if expected_version is not None and nb.version != expected_version:
                raise Conflict(f"{a.namespace}: version is {nb.version}, not {expected_version}")
            new = nb.merge(first, second)
            try:
                self._reshape_ns(a.namespace, nb.version, new, [first, second])
            except Conflict:
                if expected_version is not None:
                    raise
                continue
            return new
        raise Conflict(f"{first}+{second}: merge lost {MAX_RETRIES} races")

    # -- leases ------------------------------------------------------------------------------
    def acquire(self, bundle: str, broker: str, now_ms: int, ttl_ms: int) -> Lease:
        """Take a free or expired bundle; raise ``Conflict`` if someone else holds it."""
        r = parse_bundle(bundle)
        for _ in range(MAX_RETRIES):
            nb = self._require_ns(r.namespace)
            if not nb.contains(r):
                raise InvalidInput("bundle", f"{bundle} is not a current bundle of {r.namespace}")
            res = self._acquire(
                keys=[
                    self._ns(r.namespace),
                    self._lease(bundle),
                    self._broker(broker),
                    self._owned(broker),
                    f"{self.p}:fence",
                ],
                args=[bundle, nb.version, broker, now_ms, ttl_ms, self.p],
            )
            if res[0] == -1:
                continue  # boundaries changed between the read and the script: re-read
            if res[0] == -2:
                raise BrokerNotAlive("broker", f"broker {broker} is not registered or expired")
            owner = res[1].decode() if isinstance(res[1], bytes) else res[1]
            lease = Lease(bundle, owner, int(res[2]), int(res[3]))
            if res[0] == 0:
                raise Conflict(f"{bundle} is owned by {owner} (token {lease.token})")
            return lease
        raise Conflict(f"{bundle}: namespace kept changing")

    def renew_all(
        self, broker: str, leases: Mapping[str, int], now_ms: int, ttl_ms: int
    ) -> dict[str, bool]:
        """Renew all of a broker's leases in one call: bundle -> token; stale ones are not."""
        names = sorted(leases)
        if not names:
            return {}
        res = self._renew(
            keys=[self._lease(b) for b in names],
            args=[broker, now_ms, ttl_ms, *[leases[b] for b in names]],
        )
        return {b: bool(x) for b, x in zip(names, res)}

    def release(self, bundle: str, broker: str, token: int, now_ms: int) -> bool:
        """Give a bundle up; only the live holder with the current token can."""
        keys = [self._lease(bundle), self._owned(broker)]
        return bool(self._release(keys=keys, args=[bundle, broker, token, now_ms, "1"]))

    def transfer(
        self, bundle: str, from_broker: str, token: int, to_broker: str, now_ms: int, ttl_ms: int
    ) -> Lease:
        """Move a live lease to another live broker atomically, with a new token."""
        if from_broker == to_broker:
            raise InvalidInput("destinationBroker", "destination is the source broker")
        res = self._transfer(
            keys=[
                self._lease(bundle),
                self._owned(from_broker),
                self._owned(to_broker),
                self._broker(to_broker),
                f"{self.p}:fence",
            ],
            args=[bundle, from_broker, token, to_broker, now_ms, ttl_ms],
        )
        if res[0] == -2:
            raise BrokerNotAlive("broker", f"broker {to_broker} is not registered or expired")
        if res[0] == 0:
            raise Conflict(f"{bundle}: {from_broker} with token {token} does not hold it")
        return Lease(bundle, to_broker, int(res[1]), int(res[2]))

    def owner(self, bundle: str, now_ms: int) -> Lease | None:
        raw = self.r.hmget(self._lease(bundle), "broker", "token", "expires")
        if raw[0] is None or int(raw[2]) <= now_ms:
            return None
        return Lease(bundle, raw[0].decode(), int(raw[1]), int(raw[2]))

    def owners(self, ns: str, now_ms: int) -> dict[str, Lease]:
        nb = self._require_ns(ns)
        pipe = self.r.pipeline(transaction=False)
        names = nb.bundle_names
        for b in names:
            pipe.hmget(self._lease(b), "broker", "token", "expires")
        out = {}
        for b, raw in zip(names, pipe.execute()):
            if raw[0] is not None and int(raw[2]) > now_ms:
                out[b] = Lease(b, raw[0].decode(), int(raw[1]), int(raw[2]))
        return out

    def sweep_expired(self, now_ms: int) -> list[Lease]:
        """Remove expired leases (each with a CAS on its token) and return them."""
        gone: list[Lease] = []
        for key in self.r.scan_iter(match=f"{self.p}:lease:*", count=1000):
            raw = self.r.hmget(key, "broker", "token", "expires")
            if raw[0] is None or int(raw[2]) > now_ms:
                continue
            bundle = key.decode()[len(f"{self.p}:lease:") :]
            broker, token = raw[0].decode(), int(raw[1])
            args = [bundle, broker, token, now_ms, "0"]
            if self._release(keys=[key, self._owned(broker)], args=args):
                gone.append(Lease(bundle, broker, token, int(raw[2])))
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
        bundle = nb.find_bundle(topic).name
        return bundle, self.owner(bundle, now_ms)

    def _bundle_of(self, topic: str) -> str:
        """Hot path of lookups: hash, binary search, and a cached name per bundle index."""
        full = normalize_topic(topic)
        ns = full.split("://", 1)[1].rsplit("/", 1)[0] if full.count("/") == 4 else None
        if ns is None:
            ns = topic_namespace(full)
        nb = self._ns_cache[ns]
        names = self._names_cache.get((ns, nb.version))
        if names is None:
            names = nb.bundle_names
            self._names_cache[(ns, nb.version)] = names
        h = zlib.crc32(full.encode("utf-8")) & 0xFFFFFFFF
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
        pipe = self.r.pipeline(transaction=False)
        for b in bundles:
            pipe.hmget(self._lease(b), "broker", "token", "expires")
        out: list[tuple[str, Lease | None]] = []
        for b, raw in zip(bundles, pipe.execute()):
            live = raw[0] is not None and int(raw[2]) > now_ms
            out.append((b, Lease(b, raw[0].decode(), int(raw[1]), int(raw[2])) if live else None))
        return out


def _csv(bounds: Sequence[int]) -> str:
    return ",".join(f"0x{b:08x}" for b in bounds)
