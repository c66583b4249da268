"""What must hold in Redis after any fault, checked by reading every key the store owns.

Why a separate reader: the fault tests must not trust the code under test to judge itself, so
this module parses the raw keys (``P:ns:*``, ``P:lease:*``, ``P:owned:*``, ``P:fence``) and
checks the safety properties of docs/reliability.md:

* every namespace's boundaries start at 0x00000000, end at 0xffffffff and strictly increase
  (the ring is covered exactly: no gap, no overlap);
* every lease names a bundle that is current in its namespace, and at most one live lease per
  bundle can exist by construction of the key, so we also check that the ``owned`` sets agree
  with the leases (a bundle listed as owned by two brokers would be two owners to a reader);
* every lease token is at most the fencing counter (tokens come from it and only grow).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import redis

from infra.process import spawn
from metadata_store.keys import Keys

FULL_UPPER = 0xFFFFFFFF
REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


@dataclass
class StoreState:
    """A raw read of the store: boundaries, leases and owned sets."""

    boundaries: dict[str, list[int]] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)
    leases: dict[str, tuple[str, int, int]] = field(default_factory=dict)  # broker, token, exp
    owned: dict[str, set[str]] = field(default_factory=dict)
    fence: int = 0

    def bundles(self, ns: str) -> list[str]:
        b = self.boundaries[ns]
        return [f"{ns}/0x{lo:08x}_0x{hi:08x}" for lo, hi in itertools.pairwise(b)]

    def live_owner(self, bundle: str, now_ms: int) -> str | None:
        lease = self.leases.get(bundle)
        return lease[0] if lease and lease[2] > now_ms else None


# One atomic read of every key the checks judge (a sweep or a placement running beside the
# check must not show a lease in one read and its owned set in another).
# KEYS: namespaces set, fence; ARGV: ns key prefix, lease key prefix, owned key prefix
# -> {fence, {ns, boundaries, version, ...}, {lease key, broker, token, expires, ...},
#     {owned key, {members}, ...}}
_READ_STATE_LUA = """
local nss = {}
for _, ns in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local v = redis.call('HMGET', ARGV[1] .. ns, 'boundaries', 'version')
  nss[#nss + 1] = ns
  nss[#nss + 1] = v[1] or ''
  nss[#nss + 1] = v[2] or '0'
end
local leases = {}
for _, key in ipairs(redis.call('KEYS', ARGV[2] .. '*')) do
  local v = redis.call('HMGET', key, 'broker', 'token', 'expires')
  leases[#leases + 1] = key
  leases[#leases + 1] = v[1] or ''
  leases[#leases + 1] = v[2] or '0'
  leases[#leases + 1] = v[3] or '0'
end
local owned = {}
for _, key in ipairs(redis.call('KEYS', ARGV[3] .. '*')) do
  owned[#owned + 1] = key
  owned[#owned + 1] = redis.call('SMEMBERS', key)
end
return {redis.call('GET', KEYS[2]) or '0', nss, leases, owned}
"""


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def read_state(r: redis.Redis, prefix: str) -> StoreState:
    """Every namespace, lease and owned set, read in one Lua call: one instant of the store."""
    s = StoreState()
    keys = Keys(prefix)
    lease_prefix, owned_prefix = keys.lease_prefix(), keys.owned("")
    fence, nss, leases, owned = r.eval(
        _READ_STATE_LUA,
        2,
        keys.namespaces(),
        keys.fence(),
        keys.ns(""),
        lease_prefix,
        owned_prefix,
    )
    for i in range(0, len(nss), 3):
        ns = _text(nss[i])
        s.boundaries[ns] = [int(x, 16) for x in _text(nss[i + 1]).split(",")]
        s.versions[ns] = int(nss[i + 2])
    for i in range(0, len(leases), 4):
        bundle = _text(leases[i])[len(lease_prefix) :]
        s.leases[bundle] = (_text(leases[i + 1]), int(leases[i + 2]), int(leases[i + 3]))
    for i in range(0, len(owned), 2):
        s.owned[_text(owned[i])[len(owned_prefix) :]] = {_text(m) for m in owned[i + 1]}
    s.fence = int(fence)
    return s


def check_invariants(r: redis.Redis, prefix: str, now_ms: int) -> StoreState:
    """Assert the safety properties; return the state read, for further checks."""
    s = read_state(r, prefix)
    current: set[str] = set()
    for ns, b in s.boundaries.items():
        assert b[0] == 0 and b[-1] == FULL_UPPER, f"{ns}: ring not covered: {b[0]:x}..{b[-1]:x}"
        assert all(x < y for x, y in itertools.pairwise(b)), (
            f"{ns}: overlapping or empty ranges {b}"
        )
        current.update(s.bundles(ns))
    for bundle, (broker, token, _exp) in s.leases.items():
        assert bundle in current, f"lease on {bundle}, which is no current bundle"
        assert token <= s.fence, f"{bundle}: token {token} above the fence counter {s.fence}"
        assert bundle in s.owned.get(broker, set()), f"{bundle}: {broker} not in its owned set"
    for broker, bundles in s.owned.items():
        for bundle in bundles:
            lease = s.leases.get(bundle)
            assert lease is not None and lease[0] == broker, (
                f"{broker} lists {bundle} as owned but the lease says {lease}"
            )
    return s


def wait_for(what: str, cond: Callable[[], object], timeout_s: float, step_s: float = 0.2):
    """Poll ``cond`` until it is truthy; fail the test with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(step_s)


def lbctl(
    args: list[str], log: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``python -m lbctl.main ARGS`` as a real process in its own process group (so a
    SIGKILL is real and reaches a Spark JVM too); it dies with the test run."""
    full_env = {**os.environ, "PYSPARK_PYTHON": PYTHON, **(env or {})}
    return spawn([PYTHON, "-m", "lbctl.main", *args], log, env=full_env, cwd=REPO)


def kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to the process and everything it started (the Spark JVM)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 20.0) -> int | None:
    """SIGTERM, then SIGKILL, to the whole group; returns the exit status."""
    if proc.poll() is None:
        kill_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            proc.wait(10)
    kill_group(proc)  # leftovers (a JVM) of an exited leader
    return proc.returncode


def set_args(knobs: Mapping[str, object]) -> list[str]:
    out: list[str] = []
    for k, v in knobs.items():
        out += ["--set", f"{k}={v}"]
    return out
