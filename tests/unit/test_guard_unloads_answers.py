"""``guard_unloads`` answers once per (namespace, current broker) and, without isolation
policies, works the namespace candidates out once: the same kept decisions and the same skips,
in the same order, as asking both guards afresh for every bundle (the straightforward version
below), on seeded random clusters with isolation policies, anti-affinity groups, system bundles
and shedder-chosen destinations."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from loadbalance.config import LoadBalancerConfig
from loadbalance.decisions import TRANSFER, UNLOAD, Decision, Skip, make_decision
from loadbalance.model import NamespaceBundleStats, ResourceUsage
from loadbalance.placement.policies import PlacementPolicies
from loadbalance.shedding.policy_guards import PolicyGuard, guard_unloads
from loadbalance.values import SkipReason
from loadbalance.view import ClusterView
from tests.conformance.pulsar_fixtures import NOW_MS, Broker, view_of

HOSTS = [f"host{i}" for i in range(8)]
BROKERS = [f"{h}:8080" for h in HOSTS]
NAMESPACES = [f"t/ns{k}" for k in range(10)]


def _bundles(ns: str) -> list[str]:
    return [
        f"{ns}/0x{i * 0x40000000:08x}_0x{(i + 1) * 0x40000000 - (i == 3):08x}" for i in range(4)
    ]


def _cluster(rng: random.Random, with_policies: bool) -> tuple[ClusterView, list[Decision]]:
    """Every bundle on a random broker (plus each broker's heartbeat bundle), policies drawn
    at random, and an unload (or now and then a transfer) of every bundle from its owner."""
    owned: dict[str, list[str]] = {b: [] for b in BROKERS}
    for ns in NAMESPACES:
        for bundle in _bundles(ns):
            owned[rng.choice(BROKERS)].append(bundle)
    for broker in BROKERS:
        owned[broker].append(f"pulsar/use/{broker}/0x00000000_0xffffffff")
    stats = NamespaceBundleStats(msg_throughput_in=1.0, msg_throughput_out=1.0)
    view = view_of(
        {
            b: Broker(0.5, dict.fromkeys(names, stats), cpu=ResourceUsage(rng.uniform(5, 95), 100))
            for b, names in owned.items()
        }
    )
    if with_policies:
        isolated = rng.sample(NAMESPACES, 3)
        doc: dict = {
            "namespaceIsolationPolicies": {
                f"p{i}": {
                    "namespaces": [ns],
                    "primary": [rng.choice(["host[0-2]", "host[57]", "host9"])],
                    "secondary": [rng.choice(["host[34]", "host6", "nohost"])],
                    "auto_failover_policy": {
                        "policy_type": "min_available",
                        "parameters": {
                            "min_limit": str(rng.randint(1, 3)),
                            "usage_threshold": rng.choice(["50", "100"]),
                        },
                    },
                }
                for i, ns in enumerate(isolated)
            },
            "localPolicies": {
                ns: {"namespaceAntiAffinityGroup": rng.choice(["g1", "g2"])}
                for ns in rng.sample(NAMESPACES, 5)
            },
        }
        view = replace(view, policies=PlacementPolicies.from_admin_json(doc))
    decisions = []
    for source, names in owned.items():
        for bundle in names:
            transfer = rng.random() < 0.2
            decisions.append(
                make_decision(
                    cycle="c",
                    kind=TRANSFER if transfer else UNLOAD,
                    bundle=bundle,
                    source_broker=source,
                    destination_broker=rng.choice(BROKERS) if transfer else None,
                    reason="Overloaded",
                    strategy="S",
                    inputs={},
                    decided_at_ms=NOW_MS,
                )
            )
    rng.shuffle(decisions)
    return view, decisions


def _straightforward(
    decisions: list[Decision], view: ClusterView, config: LoadBalancerConfig, policy: str
) -> tuple[list[Decision], list[Skip]]:
    """Both guards asked afresh for every bundle, a new guard each time (nothing remembered)."""
    kept: list[Decision] = []
    skips: list[Skip] = []
    for d in decisions:
        guard = PolicyGuard(view, config)
        source = d.source_broker or ""
        refusal = guard.unload_refusal(d.bundle, source)
        dest = d.destination_broker if d.kind == TRANSFER else None
        if refusal is None and dest is not None and dest not in guard.destinations(d.bundle):
            refusal = Skip("", SkipReason.NAMESPACE_POLICIES, source, d.bundle,
                           f"destination {dest} is not allowed by its policies")  # fmt: skip
        if refusal is None:
            kept.append(d)
        else:
            skips.append(replace(refusal, policy=policy))
    return kept, skips


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("with_policies", [True, False], ids=["policies", "none"])
def test_guard_unloads_answers_as_asking_every_bundle(seed: int, with_policies: bool) -> None:
    rng = random.Random(seed)
    view, decisions = _cluster(rng, with_policies)
    config = LoadBalancerConfig(failureDomainsEnabled=rng.random() < 0.5)
    kept, skips = guard_unloads(decisions, view, config, "ThresholdShedder")
    assert (kept, skips) == _straightforward(decisions, view, config, "ThresholdShedder")
    # the cases the answers are shared between are there: refusals of several kinds, and
    # several bundles of one namespace on one broker
    reasons = {s.reason for s in skips}
    assert SkipReason.NAMESPACE_POLICIES in reasons  # the heartbeat bundles at least
    if with_policies:
        assert len(kept) < len(decisions) - len(BROKERS)
    else:
        assert all(d.bundle.startswith("pulsar/") for d in decisions if d not in kept)
