"""``lbctl bench balance --live``: the balance scoreboard played through the real pipeline.

The fast scoreboard (``producers.scoreboard``) plays each scenario in the in-memory model. This
plays the same scenario, seed and pair through the product: embedded Kafka and Redis, the Spark
job (``lbctl stream``) and the controller (``lbctl control``) as child processes, and the live
simulator (``producers.live_sim``) in this process, publishing the simulated brokers' reports
and serving what Redis says they own. The run is scored by the fast scoreboard's own scorer
(``producers.live_score`` records it in the same terms), and printed beside the fast run of the
same scenario, so a difference between the model and the product shows as a difference in one
table.

**Lockstep (the default).** After publishing cycle ``c``'s reports the simulator waits until the
job has read every one of them (its Spark checkpoint's offsets reach the offsets the reports were
delivered at), the policy cycle they made due has published its decisions (the job's progress in
Redis has no pending cycle), and the controller has committed every decision on the decisions
topic (its consumer group's committed offsets reach the topic's end). Only then does cycle
``c + 1`` read Redis and report. That is the timing of a real cluster, where a broker reports
once a minute and the job and the controller take a second or two, so each decision is in force
before the next report; it is also the fast model's order (report, decide, apply, next cycle).
Each cycle takes as long as the pipeline needs, so the result does not depend on how loaded the
machine is. A crashed broker's leases run out on the wall clock (Redis judges them): at the cycle
where the fast model lets them expire, the lockstep waits until Redis has let them expire too.
While it waits, the simulated brokers keep heartbeating and renewing their leases.

**Paced** (``--cycle-seconds S``): one cycle every S seconds of wall time whatever the pipeline
is doing, as ``lbctl run`` plays a scenario (2 s: thirty times real time), once the job has acted
on the first cycle (as ``lbctl run`` holds its simulator until the job's first batch).
Decisions then land one or more cycles after the reports they were made from, and the
difference from the lockstep row is what that lag costs.

Each scenario gets fresh embedded services and a fresh checkpoint in ``OUT/live/<scenario>/``,
with the children's logs.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from infra.config_loading import ensure_pipeline_topics, kafka_security
from infra.offsets import GroupOffsets, latest_offsets, partitions_for
from infra.redis_client import connect
from lbctl.monitor_lag import checkpoint_offsets
from lbctl.supervisor import SPARK_ENV, Supervisor, lbctl_argv
from loadbalance.config import LoadBalancerConfig, knob_text, load_config
from metadata_store.outcomes import OutcomeLog
from metadata_store.ownership_redis import RedisStore
from metadata_store.progress import RedisProgress
from producers import scoreboard
from producers.fast_sim import LEASES_EXPIRE, SimRun, event_schedule, lease_cycles, simulate
from producers.live_score import LiveRunRecorder
from producers.live_sim import LiveSim, TimestampedReportPublisher
from producers.scenarios import Scenario, load_scenario

log = logging.getLogger("lbctl.bench.live")

FIRST_WAIT_S = 300.0  # the first cycle waits for Spark to start and run its first batch
STEP_WAIT_S = 120.0  # any later cycle: the pipeline is stuck if it takes longer than this
RENEW_EVERY_S = 3.0  # heartbeats while waiting, well inside the 30 s lease and registration
POLL_S = 0.05
EXPIRE_MARGIN_S = 30.0  # beyond the lease TTL, how long a crashed broker's leases may take
BALANCE_SLACK_CYCLES = 3  # targets: live cycles to balance within fast + 3,
MOVES_RATIO = 1.15  # live moves within 1.15 x fast,
END_RATIO_SLACK = 0.05  # and live end max/mean within 0.05 of fast


class LiveRunError(RuntimeError):
    """The live pipeline could not play the scenario (a child died, a wait timed out)."""


@dataclass(frozen=True)
class LiveOptions:
    """How the live runs are played."""

    trigger_seconds: float = 0.5
    cycle_seconds: float | None = None  # None: lockstep
    sets: tuple[str, ...] = ()
    seed: int = 0
    cycles: int | None = None


@dataclass
class LiveResult:
    """One scenario's live and fast scores, and what the live run cost in wall time."""

    scenario: str
    live: scoreboard.Score
    fast: scoreboard.Score
    wall_s: float
    cycle_wall_s: list[float] = field(default_factory=list, repr=False)
    decisions: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    mode: str = "lockstep"
    traces: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)

    @property
    def within_targets(self) -> bool:
        return (
            cycles_within(self.live.balanced_after, self.fast.balanced_after)
            and moves_within(self.live.moves, self.fast.moves)
            and abs(self.live.end_max_over_mean - self.fast.end_max_over_mean) <= END_RATIO_SLACK
        )


def moves_within(live: int, fast: int) -> bool:
    """Live moves at most 1.15 x the model's: the pipeline must be as frugal as the model (a
    model that makes no move allows none)."""
    return live <= fast * MOVES_RATIO


def cycles_within(live: int | None, fast: int | None) -> bool:
    """Live cycles to balance within fast + 3; a fast run that never balances cannot be beaten,
    so any live result is within it, and a live run that never balances is not within a fast
    one that did."""
    if fast is None:
        return True
    return live is not None and live <= fast + BALANCE_SLACK_CYCLES


# -- the lockstep -------------------------------------------------------------------------------


class Lockstep:
    """Waits until the pipeline has acted on everything published so far (module docstring)."""

    def __init__(
        self,
        config: LoadBalancerConfig,
        bootstrap: str,
        checkpoint: Path,
        progress: RedisProgress,
        renew: Callable[[], Any],
        alive: Callable[[], None],
    ) -> None:
        security = kafka_security(config)
        self.config, self.bootstrap, self.security = config, bootstrap, security
        self.checkpoint, self.progress = checkpoint, progress
        self.renew, self.alive = renew, alive
        self.group = GroupOffsets(
            bootstrap, f"{config.redis_key_prefix}-controller", config.decisions_topic, security
        )
        self.decision_partitions = partitions_for(bootstrap, config.decisions_topic, security)
        self._last_renew = time.monotonic()

    def close(self) -> None:
        self.group.close()

    def pause(self, deadline: float, waiting_for: Callable[[], str]) -> None:
        now = time.monotonic()
        if now > deadline:
            raise LiveRunError(f"timed out waiting for {waiting_for()}")
        if now - self._last_renew >= RENEW_EVERY_S:
            self.renew()
            self._last_renew = now
        self.alive()
        time.sleep(POLL_S)

    def job_read(self, delivered: Mapping[int, int]) -> bool:
        done = checkpoint_offsets(self.checkpoint, self.config.load_reports_topic) or {}
        read_all = all(done.get(p, 0) >= end for p, end in delivered.items())
        return read_all and not self.progress.cycle_pending()

    def wait(self, delivered: Mapping[int, int], timeout_s: float) -> None:
        """Until the job read the reports delivered up to ``delivered`` and ran the cycle they
        made due, and the controller committed every decision published meanwhile."""
        deadline = time.monotonic() + timeout_s
        while not self.job_read(delivered):
            self.pause(deadline, lambda: f"the streaming job to read reports up to {delivered}")
        end = latest_offsets(
            self.bootstrap,
            self.config.decisions_topic,
            self.security,
            timeout_s=10.0,
        )
        wanted = {p: o for p, o in end.items() if o > 0}
        while wanted:
            committed = self.group.committed(sorted(wanted))
            if all(committed.get(p, 0) >= o for p, o in wanted.items()):
                break
            self.pause(deadline, lambda: f"the controller to commit decisions up to {wanted}")


# -- one scenario -------------------------------------------------------------------------------


def knob_sets(scenario: Scenario, pair: scoreboard.StrategyPair, sets: Sequence[str]) -> list[str]:
    """The scenario's knobs, then the pair's, then the caller's ``--set`` (last wins): what the
    job, the controller and the simulator's lookups all run with."""
    knobs = {k: knob_text(v) for k, v in scenario.config.items()}
    knobs.update({k: knob_text(v) for k, v in pair.overrides.items()})
    return [f"{k}={v}" for k, v in knobs.items()] + list(sets)


def config_from_sets(sets: Sequence[str]) -> LoadBalancerConfig:
    overrides = dict(s.split("=", 1) for s in sets)
    config, _warnings = load_config(env=os.environ, overrides=overrides)
    return config


class _Outcomes:
    """Reads the controller's outcome stream from where the last read ended."""

    def __init__(self, client: Any, prefix: str) -> None:
        self.log = OutcomeLog(client, prefix)
        self.last = "-"

    def new(self) -> list[Mapping[bytes, bytes]]:
        out: list[Mapping[bytes, bytes]] = []
        while True:
            page = self.log.read_after(self.last, count=5000)
            if not page:
                return out
            self.last = page[-1][0]
            out.extend(fields for _, fields in page)


def play_live(
    scenario_name: str,
    pair_key: str,
    run_dir: Path,
    opts: LiveOptions,
    say: Callable[[str], None],
) -> tuple[LiveRunRecorder, list[float], float]:
    """Play one scenario through the pipeline; (the recording, wall seconds per cycle, total)."""
    scenario = load_scenario(scenario_name, opts.seed)
    pair = scoreboard.PAIRS[pair_key]
    sets = knob_sets(scenario, pair, opts.sets)
    config = config_from_sets(sets)
    cycles = scenario.cycles if opts.cycles is None else opts.cycles
    t0 = time.monotonic()
    sup = Supervisor(run_dir)
    try:
        bootstrap, redis_url = sup.start_embedded(run_dir / "services", run_dir / "redis-data")
        ensure_pipeline_topics(bootstrap, config)
        checkpoint = (run_dir / "checkpoint").resolve()
        where = ["--bootstrap-servers", bootstrap, "--redis-url", redis_url]
        common = [a for s in sets for a in ("--set", s)]
        sup.start(
            "stream",
            lbctl_argv(
                "stream", *where, "--checkpoint", str(checkpoint),
                "--trigger-seconds", str(opts.trigger_seconds), *common,
            ),
            env_defaults=SPARK_ENV,
        )  # fmt: skip
        sup.start(
            "control",
            lbctl_argv(
                "control", *where, "--group", f"{config.redis_key_prefix}-controller", *common
            ),
        )
        recorder, walls = _play(scenario, config, sup, bootstrap, redis_url, checkpoint, opts,
                                cycles, say)  # fmt: skip
    finally:
        sup.stop_all()
    return recorder, walls, time.monotonic() - t0


def _alive_check(sup: Supervisor) -> Callable[[], None]:
    def alive() -> None:
        for ex in sup.poll():
            raise LiveRunError(
                f"{ex.name} exited with code {ex.code}; the end of its log:\n{ex.tail}"
            )

    return alive


def _play(
    scenario: Scenario,
    config: LoadBalancerConfig,
    sup: Supervisor,
    bootstrap: str,
    redis_url: str,
    checkpoint: Path,
    opts: LiveOptions,
    cycles: int,
    say: Callable[[str], None],
) -> tuple[LiveRunRecorder, list[float]]:
    client = connect(redis_url, config, purpose="bench")
    store = RedisStore(client, config.redis_key_prefix)
    progress = RedisProgress(client, config.redis_key_prefix)
    publisher = TimestampedReportPublisher(
        bootstrap, config.load_reports_topic, kafka_security(config)
    )
    sim = LiveSim(scenario, config, store, publisher, seed=opts.seed, stop_event=threading.Event())
    recorder = LiveRunRecorder(scenario, config, opts.seed)
    outcomes = _Outcomes(client, config.redis_key_prefix)
    alive = _alive_check(sup)
    lock = Lockstep(config, bootstrap, checkpoint, progress, sim.renew, alive)
    expiries = {
        c: [name for action, name in acts if action == LEASES_EXPIRE]
        for c, acts in event_schedule(scenario, lease_cycles(config, scenario.tick_ms)).items()
    }
    walls: list[float] = []
    try:
        sim.setup()
        next_at = time.monotonic()
        for c in range(cycles):
            started = time.monotonic()
            alive()
            if opts.cycle_seconds is None:
                for broker in expiries.get(c, ()):
                    _wait_expired(sim, lock, broker, config)
            lc = sim.tick(c)
            recorder.cycle(lc)
            next_at = _wait_for_pipeline(c, opts, lock, publisher, next_at, alive)
            recorder.applied(c, outcomes.new())
            walls.append(time.monotonic() - started)
            if c % 10 == 9 or c == cycles - 1:
                say(_progress_line(scenario.name, recorder, c + 1, cycles, walls))
        if opts.cycle_seconds is not None:  # paced: let the pipeline finish the last cycles
            lock.wait(publisher.delivered, STEP_WAIT_S)
            recorder.applied(cycles - 1, outcomes.new())
    finally:
        lock.close()
        publisher.close()
        client.close()
    return recorder, walls


def _wait_for_pipeline(
    c: int,
    opts: LiveOptions,
    lock: Lockstep,
    publisher: TimestampedReportPublisher,
    next_at: float,
    alive: Callable[[], None],
) -> float:
    """After cycle ``c``'s reports: lockstep waits until the pipeline has acted on them; paced
    waits for the cycle's wall-time slot, the first cycle once the job has acted on it (as
    ``lbctl run`` holds: else its first batch, while Spark starts, reads ten cycles at once).
    The next slot's start."""
    if opts.cycle_seconds is None:
        lock.wait(publisher.delivered, FIRST_WAIT_S if c == 0 else STEP_WAIT_S)
        return next_at
    if c == 0:
        lock.wait(publisher.delivered, FIRST_WAIT_S)
        next_at = time.monotonic()
    next_at += opts.cycle_seconds
    _sleep_until(next_at, alive)
    return next_at


def _sleep_until(deadline: float, alive: Callable[[], None]) -> None:
    while time.monotonic() < deadline:
        alive()
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))


def _progress_line(
    name: str, recorder: LiveRunRecorder, done: int, cycles: int, walls: Sequence[float]
) -> str:
    ratio = scoreboard.max_over_mean(recorder.run.usage[-1])
    return (
        f"  {name} cycle {done}/{cycles}: max/mean {ratio:.2f}, moves "
        f"{len(recorder.run.moves)}, splits {recorder.run.splits}, "
        f"{statistics.fmean(walls[-10:]):.1f} s/cycle"
    )


def _wait_expired(sim: LiveSim, lock: Lockstep, broker: str, config: LoadBalancerConfig) -> None:
    """Hold the cycle until Redis no longer counts any lease of crashed ``broker`` as live."""
    deadline = time.monotonic() + config.load_balancer_ownership_lease_ttl_seconds + EXPIRE_MARGIN_S

    def held() -> int:
        leases = sim.leases(sim.namespaces(), sim.clock())
        return sum(1 for lease in leases.values() if lease.broker == broker)

    while held():
        lock.pause(deadline, lambda: f"the leases of crashed {broker} to expire")


# -- every scenario -----------------------------------------------------------------------------


def run_live_scoreboard(
    scenarios: Sequence[str],
    pair_key: str,
    out: Path,
    opts: LiveOptions,
    say: Callable[[str], None],
) -> list[LiveResult]:
    """Each scenario live (one after the other: they share the two cores) and fast."""
    results: list[LiveResult] = []
    pair = scoreboard.PAIRS[pair_key]
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    for name in scenarios:
        scenario = load_scenario(name, opts.seed)
        run_dir = out / "live" / f"{stamp}-{scenario.name}"
        say(f"{scenario.name}: live run in {run_dir}")
        recorder, walls, wall_s = play_live(name, pair_key, run_dir, opts, say)
        tick_s = scenario.tick_ms / 1000.0
        live = scoreboard.score_run(recorder.run, pair, scenario.kinds, tick_seconds=tick_s)
        fast_run = simulate(
            scenario, pair.overrides, seed=opts.seed, cycles=opts.cycles, keep_reports=True
        )
        fast = scoreboard.score_run(fast_run, pair, scenario.kinds, tick_seconds=tick_s)
        result = LiveResult(
            scenario.name,
            live,
            fast,
            round(wall_s, 1),
            [round(w, 3) for w in walls],
            recorder.decisions,
            dict(recorder.run.outcomes),
            "lockstep" if opts.cycle_seconds is None else f"paced {opts.cycle_seconds:g} s",
            {"live": trace(recorder.run), "fast": trace(fast_run)},
        )
        say(f"{scenario.name}: {row_text(result)}")
        results.append(result)
    return results


# -- output -------------------------------------------------------------------------------------


def trace(run: SimRun) -> dict[str, Any]:
    """What a run did cycle by cycle, for finding where live and fast part: max/mean usage
    per cycle and every move (cycle, bundle, from, to, kind)."""
    return {
        "maxOverMean": [round(scoreboard.max_over_mean(u), 3) for u in run.usage],
        "moves": [[m.cycle, m.bundle, m.source, m.destination, str(m.kind)] for m in run.moves],
        "eventCycles": list(run.event_cycles),
    }


HEADER = (
    "scenario",
    "mode",
    "cycles to balance (fast / live)",
    "end max/mean (fast / live)",
    "moves (fast / live)",
    "splits (fast / live)",
    "oscillations (fast / live)",
    "max moves of a bundle in 60 cycles (fast / live)",
    "GB moved (fast / live)",
    "connections disturbed (fast / live)",
    "within targets",
    "wall s/cycle (mean, p90)",
)


def _both(result: LiveResult, key: str) -> str:
    return f"{scoreboard.cell(result.fast, key)} / {scoreboard.cell(result.live, key)}"


def row(result: LiveResult) -> list[str]:
    walls = sorted(result.cycle_wall_s) or [0.0]
    return [
        result.scenario,
        result.mode,
        _both(result, "balanced_after"),
        _both(result, "end_max_over_mean"),
        _both(result, "moves"),
        _both(result, "splits"),
        _both(result, "oscillations"),
        _both(result, "max_moves_one_bundle_60"),
        _both(result, "bytes_moved_gb"),
        _both(result, "connections_disturbed"),
        "yes" if result.within_targets else "no",
        f"{statistics.fmean(walls):.2f}, {walls[int(0.9 * (len(walls) - 1))]:.2f}",
    ]


def row_text(result: LiveResult) -> str:
    return "; ".join(f"{h} {v}" for h, v in zip(HEADER[2:], row(result)[2:], strict=True))


def to_markdown(results: Sequence[LiveResult]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row(r)) + " |" for r in results]
    return "\n".join(lines) + "\n"


def to_json(results: Sequence[LiveResult], meta: Mapping[str, Any]) -> str:
    rows = []
    for r in results:
        doc = asdict(r)
        for key in ("live", "fast"):
            doc[key] = scoreboard.score_dict(getattr(r, key))
        doc["withinTargets"] = r.within_targets
        rows.append(doc)
    return json.dumps({"meta": dict(meta), "results": rows}, indent=2, sort_keys=True)


def write_outputs(results: Sequence[LiveResult], out: Path, meta: Mapping[str, Any]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    md, js = out / "live.md", out / "live.json"
    md.write_text(to_markdown(results), encoding="utf-8")
    js.write_text(to_json(results, meta), encoding="utf-8")
    return [md, js]


def stderr_say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
