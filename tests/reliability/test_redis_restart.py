"""Redis restarts: with AOF the store survives as it was; without persistence the controller
rebuilds a valid store from the brokers' re-registration and reports what it lost.

Each test starts its own Redis (``EmbeddedRedis``) in ``tmp_path``, since it restarts it.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter

import pytest

from controller.placement import put_load_snapshot
from controller.recovery import (
    claims_from_snapshot,
    current_epoch,
    detect_loss,
    last_report,
    recover,
)
from infra.embedded import EmbeddedRedis, free_port
from loadbalance.model import LocalBrokerData, ResourceUsage
from loadbalance.report_codec import report_to_dict
from metadata_store.keys import Keys
from metadata_store.load_snapshot import shards_from_docs
from metadata_store.ownership_redis import RedisStore
from producers.agent import LeaseKeeper
from tests.reliability.invariants import check_invariants, read_state

pytestmark = pytest.mark.integration

NS, OTHER = "acme/persist", "acme/quiet"
TTL_MS = 60_000
T0 = 1_000_000


def _populate(store: RedisStore) -> list[str]:
    """Two namespaces, a split, leases on three brokers, an outcome: a store worth keeping."""
    store.create_namespace(NS, 4)
    store.create_namespace(OTHER, 2)
    for b in ("b1", "b2", "b3"):
        store.register_broker(b, T0, TTL_MS)
    first = store.get_namespace(NS).bundle_names[0]
    store.split_bundle(first, [0x20000000])
    names = store.get_namespace(NS).bundle_names
    for i, n in enumerate(names):
        store.acquire(n, ("b1", "b2", "b3")[i % 3], T0, TTL_MS)
    lease = store.owner(names[0], T0)
    store.transfer(names[0], lease.broker, lease.token, "b2", T0, TTL_MS)
    store.r.hset(f"{store.p}:outcomes", "d1", json.dumps({"outcome": "applied"}))
    return names


@pytest.mark.parametrize("how", ["sigterm", "sigkill-appendfsync-always"])
def test_with_aof_a_restart_keeps_ranges_leases_tokens_and_outcomes(tmp_path, how):
    server = EmbeddedRedis(tmp_path, port=free_port(), appendonly=True)
    server.start()
    try:
        client = server.client()
        store = RedisStore(client, "aof")
        if how != "sigterm":
            client.config_set("appendfsync", "always")  # every write on disk before the reply
        _populate(store)
        before = read_state(client, "aof")
        dump_before = {k: client.type(k) for k in client.scan_iter("aof:*")}
        if how == "sigterm":
            server.restart()  # SIGTERM: Redis flushes the AOF on shutdown
        else:
            assert server._proc is not None
            server._proc.send_signal(signal.SIGKILL)
            server._proc.wait(10)
            server.start()  # same port, same data dir
        client = server.client()
        after = check_invariants(client, "aof", T0 + 1)
        assert (after.boundaries, after.versions, after.leases, after.owned, after.fence) == (
            before.boundaries, before.versions, before.leases, before.owned, before.fence
        )  # fmt: skip
        assert {k: client.type(k) for k in client.scan_iter("aof:*")} == dump_before
        assert json.loads(client.hget("aof:outcomes", "d1"))["outcome"] == "applied"
        store = RedisStore(client, "aof")
        assert detect_loss(store, current_epoch(store), {}) is None
        new = store.acquire(store.get_namespace(OTHER).bundle_names[0], "b1", T0 + 2, TTL_MS)
        assert new.token > before.fence, "the fence counter survived too"
    finally:
        server.stop()


def _load(name: str) -> dict:
    r = LocalBrokerData(broker=name, cpu=ResourceUsage(20, 100), msg_rate_in=10.0)
    return {"report": report_to_dict(r), "updatedAtMs": T0}


def test_without_persistence_the_store_is_rebuilt_from_reregistration_and_losses_reported(
    tmp_path,
):
    server = EmbeddedRedis(tmp_path, appendonly=False)
    server.start()
    try:
        store = RedisStore(server.client(), "lost")
        _populate(store)
        before = check_invariants(store.r, "lost", T0 + 1)
        epoch = current_epoch(store)
        assert epoch is not None
        # what the brokers serve (they keep serving through the outage) and the last token the
        # controller saw on the ownership-events topic
        serving = {b: sorted(n for n, (o, _, _) in before.leases.items() if o == b)
                   for b in ("b1", "b2", "b3")}  # fmt: skip
        old_tokens = {n: t for n, (_, t, _) in before.leases.items()}
        server.restart()
        store = RedisStore(server.client(), "lost")
        assert store.list_namespaces() == [] and current_epoch(store) is None

        # brokers re-register on their next check (b3 never comes back) ...
        now = T0 + 5_000
        keepers = {b: LeaseKeeper(store, b, TTL_MS, TTL_MS) for b in ("b1", "b2")}
        for b, k in keepers.items():
            assert k.heartbeat(serving[b], now) == {}, "nothing to renew: the store is empty"
        # ... and keep reporting: the streaming job rewrites the snapshot with who serves what
        put_load_snapshot(store, {b: _load(b) for b in keepers}, {})
        docs = {n: {"broker": b} for b in ("b1", "b2", "b3") for n in serving[b]}
        stale_parent = f"{NS}/0x00000000_0x40000000"  # an old report of the split's parent
        docs[stale_parent] = {"broker": "b1"}
        store.r.hset(Keys("lost").load_shards(), mapping=shards_from_docs(docs))

        claims = claims_from_snapshot(store, now)
        assert set(claims) == {"b1", "b2"}, "only registered, live brokers' claims count"
        reason = detect_loss(store, epoch, claims)
        assert reason and "epoch" in reason
        assert "unknown namespaces" in detect_loss(store, None, claims)

        report = recover(store, claims, now_ms=now, lease_ttl_ms=TTL_MS,
                         token_floor=before.fence, reason=reason,
                         known_namespaces={OTHER: 2})  # fmt: skip

        after = check_invariants(store.r, "lost", now)
        assert after.boundaries[NS] == before.boundaries[NS], "the split survived via reports"
        assert after.boundaries[OTHER] == before.boundaries[OTHER]
        assert all(v > before.versions[NS] for v in after.versions.values())
        for b in ("b1", "b2"):
            for n in serving[b]:
                assert after.live_owner(n, now) == b
                assert after.leases[n][1] > before.fence >= old_tokens[n]
        assert (stale_parent, "b1") in [(x, y) for x, y, _ in report.refused]
        assert sorted(report.unowned) == sorted(
            serving["b3"] + store.get_namespace(OTHER).bundle_names
        ), "b3's bundles and the quiet namespace are free, to be assigned on lookup"
        assert report.namespaces[NS].gaps_filled == len(serving["b3"])
        assert report.namespaces[OTHER].source == "default"
        assert any("outcomes" in line for line in report.lost)
        stored = last_report(store)
        assert stored is not None and stored["reason"] == reason
        assert detect_loss(store, current_epoch(store), claims) is None

        # the brokers' agents find and renew their re-granted leases; a stale token is refused
        assert all(keepers["b1"].heartbeat(serving["b1"], now + 1).values())
        stale = {n: old_tokens[n] for n in serving["b2"]}
        assert not any(store.renew_all("b2", stale, now + 1, TTL_MS).values())
    finally:
        server.stop()


@pytest.mark.parametrize("down_s", [0.0, 12.0])
def test_a_running_controller_survives_a_redis_restart_with_aof(
    kafka_bootstrap, unique_topic, tmp_path, down_s
):
    """``lbctl control`` keeps running while Redis restarts under it (redis-py reconnects with
    its default retry), and what it applied before and after is all there. ``down_s`` is how
    long Redis stays away; 12 s is longer than a sweep interval (5 s) and than the consumer's
    max.poll.interval.ms (10 s), so the loop must back off without leaving its group."""
    from confluent_kafka import Producer

    from controller.apply import outcome_of
    from loadbalance.decisions import TRANSFER, encode_decision, make_decision
    from tests.reliability.invariants import lbctl, set_args, stop, wait_for

    server = EmbeddedRedis(tmp_path, port=free_port(), appendonly=True)
    server.start()
    proc = None
    try:
        store = RedisStore(server.client(), "ctl")
        store.create_namespace(NS, 4)
        now = int(time.time() * 1000)
        for b in ("b1", "b2"):
            store.register_broker(b, now, 3_600_000)
        names = store.get_namespace(NS).bundle_names
        for n in names:
            store.acquire(n, "b1", now, 3_600_000)
        moves = [make_decision(cycle="r", kind=TRANSFER, bundle=n, source_broker="b1",
                               destination_broker="b2") for n in names]  # fmt: skip
        topic, events = unique_topic(1, "decisions"), unique_topic(1, "events")
        p = Producer({"bootstrap.servers": kafka_bootstrap})

        def publish(ds) -> None:
            for d in ds:
                p.produce(topic, key=d.bundle.encode(), value=encode_decision(d))
            assert p.flush(10) == 0

        publish(moves[:2])
        proc = lbctl(["control", "--redis-url", server.url, "--bootstrap-servers",
                      kafka_bootstrap, "--group", "ctl-redis", *set_args({
                          "redisKeyPrefix": "ctl", "decisionsTopic": topic,
                          "ownershipEventsTopic": events,
                          "loadBalancerOwnershipLeaseTtlSeconds": 3600})],
                     tmp_path / "control.log")  # fmt: skip
        wait_for("the first outcomes", lambda: all(outcome_of(store, d.id) for d in moves[:2]),
                 timeout_s=60)  # fmt: skip
        server.stop()
        publish(moves[2:])  # consumed while Redis is away: retried, never committed unapplied
        time.sleep(down_s)
        server.start()
        store = RedisStore(server.client(), "ctl")
        wait_for("the outcomes after the restart",
                 lambda: proc.poll() is not None or all(outcome_of(store, d.id) for d in moves),
                 timeout_s=60)  # fmt: skip
        assert proc.poll() is None, f"the controller exited: see {tmp_path / 'control.log'}"
        assert [outcome_of(store, d.id).outcome for d in moves] == ["applied"] * len(moves)
        # applied once: the outcome stream (kept by the AOF) has exactly one "applied" entry per
        # decision, whatever the retries while Redis was away; a replay may add a "duplicate"
        entries = [
            {k.decode(): v.decode() for k, v in fields.items()}
            for _, fields in store.r.xrange("ctl:outcome-stream")
        ]
        applied = Counter(e["id"] for e in entries if e["outcome"] == "applied")
        assert applied == Counter({d.id: 1 for d in moves}), entries
        assert {e["id"] for e in entries} == {d.id for d in moves}, entries
        assert {e["outcome"] for e in entries} <= {"applied", "duplicate"}, entries
        s = check_invariants(store.r, "ctl", int(time.time() * 1000))
        assert [s.live_owner(n, int(time.time() * 1000)) for n in names] == ["b2"] * len(names)
    finally:
        if proc is not None:
            stop(proc)
        server.stop()


def test_operator_command_detects_the_loss_and_recovers_above_the_announced_tokens(
    kafka_bootstrap, unique_topic, tmp_path
):
    """``python -m controller.recovery`` end to end: the floor comes from the events topic."""
    import subprocess

    from confluent_kafka import Producer

    from controller.events import OwnershipEvent, encode_event
    from tests.reliability.invariants import PYTHON, REPO, set_args

    server = EmbeddedRedis(tmp_path, port=free_port(), appendonly=False)
    server.start()
    try:
        store = RedisStore(server.client(), "cli")
        _populate(store)
        before = read_state(store.r, "cli")
        serving = {b: sorted(n for n, (o, _, _) in before.leases.items() if o == b)
                   for b in ("b1", "b2", "b3")}  # fmt: skip
        events = unique_topic(1, "events")
        p = Producer({"bootstrap.servers": kafka_bootstrap})
        announced = before.fence + 100  # the controller had announced more than Redis kept
        e = OwnershipEvent("assigned", serving["b1"][0], 1, new_owner="b1", new_token=announced)
        p.produce(events, key=e.bundle.encode(), value=encode_event(e))
        assert p.flush(10) == 0
        server.restart()
        store = RedisStore(server.client(), "cli")
        now = int(time.time() * 1000)
        for b in ("b1", "b2", "b3"):
            store.register_broker(b, now, TTL_MS)
        store.r.hset(Keys("cli").load_shards(), mapping=shards_from_docs({
            n: {"broker": b} for b, ns in serving.items() for n in ns}))  # fmt: skip
        argv = [PYTHON, "-m", "controller.recovery", "--redis-url", server.url,
                "--bootstrap-servers", kafka_bootstrap,
                *set_args({"redisKeyPrefix": "cli", "ownershipEventsTopic": events})]  # fmt: skip

        check = subprocess.run([*argv, "--check"], cwd=REPO, capture_output=True, timeout=60)
        assert check.returncode == 1, check.stderr
        assert json.loads(check.stdout)["lost"] is True
        done = subprocess.run(argv, cwd=REPO, capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["token_floor"] == announced
        after = check_invariants(store.r, "cli", now)
        assert after.boundaries[NS] == before.boundaries[NS]
        assert min(t for _, t, _ in after.leases.values()) > announced
        again = subprocess.run([*argv, "--check"], cwd=REPO, capture_output=True, timeout=60)
        assert again.returncode == 0 and json.loads(again.stdout)["lost"] is False
    finally:
        server.stop()
