"""What a live run did, recorded in the fast scoreboard's terms, so both are scored by one scorer.

The live scoreboard (``lbctl bench balance --live``) plays a scenario through the real pipeline:
``producers.live_sim`` publishes the reports and follows Redis, the Spark job decides and the
controller applies. This recorder turns what the live run saw into the ``SimRun`` that
``producers.scoreboard.score_run`` scores for the fast model, with the same meanings:

* **usage, reports**: the reports each cycle published (``LiveCycle``), the same figures the fast
  model computes from the same ownership;
* **moves**: from the controller's outcome stream, as fast mode records them from its applier: an
  applied transfer is a move in the cycle its decision was applied after; an applied unload
  becomes a move when a later lookup places the bundle (the lookup's cycle), onto wherever the
  lookup put it. Lookups of bundles no decision freed (split children, a crashed or departed
  broker's bundles) are not moves. Oscillation is judged by the same ``MoveHistory``;
* **splits, merges, outcomes**: applied splits and merges and every decision's outcome, from the
  same stream;
* **event cycles, joined, displaced**: the scenario's schedule (``event_schedule`` with the same
  lease cycles as fast mode, so "cycles to balance" counts from the same cycle), the cycle a
  broker joined, and the bundles a departing or crashing broker held when it went.

Pure: no I/O, no clock; the caller feeds it cycles and outcome entries in order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from loadbalance.config import LoadBalancerConfig
from loadbalance.decisions import MERGE, SPLIT, TRANSFER, UNLOAD
from loadbalance.values import OutcomeKind
from producers.fast_sim import (
    BROKER_CRASH,
    BROKER_DOWN,
    BROKER_UP,
    MoveHistory,
    SimRun,
    event_schedule,
    lease_cycles,
    oscillation_cycles,
)
from producers.live_sim import LiveCycle
from producers.scenarios import Scenario

APPLIED = OutcomeKind.APPLIED.value  # the controller's outcome for a decision it carried out

__all__ = ["LiveRunRecorder", "outcome_fields"]


def outcome_fields(raw: Mapping[Any, Any]) -> dict[str, str]:
    """An outcome-stream entry (bytes or str keys and values, as redis-py returns them) as
    ``str -> str``."""
    return {
        (k.decode() if isinstance(k, bytes) else str(k)): (
            v.decode() if isinstance(v, bytes) else str(v)
        )
        for k, v in raw.items()
    }


class LiveRunRecorder:
    """Accumulates one live run as a ``SimRun``; ``cycle()`` per cycle, ``applied()`` per
    batch of outcome entries."""

    def __init__(self, scenario: Scenario, config: LoadBalancerConfig, seed: int) -> None:
        schedule = event_schedule(scenario, lease_cycles(config, scenario.tick_ms))
        self.run = SimRun(scenario.name, seed, 0)
        self.run.event_cycles = sorted(schedule)
        self._moves = MoveHistory(oscillation_cycles(scenario.tick_ms))
        self._unloaded_from: dict[str, str] = {}
        self._owners: dict[str, str] = {}
        self.decisions = 0
        self.applied_at: list[tuple[int, str]] = []  # (cycle, kind) of each applied decision
        self.bundle_counts: list[int] = []  # bundles in Redis' namespaces, per cycle

    def cycle(self, lc: LiveCycle) -> None:
        """One published cycle: its events, the unloaded bundles its lookups placed, usage."""
        run = self.run
        for event in lc.events:
            action, _, broker = event.partition(":")
            if action == BROKER_UP:
                run.joined.setdefault(broker, lc.cycle)
            elif action in (BROKER_DOWN, BROKER_CRASH):
                run.displaced.update(b for b, o in self._owners.items() if o == broker)
        for bundle in lc.looked_up:
            source = self._unloaded_from.pop(bundle, None)
            dest = lc.owners.get(bundle)
            if source is not None and dest is not None:
                run.moves.append(self._moves.move(lc.cycle, bundle, source, dest, UNLOAD))
        run.usage.append(dict(lc.usage))
        self.bundle_counts.append(lc.bundles)
        run.reports.append(dict(lc.reports))
        run.cycles = lc.cycle + 1
        self._owners = dict(lc.owners)

    def applied(self, cycle: int, entries: Iterable[Mapping[Any, Any]]) -> None:
        """Outcome-stream entries seen after cycle ``cycle``'s reports, oldest first."""
        run = self.run
        for raw in entries:
            e = outcome_fields(raw)
            kind, outcome, bundle = e.get("kind", ""), e.get("outcome", ""), e.get("bundle", "")
            if not kind:  # an unreadable record's entry: not a decision
                continue
            self.decisions += 1
            run.outcomes[outcome] = run.outcomes.get(outcome, 0) + 1
            if outcome != APPLIED:
                continue
            self.applied_at.append((cycle, kind))
            source, dest = e.get("source", ""), e.get("destination", "")
            if kind == TRANSFER and source and dest:
                run.moves.append(self._moves.move(cycle, bundle, source, dest, TRANSFER))
            elif kind == UNLOAD and source:
                self._unloaded_from[bundle] = source
            elif kind == SPLIT:
                run.splits += 1
            elif kind == MERGE:
                run.merges += 1
