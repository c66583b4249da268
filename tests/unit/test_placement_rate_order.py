"""LeastLongTermMessageRate placement through the kept score order picks what the full scan picks.

Why: ``BrokerSelector`` no longer scores every candidate for every bundle with
``LeastLongTermMessageRate``; it walks ``LeastRateOrder`` (the brokers sorted by score, one
entry moved per placement) past the brokers the filters drop, and draws among the tied least
ones. Decisions must stay bit-identical, seeded tie-breaks included. The reference here is the
same selector forced onto the plain path (a subclass of the strategy is not the strategy
itself, so it scores the filtered candidate list as ``select_broker`` always did). Clusters
are seeded and random, with few distinct rates so that ties are common, overloaded brokers
(some clusters all overloaded), a ``loadBalancerBrokerMaxTopics`` some brokers pass, few
namespaces (so every candidate may already serve one), exclusions, inherited
preallocations, stale reports and re-selected bundles.
"""

from __future__ import annotations

import random

import pytest

from loadbalance.config import LoadBalancerConfig
from loadbalance.model import LocalBrokerData, NamespaceBundleStats, ResourceUsage
from loadbalance.placement.least_long_term_message_rate import (
    LeastLongTermMessageRate,
    LeastRateOrder,
)
from loadbalance.placement.pipeline import BrokerSelector
from loadbalance.time_average import BundleData
from loadbalance.view import LoadState, UsageWeights, build_view, ingest_many

KW = {"history_percentage": 0.9, "weights": UsageWeights()}


class _PlainScan(LeastLongTermMessageRate):
    """The strategy unchanged, but not the exact type: the selector scores every candidate."""


def _name(ns: int, i: int) -> str:
    lo = i * 0x1000
    return f"t/ns-{ns}/0x{lo:08x}_0x{lo + 0x1000:08x}"


def _cluster(seed: int):  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    n_brokers = rng.randrange(2, 12)
    n_ns = rng.choice([1, 2, 5])
    names = [_name(ns, i) for ns in range(n_ns) for i in range(rng.randrange(3, 15))]
    rates = [0.0, 1.0, 2.5] if rng.random() < 0.7 else [rng.uniform(0, 50) for _ in range(8)]
    hot = rng.choice([0.3, 0.9, 1.0])  # share of overloaded brokers
    reports = []
    for k in range(n_brokers):
        mine = [b for j, b in enumerate(names) if j % n_brokers == k]
        stats = {}
        for b in mine:
            r = rng.choice(rates)
            stats[b] = NamespaceBundleStats(r, r, r * 1024, r * 1024, rng.randrange(1, 6), 1, 1)
        cpu = rng.uniform(90, 99) if rng.random() < hot else rng.uniform(5, 60)
        reports.append(
            LocalBrokerData(
                broker=f"b{k}",
                cpu=ResourceUsage(cpu, 100.0),
                num_topics=sum(s.topics for s in stats.values()),
                bundles=frozenset(stats),
                last_stats=stats,
                last_update_ms=0,
            )
        )
    # a stale broker (TTL filter) now and then, through an older receive time
    stale = rng.random() < 0.3
    state = ingest_many(LoadState(), reports[:1], received_at_ms=0 if stale else 10**6, **KW)
    state = ingest_many(state, reports[1:], received_at_ms=10**6, **KW)
    inherited: dict[str, dict[str, BundleData]] = {}
    for _ in range(rng.randrange(0, 4)):
        broker = f"b{rng.randrange(n_brokers)}"
        bundle = _name(rng.randrange(n_ns + 1), rng.randrange(20))
        inherited.setdefault(broker, {})[bundle] = BundleData.new()
    view = build_view(state, preallocated=inherited)
    topics = sorted(r.num_topics for r in reports)
    config = LoadBalancerConfig(
        loadBalancerLoadPlacementStrategy="LeastLongTermMessageRate",
        loadBalancerDistributeBundlesEvenlyEnabled=rng.random() < 0.8,
        loadBalancerBrokerMaxTopics=rng.choice([50_000, topics[len(topics) // 2] + 2, 1]),
        loadBalancerBrokerLoadDataTTLInSeconds=60,
    )
    todo = [_name(rng.randrange(n_ns + 1), rng.randrange(20)) for _ in range(40)]
    excludes = [
        tuple(f"b{rng.randrange(n_brokers)}" for _ in range(rng.choice([0, 1, 1, 2]))) for _ in todo
    ]
    return view, config, todo, excludes


@pytest.mark.parametrize("seed", range(300))
def test_kept_order_picks_the_same_brokers_as_the_full_scan(seed: int) -> None:
    view, config, todo, excludes = _cluster(seed)
    fast = BrokerSelector(view, config, random.Random(seed), now_ms=10**6)
    plain = BrokerSelector(view, config, random.Random(seed), _PlainScan(), now_ms=10**6)
    assert type(fast.strategy) is LeastLongTermMessageRate
    for bundle, exclude in zip(todo, excludes, strict=True):
        assert fast.select(bundle, exclude=exclude) == plain.select(bundle, exclude=exclude)
    assert fast.preallocated == plain.preallocated
    assert fast._order is not None and fast._order.usable  # the kept order did the work


def test_the_clusters_exercise_ties_overload_and_the_fallbacks() -> None:
    """The comparison above means something only if its clusters reach the hard cases."""
    seen = {"tie": 0, "all_overloaded": 0, "every_candidate_serves": 0}
    for seed in range(300):
        view, config, todo, excludes = _cluster(seed)
        sel = BrokerSelector(view, config, random.Random(seed), now_ms=10**6)
        threshold = config.overloaded_threshold
        if all(b.report.max_resource_usage() > threshold for b in view.brokers.values()):
            seen["all_overloaded"] += 1
        for bundle, exclude in zip(todo, excludes, strict=True):
            sel.select(bundle, exclude=exclude)
            entries = sel._order.entries if sel._order else []
            if len(entries) > 1 and entries[0][0] == entries[1][0]:
                seen["tie"] += 1
            excluded = set(exclude)
            if config.load_balancer_distribute_bundles_evenly_enabled and sel._order is not None:
                ns = bundle.rpartition("/")[0]
                if all(sel._ns_counts.count(n, ns) > 0 for _, n in entries if n not in excluded):
                    seen["every_candidate_serves"] += 1
    assert all(n > 20 for n in seen.values()), seen


def test_a_nan_score_turns_the_kept_order_off_and_the_full_scan_decides() -> None:
    """A NaN has no place in a sorted order: the selector scores every candidate instead."""
    view, config, todo, excludes = _cluster(1)
    name = sorted(view.brokers)[0]
    nan = {name: type("P", (), {"long_term_msg_rate": float("nan")})()}
    order = LeastRateOrder(LeastLongTermMessageRate(), view, view.brokers, nan, 2.0)  # type: ignore[arg-type]
    assert not order.usable

    stats = {_name(7, 0): NamespaceBundleStats(float("nan"), 1.0, 1.0, 1.0, 2, 1, 1)}
    odd = LocalBrokerData(
        broker="odd", cpu=ResourceUsage(1.0, 100.0), bundles=frozenset(stats), last_stats=stats
    )
    reports = [b.report for b in view.brokers.values()] + [odd]
    view = build_view(ingest_many(LoadState(), reports, received_at_ms=10**6, **KW))
    fast = BrokerSelector(view, config, random.Random(4), now_ms=10**6)
    plain = BrokerSelector(view, config, random.Random(4), _PlainScan(), now_ms=10**6)
    for bundle, exclude in zip(todo, excludes, strict=True):
        assert fast.select(bundle, exclude=exclude) == plain.select(bundle, exclude=exclude)
    assert fast._order is not None and not fast._order.usable
