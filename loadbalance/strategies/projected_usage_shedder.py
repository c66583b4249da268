"""ProjectedUsageShedder (ours): shed and place on one measure, with the fewest moves.

The shedding half of our default pair. Pulsar's shedders each fix one failure and open another:
ThresholdShedder's 0.9 history keeps shedding after the cluster is balanced (PIP-217, complaint
#3) and never fills an empty broker while the others sit just under ``avg + 10 %`` (#13119,
PIP-220's ``[50,50,50,50,50,0]``); UniformLoadShedder balances message rates, not machines
(#22911); TransferShedder waits four cycles and moves at most three pairs per cycle. Every move
unloads a bundle (its producers and consumers disconnect and reconnect), so this shedder moves
as few bundles as it can:

* it reads each broker's **current** weighted max usage (no long history to lag behind a move),
  with the moves earlier cycles decided and the reports do not show yet projected in
  (``view.in_flight``, kept by the cycle: ``loadbalance.in_flight``), so a lagging report never
  makes it move the same load twice; and with the bundles lookups placed that the new owner has
  not reported yet (``view.preallocated``) added to it, so a round of reports read half before
  and half after a lookup burst does not look uneven (Pulsar's shedders read reports alone);
* **hysteresis**: it acts only when the busiest broker is above the balance band
  (``loadBalancerBalancedMaxOverMean`` x the mean, 1.10) or overloaded
  (``loadBalancerBrokerOverloadedThresholdPercentage``), and the spread is more than
  ``min_spread`` (noise guard); a cluster inside the band is left alone however uneven inside
  it, and an idle broker alone is no reason to move anything;
* it sheds from each broker above the band and aims it **inside** the band, at the band less
  ``band_margin`` (1.06 x mean), so report noise does not tip it straight back out; it stops
  shedding a broker once that is ``loadBalancerSheddingStopMargin`` inside the band (1.08 x
  mean): a second move off it for the last hundredths costs a whole move (its clients
  reconnect) that a point of report noise undoes; a broker inside the band that is not
  already shedding is left alone (moving it buys nothing the band does not); it stops when no
  broker is left to shed, or no move helps;
* each move is chosen by its effect on the **whole cluster** (``move_search``): the bundle and
  destination that settle the busiest broker in one move with the least traffic cut over, else
  that leave the least excess above the target (then the flattest cluster), projected with
  ``usage_projection`` (so a 4x broker is filled 4x as far) on the mean after the move, and
  never one that takes its destination above the band (a new broker to shed, its new bundle in
  its grace period: the source waits instead), unless it relieves an overloaded source without
  overloading the destination;
* **the mean at the end of the plan**: work moved onto a strong broker costs it less usage than
  it cost the source, so the cluster's mean usage falls as the plan goes, and a broker filled
  to the band (or shed to the target) on the starting mean is above it on the mean the plan
  ends at: it is shed again, and a plan can spend its whole budget shedding on what it filled
  (in a fleet of 2- to 32-core brokers, 16 moves where 12 balance). So a plan is made in up to
  ``PLAN_PASSES`` passes, each on copies of the plan's state: the first on the cluster's mean,
  each next one with the band and the target taken on the mean the pass before it ended at
  (``MoveSearch.mean_cap``). The pass kept is the one that leaves the pool inside the band with
  the fewest moves (else the one that leaves it lowest). Passes stop when the end mean stops
  falling, and after a pass of more than ``PASS_WORK`` moves x brokers (a move costs about
  O(brokers) to choose; a million-bundle cycle stays under its second). A broker that a relief
  move (below) took past the band is not shed on in the same plan: the relief put it there
  knowingly, and moving its bundles on would move the same load twice;
* leaves a broker alone whose excess is a bundle being split (or merged) in this cycle: the cycle
  hands those bundles to the shedder as moved "now" (``recently_unloaded`` at ``now_ms``), their
  load leaves with the split, and shedding the broker's other bundles on top would move load
  that is not in excess;
* emits TRANSFER decisions with the destination it planned (UNLOAD when
  ``loadBalancerTransferEnabled`` is off), so placement agrees with shedding by construction;
* never sends a bundle back to the broker it moved it away from (the signature of ping-pong).

It never moves a bundle in the grace period (``view.recently_unloaded``) or in flight, and caps
moves per cycle at ``maxUnloadBundleNumPerShedding`` when that is positive, else at twice the
number of brokers (at least 10).

**A broker's last bundle.** Pulsar's shedders never unload a broker's only bundle (ThresholdShedder
and OverloadShedder skip a broker with one bundle; UniformLoadShedder and TransferShedder need a
bundle left behind), on the reasoning that moving it only moves the hot spot. That holds between
equal brokers, not between a 1 Gbps broker and a 25 Gbps one: a heavy bundle placed on a weak
broker pins it far above the others for good. Here a broker whose **only** bundle makes it
overloaded or far above the mean (``lone_ratio`` x mean) gives that bundle up when some other
broker would host it at a projected load at least ``lone_margin`` below the source's current load
(to the broker with the lowest such projection, not necessarily the idlest: the idlest may be
another weak one). A broker above the band whose only bundle is under that bar also gives it up
when the cluster ends inside the band for it: moved alone, or with one bundle of its new
broker's sent on (usually back to the emptied broker: a swap), since emptying a weak broker
lowers the mean and leaves the brokers near it above the band, where one bundle back raises it
again for one move, not one per broker (``MoveSearch.lone_moves``; on the fast model's
``mixed_fleet``, seed 0, a 4-core broker sat at 1.18-1.27 x mean for 28 cycles without it).
Moving a lone bundle between equal brokers never clears the margin nor brings the cluster inside
the band, so a lone bundle between equal brokers stays; the grace period and the never-back rule
keep it from coming back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar

from loadbalance.decisions import TRANSFER, UNLOAD, Decision, PolicyResult, Skip, make_decision
from loadbalance.strategies.least_projected_usage import LoadIndex
from loadbalance.strategies.move_search import MoveSearch, Spread
from loadbalance.strategies.policy_moves import PolicyMoves, restricts_moves
from loadbalance.strategies.shed_candidates import Candidate, Candidates, movable
from loadbalance.strategies.usage_projection import BundleLoad, UsageModel, Weights
from loadbalance.time_average import BundleData
from loadbalance.transfer_preallocation import preallocation_inputs
from loadbalance.values import DecisionReason, SkipReason
from loadbalance.view import ClusterView

if TYPE_CHECKING:
    from loadbalance.config import LoadBalancerConfig


@dataclass(frozen=True, slots=True)
class ProjectedShedderState:
    """Where each bundle we moved came from (moves in flight are the cycle's: ``in_flight``)."""

    came_from: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


class ProjectedUsageShedder:
    """Even brokers out on projected usage with few moves; see the module docstring."""

    name: ClassVar[str] = "ProjectedUsageShedder"
    state_type: ClassVar[type] = ProjectedShedderState

    def __init__(
        self,
        *,
        band_margin: float = 0.04,
        min_spread: float = 0.03,
        min_gain: float = 1e-6,
        lone_ratio: float = 1.25,
        lone_margin: float = 0.10,
        destinations: int = 8,
    ) -> None:
        self.band_margin = band_margin
        self.min_spread = min_spread
        self.min_gain = min_gain
        self.lone_ratio = lone_ratio
        self.lone_margin = lone_margin
        self.destinations = destinations

    def initial_state(self) -> ProjectedShedderState:
        return ProjectedShedderState()

    def find_bundles_for_unloading(
        self,
        view: ClusterView,
        config: LoadBalancerConfig,
        state: ProjectedShedderState,
        *,
        now_ms: int,
        cycle: str,
    ) -> tuple[ProjectedShedderState, PolicyResult]:
        if len(view.brokers) < 2:
            return state, PolicyResult((), (Skip(self.name, SkipReason.NO_BROKERS),))
        model = UsageModel(view, Weights.of(config))
        if view.preallocated:
            model.project_preallocated(view, LoadIndex(view).estimate)
        came_from = {b: src for b, src in state.came_from.items() if b in view.bundle_data}
        loads = {b: model.load(b) for b in model.brokers}
        moves = PolicyMoves(view, config) if restricts_moves(view, config) else None
        pools = moves.pools(loads) if moves is not None else [sorted(loads)]
        cap = config.max_unload_bundle_num_per_shedding
        budget = cap if cap > 0 else max(10, 2 * len(loads))
        out: list[Decision] = []
        quiet: list[str] = []
        held: list[Skip] = []
        for pool in pools:
            pool_loads = {b: loads[b] for b in pool}
            if len(pool) < 2 or len(out) >= budget:
                continue
            if not self._triggered(pool_loads, config):
                quiet.append(self._balanced_detail(pool_loads))
                continue
            planned, left = self._plan(
                view, config, model, pool_loads, came_from,
                now_ms=now_ms, cycle=cycle, moves=moves, budget=budget - len(out),
            )  # fmt: skip
            out += planned
            held += left
        new_state = ProjectedShedderState(MappingProxyType(came_from))
        skips: tuple[Skip, ...] = tuple(held)
        if not out and not held:
            skips = (Skip(self.name, SkipReason.BALANCED, detail="; ".join(quiet)),)
        return new_state, PolicyResult(tuple(out), skips)

    def _triggered(self, loads: Mapping[str, float], config: LoadBalancerConfig) -> bool:
        """Act only above the band or on an overloaded broker, and not on noise: a cluster
        inside the band is never moved for being short of the target inside it."""
        hi, lo = max(loads.values()), min(loads.values())
        mean = sum(loads.values()) / len(loads)
        overloaded = config.overloaded_threshold
        above = hi > mean * config.load_balancer_balanced_max_over_mean or hi > overloaded
        return above and hi - lo >= self.min_spread

    @staticmethod
    def _balanced_detail(loads: Mapping[str, float]) -> str:
        mean = sum(loads.values()) / len(loads)
        return f"max {max(loads.values()):.3f} min {min(loads.values()):.3f} mean {mean:.3f}"

    def target_ratio(self, config: LoadBalancerConfig) -> float:
        """Where shedding stops: the balance band less the margin (never below 1)."""
        return max(1.0, config.load_balancer_balanced_max_over_mean - self.band_margin)

    def _plan(
        self,
        view: ClusterView,
        config: LoadBalancerConfig,
        model: UsageModel,
        loads: dict[str, float],
        came_from: dict[str, str],
        *,
        now_ms: int,
        cycle: str,
        moves: PolicyMoves | None,
        budget: int,
    ) -> tuple[list[Decision], list[Skip]]:
        """The plan for one pool, in up to ``PLAN_PASSES`` trial passes (see the module
        docstring's "the mean at the end of the plan"); the best pass is kept: ``model``,
        ``loads``, ``came_from`` and ``moves`` follow its moves. Also a skip for each broker
        the plan leaves above the band (``_left_above``)."""
        band = config.load_balancer_balanced_max_over_mean
        start_mean = sum(loads.values()) / len(loads)
        high = start_mean * self.target_ratio(config)
        waiting = frozenset(
            _splitting_excess(view, model, high, now_ms) | _placed_excess(model, high)
        )
        sources: dict[str, Candidates] = {}
        best: _Trial | None = None
        cap: float | None = None
        for _ in range(PLAN_PASSES):
            trial = _Trial(
                model.fork(), dict(loads), dict(came_from), None if moves is None else moves.fork()
            )
            self._plan_pass(
                view, config, trial, sources, mean_cap=cap, now_ms=now_ms, cycle=cycle,
                budget=budget, band_mean=start_mean, waiting=waiting,
            )  # fmt: skip
            if best is None or trial.score(band) < best.score(band):
                best = trial
            end_mean = trial.mean()
            if (
                not trial.decisions
                or end_mean >= (start_mean if cap is None else cap) * _FALLING
                or len(trial.decisions) * len(loads) > PASS_WORK
            ):
                break
            cap = end_mean
        assert best is not None
        model.brokers = best.model.brokers
        loads.update(best.loads)
        came_from.update(best.came_from)
        if moves is not None:
            for bundle, s, d in best.picks:
                moves.moved(bundle, s, d)
        return best.decisions, self._left_above(view, best, band, waiting)

    def _left_above(
        self, view: ClusterView, trial: _Trial, band: float, waiting: frozenset[str]
    ) -> list[Skip]:
        """Why each broker a plan leaves above the band stays there, for the operator: a
        cluster left at 1.2 x mean must not read as ``Balanced``. A broker this plan moved
        bundles onto past the band (a relief) is there knowingly and not listed."""
        mean = trial.mean()
        placed = {d for _b, _s, d in trial.picks}
        out: list[Skip] = []
        for b, load in sorted(trial.loads.items()):
            if mean <= 0 or load <= mean * band or b in placed:
                continue
            ratio = f"{load / mean:.2f} x mean: "
            bundles = view.brokers[b].report.bundles
            if b in waiting:
                reason, bundle, why = SkipReason.OUT_DATED_DATA, None, _WAITS
            elif all(x in view.recently_unloaded or x in view.in_flight for x in bundles):
                reason, bundle, why = SkipReason.COOL_DOWN, None, _COOLING
            elif len(bundles) == 1:
                reason, bundle, why = SkipReason.HIGH_USAGE_SINGLE_BUNDLE, min(bundles), _LONE
            else:
                reason, bundle, why = SkipReason.NO_MOVE_HELPS, None, _NO_MOVE
            out.append(Skip(self.name, reason, b, bundle, ratio + why))
        return out

    def _plan_pass(
        self,
        view: ClusterView,
        config: LoadBalancerConfig,
        trial: _Trial,
        sources: dict[str, Candidates],
        *,
        mean_cap: float | None,
        now_ms: int,
        cycle: str,
        budget: int,
        band_mean: float,
        waiting: frozenset[str],
    ) -> None:
        """Moves off the busiest broker above the target, one at a time on the projected loads,
        until no broker is above it, no move helps, or ``budget`` moves are planned; the
        trial's loads, ``came_from`` and policy moves follow each move, so the next is chosen
        on the plan so far. The band and the target are taken on the lower of the cluster's
        mean and ``mean_cap``; ``sources`` caches each source's movable bundles across passes;
        ``waiting`` brokers are never sources (their excess is leaving with a split or is
        placed bundles not reported yet)."""
        model, loads, came_from = trial.model, trial.loads, trial.came_from
        spread = Spread(loads)
        ratio = self.target_ratio(config)
        band = config.load_balancer_balanced_max_over_mean
        search = MoveSearch(
            model, spread, ratio, destinations=self.destinations, min_gain=self.min_gain,
            came_from=came_from, moves=trial.moves, band_ratio=band,
            overloaded=config.overloaded_threshold, mean_cap=mean_cap,
        )  # fmt: skip
        stop = max(ratio, band - config.load_balancer_shedding_stop_margin)
        counts = {b: len(view.brokers[b].report.bundles) for b in loads}
        stuck = set(waiting)
        acting: set[str] = set()
        out = trial.decisions

        def cands_of(b: str) -> Candidates:
            return _cands(view, trial, sources, b)

        while len(out) < budget:
            s = _next_source(loads, search.judged(spread.mean), (band, stop), acting, stuck)
            if s is None:
                break
            acting.add(s)
            found = self._choose(search, s, cands_of, counts[s], config, budget - len(out))
            if found is None:
                stuck.add(s)
                continue
            for pick, src, d in found:
                self._apply(view, config, trial, spread, counts, pick, src, d, band_mean=band_mean,
                            cycle=cycle, now_ms=now_ms)  # fmt: skip
                if loads[d] > search.judged(spread.mean) * band:
                    stuck.add(d)  # a relief took it past the band knowingly: not shed on at once

    def _apply(
        self,
        view: ClusterView,
        config: LoadBalancerConfig,
        trial: _Trial,
        spread: Spread,
        counts: dict[str, int],
        pick: Candidate,
        s: str,
        d: str,
        *,
        band_mean: float,
        cycle: str,
        now_ms: int,
    ) -> None:
        """Move ``pick`` from ``s`` to ``d`` in the trial: its model, loads, candidates, bundle
        counts, ``came_from`` and policy moves follow, and the decision is added."""
        model, loads = trial.model, trial.loads
        before = (loads[s], loads[d])
        model.remove(s, pick.load)
        model.add(d, pick.load)
        loads[s], loads[d] = model.load(s), model.load(d)
        spread.refresh()
        counts[s] -= 1
        counts[d] += 1
        trial.cands[s].remove(pick)
        trial.decisions.append(
            self._move_decision(
                pick, s, d, before, (loads[s], loads[d]), band_mean, config=config,
                cycle=cycle, now_ms=now_ms, data=view.bundle_data.get(pick.bundle),
            )
        )  # fmt: skip
        trial.picks.append((pick.bundle, s, d))
        trial.came_from[pick.bundle] = s
        if trial.moves is not None:
            trial.moves.moved(pick.bundle, s, d)

    def _choose(
        self,
        search: MoveSearch,
        s: str,
        cands_of: Callable[[str], Candidates],
        count: int,
        config: LoadBalancerConfig,
        room: int,
    ) -> list[tuple[Candidate, str, str]] | None:
        """The moves off ``s`` (bundle, source, destination), at most ``room``: the best one of
        the search while ``s`` has other bundles; its only bundle when that is hot and a broker
        would host it well below, or the cluster ends inside the band (``MoveSearch.lone_moves``,
        with a second move off its destination), else none."""
        cands = cands_of(s)
        if count > 1:
            found = search.best(s, cands)
            return None if found is None else [(found[0], s, found[1])]
        if count != 1 or len(cands) != 1:
            return None  # idle, or its only bundle is in its grace period or in flight
        load, mean = search.spread.loads[s], search.spread.mean
        if load > config.overloaded_threshold or load > mean * self.lone_ratio:
            d = search.lone(s, cands[0], self.lone_margin)
            if d is not None:
                return [(cands[0], s, d)]
        if load <= search.judged(mean) * config.load_balancer_balanced_max_over_mean:
            return None
        moves = search.lone_moves(s, cands[0], cands_of)
        return None if moves is None or len(moves) > room else moves

    def _move_decision(
        self,
        pick: Candidate,
        s: str,
        d: str,
        loads_before: tuple[float, float],
        loads_after: tuple[float, float],
        mean: float,
        *,
        config: LoadBalancerConfig,
        cycle: str,
        now_ms: int,
        data: BundleData | None = None,
    ) -> Decision:
        """The decision for moving ``pick`` from ``s`` to ``d``, with the pair's loads before and
        projected after the move ((source, destination)) as its inputs; ``Overloaded`` when the
        source was above the band, else ``Underloaded`` (the move fills an idle broker). A
        transfer also carries the bundle's averages ``data``, which the controller records as a
        preallocation of ``d`` (``loadbalance.transfer_preallocation``)."""
        transfer = config.load_balancer_transfer_enabled
        before_s, before_d = loads_before
        after_s, after_d = loads_after
        reason = (
            DecisionReason.OVERLOADED
            if before_s > mean * config.load_balancer_balanced_max_over_mean
            else DecisionReason.UNDERLOADED
        )
        inputs = {
            "sourceLoad": round(before_s, 4),
            "destinationLoad": round(before_d, 4),
            "meanLoad": round(mean, 4),
            "projectedSourceLoad": round(after_s, 4),
            "projectedDestinationLoad": round(after_d, 4),
            "bundleMsgRate": round(pick.load.msg_rate_per_s, 3),
        }
        if transfer and data is not None:
            inputs.update(preallocation_inputs(data))
        return make_decision(
            cycle=cycle,
            kind=TRANSFER if transfer else UNLOAD,
            bundle=pick.bundle,
            source_broker=s,
            destination_broker=d if transfer else None,
            reason=reason,
            strategy=self.name,
            inputs=inputs,
            decided_at_ms=now_ms,
        )


PLAN_PASSES = 3
"""Trial passes of one pool's plan at most: the first on the cluster's mean, each next one with
the band and the target taken on the mean the pass before it ended at."""

PASS_WORK = 50_000
"""No further pass after one of more than this many moves x brokers: a move costs about
O(brokers) to choose, so a plan of hundreds of moves over hundreds of brokers (a million
bundles) is planned once and stays inside the cycle's time (``benchmarks/bench_cycle.py``)."""

_FALLING = 1.0 - 1e-3
"""A pass whose end mean is not below the mean it was planned on by this factor ends the
passes: planning again on the same mean would plan the same moves."""


_WAITS = (
    "its excess is a split leaving or bundles placed on it that it has not reported yet; "
    "it waits for that report"
)
_LONE = (
    "its only bundle; no broker would host it far enough below to be worth the move, nor would "
    "moving it (with one bundle sent on from its new broker) leave the cluster inside the band"
)
_COOLING = (
    "every bundle on it is in its grace period (loadBalancerSheddingGracePeriodMinutes) or in "
    "flight"
)
_NO_MOVE = "each move off it would take its destination above the band"


@dataclass(slots=True)
class _Trial:
    """One pass of a plan, over copies of the plan's state."""

    model: UsageModel
    loads: dict[str, float]
    came_from: dict[str, str]
    moves: PolicyMoves | None
    cands: dict[str, Candidates] = field(default_factory=dict)
    decisions: list[Decision] = field(default_factory=list)
    picks: list[tuple[str, str, str]] = field(default_factory=list)  # (bundle, source, dest)

    def mean(self) -> float:
        return sum(self.loads.values()) / len(self.loads)

    def score(self, band: float) -> tuple[bool, float, float]:
        """Lower is better: a plan that leaves the pool inside the band, with the fewer moves
        (then the lower max/mean at its end); else the lower max/mean, then fewer moves."""
        mean = self.mean()
        worst = max(self.loads.values()) / mean if mean > 0 else 0.0
        if worst > band:
            return (True, worst, len(self.decisions))
        return (False, len(self.decisions), worst)


def _cands(view: ClusterView, trial: _Trial, sources: dict[str, Candidates], b: str) -> Candidates:
    """``b``'s movable bundles in this trial: a copy of the plan's cached ranking, made once."""
    if b not in trial.cands:
        if b not in sources:
            sources[b] = movable(view, b, view.in_flight)
        trial.cands[b] = sources[b].copy()
    return trial.cands[b]


def _next_source(
    loads: Mapping[str, float],
    mean: float,
    ratios: tuple[float, float],
    acting: set[str],
    stuck: set[str],
) -> str | None:
    """The busiest broker, by (load, name), that is above the band (``ratios[0]`` x ``mean``),
    or one the plan already sheds from that is still above the target (``ratios[1]``): a broker
    inside the band is never a source for being short of the target, but one the plan acts on
    is taken inside it. ``None`` if none is left (stuck brokers are skipped)."""
    band, target = ratios
    top = max(
        (
            (v, b)
            for b, v in loads.items()
            if b not in stuck and (v > mean * band or (b in acting and v > mean * target))
        ),
        default=None,
    )
    return None if top is None else top[1]


def _placed_excess(model: UsageModel, high: float) -> set[str]:
    """Brokers that would be inside the band without the bundles lookups placed on them that
    they have not reported yet (``UsageModel.placed``).

    Why wait for their report: such a bundle counts at an estimate (its share of its closest
    ancestor, or its last data), and a split's child is often placed hot and split again at its
    first report; shedding the broker's other bundles around it moves load for an estimate that
    the next report corrects. Where reports follow ownership within the cycle (the fast model)
    nothing placed is unreported; where they lag a cycle (a paced live run), this kept our pair
    from moving 21 bundles around two hot children on ``hot_bundle``."""
    return _excess_only(model, model.placed, high)


def _splitting_excess(view: ClusterView, model: UsageModel, high: float, now_ms: int) -> set[str]:
    """Brokers that would be inside the band without the bundles being split in this cycle.

    The cycle passes the bundles it splits or merges now as moved at ``now_ms``; nothing else
    carries that time, since this cycle's own moves are recorded after shedding. Their load
    leaves with the split (its children are placed afresh), so shedding the broker's other
    bundles would move load that is not in excess."""
    leaving: dict[str, list[BundleLoad]] = {}
    for bundle, t in view.recently_unloaded.items():
        if t < now_ms:
            continue
        for name, b in view.brokers.items():
            st = b.report.last_stats.get(bundle)
            if st is not None:
                leaving.setdefault(name, []).append(BundleLoad.of_stats(st))
                break
    return _excess_only(model, leaving, high)


def _excess_only(
    model: UsageModel, leaving: Mapping[str, list[BundleLoad]], high: float
) -> set[str]:
    """The brokers above ``high`` that would be at or under it without their ``leaving`` loads."""
    out: set[str] = set()
    for name, loads in sorted(leaving.items()):
        if model.load(name) <= high:
            continue
        gone = BundleLoad(
            sum(b.msg_rate_per_s for b in loads),
            sum(b.throughput_in_bytes_per_s for b in loads),
            sum(b.throughput_out_bytes_per_s for b in loads),
        )
        if model.load_if_removed(name, gone) <= high:
            out.add(name)
    return out
