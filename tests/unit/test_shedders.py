"""Pulsar's modular shedders on the reference's worked examples, the registry, and decision
invariants of all four Pulsar shedders over random clusters.

Clusters are built with ``cluster(B(...), ...)``: each ``B`` is one broker with a usage (used as
its history usage and as its CPU percentage, so both readings agree) and the current throughput
of each of its bundles in bytes/s (a bundle's msg rate is throughput / 1000 unless given).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from loadbalance.config import LoadBalancerConfig
from loadbalance.decisions import TRANSFER, UNLOAD, PolicyResult
from loadbalance.errors import InvalidInput
from loadbalance.model import LocalBrokerData, NamespaceBundleStats, ResourceUsage
from loadbalance.shedding.overload_shedder import OverloadShedder
from loadbalance.shedding.registry import SHEDDERS, make_shedder, shedder_names
from loadbalance.shedding.threshold_shedder import ThresholdShedder
from loadbalance.shedding.transfer_shedder import TransferShedder
from loadbalance.shedding.uniform_load_shedder import UniformLoadShedder
from loadbalance.time_average import BundleData, TimeAverageBrokerData
from loadbalance.view import BrokerView, ClusterView

MB = 1024 * 1024
NOW_MS = 1_700_000_000_000
CYCLE_MS = 60_000
PULSAR_SHEDDERS = ("OverloadShedder", "ThresholdShedder", "TransferShedder", "UniformLoadShedder")


def bundle(i: int) -> str:
    """The i-th bundle of the test namespace (globally numbered across brokers)."""
    lo = i * 0x100000
    return f"t/ns/0x{lo:08x}_0x{lo + 0x100000:08x}"


def broker_name(i: int) -> str:
    return f"b{i:02d}"


def stats_of(thr_bytes_per_s: float, rate_per_s: float | None = None) -> NamespaceBundleStats:
    rate = thr_bytes_per_s / 1000.0 if rate_per_s is None else rate_per_s
    return NamespaceBundleStats(rate / 2, rate / 2, thr_bytes_per_s / 2, thr_bytes_per_s / 2, 5)


@dataclass
class B:
    """One broker of a test cluster."""

    usage: float
    bundles: Sequence[float] = ()
    rates: Sequence[float] | None = None  # per-bundle msg rates; default throughput / 1000
    rate: float | None = None  # the report's msgRateIn + Out; default sum of bundle rates
    thr_ema: float | None = None  # msg throughput EMA; default the report's throughput
    updated_at_ms: int = NOW_MS
    extra: Sequence[str] = field(default_factory=tuple)  # bundles also claimed by another broker


def cluster(
    *brokers: B,
    recently: Mapping[str, int] | None = None,
    short_term: Mapping[str, float] | None = None,
) -> ClusterView:
    """A view; ``short_term`` overrides some bundles' short-term throughput (bytes/s)."""
    views: dict[str, BrokerView] = {}
    data: dict[str, BundleData] = {}
    n = 0
    for i, spec in enumerate(brokers):
        stats: dict[str, NamespaceBundleStats] = {}
        for j, thr in enumerate(spec.bundles):
            name = bundle(n)
            n += 1
            s = stats_of(thr, spec.rates[j] if spec.rates is not None else None)
            stats[name] = s
            st_thr = (short_term or {}).get(name)
            data[name] = BundleData.new().update(s if st_thr is None else stats_of(st_thr))
        for name in spec.extra:
            stats[name] = stats_of(data[name].short_term.msg_throughput)
        total_thr = sum(s.msg_throughput for s in stats.values())
        total_rate = sum(s.msg_rate for s in stats.values()) if spec.rate is None else spec.rate
        report = LocalBrokerData(
            broker=broker_name(i),
            cpu=ResourceUsage(spec.usage * 100, 100),
            msg_throughput_in=total_thr / 2,
            msg_throughput_out=total_thr / 2,
            msg_rate_in=total_rate / 2,
            msg_rate_out=total_rate / 2,
            bundles=frozenset(stats),
            last_stats=MappingProxyType(stats),
            last_update_ms=spec.updated_at_ms,
        )
        ema = total_thr if spec.thr_ema is None else spec.thr_ema
        views[report.broker] = BrokerView(
            report, spec.usage, ema, TimeAverageBrokerData(), spec.updated_at_ms
        )
    return ClusterView(
        brokers=MappingProxyType(views),
        bundle_data=MappingProxyType(data),
        recently_unloaded=MappingProxyType(dict(recently or {})),
    )


def run(
    name: str, view: ClusterView, cycles: int = 1, state: Any = None, **knobs: Any
) -> tuple[Any, list[PolicyResult]]:
    """Run ``cycles`` shedding cycles one minute apart, threading the shedder's state."""
    config = LoadBalancerConfig(**knobs)
    shedder = make_shedder(name)
    state = shedder.initial_state() if state is None else state
    results = []
    for i in range(cycles):
        state, res = shedder.find_bundles_for_unloading(
            view, config, state, now_ms=NOW_MS + i * CYCLE_MS, cycle=f"c{i}"
        )
        results.append(res)
    return state, results


def once(name: str, view: ClusterView, **knobs: Any) -> PolicyResult:
    return run(name, view, **knobs)[1][0]


def reasons(res: PolicyResult) -> list[str]:
    return [s.reason for s in res.skips]


# -- registry -----------------------------------------------------------------------------------


def test_registry_maps_short_and_java_class_names_to_new_shedders() -> None:
    assert set(PULSAR_SHEDDERS) <= set(shedder_names())
    assert isinstance(make_shedder("ThresholdShedder"), ThresholdShedder)
    assert isinstance(
        make_shedder("org.apache.pulsar.broker.loadbalance.impl.OverloadShedder"), OverloadShedder
    )
    java = "org.apache.pulsar.broker.loadbalance.extensions.scheduler.TransferShedder"
    assert isinstance(make_shedder(java), TransferShedder)
    assert isinstance(make_shedder("UniformLoadShedder"), UniformLoadShedder)
    assert make_shedder("TransferShedder") is not make_shedder("TransferShedder")
    assert all(SHEDDERS[n].name == n for n in shedder_names())


def test_registry_rejects_an_unknown_name() -> None:
    with pytest.raises(InvalidInput) as e:
        make_shedder("LeastLongTermMessageRate")
    assert e.value.field == "loadBalancerLoadSheddingStrategy"


@pytest.mark.parametrize("name", PULSAR_SHEDDERS)
def test_a_single_broker_is_never_shed(name: str) -> None:
    res = once(name, cluster(B(0.99, [50 * MB, 50 * MB])))
    assert res.decisions == () and reasons(res) == ["NoBrokers"]


# -- ThresholdShedder ---------------------------------------------------------------------------


def test_threshold_documented_example_sheds_nothing_without_lower_boundary() -> None:
    # 10 brokers at 80 % and one at 0 %: avg 72.73 %, trigger 82.73 %: nobody is above it.
    view = cluster(*[B(0.8, [100 * MB, 60 * MB, 40 * MB])] * 10, B(0.0, [MB, MB]))
    res = once("ThresholdShedder", view)
    assert res.decisions == ()
    assert reasons(res) == ["Balanced"]
    assert "avg=0.7273 trigger=0.8273" in res.skips[0].detail


def test_threshold_lower_boundary_sheds_t_times_half_of_the_busiest_broker() -> None:
    view = cluster(*[B(0.8, [100 * MB, 60 * MB, 40 * MB])] * 10, B(0.0, [MB, MB]))
    res = once("ThresholdShedder", view, lowerBoundarySheddingEnabled=True)
    (d,) = res.decisions
    # all ten tie at 80 %: the first by name; (thrIn + thrOut) x t x 0.5 = 200 MB x 0.1 x 0.5
    assert (d.kind, d.reason, d.source_broker, d.destination_broker) == (
        UNLOAD,
        "Underloaded",
        "b00",
        None,
    )
    assert d.inputs["minThroughputToOffloadBytesPerS"] == pytest.approx(10 * MB)
    assert d.bundle == bundle(0) and d.inputs["bundleShortTermThroughputBytesPerS"] == 100 * MB


def test_threshold_lower_boundary_respects_the_10_mb_minimum() -> None:
    # 100 MB/s x 0.1 x 0.5 = 5 MB/s < 10 MB/s
    view = cluster(*[B(0.8, [50 * MB, 50 * MB])] * 10, B(0.0, [MB, MB]))
    res = once("ThresholdShedder", view, lowerBoundarySheddingEnabled=True)
    assert res.decisions == () and reasons(res) == ["BelowMinThroughput"]


def test_threshold_sheds_enough_from_a_broker_above_average_plus_threshold() -> None:
    view = cluster(B(0.9, [20 * MB] * 5), B(0.3, [5 * MB, 5 * MB]), B(0.3, [5 * MB, 5 * MB]))
    res = once("ThresholdShedder", view)
    # avg 0.5, t 0.1: (0.9 - 0.6 + 0.05) x 100 MB = 35 MB -> two 20 MB bundles, first by name
    assert [d.bundle for d in res.decisions] == [bundle(0), bundle(1)]
    assert {d.reason for d in res.decisions} == {"Overloaded"}
    assert res.decisions[0].inputs["minThroughputToOffloadBytesPerS"] == pytest.approx(35 * MB)
    assert res.decisions[0].inputs["avgUsage"] == pytest.approx(0.5)


def test_threshold_skips_small_targets_single_bundles_and_zero_average() -> None:
    small = cluster(B(0.9, [10 * MB, 10 * MB]), B(0.3, [MB, MB]), B(0.3, [MB, MB]))
    assert reasons(once("ThresholdShedder", small)) == ["BelowMinThroughput"]
    sole = cluster(B(0.9, [200 * MB]), B(0.3, [MB, MB]), B(0.3, [MB, MB]))
    res = once("ThresholdShedder", sole)
    assert res.decisions == () and reasons(res) == ["HighUsageSingleBundle"]
    assert res.skips[0].bundle == bundle(0)
    idle = cluster(B(0.0, [MB, MB]), B(0.0, [MB, MB]))
    assert reasons(once("ThresholdShedder", idle)) == ["NoLoadData"]


def test_threshold_selects_by_short_term_throughput_not_the_latest_sample() -> None:
    # the latest report says bundle 0 is biggest; its short-term average says bundle 1 is
    view = cluster(
        B(0.9, [90 * MB, 10 * MB]),
        B(0.3, [MB, MB]),
        B(0.3, [MB, MB]),
        short_term={bundle(0): 10 * MB, bundle(1): 90 * MB},
    )
    assert [d.bundle for d in once("ThresholdShedder", view).decisions] == [bundle(1)]


# -- OverloadShedder ----------------------------------------------------------------------------


def test_overload_sheds_largest_short_term_first_until_the_target_is_covered() -> None:
    # usage 1.2 (unweighted CPU 120 %): (1.2 - 0.85 + 0.05) x 10 MB = 4 MB -> 3 MB + 2.5 MB
    view = cluster(B(1.2, [1 * MB, 3 * MB, 1.5 * MB, 2.5 * MB, 2 * MB]), B(0.2, [MB]))
    res = once("OverloadShedder", view)
    assert [d.bundle for d in res.decisions] == [bundle(1), bundle(3)]
    d = res.decisions[0]
    assert (d.kind, d.reason, d.source_broker, d.destination_broker) == (
        UNLOAD,
        "Overloaded",
        "b00",
        None,
    )
    assert d.inputs["minThroughputToOffloadBytesPerS"] == pytest.approx(4 * MB)
    assert d.inputs["brokerMaxResourceUsage"] == pytest.approx(1.2)


def test_overload_sheds_at_least_one_bundle_and_reads_unweighted_current_usage() -> None:
    # target 0.15 x 100 MB = 15 MB: the largest bundle alone covers it
    view = cluster(B(0.95, [50 * MB, 30 * MB, 20 * MB]), B(0.2, [MB]))
    assert [d.bundle for d in once("OverloadShedder", view).decisions] == [bundle(0)]
    # a history usage of 0 does not matter: OverloadShedder reads the report's max usage
    hot = view.brokers["b00"]
    view = ClusterView(
        brokers=MappingProxyType(
            {
                **view.brokers,
                "b00": BrokerView(
                    hot.report, 0.0, hot.msg_throughput_ema, hot.time_average, hot.updated_at_ms
                ),
            }
        ),
        bundle_data=view.bundle_data,
    )
    assert len(once("OverloadShedder", view).decisions) == 1


def test_overload_single_bundle_warns_and_below_threshold_is_balanced() -> None:
    res = once("OverloadShedder", cluster(B(0.95, [50 * MB]), B(0.2, [MB])))
    assert res.decisions == () and reasons(res) == ["HighUsageSingleBundle"]
    assert (res.skips[0].broker, res.skips[0].bundle) == ("b00", bundle(0))
    res = once("OverloadShedder", cluster(B(0.84, [50 * MB, MB]), B(0.2, [MB])))
    assert res.decisions == () and reasons(res) == ["Balanced"]


def test_overload_skips_recently_unloaded_bundles() -> None:
    view = cluster(
        B(0.95, [50 * MB, 30 * MB, 20 * MB]), B(0.2, [MB]), recently={bundle(0): NOW_MS - 1000}
    )
    assert [d.bundle for d in once("OverloadShedder", view).decisions] == [bundle(1)]
    gone = {bundle(i): NOW_MS - 1000 for i in range(3)}
    view = cluster(B(0.95, [50 * MB, 30 * MB, 20 * MB]), B(0.2, [MB]), recently=gone)
    assert reasons(once("OverloadShedder", view)) == ["NoBundles"]


def test_overload_never_takes_the_last_bundle_even_when_the_target_wants_all() -> None:
    view = cluster(B(1.5, [MB, MB, MB]), B(0.2, [MB]))  # target 0.7 x 3 MB > 2 MB
    assert len(once("OverloadShedder", view).decisions) == 2


# -- UniformLoadShedder -------------------------------------------------------------------------


def test_uniform_msg_rate_rule_moves_a_fifth_of_the_gap_with_the_1000_delta() -> None:
    # 10,000 vs 2,000 msg/s: +400 % > 50 %; amount int(8,000 x 0.2) = 1,600 msg/s.
    # Bundles 4,000 / 3,000 / 2,000 / 1,000 msg/s: only 2,000 <= 1,600 + 1,000; after it the
    # remaining is -400 and 1,000 > -400 + 1,000.
    rates = [4000.0, 3000.0, 2000.0, 1000.0]
    view = cluster(B(0.5, [MB] * 4, rates=rates), B(0.2, [MB], rate=2000.0))
    res = once("UniformLoadShedder", view)
    assert [d.bundle for d in res.decisions] == [bundle(2)]
    d = res.decisions[0]
    assert (d.source_broker, d.reason, d.kind) == ("b00", "Overloaded", UNLOAD)
    assert d.inputs["amountToUnload"] == 1600 and d.inputs["rule"] == "msgRate"
    assert d.inputs["msgRateDifferencePercent"] == pytest.approx(400.0)


def test_uniform_keeps_taking_small_bundles_after_the_remaining_goes_negative() -> None:
    # amount 1,600: 2,500 <= 2,600 (remaining -900), then 50 <= -900 + 1,000
    view = cluster(
        B(0.5, [MB] * 3, rates=[2500.0, 1450.0, 50.0], rate=10_000.0), B(0.2, [MB], rate=2000.0)
    )
    assert [d.bundle for d in once("UniformLoadShedder", view).decisions] == [bundle(0), bundle(2)]


def test_uniform_throughput_multiplier_rule_when_rates_are_even() -> None:
    # equal msg rates; throughput 50 MB vs 5 MB = 10x > 4x; amount int(45 MB x 0.2) = 9 MB
    view = cluster(
        B(0.5, [30 * MB, 8 * MB, 7 * MB, 5 * MB], rate=1000.0),
        B(0.2, [5 * MB], rate=1000.0),
    )
    res = once("UniformLoadShedder", view)
    assert [d.bundle for d in res.decisions] == [bundle(1)]  # 30 MB > 9 MB + 1000 B
    assert res.decisions[0].inputs["rule"] == "msgThroughput"
    assert res.decisions[0].inputs["amountToUnload"] == int(45 * MB * 0.2)


def test_uniform_sheds_only_from_the_single_max_broker() -> None:
    view = cluster(
        B(0.5, [MB] * 4, rates=[3000.0] * 4),
        B(0.5, [MB] * 4, rates=[2900.0] * 4),
        B(0.2, [MB], rate=1000.0),
    )
    res = once("UniformLoadShedder", view)
    assert res.decisions and {d.source_broker for d in res.decisions} == {"b00"}


def test_uniform_caps_bundles_per_cycle_and_keeps_the_last_one() -> None:
    view = cluster(B(0.5, [MB] * 6, rates=[1000.0] * 6), B(0.2, [MB], rate=100.0))
    assert len(once("UniformLoadShedder", view, maxUnloadBundleNumPerShedding=2).decisions) == 2
    # moving the whole gap (5,900 msg/s) would take all six 1,000 msg/s bundles: one stays
    assert len(once("UniformLoadShedder", view, maxUnloadPercentage=1.0).decisions) == 5


def test_uniform_minimum_single_bundle_and_balanced_skips() -> None:
    # 3,000 vs 1,000 msg/s: +200 %, but int(2,000 x 0.2) = 400 < minUnloadMessage 1,000
    small = cluster(B(0.5, [MB, MB], rates=[1500.0, 1500.0]), B(0.2, [MB], rates=[1000.0]))
    assert reasons(once("UniformLoadShedder", small)) == ["BelowMinUnload"]
    sole = cluster(B(0.5, [MB], rates=[50_000.0]), B(0.2, [MB], rates=[1000.0]))
    assert reasons(once("UniformLoadShedder", sole)) == ["HighUsageSingleBundle"]
    even = cluster(B(0.5, [MB, MB]), B(0.2, [MB, MB]))
    assert reasons(once("UniformLoadShedder", even)) == ["Balanced"]


# -- invariants over random clusters ------------------------------------------------------------

broker_specs = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=1.3),
        st.lists(st.floats(min_value=0.0, max_value=300 * MB), max_size=20),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    broker_specs,
    st.sampled_from(PULSAR_SHEDDERS),
    st.booleans(),
    st.booleans(),
    st.data(),
)
def test_decisions_respect_the_invariants_and_are_deterministic(
    specs: list[tuple[float, list[float]]], name: str, lower: bool, transfer: bool, data: Any
) -> None:
    total = sum(len(thrs) for _, thrs in specs)
    picked = data.draw(st.sets(st.integers(0, max(total - 1, 0)), max_size=max(total // 3, 1)))
    recently = {bundle(i): NOW_MS - 60_000 for i in picked if i < total}
    shared = data.draw(st.sets(st.integers(0, max(total - 1, 0)), max_size=2)) if total else set()
    brokers = [B(u, thrs) for u, thrs in specs]
    if len(brokers) > 1:  # a hand-over caught mid-way: the last broker also reports these
        brokers[-1].extra = tuple(bundle(i) for i in sorted(shared) if i < total)
    view = cluster(*brokers, recently=recently)
    knobs = {
        "lowerBoundarySheddingEnabled": lower,
        "loadBalancerTransferEnabled": transfer,
        "loadBalancerSheddingConditionHitCountThreshold": 1,
    }
    first = run(name, view, 4, **knobs)
    assert first == run(name, view, 4, **knobs), "same input, same output"
    event(f"{name} {'sheds' if any(r.decisions for r in first[1]) else 'holds'}")
    for res in first[1]:
        seen: set[str] = set()
        shed_from: dict[str, int] = {}
        for d in res.decisions:
            assert d.bundle not in seen, "a bundle is named once per cycle"
            seen.add(d.bundle)
            assert d.bundle not in recently
            assert d.source_broker in view.brokers
            assert d.bundle in view.brokers[d.source_broker].bundles
            assert d.destination_broker != d.source_broker
            if d.kind == TRANSFER:
                assert d.destination_broker in view.brokers
            else:
                assert d.kind == UNLOAD and d.destination_broker is None
            assert d.strategy == name and d.reason in ("Overloaded", "Underloaded")
            shed_from[d.source_broker] = shed_from.get(d.source_broker, 0) + 1
        for broker, n in shed_from.items():
            assert n < len(view.brokers[broker].bundles), "a broker keeps its last bundle"
