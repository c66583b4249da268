"""The reconciler without Kafka: ``reconcile(decision) -> Outcome`` against a real Redis.

The runner (``controller.loop``) is covered over a Kafka-protocol broker by
``test_control_loop.py``; these tests pin what the reconciler itself promises: the events of an
applied decision reach ``publish``, the event outbox entry outlives a failed publish (so the
replay announces the change), and a replay publishes the saved events once and clears them.
"""

from __future__ import annotations

import pytest
import redis

from controller.apply import ALREADY_SATISFIED, APPLIED, DUPLICATE, REJECTED
from controller.events import OwnershipEvent
from controller.reconciler import Reconciler
from loadbalance.decisions import TRANSFER, make_decision
from loadbalance.errors import Transient
from metadata_store.ownership_redis import RedisStore

NS = "acme/rec"


def _setup(fresh_redis: redis.Redis) -> tuple[RedisStore, list[str]]:
    store = RedisStore(fresh_redis, prefix="rec")
    store.create_namespace(NS, 4)
    for b in ("b1", "b2"):
        store.register_broker(b, now_ms=0, ttl_ms=10**13)
    names = store.get_namespace(NS).bundle_names
    store.acquire(names[0], "b1", now_ms=0, ttl_ms=10**13)
    return store, names


def test_reconcile_applies_publishes_the_events_and_clears_the_outbox(
    fresh_redis: redis.Redis,
) -> None:
    store, names = _setup(fresh_redis)
    published: list[OwnershipEvent] = []
    rec = Reconciler(store, publish=published.extend, clock=lambda: 1_000)
    move = make_decision(cycle="1", kind=TRANSFER, bundle=names[0], source_broker="b1",
                         destination_broker="b2", reason="Overloaded")  # fmt: skip

    outcome = rec.reconcile(move)

    assert outcome.outcome == APPLIED
    assert store.owner(names[0], 1_000).broker == "b2"
    assert [(e.event, e.old_owner, e.new_owner) for e in published] == [("transferred", "b1", "b2")]
    assert store.outbox.get(move.id) is None
    assert rec.reconcile(move).outcome == DUPLICATE
    assert len(published) == 1  # a plain duplicate announces nothing again


def test_a_failed_publish_keeps_the_outbox_and_the_replay_announces_the_change(
    fresh_redis: redis.Redis,
) -> None:
    store, names = _setup(fresh_redis)

    def refuse(events: list[OwnershipEvent]) -> None:
        if events:
            raise Transient("Kafka away")

    move = make_decision(cycle="1", kind=TRANSFER, bundle=names[0], source_broker="b1",
                         destination_broker="b2", reason="Overloaded")  # fmt: skip
    with pytest.raises(Transient):
        Reconciler(store, publish=refuse, clock=lambda: 1_000).reconcile(move)
    assert store.owner(names[0], 1_000).broker == "b2"  # Redis changed ...
    assert store.outbox.get(move.id) is not None  # ... and its events are still owed

    published: list[OwnershipEvent] = []
    outcome = Reconciler(store, publish=published.extend, clock=lambda: 2_000).reconcile(move)

    assert outcome.outcome in (DUPLICATE, ALREADY_SATISFIED)
    assert [(e.event, e.old_owner, e.old_token, e.new_owner) for e in published] == [
        ("transferred", "b1", 1, "b2")
    ]
    assert store.outbox.get(move.id) is None


def test_reject_records_an_unreadable_record_by_where_it_was(fresh_redis: redis.Redis) -> None:
    store, _ = _setup(fresh_redis)
    rec = Reconciler(store, publish=lambda _e: None, clock=lambda: 5)
    outcome = rec.reject("decisions/0/7", "not valid JSON")
    assert outcome.outcome == REJECTED
    assert store.outcomes.get("record:decisions/0/7")["outcome"] == REJECTED
