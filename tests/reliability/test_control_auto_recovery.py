"""``lbctl control`` rebuilds a Redis that lost its data by itself, and only then.

Real Redis (``EmbeddedRedis``, restarted without persistence so every key is gone) and the
embedded Kafka; brokers re-register through the agent's ``LeaseKeeper`` and the load snapshot is
rewritten the way the streaming job does after a loss (``test_redis_restart.py`` does the same).
No operator command is run: the controller must detect the loss, hold its decisions, rebuild
above every token announced on the ownership-events topic, report, and resume.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time

import pytest
from confluent_kafka import Producer

from controller.apply import outcome_of
from controller.events import OwnershipEvent, encode_event
from controller.loop import run_loop
from controller.placement import put_load_snapshot
from controller.recovery import AutoRecovery, current_epoch, detect_loss, last_report
from infra import metrics
from infra.embedded import EmbeddedRedis, free_port
from loadbalance.config import LoadBalancerConfig
from loadbalance.decisions import TRANSFER, encode_decision, make_decision
from loadbalance.model import LocalBrokerData, ResourceUsage
from loadbalance.report_codec import report_to_dict
from metadata_store.load_snapshot import shards_from_docs
from metadata_store.ownership_redis import RedisStore
from producers.agent import LeaseKeeper
from tests.integration.test_assignment import read_events
from tests.reliability.invariants import (
    check_invariants,
    lbctl,
    read_state,
    set_args,
    stop,
    wait_for,
)

pytestmark = pytest.mark.integration

NS, QUIET = "acme/auto", "acme/quiet"
HOUR_MS = 3_600_000
SUMMARY = "recovered from a Redis data loss"


def _now() -> int:
    return int(time.time() * 1000)


def _load(name: str) -> dict:
    r = LocalBrokerData(broker=name, cpu=ResourceUsage(20, 100), msg_rate_in=10.0)
    return {"report": report_to_dict(r), "updatedAtMs": _now()}


def _populate(store: RedisStore, brokers: tuple[str, ...], now: int) -> list[str]:
    """A namespace with a split, its bundles leased round-robin, and a quiet namespace."""
    store.create_namespace(NS, 4)
    store.create_namespace(QUIET, 2)
    for b in brokers:
        store.register_broker(b, now, HOUR_MS)
    store.split_bundle(store.get_namespace(NS).bundle_names[0], [0x20000000])
    names = store.get_namespace(NS).bundle_names
    for i, n in enumerate(names):
        store.acquire(n, brokers[i % len(brokers)], now, HOUR_MS)
    return names


def _rewrite_snapshot(store: RedisStore, serving: dict[str, list[str]], live: list[str]) -> None:
    """What the streaming job writes after the loss: live brokers' loads, who serves what."""
    put_load_snapshot(store, {b: _load(b) for b in live}, {})
    docs = {n: {"broker": b} for b, ns in serving.items() for n in ns}
    if docs:
        store.r.hset(store.keys.load_shards(), mapping=shards_from_docs(docs))


def _publish(bootstrap: str, topic: str, *decisions) -> None:
    p = Producer({"bootstrap.servers": bootstrap})
    for d in decisions:
        p.produce(topic, key=d.bundle.encode(), value=encode_decision(d))
    assert p.flush(10) == 0


def _move(bundle: str, src: str, dst: str):
    return make_decision(cycle="auto", kind=TRANSFER, bundle=bundle, source_broker=src,
                         destination_broker=dst, reason="Overloaded")  # fmt: skip


class _CommandWatch:
    """Redis ``MONITOR`` on a raw socket: every command any client sends, as Redis logs it.

    Why: "no recovery happened" is only evidence if the controller was looking; the recovery
    check reads ``P:epoch`` first thing, so its ``GET`` in the server's own command feed shows
    that it ran (and how often) without trusting anything the controller says about itself."""

    def __init__(self, port: int) -> None:
        self._sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self._sock.sendall(b"MONITOR\r\n")
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = self._sock.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            *lines, buf = buf.split(b"\r\n")
            with self._lock:
                self._lines += [x.decode(errors="replace") for x in lines]

    def count(self, *words: str) -> int:
        """How many commands so far were exactly ``words`` (e.g. ``"GET", "aofc:epoch"``)."""
        tail = " ".join(f'"{w}"' for w in words)
        with self._lock:
            return sum(1 for x in self._lines if x.endswith(tail))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()
        self._thread.join(5)


def _log_text(path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def test_control_rebuilds_a_redis_restarted_without_persistence_by_itself(
    kafka_bootstrap, unique_topic, tmp_path
):
    server = EmbeddedRedis(tmp_path, port=free_port(), appendonly=False)
    server.start()
    proc = None
    log = tmp_path / "control.log"
    try:
        store = RedisStore(server.client(), "auto")
        names = _populate(store, ("b1", "b2", "b3"), _now())
        decisions, events = unique_topic(1, "decisions"), unique_topic(1, "events")
        # the controller had announced more than Redis kept (a token Redis never persisted)
        high = read_state(store.r, "auto").fence + 100
        p = Producer({"bootstrap.servers": kafka_bootstrap})
        e = OwnershipEvent("assigned", names[-1], 1, new_owner="b3", new_token=high)
        p.produce(events, key=e.bundle.encode(), value=encode_event(e))
        assert p.flush(10) == 0
        proc = lbctl(["control", "--redis-url", server.url, "--bootstrap-servers",
                      kafka_bootstrap, "--group", "auto-ctl", "--sweep-interval-s", "0.5",
                      "--recovery-wait-s", "1", "--known-namespace", f"{QUIET}=2",
                      *set_args({"redisKeyPrefix": "auto", "decisionsTopic": decisions,
                                 "ownershipEventsTopic": events,
                                 "loadBalancerOwnershipLeaseTtlSeconds": 3600})],
                     log)  # fmt: skip
        first = _move(names[1], store.owner(names[1], _now()).broker, "b1")
        _publish(kafka_bootstrap, decisions, first)
        wait_for("the decision before the loss", lambda: outcome_of(store, first.id), 60)
        assert outcome_of(store, first.id).outcome == "applied"
        before = check_invariants(store.r, "auto", _now())
        announced = max(
            max(ev.new_token or 0, ev.old_token or 0)
            for _, ev in read_events(kafka_bootstrap, events)
        )
        assert announced == high > before.fence
        serving = {b: sorted(n for n, (o, _, _) in before.leases.items() if o == b)
                   for b in ("b1", "b2", "b3")}  # fmt: skip
        assert all(serving.values())

        server.restart()  # no persistence: every key is gone
        lost_at = time.monotonic()
        store = RedisStore(server.client(), "auto")
        assert store.list_namespaces() == [] and current_epoch(store) is None
        # a decision published after the loss, before the rebuild: it must wait for the rebuild
        held = _move(serving["b1"][0], "b1", "b2")
        _publish(kafka_bootstrap, decisions, held)
        # brokers re-register on their next check (b3 never comes back) and keep reporting
        keepers = {b: LeaseKeeper(store, b, HOUR_MS, HOUR_MS) for b in ("b1", "b2")}
        for b, k in keepers.items():
            assert k.heartbeat(serving[b], _now()) == {}, "nothing to renew: the store is empty"
        _rewrite_snapshot(store, serving, ["b1", "b2"])

        report = wait_for("the controller's own recovery", lambda: last_report(store), 60)
        recovered_s = time.monotonic() - lost_at
        wait_for("the held decision", lambda: outcome_of(store, held.id), 30)
        resumed_s = time.monotonic() - lost_at

        now = _now()
        after = check_invariants(store.r, "auto", now)
        assert proc.poll() is None, f"the controller exited: see {log}"
        assert after.boundaries[NS] == before.boundaries[NS], "the split survived via reports"
        assert after.boundaries[QUIET] == before.boundaries[QUIET], "re-created as named"
        assert "epoch" in report["reason"] and report["token_floor"] == announced
        granted = {b: tuple(v) for b, v in report["leases_granted"].items()}
        assert granted.keys() == set(serving["b1"] + serving["b2"])
        assert min(t for _, t in granted.values()) > announced, "above every announced token"
        assert min(t for _, t, _ in after.leases.values()) > announced
        assert sorted(report["unowned"]) == sorted(
            serving["b3"] + store.get_namespace(QUIET).bundle_names
        ), "the silent broker's bundles and the quiet namespace come back unowned"
        assert store.r.xlen("auto:recovery-log") == 1, "recovered once"
        assert detect_loss(store, current_epoch(store), {}) is None

        # held, un-committed, then applied on the rebuilt store (not on the empty one)
        out = json.loads(store.r.hget("auto:outcomes", held.id))
        assert out["outcome"] == "applied" and out["atMs"] >= report["at_ms"]
        assert after.live_owner(held.bundle, now) == "b2"
        for b in ("b1", "b2"):
            for n in serving[b]:
                if n != held.bundle:
                    assert after.live_owner(n, now) == b
        # the agents find and renew their re-granted leases
        assert all(keepers["b2"].heartbeat(serving["b2"], now).values())

        text = _log_text(log)
        assert text.count(SUMMARY) == 1, text[-3000:]
        line = next(x for x in text.splitlines() if SUMMARY in x)
        assert f"{len(granted)} leases granted above token floor {announced}" in line
        assert "auto:recovery:last" in line and "lost for good" in line
        recovered = [ev for _, ev in read_events(kafka_bootstrap, events)
                     if ev.reason.startswith("recovered")]  # fmt: skip
        assert {ev.bundle: (ev.new_owner, ev.new_token) for ev in recovered} == granted

        # decisions published after the recovery are applied as usual
        later = _move(serving["b2"][0], "b2", "b1")
        _publish(kafka_bootstrap, decisions, later)
        wait_for("a decision after the recovery", lambda: outcome_of(store, later.id), 30)
        assert outcome_of(store, later.id).outcome == "applied"
        assert store.owner(later.bundle, _now()).broker == "b1"
        check_invariants(store.r, "auto", _now())
        print(f"\nloss -> recovered: {recovered_s:.2f} s; loss -> held decision applied: "
              f"{resumed_s:.2f} s (recovery wait 1 s, sweep 0.5 s)")  # fmt: skip
    finally:
        if proc is not None:
            stop(proc)
        server.stop()


def test_no_recovery_on_a_first_start_or_after_a_redis_restart_that_kept_its_data(
    kafka_bootstrap, unique_topic, tmp_path
):
    """A fresh Redis with no epoch and nothing claimed is a new cluster, not a loss; an AOF
    restart keeps the epoch, so the controller only waits out the outage."""
    server = EmbeddedRedis(tmp_path, port=free_port(), appendonly=True)
    server.start()
    proc = None
    log = tmp_path / "control.log"
    try:
        client = server.client()
        client.config_set("appendfsync", "always")
        store = RedisStore(client, "aofc")
        for b in ("b1", "b2"):
            store.register_broker(b, _now(), HOUR_MS)
        _rewrite_snapshot(store, {}, ["b1", "b2"])  # brokers report, but serve nothing yet
        decisions, events = unique_topic(1, "decisions"), unique_topic(1, "events")
        watch = _CommandWatch(server.port)
        proc = lbctl(["control", "--redis-url", server.url, "--bootstrap-servers",
                      kafka_bootstrap, "--group", "aof-ctl", "--sweep-interval-s", "0.3",
                      "--recovery-wait-s", "0.5",
                      *set_args({"redisKeyPrefix": "aofc", "decisionsTopic": decisions,
                                 "ownershipEventsTopic": events,
                                 "loadBalancerOwnershipLeaseTtlSeconds": 3600})],
                     log)  # fmt: skip
        wait_for("the controller's recovery checks on the empty store",
                 lambda: watch.count("GET", "aofc:epoch") >= 3, timeout_s=60)  # fmt: skip
        time.sleep(1)  # and a few more checks, each of which could have recovered
        assert watch.count("GET", "aofc:epoch") >= 4
        watch.close()
        assert proc.poll() is None, f"the controller exited: see {log}"
        assert current_epoch(store) is None and last_report(store) is None
        names = _populate(store, ("b1", "b2"), _now())
        epoch = current_epoch(store)
        first = _move(names[0], "b1", "b2")
        _publish(kafka_bootstrap, decisions, first)
        wait_for("the first decision", lambda: outcome_of(store, first.id), 60)

        server.restart()  # SIGTERM: the AOF is flushed, the data comes back
        watch = _CommandWatch(server.port)
        store = RedisStore(server.client(), "aofc")
        owners = store.owners(NS, _now())
        serving = {b: [n for n, x in owners.items() if x.broker == b] for b in ("b1", "b2")}
        _rewrite_snapshot(store, serving, ["b1", "b2"])
        second = _move(names[1], "b2", "b1")
        _publish(kafka_bootstrap, decisions, second)
        wait_for("the decision after the restart", lambda: outcome_of(store, second.id), 60)
        time.sleep(2)  # more than the recovery wait and several sweeps
        checks_after_restart = watch.count("GET", "aofc:epoch")
        watch.close()

        assert checks_after_restart >= 3, "the controller kept checking after the restart"
        assert proc.poll() is None, f"the controller exited: see {log}"
        assert current_epoch(store) == epoch, "same dataset"
        assert last_report(store) is None and not store.r.exists("aofc:recovery-log")
        assert [outcome_of(store, d.id).outcome for d in (first, second)] == ["applied"] * 2
        check_invariants(store.r, "aofc", _now())
        text = _log_text(log)
        assert "lost its data" not in text and SUMMARY not in text, text[-3000:]
    finally:
        if proc is not None:
            stop(proc)
        server.stop()


def test_a_second_controller_adopts_a_recovery_instead_of_recovering_again(
    kafka_bootstrap, unique_topic, fresh_redis
):
    """Two controllers see the same loss; the one that recovers second finds the first's epoch
    in ``P:recovery:last`` and adopts it (no ping-pong of epochs). Also: a fresh store with
    brokers but no claims is no loss, and a store's first epoch is adopted, not reported."""
    store = RedisStore(fresh_redis, "two")
    events = unique_topic(1, "events")
    clock = [100.0]

    def auto() -> AutoRecovery:
        return AutoRecovery(store, kafka_bootstrap, events, HOUR_MS, wait_s=1.0,
                            monotonic=lambda: clock[0])  # fmt: skip

    a, b = auto(), auto()
    store.register_broker("b1", _now(), HOUR_MS)
    assert detect_loss(store, None, {}) is None
    assert a.check(_now()) is None and not a.pending and a.known_epoch is None
    names = _populate(store, ("b1",), _now())
    epoch = current_epoch(store)
    assert a.check(_now()) is None and b.check(_now()) is None
    assert a.known_epoch == b.known_epoch == epoch and not a.suspect()

    fresh_redis.flushall()
    store.register_broker("b1", _now(), HOUR_MS)
    _rewrite_snapshot(store, {"b1": names}, ["b1"])
    assert a.suspect() and b.suspect()
    assert a.check(_now()) is None and b.check(_now()) is None
    assert a.pending and b.pending
    clock[0] += 0.5
    assert a.check(_now()) is None, "still within the wait"
    clock[0] += 0.6
    report = a.check(_now())
    assert report is not None and set(report.leases_granted) == set(names)
    assert b.check(_now()) is None and not b.pending and b.known_epoch == report.epoch
    clock[0] += 5
    assert a.check(_now()) is None and b.check(_now()) is None
    assert fresh_redis.xlen("two:recovery-log") == 1
    check_invariants(fresh_redis, "two", _now())


def test_loop_holds_a_decision_until_it_recovered_and_counts_sweeps_expiries_recoveries(
    kafka_bootstrap, unique_topic, fresh_redis
):
    """In process: a loss found at start (no epoch, brokers report unknown namespaces), the
    decision waiting in Kafka is applied only after the rebuild, and the new counters move."""
    store = RedisStore(fresh_redis, "inproc")
    decisions, events = unique_topic(1, "decisions"), unique_topic(1, "events")
    names = _populate(store, ("b1", "b2"), _now())
    serving = {b: [n for n in names if store.owner(n, _now()).broker == b] for b in ("b1", "b2")}
    fresh_redis.flushall()
    for b in ("b1", "b2"):
        store.register_broker(b, _now(), HOUR_MS)
    _rewrite_snapshot(store, serving, ["b1", "b2"])
    held = _move(serving["b1"][0], "b1", "b2")
    _publish(kafka_bootstrap, decisions, held)

    def value(name: str) -> float:
        return metrics.REGISTRY.get_sample_value(name) or 0.0

    counters = ("lbctl_control_sweeps_total", "lbctl_control_leases_expired_total",
                "lbctl_control_recoveries_total")  # fmt: skip
    start = {c: value(c) for c in counters}
    # leases granted by the recovery last 400 ms and nobody renews them: the sweeps after the
    # recovery expire them (and place them again), which the expiry counter must see. The idle
    # timeout counts from the start: it must cover joining the consumer group, which took 3 s
    # and more on the embedded broker (a 3 s timeout made this test flaky)
    recovery = AutoRecovery(store, kafka_bootstrap, events, 400, wait_s=0.3)
    stats = run_loop(store, client_config={"bootstrap.servers": kafka_bootstrap},
                     decisions_topic=decisions, events_topic=events, group_id="inproc",
                     idle_timeout_s=8, config=LoadBalancerConfig(), sweep_interval_s=0.2,
                     recovery=recovery)  # fmt: skip
    report = last_report(store)
    assert report is not None and stats.recoveries == 1
    assert stats.consumed == 1 and stats.rejected == 0
    out = json.loads(fresh_redis.hget("inproc:outcomes", held.id))
    # Handled after the rebuild (before it, the namespace did not exist and the transfer would
    # have been refused). Applied, or already satisfied when the consumer joined its group
    # only after the 400 ms leases had expired and the sweep had placed the bundle on b2.
    assert out["outcome"] in ("applied", "already_satisfied"), out
    assert out["atMs"] >= report["at_ms"]
    assert stats.expired >= 1 and stats.sweeps >= 1
    delta = {c: value(c) - start[c] for c in counters}
    assert delta == {
        "lbctl_control_sweeps_total": stats.sweeps,
        "lbctl_control_leases_expired_total": stats.expired,
        "lbctl_control_recoveries_total": 1,
    }
    check_invariants(fresh_redis, "inproc", _now())
