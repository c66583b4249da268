"""``lbctl run`` end to end: the whole product balances a hot, overloaded cluster, and stops clean.

Real components only: the session's embedded Kafka and Redis (or ``lbctl run``'s own), the Spark
streaming job, the controller and the live simulator, each a process started by ``lbctl run``.

The scenario (written below) is small on purpose, so Spark's batches stay short on a busy
2-core machine: four brokers placed round-robin, so ``broker-00`` holds the hot bundle
``public/hot/0x00000000_0x40000000`` (eight topics at 7k msg/s) *and* two application bundles,
which puts it near 100 % CPU while the others idle: a hot bundle and an overloaded broker at once.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from infra.process import pid_alive
from lbctl.supervisor import CHILDREN_FILE, group_members

ROOT = Path(__file__).resolve().parents[2]
HOT_BUNDLE = "public/hot/0x00000000_0x40000000"
SCENARIO = {
    "name": "e2e_hot",
    "description": "4 brokers; a hot bundle on a broker also overloaded by round-robin placement",
    "cycles": 600,
    "brokers": [{"prefix": "broker", "count": 4, "cores": 8, "nic_gbps": 10}],
    "namespaces": [
        {"name": "public/app", "count": 1, "bundles": 8, "topics": 80, "rate_in_per_s": 50000,
         "msg_bytes": 1024, "subscriptions": 1, "noise": 0.02, "zipf_exponent": 0.5},
        {"name": "public/hot", "count": 1, "bundles": 4, "topics": 16, "rate_in_per_s": 2000,
         "msg_bytes": 1024, "subscriptions": 1, "noise": 0.02},
    ],
    "hot_topics": [
        {"namespace": "public/hot", "bundle_index": 0, "count": 8, "rate_in_per_s": 7000}
    ],
    "initial_assignment": "round_robin",
}  # fmt: skip
# Spark takes 20-30 s to its first batch on a quiet machine, minutes on a crowded one; the
# policies then balance this scenario in under a minute (measured: 50 s at load average 14).
FIRST_BATCH_DEADLINE_S = 240.0
BALANCE_AFTER_FIRST_BATCH_S = 120.0
STOP_LIMIT_S = 10.0

pytestmark = pytest.mark.timeout(420)


def _scenario_file(tmp_path: Path) -> Path:
    path = tmp_path / "e2e_hot.json"
    path.write_text(json.dumps(SCENARIO), encoding="utf-8")
    return path


def _free_port_run(n: int) -> int:
    """A base port with ``n`` consecutive free loopback ports (for ``--metrics-port BASE``)."""
    import socket

    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + n > 65535:
            continue
        held = []
        try:
            for port in range(base, base + n):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise RuntimeError("no run of free ports")


def _scrape(port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def _sample(text: str, name: str) -> float:
    """Sum of every sample of metric ``name`` (any labels) in a Prometheus text page."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _start_run(args: list[str], run_dir: Path) -> subprocess.Popen[bytes]:
    """``lbctl run`` as a child of the test, output into files in the run folder."""
    run_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "lbctl.main", "run", *args, "--run-dir", str(run_dir)]
    with open(run_dir / "run.out", "wb") as out, open(run_dir / "run.err", "wb") as err:
        return subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=err, stdin=subprocess.DEVNULL)


def _output(run_dir: Path) -> str:
    return "\n".join(
        f"--- {name}\n{(run_dir / name).read_text(errors='replace')[-3000:]}"
        for name in ("run.out", "run.err", "stream.log", "control.log", "simulate.log")
        if (run_dir / name).exists()
    )


def _children(run_dir: Path) -> list[dict[str, Any]]:
    try:
        return json.loads((run_dir / CHILDREN_FILE).read_text())["children"]
    except (OSError, ValueError, KeyError):
        return []


def _left_over(children: list[dict[str, Any]]) -> list[int]:
    """Processes still alive that the run started: the children and their process groups."""
    pids = {c["pid"] for c in children if pid_alive(c["pid"])}
    return sorted(pids | set(group_members([c["pgid"] for c in children])))


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _spread(client: redis.Redis, prefix: str) -> tuple[int, float]:
    """(brokers reporting, max/mean of their largest resource usage) from the load snapshot."""
    usages = []
    for raw in client.hgetall(f"{prefix}:load:brokers").values():
        report = json.loads(raw).get("report", {})
        usages.append(
            max(
                report[k]["usage"] / report[k]["limit"]
                for k in ("cpu", "memory", "bandwidthIn", "bandwidthOut")
                if report.get(k, {}).get("limit")
            )
        )
    if not usages:
        return 0, 0.0
    return len(usages), max(usages) / statistics.fmean(usages)


def _applied(client: redis.Redis, prefix: str) -> dict[str, dict[str, Any]]:
    """decision id -> outcome document, for the decisions the controller applied."""
    out = {}
    for key, raw in client.hgetall(f"{prefix}:outcomes").items():
        doc = json.loads(raw)
        if doc.get("outcome") == "applied":
            out[key.decode()] = doc
    return out


def _decisions(bootstrap: str, topic: str) -> dict[str, Any]:
    """Every decision the streaming job published, by id (read to the end of each partition)."""
    from confluent_kafka import Consumer, KafkaError

    from loadbalance.decisions import decode_decision

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"e2e-reader-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
            "session.timeout.ms": 6000,
            "max.poll.interval.ms": 10000,
        }
    )
    consumer.subscribe([topic])
    out: dict[str, Any] = {}
    eof: set[int] = set()
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                if eof and len(eof) >= len(consumer.assignment() or [1]):
                    break
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    eof.add(msg.partition())
                continue
            d = decode_decision(msg.value())
            out[d.id] = d
    finally:
        consumer.close()
    return out


def test_run_splits_the_hot_bundle_sheds_the_overloaded_broker_and_stops_on_sigint(
    kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> None:
    from metadata_store.ownership_redis import RedisStore

    tag = uuid.uuid4().hex[:8]
    prefix = f"e2e{tag}"
    decisions_topic = f"e2e-decisions-{tag}"
    sets = {
        "redisKeyPrefix": prefix,
        "loadReportsTopic": f"e2e-reports-{tag}",
        "decisionsTopic": decisions_topic,
        "deadLettersTopic": f"e2e-dead-{tag}",
        "ownershipEventsTopic": f"e2e-events-{tag}",
    }
    run_dir = tmp_path / "run"
    args = [str(_scenario_file(tmp_path)), "--bootstrap-servers", kafka_bootstrap]
    args += ["--redis-url", redis_url, "--no-monitor", "--json"]
    args += ["--checkpoint", str(tmp_path / "checkpoint")]
    metrics_base = _free_port_run(3)
    args += ["--metrics-port", str(metrics_base)]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    proc = _start_run(args, run_dir)
    client = redis.Redis.from_url(redis_url)
    start_spread = end_spread = None
    deadline = time.monotonic() + FIRST_BATCH_DEADLINE_S
    first_batch = False
    try:
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"lbctl run exited early\n{_output(run_dir)}"
            if not first_batch and client.exists(f"{prefix}:stream:progress"):
                first_batch = True
                deadline = time.monotonic() + BALANCE_AFTER_FIRST_BATCH_S
            n, spread = _spread(client, prefix)
            if n == 4:
                start_spread = spread if start_spread is None else start_spread
                end_spread = spread
            kinds = {doc["kind"] for doc in _applied(client, prefix).values()}
            split_done = any(
                doc["kind"] == "split" and doc["bundle"] == HOT_BUNDLE
                for doc in _applied(client, prefix).values()
            )
            if (
                split_done
                and kinds & {"transfer", "unload"}
                and start_spread is not None
                and end_spread is not None
                and end_spread < 0.8 * start_spread
            ):
                break
            time.sleep(2)
        # The run's summary samples the view every refresh interval (2 s, its own clock): let it
        # read the state this loop stopped on before stopping the run.
        time.sleep(4)
        assert first_batch, f"no streaming batch completed\n{_output(run_dir)}"
        # Each child serves its metrics on the ports `lbctl run --metrics-port` gave it.
        stream_page, control_page, sim_page = (_scrape(metrics_base + i) for i in range(3))
        assert _sample(stream_page, "lbctl_stream_batches_total") >= 1, stream_page
        assert _sample(control_page, "lbctl_control_decisions_total") >= 1, control_page
        assert _sample(sim_page, "lbctl_simulator_reports_published_total") >= 1, sim_page
        children = _children(run_dir)
        assert {c["name"] for c in children} == {"stream", "control", "simulate"}
        stop_t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=STOP_LIMIT_S + 20)
        stop_s = time.monotonic() - stop_t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = _output(run_dir)
    assert stop_s < STOP_LIMIT_S, f"stop took {stop_s:.1f}s\n{output}"
    assert proc.returncode == 0, output
    deadline = time.monotonic() + 5
    while _left_over(children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _left_over(children) == [], f"processes left: {_left_over(children)}"
    assert "logs in" in (run_dir / "run.err").read_text()

    # What Redis holds agrees with what the decisions said.
    now_ms = int(time.time() * 1000)
    store = RedisStore(client, prefix)
    applied = _applied(client, prefix)
    decisions = _decisions(kafka_bootstrap, decisions_topic)
    assert set(applied) <= set(decisions), "every applied outcome names a published decision"
    hot_splits = [
        decisions[i] for i, doc in applied.items() if doc["kind"] == "split"
        and doc["bundle"] == HOT_BUNDLE
    ]  # fmt: skip
    assert len(hot_splits) == 1, f"the hot bundle was split once: {applied}\n{output}"
    hot_ns = store.get_namespace("public/hot")
    assert hot_ns is not None and not hot_ns.contains(HOT_BUNDLE)
    assert set(hot_splits[0].split_boundaries) <= set(hot_ns.boundaries)

    last_move: dict[str, tuple[int, Any]] = {}
    for i, doc in applied.items():
        if doc["kind"] in ("transfer", "unload"):
            at = int(doc["atMs"])
            if doc["bundle"] not in last_move or at >= last_move[doc["bundle"]][0]:
                last_move[doc["bundle"]] = (at, decisions[i])
    assert last_move, f"no unload or transfer was applied\n{output}"
    checked = 0
    for bundle, (_at, d) in last_move.items():
        ns = store.get_namespace(bundle.rsplit("/", 1)[0])
        if d.kind != "transfer" or ns is None or not ns.contains(bundle):
            continue  # split since, or a plain unload (the next lookup chooses the owner)
        lease = store.owner(bundle, now_ms)
        assert lease is not None and lease.broker == d.destination_broker, (bundle, lease, d)
        checked += 1
    assert checked >= 1, "at least one transfer's destination is the owner in Redis"
    # The overloaded broker sheds load: by moves off it, or by the hot bundle's split, whose
    # children the lookups place afresh (our shedder moves nothing else off a broker whose
    # excess is a bundle split in the same cycle).
    hot_children = [n for n in hot_ns.bundle_names if int(n.rsplit("_", 1)[1], 16) <= 0x40000000]
    child_owners = {lease.broker for c in hot_children if (lease := store.owner(c, now_ms))}
    moved_off = any(d.source_broker == "broker-00" for _, d in last_move.values())
    assert moved_off or child_owners - {"broker-00"}, (
        f"the overloaded broker shed load: {child_owners}\n{output}"
    )

    assert start_spread is not None and end_spread is not None
    assert end_spread < start_spread, (start_spread, end_spread)
    summary = json.loads((run_dir / "run.out").read_text().strip().splitlines()[-1])
    assert summary["applied"].get("split", 0) >= 1
    assert summary["applied"].get("transfer", 0) + summary["applied"].get("unload", 0) >= 1
    assert summary["spreadEnd"]["maxOverMean"] < summary["spreadStart"]["maxOverMean"], summary


def test_sigkill_of_run_takes_every_process_it_started_with_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _start_run([str(_scenario_file(tmp_path)), "--no-monitor"], run_dir)
    try:
        deadline = time.monotonic() + 120
        children: list[dict[str, Any]] = []
        jvm = False
        while time.monotonic() < deadline and not jvm:
            assert proc.poll() is None, _output(run_dir)
            children = _children(run_dir)
            stream = [c for c in children if c["name"] == "stream"]
            if len(children) == 5 and stream:
                jvm = any(_comm(p) == "java" for p in group_members([stream[0]["pgid"]]))
            time.sleep(0.5)
        assert jvm, f"the streaming job's JVM never started\n{_output(run_dir)}"
        assert {c["name"] for c in children} == {"kafka", "redis", "stream", "control", "simulate"}
        assert _left_over(children)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # A Python process Spark's JVM started (its daemon, the data source runner) notices the JVM
    # gone only when it next reads from it; one still importing under a loaded suite can take
    # longer than the rest to go, so the bound is generous: it must still go by itself.
    deadline = time.monotonic() + 45
    while _left_over(children) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _left_over(children)
    assert left == [], f"left behind: {[(p, _comm(p)) for p in left]}"


def test_monitor_reads_rows_owners_and_applied_decisions_from_redis(redis_url: str) -> None:
    """The table's data path against real Redis: the stream's snapshot documents, the owners in
    the store, and the controller's outcome stream (counted once, however often it is read)."""
    from controller.apply import apply_decision
    from lbctl.monitor import Monitor
    from loadbalance.decisions import TRANSFER, make_decision
    from metadata_store.ownership_redis import RedisStore

    prefix = f"mon{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_url)
    store = RedisStore(client, prefix)
    now = int(time.time() * 1000)
    store.create_namespace("public/m", 2)
    a, b = store.get_namespace("public/m").bundle_names
    for broker in ("broker-a", "broker-b"):
        store.register_broker(broker, now, 60_000)
    store.acquire(a, "broker-a", now, 60_000)
    store.acquire(b, "broker-a", now, 60_000)
    for broker, cpu in (("broker-a", 720.0), ("broker-b", 80.0)):
        doc = {"report": {"cpu": {"usage": cpu, "limit": 800.0}, "numTopics": 3}}
        client.hset(f"{prefix}:load:brokers", broker, json.dumps(doc))
    client.hset(f"{prefix}:stream:progress", mapping={"batch": 7, "now_ms": now})
    monitor = Monitor(client, prefix)

    before = monitor.read()
    assert [(r.broker, r.bundles) for r in before.rows] == [("broker-a", 2), ("broker-b", 0)]
    assert before.rows[0].max_pct == pytest.approx(90.0)
    assert before.spread is not None and before.spread.max_over_mean == pytest.approx(1.8)
    assert before.applied == {} and before.batch == 7
    assert before.owning_brokers == {"broker-a"} and before.complete

    d = make_decision(
        cycle="t", kind=TRANSFER, bundle=b, source_broker="broker-a",
        destination_broker="broker-b", reason="test", strategy="test", decided_at_ms=now,
    )  # fmt: skip
    assert apply_decision(store, d, now_ms=now, lease_ttl_ms=60_000).outcome == "applied"
    after = monitor.read()
    assert [(r.broker, r.bundles) for r in after.rows] == [("broker-a", 1), ("broker-b", 1)]
    assert after.applied == {"transfer": 1}
    assert monitor.read().applied == {"transfer": 1}, "outcomes are read incrementally, once"
