"""``sheddable_bundles`` ranks a broker's movable bundles as the plain definition does.

Why: the modular shedders (Overload, Threshold, UniformLoad) pick their bundles from this
ranking, and at a million bundles it is most of an OverloadShedder cycle, so it fetches the
bundles' averages in one call and falls back to one lookup per bundle when some bundle has
none. The reference below is the definition written plainly: every bundle of the broker that
is not recently unloaded, not already taken and not in a system namespace, with its short-term
throughput (or msg rate) - Pulsar's defaults for a bundle never seen - largest first, ties by
name. Views are seeded and random, with bundles lacking averages in about half of them.
"""

from __future__ import annotations

import random

import pytest

from loadbalance.bundles import is_system_service_bundle
from loadbalance.model import LocalBrokerData, NamespaceBundleStats, ResourceUsage
from loadbalance.shedding.selection import sheddable_bundles
from loadbalance.time_average import BundleData
from loadbalance.view import ClusterView, LoadState, UsageWeights, build_view, ingest_many

KW = {"history_percentage": 0.9, "weights": UsageWeights(), "received_at_ms": 1_000}


def _view(seed: int) -> tuple[ClusterView, set[str]]:
    rng = random.Random(seed)
    names = [
        f"t/ns-{rng.randrange(4)}/0x{i:08x}_0x{i + 1:08x}" for i in range(rng.randrange(1, 60))
    ]
    names += ["pulsar/c1/host-1:8080/0x00000000_0xffffffff"]  # heartbeat: never moved
    stats = {}
    for b in names:
        r = rng.choice([0.0, 1.0, 7.5, rng.uniform(0, 100)])
        stats[b] = NamespaceBundleStats(r, r, r * 1024, r * 999, 2, 1, 1)
    listed = set(stats)
    if rng.random() < 0.5:  # bundles the broker lists without stats: no averages yet
        listed |= {f"t/ns-9/0x{i:08x}_0x{i + 1:08x}" for i in range(rng.randrange(1, 4))}
    report = LocalBrokerData(
        broker="b", cpu=ResourceUsage(50.0, 100.0), bundles=frozenset(listed), last_stats=stats
    )
    state = ingest_many(LoadState(), [report], **KW)
    recent = {b: 0 for b in rng.sample(sorted(listed), k=len(listed) // 4)}
    taken = set(rng.sample(sorted(listed), k=len(listed) // 5))
    return build_view(state, recently_unloaded=recent), taken


def _plain(view: ClusterView, taken: set[str], by_msg_rate: bool) -> list[tuple[str, float]]:
    out = []
    for b in view.brokers["b"].bundles:
        if b in view.recently_unloaded or b in taken or is_system_service_bundle(b):
            continue
        st = view.bundle_data.get(b, BundleData.new()).short_term
        value = (
            st.msg_rate_in + st.msg_rate_out
            if by_msg_rate
            else st.msg_throughput_in + st.msg_throughput_out
        )
        out.append((b, value))
    return sorted(out, key=lambda bv: (-bv[1], bv[0]))


@pytest.mark.parametrize("seed", range(60))
@pytest.mark.parametrize("by_msg_rate", [False, True])
def test_ranking_matches_the_plain_definition(seed: int, by_msg_rate: bool) -> None:
    view, taken = _view(seed)
    got = sheddable_bundles(view, view.brokers["b"], taken, by_msg_rate=by_msg_rate)
    assert got == _plain(view, taken, by_msg_rate)


def test_the_views_include_bundles_without_averages() -> None:
    missing = 0
    for seed in range(60):
        view, _ = _view(seed)
        missing += any(b not in view.bundle_data for b in view.brokers["b"].bundles)
    assert 10 < missing < 60


@pytest.mark.parametrize("movable", [0, 1, 2])
def test_a_broker_with_none_one_or_two_movable_bundles(movable: int) -> None:
    names = [f"t/ns-1/0x{i:08x}_0x{i + 1:08x}" for i in range(3)]
    stats = {
        b: NamespaceBundleStats(1.0 + i, 1.0, 10.0 * i, 1.0, 2, 1, 1) for i, b in enumerate(names)
    }
    report = LocalBrokerData(broker="b", bundles=frozenset(stats), last_stats=stats)
    view = build_view(ingest_many(LoadState(), [report], **KW))
    taken = set(names[movable:])
    got = sheddable_bundles(view, view.brokers["b"], taken)
    assert got == _plain(view, taken, False)
    assert len(got) == movable
