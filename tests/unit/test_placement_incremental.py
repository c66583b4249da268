"""Placement keeps its per-broker figures up to date instead of recomputing them per bundle.

Why: a cycle that places thousands of bundles used to recount every broker's namespaces,
topics and scores for each placement. ``BrokerSelector`` now keeps the namespace counts
(``NamespaceCounts``, copy on write over the report digests), the set of brokers over
``loadBalancerBrokerMaxTopics`` and ``LeastLongTermMessageRate``'s per-view scores, and the
projection answers ``load_if_added``/``load_if_removed`` without building a shifted copy. Each
test checks the kept figures against the plain functions they replace, after placements, so a
figure that went stale fails here.
"""

from __future__ import annotations

import random

from loadbalance.config import LoadBalancerConfig
from loadbalance.model import LocalBrokerData, NamespaceBundleStats, ResourceUsage
from loadbalance.placement.filters import (
    NamespaceCounts,
    filter_brokers_with_large_topic_count,
    namespace_bundle_counts,
)
from loadbalance.placement.pipeline import BrokerSelector
from loadbalance.strategies.usage_projection import BundleLoad, UsageModel, Weights
from loadbalance.view import LoadState, UsageWeights, build_view, digest_of, ingest_many

KW = {"history_percentage": 0.9, "weights": UsageWeights(), "received_at_ms": 1_000}


def _name(ns: int, i: int) -> str:
    lo = i * 0x1000
    return f"t/ns-{ns}/0x{lo:08x}_0x{lo + 0x1000:08x}"


def _report(broker: str, bundles: list[str], rng: random.Random) -> LocalBrokerData:
    stats = {}
    for b in bundles:
        r = rng.uniform(1, 100)
        stats[b] = NamespaceBundleStats(r, r, r * 1024, r * 1024, rng.randrange(1, 40), 1, 1)
    return LocalBrokerData(
        broker=broker,
        cpu=ResourceUsage(rng.uniform(10, 95), 100.0),
        bandwidth_in=ResourceUsage(100.0, 1000.0),
        bandwidth_out=ResourceUsage(100.0, 1000.0),
        msg_rate_in=sum(s.msg_rate_in for s in stats.values()),
        num_topics=sum(s.topics for s in stats.values()),
        bundles=frozenset(stats),
        last_stats=stats,
    )


def _view(seed: int = 3):  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    names = [_name(ns, i) for ns in range(6) for i in range(12)]
    rng.shuffle(names)
    brokers = [f"b{i}" for i in range(6)]
    reports = [_report(b, names[k::6], rng) for k, b in enumerate(brokers)]
    return build_view(ingest_many(LoadState(), reports, **KW))


def test_namespace_counts_follow_placements_as_a_fresh_count_would() -> None:
    view = _view()
    assert all(digest_of(view, b) is not None for b in view.brokers)
    pre: dict[str, dict] = {"b1": {_name(9, 1): None, _name(0, 50): None}}
    counts = NamespaceCounts(view, pre)  # type: ignore[arg-type]
    fresh = namespace_bundle_counts(view, pre)  # type: ignore[arg-type]
    namespaces = [f"t/ns-{i}" for i in (0, 1, 2, 9)]
    for b in view.brokers:
        for ns in namespaces:
            assert counts.count(b, ns) == fresh[b][ns]
    counts.add("b2", "t/ns-1")
    fresh["b2"]["t/ns-1"] += 1
    counts.remove("b3", "t/ns-2")
    if fresh["b3"]["t/ns-2"] > 0:
        fresh["b3"]["t/ns-2"] -= 1
    counts.remove("b3", "t/ns-404")  # nothing to lose: stays 0
    for b in view.brokers:
        for ns in [*namespaces, "t/ns-404"]:
            assert counts.count(b, ns) == fresh[b][ns]
    # the digests' shared counts are untouched by the copy on write
    assert NamespaceCounts(view, {}).count("b2", "t/ns-1") == fresh["b2"]["t/ns-1"] - 1


def test_the_max_topics_filter_follows_preallocated_topics() -> None:
    view = _view()
    totals = sorted(b.report.num_topics for b in view.brokers.values())
    limit = totals[2] + 5  # some brokers under, some over, before any placement
    config = LoadBalancerConfig(loadBalancerBrokerMaxTopics=limit)
    selector = BrokerSelector(view, config, random.Random(1))
    full = sorted(view.brokers)
    for i in range(30):
        bundle = _name(i % 6, i % 12)  # known bundles: their topics count once preallocated
        expected = filter_brokers_with_large_topic_count(
            full, view, selector.preallocated, config.load_balancer_broker_max_topics
        )
        assert selector._below_max_topics(full) == expected
        selector.select(bundle)


def _two_broker_view(rate_a: float, rate_b: float):  # type: ignore[no-untyped-def]
    rng = random.Random(1)
    reports = []
    for broker, rate, ns in (("a", rate_a, 0), ("b", rate_b, 1)):
        r = _report(broker, [_name(ns, 0), _name(ns, 1)], rng)
        stats = {k: NamespaceBundleStats(rate, rate, 1.0, 1.0, 3, 1, 1) for k in r.last_stats}
        reports.append(
            LocalBrokerData(
                broker=broker, cpu=ResourceUsage(10.0, 100.0), bundles=r.bundles, last_stats=stats
            )
        )
    return build_view(ingest_many(LoadState(), reports, **KW))


def test_least_long_term_message_rate_scores_a_new_view_afresh() -> None:
    config = LoadBalancerConfig(loadBalancerLoadPlacementStrategy="LeastLongTermMessageRate")
    a_idle, b_idle = _two_broker_view(1.0, 500.0), _two_broker_view(500.0, 1.0)
    strategy = BrokerSelector(a_idle, config, random.Random(1)).strategy

    def pick(view):  # type: ignore[no-untyped-def]
        data = view.bundle("x")
        return strategy.select_broker(
            ["a", "b"], "x", data, view, {}, config, random.Random(0), None
        )[1]

    assert [pick(a_idle), pick(b_idle), pick(a_idle)] == ["a", "b", "a"]


def test_load_if_added_and_removed_match_the_shifted_copy() -> None:
    view = _view()
    model = UsageModel(view, Weights())
    rng = random.Random(5)
    for _ in range(200):
        b = BundleLoad(rng.uniform(0, 5e3), rng.uniform(0, 5e6), rng.uniform(0, 5e6))
        broker = rng.choice(sorted(view.brokers))
        usage = model.brokers[broker]
        assert model.load_if_added(broker, b) == usage.shifted(b, 1.0).load(model.weights)
        assert model.load_if_removed(broker, b) == usage.shifted(b, -1.0).load(model.weights)
