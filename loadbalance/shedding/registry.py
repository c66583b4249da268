"""Shedders by name, so configuration can pick one the way Pulsar's
``loadBalancerLoadSheddingStrategy`` does: Pulsar's short class name (``ThresholdShedder``) or
the full Java class name (``org.apache.pulsar.broker.loadbalance.impl.ThresholdShedder``); only
the part after the last dot counts. An unknown name is a configuration error, not a silent
fallback (Pulsar falls back to OverloadShedder and logs; an operator would rather be told).
"""

from __future__ import annotations

from typing import Any, TypeAlias

from loadbalance.errors import InvalidInput
from loadbalance.shedding.base import Shedder
from loadbalance.shedding.overload_shedder import OverloadShedder
from loadbalance.shedding.threshold_shedder import ThresholdShedder
from loadbalance.shedding.transfer_shedder import TransferShedder, TransferShedderState
from loadbalance.shedding.uniform_load_shedder import UniformLoadShedder
from loadbalance.strategies.projected_usage_shedder import (
    ProjectedShedderState,
    ProjectedUsageShedder,
)

ShedderState: TypeAlias = TransferShedderState | ProjectedShedderState | None
"""The state of any registered shedder (``None``: a stateless one, or before the first cycle)."""

SHEDDERS: dict[str, type] = {
    cls.name: cls
    for cls in (
        ThresholdShedder,
        OverloadShedder,
        UniformLoadShedder,
        TransferShedder,
        ProjectedUsageShedder,
    )
}
"""Short class name -> shedder class (Pulsar's four, and ours)."""


def shedder_names() -> tuple[str, ...]:
    """The short names ``make_shedder`` accepts, sorted."""
    return tuple(sorted(SHEDDERS))


def make_shedder(name: str) -> Shedder[Any]:
    """A new shedder for a short or fully qualified class name; ``InvalidInput`` if unknown."""
    short = name.strip().rsplit(".", 1)[-1]
    cls = SHEDDERS.get(short)
    if cls is None:
        raise InvalidInput(
            "loadBalancerLoadSheddingStrategy",
            f"unknown shedder {name!r}; expected one of {', '.join(shedder_names())}",
        )
    return cls()
