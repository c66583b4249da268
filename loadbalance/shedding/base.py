"""The shedder interface shared by every load-shedding strategy.

A shedder mirrors Pulsar's ``LoadSheddingStrategy.findBundlesForUnloading`` but is a pure step
with explicit state: it reads a ``ClusterView`` and returns its new state and a
``PolicyResult`` (unload/transfer decisions plus skips with Pulsar's reason names). The caller
(``loadbalance.cycle``) owns the shedding interval and the grace period bookkeeping;
``view.recently_unloaded`` holds bundle -> unload time (ms) for bundles still in grace.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from loadbalance.decisions import PolicyResult
from loadbalance.view import ClusterView

if TYPE_CHECKING:
    from loadbalance.config import LoadBalancerConfig


class Shedder(Protocol):
    """One shedding strategy; ``name`` is Pulsar's short class name."""

    name: ClassVar[str]

    def initial_state(self) -> Any:
        """State before the first cycle (``None`` for stateless shedders)."""
        ...

    def find_bundles_for_unloading(
        self,
        view: ClusterView,
        config: LoadBalancerConfig,
        state: Any,
        *,
        now_ms: int,
        cycle: str,
    ) -> tuple[Any, PolicyResult]:
        """Return (new state, decisions and skips) for this cycle."""
        ...
