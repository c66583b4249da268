"""Benchmark of the end-to-end reaction: a broker's report crosses the overload threshold; how
long until a bundle has left that broker in Redis, as a client lookup reads the owners?

What runs (everything local, on the product's own code paths, the processes of ``lbctl run``):
embedded Apache Kafka and Redis (``infra.embedded``), ``lbctl stream`` (the Spark job on
``local[2]``, trigger ``--trigger-seconds``, default 0.5 s) and ``lbctl control`` (the
controller) as children of ``lbctl.supervisor``, and in this process a simulated cluster
(``producers.live_sim.LiveSim``: registered brokers, leases acquired and renewed against the
wall clock, lookups, reports published to Kafka) plus two observer threads: one polls the job's
progress and the owners in Redis every ``--poll-ms`` (``RedisStore.owners``, what a lookup
reads), one reads the decisions topic.

The world: ``--brokers`` equal brokers (8 cores, 1 Gbit/s NIC), ``--namespaces`` namespaces of
``--bundles`` bundles each, steady traffic without noise, about 45 % broker usage, the
``balanced`` initial assignment. Split thresholds are far away (they read long-term averages),
so the reaction is a move, not a split.

**Rounds and virtual time.** Every broker reports once per round, all stamped with the same
virtual time, one report interval (``--report-interval-s``, default 60 s, a real cluster's
one-minute report) after the previous round. Rounds run in lockstep with the job: round k+1 is
published once the job has committed the batch that read round k (and at least ``--round-s``
after round k), so each batch carries exactly one round and runs one policy cycle, as a real
cluster does once per report interval. The job's clock is the newest record timestamp, so the
knobs written in minutes pass at round speed: ``loadBalancerSheddingIntervalMinutes`` is set to
one report interval (the shedding gate is open at every batch; a smaller value changes nothing
when a batch carries a report interval), the grace period lasts 30 rounds. Leases are judged on
the wall clock and the simulated brokers renew them every round.

**A trial.** A target broker (rotating) gets ``--hot-bundles`` of its bundles hot: every topic
in them runs at a factor chosen so the broker's weighted usage reaches ``--hot-pct`` (above the
85 % overload threshold) from the next round on (hot bundles out of the grace period first; a
bundle in it cannot move, so the broker must shed another). That round's publish wall time is
noted; the observer polls until one of the target's bundles is no longer owned by it, by a
decision made at or after the hot round (a move decided before it and still in flight is counted
and ignored). Then the traffic goes back to normal and the cluster settles (no owner change for
``--quiet-rounds`` rounds, default 2) before the next trial.
Figures per trial:

* **policy wait**, in rounds: from the first hot report to the round whose batch decided (the
  decision's ``decidedAtMs`` is that round's virtual time). ProjectedUsageShedder reads current
  usage and decides on the first hot round (0); TransferShedder's load is the 0.9-history EMA
  and it needs four consecutive hits, so it waits many rounds. In a real cluster each round is
  one report interval;
* **pipeline latency**, wall clock: from the publish of the deciding round to the move visible
  to a lookup, split at points each read from the clock of the piece that acted: report
  published (this process) -> the batch's decision stage starts (``foreachBatch``: the time of
  the batch's ``streaming.decide`` log line less the duration it logs; so this stage is the
  trigger wait, offset listing and planning) -> the decision on the decisions topic (its Kafka
  record timestamp, set by the job's producer: the Spark plan run by the stage's collect, i.e.
  reading, parsing and the state step, then the Redis commit, the policy cycle and the produce)
  -> applied (the id of the decision's entry in the Redis outcome stream: Redis' clock when the
  controller recorded it) -> visible to the poller (poll period). The batch's view commit seen
  by the poller (the progress clock reaching the round) is printed as a side figure only: the
  poller sees it late by up to its period plus any wait for a core;
* **reaction in this benchmark**: first hot report published -> visible, wall clock (policy
  rounds at lockstep speed plus the pipeline);
* **a real cluster with 1-minute reports**: policy wait x report interval + pipeline latency,
  plus the shedding gate: reports there are not aligned with the shedding cycle, so with
  ``loadBalancerSheddingIntervalMinutes`` = 1 a hot report waits 0 to 60 s more for the next due
  cycle (0 here by construction; a shorter interval shortens it).

Percentiles are nearest-rank: with 20 trials p99 is the maximum. The machine's 2 cores are
shared with the JVM, the Python workers, the Kafka broker, Redis and this process, so stage
times include waiting for a core.

    .venv/bin/python benchmarks/bench_reaction.py [--pair ours] [--trials 20]
    .venv/bin/python benchmarks/bench_reaction.py --pair extensible --trials 6

Prints the per-trial rows, a JSON summary and a Markdown table for docs/benchmarks.md;
``--json FILE`` keeps every observation, and ``--from-json FILE`` prints a kept run's figures
again without running anything. The default run is Spark's start, 5 warm-up rounds and 20
trials of about 5 rounds each: 7 minutes at a load average of 12 (2.3 s a round); rounds take
at least ``--round-s``, so a quiet machine should need about half that.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import re
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STAGES = (
    ("report_to_stage", "report published -> the batch's decision stage starts (ms)"),
    ("stage_to_decision", "-> decision on the decisions topic (ms)"),
    ("decision_to_applied", "-> applied in Redis by the controller (ms)"),
    ("applied_to_visible", "-> visible to a lookup (ms)"),
)
_BATCH_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO streaming\.decide: batch (\d+): .*?"
    r"([\d.]+) ms\s*$"
)


# -- pure helpers (tests/unit/test_bench_reaction.py) -----------------------------------------
def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile, ``q`` in 0..100: the smallest value with at least q % of the
    values at or below it (so p99 of fewer than 100 values is the maximum). NaN when empty."""
    s = sorted(values)
    if not s:
        return float("nan")
    rank = max(1, math.ceil(q / 100.0 * len(s)))
    return s[min(rank, len(s)) - 1]


@dataclass
class Trial:
    """What one trial observed; wall times in ms since the epoch, None where not seen."""

    index: int
    target: str
    hot_bundles: tuple[str, ...]
    factor: float
    hot_usage: float
    hot_round: int
    hot_pub_ms: float
    visible_ms: float | None = None
    moved_bundle: str | None = None
    new_owner: str | None = None
    decision_id: str | None = None
    decision_kind: str | None = None
    decide_round: int | None = None
    decide_pub_ms: float | None = None
    stage_start_ms: float | None = None
    commit_ms: float | None = None
    decision_ms: float | None = None
    applied_ms: float | None = None
    batch: int | None = None  # the micro-batch whose policy cycle decided
    strays: int = 0  # bundles that left the broker by decisions made before the hot report

    @property
    def policy_rounds(self) -> int | None:
        return None if self.decide_round is None else self.decide_round - self.hot_round

    @property
    def reaction_ms(self) -> float | None:
        return None if self.visible_ms is None else self.visible_ms - self.hot_pub_ms

    @property
    def pipeline_ms(self) -> float | None:
        if self.visible_ms is None or self.decide_pub_ms is None:
            return None
        return self.visible_ms - self.decide_pub_ms


def stages(t: Trial) -> dict[str, float | None]:
    """The pipeline latency of a trial split at the observed points; a stage whose ends were not
    both seen is None. Consecutive stages share their ends, so the known ones add up to
    ``pipeline_ms`` when every point was seen."""
    points = [t.decide_pub_ms, t.stage_start_ms, t.decision_ms, t.applied_ms, t.visible_ms]
    out: dict[str, float | None] = {}
    for (name, _), a, b in zip(STAGES, points[:-1], points[1:], strict=True):
        out[name] = None if a is None or b is None else b - a
    return out


def commit_to_decision_ms(t: Trial) -> float | None:
    """How long after the batch's view commit the decision was published, with the commit as
    the poller saw it: late by up to a poll period plus however long the poller waited for a
    core, so a small or even negative figure; a side figure, not a stage."""
    if t.commit_ms is None or t.decision_ms is None:
        return None
    return t.decision_ms - t.commit_ms


def round_of(decided_at_ms: int, start_ms: int, interval_ms: int) -> int | None:
    """The round whose reports carry ``decided_at_ms`` (the job's clock is the newest record
    timestamp, and every report of round k is stamped ``start_ms + k x interval``)."""
    k, rest = divmod(decided_at_ms - start_ms, interval_ms)
    return k if rest == 0 and k >= 0 else None


def parse_batch_lines(lines: Iterable[str]) -> dict[int, tuple[float, float]]:
    """``streaming.decide``'s "batch N: ... X ms" log lines -> {batch: (start, end) wall ms}.
    The line is written when the batch's stage (its policy cycle included) is done, and X is
    how long the stage took, so its start is the line's time less X."""
    out: dict[int, tuple[float, float]] = {}
    for line in lines:
        m = _BATCH_LINE.match(line)
        if m is None:
            continue
        end = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() * 1000
        out[int(m.group(2))] = (end - float(m.group(3)), end)
    return out


def summarize(trials: Sequence[Trial], interval_s: float, gate_s: float) -> dict[str, Any]:
    """p50/p99/max of every figure over the trials that reacted."""

    def dist(values: list[float]) -> dict[str, float] | None:
        if not values:
            return None
        return {
            "p50": round(percentile(values, 50), 1),
            "p99": round(percentile(values, 99), 1),
            "max": round(max(values), 1),
            "n": len(values),
        }

    done = [t for t in trials if t.visible_ms is not None]
    rounds = [float(t.policy_rounds) for t in done if t.policy_rounds is not None]
    pipeline = [t.pipeline_ms for t in done if t.pipeline_ms is not None]
    real = [
        t.policy_rounds * interval_s * 1000 + t.pipeline_ms
        for t in done
        if t.policy_rounds is not None and t.pipeline_ms is not None
    ]
    per_stage = {
        name: dist([v for t in done if (v := stages(t)[name]) is not None]) for name, _ in STAGES
    }
    return {
        "trials": len(trials),
        "reacted": len(done),
        "commitToDecisionPolledMs": dist(
            [v for t in done if (v := commit_to_decision_ms(t)) is not None]
        ),
        "policyRounds": dist(rounds),
        "pipelineMs": dist(pipeline),
        "reactionInBenchMs": dist([t.reaction_ms for t in done if t.reaction_ms is not None]),
        "realClusterMs": dist(real),
        "realClusterGateMaxS": gate_s,
        "stagesMs": per_stage,
        "moves": {
            k: sum(1 for t in done if t.decision_kind == k)
            for k in sorted({t.decision_kind or "?" for t in done})
        },
    }


# -- the world ------------------------------------------------------------------------------
def world(brokers: int, namespaces: int, bundles: int, base_pct: float) -> dict[str, Any]:
    """A scenario document: equal brokers at about ``base_pct`` usage (NIC-bound, CPU close)."""
    msg_bytes, nic_bytes_per_s = 4096, 1e9 / 8
    rate = brokers * base_pct * nic_bytes_per_s / msg_bytes / namespaces
    return {
        "name": "reaction",
        "tick_seconds": 60,
        "cycles": 1_000_000,
        "brokers": [{"prefix": "broker", "count": brokers, "cores": 8, "nic_gbps": 1}],
        "namespaces": [
            {
                "name": "bench/reaction",
                "count": namespaces,
                "bundles": bundles,
                "topics": 50 * bundles,
                "rate_in_per_s": rate,
                "msg_bytes": msg_bytes,
                "subscriptions": 1,
                "noise": 0.0,
                "zipf_exponent": 0.0,
            }
        ],
        "initial_assignment": "balanced",
    }


def hot_bursts(sim: Any, bundles: Iterable[str], factor: float, start_ms: int, end_ms: int):
    """Bursts on every topic of ``bundles`` (model time), for ``sim_model.bundle_stats``."""
    from producers.sim_model import Burst

    wanted = set(bundles)
    out = []
    for ns_name, nb in sim.namespaces().items():
        names = nb.bundle_names
        for i, topic in enumerate(sim.scenario.model.traffic[ns_name].topics):
            if names[nb.find_index(topic.hash)] in wanted:
                out.append(Burst(ns_name, i, start_ms, end_ms, factor))
    return tuple(out)


def set_bursts(sim: Any, bursts: tuple) -> None:
    model = dataclasses.replace(sim.scenario.model, bursts=bursts)
    sim.scenario = dataclasses.replace(sim.scenario, model=model)


def hot_factor(sim: Any, target: str, bundles: Sequence[str], cycle: int, hot_pct: float):
    """The smallest factor (steps of 0.25) that takes ``target``'s weighted usage to
    ``hot_pct``; (factor, usage)."""
    from producers.sim_model import reports_at

    namespaces = sim.namespaces()
    owners = {b: lease.broker for b, lease in sim.leases(namespaces, sim.clock()).items()}
    t_ms = cycle * sim.tick_ms
    factor, usage = 1.0, 0.0
    while factor < 50:
        factor += 0.25
        model = dataclasses.replace(
            sim.scenario.model, bursts=hot_bursts(sim, bundles, factor, 0, 1 << 62)
        )
        reports, _ = reports_at(model, namespaces, owners, sorted(sim.live), t_ms, random.Random(0))
        usage = sim.weights.weighted_max(reports[target])
        if usage >= hot_pct:
            break
    return factor, usage


# -- observers ------------------------------------------------------------------------------
class Observer(threading.Thread):
    """Polls the job's progress and, during a trial, the owners of the target's bundles."""

    def __init__(self, redis_url: str, prefix: str, poll_s: float) -> None:
        super().__init__(daemon=True, name="observer")
        import redis

        from metadata_store.ownership_redis import RedisStore
        from metadata_store.progress import RedisProgress

        self.store = RedisStore.from_url(redis_url, prefix=prefix)
        self.progress = RedisProgress(redis.Redis.from_url(redis_url), prefix)
        self.poll_s = poll_s
        self.lock = threading.Lock()
        self.commits: list[tuple[int, float]] = []  # (job clock, first wall ms seen)
        self.clock: int | None = None
        self.watch: tuple[str, dict[str, str]] | None = None  # broker, bundle -> namespace
        self.departures: list[tuple[float, str, str]] = []  # wall ms, bundle, new owner
        self.stop_event = threading.Event()
        self.errors = 0

    def commit_seen_ms(self, clock_ms: int) -> float | None:
        with self.lock:
            return next((w for c, w in self.commits if c >= clock_ms), None)

    def start_watch(self, broker: str, bundles: Mapping[str, str]) -> None:
        with self.lock:
            self.watch, self.departures = (broker, dict(bundles)), []

    def take_departures(self) -> list[tuple[float, str, str]]:
        """The watched bundles seen leaving the broker since the last call (each once)."""
        with self.lock:
            out, self.departures = self.departures, []
            return out

    def end_watch(self) -> None:
        with self.lock:
            self.watch = None

    def run(self) -> None:
        while not self.stop_event.wait(self.poll_s):
            try:
                self._poll()
            except Exception:  # a Redis hiccup: counted, the next poll goes on
                self.errors += 1

    def _poll(self) -> None:
        _, clock = self.progress.batch_and_clock()
        now = time.time() * 1000
        with self.lock:
            if clock is not None and clock != self.clock:
                self.clock = clock
                self.commits.append((clock, now))
            watch = self.watch
        if watch is None:
            return
        broker, bundles = watch
        for ns in sorted(set(bundles.values())):
            owners = self.store.owners(ns, int(time.time() * 1000))
            seen = time.time() * 1000
            for b in sorted(b for b, n in bundles.items() if n == ns):
                lease = owners.get(b)
                if lease is None or lease.broker != broker:
                    with self.lock:
                        if self.watch is not None and self.watch[1].pop(b, None) is not None:
                            self.departures.append((seen, b, lease.broker if lease else "(free)"))


class DecisionReader(threading.Thread):
    """Every record of the decisions topic, with its Kafka timestamp (the producer's wall
    clock when the job published it)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True, name="decisions")
        from confluent_kafka import Consumer, TopicPartition

        from infra.offsets import probe_consumer_config

        self.consumer = Consumer(probe_consumer_config(bootstrap, None))
        parts = self.consumer.list_topics(topic, timeout=10).topics[topic].partitions
        self.consumer.assign([TopicPartition(topic, p, 0) for p in sorted(parts)])
        self.lock = threading.Lock()
        self.decisions: list[tuple[dict[str, Any], int]] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            msg = self.consumer.poll(0.1)
            if msg is None or msg.error() is not None:
                continue
            try:
                doc = json.loads(msg.value())
            except ValueError:
                continue
            with self.lock:
                self.decisions.append((doc, msg.timestamp()[1]))
        self.consumer.close()

    def find(self, bundle: str, source: str) -> tuple[dict, int] | None:
        """The newest decision moving ``bundle`` off ``source`` read so far, with its Kafka
        timestamp."""
        with self.lock:
            for doc, ts in reversed(self.decisions):
                if doc.get("bundle") == bundle and doc.get("sourceBroker") == source:
                    return doc, ts
        return None


def applied_times(client: Any, prefix: str) -> dict[str, float]:
    """Decision id -> wall ms of its ``applied`` entry in the outcome stream (the entry id is
    Redis' clock when the controller recorded it, right after the write)."""
    from metadata_store.outcomes import OutcomeLog

    log = OutcomeLog(client, prefix)
    out: dict[str, float] = {}
    last = "-"
    while True:
        entries = log.read_after(last, 1000)
        if not entries:
            return out
        for entry_id, fields in entries:
            f = {k.decode(): v.decode() for k, v in fields.items()}
            if f.get("outcome") == "applied":
                out.setdefault(f.get("id", ""), float(entry_id.split("-")[0]))
            last = entry_id


# -- one run --------------------------------------------------------------------------------
class Bench:
    """The cluster in lockstep with the job, and the trials."""

    def __init__(
        self,
        args: argparse.Namespace,
        sim: Any,
        observer: Observer,
        reader: DecisionReader,
        sup: Any,
    ) -> None:
        self.args, self.sim, self.observer, self.reader, self.sup = args, sim, observer, reader, sup
        self.cycle = 0
        self.pub_ms: dict[int, float] = {}
        self.last_tick = 0.0
        self.recent_moves: dict[str, int] = {}  # bundle -> round it last changed owner
        self.owners: dict[str, str] = {}
        self.last_moved = 0

    def virtual_ms(self, k: int) -> int:
        return self.sim.virtual_ms(k)

    def tick(self, lockstep: bool = True) -> None:
        """One round: wait for the job to have committed the last one (lockstep) and for the
        round period, then publish."""
        deadline = time.monotonic() + self.args.lockstep_timeout_s
        while lockstep and self.cycle > 0 and time.monotonic() < deadline:
            clock = self.observer.clock
            if clock is not None and clock >= self.virtual_ms(self.cycle - 1):
                break
            time.sleep(0.005)
        wait = self.last_tick + self.args.round_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        self._check_children()
        self.last_tick = time.monotonic()
        self.pub_ms[self.cycle] = time.time() * 1000
        result = self.sim.tick(self.cycle)
        owners = {
            b: lease.broker
            for b, lease in self.sim.leases(self.sim.namespaces(), self.sim.clock()).items()
        }
        for b, o in owners.items():
            if self.owners.get(b, o) != o:
                self.recent_moves[b] = self.cycle
        self.owners = owners
        self.cycle += 1
        self.last_moved = result.moved

    def _check_children(self) -> None:
        for ex in self.sup.poll():
            raise RuntimeError(f"{ex.name} exited with code {ex.code}: {ex.error or ex.tail}")

    def start_up(self) -> None:
        """Rounds every 3 s until the job's first commit, then lockstep rounds until quiet."""
        self.sim.setup()
        deadline = time.monotonic() + self.args.startup_timeout_s
        while self.observer.clock is None:
            if time.monotonic() > deadline:
                raise RuntimeError("the streaming job committed no batch in time")
            self.tick(lockstep=False)  # leases renewed, a backlog the first batch reads
            time.sleep(max(0.0, 3.0 - self.args.round_s))
        say(f"job's first batch committed after {self.cycle} rounds; warming up")
        self.settle(min_rounds=self.args.warmup_rounds)

    def settle(self, min_rounds: int) -> int:
        """Rounds until ``min_rounds`` passed and no owner changed for ``--quiet-rounds``."""
        quiet = n = 0
        while n < self.args.settle_max_rounds:
            self.tick()
            n += 1
            quiet = 0 if self.last_moved else quiet + 1
            if n >= min_rounds and quiet >= self.args.quiet_rounds:
                break
        return n

    def pick(self, index: int) -> tuple[str, list[str]]:
        """The trial's broker (rotating) and its hot bundles: its largest, those out of the
        grace period first (a bundle in it cannot be moved, so the broker must shed others)."""
        brokers = sorted(self.sim.live)
        grace_rounds = int(self.sim.config.load_balancer_shedding_grace_period_minutes) + 2
        for j in range(len(brokers)):
            target = brokers[(index + j) % len(brokers)]
            own = [b for b, o in sorted(self.owners.items()) if o == target]
            if len(own) <= self.args.hot_bundles:
                continue
            stats = self.sim.last.reports[target].last_stats
            ranked = sorted(
                (
                    self.cycle - self.recent_moves.get(b, -(10**9)) <= grace_rounds,
                    -(stats[b].msg_throughput_in if b in stats else 0.0),
                    b,
                )
                for b in own
            )
            return target, [b for _, _, b in ranked[: self.args.hot_bundles]]
        raise RuntimeError(f"no broker owns more than {self.args.hot_bundles} bundles")

    def trial(self, index: int) -> Trial:
        target, hot = self.pick(index)
        k = self.cycle
        factor, usage = hot_factor(self.sim, target, hot, k, self.args.hot_pct / 100)
        set_bursts(self.sim, hot_bursts(self.sim, hot, factor, k * self.sim.tick_ms, 1 << 62))
        ns_of = {b: b.rsplit("/", 1)[0] for b, o in self.owners.items() if o == target}
        self.observer.start_watch(target, ns_of)
        self.tick()
        t = Trial(index, target, tuple(hot), factor, usage, k, self.pub_ms[k])
        while t.visible_ms is None and self.cycle < k + self.args.max_wait_rounds:
            for seen_ms, bundle, owner in self.observer.take_departures():
                found = self._decision(bundle, target)
                if found is None or found[0].get("decidedAtMs", 0) < self.virtual_ms(k):
                    t.strays += 1  # moved by a decision made before the hot report
                    continue
                t.visible_ms, t.moved_bundle, t.new_owner = seen_ms, bundle, owner
                self._note_decision(t, *found)
                break
            else:
                self.tick()
        self.observer.end_watch()
        set_bursts(self.sim, ())  # traffic back to normal from the next round on
        return t

    def _decision(self, bundle: str, source: str) -> tuple[dict, int] | None:
        """The decision that moved ``bundle`` off ``source``; the reader may lag the move by a
        poll, so wait a little for it."""
        deadline = time.monotonic() + 3.0
        found = self.reader.find(bundle, source)
        while found is None and time.monotonic() < deadline:
            time.sleep(0.05)
            found = self.reader.find(bundle, source)
        return found

    def _note_decision(self, t: Trial, doc: dict[str, Any], kafka_ts_ms: int) -> None:
        t.decision_id, t.decision_kind = doc["id"], doc["kind"]
        t.decision_ms = float(kafka_ts_ms)
        t.batch = int(doc["cycle"]) if str(doc.get("cycle", "")).isdigit() else None
        t.decide_round = round_of(doc["decidedAtMs"], self.sim.start_ms, self.sim.tick_ms)
        if t.decide_round is not None:
            t.decide_pub_ms = self.pub_ms.get(t.decide_round)
            t.commit_ms = self.observer.commit_seen_ms(self.virtual_ms(t.decide_round))


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def knob_sets(args: argparse.Namespace) -> list[str]:
    from producers.scoreboard import PAIRS

    pair = PAIRS[args.pair]
    minutes = args.report_interval_s / 60
    knobs = {
        **{k: str(v) for k, v in pair.overrides.items()},
        "loadBalancerSheddingIntervalMinutes": f"{minutes:g}",
        "loadBalancerSplitIntervalMinutes": f"{minutes:g}",
    }
    return [f"{k}={v}" for k, v in knobs.items()] + list(args.set or [])


def start_processes(args: argparse.Namespace, config: Any, sets: list[str], sup: Any) -> tuple:
    """Embedded Kafka and Redis, the topics, then ``lbctl stream`` and ``lbctl control`` as
    ``lbctl run`` starts them; (bootstrap servers, Redis URL)."""
    from infra.config_loading import ensure_pipeline_topics
    from lbctl.supervisor import SPARK_ENV, lbctl_argv

    bs, url = sup.start_embedded(sup.run_dir / "services")
    ensure_pipeline_topics(bs, config)
    common = [a for s in sets for a in ("--set", s)]
    where = ["--bootstrap-servers", bs, "--redis-url", url]
    checkpoint = ["--checkpoint", str(sup.run_dir / "checkpoint")]
    trigger = ["--trigger-seconds", str(args.trigger_seconds), "--source", args.source]
    for flag, value in (
        ("--shuffle-partitions", args.shuffle_partitions),
        ("--shards", args.shards),
    ):
        trigger += [flag, str(value)] if value is not None else []
    sup.start(
        "stream",
        lbctl_argv("stream", *where, *checkpoint, *trigger, *common),
        env_defaults=SPARK_ENV,
    )
    group = ["--group", f"{config.redis_key_prefix}-controller"]
    sup.start("control", lbctl_argv("control", *where, *group, *common))
    return bs, url


def run(args: argparse.Namespace) -> tuple[list[Trial], dict[str, Any]]:
    """One run: the processes, the cluster, the trials; everything stopped at the end."""
    import redis

    from infra.config_loading import load_from_args
    from lbctl.supervisor import Supervisor
    from metadata_store.ownership_redis import RedisStore
    from producers.live_sim import LiveSim, TimestampedReportPublisher
    from producers.scenarios import parse_scenario

    sets = knob_sets(args)
    config = load_from_args(argparse.Namespace(config=None, set=sets))
    doc = world(args.brokers, args.namespaces, args.bundles, args.base_pct / 100)
    doc["tick_seconds"] = args.report_interval_s
    scenario = parse_scenario(doc, random.Random(args.seed))
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="bench-reaction-")).resolve()
    sup = Supervisor(run_dir)
    say(f"bench_reaction: pair {args.pair}; logs in {run_dir}")
    trials: list[Trial] = []
    started = time.monotonic()
    threads: list[Any] = []
    try:
        bs, url = start_processes(args, config, sets, sup)
        store = RedisStore.from_url(url, prefix=config.redis_key_prefix)
        publisher = TimestampedReportPublisher(bs, config.load_reports_topic)
        sim = LiveSim(scenario, config, store, publisher, seed=args.seed)
        observer = Observer(url, config.redis_key_prefix, args.poll_ms / 1000)
        reader = DecisionReader(bs, config.decisions_topic)
        threads = [observer, reader]
        for th in threads:
            th.start()
        bench = Bench(args, sim, observer, reader, sup)
        bench.start_up()
        say(f"cluster settled after {bench.cycle} rounds, {time.monotonic() - started:.0f} s")
        for i in range(args.trials):
            trials.append(bench.trial(i))
            settle = bench.settle(min_rounds=args.quiet_rounds)
            say(row_line(trials[-1]) + f"  settled in {settle} rounds")
        rounds, seconds = bench.cycle, time.monotonic() - started
        client = redis.Redis.from_url(url)
        applied = applied_times(client, config.redis_key_prefix)
        client.close()
        publisher.close()
    finally:
        for th in threads:
            th.stop_event.set()
        for th in threads:
            th.join(timeout=5)
        sup.stop_all()
    add_stage_times(trials, applied, run_dir / "stream.log")
    info = {
        "runDir": str(run_dir),
        "rounds": rounds,
        "seconds": round(seconds, 1),
        "roundWallS": round(seconds / max(rounds, 1), 2),
        "knobs": sets,
    }
    return trials, info


def add_stage_times(trials: Sequence[Trial], applied: Mapping[str, float], log: Path) -> None:
    """Fill in what is read after the run: each decision's applied time (outcome stream) and
    its batch's decision-stage start (the stream's log)."""
    batches = parse_batch_lines(log.read_text(errors="replace").splitlines())
    for t in trials:
        if t.decision_id is not None:
            t.applied_ms = applied.get(t.decision_id)
            span = batches.get(t.batch) if t.batch is not None else None
            t.stage_start_ms = span[0] if span else None


# -- output ---------------------------------------------------------------------------------
def _ms(v: float | None) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:,.0f}"


def row_line(t: Trial) -> str:
    return (
        f"trial {t.index:2d} {t.target} x{t.factor:.2f} ({t.hot_usage:.0%}): "
        f"policy rounds {t.policy_rounds if t.policy_rounds is not None else '-'}, "
        f"pipeline {_ms(t.pipeline_ms)} ms, in-bench reaction {_ms(t.reaction_ms)} ms, "
        f"{t.decision_kind or '-'} {t.moved_bundle or '-'} -> {t.new_owner or '-'}"
        + (f" ({t.strays} earlier moves off it ignored)" if t.strays else "")
    )


def markdown(
    args: argparse.Namespace, s: dict[str, Any], info: dict[str, Any], loadavg: str
) -> str:
    from producers.scoreboard import PAIRS

    def d(key: str, scale: float = 1.0, unit: str = "") -> str:
        v = s[key]
        if v is None:
            return "-"
        return f"{_ms(v['p50'] * scale)}{unit} / {_ms(v['p99'] * scale)}{unit}"

    rounds = s["policyRounds"]
    rounds_txt = (
        "-"
        if rounds is None
        else (
            f"{rounds['p50']:.0f} / {rounds['p99']:.0f} "
            f"(= {rounds['p50'] * args.report_interval_s:.0f} / "
            f"{rounds['p99'] * args.report_interval_s:.0f} s of report intervals)"
        )
    )
    stage_rows = "\n".join(
        f"| {label} | {_ms(v['p50']) if v else '-'} / {_ms(v['p99']) if v else '-'} |"
        for (name, label), v in ((st, s["stagesMs"][st[0]]) for st in STAGES)
    )
    gate = s["realClusterGateMaxS"]
    commit = d("commitToDecisionPolledMs")
    real = s["realClusterMs"]
    real_txt = (
        "-"
        if real is None
        else (
            f"{real['p50'] / 1000:.1f} s / {real['p99'] / 1000:.1f} s, plus 0-{gate:.0f} s "
            "shedding gate"
        )
    )
    return f"""
```
.venv/bin/python benchmarks/bench_reaction.py {" ".join(info.get("argv", sys.argv[1:]))}
```

Pair `{args.pair}` ({PAIRS[args.pair].label}); {args.brokers} brokers, {args.namespaces} x
{args.bundles} bundles; trigger {args.trigger_seconds} s, one report round per batch (a round
took {info["roundWallS"]} s of wall time), report interval {args.report_interval_s:g} s of
virtual time, shedding interval = one report interval; {s["reacted"]} of {s["trials"]} trials
reacted ({", ".join(f"{k} {v}" for k, v in s["moves"].items())}); load average before the run
{loadavg}; nearest-rank percentiles (p99 of {s["reacted"]} trials is their maximum). The
decision left {commit} ms (p50 / p99) after the batch's view commit as the poller saw it.

| figure (p50 / p99) | value |
|---|---|
| policy wait, report rounds after the first hot report | {rounds_txt} |
| pipeline: deciding report published -> move visible to a lookup (ms) | {d("pipelineMs")} |
{stage_rows}
| reaction in this benchmark: first hot report -> visible (ms, rounds at lockstep speed) | \
{d("reactionInBenchMs")} |
| a real cluster, 1-minute reports: policy wait x 60 s + pipeline | {real_txt} |
"""


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", default="ours", help="strategy pair (producers.scoreboard.PAIRS)")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--brokers", type=int, default=8)
    ap.add_argument("--namespaces", type=int, default=4)
    ap.add_argument("--bundles", type=int, default=12, help="bundles per namespace")
    ap.add_argument("--base-pct", type=float, default=45.0, help="broker usage before a trial")
    ap.add_argument("--hot-pct", type=float, default=95.0, help="target usage in a trial")
    ap.add_argument("--hot-bundles", type=int, default=2, help="hot bundles per trial")
    ap.add_argument("--trigger-seconds", type=float, default=0.5)
    ap.add_argument(
        "--shuffle-partitions",
        type=int,
        default=None,
        help="the job's state partitions (lbctl stream --shuffle-partitions; default: its own)",
    )
    ap.add_argument(
        "--shards",
        type=int,
        default=None,
        help="the job's bundle state shards (lbctl stream --shards; default: its own)",
    )
    ap.add_argument(
        "--source",
        default="kafka",
        choices=("kafka", "python"),
        help="the job's Kafka source: Spark's connector (default) or the Python data source",
    )
    ap.add_argument("--round-s", type=float, default=1.0, help="least wall time per round")
    ap.add_argument(
        "--report-interval-s", type=float, default=60.0, help="virtual time between rounds"
    )
    ap.add_argument("--poll-ms", type=float, default=20.0)
    ap.add_argument("--max-wait-rounds", type=int, default=40)
    ap.add_argument("--warmup-rounds", type=int, default=5)
    ap.add_argument("--quiet-rounds", type=int, default=2)
    ap.add_argument("--settle-max-rounds", type=int, default=20)
    ap.add_argument("--lockstep-timeout-s", type=float, default=10.0)
    ap.add_argument("--startup-timeout-s", type=float, default=300.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--run-dir", default=None)
    ap.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE")
    ap.add_argument("--json", default=None, metavar="FILE", help="also write the figures here")
    ap.add_argument(
        "--from-json",
        default=None,
        metavar="FILE",
        help="run nothing: print the figures of a run saved with --json (its options given again)",
    )
    return ap


def load_run(args: argparse.Namespace) -> tuple[list[Trial], dict[str, Any], list[str]]:
    """The trials, run facts and load average of a run kept with ``--json``."""
    saved = json.loads(Path(args.from_json).read_text())
    names = {f.name for f in dataclasses.fields(Trial)}
    trials = [Trial(**{k: v for k, v in row.items() if k in names}) for row in saved["perTrial"]]
    for t in trials:
        t.hot_bundles = tuple(t.hot_bundles)
    info = {k: saved[k] for k in ("runDir", "rounds", "seconds", "roundWallS", "knobs")}
    given = [a for a in sys.argv[1:] if a not in (args.from_json, "--from-json")]
    info["argv"] = saved.get("argv") or given
    return trials, info, saved["loadavgBefore"]


def main() -> int:
    args = parser().parse_args()
    import logging

    logging.basicConfig(level=logging.WARNING)
    if args.from_json:
        trials, info, loadavg = load_run(args)
    else:
        loadavg = Path("/proc/loadavg").read_text().split()[:3]
        trials, info = run(args)
        info["argv"] = sys.argv[1:]
    s = summarize(trials, args.report_interval_s, args.report_interval_s)
    for t in trials:
        print(row_line(t), {k: _ms(v) for k, v in stages(t).items()})
    out = {
        "pair": args.pair,
        **info,
        "loadavgBefore": loadavg,
        **s,
        "perTrial": [
            {**dataclasses.asdict(t), "policyRounds": t.policy_rounds, "pipelineMs": t.pipeline_ms}
            for t in trials
        ],
    }
    print(json.dumps({k: v for k, v in out.items() if k != "perTrial"}, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    print(markdown(args, s, info, " ".join(loadavg)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
