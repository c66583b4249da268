"""The placement interface: choose a broker for a bundle being assigned.

Mirrors Pulsar's ``ModularLoadManagerStrategy.selectBroker`` (and the extensible
``BrokerSelectionStrategy``). A strategy scores candidate brokers from a ``ClusterView`` plus the
bundles already preallocated to each broker in this cycle (``preallocated``: broker -> bundle ->
``BundleData``), and picks one with the seeded ``rng`` where Pulsar picks at random among ties.
``loadbalance.placement.pipeline.BrokerSelector`` runs the filters around it and records the
preallocation, as ``ModularLoadManagerImpl.selectBrokerForAssignment`` does.

A strategy that remembers something between selections (``RoundRobinBrokerSelector``'s counter)
keeps it in a frozen dataclass that the caller threads through and persists; the others have no
state (``None``). ``state_type`` lets the caller replace a state left by another strategy.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from loadbalance.time_average import BundleData
from loadbalance.view import ClusterView

if TYPE_CHECKING:
    from loadbalance.config import LoadBalancerConfig


S = TypeVar("S")


class PlacementStrategy(Protocol[S]):
    """One placement strategy; ``name`` is Pulsar's short class name, ``S`` its state type."""

    name: ClassVar[str]
    state_type: ClassVar[type]
    """The class of ``S`` (``type(None)`` for a stateless strategy)."""

    def initial_state(self) -> S:
        """State before the first selection (``None`` for stateless strategies)."""
        ...

    def select_broker(
        self,
        candidates: Sequence[str],
        bundle: str,
        bundle_data: BundleData,
        view: ClusterView,
        preallocated: Mapping[str, Mapping[str, BundleData]],
        config: LoadBalancerConfig,
        rng: random.Random,
        state: S,
    ) -> tuple[S, str | None]:
        """Return (new strategy state, chosen broker or None when no candidate)."""
        ...


class Preallocations(dict[str, BundleData]):
    """One broker's preallocated bundles (bundle -> ``BundleData``), with the totals the filters
    and strategies read kept up to date as bundles are added.

    A cycle that places thousands of bundles would otherwise re-add every broker's
    preallocations for every candidate of every placement. The msg rate total is a left fold in
    insertion order starting from ``0`` (``_fold_msg_rate``), the same operations as summing the
    values afresh, so the same bits; replacing or removing an entry sums afresh."""

    __slots__ = ("generation", "long_term_msg_rate", "topics")

    def __init__(self) -> None:
        super().__init__()
        self.long_term_msg_rate: float = 0
        self.topics: int = 0
        self.generation = 0
        """Counts replacements and removals: while it stays, entries were only appended."""

    def __setitem__(self, bundle: str, data: BundleData) -> None:
        if bundle in self:
            super().__setitem__(bundle, data)
            self._resum()
            return
        super().__setitem__(bundle, data)
        self.long_term_msg_rate = self.long_term_msg_rate + data.long_term.msg_rate
        self.topics = self.topics + data.topics

    def __delitem__(self, bundle: str) -> None:
        super().__delitem__(bundle)
        self._resum()

    def pop(self, bundle: str, *default: Any) -> Any:  # type: ignore[override]
        out = super().pop(bundle, *default)
        self._resum()
        return out

    def _resum(self) -> None:
        self.generation += 1
        self.long_term_msg_rate = _fold_msg_rate(self.values())
        self.topics = sum(d.topics for d in self.values())

    # Mutations the totals do not follow are refused rather than left silently stale.
    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("Preallocations changes by item only")

    update = setdefault = popitem = clear = __ior__ = _refuse  # type: ignore[assignment]


def _fold_msg_rate(bundles: Iterable[BundleData]) -> float:
    """``0 + a + b + ...`` left to right: plain float additions, written out rather than
    ``sum`` (whose float algorithm differs between Python versions) so a running total kept one
    addition at a time is the same bits as a fresh sum."""
    total: float = 0
    for d in bundles:
        total = total + d.long_term.msg_rate
    return total


def pending_msg_rate(preallocated: Mapping[str, BundleData]) -> float:
    """Summed long-term msg/s of a broker's preallocated bundles (kept, when it can be)."""
    if isinstance(preallocated, Preallocations):
        return preallocated.long_term_msg_rate
    return _fold_msg_rate(preallocated.values())


def pending_topics(preallocated: Mapping[str, BundleData]) -> int:
    """Summed topics of a broker's preallocated bundles (kept, when it can be)."""
    if isinstance(preallocated, Preallocations):
        return preallocated.topics
    return sum(d.topics for d in preallocated.values())
