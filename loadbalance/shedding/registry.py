"""Shedders by Pulsar's short class name (a full Java class name is accepted too)."""

from __future__ import annotations

from loadbalance.errors import InvalidInput
from loadbalance.shedding.base import Shedder
from loadbalance.shedding.overload_shedder import OverloadShedder
from loadbalance.shedding.threshold_shedder import ThresholdShedder
from loadbalance.shedding.transfer_shedder import TransferShedder
from loadbalance.shedding.uniform_load_shedder import UniformLoadShedder
from loadbalance.strategies.projected_usage_shedder import ProjectedUsageShedder

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


def make_shedder(name: str) -> Shedder:
    short = name.rsplit(".", 1)[-1]
    cls = SHEDDERS.get(short)
    if cls is None:
        raise InvalidInput("loadBalancerLoadSheddingStrategy", f"unknown shedder {name!r}")
    return cls()
