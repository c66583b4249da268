"""The decider lease: one streaming job decides at a time, and every decision says which term.

Pulsar elects one leader broker to run its load manager; here the decider is the streaming
job's decision stage, and a second job started by mistake (or an old driver still alive after a
restart) must not publish decisions beside the real one. Three keys (formats in
``metadata_store.keys``):

* ``P:decider``: the lease, a hash naming the holder (``host:pid:random``, its host and pid),
  its **term**, its expiry and the last batch that renewed it.
* ``P:decider:term``: the term counter. A decider that takes a free or expired lease gets the
  next term (``INCR``, raised above ``P:decider:seen`` if that is higher), so terms only grow
  and a restarted job always decides under a higher term than any before it.
* ``P:decider:seen``: the newest term of a decision a controller accepted, shared by every
  controller.

**One clock per judgement**, as for the ownership leases (``metadata_store.ownership_redis``):
the acquire-or-renew script reads the lease and judges its expiry against Redis's own
``TIME`` (or the caller's ``now_ms`` with ``clock="caller"``, for tests) in the step that acts
on the judgement. No key expiry is used.

The decision stage calls ``hold`` once per batch. The holder renews while the term it holds is
still the newest (even after its expiry, when nobody took the lease meanwhile: no other decider
has decided since); anyone else gets the lease only when it is free or expired, under a new
term. A batch whose ``hold`` does not answer with the term the stage held publishes nothing.

The controller calls ``admit(term)`` for every decision from the topic, before applying it: in
one script, a term older than the newest known (the counter or ``seen``, whichever is higher)
is refused, and a newer one raises ``seen``. So a decision of a decider that lost its lease is
refused once a newer term exists, a decision without a term (an older job: term 0) is refused
once any decider has held the lease, and every controller judges by the same number. A
handover that lands between ``admit`` and the apply lets that one decision through, as any
decision already in flight; the next renewal of the old decider fails, so it stops there.

A term above the counter was never handed out by this Redis (it lost its data since): it is
admitted and raises ``seen``; the decider's next renewal then fails and it takes the lease again
above that term, within one TTL.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from typing import Any

import redis

from loadbalance.errors import InvalidInput
from metadata_store.keys import Keys
from metadata_store.ownership_redis import LUA_CLOCK

__all__ = ["DeciderInfo", "DeciderLease", "Hold", "decider_id"]

# the store's own clock function (Redis ``TIME`` when ``now`` is empty), so the decider lease
# and the bundle leases are judged by one piece of Lua
_LUA_CLOCK = (
    LUA_CLOCK
    + """
local function num(v) return tonumber(v or '0') or 0 end
"""
)

# KEYS: lease, term counter, seen
# ARGV: holder, ttl, now, host, pid, batch ('' = none), expected term ('' = any)
# -> {1, term, expires, now} renewed | {2, term, expires, now} acquired
#    | {0, term, expires, now, holder} held by another (or by this holder under an old term)
_LUA_HOLD = (
    _LUA_CLOCK
    + """
local now = clock(ARGV[3])
local cur = redis.call('HMGET', KEYS[1], 'holder', 'term', 'expires')
local newest = math.max(num(redis.call('GET', KEYS[2])), num(redis.call('GET', KEYS[3])))
local exp = now + tonumber(ARGV[2])
local mine = cur[1] == ARGV[1] and num(cur[2]) >= newest
if mine and ARGV[7] ~= '' and num(cur[2]) ~= tonumber(ARGV[7]) then mine = false end
local term
local code
if mine then
  term = num(cur[2])
  code = 1
  redis.call('HSET', KEYS[1], 'expires', exp, 'renewedAtMs', now)
elseif cur[1] and num(cur[3]) > now then
  return {0, num(cur[2]), num(cur[3]), now, cur[1]}
else
  term = redis.call('INCR', KEYS[2])
  if term <= newest then
    term = newest + 1
    redis.call('SET', KEYS[2], term)
  end
  code = 2
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'host', ARGV[4], 'pid', ARGV[5],
             'term', term, 'expires', exp, 'acquiredAtMs', now, 'renewedAtMs', now)
end
if ARGV[6] ~= '' then
  redis.call('HSET', KEYS[1], 'lastBatch', ARGV[6], 'lastBatchAtMs', now)
end
return {code, term, exp, now}
"""
)

# KEYS: term counter, seen; ARGV: term, raise ('1': raise seen) -> {1, newest} | {0, newest}
_LUA_ADMIT = """
local function num(v) return tonumber(v or '0') or 0 end
local seen = num(redis.call('GET', KEYS[2]))
local newest = math.max(num(redis.call('GET', KEYS[1])), seen)
local t = tonumber(ARGV[1])
if t < newest then return {0, newest} end
if t > seen and ARGV[2] == '1' then redis.call('SET', KEYS[2], t) end
return {1, math.max(newest, t)}
"""

# KEYS: lease; ARGV: holder, term -> 1 released | 0 not this holder's
_LUA_RELEASE = """
local cur = redis.call('HMGET', KEYS[1], 'holder', 'term')
if cur[1] ~= ARGV[1] or tonumber(cur[2]) ~= tonumber(ARGV[2]) then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""

_INFO_FIELDS = ("holder", "host", "pid", "term", "expires", "acquiredAtMs", "renewedAtMs",
                "lastBatch", "lastBatchAtMs")  # fmt: skip

_PROCESS_ID: list[str] = []


def decider_id() -> str:
    """``host:pid:random``, fixed for this process: unique among deciders (the random part
    tells a restarted process from an old one with a recycled pid), readable by an operator.
    One per process, so a query restarted inside the same process renews its own lease
    instead of waiting for it to expire."""
    if not _PROCESS_ID:
        _PROCESS_ID.append(f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}")
    return _PROCESS_ID[0]


@dataclass(frozen=True, slots=True)
class Hold:
    """What one ``hold`` found: ``held`` (renewed or acquired), the term and expiry of the
    lease (this holder's, or the other holder's), Redis's time of the judgement, and who holds
    it when this one does not."""

    held: bool
    acquired: bool
    term: int
    expires_ms: int
    at_ms: int
    holder: str = ""


@dataclass(frozen=True, slots=True)
class DeciderInfo:
    """The lease as stored, judged at ``now_ms`` (``live``), and the newest term known."""

    holder: str
    host: str
    pid: int | None
    term: int
    expires_ms: int
    acquired_at_ms: int | None
    renewed_at_ms: int | None
    last_batch: int | None
    last_batch_at_ms: int | None
    now_ms: int
    newest_term: int
    seen_term: int

    @property
    def live(self) -> bool:
        return self.expires_ms > self.now_ms


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _int(v: Any) -> int | None:
    try:
        return None if v is None else int(v)
    except ValueError:
        return None


class DeciderLease:
    """The decider lease, its term counter and the controllers' newest seen term."""

    def __init__(self, client: Any, prefix: str = "lb", *, clock: str = "server") -> None:
        if clock not in ("caller", "server"):
            raise InvalidInput("clock", f"must be caller or server, got {clock!r}")
        self._r = client
        self._keys = Keys(prefix)
        self.clock = clock
        self._hold = client.register_script(_LUA_HOLD)
        self._admit = client.register_script(_LUA_ADMIT)
        self._release = client.register_script(_LUA_RELEASE)

    @classmethod
    def from_url(cls, url: str, prefix: str = "lb", **kwargs: Any) -> DeciderLease:
        """The lease of a running deployment: Redis's clock judges it."""
        return cls(redis.Redis.from_url(url, **kwargs), prefix)

    @classmethod
    def of(cls, store: Any) -> DeciderLease | None:
        """The lease over an ownership store's own connection and prefix (what a controller
        admits decisions through); None for a store without Redis (``MemoryStore``)."""
        client, prefix = getattr(store, "r", None), getattr(store, "p", None)
        if client is None or prefix is None:
            return None
        return cls(client, prefix, clock=getattr(store, "clock", "server"))

    def _now(self, now_ms: int | None) -> int | str:
        if self.clock == "server":
            return ""
        if now_ms is None:
            raise InvalidInput("now_ms", "a lease with clock='caller' needs the time")
        return int(now_ms)

    def hold(
        self,
        holder: str,
        ttl_ms: int,
        *,
        term: int | None = None,
        batch: int | None = None,
        now_ms: int | None = None,
    ) -> Hold:
        """Renew the lease if ``holder`` holds it under the newest term (and under ``term``,
        when given: the term the caller believes it holds), else take it if it is free or
        expired, under a new term; ``batch`` is recorded as the last batch."""
        host, _, rest = holder.partition(":")
        pid = rest.partition(":")[0]
        res = self._hold(
            keys=[self._keys.decider(), self._keys.decider_term(), self._keys.decider_seen()],
            args=[holder, int(ttl_ms), self._now(now_ms), host, pid,
                  "" if batch is None else int(batch), "" if term is None else int(term)],
        )  # fmt: skip
        code = int(res[0])
        other = _text(res[4]) if code == 0 else ""
        return Hold(code > 0, code == 2, int(res[1]), int(res[2]), int(res[3]), other)

    def admit(self, term: int, *, record: bool = True) -> int | None:
        """None when a decision of ``term`` may be applied (raising the newest seen term to it
        when ``record``); else the newer term that makes it stale."""
        res = self._admit(
            keys=[self._keys.decider_term(), self._keys.decider_seen()],
            args=[int(term), "1" if record else "0"],
        )
        return None if int(res[0]) else int(res[1])

    def release(self, holder: str, term: int) -> bool:
        """Give the lease up (a clean stop), only if ``holder`` still holds it under ``term``."""
        return bool(self._release(keys=[self._keys.decider()], args=[holder, int(term)]))

    def read(self, now_ms: int | None = None) -> DeciderInfo | None:
        """The lease as stored with the time it is judged at (Redis's, or ``now_ms`` with the
        caller's clock) and the newest terms; None when no decider ever held it here."""
        pipe = self._r.pipeline(transaction=True)
        pipe.time()
        pipe.hmget(self._keys.decider(), *_INFO_FIELDS)
        pipe.get(self._keys.decider_term())
        pipe.get(self._keys.decider_seen())
        (sec, micros), raw, counter, seen = pipe.execute()
        now = int(sec) * 1000 + int(micros) // 1000 if self.clock == "server" else int(now_ms or 0)
        seen_term = _int(seen) or 0
        if raw[0] is None:
            return None
        f = dict(zip(_INFO_FIELDS, raw, strict=True))
        return DeciderInfo(
            holder=_text(f["holder"]),
            host=_text(f["host"] or b""),
            pid=_int(f["pid"]),
            term=_int(f["term"]) or 0,
            expires_ms=_int(f["expires"]) or 0,
            acquired_at_ms=_int(f["acquiredAtMs"]),
            renewed_at_ms=_int(f["renewedAtMs"]),
            last_batch=_int(f["lastBatch"]),
            last_batch_at_ms=_int(f["lastBatchAtMs"]),
            now_ms=now,
            newest_term=max(_int(counter) or 0, seen_term),
            seen_term=seen_term,
        )
