"""Builders that restate the fixtures of Pulsar's load-balancer unit tests as this project's
values: brokers with an exact load and exact per-bundle stats, a view, a configuration with
Pulsar's defaults plus a test's overrides, and one call into a shedder.

Pulsar's tests push ``BrokerLoadData``/``LocalBrokerData`` and ``TopBundlesLoadData`` into
mocked stores; here the same figures go into ``LocalBrokerData`` reports and ``BrokerView``s,
which is what every policy reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from loadbalance.config import LoadBalancerConfig
from loadbalance.decisions import PolicyResult
from loadbalance.model import LocalBrokerData, NamespaceBundleStats, ResourceUsage
from loadbalance.shedding.registry import make_shedder
from loadbalance.time_average import BundleData, TimeAverageBrokerData
from loadbalance.view import BrokerView, ClusterView

NOW_MS = 1_700_000_000_000
MB = 1024 * 1024
UNUSED = ResourceUsage()
"""A resource Pulsar's fixtures leave at 0 of no limit."""


def thr_out(value: float) -> NamespaceBundleStats:
    """A bundle whose only figure is its outbound throughput (``getTopBundlesLoad``)."""
    return NamespaceBundleStats(msg_throughput_out=float(value))


@dataclass
class Broker:
    """One broker of a Pulsar test: its load (``weightedMaxEMA`` or a ThresholdShedder-style
    history usage, as a fraction), its bundles' stats, and its report's throughput
    (``msgThroughputIn``/``Out``; Pulsar's ``getCpuLoad`` writes 1 and the sum of the top
    bundles' outbound throughput)."""

    load: float
    bundles: Mapping[str, NamespaceBundleStats] = field(default_factory=dict)
    thr_in: float = 1.0
    thr_out: float | None = None
    thr_ema: float | None = None
    updated_at_ms: int = NOW_MS
    owned_without_stats: tuple[str, ...] = ()
    stats_not_owned: bool = False
    cpu: ResourceUsage | None = None
    memory: ResourceUsage = UNUSED
    direct_memory: ResourceUsage = UNUSED
    bandwidth_in: ResourceUsage = UNUSED
    bandwidth_out: ResourceUsage = UNUSED
    msg_rate_in: float = 3.0
    msg_rate_out: float = 4.0


def view_of(
    brokers: Mapping[str, Broker],
    *,
    recently_unloaded: Mapping[str, int] | None = None,
    bundle_data: Mapping[str, BundleData] | None = None,
) -> ClusterView:
    views: dict[str, BrokerView] = {}
    data: dict[str, BundleData] = dict(bundle_data or {})
    for name, spec in brokers.items():
        out = (
            sum(s.msg_throughput_out for s in spec.bundles.values())
            if spec.thr_out is None
            else spec.thr_out
        )
        owned = frozenset(() if spec.stats_not_owned else spec.bundles) | frozenset(
            spec.owned_without_stats
        )
        report = LocalBrokerData(
            broker=name,
            cpu=spec.cpu if spec.cpu is not None else ResourceUsage(spec.load * 100, 100),
            memory=spec.memory,
            direct_memory=spec.direct_memory,
            bandwidth_in=spec.bandwidth_in,
            bandwidth_out=spec.bandwidth_out,
            msg_throughput_in=spec.thr_in,
            msg_throughput_out=out,
            msg_rate_in=spec.msg_rate_in,
            msg_rate_out=spec.msg_rate_out,
            bundles=owned,
            last_stats=MappingProxyType(dict(spec.bundles)),
            last_update_ms=spec.updated_at_ms,
        )
        ema = spec.thr_in + out if spec.thr_ema is None else spec.thr_ema
        # ``load`` is both readings: TransferShedder's tests set ``weightedMaxEMA``, the
        # modular shedders' tests the within-limit history usage
        views[name] = BrokerView(
            report,
            spec.load,
            ema,
            TimeAverageBrokerData(),
            spec.updated_at_ms,
            weighted_max_ema=spec.load,
        )
        for b, s in spec.bundles.items():
            data.setdefault(b, BundleData.new().update(s))
    return ClusterView(
        brokers=MappingProxyType(views),
        bundle_data=MappingProxyType(data),
        recently_unloaded=MappingProxyType(dict(recently_unloaded or {})),
    )


def config(**knobs: Any) -> LoadBalancerConfig:
    return LoadBalancerConfig(**knobs)


def shed(
    name: str,
    view: ClusterView,
    state: Any = None,
    *,
    now_ms: int = NOW_MS,
    **knobs: Any,
) -> tuple[Any, PolicyResult]:
    shedder = make_shedder(name)
    state = shedder.initial_state() if state is None else state
    return shedder.find_bundles_for_unloading(
        view, config(**knobs), state, now_ms=now_ms, cycle="c"
    )


def moves(result: PolicyResult) -> set[tuple[str, str, str | None]]:
    """Pulsar's decision set: (source broker, bundle, destination broker or None)."""
    return {(d.source_broker, d.bundle, d.destination_broker) for d in result.decisions}


def reasons(result: PolicyResult) -> list[str]:
    return [s.reason for s in result.skips]
