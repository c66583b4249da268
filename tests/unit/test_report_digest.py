"""Report digests: the per-broker figures ``ingest_many`` works out as it folds a report.

Why: ``build_view`` takes a broker's ``TimeAverageBrokerData`` from its digest and the split
scan skips a broker whose digest shows no bundle over a limit, instead of walking a million
bundle averages. A digest that outlived a change of one of its bundles (another broker's report
folding the same bundle, ``forget_bundles`` dropping it) would give wrong sums or miss a hot
bundle, so every test here compares against the same state without digests (summed and
scanned the long way).
"""

from __future__ import annotations

import random
from dataclasses import replace

from loadbalance.config import LoadBalancerConfig
from loadbalance.model import LocalBrokerData, NamespaceBundleStats, ResourceUsage
from loadbalance.split_policy import find_bundles_to_split
from loadbalance.view import (
    LoadState,
    UsageWeights,
    build_view,
    digest_of,
    forget_brokers,
    forget_bundles,
    ingest_many,
)

KW = {"history_percentage": 0.9, "weights": UsageWeights(), "received_at_ms": 1_000}
NS = "t/ns"


def _name(i: int) -> str:
    lo = i * 0x1000
    return f"{NS}/0x{lo:08x}_0x{lo + 0x1000:08x}"


def _report(
    broker: str, bundles: dict[str, float], *, topics: dict[str, int] | None = None
) -> LocalBrokerData:
    """A report of these bundles (msg/s in and out each); 3 topics unless ``topics`` says."""
    counts = topics or {}
    stats = {
        b: NamespaceBundleStats(r, r, r * 1024, r * 1024, counts.get(b, 3), 1, 1)
        for b, r in bundles.items()
    }
    return LocalBrokerData(
        broker=broker,
        cpu=ResourceUsage(50.0, 100.0),
        bundles=frozenset(stats),
        last_stats=stats,
    )


def _plain(state: LoadState) -> LoadState:
    """The same state without its digests: everything summed and scanned the long way."""
    return LoadState(state.brokers, state.bundles)


def _sums(state: LoadState) -> dict[str, object]:
    view = build_view(state)
    return {b: v.time_average for b, v in view.brokers.items()}


def test_a_bundle_folded_again_by_another_broker_drops_the_first_digest() -> None:
    shared = _name(1)
    a = _report("a", {_name(0): 5.0, shared: 7.0})
    b = _report("b", {shared: 900.0, _name(2): 1.0})  # the same bundle, reported again
    state = ingest_many(LoadState(), [a, b], **KW)
    assert "a" not in state.digests and "b" in state.digests
    assert _sums(state) == _sums(_plain(state))
    # a's next report folds the bundle again: a's digest is back, b's is gone
    state = ingest_many(state, [a], **KW)
    assert "a" in state.digests and "b" not in state.digests
    assert _sums(state) == _sums(_plain(state))


def test_a_bundle_that_moved_away_keeps_the_old_owner_digest() -> None:
    moving = _name(1)
    state = ingest_many(LoadState(), [_report("a", {_name(0): 5.0, moving: 7.0})], **KW)
    state = ingest_many(state, [_report("a", {_name(0): 5.0}), _report("b", {moving: 7.0})], **KW)
    assert set(state.digests) == {"a", "b"}  # a no longer lists it: its sums stay true
    assert _sums(state) == _sums(_plain(state))


def test_forget_bundles_and_brokers_drop_the_digests_they_falsify() -> None:
    gone = _name(1)
    state = ingest_many(
        LoadState(),
        [_report("a", {_name(0): 5.0, gone: 7.0}), _report("b", {_name(2): 3.0})],
        **KW,
    )
    state = forget_bundles(state, [gone])
    assert "a" not in state.digests and "b" in state.digests
    assert _sums(state) == _sums(_plain(state))
    assert set(forget_brokers(state, ["b"]).digests) == set()


def test_random_overlapping_reports_sum_as_the_long_way() -> None:
    rng = random.Random(7)
    state = LoadState()
    for _ in range(12):
        reports = []
        for broker in ("a", "b", "c", "d"):
            picked = rng.sample(range(40), 12)
            reports.append(_report(broker, {_name(i): rng.uniform(0, 500) for i in picked}))
        state = ingest_many(state, reports, **KW)
        if rng.random() < 0.3:
            state = forget_bundles(state, [_name(rng.randrange(40))])
        assert _sums(state) == _sums(_plain(state))


def test_the_split_scan_finds_the_same_hot_bundles_with_and_without_digests() -> None:
    config = LoadBalancerConfig(loadBalancerNamespaceBundleMaxMsgRate=1000)
    hot, cool = _name(3), _name(4)
    state = ingest_many(
        LoadState(),
        [
            _report("a", {_name(0): 5.0, hot: 10.0}),
            _report("b", {_name(2): 1.0, cool: 2.0}),
        ],
        **KW,
    )
    # b reports the first bundle of a too, hot now: a's digest no longer holds
    state = ingest_many(state, [_report("b", {_name(2): 1.0, hot: 5_000.0})], **KW)
    view = build_view(state)
    assert digest_of(view, "a") is None and digest_of(view, "b") is not None

    def splits(v: object) -> list[tuple[str, str | None]]:
        _, res = find_bundles_to_split(v, config, None, now_ms=1, cycle="c")  # type: ignore[arg-type]
        return [(d.bundle, d.source_broker) for d in res.decisions]

    assert splits(view) == splits(build_view(_plain(state))) == [(hot, "a")]


def test_a_digest_is_not_read_for_another_report_or_other_averages() -> None:
    state = ingest_many(LoadState(), [_report("a", {_name(0): 5.0, _name(1): 6.0})], **KW)
    view = build_view(state)
    assert digest_of(view, "a") is not None
    assert digest_of(replace(view, bundle_data=dict(view.bundle_data)), "a") is None
    other = replace(view.brokers["a"], report=_report("a", {_name(0): 5.0}))
    assert digest_of(replace(view, brokers={"a": other}), "a") is None


def test_a_broker_whose_digest_shows_a_hot_bundle_is_scanned() -> None:
    hot = _name(5)
    for limit, over in (
        ({"loadBalancerNamespaceBundleMaxMsgRate": 1000}, {"rate": 5_000.0}),
        ({"loadBalancerNamespaceBundleMaxTopics": 10}, {"topics": 20}),
        ({"loadBalancerNamespaceBundleMaxBandwidthMbytes": 1}, {"rate": 900.0}),
    ):
        config = LoadBalancerConfig(**limit)
        rate = float(over.get("rate", 1.0))
        state = ingest_many(
            LoadState(),
            [
                _report("a", {_name(0): 1.0}),
                _report("b", {_name(1): 1.0, hot: rate}, topics={hot: int(over.get("topics", 3))}),
            ],
            **KW,
        )
        view = build_view(state)
        assert digest_of(view, "a") is not None and digest_of(view, "b") is not None
        _, res = find_bundles_to_split(view, config, None, now_ms=1, cycle="c")
        assert [d.bundle for d in res.decisions] == [hot], limit
