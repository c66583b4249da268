"""RoundRobinBrokerSelector: hand bundles to the candidates in turn.

Mirrors Pulsar's ``org.apache.pulsar.broker.loadbalance.impl.RoundRobinBrokerSelector``: a counter
that grows by one per selection, taken modulo the number of candidates, and wraps from
``Integer.MAX_VALUE`` to 0 as Pulsar's ``AtomicInteger`` update does (so a replay of a long-lived
counter names the same brokers). Pulsar keeps the counter inside the strategy object; here it is
the strategy state (``RoundRobinState``) that the caller persists across cycles, so a restart or
an offline replay continues the rotation where it stopped.

Deviation: candidates are sorted before indexing. Pulsar indexes a cached copy of the candidate
set's iteration order, refreshed when the set's size changes or the cached pick is no longer a
candidate, so the order it rotates in depends on hash-set order; sorted, the same counter always
names the same broker (with sorted candidate sets the two agree). Load, overload and
preallocation are ignored by design: this strategy is for tests and for operators who want a
predictable spread.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from loadbalance.time_average import BundleData
from loadbalance.view import ClusterView

if TYPE_CHECKING:
    from loadbalance.config import LoadBalancerConfig

JAVA_INT_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class RoundRobinState:
    """The rotation counter: the index (modulo the candidates) of the next selection."""

    counter: int = 0


class RoundRobinBrokerSelector:
    """Choose ``sorted(candidates)[counter % n]`` and advance the counter."""

    name: ClassVar[str] = "RoundRobinBrokerSelector"
    state_type: ClassVar[type] = RoundRobinState

    def initial_state(self) -> RoundRobinState:
        return RoundRobinState()

    def select_broker(
        self,
        candidates: Sequence[str],
        bundle: str,
        bundle_data: BundleData,
        view: ClusterView,
        preallocated: Mapping[str, Mapping[str, BundleData]],
        config: LoadBalancerConfig,
        rng: random.Random,
        state: RoundRobinState,
    ) -> tuple[RoundRobinState, str | None]:
        counter = state.counter
        ordered = sorted(set(candidates))
        if not ordered:
            return state, None
        following = 0 if counter >= JAVA_INT_MAX else counter + 1
        return RoundRobinState(following), ordered[counter % len(ordered)]
