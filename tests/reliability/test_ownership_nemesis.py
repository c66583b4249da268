"""A randomized nemesis run against a real Redis: the recorded ownership history stays clean.

Why: the ownership guards live in Lua scripts, and their unit tests check one operation at a
time. Here controllers, brokers and an admin act on one store at once while Redis is paused
(SIGSTOP) and restarted (SIGTERM and SIGKILL, AOF with ``appendfsync always``); every store
shares one ``HistoryRecorder`` and ``loadbalance.lease_checker`` checks the whole history by
hash interval afterwards: no two live owners, no renewal of a lost lease, sweeps only of expired
leases, growing fencing tokens, consistent namespace versions.

Threads (each with its own RNG derived from the seed, so ``LB_NEMESIS_SEED=<n>`` replays every
thread's schedule of choices; the interleaving is the machine's):

* 3 controllers: place unowned bundles (acquire), transfer and unload through
  ``apply_decision``, split and merge with expected versions, sweep expired leases.
* 6 brokers: heartbeat, discover the leases they were given, renew each one close to its expiry
  (150-400 ms TTLs, sometimes too late: the lease is lost and dropped), now and then stall like a
  paused JVM; some have clocks seconds off, which must not matter with ``clock="server"``.
* 1 admin: transfers with random upper/lower-case spellings of bundle names.
* 1 nemesis: pauses Redis for a few hundred ms, or restarts it on the same port and data dir.

Every thread retries an operation that hit a connection error (Redis down or loading).

Before each restart the nemesis holds new writes back with ``CLIENT PAUSE WRITE`` for a moment,
so every script Redis ran has answered its client before the process dies. Why: a script that
ran but whose reply died with the process did change the store, yet its client saw only a
connection error, so no recorder (inside the store or beside it) can know what it granted or
revoked, and the checker would then blame the store for a lease it cannot see. The held-back
writes fail with the connection and are retried against the restarted Redis, which must have
kept every acknowledged write (AOF, ``appendfsync always``).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from controller.apply import apply_decision
from infra.embedded import EmbeddedRedis, free_port
from loadbalance.decisions import TRANSFER, UNLOAD, make_decision
from loadbalance.errors import Conflict, InvalidInput
from loadbalance.lease_checker import check_history
from loadbalance.lease_history import Claim, Event, HistoryRecorder, NamespaceVersion, Revocation
from metadata_store.ownership_redis import RedisStore

pytestmark = pytest.mark.integration

PREFIX = "nem"
NAMESPACES = ("acme/nem-a", "acme/nem-b")
BROKERS = {  # name -> (lease TTL ms, clock skew ms)
    "b0": (150, 0),
    "b1": (200, 2_500),
    "b2": (250, -3_000),
    "b3": (300, 0),
    "b4": (400, 900),
    "b5": (350, -700),
}
REGISTRATION_TTL_MS = 2_000
MAX_BUNDLES = 12  # per namespace: splits stop here, merges start above MIN_BUNDLES
MIN_BUNDLES = 3
TARGET_OPS = 22_000
MIN_RUN_S = 15.0  # long enough for several pauses and restarts
MAX_RUN_S = 50.0
CONNECTION_ERRORS = (redis.ConnectionError, redis.TimeoutError)


def _seed() -> int:
    raw = os.environ.get("LB_NEMESIS_SEED")
    return int(raw) if raw else random.SystemRandom().randrange(2**32)


def respell(name: str, rng: random.Random) -> str:
    """The same bundle with each hex digit of its range in random case (``0x`` stays)."""
    head, rng_part = name.rsplit("/", 1)
    lo, hi = rng_part.split("_")
    flip = "".join(c.upper() if rng.random() < 0.5 else c.lower() for c in lo[2:] + hi[2:])
    return f"{head}/0x{flip[:8]}_0x{flip[8:]}"


@dataclass
class Run:
    """What the threads share: the server, the history, counters and the stop signal."""

    server: EmbeddedRedis
    seed: int
    recorder: HistoryRecorder = field(default_factory=HistoryRecorder)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    ops: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    restarts_done_ms: list[int] = field(default_factory=list)
    crashes: list[str] = field(default_factory=list)

    def client(self) -> redis.Redis:
        """No retries inside redis-py: ``Actor.call`` retries, and counts what it retried."""
        return redis.Redis(
            host="127.0.0.1",
            port=self.server.port,
            socket_timeout=5,
            socket_connect_timeout=2,
            retry=Retry(NoBackoff(), 0),
        )

    def store(self) -> RedisStore:
        return make_store(self.client(), self.recorder)

    def rng(self, who: str) -> random.Random:
        return random.Random(f"{self.seed}/{who}")

    def total_ops(self) -> int:
        with self.lock:
            return sum(self.ops.values())


def make_store(client: redis.Redis, recorder: HistoryRecorder) -> Any:
    """Every store of the run judges time by Redis's clock and records into one history."""
    return RedisStore(client, PREFIX, clock="server", recorder=recorder)


class Actor:
    """One thread's view: counted store calls, retried while Redis is unreachable."""

    def __init__(self, run: Run, name: str) -> None:
        self.run, self.name = run, name
        self.rng = run.rng(name)
        self.store = run.store()
        self.local: Counter[str] = Counter()
        self.count = 0  # store calls answered, read by the main thread while this one runs

    def call(self, op: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args)``; a connection error is retried until Redis answers or the run ends.
        Store errors (``Conflict``, ``InvalidInput``) are answers, returned as the exception."""
        retried = False
        while True:
            try:
                result = fn(*args, **kwargs)
            except CONNECTION_ERRORS:
                self.local["connection_error"] += 1
                retried = True
                if self.run.stop.is_set():
                    return None
                time.sleep(0.02)
                continue
            except (Conflict, InvalidInput) as e:
                result = e
            self.local[op] += 1
            self.count += 1
            if retried:
                self.local["retried_ok"] += 1
            return result

    def now_ms(self, skew_ms: int = 0) -> int:
        """This actor's wall clock (ignored by a server-clock store, skewed for some brokers)."""
        return int(time.time() * 1000) + skew_ms

    def loop(self) -> None:
        try:
            while not self.run.stop.is_set():
                self.step()
        except Exception as e:  # a crashed actor fails the test instead of thinning the run
            self.run.crashes.append(f"{self.name}: {e!r}")
            self.run.stop.set()
        finally:
            with self.run.lock:
                for k, v in self.local.items():
                    (self.run.faults if k in ("connection_error", "retried_ok") else self.run.ops)[
                        k
                    ] += v

    def step(self) -> None:
        raise NotImplementedError


class Broker(Actor):
    """Heartbeats, picks up the leases it was given, renews each one close to its expiry."""

    def __init__(self, run: Run, name: str) -> None:
        super().__init__(run, name)
        self.ttl_ms, self.skew_ms = BROKERS[name]
        self.held: dict[str, tuple[int, float]] = {}  # bundle -> (token, monotonic renew-by)
        self.next_heartbeat = 0.0
        self.next_discovery = 0.0

    def step(self) -> None:
        mono = time.monotonic()
        if self.rng.random() < 0.002:  # a stall: heartbeats and renewals stop for a while
            time.sleep(self.rng.uniform(0.2, 0.8))
            mono = time.monotonic()
        if mono >= self.next_heartbeat:
            self.call(
                "heartbeat",
                self.store.register_broker,
                self.name,
                self.now_ms(self.skew_ms),
                REGISTRATION_TTL_MS,
            )
            self.next_heartbeat = mono + 0.3
        if mono >= self.next_discovery:
            ns = self.rng.choice(NAMESPACES)
            owners = self.call("owners", self.store.owners, ns, self.now_ms(self.skew_ms))
            if isinstance(owners, dict):
                for bundle, lease in owners.items():
                    if lease.broker == self.name and self.held.get(bundle, (0,))[0] != lease.token:
                        # the remaining time is unknown: renew within the first part of a TTL
                        renew_in = self.ttl_ms * self.rng.uniform(0.1, 0.5) / 1000
                        self.held[bundle] = (lease.token, mono + renew_in)
            self.next_discovery = mono + self.rng.uniform(0.03, 0.12)
        due = {b: tok for b, (tok, by) in self.held.items() if by <= time.monotonic() + 0.005}
        if due:
            asked = {respell(b, self.rng) if self.rng.random() < 0.3 else b: b for b in due}
            answer = self.call(
                "renew",
                self.store.renew_leases,
                self.name,
                {spelled: due[b] for spelled, b in asked.items()},
                self.now_ms(self.skew_ms),
                self.ttl_ms,
            )
            if isinstance(answer, dict):
                after = time.monotonic()
                for spelled, lease in answer.items():
                    b = asked[spelled]
                    if lease is None:
                        self.held.pop(b, None)  # lost: stop serving it
                        self.local["renew_lost"] += 1
                    else:
                        # close to expiry: 60-105 % of the TTL, so a late one loses the lease
                        late = self.rng.uniform(0.6, 1.05)
                        self.held[b] = (lease.token, after + self.ttl_ms * late / 1000)
        time.sleep(0.004)


class Controller(Actor):
    """Applies random decisions, places unowned bundles, splits, merges and sweeps."""

    def step(self) -> None:
        kind = self.rng.choices(
            ["place", "transfer", "unload", "split", "merge", "sweep"],
            [10, 2, 0.5, 0.25, 0.25, 2],
        )[0]
        ns = self.rng.choice(NAMESPACES)
        now = self.now_ms()
        nb = self.call("get_namespace", self.store.get_namespace, ns)
        if nb is None or isinstance(nb, Exception):
            return
        names = nb.bundle_names
        if kind == "sweep":
            self.call("sweep", self.store.sweep_expired, now)
        elif kind == "split":
            splittable = [b for b in nb.bundles if b.can_split()]
            if len(names) < MAX_BUNDLES and splittable:
                r = self.rng.choice(splittable)
                point = self.rng.randrange(r.lower + 1, r.upper)
                self.call(
                    "split",
                    self.store.split_bundle,
                    respell(r.name, self.rng),
                    [point],
                    expected_version=nb.version,
                )
        elif kind == "merge":
            if len(names) > MIN_BUNDLES:
                i = self.rng.randrange(len(names) - 1)
                self.call(
                    "merge",
                    self.store.merge_bundles,
                    names[i],
                    respell(names[i + 1], self.rng),
                    expected_version=nb.version,
                )
        else:
            bundle = self.rng.choice(names)
            dest = self.rng.choice(sorted(BROKERS))
            lease = self.call("owner", self.store.owner, bundle, now)
            if isinstance(lease, Exception):
                return
            if kind == "place":
                if lease is None:
                    self.call("acquire", self.store.acquire, bundle, dest, now, BROKERS[dest][0])
                return
            d = make_decision(
                cycle=f"{self.name}-{self.rng.random()}",
                kind=TRANSFER if kind == "transfer" else UNLOAD,
                bundle=bundle,
                source_broker=lease.broker if lease else None,
                destination_broker=dest if kind == "transfer" else None,
            )
            self.call(
                kind,
                apply_decision,
                self.store,
                d,
                now_ms=now,
                lease_ttl_ms=BROKERS[dest][0],
            )
        time.sleep(0.01)


class Admin(Actor):
    """Operator transfers naming bundles in any case spelling."""

    def step(self) -> None:
        ns = self.rng.choice(NAMESPACES)
        nb = self.call("get_namespace", self.store.get_namespace, ns)
        if nb is None or isinstance(nb, Exception):
            return
        name = respell(self.rng.choice(nb.bundle_names), self.rng)
        lease = self.call("owner", self.store.owner, name, self.now_ms())
        dest = self.rng.choice(sorted(BROKERS))
        if lease is not None and not isinstance(lease, Exception) and lease.broker != dest:
            self.call(
                "admin_transfer",
                self.store.transfer,
                respell(name, self.rng),
                lease.broker,
                lease.token,
                dest,
                self.now_ms(),
                BROKERS[dest][0],
            )
        time.sleep(0.03)


def nemesis(run: Run) -> None:
    """Pause Redis or restart it (SIGTERM or SIGKILL) on the same port and data dir."""
    rng = run.rng("nemesis")
    server = run.server
    rounds: list[str] = []
    try:
        while not run.stop.wait(rng.uniform(0.8, 2.0)):
            if not rounds:  # every round of three has a pause, a clean and a hard restart
                rounds = ["pause", "restart", "kill"]
                rng.shuffle(rounds)
            action = rounds.pop()
            if action == "pause":
                assert server.pid is not None
                os.kill(server.pid, signal.SIGSTOP)
                time.sleep(rng.uniform(0.15, 0.6))
                os.kill(server.pid, signal.SIGCONT)
            elif action == "restart":
                _hold_writes(server)
                server.restart()
            else:
                _hold_writes(server)
                assert server._proc is not None
                server._proc.send_signal(signal.SIGKILL)
                server._proc.wait(10)
                server.start()
            if action != "pause":
                _always_fsync(server)
                run.restarts_done_ms.append(int(time.time() * 1000))
            with run.lock:
                run.faults[action] += 1
    except Exception as e:
        run.crashes.append(f"nemesis: {e!r}")
        run.stop.set()


def _hold_writes(server: EmbeddedRedis) -> None:
    """Block every script and write from now on; let the answers of those that ran go out."""
    client = server.client(socket_timeout=5)
    try:
        client.client_pause(10_000, all=False)
    finally:
        client.close()
    time.sleep(0.05)


def _always_fsync(server: EmbeddedRedis) -> None:
    """Every acknowledged write is on disk before its reply (set again after each start)."""
    client = server.client(socket_timeout=5)
    try:
        client.config_set("appendfsync", "always")
    finally:
        client.close()


def run_nemesis(data_dir: Path, seed: int) -> tuple[Run, list[Event], float]:
    """Start Redis, run every thread until enough operations and time passed, return the
    history. Kept apart from the test so another schedule can reuse it."""
    server = EmbeddedRedis(data_dir, port=free_port(), appendonly=True)
    server.start()
    run = Run(server, seed)
    try:
        _always_fsync(server)
        setup = run.store()
        for ns in NAMESPACES:
            setup.create_namespace(ns, 4)
        actors: list[Actor] = [Broker(run, b) for b in BROKERS]
        actors += [Controller(run, f"controller-{i}") for i in range(3)]
        actors.append(Admin(run, "admin"))
        threads = [threading.Thread(target=a.loop, name=a.name, daemon=True) for a in actors]
        threads.append(threading.Thread(target=nemesis, args=(run,), name="nemesis", daemon=True))
        t0 = time.monotonic()
        for t in threads:
            t.start()
        while not run.stop.is_set():
            elapsed = time.monotonic() - t0
            counted = sum(a.count for a in actors)
            if elapsed >= MAX_RUN_S or (elapsed >= MIN_RUN_S and counted >= TARGET_OPS):
                break
            time.sleep(0.2)
        run.stop.set()
        for t in threads:
            t.join(30)
        elapsed = time.monotonic() - t0
        return run, run.recorder.snapshot(), elapsed
    finally:
        server.stop()


_NOT_OPS = ("connection_error", "retried_ok", "renew_lost")


def summarize(history: list[Event]) -> Counter[str]:
    kinds: Counter[str] = Counter()
    for e in history:
        if isinstance(e, Claim):
            kinds[f"claim:{e.kind}"] += 1
        elif isinstance(e, Revocation):
            kinds[f"revoke:{e.kind}"] += 1
        elif isinstance(e, NamespaceVersion):
            kinds["namespace_version"] += 1
    return kinds


def test_ownership_history_stays_clean_under_pauses_restarts_and_skewed_brokers(tmp_path):
    seed = _seed()
    print(f"nemesis seed={seed}")
    run, history, elapsed = run_nemesis(tmp_path, seed)
    store_ops = sum(v for k, v in run.ops.items() if k not in _NOT_OPS)
    kinds = summarize(history)
    print(
        f"nemesis: {store_ops} store operations in {elapsed:.1f} s, {len(history)} events; "
        f"ops {dict(sorted(run.ops.items()))}; faults {dict(sorted(run.faults.items()))}; "
        f"history {dict(sorted(kinds.items()))}"
    )
    assert not run.crashes, run.crashes
    violations = check_history(history)
    for v in violations[:20]:
        print(f"VIOLATION {v.kind}: {v.message}")
    assert violations == [], f"{len(violations)} violations (seed={seed}); first: {violations[0]}"

    assert store_ops >= 20_000
    # not vacuous: every kind of change happened, and the store kept working across faults
    for k in ("claim:acquire", "claim:transfer", "claim:renew", "revoke:transfer",
              "revoke:release", "revoke:split", "revoke:merge", "revoke:sweep"):  # fmt: skip
        assert kinds[k] > 0, f"no {k} in the history: {dict(kinds)}"
    assert run.ops["renew_lost"] > 0  # some renewals came too late and lost the lease
    assert run.faults["pause"] > 0 and run.faults["restart"] > 0 and run.faults["kill"] > 0
    assert run.faults["retried_ok"] > 0  # operations hit a down Redis and succeeded on retry
    first_restart = min(run.restarts_done_ms)
    after = [e for e in history if isinstance(e, Claim) and e.valid_from_ms > first_restart]
    assert any(c.kind in ("acquire", "transfer") for c in after)
    assert any(c.kind == "renew" for c in after)
