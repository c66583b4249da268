"""First lookup assigns a free bundle with the placement strategy over the Redis load snapshot,
and says so with an ``assigned`` ownership event; the sweep reports expired and reassigned."""

from __future__ import annotations

import redis
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from controller.events import (
    ASSIGNED,
    EXPIRED,
    TRANSFERRED,
    EventPublisher,
    OwnershipEvent,
    decode_event,
    encode_event,
)
from controller.placement import lookup_and_assign, lookup_assign_event, put_load_snapshot
from loadbalance.config import LoadBalancerConfig
from loadbalance.model import LocalBrokerData, ResourceUsage
from loadbalance.report_codec import report_to_dict
from metadata_store.leases import Lease
from metadata_store.ownership_redis import RedisStore

NS = "acme/assign"


def read_events(bootstrap: str, topic: str) -> list[tuple[str, OwnershipEvent]]:
    """Every record of a one-partition events topic, decoded, with its key."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{topic}",
                  "enable.partition.eof": True})  # fmt: skip
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    out = []
    try:
        while True:
            m = c.poll(5)
            if m is None or (m.error() and m.error().code() == KafkaError._PARTITION_EOF):
                break
            if not m.error():
                out.append((m.key().decode(), decode_event(m.value())))
    finally:
        c.close()
    return out


def _broker(name: str, rate: float, cpu: float) -> dict:
    r = LocalBrokerData(
        broker=name, cpu=ResourceUsage(cpu, 100), msg_rate_in=rate, msg_throughput_in=rate * 1000
    )
    return {"report": report_to_dict(r), "updatedAtMs": 0}


def test_lookup_assigns_by_strategy_with_preallocation_and_then_keeps_the_owner(
    fresh_redis: redis.Redis,
) -> None:
    store = RedisStore(fresh_redis, prefix="as")
    store.create_namespace(NS, 16)
    for b in ("busy", "idle1", "idle2", "gone"):
        store.register_broker(b, now_ms=0, ttl_ms=10**12 if b != "gone" else 1)
    put_load_snapshot(
        store,
        {
            "busy": _broker("busy", 5000, 95),  # above 85 %: LeastLongTermMessageRate skips it
            "idle1": _broker("idle1", 100, 10),
            "idle2": _broker("idle2", 100, 10),
            "gone": _broker("gone", 0, 0),  # not live in the registry
        },
        {},
    )
    cfg = LoadBalancerConfig(loadBalancerDistributeBundlesEvenlyEnabled=False)
    owners = []
    assigned: dict[str, Lease] = {}
    for i in range(12):
        topic = f"persistent://{NS}/t{i}"
        bundle, lease, event = lookup_assign_event(store, topic, cfg, now_ms=10)
        assert lease is not None
        if bundle in assigned:  # two topics of one bundle: the second finds an owner
            assert event is None and assigned[bundle] == lease
        else:
            assert event == OwnershipEvent(
                ASSIGNED, bundle, 10, new_owner=lease.broker, new_token=lease.token,
                reason=f"lookup of {topic}",
            )  # fmt: skip
            assigned[bundle] = lease
        owners.append(lease.broker)
        again_bundle, again, again_event = lookup_assign_event(store, topic, cfg, now_ms=11)
        assert (again_bundle, again.broker, again.token) == (bundle, lease.broker, lease.token)
        assert again_event is None, "an owned bundle is not assigned again"
    assert set(owners) <= {"idle1", "idle2"}, owners
    counts = {b: owners.count(b) for b in ("idle1", "idle2")}
    assert min(counts.values()) >= 3, f"preallocation spreads assignments: {counts}"
    assert fresh_redis.hlen("as:prealloc:idle1") + fresh_redis.hlen("as:prealloc:idle2") >= 6


def test_no_live_broker_with_load_data_means_no_owner(fresh_redis: redis.Redis) -> None:
    store = RedisStore(fresh_redis, prefix="as2")
    store.create_namespace(NS, 4)
    bundle, lease, event = lookup_assign_event(store, f"{NS}/t", LoadBalancerConfig(), now_ms=5)
    assert lease is None and event is None and bundle.startswith(NS)


def test_expired_leases_are_swept_and_reassigned_to_live_brokers(fresh_redis: redis.Redis) -> None:
    from controller.sweep import sweep_and_reassign

    store = RedisStore(fresh_redis, prefix="sw")
    store.create_namespace(NS, 4)
    store.register_broker("dying", now_ms=0, ttl_ms=1_000)
    store.register_broker("alive", now_ms=0, ttl_ms=10**12)
    put_load_snapshot(
        store, {"alive": _broker("alive", 10, 10), "dying": _broker("dying", 1, 1)}, {}
    )
    names = store.get_namespace(NS).bundle_names
    old = [store.acquire(b, "dying", now_ms=0, ttl_ms=500) for b in names[:2]]
    store.split_bundle(names[1], [0x60000000])  # one of them is gone before the sweep
    events = sweep_and_reassign(store, LoadBalancerConfig(), now_ms=2_000)
    lease = store.owner(names[0], now_ms=2_001)
    assert lease.broker == "alive" and lease.token > old[0].token
    # the split bundle's lease ended with the split, so only names[0] was swept
    assert [decode_event(encode_event(e)) for e in events] == [
        OwnershipEvent(EXPIRED, names[0], 2_000, old_owner="dying", old_token=old[0].token,
                       reason="lease expired at 500"),
        OwnershipEvent(ASSIGNED, names[0], 2_000, new_owner="alive", new_token=lease.token,
                       reason="reassigned: dying expired"),
    ]  # fmt: skip


def test_a_lookup_that_assigns_publishes_the_assigned_event_and_a_plain_one_does_not(
    fresh_redis: redis.Redis, kafka_bootstrap: str, unique_topic
) -> None:
    topic_name = unique_topic(1, "events")
    store = RedisStore(fresh_redis, prefix="pub")
    store.create_namespace(NS, 4)
    store.register_broker("only", now_ms=0, ttl_ms=10**12)
    put_load_snapshot(store, {"only": _broker("only", 10, 10)}, {})
    publisher = EventPublisher(kafka_bootstrap, topic_name)
    try:
        first = lookup_and_assign(store, f"{NS}/a", LoadBalancerConfig(), 7, publisher=publisher)
        again = lookup_and_assign(store, f"{NS}/a", LoadBalancerConfig(), 8, publisher=publisher)
    finally:
        publisher.close()
    assert first == again and first[1].broker == "only"
    records = read_events(kafka_bootstrap, topic_name)
    assert [(k, e.event, e.new_owner, e.new_token) for k, e in records] == [
        (first[0], ASSIGNED, "only", first[1].token)
    ]


def test_lbctl_verbs_publish_their_ownership_changes_unless_told_not_to(
    fresh_redis: redis.Redis, redis_url: str, kafka_bootstrap: str, unique_topic, capsys
) -> None:
    import json
    import time

    from lbctl.main import main

    events = unique_topic(1, "events")
    store = RedisStore(fresh_redis)  # the CLI's default prefix
    store.create_namespace(NS, 2)
    now = int(time.time() * 1000)
    for b in ("b1", "b2"):
        store.register_broker(b, now_ms=now, ttl_ms=600_000)
    put_load_snapshot(store, {"b1": _broker("b1", 10, 10)}, {})
    common = ["--redis-url", redis_url, "--json", "--bootstrap-servers", kafka_bootstrap,
              "--set", f"ownershipEventsTopic={events}"]  # fmt: skip

    def run(*argv: str) -> list[dict]:
        assert main([*argv, *common]) == 0
        return json.loads(capsys.readouterr().out)

    [quiet] = run("lookup", f"{NS}/quiet", "--no-events")
    assert quiet["assigned"] and quiet["owner"] == "b1"
    nb = store.get_namespace(NS)
    loud = next(t for t in (f"{NS}/loud{i}" for i in range(100))
                if nb.find_bundle(t).name != quiet["bundle"])  # fmt: skip
    [row] = run("lookup", loud)
    [again] = run("lookup", loud)
    assert row["assigned"] and row["owner"] == "b1" and not again["assigned"]
    b = row["bundle"]
    [moved] = run("unload", NS, "-b", b.rsplit("/", 1)[1], "-d", "b2")
    assert moved["outcome"] == "applied"
    run("split-bundle", NS, "-b", b.rsplit("/", 1)[1])
    got = [(k, e.event, e.old_owner, e.new_owner) for k, e in read_events(kafka_bootstrap, events)]
    expected = [
        (b, ASSIGNED, None, "b1"),  # the --no-events lookup published nothing
        (b, TRANSFERRED, "b1", "b2"),
        (b, "split", "b2", None),
    ]
    assert got == expected


def test_a_preallocation_ends_once_a_report_lists_its_bundle(fresh_redis: redis.Redis) -> None:
    """Kept, a preallocation would count a bundle on a broker it has left since (moved away
    before that broker reported it) and send the bundle back there on its next lookup."""
    from controller.placement import load_view
    from loadbalance.bundles import NamespaceBundles

    store = RedisStore(fresh_redis, prefix="pa")
    names = NamespaceBundles.initial(NS, 4).bundle_names
    for b in ("b1", "b2"):
        store.register_broker(b, now_ms=0, ttl_ms=10**12)
    store.create_namespace(NS, 4)
    doc = {"shortTerm": {}, "longTerm": {}, "topics": 3}
    store.preallocations.record("b1", names[0], doc)  # moved on to b2, which reports it
    store.acquire(names[0], "b2", now_ms=0, ttl_ms=10**12)
    store.preallocations.record("b1", names[1], doc)  # nobody reports it yet
    store.acquire(names[1], "b1", now_ms=0, ttl_ms=10**12)
    reports = {
        "b1": {"report": report_to_dict(LocalBrokerData(broker="b1")), "updatedAtMs": 0},
        "b2": {
            "report": report_to_dict(LocalBrokerData(broker="b2", bundles=frozenset({names[0]}))),
            "updatedAtMs": 0,
        },
    }
    put_load_snapshot(store, reports, {})
    view = load_view(store, LoadBalancerConfig(), now_ms=10)
    assert view is not None
    assert set(view.preallocated.get("b1", {})) == {names[1]}
    assert set(store.preallocations.of("b1")) == {names[1]}, "the ended one is deleted in Redis"
