"""Test helpers for a three-broker Kafka cluster: who leads a partition, who is in sync, who
coordinates a consumer group, and the exact checks run after every Kafka fault.

Why here and not in ``infra.kafka_server``: the product never needs to know which broker leads
a partition; only fault tests do, to aim a kill. Everything is read from the cluster's own
metadata through confluent-kafka's ``AdminClient``, so a test aims where Kafka says, not where it
guessed.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping

import redis
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from controller.apply import apply_decision, apply_knobs
from loadbalance.config import LoadBalancerConfig
from loadbalance.decisions import Decision
from metadata_store.keys import Keys
from metadata_store.ownership_redis import RedisStore
from tests.reliability.invariants import StoreState, check_invariants, read_state

REAL_OUTCOMES = ("applied", "already_satisfied", "rejected", "conflict")


def _admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})


def partition_leaders(bootstrap: str, topic: str) -> dict[int, int]:
    """partition -> node id of its leader (-1 while none is elected)."""
    md = _admin(bootstrap).list_topics(topic, timeout=10)
    return {p.id: p.leader for p in md.topics[topic].partitions.values()}


def in_sync_everywhere(bootstrap: str, node_id: int, topics: Iterable[str]) -> bool:
    """Whether ``node_id`` is back in the ISR of every partition of ``topics``, and every
    partition has a leader: a node restarted in a rolling restart is caught up only then."""
    try:
        md = _admin(bootstrap).list_topics(timeout=5)
    except KafkaException:
        return False
    for topic in topics:
        t = md.topics.get(topic)
        if t is None or t.error is not None:
            return False
        for p in t.partitions.values():
            if p.leader < 0 or node_id not in p.isrs:
                return False
    return True


def group_coordinator(bootstrap: str, group: str) -> int:
    """The node id of the broker coordinating consumer group ``group``."""
    admin = _admin(bootstrap)  # kept until the answer: a collected client fails its futures
    future = admin.describe_consumer_groups([group], request_timeout=10)[group]
    return future.result(timeout=15).coordinator.id


def group_assignment(bootstrap: str, group: str) -> list[set[int]]:
    """One set of assigned partitions per live member of ``group``."""
    admin = _admin(bootstrap)
    desc = admin.describe_consumer_groups([group], request_timeout=10)[group].result(timeout=15)
    return [{tp.partition for tp in m.assignment.topic_partitions} for m in desc.members]


def group_committed(bootstrap: str, group: str, topic: str, partitions: Iterable[int]) -> dict:
    """partition -> the offset ``group`` committed on ``topic`` (-1001 when none)."""
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in partitions])
    admin = _admin(bootstrap)
    future = admin.list_consumer_group_offsets([request], request_timeout=10)[group]
    return {tp.partition: tp.offset for tp in future.result(timeout=15).topic_partitions}


def first_copies(published: list[Decision]) -> dict[str, Decision]:
    """id -> decision, after checking every repeated id carries the same content (a replayed
    batch re-sends a decision; it must never re-decide it differently)."""
    by_id: dict[str, Decision] = {}
    for d in published:
        first = by_id.setdefault(d.id, d)
        assert first == d, f"id {d.id} published with different content: {first} / {d}"
    return by_id


def outcome_entries(r: redis.Redis, prefix: str) -> list[tuple[str, str]]:
    """(decision id, outcome) of every outcome-stream entry, in the order recorded."""
    return [
        (f[b"id"].decode(), f[b"outcome"].decode())
        for _, f in r.xrange(Keys(prefix).outcome_stream())
    ]


def assert_one_outcome_each_applied_once(
    store: RedisStore, decisions: Mapping[str, Decision], entries: list[tuple[str, str]]
) -> list[str]:
    """Every decision has exactly one recorded outcome (the hash, keyed by id, holds nothing
    else), none was applied twice (at most one ``applied`` entry per id in the stream, every
    other sighting a ``duplicate`` or a reported race) and the hash's outcome is the one the
    stream recorded; returns the ids in the order their recorded outcome happened."""
    recorded = {k.decode(): v for k, v in store.r.hgetall(store.keys.outcomes()).items()}
    assert set(recorded) == set(decisions), (
        f"outcomes without a decision: {sorted(set(recorded) - set(decisions))[:5]}; "
        f"decisions without an outcome: {sorted(set(decisions) - set(recorded))[:5]}"
    )
    applied = Counter(i for i, o in entries if o == "applied")
    twice = {i: n for i, n in applied.items() if n > 1}
    assert not twice, f"decisions applied more than once: {twice}"
    order: list[str] = []
    for ident in decisions:
        kinds = [o for i, o in entries if i == ident]
        assert any(o in REAL_OUTCOMES for o in kinds), f"{ident}: no real outcome in {kinds}"
    for ident, outcome in entries:
        if ident not in order and outcome == _hash_outcome(store, ident):
            order.append(ident)
    assert set(order) == set(decisions), "every hash outcome appears in the stream"
    return order


def _hash_outcome(store: RedisStore, ident: str) -> str:
    doc = store.outcomes.get(ident)
    return doc["outcome"] if doc else ""


def assert_store_equals_one_pass(
    r: redis.Redis,
    prefix: str,
    reference: RedisStore,
    decisions: Mapping[str, Decision],
    order: list[str],
    config: LoadBalancerConfig,
) -> StoreState:
    """The ring and the leases are exact: the store after the faults equals a fresh copy of the
    starting store (``reference``, set up identically) with every decision applied once, in the
    order the controllers recorded them, at the time each was recorded and with the
    controller's knobs (``apply_knobs``); each replayed outcome equals the recorded one.

    Why tokens as a multiset and the fence: a decision applied twice draws a fencing token twice
    (the fence ends higher), and two controllers on two partitions may draw tokens in either
    order for unrelated bundles, which changes which bundle holds which number but not the
    numbers drawn."""
    now = int(time.time() * 1000)
    actual = check_invariants(r, prefix, now)
    store = RedisStore(r, prefix)
    ttl_ms = int(config.load_balancer_ownership_lease_ttl_seconds * 1000)
    for ident in order:
        doc = store.outcomes.get(ident) or {}
        got = apply_decision(reference, decisions[ident], now_ms=int(doc["atMs"]),
                             lease_ttl_ms=ttl_ms, **apply_knobs(config))  # fmt: skip
        assert got.outcome == doc["outcome"], (ident, got, doc, decisions[ident])
    expected = read_state(r, reference.keys.prefix)
    assert actual.boundaries == expected.boundaries, "namespace bundle ranges"
    assert {b: lease[0] for b, lease in actual.leases.items()} == {
        b: lease[0] for b, lease in expected.leases.items()
    }, "lease owners"
    assert sorted(t for _, t, _ in actual.leases.values()) == sorted(
        t for _, t, _ in expected.leases.values()
    ), "lease tokens"
    assert actual.fence == expected.fence, "tokens drawn (a decision applied twice draws more)"
    assert actual.owned == expected.owned, "owned sets"
    return actual
