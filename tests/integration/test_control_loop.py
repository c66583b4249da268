"""The control loop over a real Kafka-protocol broker and Redis: apply, record, publish, commit."""

from __future__ import annotations

import json

import redis
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from controller.apply import outcome_of
from controller.loop import run_loop
from controller.redis_store import RedisStore
from loadbalance.decisions import SPLIT, TRANSFER, encode_decision, make_decision

NS = "acme/loop"


def _read_all(bootstrap: str, topic: str) -> list[tuple[bytes, dict]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader",
                  "enable.partition.eof": True})  # fmt: skip
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    out = []
    while True:
        m = c.poll(5)
        if m is None or (m.error() and m.error().code() == -191):  # partition EOF
            break
        if not m.error():
            out.append((m.key(), json.loads(m.value())))
    c.close()
    return out


def test_loop_applies_decisions_rejects_garbage_publishes_events_and_commits(
    kafka_bootstrap: str, unique_topic, fresh_redis: redis.Redis
) -> None:
    decisions, events = unique_topic(1, "decisions"), unique_topic(1, "events")
    store = RedisStore(fresh_redis, prefix="loop")
    store.create_namespace(NS, 4)
    now = 1_000
    for b in ("b1", "b2"):
        store.register_broker(b, now_ms=0, ttl_ms=10**13)
    names = store.get_namespace(NS).bundle_names
    store.acquire(names[0], "b1", now_ms=0, ttl_ms=10**13)
    move = make_decision(cycle="7", kind=TRANSFER, bundle=names[0], source_broker="b1",
                         destination_broker="b2", reason="Overloaded")  # fmt: skip
    split = make_decision(cycle="7", kind=SPLIT, bundle=names[1], source_broker="b1",
                          split_boundaries=(0x60000000,), reason="MsgRate")  # fmt: skip
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    for value in (encode_decision(move), b"{not json", encode_decision(split),
                  encode_decision(move)):  # a duplicate of the first  # fmt: skip
        p.produce(decisions, value=value)
    p.flush(10)
    cfg = {"bootstrap.servers": kafka_bootstrap}
    stats = run_loop(store, client_config=cfg, decisions_topic=decisions, events_topic=events,
                     group_id="ctl", max_messages=4, clock=lambda: now)  # fmt: skip
    assert (stats.consumed, stats.applied, stats.rejected) == (4, 2, 1)
    assert store.owner(names[0], now + 1).broker == "b2"
    assert 0x60000000 in store.get_namespace(NS).boundaries
    assert outcome_of(store, move.id).outcome == "applied"
    assert any(b"record:" in k for k in fresh_redis.hkeys("loop:outcomes"))
    evs = _read_all(kafka_bootstrap, events)
    assert [(k.decode(), e["event"]) for k, e in evs] == [
        (names[0], "transferred"),
        (names[1], "split"),
    ]
    again = run_loop(store, client_config=cfg, decisions_topic=decisions, events_topic=events,
                     group_id="ctl", idle_timeout_s=4, clock=lambda: now)  # fmt: skip
    assert again.consumed == 0, "offsets were committed: nothing is consumed twice"
