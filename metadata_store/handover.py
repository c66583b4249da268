"""Handover fences: a lease that ends by a move keeps the next holder waiting until the old
holder stopped serving.

Why: a broker stops serving by its own clock (``loadbalance.serving``), at the latest when its
lease would lapse. A lease that ends by *expiry* has lapsed, so the next holder may serve at
once. A lease that ends by a *move* (a transfer, a release, a split or a merge) ends in the
store while the old holder may serve on until its next check. So the script that ends a live
lease over range R held by broker A until E (store time) records a fence (R, A, A's token, E),
and every lease granted over a range that overlaps a live fence of another broker carries
``notbefore`` = the latest such E: its holder is told to wait ``notbefore - now`` store ms
before serving. The fence ends only when A acknowledges, *after* it stopped serving
(``ack_handover``), or when E passes; a renewal then answers a wait of 0.

Stored per namespace (``Keys.handover``): a hash from the old holder's token (tokens are
unique store-wide) to ``lower,upper,expires,broker``. ``LUA_HANDOVER`` holds the Lua helpers
the lease scripts of ``metadata_store.ownership_redis`` share; ``MemoryStore`` keeps the same
fences in a dict.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LUA_ACK", "LUA_HANDOVER", "HandoverFence", "parse_fence", "ranges_overlap"]

_RING_TOP = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class HandoverFence:
    """Broker ``broker`` held ``[lower, upper]`` of ``namespace`` with ``token`` until
    ``expires_at_ms`` (store time) when the lease ended by a move."""

    namespace: str
    lower: int
    upper: int
    broker: str
    token: int
    expires_at_ms: int


def _end(upper: int) -> int:
    return upper + 1 if upper == _RING_TOP else upper


def ranges_overlap(lo1: int, up1: int, lo2: int, up2: int) -> bool:
    """``[lo, up)`` ranges of one namespace overlap (a range ending at the ring's top covers
    it), as ``loadbalance.lease_history`` compares them."""
    return lo1 < _end(up2) and lo2 < _end(up1)


def parse_fence(namespace: str, token: bytes | str, value: bytes | str) -> HandoverFence | None:
    """One stored fence (hash field and value), or None if it is not one."""
    text = value.decode() if isinstance(value, bytes) else value
    parts = text.split(",", 3)
    try:
        lower, upper, expires = int(parts[0]), int(parts[1]), int(parts[2])
        return HandoverFence(namespace, lower, upper, parts[3], int(token), expires)
    except (IndexError, ValueError):
        return None


# Shared by the lease scripts (after ``LUA_CLOCK``). A bundle's bounds are read from the end of
# a lease key or a bundle name (``..._0x%08x_0x%08x``).
LUA_HANDOVER = """
local function ho_range(name)
  local lo, up = string.match(name, '(0x%x+)_(0x%x+)$')
  return tonumber(lo), tonumber(up)
end
local function ho_end(u)
  if u == 4294967295 then return u + 1 end
  return u
end
-- the latest expiry of the live fences of brokers other than `who` over `name`'s range
-- (0: none); fences whose expiry has passed (or that hold no fence) are removed
local function ho_not_before(key, name, who, now)
  local lo, up = ho_range(name)
  local nb = 0
  local all = redis.call('HGETALL', key)
  for i = 1, #all, 2 do
    local flo, fup, fexp, fb = string.match(all[i + 1], '^(%d+),(%d+),(%d+),(.*)$')
    fexp = tonumber(fexp)
    if not fexp or fexp <= now then
      redis.call('HDEL', key, all[i])
    elseif fb ~= who and tonumber(flo) < ho_end(up) and lo < ho_end(tonumber(fup))
       and fexp > nb then
      nb = fexp
    end
  end
  return nb
end
-- a live lease over `name` held by `broker` with `token` until `exp` ends by a move
local function ho_record(key, name, broker, token, exp, now)
  ho_not_before(key, name, broker, now)
  local lo, up = ho_range(name)
  redis.call('HSET', key, tostring(token),
             string.format('%d,%d,%d,%s', lo, up, tonumber(exp), broker))
end
"""

# KEYS: handover key; ARGV: broker, token -> 1 | 0
# The old holder's acknowledgement, sent after it stopped serving: only its own fence goes.
LUA_ACK = """
local v = redis.call('HGET', KEYS[1], ARGV[2])
if not v then return 0 end
if string.match(v, '^%d+,%d+,%d+,(.*)$') ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[2])
return 1
"""
