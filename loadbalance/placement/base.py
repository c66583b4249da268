"""The placement interface: choose a broker for a bundle being assigned.

Mirrors Pulsar's ``ModularLoadManagerStrategy.selectBroker`` (and the extensible
``BrokerSelectionStrategy``). A strategy scores candidate brokers from a ``ClusterView`` plus the
bundles already preallocated to each broker in this cycle (``preallocated``: broker -> bundle ->
``BundleData``), and picks one with the seeded ``rng`` where Pulsar picks at random among ties.
``loadbalance.placement.pipeline.BrokerSelector`` runs the filters around it and records the
preallocation, as ``ModularLoadManagerImpl.selectBrokerForAssignment`` does.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from loadbalance.time_average import BundleData
from loadbalance.view import ClusterView

if TYPE_CHECKING:
    from loadbalance.config import LoadBalancerConfig


class PlacementStrategy(Protocol):
    """One placement strategy; ``name`` is Pulsar's short class name."""

    name: ClassVar[str]

    def select_broker(
        self,
        candidates: Sequence[str],
        bundle: str,
        bundle_data: BundleData,
        view: ClusterView,
        preallocated: Mapping[str, Mapping[str, BundleData]],
        config: LoadBalancerConfig,
        rng: random.Random,
        state: Any,
    ) -> tuple[Any, str | None]:
        """Return (new strategy state, chosen broker or None when no candidate)."""
        ...
