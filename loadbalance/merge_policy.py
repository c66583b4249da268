"""The bundle merge step (ours; Pulsar never merges): fold cold neighbours back together.

Splits in Pulsar are permanent, so a namespace that was hot once keeps its 128 bundles forever,
each with its own ownership lease and load-report entry. With ``load_balancer_merge_enabled`` (off
by default) this step proposes merging two bundles when all of these hold:

* they are adjacent in the namespace's current boundaries (``view.namespaces``), so the union is
  one contiguous hash range, and the same broker serves both, so the merge moves no traffic;
* both are cold: long-term ``msgRateIn + Out < load_balancer_merge_max_msg_rate`` and long-term
  throughput ``< load_balancer_merge_max_bandwidth_mbytes`` MiB/s, and together they hold at most
  ``load_balancer_merge_max_topics`` topics. A bundle with no averages yet is judged on Pulsar's
  defaults for an unseen bundle (``ClusterView.bundle``);
* neither was unloaded, split or merged recently (``view.recently_unloaded``), so a merge never
  chases a change whose effect the reports do not show yet;
* hysteresis: the merged bundle would not qualify for a split right away (topics, sessions,
  long-term msg rate and throughput all within the split limits), or merge and split would undo
  each other every cycle;
* the namespace keeps at least ``defaultNumberOfNamespaceBundles`` bundles;
* the namespace is not a system service namespace (``is_system_service_namespace``: heartbeat,
  SLA monitor, ``pulsar/system``). Those bundles belong to one broker by design and Pulsar never
  reshapes them; the split step leaves them whole for the same reason, so merging them would be
  the only policy that touched them.

At most ``load_balancer_max_number_of_bundles_to_merge_per_cycle`` merges are proposed per cycle
(0 turns merging off in practice) and a bundle takes part in at most one. The coldest pairs
(combined long-term msg rate, then throughput, then name) go first, so the cap keeps them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from loadbalance.bundles import is_system_service_namespace
from loadbalance.decisions import MERGE, Decision, PolicyResult, Skip, make_decision
from loadbalance.split_algorithms import MBYTES
from loadbalance.values import DecisionReason, SkipReason
from loadbalance.view import ClusterView

if TYPE_CHECKING:
    from loadbalance.config import LoadBalancerConfig

STRATEGY = "ColdBundleMerger"
REASON = DecisionReason.COLD


@dataclass(frozen=True, slots=True)
class _Pair:
    namespace: str
    left: str
    right: str
    owner: str
    msg_rate_per_s: float
    throughput_bytes_per_s: float
    topics: int
    sessions: int


def _sessions(view: ClusterView, owner: str, bundle: str) -> int:
    stats = view.brokers[owner].report.last_stats.get(bundle)
    return stats.sessions if stats is not None else 0


def _is_cold(view: ClusterView, bundle: str, config: LoadBalancerConfig) -> bool:
    data = view.bundle(bundle)
    return (
        data.long_term.msg_rate < config.load_balancer_merge_max_msg_rate
        and data.long_term.msg_throughput < config.load_balancer_merge_max_bandwidth_mbytes * MBYTES
    )


def _would_split(pair: _Pair, config: LoadBalancerConfig) -> bool:
    """Whether the merged bundle would pass a split threshold (same tests as the split step)."""
    max_sessions = config.load_balancer_namespace_bundle_max_sessions
    return (
        pair.topics > config.load_balancer_namespace_bundle_max_topics
        or (max_sessions > 0 and pair.sessions > max_sessions)
        or pair.msg_rate_per_s > config.load_balancer_namespace_bundle_max_msg_rate
        or pair.throughput_bytes_per_s
        > config.load_balancer_namespace_bundle_max_bandwidth_mbytes * MBYTES
    )


def _cold_pairs(view: ClusterView, config: LoadBalancerConfig, skips: list[Skip]) -> list[_Pair]:
    """Adjacent, same-owner, cold pairs that pass the recency and hysteresis checks."""
    owners = view.owners()
    pairs: list[_Pair] = []
    for ns in sorted(view.namespaces):
        if is_system_service_namespace(ns):
            continue
        names = view.namespaces[ns].bundle_names
        for left, right in itertools.pairwise(names):
            owner = owners.get(left)
            if owner is None or owners.get(right) != owner:
                continue
            if not (_is_cold(view, left, config) and _is_cold(view, right, config)):
                continue
            a, b = view.bundle(left), view.bundle(right)
            pair = _Pair(
                ns,
                left,
                right,
                owner,
                a.long_term.msg_rate + b.long_term.msg_rate,
                a.long_term.msg_throughput + b.long_term.msg_throughput,
                a.topics + b.topics,
                _sessions(view, owner, left) + _sessions(view, owner, right),
            )
            if pair.topics > config.load_balancer_merge_max_topics:
                continue
            if left in view.recently_unloaded or right in view.recently_unloaded:
                skips.append(Skip(STRATEGY, SkipReason.COOL_DOWN, owner, left, f"with {right}"))
                continue
            if _would_split(pair, config):
                detail = f"merged with {right} it would qualify for a split"
                skips.append(Skip(STRATEGY, SkipReason.HYSTERESIS, owner, left, detail))
                continue
            pairs.append(pair)
    return pairs


def find_bundles_to_merge(
    view: ClusterView, config: LoadBalancerConfig, *, now_ms: int, cycle: str
) -> PolicyResult:
    """Choose this cycle's merges of cold adjacent bundles (nothing when merging is off)."""
    if not config.load_balancer_merge_enabled:
        return PolicyResult()
    skips: list[Skip] = []
    pairs = _cold_pairs(view, config, skips)
    pairs.sort(key=lambda p: (p.msg_rate_per_s, p.throughput_bytes_per_s, p.left))
    cap = config.load_balancer_max_number_of_bundles_to_merge_per_cycle
    floor = config.default_number_of_namespace_bundles
    used: set[str] = set()
    merged_in_ns: dict[str, int] = {}
    decisions: list[Decision] = []
    for i, p in enumerate(pairs):
        if p.left in used or p.right in used:
            continue
        if len(decisions) >= cap:
            detail = f"{len(decisions)} merges this cycle; {len(pairs) - i} cold pairs left over"
            skips.append(Skip(STRATEGY, SkipReason.MAX_MERGES_PER_CYCLE, p.owner, p.left, detail))
            break
        count = len(view.namespaces[p.namespace]) - merged_in_ns.get(p.namespace, 0)
        if count - 1 < floor:
            detail = f"{p.namespace} would have {count - 1} bundles, minimum {floor}"
            skips.append(
                Skip(STRATEGY, SkipReason.NAMESPACE_MINIMUM_BUNDLES, p.owner, p.left, detail)
            )
            continue
        used.update((p.left, p.right))
        merged_in_ns[p.namespace] = merged_in_ns.get(p.namespace, 0) + 1
        inputs = {
            "combinedLongTermMsgRate": p.msg_rate_per_s,
            "combinedLongTermMsgThroughput": p.throughput_bytes_per_s,
            "combinedTopics": p.topics,
            "combinedSessions": p.sessions,
            "namespaceBundleCount": count,
            "loadBalancerMergeMaxMsgRate": config.load_balancer_merge_max_msg_rate,
            "loadBalancerMergeMaxBandwidthMbytes": config.load_balancer_merge_max_bandwidth_mbytes,
            "loadBalancerMergeMaxTopics": config.load_balancer_merge_max_topics,
            "defaultNumberOfNamespaceBundles": floor,
        }
        decisions.append(
            make_decision(
                cycle=cycle,
                kind=MERGE,
                bundle=p.left,
                merge_bundle=p.right,
                source_broker=p.owner,
                reason=REASON,
                strategy=STRATEGY,
                inputs=inputs,
                decided_at_ms=now_ms,
            )
        )
    return PolicyResult(tuple(decisions), tuple(skips))
