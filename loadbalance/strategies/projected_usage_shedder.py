"""ProjectedUsageShedder (ours): shed and place on one measure, planning each move's effect.

The shedding half of our default pair. Pulsar's shedders each fix one failure and open another:
ThresholdShedder's 0.9 history keeps shedding after the cluster is balanced (PIP-217, complaint
#3) and never fills an empty broker while the others sit just under ``avg + 10 %`` (#13119,
PIP-220's ``[50,50,50,50,50,0]``); UniformLoadShedder balances message rates, not machines
(#22911); TransferShedder waits four cycles and moves at most three pairs per cycle. This shedder:

* reads each broker's **current** weighted max usage (no long history to lag behind a move);
* triggers when the busiest broker is above ``trigger_ratio`` x the mean, or the idlest below
  ``underload_ratio`` x the mean, and the spread is more than ``min_spread`` (noise guard);
* then plans moves one at a time from the currently busiest broker to the currently idlest one,
  choosing the bundle that best evens the pair **after** the move, projected with
  ``usage_projection`` (so a 4x broker is filled 4x as far, and the plan never overshoots: a move
  is accepted only if the pair's higher projected load drops);
* stops as soon as the busiest broker is at most ``loadBalancerBalancedMaxOverMean`` (the
  balance band, 1.10) less ``band_margin`` times the mean (a small margin, so report noise does
  not tip it straight back out of the band) and the idlest is at least ``floor_ratio`` times the
  mean, or when no move helps. It aims at the band, not at a perfectly even spread: every move
  disconnects the moved bundle's clients, and moves past the band buy nothing the band does not;
* prefers the move that settles the pair: when some bundle brings both brokers of the pair
  inside ``[floor, target]`` in one move, it takes the one with the fewest bytes (the least
  traffic cut over), else the one that evens the pair best, as above;
* leaves a broker alone whose excess is a bundle being split (or merged) in this cycle: the cycle
  hands those bundles to the shedder as moved "now" (``recently_unloaded`` at ``now_ms``), their
  load leaves with the split, and shedding the broker's other bundles on top would move load
  that is not in excess;
* emits TRANSFER decisions with the destination it planned (UNLOAD when
  ``loadBalancerTransferEnabled`` is off), so placement agrees with shedding by construction;
* never sends a bundle back to the broker it moved it away from (the signature of ping-pong);
* remembers its moves until the destination reports the bundle (at most
  ``loadBalanceSheddingDelayInSeconds``) and counts them in the projection meanwhile, so a slow
  report never makes it move the same load twice.

It never moves a bundle in the grace period (``view.recently_unloaded``) and caps moves per
cycle at ``maxUnloadBundleNumPerShedding`` when that is positive, else at twice the number of
brokers (at least 10).

**A broker's last bundle.** Pulsar's shedders never unload a broker's only bundle (ThresholdShedder
and OverloadShedder skip a broker with one bundle; UniformLoadShedder and TransferShedder need a
bundle left behind), on the reasoning that moving it only moves the hot spot. That holds between
equal brokers, not between a 1 Gbps broker and a 25 Gbps one: a heavy bundle placed on a weak
broker pins it far above the others for good. Here a broker whose **only** bundle makes it
overloaded (above ``loadBalancerBrokerOverloadedThresholdPercentage``) or far above the mean
(``lone_ratio`` x mean) gives that bundle up when some other broker would host it at a projected
load at least ``lone_margin`` below the source's current load (to the broker with the lowest such
projection, not necessarily the idlest: the idlest may be another weak one). Moving a lone bundle
between equal brokers never clears the margin, so a lone bundle between equal brokers stays; the
grace period and the never-back rule above stop it from returning.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar, NamedTuple

import numpy as np

from loadbalance.bundles import is_system_service_bundle
from loadbalance.decisions import TRANSFER, UNLOAD, Decision, PolicyResult, Skip, make_decision
from loadbalance.model import NamespaceBundleStats
from loadbalance.ranking import order_by_value_then_name
from loadbalance.strategies.policy_moves import PolicyMoves, restricts_moves
from loadbalance.strategies.usage_projection import KBYTES, BundleLoad, UsageModel, Weights
from loadbalance.values import DecisionReason, SkipReason
from loadbalance.view import ClusterView

if TYPE_CHECKING:
    from loadbalance.config import LoadBalancerConfig

_WINDOW = 16


@dataclass(frozen=True, slots=True)
class PendingMove:
    """A move this shedder decided that the destination's report does not show yet."""

    source: str
    destination: str
    at_ms: int
    load: BundleLoad


@dataclass(frozen=True, slots=True)
class ProjectedShedderState:
    """Moves not yet visible in the reports, and where each bundle we moved came from."""

    pending: Mapping[str, PendingMove] = field(default_factory=lambda: MappingProxyType({}))
    came_from: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


class _Candidate(NamedTuple):
    """A bundle that may move. A tuple, so a broker's candidates sort natively, by work then
    name (names are unique within a broker, so ``stats`` is never compared)."""

    work: float
    bundle: str
    stats: NamespaceBundleStats

    @property
    def load(self) -> BundleLoad:
        return BundleLoad.of_stats(self.stats)


class _Candidates:
    """A broker's movable bundles sorted by (work, name), each bundle's stats fetched when a
    candidate is first looked at.

    Why not a list of candidates: the plan ranks every bundle of each broker it sheds from
    (thousands at a million bundles) but looks at a window of a few dozen per move, so the
    ranking needs only the work and the name, and the stats come from ``stats_of`` on demand
    (a view over columns makes them one by one instead of a whole broker's)."""

    __slots__ = ("_keys", "_stats_of")

    def __init__(
        self, keys: list[tuple[float, str]], stats_of: Callable[[str], NamespaceBundleStats]
    ) -> None:
        self._keys, self._stats_of = keys, stats_of  # keys sorted, names unique

    def __len__(self) -> int:
        return len(self._keys)

    def __getitem__(self, i: int) -> _Candidate:
        work, bundle = self._keys[i]
        return _Candidate(work, bundle, self._stats_of(bundle))

    def __iter__(self) -> Iterator[_Candidate]:
        stats_of = self._stats_of
        return (_Candidate(w, b, stats_of(b)) for w, b in self._keys)

    def window(self, start: int, stop: int) -> list[_Candidate]:
        """The candidates at positions ``start`` to ``stop`` (clipped, as a slice is)."""
        stats_of = self._stats_of
        return [_Candidate(w, b, stats_of(b)) for w, b in self._keys[start:stop]]

    def first_at_least(self, work: float) -> int:
        """``bisect_left`` of ``work`` over the candidates' work."""
        return bisect.bisect_left(self._keys, (work,))

    def remove(self, pick: _Candidate) -> None:
        """Remove ``pick``, found by bisection (names are unique, so the key is its own)."""
        del self._keys[bisect.bisect_left(self._keys, (pick.work, pick.bundle))]


class ProjectedUsageShedder:
    """Even brokers out on projected usage; see the module docstring."""

    name: ClassVar[str] = "ProjectedUsageShedder"
    state_type: ClassVar[type] = ProjectedShedderState

    def __init__(
        self,
        *,
        trigger_ratio: float = 1.08,
        underload_ratio: float = 0.85,
        band_margin: float = 0.04,
        floor_ratio: float = 0.90,
        min_spread: float = 0.03,
        min_gain: float = 1e-6,
        lone_ratio: float = 1.25,
        lone_margin: float = 0.10,
    ) -> None:
        self.trigger_ratio = trigger_ratio
        self.underload_ratio = underload_ratio
        self.band_margin = band_margin
        self.floor_ratio = floor_ratio
        self.min_spread = min_spread
        self.min_gain = min_gain
        self.lone_ratio = lone_ratio
        self.lone_margin = lone_margin

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
        delay_ms = int(config.load_balance_shedding_delay_in_seconds * 1000)
        pending = _replay_pending(state, view, model, now_ms, delay_ms)
        came_from = {b: src for b, src in state.came_from.items() if b in view.bundle_data}
        loads = {b: model.load(b) for b in model.brokers}
        if restricts_moves(view, config):
            moves = PolicyMoves(view, config)
            decisions = self._plan_pools(
                view, config, model, loads, pending, came_from, moves, now_ms=now_ms, cycle=cycle
            )
            new_state = ProjectedShedderState(
                MappingProxyType(pending), MappingProxyType(came_from)
            )
            skips = () if decisions else (Skip(self.name, SkipReason.BALANCED, detail="pools"),)
            return new_state, PolicyResult(tuple(decisions), skips)
        mean = sum(loads.values()) / len(loads)
        hi, lo = max(loads.values()), min(loads.values())
        if self._quiet(hi, lo, mean):
            detail = f"max {hi:.3f} min {lo:.3f} mean {mean:.3f}"
            new_state = ProjectedShedderState(
                MappingProxyType(pending), MappingProxyType(came_from)
            )
            return new_state, PolicyResult(
                (), (Skip(self.name, SkipReason.BALANCED, detail=detail),)
            )
        decisions = self._plan(
            view, config, model, loads, mean, pending, came_from, now_ms=now_ms, cycle=cycle
        )
        new_state = ProjectedShedderState(MappingProxyType(pending), MappingProxyType(came_from))
        return new_state, PolicyResult(tuple(decisions))

    def _quiet(self, hi: float, lo: float, mean: float) -> bool:
        """No shedding: the spread is noise, or nobody is above the trigger or below the floor."""
        return hi - lo < self.min_spread or (
            hi <= mean * self.trigger_ratio and lo >= mean * self.underload_ratio
        )

    def _plan_pools(
        self,
        view: ClusterView,
        config: LoadBalancerConfig,
        model: UsageModel,
        loads: dict[str, float],
        pending: dict[str, PendingMove],
        came_from: dict[str, str],
        moves: PolicyMoves,
        *,
        now_ms: int,
        cycle: str,
    ) -> list[Decision]:
        """The plan under placement policies: each isolation pool balanced against its own
        mean (load cannot cross pools), every move one the bundle's policies allow given the
        plan's earlier moves (``policy_moves``); one budget for the whole cycle."""
        cap = config.max_unload_bundle_num_per_shedding
        budget = cap if cap > 0 else max(10, 2 * len(loads))
        out: list[Decision] = []
        for pool in moves.pools(loads):
            pool_loads = {b: loads[b] for b in pool}
            mean = sum(pool_loads.values()) / len(pool_loads)
            hi, lo = max(pool_loads.values()), min(pool_loads.values())
            if len(pool) < 2 or len(out) >= budget or self._quiet(hi, lo, mean):
                continue
            out += self._plan(
                view, config, model, pool_loads, mean, pending, came_from,
                now_ms=now_ms, cycle=cycle, moves=moves, budget=budget - len(out),
            )  # fmt: skip
        return out

    def _plan(
        self,
        view: ClusterView,
        config: LoadBalancerConfig,
        model: UsageModel,
        loads: dict[str, float],
        mean: float,
        pending: dict[str, PendingMove],
        came_from: dict[str, str],
        *,
        now_ms: int,
        cycle: str,
        moves: PolicyMoves | None = None,
        budget: int | None = None,
    ) -> list[Decision]:
        """Moves from the busiest broker to the idlest, one at a time on the projected loads,
        until the busiest is under the target and the idlest over the floor, no move helps, or
        ``budget`` moves are planned; ``loads``, ``pending`` and ``came_from`` (and ``moves``)
        are updated with each move, so the next one is chosen on the plan so far."""
        movable: dict[str, _Candidates] = {}
        counts = {b: len(v.report.bundles) for b, v in view.brokers.items()}
        if budget is None:
            cap = config.max_unload_bundle_num_per_shedding
            budget = cap if cap > 0 else max(10, 2 * len(loads))
        transfer = config.load_balancer_transfer_enabled
        high = mean * self.target_ratio(config)
        low = mean * self.floor_ratio
        stuck = _splitting_excess(view, model, high, now_ms)
        out: list[Decision] = []
        while len(out) < budget:
            pair = _busiest_and_idlest(loads, stuck)
            if pair is None:
                break
            s, d = pair
            if s == d or (loads[s] <= high and loads[d] >= low):
                break
            if s not in movable:
                movable[s] = _movable(view, s, pending)
            pick = None
            if counts[s] > 1:
                pick = self._pick_finishing(
                    model, s, d, movable[s], loads, came_from, high, low, moves
                )
                if pick is None:
                    pick = self._pick(model, s, d, movable[s], loads, came_from, moves)
            elif counts[s] == 1 and self._lone_hot(loads[s], mean, config):
                pick, d = self._pick_lone(model, s, movable[s], loads, came_from, moves)
            if pick is None:
                stuck.add(s)
                continue
            before_s, before_d = loads[s], loads[d]
            model.remove(s, pick.load)
            model.add(d, pick.load)
            loads[s], loads[d] = model.load(s), model.load(d)
            counts[s] -= 1
            counts[d] += 1
            movable[s].remove(pick)
            out.append(
                self._move_decision(
                    pick,
                    s,
                    d,
                    (before_s, before_d),
                    (loads[s], loads[d]),
                    mean,
                    transfer=transfer,
                    cycle=cycle,
                    now_ms=now_ms,
                )
            )
            came_from[pick.bundle] = s
            if moves is not None:
                moves.moved(pick.bundle, s, d)
            if transfer:
                pending[pick.bundle] = PendingMove(s, d, now_ms, pick.load)
        return out

    def _move_decision(
        self,
        pick: _Candidate,
        s: str,
        d: str,
        loads_before: tuple[float, float],
        loads_after: tuple[float, float],
        mean: float,
        *,
        transfer: bool,
        cycle: str,
        now_ms: int,
    ) -> Decision:
        """The decision for moving ``pick`` from ``s`` to ``d``, with the pair's loads before and
        projected after the move ((source, destination)) as its inputs; ``Overloaded`` when the
        source was above the trigger, else ``Underloaded`` (the move fills an idle broker)."""
        before_s, before_d = loads_before
        after_s, after_d = loads_after
        reason = (
            DecisionReason.OVERLOADED
            if before_s > mean * self.trigger_ratio
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

    def target_ratio(self, config: LoadBalancerConfig) -> float:
        """Where shedding stops: the balance band less the margin, never above the trigger."""
        return min(
            self.trigger_ratio, config.load_balancer_balanced_max_over_mean - self.band_margin
        )

    def _pick_finishing(
        self,
        model: UsageModel,
        s: str,
        d: str,
        cands: _Candidates,
        loads: Mapping[str, float],
        came_from: Mapping[str, str],
        high: float,
        low: float,
        moves: PolicyMoves | None = None,
    ) -> _Candidate | None:
        """The bundle with the fewest bytes whose move leaves both brokers of the pair inside
        ``[low, high]``, if one does: one move then settles the pair, and the smallest such
        bundle disconnects the least traffic and leaves the destination the most room. Under
        placement policies only bundles that may go to ``d`` are considered."""
        if not cands:
            return None
        window: Iterable[_Candidate] = cands
        if len(cands) > 2 * _WINDOW:
            probe = cands[len(cands) // 2].load
            slope = loads[s] - model.load_if_removed(s, probe)
            if slope > 0:
                need = max(loads[s] - high, 0.0) / slope * probe.work
                i = cands.first_at_least(need)
                window = cands.window(max(0, i - _WINDOW), i + 2 * _WINDOW)
        best: _Candidate | None = None
        best_key: tuple[float, float, str] | None = None
        for c in window:
            if came_from.get(c.bundle) == d:
                continue
            after_s = model.load_if_removed(s, c.load)
            after_d = model.load_if_added(d, c.load)
            if not (low <= after_s <= high and low <= after_d <= high):
                continue
            if moves is not None and not moves.allows(c.bundle, s, d):
                continue
            key = (c.stats.msg_throughput_in + c.stats.msg_throughput_out, c.work, c.bundle)
            if best_key is None or key < best_key:
                best, best_key = c, key
        return best

    def _lone_hot(self, load: float, mean: float, config: LoadBalancerConfig) -> bool:
        """Whether a broker's only bundle may go: it is overloaded, or far above the mean."""
        threshold = config.load_balancer_broker_overloaded_threshold_percentage / 100.0
        return load > threshold or load > mean * self.lone_ratio

    def _pick_lone(
        self,
        model: UsageModel,
        s: str,
        cands: _Candidates,
        loads: Mapping[str, float],
        came_from: Mapping[str, str],
        moves: PolicyMoves | None = None,
    ) -> tuple[_Candidate | None, str]:
        """A lone bundle and the broker that would host it lowest, if that is at least
        ``lone_margin`` below the source's load now (else ``(None, s)``); under placement
        policies, the lowest among the brokers the bundle may go to."""
        if len(cands) != 1:
            return None, s  # in the grace period, pending, or idle: it stays
        c = cands[0]
        best, best_load = s, loads[s] - self.lone_margin
        for d in sorted(loads):
            if d == s or came_from.get(c.bundle) == d:
                continue
            projected = model.load_if_added(d, c.load)
            if projected < best_load and (moves is None or moves.allows(c.bundle, s, d)):
                best, best_load = d, projected
        return (c, best) if best != s else (None, s)

    def _pick(
        self,
        model: UsageModel,
        s: str,
        d: str,
        cands: _Candidates,
        loads: Mapping[str, float],
        came_from: Mapping[str, str],
        moves: PolicyMoves | None = None,
    ) -> _Candidate | None:
        """The bundle that leaves the pair's higher projected load lowest, if it helps at all,
        never sending a bundle back to the broker we moved it away from (ping-pong), and under
        placement policies only a bundle that may go to ``d``."""
        if not cands:
            return None
        window: Iterable[_Candidate] = cands
        if len(cands) > 2 * _WINDOW:
            probe = cands[len(cands) // 2].load
            slope = (loads[s] - model.load_if_removed(s, probe)) + (
                model.load_if_added(d, probe) - loads[d]
            )
            if slope > 0:
                ideal = (loads[s] - loads[d]) / slope * probe.work
                i = cands.first_at_least(ideal)
                window = cands.window(max(0, i - _WINDOW), i + _WINDOW)
        best: _Candidate | None = None
        best_max = loads[s] - self.min_gain
        for c in window:
            if came_from.get(c.bundle) == d:
                continue
            pair_max = max(model.load_if_removed(s, c.load), model.load_if_added(d, c.load))
            if pair_max < best_max and (moves is None or moves.allows(c.bundle, s, d)):
                best, best_max = c, pair_max
        return best


def _busiest_and_idlest(loads: Mapping[str, float], stuck: set[str]) -> tuple[str, str] | None:
    """The busiest broker not stuck and the idlest one, each by (load, name); ``None`` when
    every broker is stuck. The same comparisons as ``max``/``min`` keyed on (load, name), made
    on the tuples directly instead of calling a key per broker for every planned move."""
    ranked: Iterable[tuple[float, str]] = zip(loads.values(), loads)
    if stuck:
        ranked = (t for t in ranked if t[1] not in stuck)
    top = max(ranked, default=None)
    if top is None:
        return None
    return top[1], min(zip(loads.values(), loads))[1]


def _replay_pending(
    state: ProjectedShedderState,
    view: ClusterView,
    model: UsageModel,
    now_ms: int,
    delay_ms: int,
) -> dict[str, PendingMove]:
    """Count moves not yet visible in the reports; forget them once visible or too old."""
    kept: dict[str, PendingMove] = {}
    for bundle, pm in sorted(state.pending.items()):
        dst = view.brokers.get(pm.destination)
        if dst is None or now_ms - pm.at_ms > delay_ms or bundle in dst.report.bundles:
            continue
        src = view.brokers.get(pm.source)
        if src is not None and bundle in src.report.bundles:
            model.remove(pm.source, pm.load)
        model.add(pm.destination, pm.load)
        kept[bundle] = pm
    return kept


def _splitting_excess(view: ClusterView, model: UsageModel, high: float, now_ms: int) -> set[str]:
    """Brokers that would be inside the band without the bundles being split in this cycle.

    The cycle passes the bundles it splits or merges now as moved at ``now_ms``; nothing else
    carries that time, since this cycle's own moves are recorded after shedding. Their load
    leaves with the split (its children are placed afresh), so shedding the broker's other
    bundles would move load that is not in excess."""
    leaving: dict[str, list[NamespaceBundleStats]] = {}
    for bundle, t in view.recently_unloaded.items():
        if t < now_ms:
            continue
        for name, b in view.brokers.items():
            st = b.report.last_stats.get(bundle)
            if st is not None:
                leaving.setdefault(name, []).append(st)
                break
    out: set[str] = set()
    for name, stats in sorted(leaving.items()):
        gone = BundleLoad(
            sum(st.msg_rate for st in stats),
            sum(st.msg_throughput_in for st in stats),
            sum(st.msg_throughput_out for st in stats),
        )
        if model.load(name) > high and model.load_if_removed(name, gone) <= high:
            out.add(name)
    return out


def _movable(view: ClusterView, broker: str, pending: Mapping[str, PendingMove]) -> _Candidates:
    """The broker's bundles that may move now, sorted by work (ties by name); heartbeat,
    SLA-monitor and ``pulsar/system`` bundles never move (``is_system_service_bundle``).

    Built only for brokers the plan actually sheds from: with 100k bundles most brokers are
    never a source in a cycle. A ``lastStats`` that offers ``sample_columns()`` (the streaming
    driver's view: the names and their figures as one array) is ranked from the columns, with
    the same float operations, and ``stat(name)`` makes the value of a bundle looked at.
    """
    recent = view.recently_unloaded
    stats = view.brokers[broker].report.last_stats
    bulk = getattr(stats, "sample_columns", None)
    columns = bulk() if bulk is not None else None
    if columns is not None:
        names, values = columns  # STAT_COLUMNS: throughput in, out, rate in, out
        work = values[:, 2] + values[:, 3] + (values[:, 0] + values[:, 1]) / KBYTES
        kept = [
            i
            for i in np.flatnonzero(work > 0).tolist()  # work > 0: never a NaN
            if names[i] not in recent
            and names[i] not in pending
            and not is_system_service_bundle(names[i])
        ]
        kept_names = [names[i] for i in kept]
        kept_work = work[kept]
        order = order_by_value_then_name(kept_work, kept_names)
        works = kept_work.tolist()
        stat = getattr(stats, "stat", stats.__getitem__)
        return _Candidates([(works[i], kept_names[i]) for i in order], stat)
    raw: list[tuple[float, str]] = []
    made: dict[str, NamespaceBundleStats] = {}
    for bundle, s in stats.items():
        if bundle in recent or bundle in pending or is_system_service_bundle(bundle):
            continue
        work = (
            s.msg_rate_in + s.msg_rate_out + (s.msg_throughput_in + s.msg_throughput_out) / KBYTES
        )
        if work > 0:
            raw.append((work, bundle))
            made[bundle] = s
    raw.sort()  # (work, bundle): work > 0 above, so never a NaN
    return _Candidates(raw, made.__getitem__)
