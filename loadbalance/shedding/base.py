"""The shedder interface shared by every load-shedding strategy.

A shedder mirrors Pulsar's ``LoadSheddingStrategy.findBundlesForUnloading`` but is a pure step
with explicit state: it reads a ``ClusterView`` and returns its new state and a
``PolicyResult`` (unload/transfer decisions plus skips with Pulsar's reason names). The caller
(``loadbalance.cycle``) owns the shedding interval and the grace period bookkeeping;
``view.recently_unloaded`` holds bundle -> unload time (ms) for bundles still in grace.

Each shedder names its state type: a frozen dataclass for those that carry something from one
cycle to the next (``TransferShedderState``, ``ProjectedShedderState``), ``None`` for the
stateless ones. The cycle state is persisted and replayed by the streaming job, so a state is a
value: frozen, picklable, compared by content. ``state_type`` lets the caller tell a state that
belongs to another shedder (the strategy was reconfigured between runs) and start afresh.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol, TypeVar

from loadbalance.decisions import PolicyResult
from loadbalance.view import ClusterView

if TYPE_CHECKING:
    from loadbalance.config import LoadBalancerConfig


S = TypeVar("S")


class Shedder(Protocol[S]):
    """One shedding strategy; ``name`` is Pulsar's short class name, ``S`` its state type."""

    name: ClassVar[str]
    state_type: ClassVar[type]
    """The class of ``S`` (``type(None)`` for a stateless shedder)."""

    def initial_state(self) -> S:
        """State before the first cycle (``None`` for stateless shedders)."""
        ...

    def find_bundles_for_unloading(
        self,
        view: ClusterView,
        config: LoadBalancerConfig,
        state: S,
        *,
        now_ms: int,
        cycle: str,
    ) -> tuple[S, PolicyResult]:
        """Return (new state, decisions and skips) for this cycle."""
        ...
