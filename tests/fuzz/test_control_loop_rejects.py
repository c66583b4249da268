"""Hostile decision records through the real control loop: each rejected with a reason, no crash.

A few hundred records of every bad class, interleaved with good decisions, go onto a real
Kafka-protocol topic; ``controller.loop.run_loop`` consumes them against the real Redis. The loop
must consume every record (it did not stop on one), record a ``rejected`` outcome with a reason
under each bad record's coordinates, and an outcome for each good decision.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter

import redis
from confluent_kafka import Producer

from controller.loop import run_loop
from loadbalance.decisions import decode_decision
from metadata_store.ownership_redis import RedisStore
from tests.fuzz.corpus import DECISION_CLASSES, NAMESPACES, decision_cases

N_RECORDS = 330


def test_hostile_decisions_are_rejected_by_the_running_loop(
    kafka_bootstrap: str, fresh_redis: redis.Redis, unique_topic
) -> None:
    topic, events = unique_topic(1, "decisions"), unique_topic(1, "events")
    store = RedisStore(fresh_redis, prefix=f"c{uuid.uuid4().hex[:6]}")
    for ns in NAMESPACES:
        store.create_namespace(ns, 4)
    records = list(decision_cases(N_RECORDS, seed=5, valid_share=0.1))
    assert set(Counter(c.cls for c in records)) == set(DECISION_CLASSES)
    p = Producer({"bootstrap.servers": kafka_bootstrap, "message.max.bytes": 4_000_000})
    for case in records:
        p.produce(topic, value=case.value)
        p.poll(0)
    assert p.flush(30) == 0

    stats = run_loop(
        store,
        client_config={"bootstrap.servers": kafka_bootstrap},
        decisions_topic=topic,
        events_topic=events,
        group_id=f"g-{uuid.uuid4().hex[:6]}",
        max_messages=len(records),
        idle_timeout_s=60,
    )
    assert stats.consumed == len(records)
    outcomes = {
        k.decode(): json.loads(v) for k, v in fresh_redis.hgetall(f"{store.p}:outcomes").items()
    }
    for offset, case in enumerate(records):
        if case.bad:
            doc = outcomes.get(f"record:{topic}/0/{offset}")
            assert doc is not None, (offset, case.cls, case.note)
            assert doc["outcome"] == "rejected" and doc["reason"], doc
        else:
            d = decode_decision(case.value)
            assert d.id in outcomes, (offset, case.note)
