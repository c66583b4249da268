"""A chaos soak: the whole product under random process kills, with exact checks at the end.

Why: each fault test aims one fault at one moment. Operators meet faults in any order and
overlapping a busy cluster's ordinary work. This soak runs what ``lbctl run`` runs (the Spark
job, two controllers in one group, the simulated brokers of a busy scenario) on a three-broker
Apache Kafka cluster and a Redis with AOF, and for a set time injects, one at a time and at
seeded random moments:

* ``job``: SIGKILL of the streaming job (driver and JVM), restarted on its checkpoint;
* ``controller``: SIGKILL of one controller, restarted;
* ``brokers-kill``: SIGKILL of the simulated brokers (the agents), restarted;
* ``brokers-stop``: SIGSTOP of the simulated brokers past the lease TTL, then SIGCONT (a paused
  JVM: its leases lapse and are placed elsewhere while it sleeps);
* ``redis``: SIGKILL of Redis, restarted on the same port and AOF (``appendfsync always``, the
  setting under which an acknowledged write survives a crash);
* ``kafka``: SIGKILL of one Kafka broker, restarted.

While it runs, a sampler reads every lease in one Lua call (atomic, by
Redis's clock) a few times a second and records every two live leases on overlapping hash
ranges. At the end, after the brokers stop and the pipeline drains, it checks:

1. the ring is exact and the owned sets agree with the leases (``invariants.check_invariants``);
2. each bundle had at most one owner in store time (the sampler) and in real serving time (the
   brokers' recorded serving intervals, when the simulator writes them);
3. every decision on the decisions topic has exactly one outcome and none was applied twice;
4. no event is lost: every lease token the sampler saw has its ``assigned`` or ``transferred``
   event on the ownership-events topic.

``python -m tests.reliability.chaos_soak --duration 1800 --seed 7`` runs a long soak and prints
its figures (``--json`` for one JSON object); ``tests/reliability/test_chaos_soak.py`` runs
three minutes of it in CI.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import redis

from controller.events import ASSIGNED, TRANSFERRED, decode_event
from infra.config_loading import ensure_pipeline_topics
from infra.embedded import EmbeddedRedis
from infra.kafka_server import KafkaCluster
from loadbalance.config import LoadBalancerConfig
from loadbalance.decisions import decode_decision
from loadbalance.serving import ServingInterval
from loadbalance.serving_checker import ClockBound, check_serving
from metadata_store.keys import Keys
from metadata_store.ownership_redis import RedisStore
from metadata_store.progress import RedisProgress
from tests.reliability.invariants import (
    check_invariants,
    kill_group,
    lbctl,
    set_args,
    stop,
    wait_for,
)
from tests.reliability.kafka_cluster import assert_one_outcome_each_applied_once, outcome_entries
from tests.reliability.test_stream_faults import _read_values

FAULTS = ("job", "controller", "brokers-kill", "brokers-stop", "redis", "kafka")
LEASE_TTL_S = 6
CYCLE_S = 2.0
DRAIN_TIMEOUT_S = 240.0
SAME_HOST_CLOCK = ClockBound.skewed(0.0, 1.0)
"""Every simulated broker reads the host's CLOCK_MONOTONIC, the soak's reference clock, and
the serving files keep its readings at full precision: the images are exact, with no allowance.
An allowance would be wrong here, not merely loose: a simulated broker acknowledges a handover
the instant it stops (``ack_delay_s=0``), so the next holder may start a few milliseconds after
the stop, and two 1 ms allowances made such a handover read as an overlap."""

SNAPSHOT_LUA = """
local out = {}
local t = redis.call('TIME')
out[1] = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local leases = {}
for _, key in ipairs(redis.call('KEYS', KEYS[1] .. '*')) do
  if redis.call('TYPE', key)['ok'] == 'hash' then
    local v = redis.call('HMGET', key, 'broker', 'token', 'expires')
    leases[#leases + 1] = string.sub(key, #KEYS[1] + 1)
    leases[#leases + 1] = v[1] or ''
    leases[#leases + 1] = v[2] or '0'
    leases[#leases + 1] = v[3] or '0'
  end
end
out[2] = leases
return out
"""


class AofAlwaysRedis(EmbeddedRedis):
    """The embedded Redis with ``appendfsync always``: an acknowledged write survives SIGKILL."""

    def _argv(self, port: int) -> list[str]:
        return [*super()._argv(port), "--appendfsync", "always"]


@dataclass
class Sampler:
    """Reads every lease atomically a few times a second; records overlaps and tokens seen."""

    r: redis.Redis
    prefix: str
    period_s: float = 0.25
    samples: int = 0
    errors: int = 0
    violations: list[str] = field(default_factory=list)
    tokens: dict[tuple[str, int], str] = field(default_factory=dict)  # (bundle, token) -> broker
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        script = self.r.register_script(SNAPSHOT_LUA)
        self._keys = [Keys(self.prefix).lease_prefix()]
        while not self._stop.wait(self.period_s):
            try:
                now, leases = script(keys=self._keys)
            except redis.RedisError:
                self.errors += 1  # Redis down or loading: the next sample tries again
                continue
            self.samples += 1
            self._check(int(now), leases)

    def _check(self, now: int, leases: list[bytes]) -> None:
        live: dict[str, list[tuple[int, int, str, str]]] = {}
        for i in range(0, len(leases), 4):
            bundle, broker = leases[i].decode(), leases[i + 1].decode()
            token, expires = int(leases[i + 2]), int(leases[i + 3])
            self.tokens.setdefault((bundle, token), broker)
            if expires <= now:
                continue
            ns, _, rng = bundle.rpartition("/")
            lo, hi = (int(x, 16) for x in rng.split("_"))
            live.setdefault(ns, []).append((lo, hi, bundle, broker))
        for ranges in live.values():
            ranges.sort()
            for (_, hi_a, a, owner_a), (lo_b, _, b, owner_b) in itertools.pairwise(ranges):
                if lo_b < hi_a:
                    self.violations.append(
                        f"store time {now}: {a} ({owner_a}) and {b} ({owner_b}) both live"
                    )

    def stop(self) -> None:
        self._stop.set()


@dataclass
class Soak:
    """The services, the product's processes, and the fault schedule of one soak."""

    workdir: Path
    seed: int
    scenario: str
    rng: random.Random = field(init=False)
    prefix: str = field(default_factory=lambda: f"soak{uuid.uuid4().hex[:6]}")
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    faults: Counter[str] = field(default_factory=Counter)
    restarts: Counter[str] = field(default_factory=Counter)
    brokers_ended: dict[int, float] = field(default_factory=dict)  # incarnation -> monotonic
    say: Callable[[str], None] = print

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.logs = self.workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)

    @property
    def knobs(self) -> dict[str, object]:
        p = self.prefix
        return {
            "redisKeyPrefix": p,
            "loadReportsTopic": f"reports-{p}",
            "decisionsTopic": f"dec-{p}",
            "deadLettersTopic": f"dead-{p}",
            "ownershipEventsTopic": f"ev-{p}",
            "topicPartitions": 2,
            "loadBalancerOwnershipLeaseTtlSeconds": LEASE_TTL_S,
            "loadBalancerSheddingIntervalMinutes": 1,
            "loadBalancerSheddingGracePeriodMinutes": 2,
        }

    def start(self) -> None:
        self.cluster = KafkaCluster(self.workdir / "kafka", size=3)
        self.cluster.start()
        self.redis = AofAlwaysRedis(self.workdir / "redis", appendonly=True)
        self.redis.start()
        self.bootstrap, self.redis_url = self.cluster.bootstrap_servers, self.redis.url
        self.config = LoadBalancerConfig(**self.knobs)
        ensure_pipeline_topics(self.bootstrap, self.config)
        self.r = redis.Redis.from_url(self.redis_url, socket_timeout=5)
        for name in ("job", "control-0", "control-1"):
            self._spawn(name)
        # the brokers start once the query exists, as lbctl run does, and the faults once the
        # job has committed a batch: a soak whose job never started would prove nothing
        wait_for("the streaming query", (self.workdir / "ckpt" / "metadata").exists, 300)
        self._spawn("brokers")
        progress = RedisProgress(self.r, self.prefix)
        wait_for("the job's first batch", lambda: progress.last_batch() is not None, 300)

    def _where(self) -> list[str]:
        return ["--bootstrap-servers", self.bootstrap, "--redis-url", self.redis_url]

    def _spawn(self, name: str) -> None:
        knobs = set_args(self.knobs)
        if name == "job":
            argv = ["stream", *self._where(), "--checkpoint", str(self.workdir / "ckpt"),
                    "--trigger-seconds", "1", *knobs]  # fmt: skip
        elif name.startswith("control"):
            argv = ["control", *self._where(), "--group", f"{self.prefix}-ctl", *knobs]
        else:
            argv = ["simulate", self.scenario, *self._where(), "--seed", str(self.seed),
                    "--cycle-seconds", str(CYCLE_S), "--serving-log",
                    str(self.logs / f"serving.{self.restarts[name]}.json"), *knobs]  # fmt: skip
        n = self.restarts[name]
        self.procs[name] = lbctl(argv, self.logs / f"{name}.{n}.log")
        self.restarts[name] += 1

    def alive(self) -> list[str]:
        """Processes that exited on their own (a product process must never do that)."""
        return [n for n, p in self.procs.items() if p.poll() is not None]

    def inject(self) -> str:
        fault = self.rng.choice(FAULTS)
        self.faults[fault] += 1
        if fault == "job":
            self._kill_restart("job", pause_s=self.rng.uniform(1, 4))
        elif fault == "controller":
            self._kill_restart(f"control-{self.rng.randrange(2)}", pause_s=self.rng.uniform(0, 3))
        elif fault == "brokers-kill":
            self._kill_restart("brokers", pause_s=self.rng.uniform(0, 3))
        elif fault == "brokers-stop":
            kill_group(self.procs["brokers"], signal.SIGSTOP)
            time.sleep(LEASE_TTL_S + self.rng.uniform(1, 4))
            kill_group(self.procs["brokers"], signal.SIGCONT)
        elif fault == "redis":
            os.kill(self.redis.pid, signal.SIGKILL)
            time.sleep(self.rng.uniform(0.5, 3))
            self.redis.restart()
        else:
            node = self.cluster.node(self.rng.randrange(3))
            node.kill()
            time.sleep(self.rng.uniform(2, 8))
            self.cluster.restart_node(node.node_id)
        return fault

    def _kill_restart(self, name: str, pause_s: float) -> None:
        kill_group(self.procs[name])
        self.procs[name].wait(30)
        if name == "brokers":  # that incarnation served nothing after this instant
            self.brokers_ended[self.restarts[name] - 1] = time.monotonic()
        time.sleep(pause_s)
        self._spawn(name)

    def drain(self) -> bool:
        """Stop the brokers, then wait until every decision on the topic has an outcome."""
        stop(self.procs.pop("brokers"))
        self.brokers_ended[self.restarts["brokers"] - 1] = time.monotonic()
        store = RedisStore(self.r, self.prefix)
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        quiet_since: float | None = None
        while time.monotonic() < deadline:
            time.sleep(3)
            with contextlib.suppress(Exception):
                decisions = self._decisions()
                if all(store.outcomes.get(i) for i in decisions):
                    quiet_since = quiet_since or time.monotonic()
                    if time.monotonic() - quiet_since > 10:  # no new decision for 10 s
                        return True
                else:
                    quiet_since = None
        return False

    def _decisions(self) -> dict[str, Any]:
        values = _read_values(self.bootstrap, self.config.decisions_topic)
        out: dict[str, Any] = {}
        for v in values:
            d = decode_decision(v)
            out.setdefault(d.id, d)
        return out

    def check(self, sampler: Sampler) -> dict[str, Any]:
        violations = list(sampler.violations)
        store = RedisStore(self.r, self.prefix)
        now_ms = int(self.r.time()[0]) * 1000
        try:
            check_invariants(self.r, self.prefix, now_ms)
        except AssertionError as e:
            violations.append(f"store invariants: {e}")
        decisions = self._decisions()
        try:
            assert_one_outcome_each_applied_once(
                store, decisions, outcome_entries(self.r, self.prefix)
            )
        except AssertionError as e:
            violations.append(f"outcomes: {e}")
        events = [
            decode_event(v)
            for v in _read_values(self.bootstrap, self.config.ownership_events_topic)
        ]
        announced = {(e.bundle, e.new_token) for e in events if e.event in (ASSIGNED, TRANSFERRED)}
        silent = sorted(k for k in sampler.tokens if k not in announced)
        if silent:
            violations.append(f"{len(silent)} lease tokens with no event, e.g. {silent[:3]}")
        intervals = self.serving_intervals()
        overlaps = check_serving(intervals, {i.broker: SAME_HOST_CLOCK for i in intervals})
        violations += [f"serving: {v.kind}: {v.message}" for v in overlaps]
        outcomes = Counter(
            (doc or {}).get("outcome", "?") for doc in (store.outcomes.get(i) for i in decisions)
        )
        return {
            "decisions": len(decisions),
            "outcomes": dict(outcomes),
            "events": Counter(e.event for e in events),
            "lease_tokens_seen": len(sampler.tokens),
            "serving_intervals": len(intervals),
            "samples": sampler.samples,
            "violations": violations,
        }

    def serving_intervals(self) -> list[ServingInterval]:
        """What the simulated brokers served, every incarnation's file (one host, one
        monotonic clock: an interval ends no later than its serve-until even when the process
        was killed before it closed it)."""
        out: list[ServingInterval] = []
        for path in sorted(self.logs.glob("serving.*.json")):
            ended = self.brokers_ended.get(int(path.name.split(".")[1]), float("inf"))
            for doc in json.loads(path.read_text()):
                i = ServingInterval.from_json(doc)
                # an interval still open when its process was killed ended with the process
                # (the file, written after each cycle, gives it its serve-until as its end)
                out.append(replace(i, end=max(i.start, min(i.end, ended))))
        return out

    def close(self) -> None:
        for p in self.procs.values():
            with contextlib.suppress(Exception):
                kill_group(p, signal.SIGCONT)
                stop(p)
        for service in (getattr(self, "redis", None), getattr(self, "cluster", None)):
            if service is not None:
                with contextlib.suppress(Exception):
                    service.stop()


def run_soak(
    workdir: Path,
    duration_s: float,
    seed: int,
    scenario: str = "hot_bundle",
    gap_s: tuple[float, float] = (4.0, 10.0),
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run a soak; return its figures (``violations`` empty when every check held)."""
    soak = Soak(workdir, seed, scenario, say=say)
    started = time.monotonic()
    try:
        soak.start()
        say(f"soak {soak.prefix}: the job's first batch is in; faults start")
        sampler = Sampler(soak.r, soak.prefix)
        thread = threading.Thread(target=sampler.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + duration_s
        exited: list[str] = []
        while time.monotonic() < deadline:
            time.sleep(soak.rng.uniform(*gap_s))
            exited += [f"{n} exited on its own" for n in soak.alive()]
            if exited:
                break
            fault = soak.inject()
            say(f"  {time.monotonic() - started:6.0f} s  fault: {fault}")
        drained = soak.drain()
        sampler.stop()
        thread.join(5)
        figures = soak.check(sampler)
        if not drained:
            figures["violations"].append("decisions still without an outcome after the drain")
        figures["violations"] += exited
        figures.update(
            seed=seed,
            scenario=scenario,
            duration_s=round(time.monotonic() - started, 1),
            faults=dict(soak.faults),
            faults_total=sum(soak.faults.values()),
            logs=str(soak.logs),
        )
        return figures
    finally:
        soak.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=180.0, help="seconds of faults (default 180)")
    p.add_argument("--seed", type=int, default=0, help="seed of the fault schedule (default 0)")
    p.add_argument("--scenario", default="hot_bundle", help="bundled scenario (default hot_bundle)")
    p.add_argument("--workdir", type=Path, default=None, help="run folder (default: a temp dir)")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = p.parse_args(argv)
    workdir = args.workdir or Path(f"/tmp/chaos-soak-{os.getpid()}")
    figures = run_soak(workdir, args.duration, args.seed, args.scenario)
    if args.json:
        print(json.dumps(figures, default=dict))
    else:
        for k, v in figures.items():
            print(f"{k}: {v}")
    return 1 if figures["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
