"""The control loop over a real Kafka-protocol broker and Redis: apply, record, publish, commit.

The ownership events are read back from Kafka and decoded with ``decode_event``, so the test
checks what a follower would see: the kind, the key, old and new owners and fencing tokens,
split children and the merge result, and the sweep's expired/assigned pair.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import redis
from confluent_kafka import Producer

from controller.apply import outcome_of
from controller.events import (
    ASSIGNED,
    EXPIRED,
    MERGED,
    RELEASED,
    SPLIT,
    TRANSFERRED,
    EventPublisher,
    OwnershipEvent,
)
from controller.loop import run_loop
from controller.placement import put_load_snapshot
from infra import metrics
from loadbalance.config import LoadBalancerConfig
from loadbalance.decisions import MERGE, TRANSFER, UNLOAD, encode_decision, make_decision
from loadbalance.decisions import SPLIT as SPLIT_DECISION
from loadbalance.errors import Transient
from loadbalance.model import LocalBrokerData, ResourceUsage
from loadbalance.report_codec import report_to_dict
from metadata_store.ownership_redis import RedisStore
from tests.integration.test_assignment import read_events

NS = "acme/loop"
REPO = Path(__file__).resolve().parents[2]


def _load(name: str) -> dict:
    r = LocalBrokerData(broker=name, cpu=ResourceUsage(10, 100), msg_rate_in=10)
    return {"report": report_to_dict(r), "updatedAtMs": 0}


def _scrape(port: int) -> dict[str, float]:
    """The exporter's samples over HTTP: ``name{labels}`` -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def test_loop_applies_decisions_publishes_their_events_sweeps_and_commits(
    kafka_bootstrap: str, unique_topic, fresh_redis: redis.Redis
) -> None:
    decisions, events = unique_topic(1, "decisions"), unique_topic(1, "events")
    store = RedisStore(fresh_redis, prefix="loop")
    store.create_namespace(NS, 8)
    now = 1_000
    for b in ("b1", "b2"):
        store.register_broker(b, now_ms=0, ttl_ms=10**13)
    store.register_broker("dying", now_ms=0, ttl_ms=500)
    put_load_snapshot(store, {"b1": _load("b1"), "b2": _load("b2")}, {})
    n = store.get_namespace(NS).bundle_names
    held = {i: store.acquire(n[i], o, now_ms=0, ttl_ms=10**13)
            for i, o in ((0, "b1"), (1, "b1"), (2, "b2"), (3, "b2"), (4, "b1"))}  # fmt: skip
    doomed = store.acquire(n[6], "dying", now_ms=0, ttl_ms=400)  # expired at `now`
    move = make_decision(cycle="7", kind=TRANSFER, bundle=n[0], source_broker="b1",
                         destination_broker="b2", reason="Overloaded")  # fmt: skip
    split = make_decision(cycle="7", kind=SPLIT_DECISION, bundle=n[1], source_broker="b1",
                          split_boundaries=(0x30000000,), reason="MsgRate")  # fmt: skip
    merge = make_decision(cycle="7", kind=MERGE, bundle=n[2], merge_bundle=n[3], source_broker="b2",
                          reason="Underloaded")  # fmt: skip
    unload = make_decision(cycle="7", kind=UNLOAD, bundle=n[4], source_broker="b1",
                           reason="Overloaded")  # fmt: skip
    place = make_decision(cycle="7", kind=TRANSFER, bundle=n[5], source_broker=None,
                          destination_broker="b1", reason="Admin")  # fmt: skip
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    for value in (encode_decision(move), b"{not json", encode_decision(split),
                  encode_decision(merge), encode_decision(unload), encode_decision(place),
                  encode_decision(move)):  # the last is a duplicate of the first  # fmt: skip
        p.produce(decisions, value=value)
    p.flush(10)

    before = (
        metrics.REGISTRY.get_sample_value(
            "lbctl_control_decisions_total", {"kind": "transfer", "outcome": "applied"}
        )
        or 0.0
    )
    port = metrics.serve(0)
    try:
        cfg = {"bootstrap.servers": kafka_bootstrap}
        stats = run_loop(store, client_config=cfg, decisions_topic=decisions, events_topic=events,
                         group_id="ctl", max_messages=7, clock=lambda: now,
                         config=LoadBalancerConfig(), sweep_interval_s=0)  # fmt: skip
        scraped = _scrape(port)
    finally:
        metrics.stop_all()
    assert (stats.consumed, stats.applied, stats.rejected, stats.other) == (7, 5, 1, 1)
    assert stats.expired == 1 and stats.sweeps >= 1 and stats.events == 8
    applied = scraped['lbctl_control_decisions_total{kind="transfer",outcome="applied"}']
    assert applied - before == 2, "move and place, counted once each; the duplicate is not"
    assert scraped['lbctl_control_decisions_total{kind="transfer",outcome="duplicate"}'] >= 1
    assert scraped['lbctl_ownership_events_published_total{event="expired"}'] >= 1
    assert scraped['lbctl_ownership_events_published_total{event="merged"}'] >= 2

    moved = store.owner(n[0], now + 1)
    placed = store.owner(n[5], now + 1)
    reassigned = store.owner(n[6], now + 1)
    assert moved.broker == "b2" and placed.broker == "b1"
    assert reassigned.broker in ("b1", "b2") and reassigned.token > doomed.token
    assert 0x30000000 in store.get_namespace(NS).boundaries
    assert outcome_of(store, move.id).outcome == "applied"
    assert any(b"record:" in k for k in fresh_redis.hkeys("loop:outcomes"))

    merged_name = f"{NS}/0x40000000_0x80000000"
    evs = read_events(kafka_bootstrap, events)
    assert all(key == e.bundle for key, e in evs), "keyed by bundle"
    assert [e for _, e in evs] == [
        OwnershipEvent(EXPIRED, n[6], now, old_owner="dying", old_token=doomed.token,
                       reason="lease expired at 400"),
        OwnershipEvent(ASSIGNED, n[6], now, new_owner=reassigned.broker,
                       new_token=reassigned.token, reason="reassigned: dying expired"),
        OwnershipEvent(TRANSFERRED, n[0], now, old_owner="b1", old_token=held[0].token,
                       new_owner="b2", new_token=moved.token, decision_id=move.id,
                       reason="Overloaded"),
        OwnershipEvent(SPLIT, n[1], now, old_owner="b1", old_token=held[1].token,
                       decision_id=split.id, reason="MsgRate",
                       children=(f"{NS}/0x20000000_0x30000000", f"{NS}/0x30000000_0x40000000")),
        OwnershipEvent(MERGED, n[2], now, old_owner="b2", old_token=held[2].token,
                       decision_id=merge.id, reason="Underloaded", children=(merged_name,)),
        OwnershipEvent(MERGED, n[3], now, old_owner="b2", old_token=held[3].token,
                       decision_id=merge.id, reason="Underloaded", children=(merged_name,)),
        OwnershipEvent(RELEASED, n[4], now, old_owner="b1", old_token=held[4].token,
                       decision_id=unload.id, reason="Overloaded"),
        OwnershipEvent(ASSIGNED, n[5], now, new_owner="b1", new_token=placed.token,
                       decision_id=place.id, reason="Admin"),
    ]  # fmt: skip
    assert moved.token > held[0].token

    again = run_loop(store, client_config=cfg, decisions_topic=decisions, events_topic=events,
                     group_id="ctl", idle_timeout_s=4, clock=lambda: now)  # fmt: skip
    assert again.consumed == 0, "offsets were committed: nothing is consumed twice"
    assert len(read_events(kafka_bootstrap, events)) == len(evs), "and nothing is re-published"


def test_lbctl_control_serves_metrics_that_count_the_applied_decision(
    kafka_bootstrap: str, unique_topic, redis_url: str, fresh_redis: redis.Redis, capsys
) -> None:
    from lbctl.main import main

    decisions, events = unique_topic(1, "decisions"), unique_topic(1, "events")
    store = RedisStore(fresh_redis)  # the CLI's default prefix
    store.create_namespace(NS, 2)
    store.register_broker("b1", now_ms=0, ttl_ms=10**13)
    bundle = store.get_namespace(NS).bundle_names[0]
    lease = store.acquire(bundle, "b1", now_ms=0, ttl_ms=10**13)
    unload = make_decision(cycle="9", kind=UNLOAD, bundle=bundle, source_broker="b1",
                           reason="Overloaded")  # fmt: skip
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    p.produce(decisions, value=encode_decision(unload))
    p.flush(10)
    before = (
        metrics.REGISTRY.get_sample_value(
            "lbctl_control_decisions_total", {"kind": "unload", "outcome": "applied"}
        )
        or 0.0
    )
    try:
        code = main(["control", "--redis-url", redis_url, "--bootstrap-servers", kafka_bootstrap,
                     "--group", "cli-ctl", "--max-messages", "1", "--metrics-port", "0",
                     "--set", f"decisionsTopic={decisions}",
                     "--set", f"ownershipEventsTopic={events}"])  # fmt: skip
        stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        scraped = _scrape(stats["metricsPort"])
    finally:
        metrics.stop_all()
    assert code == 0 and (stats["applied"], stats["events"]) == (1, 1)
    key = 'lbctl_control_decisions_total{kind="unload",outcome="applied"}'
    assert scraped[key] - before == 1
    assert scraped['lbctl_ownership_events_published_total{event="released"}'] >= 1
    assert store.owner(bundle, now_ms=1) is None
    [(_, event)] = read_events(kafka_bootstrap, events)
    assert (event.event, event.old_owner, event.old_token) == (RELEASED, "b1", lease.token)


def _control_until_fault(argv: list[str], point: str, log: Path) -> None:
    """Run ``lbctl control`` as a real process that dies (exit 137) at ``point``."""
    env = {**os.environ, "LBCTL_FAULT_POINT": point}
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "lbctl.main", *argv], env=env,
                                stdout=out, stderr=subprocess.STDOUT, cwd=REPO)  # fmt: skip
        try:
            assert proc.wait(120) == 137, f"no death at {point}: see {log}"
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def test_events_of_a_change_made_before_a_kill_are_published_by_the_replay(
    kafka_bootstrap: str, unique_topic, redis_url: str, fresh_redis: redis.Redis, tmp_path: Path
) -> None:
    decisions, events = unique_topic(1, "decisions"), unique_topic(1, "events")
    store = RedisStore(fresh_redis, prefix="crash")
    store.create_namespace(NS, 4)
    for b in ("b1", "b2"):
        store.register_broker(b, now_ms=0, ttl_ms=10**13)
    n = store.get_namespace(NS).bundle_names
    old = [store.acquire(n[i], "b1", now_ms=0, ttl_ms=10**13) for i in (0, 1)]
    moves = [make_decision(cycle="k", kind=TRANSFER, bundle=n[i], source_broker="b1",
                           destination_broker="b2", reason="Overloaded")
             for i in (0, 1)]  # fmt: skip
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    for d in moves:
        p.produce(decisions, value=encode_decision(d))
    p.flush(10)
    argv = ["control", "--redis-url", redis_url, "--bootstrap-servers", kafka_bootstrap,
            "--group", "crash", "--set", "redisKeyPrefix=crash",
            "--set", f"decisionsTopic={decisions}",
            "--set", f"ownershipEventsTopic={events}"]  # fmt: skip
    log = tmp_path / "control.log"
    # 1. the first transfer is made in Redis, then the process dies: no outcome, no event
    _control_until_fault(argv, "after-transfer-script", log)
    assert store.owner(n[0], now_ms=1).broker == "b2" and outcome_of(store, moves[0].id) is None
    assert read_events(kafka_bootstrap, events) == []
    # 2. the replay finds it made, records that, and dies before publishing or committing
    _control_until_fault(argv, "after-outcome", log)
    assert outcome_of(store, moves[0].id).outcome == "already_satisfied"
    assert read_events(kafka_bootstrap, events) == []
    # 3. a clean run: the duplicate announces the first transfer, the second is applied
    stats = run_loop(store, client_config={"bootstrap.servers": kafka_bootstrap},
                     decisions_topic=decisions, events_topic=events, group_id="crash",
                     max_messages=2)  # fmt: skip
    assert (stats.consumed, stats.applied, stats.events) == (2, 1, 2)
    got = [(k, e.event, e.old_owner, e.old_token, e.new_owner, e.new_token, e.decision_id)
           for k, e in read_events(kafka_bootstrap, events)]  # fmt: skip
    now = [store.owner(n[i], now_ms=1) for i in (0, 1)]
    assert got == [
        (n[i], TRANSFERRED, "b1", old[i].token, "b2", now[i].token, moves[i].id) for i in (0, 1)
    ]
    assert fresh_redis.hlen("crash:event-outbox") == 0, "the outbox is emptied once delivered"


class _GivesUpFast(EventPublisher):
    """A publisher to a dead Kafka that gives up after two short tries (instead of waiting
    for a stop signal as the loop asks), so the test sees the loop's failure path quickly."""

    def deliver(self, events, **_kw) -> int:  # type: ignore[override]
        return super().deliver(events, attempts=2, backoff_s=0.05, flush_timeout_s=0.5)


def test_no_offset_is_committed_before_the_events_are_delivered(
    kafka_bootstrap: str, unique_topic, fresh_redis: redis.Redis
) -> None:
    decisions, events = unique_topic(1, "decisions"), unique_topic(1, "events")
    store = RedisStore(fresh_redis, prefix="nocommit")
    store.create_namespace(NS, 2)
    for b in ("b1", "b2"):
        store.register_broker(b, now_ms=0, ttl_ms=10**13)
    bundle = store.get_namespace(NS).bundle_names[0]
    old = store.acquire(bundle, "b1", now_ms=0, ttl_ms=10**13)
    move = make_decision(cycle="n", kind=TRANSFER, bundle=bundle, source_broker="b1",
                         destination_broker="b2", reason="Overloaded")  # fmt: skip
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    p.produce(decisions, value=encode_decision(move))
    p.flush(10)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    cfg = {"bootstrap.servers": kafka_bootstrap}
    with pytest.raises(Transient):
        run_loop(store, client_config=cfg, decisions_topic=decisions, events_topic=events,
                 group_id="nc", max_messages=1, clock=lambda: 5,
                 publisher=_GivesUpFast(dead, events))  # fmt: skip
    assert store.owner(bundle, now_ms=6).broker == "b2", "Redis was changed"
    assert fresh_redis.hexists("nocommit:event-outbox", move.id), "its events are owed"
    stats = run_loop(store, client_config=cfg, decisions_topic=decisions, events_topic=events,
                     group_id="nc", max_messages=1, clock=lambda: 7)  # fmt: skip
    assert stats.consumed == 1, "the record came again: its offset was not committed"
    new = store.owner(bundle, now_ms=8)
    [(_, e)] = read_events(kafka_bootstrap, events)
    assert (e.event, e.old_owner, e.old_token, e.new_owner, e.new_token, e.decision_id) == (
        TRANSFERRED, "b1", old.token, "b2", new.token, move.id
    )  # fmt: skip


def test_lbctl_control_creates_its_topics_so_a_decision_published_after_start_is_applied(
    kafka_bootstrap: str, redis_url: str, fresh_redis: redis.Redis, capsys
) -> None:
    """Subscribing to a topic that does not exist yet must not leave the group idle."""
    import threading
    import uuid

    from confluent_kafka.admin import AdminClient

    from lbctl.main import main

    suffix = uuid.uuid4().hex[:8]
    decisions, events = f"decisions-new-{suffix}", f"events-new-{suffix}"
    store = RedisStore(fresh_redis)
    store.create_namespace(NS, 2)
    store.register_broker("b1", now_ms=0, ttl_ms=10**13)
    bundle = store.get_namespace(NS).bundle_names[0]
    store.acquire(bundle, "b1", now_ms=0, ttl_ms=10**13)
    unload = make_decision(cycle="7", kind=UNLOAD, bundle=bundle, source_broker="b1",
                           reason="Overloaded")  # fmt: skip
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})

    found: list[bool] = []

    def publish_once_the_topic_exists() -> None:
        for _ in range(150):  # up to ~15 s: the controller must create the topic itself
            if decisions in admin.list_topics(timeout=5).topics:
                found.append(True)
                break
            threading.Event().wait(0.1)
        p = Producer({"bootstrap.servers": kafka_bootstrap})
        p.produce(decisions, value=encode_decision(unload))
        p.flush(10)

    publisher = threading.Thread(target=publish_once_the_topic_exists, daemon=True)
    publisher.start()
    code = main(["control", "--redis-url", redis_url, "--bootstrap-servers", kafka_bootstrap,
                 "--group", f"new-{suffix}", "--max-messages", "1",
                 "--set", f"decisionsTopic={decisions}",
                 "--set", f"ownershipEventsTopic={events}"])  # fmt: skip
    publisher.join(10)
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert found, "lbctl control did not create the decisions topic before consuming"
    assert code == 0 and stats["applied"] == 1
    assert events in admin.list_topics(timeout=5).topics
    assert store.owner(bundle, now_ms=1) is None
