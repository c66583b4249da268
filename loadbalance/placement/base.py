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
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar, Protocol, TypeVar

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
