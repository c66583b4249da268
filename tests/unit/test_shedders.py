"""The four Pulsar shedders: the reference's worked examples and invariants over random clusters."""

from __future__ import annotations

from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadbalance.config import LoadBalancerConfig
from loadbalance.decisions import TRANSFER, UNLOAD
from loadbalance.model import LocalBrokerData, NamespaceBundleStats, ResourceUsage
from loadbalance.shedding.registry import SHEDDERS, make_shedder
from loadbalance.time_average import BundleData, TimeAverageBrokerData
from loadbalance.view import BrokerView, ClusterView

MB = 1024 * 1024
NS = "t/ns"


def _bundle(i: int) -> str:
    lo = i * 0x100000
    return f"{NS}/0x{lo:08x}_0x{lo + 0x100000:08x}"


def _cluster(
    spec: list[tuple[float, list[float]]],
    *,
    recently: dict[str, int] | None = None,
    rates: list[float] | None = None,
) -> ClusterView:
    """spec: per broker (usage fraction, [bundle throughputs in bytes/s])."""
    brokers, data, n = {}, {}, 0
    for i, (usage, thrs) in enumerate(spec):
        names = []
        stats = {}
        for thr in thrs:
            b = _bundle(n)
            n += 1
            names.append(b)
            rate = thr / 1000.0
            s = NamespaceBundleStats(rate / 2, rate / 2, thr / 2, thr / 2, 5, 1, 1)
            stats[b] = s
            data[b] = BundleData.new().update(s)
        total_thr = sum(thrs)
        msg_rate = rates[i] if rates else total_thr / 1000.0
        report = LocalBrokerData(
            broker=f"b{i:02d}",
            cpu=ResourceUsage(usage * 100, 100),
            msg_throughput_in=total_thr / 2,
            msg_throughput_out=total_thr / 2,
            msg_rate_in=msg_rate / 2,
            msg_rate_out=msg_rate / 2,
            bundles=frozenset(names),
            last_stats=MappingProxyType(stats),
            last_update_ms=1_000_000,
        )
        brokers[report.broker] = BrokerView(
            report,
            usage,
            float(total_thr),
            TimeAverageBrokerData.of(data[b] for b in names),
            1_000_000,
        )
    return ClusterView(
        brokers=MappingProxyType(brokers),
        bundle_data=MappingProxyType(data),
        recently_unloaded=MappingProxyType(recently or {}),
    )


def _run(name: str, view: ClusterView, cycles: int = 1, **knobs: object):
    cfg = LoadBalancerConfig(**knobs)
    shedder = make_shedder(name)
    state = shedder.initial_state()
    results = []
    for i in range(cycles):
        state, res = shedder.find_bundles_for_unloading(
            view, cfg, state, now_ms=1_000_000 + i * 60_000, cycle=str(i)
        )
        results.append(res)
    return results


def test_threshold_shedder_documented_example_sheds_nothing_without_lower_boundary() -> None:
    # 11 brokers, 10 at 80 % and 1 at 0 %: avg 72.73 %, trigger 82.73 %.
    view = _cluster([(0.8, [20 * MB, 20 * MB])] * 10 + [(0.0, [1 * MB, 1 * MB])])
    res = _run("ThresholdShedder", view)[0]
    assert res.decisions == ()
    assert "avg=0.7273 trigger=0.8273" in res.skips[0].detail


def test_threshold_shedder_lower_boundary_sheds_the_documented_amount() -> None:
    view = _cluster([(0.8, [100 * MB, 60 * MB, 40 * MB])] * 10 + [(0.0, [1 * MB, 1 * MB])])
    res = _run("ThresholdShedder", view, lowerBoundarySheddingEnabled=True)[0]
    assert len(res.decisions) == 1
    d = res.decisions[0]
    assert d.reason == "Underloaded" and d.kind == UNLOAD
    assert d.inputs["minThroughputToOffload"] == pytest.approx(200 * MB * 0.10 * 0.5)
    assert d.bundle == _bundle(27)  # largest bundle of the highest broker (last by name on tie)


def test_threshold_shedder_sheds_above_average_plus_threshold() -> None:
    view = _cluster([(0.9, [60 * MB, 30 * MB, 10 * MB]), (0.3, [5 * MB]), (0.3, [5 * MB])])
    res = _run("ThresholdShedder", view)[0]
    # avg 0.5, t 0.1: fraction 0.9 - 0.6 + 0.05 = 0.35 of 100 MB -> the 60 MB bundle suffices
    assert [d.bundle for d in res.decisions] == [_bundle(0)]
    assert res.decisions[0].inputs["minThroughputToOffload"] == pytest.approx(35 * MB)


@pytest.mark.parametrize("usages", [[0.12, 0.02, 0.01, 0.01], [0.5] * 5 + [0.0]])
def test_transfer_shedder_motivating_cases(usages: list[float]) -> None:
    spec = [(u, [u * 100 * MB / 6] * 6 if u else [MB, MB]) for u in usages]
    view = _cluster(spec)
    assert all(r.decisions == () for r in _run("ThresholdShedder", view, 5))
    results = _run("TransferShedder", view, 5)
    assert [r.skips[-1].reason for r in results[:3]] == ["HitCount"] * 3
    assert results[3].decisions, "the 4th consecutive hit sheds"
    for d in results[3].decisions:
        assert d.kind == TRANSFER and d.destination_broker != d.source_broker
    low = min(view.brokers.values(), key=lambda b: (b.history_usage, b.broker)).broker
    assert any(d.destination_broker == low for d in results[3].decisions)


def test_transfer_shedder_plain_unload_when_transfer_disabled() -> None:
    view = _cluster([(0.9, [30 * MB, 30 * MB, 30 * MB]), (0.1, [5 * MB, 5 * MB])])
    res = _run("TransferShedder", view, 4, loadBalancerTransferEnabled=False)[3]
    assert res.decisions and all(
        d.kind == UNLOAD and d.destination_broker is None for d in res.decisions
    )


def test_overload_shedder_sheds_enough_largest_first() -> None:
    view = _cluster([(0.95, [50 * MB, 30 * MB, 20 * MB]), (0.2, [MB])])
    res = _run("OverloadShedder", view)[0]
    # target (0.95 - 0.85 + 0.05) x 100 MB = 15 MB: the largest bundle alone covers it
    assert [d.bundle for d in res.decisions] == [_bundle(0)]
    assert res.decisions[0].reason == "Overloaded"


def test_overload_shedder_single_bundle_and_below_threshold() -> None:
    res = _run("OverloadShedder", _cluster([(0.95, [50 * MB]), (0.2, [MB])]))[0]
    assert res.decisions == () and res.skips[0].reason == "HighUsageSingleBundle"
    res = _run("OverloadShedder", _cluster([(0.80, [50 * MB, MB]), (0.2, [MB])]))[0]
    assert res.decisions == ()


def test_uniform_load_shedder_msg_rate_rule_and_delta() -> None:
    # rates 10,000 vs 2,000 msg/s: diff 400 % > 50 %; amount 0.2 x 8,000 = 1,600 msg/s
    view = _cluster([(0.5, [4e6, 3e6, 2e6, 1e6]), (0.2, [2e6])], rates=[10_000.0, 2_000.0])
    res = _run("UniformLoadShedder", view)[0]
    # bundle rates 4000, 3000, 2000, 1000: taken when rate <= remaining + 1000
    assert [d.inputs["bundleMetric"] for d in res.decisions] == [2000.0]
    assert all(d.source_broker == "b00" for d in res.decisions)


def test_uniform_load_shedder_cap_and_minimum() -> None:
    view = _cluster([(0.5, [1e6] * 6), (0.2, [1e5])], rates=[100_000.0, 1_000.0])
    res = _run("UniformLoadShedder", view, maxUnloadBundleNumPerShedding=2)[0]
    assert len(res.decisions) == 2
    small = _cluster([(0.5, [1e5, 1e5]), (0.2, [1e5])], rates=[3000.0, 1000.0])
    res = _run("UniformLoadShedder", small)[0]
    assert res.decisions == () and res.skips[0].reason == "BelowMinUnload"


cluster_spec = st.lists(
    st.tuples(
        st.floats(min_value=0, max_value=1.2),
        st.lists(st.floats(min_value=0, max_value=200 * MB), min_size=0, max_size=8),
    ),
    min_size=1,
    max_size=10,
)


@settings(max_examples=60, deadline=None)
@given(cluster_spec, st.sampled_from(sorted(SHEDDERS)), st.data())
def test_invariants_over_random_clusters(spec, name: str, data) -> None:
    total = sum(len(t) for _, t in spec)
    recent_idx = data.draw(st.sets(st.integers(0, max(total - 1, 0)), max_size=3))
    recently = {_bundle(i): 999_000 for i in recent_idx if i < total}
    view = _cluster(spec, recently=recently)
    runs = _run(name, view, 5, lowerBoundarySheddingEnabled=True)
    again = _run(name, view, 5, lowerBoundarySheddingEnabled=True)
    assert runs == again, "deterministic"
    for res in runs:
        seen: set[str] = set()
        per_source: dict[str, int] = {}
        for d in res.decisions:
            assert d.bundle not in seen
            seen.add(d.bundle)
            assert d.destination_broker != d.source_broker
            assert d.bundle not in recently
            src = view.brokers[d.source_broker]
            assert d.bundle in src.bundles
            per_source[d.source_broker] = per_source.get(d.source_broker, 0) + 1
        for broker, n in per_source.items():
            assert n < len(view.brokers[broker].bundles), "a broker's last bundle stays"


def test_transfer_shedder_swaps_when_one_bundle_would_overshoot() -> None:
    # max broker 60 + 40 MB, target 100 x 0.4 / 0.9 = 44 MB: the 60 MB bundle overshoots, so it
    # goes to the min broker and the min broker's 32 MB bundle comes back: 72 / 68 MB after.
    view = _cluster([(0.9, [60 * MB, 40 * MB]), (0.1, [32 * MB, 8 * MB])])
    res = _run("TransferShedder", view, 4)[3]
    moves = {(d.bundle, d.source_broker, d.destination_broker) for d in res.decisions}
    assert (_bundle(0), "b00", "b01") in moves
    assert (_bundle(2), "b01", "b00") in moves
    assert len(moves) == 2
