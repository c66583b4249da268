"""Which bundle to move off a busy broker, and where: judged on the whole cluster after the move.

Why not the busiest-to-idlest pair: in a fleet of unequal brokers the idlest broker is often a
weak one, and the bundle that evens that pair is a small one, so a plan that only ever looks at
that pair moves many small bundles, and moves some twice. Here each move of a plan is chosen
among every bundle near the size the source needs to shed and the ``destinations`` least loaded
brokers (all brokers of the pool under placement policies), by the **whole cluster's** projected
loads after it (``Spread``: the mean moves with every move, since the same work costs a strong
broker less usage than a weak one):

1. a move that **settles** the source, bringing it and the destination within the target (the
   balance band less its margin, on the mean after the move), wins; among those the one that
   cuts over the least traffic (bytes in + out, then producers + consumers, then messages),
   then the flatter cluster (sum of squared deviations from the mean);
2. otherwise the move that leaves the least **excess** above the target on the two brokers
   (the largest bundle that fits where it goes: each move then does as much of the work as one
   move can, which is what keeps the count of moves low), then the flatter cluster, then the
   cheaper bundle; a move that leaves its destination within the target before one that pushes
   it over (that broker would have to be shed in turn, a second move for the same load).

A move must lower the higher load of its pair and must not leave either broker of the pair above
the cluster's max/mean before it (work moved to a stronger broker costs less usage there, so the
mean falls with it). Another broker's max/mean may rise as the mean falls: a busy broker beside
the source is the plan's next source, and judging each move by it would stop the plan after
the first move off two near-equal hot brokers; the plan's end mean is judged instead (below).
It must not take
its destination above the balance band (``band_ratio`` x the mean after the move): that broker
would then have to shed in turn, and the bundle just moved sits in its grace period there, so a
destination filled with moved bundles can stay above the band for the whole period, every cycle
of it one more for the episode to count (the source waits for another move instead), unless
the source is overloaded and the destination stays under the overload threshold (an overloaded
broker never waits for a move that keeps every broker inside the band);
a bundle is never sent back to the broker a move of ours took it from (ping-pong), and under
placement policies only to a broker its policies allow (``PolicyMoves``).

The band and the target are taken on the lower of the mean after the move and ``mean_cap``, the
mean the plan's previous pass ended at (``ProjectedUsageShedder``: a plan that moves load onto
strong brokers ends at a lower mean than it starts from, and a broker filled to the band on the
starting mean is above it on the end mean).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from loadbalance.strategies.policy_moves import PolicyMoves
from loadbalance.strategies.shed_candidates import WINDOW, Candidate, Candidates
from loadbalance.strategies.usage_projection import BundleLoad, UsageModel

__all__ = ["MoveSearch", "Spread"]


@dataclass(slots=True)
class Spread:
    """The projected loads of the brokers a plan balances, with their sum and sum of squares."""

    loads: dict[str, float]
    total: float = 0.0
    squares: float = 0.0

    def __post_init__(self) -> None:
        self.refresh()

    def refresh(self) -> None:
        """Sum and sum of squares afresh (after a move; no drift from running updates)."""
        self.total = sum(self.loads.values())
        self.squares = sum(v * v for v in self.loads.values())

    @property
    def mean(self) -> float:
        return self.total / len(self.loads)

    def after(self, s: str, load_s: float, d: str, load_d: float) -> tuple[float, float]:
        """(mean, sum of squared deviations) once ``s`` and ``d`` carry the given loads."""
        n = len(self.loads)
        old_s, old_d = self.loads[s], self.loads[d]
        total = self.total - old_s - old_d + load_s + load_d
        squares = self.squares - old_s * old_s - old_d * old_d + load_s * load_s + load_d * load_d
        mean = total / n
        return mean, max(squares - n * mean * mean, 0.0)


class MoveSearch:
    """The best move off one source over one plan's loads (see the module docstring)."""

    def __init__(
        self,
        model: UsageModel,
        spread: Spread,
        target_ratio: float,
        *,
        destinations: int,
        min_gain: float,
        came_from: Mapping[str, str],
        moves: PolicyMoves | None = None,
        band_ratio: float | None = None,
        overloaded: float | None = None,
        mean_cap: float | None = None,
    ) -> None:
        self.model, self.spread, self.target_ratio = model, spread, target_ratio
        self.band_ratio = band_ratio
        self.overloaded = overloaded
        self.destinations, self.min_gain = destinations, min_gain
        self.came_from, self.moves = came_from, moves
        self.mean_cap = mean_cap
        self._ratio = 0.0
        self._off: dict[str, tuple[BundleLoad, float]] = {}

    def best(self, s: str, cands: Candidates) -> tuple[Candidate, str] | None:
        """The best (bundle, destination) off ``s``, or ``None`` when no move lowers it."""
        if not cands:
            return None
        best: tuple[Candidate, str] | None = None
        best_key: tuple | None = None
        loads = self.spread.loads
        self._ratio = max(loads.values()) / self.spread.mean if self.spread.mean > 0 else 0.0
        self._off = {}
        for d in self._destinations(s):
            for c in self._window(s, d, cands):
                key = self._key(s, d, c)
                if key is not None and (best_key is None or key < best_key):
                    best, best_key = (c, d), key
        return best

    def _destinations(self, s: str) -> list[str]:
        """The brokers a move off ``s`` may go to: the least loaded few (by load, then name),
        or every broker of the plan when policies restrict moves (the few may all be refused)."""
        ranked = sorted((v, b) for b, v in self.spread.loads.items() if b != s)
        if self.moves is None:
            ranked = ranked[: self.destinations]
        return [b for _, b in ranked]

    def _window(self, s: str, d: str, cands: Candidates) -> Iterable[Candidate]:
        """The candidates worth judging for ``s`` -> ``d``: all when few, else those around the
        work that settles ``s`` (when ``d`` has room for it) or the most ``d`` has room for."""
        if len(cands) <= 3 * WINDOW:
            return cands
        model, loads = self.model, self.spread.loads
        probe = cands[len(cands) // 2].load
        shed = loads[s] - model.load_if_removed(s, probe)
        take = model.load_if_added(d, probe) - loads[d]
        if shed <= 0 or take <= 0:
            return cands.window(len(cands) - 2 * WINDOW, len(cands))
        target = self.judged(self.spread.mean) * self.target_ratio
        need = max(loads[s] - target, 0.0) / shed * probe.work
        room = max(target - loads[d], 0.0) / take * probe.work
        if need <= room:
            i = cands.first_at_least(need)
            return cands.window(max(0, i - WINDOW), i + 2 * WINDOW)
        i = cands.first_at_least(room)
        return cands.window(max(0, i - 2 * WINDOW), i + WINDOW)

    def _relief(self, s: str, load_d: float) -> bool:
        """Whether the move relieves an overloaded source without overloading its destination:
        such a move may take the destination above the band, since an overloaded broker never
        waits for a move that keeps every broker inside it (Pulsar's shedders always act on
        one); it still lowers the pair's higher load, as every move must."""
        limit = self.overloaded
        return limit is not None and self.spread.loads[s] > limit and load_d < limit

    def _key(self, s: str, d: str, c: Candidate) -> tuple | None:
        """How good moving ``c`` from ``s`` to ``d`` is (lower is better); ``None`` when the
        move is not allowed or does not lower the pair's higher load."""
        if self.came_from.get(c.bundle) == d:
            return None
        load, load_s = self._taken_off(s, c)
        load_d = self.model.load_if_added(d, load)
        if max(load_s, load_d) >= self.spread.loads[s] - self.min_gain:
            return None
        mean, squares = self.spread.after(s, load_s, d, load_d)
        if mean <= 0 or max(load_s, load_d) / mean > self._ratio:
            return None  # the pair would end above the cluster's max/mean before the move
        if self.moves is not None and not self.moves.allows(c.bundle, s, d):
            return None
        mean = self.judged(mean)
        if (
            self.band_ratio is not None
            and load_d > mean * self.band_ratio
            and not self._relief(s, load_d)
        ):
            return None  # a new broker above the band, its new bundle in its grace period
        target = mean * self.target_ratio
        excess = max(load_s - target, 0.0) + max(load_d - target, 0.0)
        st = c.stats
        cost = (
            st.msg_throughput_in + st.msg_throughput_out,
            st.producer_count + st.consumer_count,
            c.work,
        )
        if excess <= 0.0:
            return (0, 0.0, cost, squares, c.bundle, d)
        over = 1 if load_d <= target else 2  # a destination pushed over must be shed in turn
        return (over, excess, squares, cost, c.bundle, d)

    def _taken_off(self, s: str, c: Candidate) -> tuple[BundleLoad, float]:
        """``c``'s load and ``s``'s load without it, once per candidate in one ``best``
        (every destination judges the same candidates)."""
        got = self._off.get(c.bundle)
        if got is None:
            load = c.load
            got = self._off[c.bundle] = (load, self.model.load_if_removed(s, load))
        return got

    def judged(self, mean: float) -> float:
        """The mean the band and the target are taken on: the cluster's, or the plan's
        projected end mean (``mean_cap``) when that is lower (see ``ProjectedUsageShedder``)."""
        cap = self.mean_cap
        return mean if cap is None or cap >= mean else cap

    def lone(self, s: str, c: Candidate, margin: float) -> str | None:
        """Where a broker's only bundle would sit lowest, if that is at least ``margin`` below
        the source's load now (else ``None``); under policies, among the brokers allowed."""
        ranked = self._hosts(s, c)
        if ranked and ranked[0][0] < self.spread.loads[s] - margin:
            return ranked[0][1]
        return None

    def _hosts(self, s: str, c: Candidate) -> list[tuple[float, str]]:
        """(projected load, broker) of every broker ``s``'s bundle ``c`` may go to, lowest
        first (then by name): not ``s``, not where it came from, allowed by the policies."""
        return sorted(
            (self.model.load_if_added(d, c.load), d)
            for d in self.spread.loads
            if d != s
            and self.came_from.get(c.bundle) != d
            and (self.moves is None or self.moves.allows(c.bundle, s, d))
        )

    def lone_moves(
        self, s: str, c: Candidate, cands_of: Callable[[str], Candidates]
    ) -> list[tuple[Candidate, str, str]] | None:
        """The moves that take ``s``'s only bundle ``c`` away when ``s`` is above the band and
        ``lone`` found no broker far enough below, as ``(bundle, source, destination)``.

        Among the ``destinations`` brokers ``c`` would sit lowest on: the move alone when it
        leaves the whole cluster inside the band, else with one move off its destination
        (to ``s``, now empty, or another of the least loaded) that does, the fewest moves
        first, then the lower max/mean; else the move alone to the broker ``c`` sits lowest on
        among those it leaves inside the band (the plan sheds what the emptied ``s`` lowered
        the mean under); ``None`` when there is none.

        Why a second move: a hot bundle on a weak broker is a small share of a strong one, but
        emptying the weak broker lowers the cluster's mean, and the brokers near it end above
        the band; one bundle of the strong broker's sent back to the weak one (a swap) raises the
        mean again, where a bundle off each of them would take a move apiece. Between equal
        brokers none of this applies: ``c`` alone puts any of them where it puts ``s``."""
        band = self.band_ratio
        if band is None:
            return None
        loads = self.spread.loads
        ranked = self._hosts(s, c)
        load_s = self.model.load_if_removed(s, c.load)
        best: tuple[tuple[int, float], list[tuple[Candidate, str, str]]] | None = None
        for projected, d in ranked[: self.destinations]:
            ratio = self._ratio_with({s: load_s, d: projected})
            if ratio <= band:
                key, moves = (1, ratio), [(c, s, d)]
            else:
                second = self._refill(s, c, d, cands_of(d), band)
                if second is None:
                    continue
                key, moves = (2, second[2]), [(c, s, d), (second[0], d, second[1])]
            if best is None or key < best[0]:
                best = (key, moves)
        if best is not None:
            return best[1]
        for projected, d in ranked:
            mean, _ = self.spread.after(s, load_s, d, projected)
            if projected <= self.judged(mean) * band and projected < loads[s] - self.min_gain:
                return [(c, s, d)]
        return None

    def _ratio_with(self, changed: Mapping[str, float]) -> float:
        """The cluster's max/mean on the judged mean once the ``changed`` brokers carry the given
        loads (O(brokers): only for the rare lone-bundle moves)."""
        loads = self.spread.loads
        total = self.spread.total + sum(v - loads[b] for b, v in changed.items())
        mean = self.judged(total / len(loads))
        top = max(
            max((v for b, v in loads.items() if b not in changed), default=0.0),
            max(changed.values()),
        )
        return top / mean if mean > 0 else float("inf")

    def _refill(
        self, s: str, c: Candidate, d: str, cands: Candidates, band: float
    ) -> tuple[Candidate, str, float] | None:
        """The move off ``d`` (bundle, destination, the cluster's max/mean after) that, once
        ``c`` moved from ``s`` to ``d``, leaves the whole cluster lowest and inside the band;
        ``None`` when none does. Judged over the candidates around the work that fills ``s`` to
        the mean (all when few), to ``s`` and ``d``'s other least loaded brokers; the plan's
        state is as it was after."""
        model, loads = self.model, self.spread.loads
        if not cands:
            return None
        saved = (model.brokers[s], model.brokers[d], loads[s], loads[d], self.moves)
        model.remove(s, c.load)
        model.add(d, c.load)
        loads[s], loads[d] = model.load(s), model.load(d)
        self.spread.refresh()
        if self.moves is not None:  # the second move is judged with the first one made
            self.moves = self.moves.fork()
            self.moves.moved(c.bundle, s, d)
        try:
            best: tuple[float, Candidate, str] | None = None
            for x in self._fill_window(s, cands):
                load_d = model.load_if_removed(d, x.load)
                for e in self._destinations(d):
                    if self.came_from.get(x.bundle) == e or (
                        self.moves is not None and not self.moves.allows(x.bundle, d, e)
                    ):
                        continue
                    ratio = self._ratio_with({d: load_d, e: model.load_if_added(e, x.load)})
                    if ratio <= band and (best is None or ratio < best[0]):
                        best = (ratio, x, e)
            return None if best is None else (best[1], best[2], best[0])
        finally:
            model.brokers[s], model.brokers[d], loads[s], loads[d], self.moves = saved
            self.spread.refresh()

    def _fill_window(self, s: str, cands: Candidates) -> list[Candidate]:
        """The candidates around the work that would fill ``s`` to the mean (all when few)."""
        if len(cands) <= 3 * WINDOW:
            return list(cands)
        probe = cands[len(cands) // 2].load
        take = self.model.load_if_added(s, probe) - self.spread.loads[s]
        if take <= 0:
            return cands.window(0, 2 * WINDOW)
        need = max(self.spread.mean - self.spread.loads[s], 0.0) / take * probe.work
        i = cands.first_at_least(need)
        return cands.window(max(0, i - WINDOW), i + WINDOW)
