"""TimeAverageMessageData, BundleData and history usage follow Pulsar's update rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadbalance.model import LocalBrokerData, NamespaceBundleStats, ResourceUsage
from loadbalance.time_average import (
    DEFAULT_MESSAGE_RATE,
    DEFAULT_MESSAGE_THROUGHPUT,
    BundleData,
    TimeAverageBrokerData,
    TimeAverageMessageData,
    history_usage,
)
from loadbalance.view import LoadState, UsageWeights, build_view, ingest


def test_unseen_bundle_has_pulsars_defaults() -> None:
    d = BundleData.new()
    assert d.short_term.msg_rate_in == DEFAULT_MESSAGE_RATE == 50.0
    assert d.long_term.msg_throughput_out == DEFAULT_MESSAGE_THROUGHPUT == 50000.0
    assert (d.short_term.max_samples, d.long_term.max_samples) == (10, 1000)


def test_first_sample_overwrites_the_default() -> None:
    d = BundleData.new().update(NamespaceBundleStats(msg_rate_in=7.0, msg_throughput_in=9.0))
    assert d.short_term.msg_rate_in == 7.0
    assert d.long_term.msg_throughput_in == 9.0
    assert d.short_term.msg_rate_out == 0.0


def test_cumulative_mean_until_max_samples_then_ema() -> None:
    t = TimeAverageMessageData(max_samples=3)
    for v in (3.0, 6.0, 9.0):
        t = t.update_values(v, 0, 0, 0)
    assert t.num_samples == 3
    assert t.msg_throughput_in == pytest.approx(6.0)
    t = t.update_values(12.0, 0, 0, 0)  # saturated: weight 1/3
    assert t.num_samples == 3
    assert t.msg_throughput_in == pytest.approx((2 * 6.0 + 12.0) / 3)


@given(st.lists(st.floats(min_value=0, max_value=1e9), min_size=1, max_size=30))
def test_short_term_is_mean_of_samples_while_unsaturated(samples: list[float]) -> None:
    t = TimeAverageMessageData(max_samples=1000)
    for s in samples:
        t = t.update_values(s, 0, 0, 0)
    assert t.msg_throughput_in == pytest.approx(sum(samples) / len(samples), rel=1e-9, abs=1e-6)


def test_history_usage_seeds_with_first_reading() -> None:
    assert history_usage(None, 0.8, 0.9) == 0.8
    assert history_usage(0.8, 0.0, 0.9) == pytest.approx(0.72)


def test_ingest_keeps_broker_history_and_bundle_samples() -> None:
    b = "t/ns/0x00000000_0xffffffff"
    weights = UsageWeights()

    def report(cpu: float, rate: float) -> LocalBrokerData:
        return LocalBrokerData(
            broker="b1",
            cpu=ResourceUsage(cpu, 100),
            bundles=frozenset({b}),
            last_stats={b: NamespaceBundleStats(msg_rate_in=rate)},
            msg_throughput_in=1000.0,
        )

    s = LoadState()
    s = ingest(s, report(50, 10), history_percentage=0.9, weights=weights, received_at_ms=1)
    s = ingest(s, report(100, 30), history_percentage=0.9, weights=weights, received_at_ms=2)
    assert s.brokers["b1"].history_usage == pytest.approx(0.5 * 0.9 + 0.1 * 1.0)
    assert s.bundles[b].short_term.num_samples == 2
    assert s.bundles[b].short_term.msg_rate_in == pytest.approx(20.0)
    view = build_view(s)
    assert view.brokers["b1"].time_average.long_term_msg_rate == pytest.approx(20.0)
    assert view.owner_of(b) == "b1"


def test_broker_time_average_sums_bundles() -> None:
    a = BundleData.new().update(NamespaceBundleStats(msg_rate_in=1, msg_rate_out=2))
    b = BundleData.new().update(NamespaceBundleStats(msg_rate_in=3, msg_throughput_out=5))
    ta = TimeAverageBrokerData.of([a, b])
    assert ta.long_term_msg_rate == pytest.approx(6)
    assert ta.short_term_msg_throughput == pytest.approx(5)


def test_ingest_many_equals_repeated_ingest() -> None:
    from loadbalance.view import ingest_many

    b1, b2 = "t/ns/0x00000000_0x80000000", "t/ns/0x80000000_0xffffffff"
    reports = [
        LocalBrokerData(
            broker=f"b{i % 2}",
            cpu=ResourceUsage(10 + 7 * i, 100),
            bundles=frozenset({b1 if i % 2 else b2}),
            last_stats={(b1 if i % 2 else b2): NamespaceBundleStats(msg_rate_in=float(i))},
        )
        for i in range(7)
    ]
    kw = {"history_percentage": 0.9, "weights": UsageWeights(), "received_at_ms": 5}
    one = LoadState()
    for r in reports:
        one = ingest(one, r, **kw)
    assert ingest_many(LoadState(), reports, **kw) == one


def test_broker_time_average_is_the_same_bits_in_any_bundle_order() -> None:
    """A broker's bundles are a frozenset, iterated in the per-process string-hash order: the
    sums must not depend on it, or a cycle replayed by another process could tip a near-tie."""
    import random

    rng = random.Random(7)
    bundles = [
        BundleData.new().update(
            NamespaceBundleStats(
                msg_rate_in=rng.uniform(0, 10) ** rng.randint(0, 12),
                msg_rate_out=rng.random() * 1e-3,
                msg_throughput_in=rng.uniform(0, 1e9),
                msg_throughput_out=rng.uniform(0, 1e3),
            )
        )
        for _ in range(500)
    ]
    want = TimeAverageBrokerData.of(bundles)
    plain = set()
    for _ in range(5):
        rng.shuffle(bundles)
        assert TimeAverageBrokerData.of(bundles) == want
        plain.add(sum(b.short_term.msg_rate_in for b in bundles))
    assert len(plain) > 1  # the data really is order-sensitive under plain addition
