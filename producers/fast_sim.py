"""Fast mode: the closed loop in one process, thousands of cycles per second of virtual time.

This is the imperative shell around the pure model (``producers.sim_model``) and the pure policy
core (``loadbalance``). One **cycle** is one report interval of virtual time, one minute by
default (``tick_seconds`` in the scenario): Pulsar samples host usage every minute
(``loadBalancerHostUsageCheckIntervalMinutes``) and sheds every minute
(``loadBalancerSheddingIntervalMinutes``), so a minute is the finest step at which the policies
can see a change. Time averages count reports, so the short-term window is 10 cycles here.

Per cycle, in this order (what a Pulsar cluster with our controller does):

1. Scenario events: brokers join, leave gracefully (their bundles become unowned), crash (their
   bundles stay unserved until the ownership lease expires), or restart.
2. Lookups: every unowned bundle with topics is placed by ``BrokerSelector`` over the last view,
   with preallocation carried across cycles, exactly as the controller places on lookup.
3. Every live broker reports (``sim_model.reports_at``) from the bundles it owns now.
4. Reports are folded with ``loadbalance.view.ingest`` and ``build_view`` makes the view.
5. ``loadbalance.cycle.step`` decides; its wall time is the policy's compute time.
6. Decisions are applied by the controller's applier (``controller.apply.apply_decision``) to
   an in-memory ownership store (``metadata_store.ownership_memory.MemoryStore``), with the
   product's rules: a transfer moves the lease, an unload frees the bundle for the next lookup,
   a split or merge ends the leases of the bundles it replaces and the new ones start unowned
   (placed by the next lookup), and a stale decision is rejected, not half-applied.

Ownership lives in that store only; ``owners`` and ``namespaces`` are read back from it after
every change. A running broker's registration and leases are held as long as it runs (a live
broker always heartbeats and renews in time, so the simulator skips the renewals); a broker that
leaves or crashes is not live from that cycle on. A graceful leave releases its leases at once;
a crashed broker's leases end when its lease TTL has run out (the cycle ``event_schedule``
gives), as the controller's sweep finds them.

The runner records per-cycle broker usage (the weighted max resource usage the shedders read)
and every bundle move, so ``producers.scoreboard`` can score balance quality; with placement
policies (or heartbeat namespaces) it also judges the ownership at every cycle's end
(``producers.policy_violations``), independently of the filters that chose the owners.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.apply import APPLIED, Outcome, apply_decision, apply_knobs
from loadbalance.bundles import NamespaceBundles, is_system_service_namespace
from loadbalance.config import LoadBalancerConfig
from loadbalance.cycle import CycleState, cycle_rng, ingest_kwargs, step, weights_from_config
from loadbalance.decisions import MERGE, SPLIT, TRANSFER, UNLOAD, Decision
from loadbalance.model import LocalBrokerData
from loadbalance.placement.pipeline import BrokerSelector
from loadbalance.transfer_preallocation import preallocation_of
from loadbalance.view import (
    ClusterView,
    LoadState,
    build_view,
    forget_brokers,
    forget_bundles,
    ingest_many,
    with_preallocated,
)
from metadata_store.ownership_memory import MemoryStore
from producers.policy_violations import Violation, find_violations, isolation_pools
from producers.scenarios import (
    ADD_BROKERS,
    CRASH,
    REMOVE_BROKERS,
    RESTART,
    Scenario,
    initial_owners,
)
from producers.sim_model import reports_at

MINUTE_MS = 60_000
OSCILLATION_WINDOW_MS = 30 * MINUTE_MS  # loadBalancerSheddingGracePeriodMinutes' default
BROKER_DOWN, BROKER_UP, BROKER_CRASH, LEASES_EXPIRE = "down", "up", "crash", "expire"
# How long a lease or registration runs: longer than any run, as a live broker renews both.
HELD_MS = 1 << 50
MAX_VIOLATION_EXAMPLES = 10


@dataclass(frozen=True, slots=True)
class Move:
    """A bundle that changed owner because of a shedding decision (not a lookup placement)."""

    cycle: int
    bundle: str
    source: str
    destination: str
    kind: str
    oscillation: bool


class MoveHistory:
    """Turns owner changes into ``Move`` records, judging oscillation the same way in the fast
    and the live scoreboards: a move that undoes recent work (the bundle moved again inside
    ``oscillation_cycles``, back to the broker it had just left, or onto its own source)."""

    def __init__(self, oscillation_cycles: int) -> None:
        self.oscillation_cycles = oscillation_cycles
        self._last: dict[str, tuple[str, int]] = {}

    def move(self, cycle: int, bundle: str, source: str, dest: str, kind: str) -> Move:
        prev = self._last.get(bundle)
        oscillation = dest == source
        if prev is not None:
            before, at = prev
            oscillation = oscillation or cycle - at < self.oscillation_cycles or dest == before
        self._last[bundle] = (source, cycle)
        return Move(cycle, bundle, source, dest, kind, oscillation)


def lease_cycles(config: LoadBalancerConfig, tick_ms: int) -> int:
    """Cycles a crashed broker's leases take to run out: the lease TTL in whole report
    intervals, at least one."""
    lease_s = config.load_balancer_ownership_lease_ttl_seconds
    return max(1, -(-int(lease_s * 1000) // tick_ms))


def oscillation_cycles(tick_ms: int) -> int:
    """Pulsar's default grace period in cycles, whatever the pair sets, so a pair cannot look
    steadier by shortening its own grace period."""
    return max(1, int(OSCILLATION_WINDOW_MS // tick_ms))


@dataclass
class SimRun:
    """Everything one fast-mode run recorded."""

    scenario: str
    seed: int
    cycles: int
    usage: list[dict[str, float]] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    splits: int = 0
    merges: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    policy_ms: list[float] = field(default_factory=list)
    view_ms: list[float] = field(default_factory=list)
    displaced: set[str] = field(default_factory=set)
    joined: dict[str, int] = field(default_factory=dict)
    event_cycles: list[int] = field(default_factory=list)
    reports: list[dict[str, LocalBrokerData]] = field(default_factory=list)
    violations: list[int] = field(default_factory=list)
    """Per cycle, the placement-policy violations of the ownership at the cycle's end (empty
    when the scenario has no policies to keep)."""
    violation_examples: list[tuple[int, Violation]] = field(default_factory=list)
    """The first few violations with their cycle, to say what broke."""
    pools: dict[str, str] = field(default_factory=dict)
    """broker -> its isolation pool (``policy_violations.isolation_pools``); empty when no
    isolation policy splits the cluster, so balance is judged over all brokers."""


def make_config(
    scenario: Scenario, overrides: Mapping[str, Any] | None = None
) -> LoadBalancerConfig:
    """Defaults, then the scenario's knobs, then the caller's (e.g. a strategy pair's)."""
    return LoadBalancerConfig(**{**dict(scenario.config), **dict(overrides or {})})


def event_schedule(scenario: Scenario, lease_cycles: int) -> dict[int, list[tuple[str, str]]]:
    """Cycle -> ``(action, broker)`` for the scenario's events; shared by the fast and live modes.

    A crash also schedules ``LEASES_EXPIRE`` ``lease_cycles`` later, which only the fast mode
    acts on (live, Redis' lease TTL does it).
    """
    out: dict[int, list[tuple[str, str]]] = {}
    for e in scenario.events:
        if e.kind == ADD_BROKERS:
            for b in e.brokers:
                out.setdefault(e.at_cycle, []).append((BROKER_UP, b.name))
        elif e.kind == REMOVE_BROKERS:
            for name in e.names:
                out.setdefault(e.at_cycle, []).append((BROKER_DOWN, name))
        elif e.kind == CRASH:
            for name in e.names:
                out.setdefault(e.at_cycle, []).append((BROKER_CRASH, name))
                out.setdefault(e.at_cycle + lease_cycles, []).append((LEASES_EXPIRE, name))
        elif e.kind == RESTART:
            for i, name in enumerate(e.names):
                at = e.at_cycle + i * e.every_cycles
                out.setdefault(at, []).append((BROKER_DOWN, name))
                out.setdefault(at + e.down_cycles, []).append((BROKER_UP, name))
    return out


class FastSim:
    """One scenario under one configuration; ``run()`` plays it and returns a ``SimRun``."""

    def __init__(
        self,
        scenario: Scenario,
        config: LoadBalancerConfig,
        *,
        seed: int = 0,
        keep_reports: bool = False,
        report_lag_cycles: int = 0,
    ) -> None:
        self.scenario = scenario
        self.report_lag_cycles = report_lag_cycles
        self._ownership_log: list[tuple[dict[str, NamespaceBundles], dict[str, str]]] = []
        self.config = config
        self.seed = seed
        self.rng = random.Random(seed)
        self.keep_reports = keep_reports
        self.tick_ms = scenario.tick_ms
        self.live: set[str] = set(scenario.initial_brokers)
        self.store = MemoryStore()
        self._setup_store(initial_owners(scenario, self.rng))
        self.load = LoadState()
        self.cycle_state = CycleState()
        self.view: ClusterView | None = None
        self.preallocated: Mapping[str, Mapping[str, Any]] = {}
        self.lookup_state: Any = None
        self.weights = weights_from_config(config)
        self._ingest = ingest_kwargs(config)
        self.lease_cycles = lease_cycles(config, self.tick_ms)
        self.oscillation_cycles = oscillation_cycles(self.tick_ms)
        self.schedule = event_schedule(scenario, self.lease_cycles)
        self._unloaded_from: dict[str, str] = {}
        self._moves = MoveHistory(self.oscillation_cycles)
        self.run_data = SimRun(scenario.name, seed, 0)
        self.run_data.event_cycles = sorted(self.schedule)
        policies = scenario.policies
        self._check_policies = not policies.empty or any(
            is_system_service_namespace(ns) for ns in scenario.namespaces
        )
        if policies.isolation:
            self.run_data.pools = isolation_pools(scenario.model.brokers, policies)

    # --- the ownership store -------------------------------------------------------------------

    def _setup_store(self, initial: Mapping[str, str]) -> None:
        """The scenario's namespaces (Pulsar's equal split), brokers and initial leases."""
        for ns, nb in sorted(self.scenario.namespaces.items()):
            self.store.create_namespace(ns, len(nb))
        for broker in sorted(self.live):
            self.store.register_broker(broker, 0, HELD_MS)
        for bundle, broker in sorted(initial.items()):
            self.store.acquire(bundle, broker, 0, HELD_MS)
        self._read_store(0)

    def _read_store(self, now_ms: int) -> None:
        """``namespaces`` and ``owners`` (bundle -> broker) as the store has them now."""
        namespaces: dict[str, NamespaceBundles] = {}
        owners: dict[str, str] = {}
        for ns in self.store.list_namespaces():
            nb = self.store.get_namespace(ns)
            if nb is not None:
                namespaces[ns] = nb
                owners.update(
                    (b, lease.broker) for b, lease in self.store.owners(ns, now_ms).items()
                )
        self.namespaces = namespaces
        self.owners = owners

    # --- events and lookups ------------------------------------------------------------------

    def _apply_events(self, cycle: int, now_ms: int) -> None:
        for action, name in self.schedule.get(cycle, ()):
            if action == BROKER_UP:
                self.live.add(name)
                self.store.register_broker(name, now_ms, HELD_MS)
                self.run_data.joined[name] = cycle
            elif action in (BROKER_DOWN, BROKER_CRASH):
                self.live.discard(name)
                self.store.register_broker(name, now_ms, 0)  # its registration lapses now
                self.load = forget_brokers(self.load, [name])
                self.preallocated = {b: m for b, m in self.preallocated.items() if b != name}
                if action == BROKER_DOWN:
                    self._free_bundles_of(name, now_ms)
            elif action == LEASES_EXPIRE and name not in self.live:
                self._free_bundles_of(name, now_ms)
        if cycle in self.schedule:
            self._read_store(now_ms)

    def _free_bundles_of(self, broker: str, now_ms: int) -> None:
        """End the broker's leases: released on a graceful leave, run out after a crash."""
        held = self.store.owned_by(broker, now_ms)
        for bundle, lease in held.items():
            self.store.release(bundle, broker, lease.token, now_ms)
        self.run_data.displaced.update(held)

    def _lookups(self, cycle: int, now_ms: int) -> None:
        if self.view is None or not self.view.brokers:
            return
        unowned = [
            b
            for ns in sorted(self.namespaces)
            for b, agg in self.scenario.model.bundle_base(self.namespaces[ns]).items()
            if b not in self.owners and agg.topics > 0
        ]
        if not unowned:
            return
        view = self.view
        if any(b not in self.live for b in view.brokers):
            gone = [b for b in view.brokers if b not in self.live]
            view = build_view(
                forget_brokers(self.load, gone),
                namespaces=self.namespaces,
                preallocated=self.preallocated,
                policies=self.scenario.policies,
            )
        else:
            view = with_preallocated(view, self.preallocated)
        selector = BrokerSelector(
            view,
            self.config,
            cycle_rng(f"{self.scenario.name}:lookup:{cycle}", self.seed),
            strategy_state=self.lookup_state,
        )
        for bundle in sorted(unowned):
            dest = selector.select(bundle)
            if dest is None:
                continue
            self.store.acquire(bundle, dest, now_ms, HELD_MS)
            self.owners[bundle] = dest
            source = self._unloaded_from.pop(bundle, None)
            if source is not None:
                self._record_move(cycle, bundle, source, dest, UNLOAD)
        self.lookup_state = selector.strategy_state
        self.preallocated = selector.preallocated

    def _drop_reported_preallocations(self, reports: Mapping[str, LocalBrokerData]) -> None:
        """Pulsar forgets a preallocation once a report shows the bundle loaded; without this a
        bundle moved on before the next lookup batch would be counted twice forever."""
        if not self.preallocated:
            return
        served = set().union(*(r.bundles for r in reports.values()))
        kept = {
            broker: {b: d for b, d in m.items() if b not in served}
            for broker, m in self.preallocated.items()
        }
        self.preallocated = {broker: m for broker, m in kept.items() if m}

    # --- decisions -----------------------------------------------------------------------------

    def _record_move(self, cycle: int, bundle: str, source: str, dest: str, kind: str) -> None:
        self.run_data.moves.append(self._moves.move(cycle, bundle, source, dest, kind))

    def apply(self, d: Decision, cycle: int) -> Outcome:
        """Apply one decision outside ``tick`` (``owners`` and ``namespaces`` follow at once)."""
        outcome = self._apply(d, cycle)
        self._read_store(cycle * self.tick_ms)
        return outcome

    def _apply(self, d: Decision, cycle: int) -> Outcome:
        """Apply one decision with the controller's applier and record what it changed."""
        now_ms = cycle * self.tick_ms
        before = self.store.owner(d.bundle, now_ms) if d.kind in (TRANSFER, UNLOAD) else None
        outcome = apply_decision(
            self.store, d, now_ms=now_ms, lease_ttl_ms=HELD_MS, **apply_knobs(self.config)
        )
        run = self.run_data
        run.outcomes[outcome.outcome] = run.outcomes.get(outcome.outcome, 0) + 1
        if outcome.outcome != APPLIED:
            return outcome
        if d.kind == TRANSFER and before is not None:
            dest = d.destination_broker or ""
            self._record_move(cycle, d.bundle, before.broker, dest, TRANSFER)
            self._preallocate_transfer(d)
        elif d.kind == UNLOAD and before is not None:
            self._unloaded_from[d.bundle] = before.broker
        elif d.kind == SPLIT:
            self.load = forget_bundles(self.load, [d.bundle])
            run.splits += 1
        elif d.kind == MERGE:
            self.load = forget_bundles(self.load, [d.bundle, d.merge_bundle or ""])
            run.merges += 1
        return outcome

    def _preallocate_transfer(self, d: Decision) -> None:
        """Count an applied transfer's bundle on its destination for the next lookups, as the
        controller records it (``loadbalance.transfer_preallocation``): until the destination
        reports it, the lookups' view would show that broker without it."""
        data = preallocation_of(d)
        dest = d.destination_broker
        if data is None or dest is None:
            return
        pre = dict(self.preallocated)
        pre[dest] = {**pre.get(dest, {}), d.bundle: data}
        self.preallocated = pre

    # --- the loop ------------------------------------------------------------------------------

    def tick(self, cycle: int) -> None:
        """Play one cycle of virtual time."""
        now_ms = cycle * self.tick_ms
        self._apply_events(cycle, now_ms)
        t0 = time.perf_counter()
        self._lookups(cycle, now_ms)
        lookup_ms = (time.perf_counter() - t0) * 1000.0
        namespaces, owners = self._reported_ownership()
        reports, _ = reports_at(
            self.scenario.model, namespaces, owners, sorted(self.live), now_ms, self.rng
        )
        self._drop_reported_preallocations(reports)
        t1 = time.perf_counter()
        self.load = ingest_many(
            self.load, [reports[n] for n in sorted(reports)], received_at_ms=now_ms, **self._ingest
        )
        self.view = build_view(
            self.load,
            namespaces=self.namespaces,
            recently_unloaded=self.cycle_state.recently_unloaded,
            preallocated=self.preallocated,
            policies=self.scenario.policies,
        )
        t2 = time.perf_counter()
        self.cycle_state, result = step(
            self.cycle_state,
            self.view,
            self.config,
            now_ms=now_ms,
            cycle=f"{self.scenario.name}:{cycle}",
            seed=self.seed,
        )
        t3 = time.perf_counter()
        run = self.run_data
        run.view_ms.append((t2 - t1) * 1000.0)
        run.policy_ms.append((t3 - t2) * 1000.0 + lookup_ms)
        run.usage.append({b: self.weights.weighted_max(r) for b, r in reports.items()})
        if self.keep_reports:
            run.reports.append(reports)
        for d in result.decisions:
            run.decisions.append(d)
            self._apply(d, cycle)
        if result.decisions:
            self._read_store(now_ms)
        if self._check_policies:
            self._record_violations(cycle)
        run.cycles = cycle + 1

    def _reported_ownership(self) -> tuple[dict[str, NamespaceBundles], dict[str, str]]:
        """The ownership the brokers report this cycle: the store's now, or with
        ``report_lag_cycles`` the store's that many cycles ago (reports that do not show the
        latest moves yet, as a live broker's may not for minutes: ``loadbalance.in_flight``)."""
        if not self.report_lag_cycles:
            return self.namespaces, self.owners
        self._ownership_log.append((dict(self.namespaces), dict(self.owners)))
        del self._ownership_log[: -(self.report_lag_cycles + 1)]
        return self._ownership_log[0]

    def _record_violations(self, cycle: int) -> None:
        """Judge the ownership at the cycle's end against the scenario's policies."""
        found = find_violations(
            self.owners,
            self.live,
            self.scenario.policies,
            domains_enabled=self.config.failure_domains_enabled,
        )
        run = self.run_data
        run.violations.append(len(found))
        room = MAX_VIOLATION_EXAMPLES - len(run.violation_examples)
        run.violation_examples.extend((cycle, v) for v in found[: max(room, 0)])

    def run(self, cycles: int | None = None) -> SimRun:
        for c in range(self.scenario.cycles if cycles is None else cycles):
            self.tick(c)
        return self.run_data


def simulate(
    scenario: Scenario,
    overrides: Mapping[str, Any] | None = None,
    *,
    seed: int = 0,
    cycles: int | None = None,
    keep_reports: bool = False,
    report_lag_cycles: int = 0,
) -> SimRun:
    """Run one scenario in fast mode under the defaults plus ``overrides``."""
    sim = FastSim(
        scenario, make_config(scenario, overrides), seed=seed, keep_reports=keep_reports,
        report_lag_cycles=report_lag_cycles,
    )  # fmt: skip
    return sim.run(cycles)
