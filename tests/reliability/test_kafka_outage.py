"""The Kafka broker goes away for a while and comes back, under a running ``lbctl control``.

"Away" is a SIGSTOP of the embedded Kafka broker for longer than the consumer's session
timeout (6 s) and poll interval (10 s), then SIGCONT: connections stay open and nothing answers,
like a hung or partitioned broker (a restart and a crash are the cluster-fault tests' cases).
Decisions produced during the outage (held by the producer) and after it must all be applied
once, with no manual action.
"""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from controller.apply import outcome_of
from infra.embedded import EmbeddedKafka
from infra.offsets import latest_offsets
from infra.topics import ensure_topics
from loadbalance.decisions import TRANSFER, encode_decision, make_decision
from metadata_store.ownership_redis import RedisStore
from tests.reliability.invariants import check_invariants, lbctl, set_args, stop, wait_for

pytestmark = pytest.mark.integration

NS = "acme/outage"
HOUR_MS = 3_600_000
AWAY_S = 15.0


def test_controller_waits_through_a_kafka_outage_and_applies_everything_after(
    fresh_redis, redis_url, tmp_path
):
    kafka = EmbeddedKafka(tmp_path / "kafka")
    kafka.start()
    proc = None
    try:
        bootstrap = kafka.bootstrap_servers
        prefix = f"out{uuid.uuid4().hex[:6]}"
        decisions_topic, events_topic = f"dec-{prefix}", f"ev-{prefix}"
        ensure_topics(bootstrap, {decisions_topic: 1, events_topic: 1})
        store = RedisStore(fresh_redis, prefix)
        store.create_namespace(NS, 8)
        now = int(time.time() * 1000)
        for b in ("b1", "b2"):
            store.register_broker(b, now, HOUR_MS)
        names = store.get_namespace(NS).bundle_names
        for n in names:
            store.acquire(n, "b1", now, HOUR_MS)
        moves = [
            make_decision(
                cycle="o", kind=TRANSFER, bundle=n, source_broker="b1", destination_broker="b2"
            )
            for n in names
        ]
        producer = Producer({"bootstrap.servers": bootstrap})

        def publish(ds) -> None:
            for d in ds:
                producer.produce(decisions_topic, key=d.bundle.encode(), value=encode_decision(d))

        publish(moves[:2])
        assert producer.flush(10) == 0
        group = "ctl-outage"
        proc = lbctl(
            ["control", "--redis-url", redis_url, "--bootstrap-servers", bootstrap,
             "--group", group, *set_args({"redisKeyPrefix": prefix,
                                          "decisionsTopic": decisions_topic,
                                          "ownershipEventsTopic": events_topic,
                                          "loadBalancerOwnershipLeaseTtlSeconds": 3600})],
            tmp_path / "control.log",
        )  # fmt: skip
        wait_for("the first two outcomes", lambda: all(outcome_of(store, d.id) for d in moves[:2]),
                 timeout_s=60)  # fmt: skip

        assert kafka.pid is not None
        os.kill(kafka.pid, signal.SIGSTOP)
        try:
            publish(moves[2:5])  # produced during the outage: the producer holds them
            time.sleep(AWAY_S)
            assert proc.poll() is None, "the controller must wait, not exit"
        finally:
            os.kill(kafka.pid, signal.SIGCONT)
        back = time.monotonic()
        assert producer.flush(30) == 0
        publish(moves[5:])
        assert producer.flush(10) == 0
        wait_for("every outcome after the outage",
                 lambda: all(outcome_of(store, d.id) for d in moves), timeout_s=90)  # fmt: skip
        print(f"figure: Kafka back to every outcome {time.monotonic() - back:.1f} s")
        assert proc.poll() is None
        # nothing skipped, nothing twice: one applied outcome each, offsets committed to the end
        assert [outcome_of(store, d.id).outcome for d in moves] == ["applied"] * len(moves)
        assert fresh_redis.xlen(f"{prefix}:outcome-stream") == len(moves)
        s = check_invariants(fresh_redis, prefix, int(time.time() * 1000))
        assert all(s.live_owner(n, int(time.time() * 1000)) == "b2" for n in names)
        end = sum(latest_offsets(bootstrap, decisions_topic).values())
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
        try:
            wait_for(
                "the offsets committed up to the end",
                lambda: (
                    c.committed([TopicPartition(decisions_topic, 0)], timeout=10)[0].offset == end
                ),
                timeout_s=20,
            )
        finally:
            c.close()
        assert end == len(moves)
    finally:
        if proc is not None:
            stop(proc)
        kafka.stop()
