"""Pulsar's ``TransferShedderTest`` (``extensions/scheduler``), restated on this model.

Every test names the Pulsar method it mirrors. The fixture is Pulsar's ``setupContext``: five
brokers at 2, 4, 6, 80 and 90 % CPU (``weightedMaxEMA`` 0.02 ... 0.9), each with two bundles
of its namespace whose outbound throughputs are (1, 2), (1, 3), (2, 4), (2, 6) and (2, 7)
MB/s (decimal, as Pulsar writes them), a report throughput of 1 B/s in plus the bundles' sum
out, and ``loadBalancerSheddingConditionHitCountThreshold = 0`` as Pulsar's ``getContext``
sets. Pulsar's test runs in debug mode, where a swap's gain is subtracted from the traffic
marked to offload, which this shedder always does. Bundle names are written canonically
(lower-case hex, as the report codec and ``make_decision`` spell them); Pulsar's test writes
``0x0FFFFFFF``.

The policy cases (``testBundlesWithIsolationPolicies``, ``testBundlesWithAntiAffinityGroup``,
``testIsLoadBalancerSheddingBundlesWithPoliciesEnabled``) are in ``test_shedding_policies.py``.
Not ported: ``testFilterHasException`` and ``testGetAvailableBrokersFailed`` (no filter or
broker registry call can fail inside a pure cycle).
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from loadbalance.cycle import ingest_kwargs
from loadbalance.model import ResourceUsage
from loadbalance.shedding.transfer_shedder import TransferShedderState, _LoadStats
from loadbalance.view import LoadState, build_view, ingest_many
from tests.conformance.pulsar_fixtures import (
    NOW_MS,
    Broker,
    config,
    moves,
    reasons,
    shed,
    thr_out,
    view_of,
)

HIT0 = {"loadBalancerSheddingConditionHitCountThreshold": 0}
SETUP_LOAD_AVG = 0.36400000000000005
SETUP_LOAD_STD = 0.3982762860126121

D1 = "my-tenant/my-namespaceD/0x00000000_0x0fffffff"
D2 = "my-tenant/my-namespaceD/0x0fffffff_0xffffffff"
E1 = "my-tenant/my-namespaceE/0x00000000_0x0fffffff"
E2 = "my-tenant/my-namespaceE/0x0fffffff_0xffffffff"
C1 = "my-tenant/my-namespaceC/0x00000000_0x0fffffff"


def b(n: int) -> str:
    return f"broker{n}:8080"


def two_bundles(ns: str, load1: float, load2: float) -> dict:
    """``getTopBundlesLoad(prefix, load1, load2)``."""
    return {
        f"my-tenant/{ns}/0x00000000_0x0fffffff": thr_out(load1),
        f"my-tenant/{ns}/0x0fffffff_0xffffffff": thr_out(load2),
    }


def five_bundles(ns: str, *loads: float) -> dict:
    """``getTopBundlesLoad(prefix, load1, ..., load5)``."""
    ranges = ["0x00000000_0x1fffffff", "0x1fffffff_0x2fffffff", "0x2fffffff_0x3fffffff"]
    ranges += ["0x3fffffff_0x4fffffff", "0x4fffffff_0x5fffffff"]
    return {f"my-tenant/{ns}/{r}": thr_out(x) for r, x in zip(ranges, loads, strict=True)}


SETUP = {
    1: (0.02, "my-namespaceA", 1_000_000, 2_000_000),
    2: (0.04, "my-namespaceB", 1_000_000, 3_000_000),
    3: (0.06, "my-namespaceC", 2_000_000, 4_000_000),
    4: (0.80, "my-namespaceD", 2_000_000, 6_000_000),
    5: (0.90, "my-namespaceE", 2_000_000, 7_000_000),
}


def setup_brokers() -> dict[str, Broker]:
    return {b(n): Broker(load, two_bundles(ns, x, y)) for n, (load, ns, x, y) in SETUP.items()}


def load_stats(view, **knobs) -> _LoadStats:
    brokers = sorted(view.brokers.values(), key=lambda v: (v.history_usage, v.broker))
    return _LoadStats(brokers, config(**knobs))


def test_setup_context_load_stats() -> None:
    """The avg/std every ``setupContext`` test asserts (``setupLoadAvg``/``setupLoadStd``)."""
    stats = load_stats(view_of(setup_brokers()))
    assert stats.avg == pytest.approx(SETUP_LOAD_AVG, abs=1e-12)
    assert stats.std == pytest.approx(SETUP_LOAD_STD, abs=1e-12)


def test_empty_broker_load_data() -> None:
    """TransferShedderTest.testEmptyBrokerLoadData"""
    _, res = shed("TransferShedder", view_of({}), **HIT0)
    assert res.decisions == () and reasons(res) == ["NoBrokers"]


def test_no_owner_load_data() -> None:
    """TransferShedderTest.testNoOwnerLoadData: the top bundles are reported but the max
    brokers do not own them (Pulsar: ``channel.isOwner`` false) -> NoBundles."""
    brokers = {k: replace(v, stats_not_owned=True) for k, v in setup_brokers().items()}
    _, res = shed("TransferShedder", view_of(brokers), **HIT0)
    assert res.decisions == () and reasons(res)[-1] == "NoBundles"


def test_empty_top_bundles_load_data() -> None:
    """TransferShedderTest.testEmptyTopBundlesLoadData: brokers own bundles but report no
    bundle stats -> NoLoadData."""
    brokers = {
        k: replace(v, bundles={}, thr_out=2.0, owned_without_stats=tuple(v.bundles))
        for k, v in setup_brokers().items()
    }
    _, res = shed("TransferShedder", view_of(brokers), **HIT0)
    assert res.decisions == () and reasons(res)[-1] == "NoLoadData"


def test_outdated_load_data() -> None:
    """TransferShedderTest.testOutDatedLoadData"""
    _, res = shed("TransferShedder", view_of(setup_brokers()), **HIT0)
    assert len(res.decisions) == 2
    old = {k: replace(v, updated_at_ms=0) for k, v in setup_brokers().items()}
    _, res = shed("TransferShedder", view_of(old), **HIT0)
    assert res.decisions == () and "OutDatedData" in reasons(res)


def test_recently_unloaded_brokers() -> None:
    """TransferShedderTest.testRecentlyUnloadedBrokers"""
    view = view_of(setup_brokers())
    ttl_s = config().load_balancer_broker_load_data_ttl_in_seconds
    old_ts = NOW_MS - ttl_s * 1001
    state = TransferShedderState(0, {b(1): old_ts})
    _, res = shed("TransferShedder", view, state, **HIT0)
    assert moves(res) == {(b(5), E1, b(1)), (b(4), D1, b(2))}
    assert {d.reason for d in res.decisions} == {"Overloaded"}
    _, res = shed("TransferShedder", view, TransferShedderState(0, {b(1): NOW_MS}), **HIT0)
    assert res.decisions == () and reasons(res) == ["CoolDown"]


def test_recently_unloaded_bundles() -> None:
    """TransferShedderTest.testRecentlyUnloadedBundles"""
    recent = dict.fromkeys([E1, E2, D1, D2], NOW_MS)
    _, res = shed("TransferShedder", view_of(setup_brokers(), recently_unloaded=recent), **HIT0)
    assert moves(res) == {(b(3), C1, b(1))}
    assert {d.reason for d in res.decisions} == {"Overloaded"}


def test_target_std() -> None:
    """TransferShedderTest.testTargetStd: std 0.0816 under the 0.25 target, nobody under- or
    overloaded -> no decision (Pulsar counts it as a HitCount skip; here ``Balanced``)."""
    brokers = {
        b(1): Broker(0.10, two_bundles("my-namespaceA", 30, 30)),
        b(2): Broker(0.20, two_bundles("my-namespaceB", 40, 40)),
        b(3): Broker(0.30, two_bundles("my-namespaceC", 50, 50)),
    }
    view = view_of(brokers)
    stats = load_stats(view)
    assert stats.avg == pytest.approx(0.2000000063578288, abs=1e-7)
    assert stats.std == pytest.approx(0.08164966587949089, abs=1e-7)
    _, res = shed("TransferShedder", view, **HIT0)
    assert res.decisions == () and reasons(res) == ["Balanced"]


def test_single_top_bundles_load_data() -> None:
    """TransferShedderTest.testSingleTopBundlesLoadData"""
    brokers = setup_brokers()
    for n, (ns, x) in enumerate([("A", 1), ("B", 2), ("C", 6), ("D", 10), ("E", 70)], start=1):
        bundles = {f"my-tenant/my-namespace{ns}/0x00000000_0x0fffffff": thr_out(x)}
        brokers[b(n)] = replace(brokers[b(n)], bundles=bundles, thr_out=brokers[b(n)].thr_out)
    # the report throughput stays what getCpuLoad computed before the top bundles changed
    for n, (_, _, x, y) in SETUP.items():
        brokers[b(n)].thr_out = x + y
    _, res = shed("TransferShedder", view_of(brokers), **HIT0)
    assert res.decisions == () and reasons(res)[-1] == "NoBundles"


def test_bundle_throughput_larger_than_offload_threshold() -> None:
    """TransferShedderTest.testBundleThroughputLargerThanOffloadThreshold"""
    brokers = setup_brokers()
    brokers[b(4)] = replace(
        brokers[b(4)], bundles=two_bundles("my-namespaceD", 1e9, 1e9), thr_out=8_000_000
    )
    brokers[b(5)] = replace(
        brokers[b(5)], bundles=two_bundles("my-namespaceE", 1e9, 1e9), thr_out=9_000_000
    )
    _, res = shed("TransferShedder", view_of(brokers), **HIT0)
    assert moves(res) == {(b(3), C1, b(1))}
    assert {d.reason for d in res.decisions} == {"Overloaded"}


def test_zero_bundle_throughput() -> None:
    """TransferShedderTest.testZeroBundleThroughput"""
    brokers = setup_brokers()
    for n, (_, ns, x, y) in SETUP.items():
        brokers[b(n)] = replace(brokers[b(n)], bundles=two_bundles(ns, 0, 0), thr_out=x + y)
    _, res = shed("TransferShedder", view_of(brokers), **HIT0)
    assert res.decisions == () and reasons(res)[-1] == "NoBundles"


def test_target_std_after_transfer() -> None:
    """TransferShedderTest.testTargetStdAfterTransfer"""
    brokers = setup_brokers()
    brokers[b(4)].load, brokers[b(5)].load = 0.55, 0.65
    view = view_of(brokers)
    stats = load_stats(view)
    assert (stats.avg, stats.std) == pytest.approx((0.26400000000000007, 0.27644891028904417))
    _, res = shed("TransferShedder", view, **HIT0)
    assert moves(res) == {(b(5), E1, b(1))}
    assert {d.reason for d in res.decisions} == {"Overloaded"}


def two_broker_context(a: dict, a_load: float, bb: dict, b_load: float) -> dict[str, Broker]:
    return {b(1): Broker(a_load, a), b(2): Broker(b_load, bb)}


def std_after(res, view, **knobs) -> float:
    """LoadStats.std after the cycle's offloads, re-derived from the decisions' inputs."""
    stats = load_stats(view, **knobs)
    pairs: dict[tuple[float, float], float] = {}
    for d in res.decisions:
        key = (d.inputs["maxBrokerLoad"], d.inputs["minBrokerLoad"])
        pairs[key] = d.inputs["netThroughputMovedBytesPerS"]
    for (max_load, min_load), net in pairs.items():
        src = next(v for v in view.brokers.values() if v.history_usage == max_load)
        stats.offload(max_load, min_load, net * max_load / src.report.msg_throughput)
    return stats.std


def test_unload_bundles_greater_than_target_throughput() -> None:
    """TransferShedderTest.testUnloadBundlesGreaterThanTargetThroughput: three of broker2's
    bundles move (100 + 180 MB, then 220 MB with a swap of broker1's four smallest bundles)."""
    brokers = two_broker_context(
        five_bundles("my-namespaceA", 1e6, 2e6, 3e6, 4e6, 5e6),
        0.10,
        five_bundles("my-namespaceB", 100e6, 180e6, 220e6, 250e6, 250e6),
        10.0,
    )
    view = view_of(brokers)
    stats = load_stats(view)
    assert (stats.avg, stats.std) == pytest.approx((5.05, 4.95))
    _, res = shed("TransferShedder", view, **HIT0)
    a = "my-tenant/my-namespaceA/"
    bb = "my-tenant/my-namespaceB/"
    assert moves(res) == {
        (b(2), bb + "0x00000000_0x1fffffff", b(1)),
        (b(2), bb + "0x1fffffff_0x2fffffff", b(1)),
        (b(2), bb + "0x2fffffff_0x3fffffff", b(1)),
        (b(1), a + "0x00000000_0x1fffffff", b(2)),
        (b(1), a + "0x1fffffff_0x2fffffff", b(2)),
        (b(1), a + "0x2fffffff_0x3fffffff", b(2)),
        (b(1), a + "0x3fffffff_0x4fffffff", b(2)),
    }
    assert {d.reason for d in res.decisions} == {"Overloaded"}
    assert std_after(res, view) == pytest.approx(0.050000004900021836, abs=1e-6)


def test_skip_bundles_greater_than_target_throughput_after_split() -> None:
    """TransferShedderTest.testSkipBundlesGreaterThanTargetThroughputAfterSplit"""
    brokers = two_broker_context(
        two_bundles("my-namespaceA", 1, 500_000_000),
        0.50,
        two_bundles("my-namespaceB", 500_000_000, 500_000_000),
        1.00,
    )
    knobs = {**HIT0, "loadBalancerBrokerLoadTargetStd": 0.20}
    _, res = shed("TransferShedder", view_of(brokers), **knobs)
    assert res.decisions == () and reasons(res)[-1] == "NoBundles"


def test_unload_bundles_less_than_target_throughput_after_split() -> None:
    """TransferShedderTest.testUnloadBundlesLessThanTargetThroughputAfterSplit: the smaller
    top bundle (490 MB) fits the 495 MB target and moves; walked largest first, the 510 MB one
    would have stopped the pair with nothing moved."""
    brokers = two_broker_context(
        five_bundles("my-namespaceA", 1e6, 2e6, 3e6, 4e6, 5e6),
        0.10,
        two_bundles("my-namespaceB", 490_000_000, 510_000_000),
        10.0,
    )
    view = view_of(brokers)
    _, res = shed("TransferShedder", view, **HIT0)
    assert moves(res) == {(b(2), "my-tenant/my-namespaceB/0x00000000_0x0fffffff", b(1))}
    assert std_after(res, view) == pytest.approx(0.050000004900021836, abs=1e-6)


def test_unload_bundles_greater_than_target_throughput_after_split() -> None:
    """TransferShedderTest.testUnloadBundlesGreaterThanTargetThroughputAfterSplit: one 5 MB
    bundle of broker2 is swapped against one 2.4 MB bundle of broker1."""
    brokers = two_broker_context(
        two_bundles("my-namespaceA", 2_400_000, 2_400_000),
        0.48,
        two_bundles("my-namespaceB", 5_000_000, 5_000_000),
        1.00,
    )
    view = view_of(brokers)
    stats = load_stats(view)
    assert (stats.avg, stats.std) == pytest.approx((0.74, 0.26))
    _, res = shed("TransferShedder", view, **HIT0)
    assert sorted((s, d) for s, _, d in moves(res)) == [(b(1), b(2)), (b(2), b(1))]
    assert {d.reason for d in res.decisions} == {"Overloaded"}
    assert std_after(res, view) == pytest.approx(2.5809568279517847e-8, abs=1e-6)


@pytest.mark.parametrize(
    ("broker2", "reason2", "avg", "std"),
    [
        (Broker(0.04, {}, thr_ema=10), "Underloaded", 0.26400000000000007, 0.27644891028904417),
        (Broker(0.03, {}), "Underloaded", 0.262, 0.2780935094532054),
    ],
    ids=["testMinBrokerWithLowTraffic", "testMinBrokerWithLowerLoadThanAvg"],
)
def test_min_broker_underloaded(broker2: Broker, reason2: str, avg: float, std: float) -> None:
    """TransferShedderTest.testMinBrokerWithLowTraffic / testMinBrokerWithLowerLoadThanAvg:
    the second pair moves because broker2 is underloaded although std is under target."""
    brokers = setup_brokers()
    brokers[b(2)] = replace(broker2, bundles=brokers[b(2)].bundles)
    brokers[b(4)].load, brokers[b(5)].load = 0.55, 0.65
    view = view_of(brokers)
    stats = load_stats(view)
    assert (stats.avg, stats.std) == pytest.approx((avg, std))
    _, res = shed("TransferShedder", view, **HIT0)
    got = {(d.source_broker, d.bundle, d.destination_broker, d.reason) for d in res.decisions}
    assert got == {(b(5), E1, b(1), "Overloaded"), (b(4), D1, b(2), reason2)}


def test_max_number_of_transfers_per_shedder_cycle() -> None:
    """TransferShedderTest.testMaxNumberOfTransfersPerShedderCycle"""
    knobs = {**HIT0, "loadBalancerMaxNumberOfBrokerSheddingPerCycle": 10}
    _, res = shed("TransferShedder", view_of(setup_brokers()), **knobs)
    assert moves(res) == {(b(5), E1, b(1)), (b(4), D1, b(2))}


def test_load_balancer_shedding_condition_hit_count_threshold() -> None:
    """TransferShedderTest.testLoadBalancerSheddingConditionHitCountThreshold"""
    view = view_of(setup_brokers())
    state = None
    for i in range(3):
        state, res = shed(
            "TransferShedder",
            view,
            state,
            now_ms=NOW_MS + i,
            loadBalancerSheddingConditionHitCountThreshold=3,
        )
        assert res.decisions == () and reasons(res) == ["HitCount"]
    _, res = shed("TransferShedder", view, state, loadBalancerSheddingConditionHitCountThreshold=3)
    assert moves(res) == {(b(5), E1, b(1)), (b(4), D1, b(2))}


def test_remaining_top_bundles() -> None:
    """TransferShedderTest.testRemainingTopBundles"""
    brokers = setup_brokers()
    brokers[b(5)] = replace(
        brokers[b(5)], bundles=two_bundles("my-namespaceE", 2_000_000, 3_000_000), thr_out=9e6
    )
    _, res = shed("TransferShedder", view_of(brokers), **HIT0)
    assert moves(res) == {(b(5), E1, b(1)), (b(4), D1, b(2))}


def test_load_more_than_100() -> None:
    """TransferShedderTest.testLoadMoreThan100: loads of 200 % and 1000 % are taken as they
    are (``weightedMaxEMA`` 2.0 and 10.0)."""
    brokers = setup_brokers()
    brokers[b(4)].load, brokers[b(5)].load = 2.0, 10.0
    view = view_of(brokers)
    stats = load_stats(view)
    assert (stats.avg, stats.std) == pytest.approx((2.4240000000000004, 3.8633332758124816))
    _, res = shed("TransferShedder", view, **HIT0)
    assert moves(res) == {(b(5), E1, b(1)), (b(4), D1, b(2))}
    assert std_after(res, view) == pytest.approx(2.781643776903451, abs=1e-6)


def test_random_load() -> None:
    """TransferShedderTest.testRandomLoad (seeded): after a cycle, std is under target or no
    (max, min) pair is left."""
    rng = random.Random(7)
    for _ in range(5):
        brokers = {}
        for i in range(10):
            load = rng.randrange(1000)
            part = rng.randrange(load + 1)
            brokers[f"broker{i}:8080"] = Broker(
                load / 100, two_bundles(f"my-namespace{i}", part, load - part)
            )
        view = view_of(brokers)
        _, res = shed("TransferShedder", view, **HIT0)
        cfg = config(**HIT0)
        stats = load_stats(view)
        pairs: dict[tuple[float, float], float] = {}
        for d in res.decisions:
            pairs[(d.inputs["maxBrokerLoad"], d.inputs["minBrokerLoad"])] = d.inputs[
                "netThroughputMovedBytesPerS"
            ]
        for max_load, min_load in pairs:
            net = pairs[(max_load, min_load)]
            src = next(v for v in view.brokers.values() if v.history_usage == max_load)
            stats.offload(max_load, min_load, net * max_load / src.report.msg_throughput)
        # every pair walked used up one max broker; those that moved nothing left a skip
        walked = stats.pairs + sum(1 for s in res.skips if s.broker)
        transferable = (
            stats.pairs < cfg.load_balancer_max_number_of_broker_shedding_per_cycle
            and stats.lo < len(view.brokers) - 1 - walked
        )
        assert stats.std <= cfg.load_balancer_broker_load_target_std or not transferable


def test_overload_outlier() -> None:
    """TransferShedderTest.testOverloadOutlier: 99 brokers at 1 %, one at 100 %: its smaller
    bundle goes to one of the idle brokers (Pulsar's pick among equal loads follows hash-map
    order; here the first by name), reason Underloaded (their throughput is starved)."""
    brokers = {
        f"broker{i}:8080": Broker(0.01, two_bundles(f"my-namespace{i}", 300_000, 700_000))
        for i in range(99)
    }
    brokers["broker99:8080"] = Broker(1.0, two_bundles("my-namespace99", 30_000_000, 70_000_000))
    view = view_of(brokers)
    stats = load_stats(view)
    assert (stats.avg, stats.std) == pytest.approx((0.0199, 0.09850375627355534), abs=1e-5)
    _, res = shed("TransferShedder", view, **HIT0)
    (d,) = res.decisions
    assert (d.source_broker, d.bundle, d.reason) == (
        "broker99:8080",
        "my-tenant/my-namespace99/0x00000000_0x0fffffff",
        "Underloaded",
    )
    assert view.brokers[d.destination_broker].history_usage == 0.01


def test_underload_outlier() -> None:
    """TransferShedderTest.testUnderloadOutlier"""
    brokers = {
        f"broker{i}:8080": Broker(0.98, two_bundles(f"my-namespace{i}", 30_000_000, 70_000_000))
        for i in range(98)
    }
    brokers["broker98:8080"] = Broker(0.99, two_bundles("my-namespace98", 30_000_000, 70_000_000))
    brokers["broker99:8080"] = Broker(0.01, two_bundles("my-namespace99", 300_000, 700_000))
    view = view_of(brokers)
    stats = load_stats(view)
    assert (stats.avg, stats.std) == pytest.approx((0.9704, 0.09652895938523735), abs=1e-5)
    _, res = shed("TransferShedder", view, **HIT0)
    assert {(d.source_broker, d.bundle, d.destination_broker, d.reason) for d in res.decisions} == {
        (
            "broker98:8080",
            "my-tenant/my-namespace98/0x00000000_0x0fffffff",
            "broker99:8080",
            "Underloaded",
        )
    }


def test_random_load_stats() -> None:
    """TransferShedderTest.testRandomLoadStats (seeded): LoadStats' avg/std and its offload
    re-estimate match a direct mean/population std after each (max, min) offload."""
    rng = random.Random(11)
    for _ in range(5):
        loads = [rng.randrange(1000) / 100 for _ in range(10)]
        view = view_of({f"broker{i}:8080": Broker(x) for i, x in enumerate(loads)})
        stats = load_stats(view)
        cur = sorted(loads)
        i, j = 0, len(cur) - 1
        for _ in range(config().load_balancer_max_number_of_broker_shedding_per_cycle):
            lo, hi = cur[i], cur[j]
            mean = sum(cur) / len(cur)
            std = math.sqrt(sum((x - mean) ** 2 for x in cur) / len(cur))
            assert stats.loads[stats.lo] == lo and stats.loads[stats.hi] == hi
            assert stats.avg == pytest.approx(mean, abs=1e-4)
            assert stats.std == pytest.approx(std, abs=1e-4)
            offload = (hi - lo) / 2
            stats.offload(hi, lo, offload)
            stats.hi -= 1
            cur[i], cur[j] = lo + offload, hi - offload
            i, j = i + 1, j - 1


@pytest.mark.parametrize(
    ("loads", "avg", "std"),
    [
        ([1] + [100] * 16, 0.9417647058823528, 0.23294117647058868),
        (list(range(390, 400)), 3.9449999999999994, 0.028722813232795824),
    ],
    ids=["testHighVarianceLoadStats", "testLowVarianceLoadStats"],
)
def test_load_stats_variance(loads: list[int], avg: float, std: float) -> None:
    """TransferShedderTest.testHighVarianceLoadStats / testLowVarianceLoadStats"""
    view = view_of({f"broker{i}:8080": Broker(x / 100) for i, x in enumerate(loads)})
    stats = load_stats(view)
    assert (stats.avg, stats.std) == pytest.approx((avg, std), abs=1e-9)


def test_a_broker_over_100_percent_on_one_signal_is_not_the_least_loaded() -> None:
    """``BrokerLoadData.updateWeightedMaxEMA`` folds ``getMaxResourceUsageWithWeight``, every
    signal as it is: a broker at 120 % CPU and 30 % bandwidth reads 1.2, not the 0.3 of the
    within-limit reading (``history_usage``), which would make it the least loaded broker and
    the destination of a transfer. The view is made by the fold itself (``ingest_many``,
    ``build_view``), so the reading TransferShedder ranks by is the one the fold keeps."""
    bw = ResourceUsage(30.0, 100.0)
    brokers = {
        b(1): Broker(0.0, two_bundles("my-namespaceA", 2e6, 6e6), cpu=ResourceUsage(120, 100)),
        b(2): Broker(0.0, two_bundles("my-namespaceB", 2e6, 7e6), cpu=ResourceUsage(80, 100)),
        b(3): Broker(0.0, two_bundles("my-namespaceC", 1e6, 2e6), cpu=ResourceUsage(50, 100)),
    }
    for spec in brokers.values():
        spec.bandwidth_in = spec.bandwidth_out = bw
    reports = [v.report for v in view_of(brokers).brokers.values()]
    knobs = config(**HIT0)
    state = ingest_many(LoadState(), reports, received_at_ms=NOW_MS, **ingest_kwargs(knobs))
    view = build_view(state)
    hot = view.brokers[b(1)]
    assert (hot.history_usage, hot.weighted_max_ema) == pytest.approx((0.3, 1.2))
    _, res = shed("TransferShedder", view, **HIT0)
    assert moves(res) == {(b(1), "my-tenant/my-namespaceA/0x00000000_0x0fffffff", b(3))}
