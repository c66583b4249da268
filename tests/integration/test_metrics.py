"""Prometheus endpoints of the long-running processes, scraped over HTTP.

Each test runs a real process path (``lbctl stream`` on the embedded Kafka, Redis and local
Spark; ``lbctl agent`` on the embedded Kafka and Redis) with ``--metrics-port 0``, reads the
bound port from the log line, scrapes ``/metrics`` and checks values that follow from what was
fed in. Counters are process-wide, so they are compared with their value before the run.
"""

from __future__ import annotations

import json
import logging
import re
import time
import urllib.request
import uuid
from collections import Counter as Tally
from collections.abc import Iterator

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from infra import metrics
from loadbalance.config import LoadBalancerConfig
from loadbalance.decisions import SPLIT, TRANSFER, UNLOAD, decode_decision
from loadbalance.model import LocalBrokerData, NamespaceBundleStats, ResourceUsage
from loadbalance.report_codec import encode_report

NS = "acme/metrics"
T0_MS = 1_700_000_000_000
_PORT_RE = re.compile(r"metrics on http://[^:]+:(\d+)/metrics")


@pytest.fixture
def exporter_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Capture ``infra.metrics``' log (for the port) and stop the exporters afterwards."""
    caplog.set_level(logging.INFO, logger="infra.metrics")
    try:
        yield caplog
    finally:
        metrics.stop_all()


def _port(caplog: pytest.LogCaptureFixture) -> int:
    ports = [int(m.group(1)) for r in caplog.records if (m := _PORT_RE.search(r.getMessage()))]
    assert ports, "no 'metrics on http://...' log line"
    return ports[-1]


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        body = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def _get(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _before(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


# An overloaded broker to shed and a hot bundle to split (as in test_streaming_job).
_KNOBS = {"loadBalancerLoadSheddingStrategy": "OverloadShedder",
          "loadBalancerNamespaceBundleMaxMsgRate": 1000}  # fmt: skip


def _config(unique_topic) -> LoadBalancerConfig:
    return LoadBalancerConfig(
        **{
            "loadReportsTopic": unique_topic(1, "reports"),
            "decisionsTopic": unique_topic(1, "decisions"),
            "deadLettersTopic": unique_topic(1, "dead"),
            "redisKeyPrefix": f"t{uuid.uuid4().hex[:8]}",
            **_KNOBS,
        }
    )


def _stats(rate: float, thr: float) -> NamespaceBundleStats:
    return NamespaceBundleStats(rate, rate / 2, thr, thr / 2, 4, 2, 3)


def _round(brokers: list[str], names: list[str], i: int) -> list[LocalBrokerData]:
    """Four brokers, four bundles each; the first at 95 % CPU, names[5] hot (5000 msg/s)."""
    out = []
    for b, broker in enumerate(brokers):
        stats = {}
        for j, name in enumerate(names[b * 4 : b * 4 + 4]):
            rate = 5000.0 if name == names[5] else 100.0 + 10 * j + i
            stats[name] = _stats(rate, 2e6 + 1e5 * j + 1e3 * i)
        out.append(
            LocalBrokerData(
                broker=broker,
                cpu=ResourceUsage(95.0 if b == 0 else 30.0 + b, 100.0),
                memory=ResourceUsage(1000.0, 4000.0),
                bandwidth_in=ResourceUsage(100.0, 1000.0),
                bandwidth_out=ResourceUsage(300.0, 1000.0),
                msg_rate_in=sum(s.msg_rate_in for s in stats.values()),
                msg_rate_out=sum(s.msg_rate_out for s in stats.values()),
                msg_throughput_in=sum(s.msg_throughput_in for s in stats.values()),
                msg_throughput_out=sum(s.msg_throughput_out for s in stats.values()),
                num_bundles=len(stats),
                bundles=frozenset(stats),
                last_stats=stats,
            )
        )
    return out


def _publish(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes, int]]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 4_000_000})
    for key, value, ts in records:
        p.produce(topic, value=value, key=key, timestamp=ts)
    assert p.flush(30) == 0


def _read_all(bootstrap: str, topic: str) -> list[bytes]:
    c = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "reader", "enable.partition.eof": True}
    )
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    out = []
    while True:
        m = c.poll(5)
        if m is None or (m.error() and m.error().code() == -191):  # partition EOF
            break
        if not m.error():
            out.append(m.value())
    c.close()
    return out


def test_lbctl_stream_serves_metrics_that_reflect_the_batches(
    spark, kafka_bootstrap, redis_url, fresh_redis, unique_topic, tmp_path, exporter_log,
    monkeypatch,
):  # fmt: skip
    from pyspark.sql.streaming.listener import QueryProgressEvent

    from lbctl.main import main
    from metadata_store.ownership_redis import RedisStore

    # The input-row count reads each progress event as one JSON text; PySpark's field-by-field
    # reading (a Py4J call per field, a class-path search among them) is only the fallback.
    slow_reads: list[int] = []
    slow = QueryProgressEvent.fromJObject.__func__

    def counted(cls: type, jevent: object) -> QueryProgressEvent:
        slow_reads.append(1)
        return slow(cls, jevent)

    monkeypatch.setattr(QueryProgressEvent, "fromJObject", classmethod(counted))

    config = _config(unique_topic)
    store = RedisStore(fresh_redis, config.redis_key_prefix)
    store.create_namespace(NS, 16)
    names = store.get_namespace(NS).bundle_names
    tag = uuid.uuid4().hex[:6]
    brokers = [f"m{b}-{tag}:8080" for b in range(1, 5)]
    records: list[tuple[bytes | None, bytes, int]] = []
    for i in range(3):
        reports = _round(brokers, names, i)
        records += [
            (r.broker.encode(), encode_report(r), T0_MS + i * 5000 + k)
            for k, r in enumerate(reports)
        ]
    records += [(b"bad", b"{not json", T0_MS + 20_000), (None, b"[1]", T0_MS + 20_001)]
    _publish(kafka_bootstrap, config.load_reports_topic, records)

    counters = [
        ("lbctl_stream_input_rows_total", {}),
        ("lbctl_stream_dead_letters_total", {}),
        ("lbctl_stream_batches_total", {}),
        ("lbctl_stream_batch_duration_seconds_count", {}),
        ("lbctl_stream_batch_duration_seconds_sum", {}),
        ("lbctl_stream_batch_spark_seconds_sum", {}),
        ("pulsar_lb_unload_broker_total", {}),
        ("pulsar_lb_unload_bundle_total", {}),
        ("pulsar_lb_bundles_split_total", {}),
        ("pulsar_lb_bundles_split_breakdown_total", {"result": "Success", "reason": "MsgRate"}),
        ("pulsar_lb_unload_broker_breakdown_total", {"result": "Success", "reason": "Overloaded"}),
    ]
    kinds = [(k, r) for k in (UNLOAD, TRANSFER, SPLIT) for r in ("Overloaded", "MsgRate")]
    counters += [("lbctl_decisions_published_total", {"kind": k, "reason": r}) for k, r in kinds]
    before = {(n, tuple(sorted(lb.items()))): _before(n, **lb) for n, lb in counters}

    argv = ["stream", "--bootstrap-servers", kafka_bootstrap, "--redis-url", redis_url,
            "--checkpoint", str(tmp_path / "ckpt"), "--available-now", "--source", "kafka",
            "--shards", "2", "--metrics-port", "0"]  # fmt: skip
    for knob, value in _KNOBS.items():
        argv += ["--set", f"{knob}={value}"]
    for knob in ("loadReportsTopic", "decisionsTopic", "deadLettersTopic", "redisKeyPrefix"):
        argv += ["--set", f"{knob}={config.model_dump(by_alias=True)[knob]}"]
    started = time.monotonic()
    assert main(argv) == 0
    port = _port(exporter_log)

    # Input rows come from Spark's progress events, delivered on its listener bus just after
    # the batch; give them a moment.
    deadline = time.monotonic() + 30
    while True:
        now = _scrape(port)
        rows = (
            _get(now, "lbctl_stream_input_rows_total")
            - before[("lbctl_stream_input_rows_total", ())]
        )
        if rows >= len(records) or time.monotonic() > deadline:
            break
        time.sleep(0.5)

    def delta(name: str, **labels: str) -> float:
        return _get(now, name, **labels) - before[(name, tuple(sorted(labels.items())))]

    assert rows == len(records)
    assert not slow_reads
    assert delta("lbctl_stream_dead_letters_total") == 2
    batches = delta("lbctl_stream_batches_total")
    assert batches >= 1 and delta("lbctl_stream_batch_duration_seconds_count") == batches
    total_s = delta("lbctl_stream_batch_duration_seconds_sum")
    assert 0 < total_s <= time.monotonic() - started + 1
    assert 0 < delta("lbctl_stream_batch_spark_seconds_sum") <= total_s
    prefix = config.redis_key_prefix
    last_batch = int(fresh_redis.hget(f"{prefix}:stream:progress", "batch"))
    assert _get(now, "lbctl_stream_last_batch_id") == last_batch
    assert _get(now, "lbctl_stream_brokers") == 4

    # Usage gauges: the latest report of each broker, in percent (Pulsar's percentUsage).
    first = brokers[0]
    assert _get(now, "pulsar_lb_cpu_usage", broker=first) == pytest.approx(95.0)
    assert _get(now, "pulsar_lb_cpu_usage", broker=brokers[2]) == pytest.approx(32.0)
    assert _get(now, "pulsar_lb_memory_usage", broker=first) == pytest.approx(25.0)
    assert _get(now, "pulsar_lb_bandwidth_in_usage", broker=first) == pytest.approx(10.0)
    assert _get(now, "pulsar_lb_bandwidth_out_usage", broker=first) == pytest.approx(30.0)
    assert _get(now, "pulsar_lb_directMemory_usage", broker=first) == 0.0

    # Scores and their avg/std equal the history usage the job wrote to Redis.
    docs = {
        k.decode(): json.loads(v) for k, v in fresh_redis.hgetall(f"{prefix}:load:brokers").items()
    }
    scores = [docs[b]["historyUsage"] for b in brokers]
    avg = sum(scores) / len(scores)
    std = (sum(s * s for s in scores) / len(scores) - avg * avg) ** 0.5
    for b in brokers:
        assert _get(now, "pulsar_lb_resource_usage", broker=b, feature="max_ema") == pytest.approx(
            docs[b]["historyUsage"]
        )
    assert _get(
        now, "pulsar_lb_resource_usage_stats", feature="max_ema", stat="avg"
    ) == pytest.approx(avg)
    assert _get(
        now, "pulsar_lb_resource_usage_stats", feature="max_ema", stat="std"
    ) == pytest.approx(std)

    # Decisions: the counters agree with what is on the decisions topic.
    decisions = [decode_decision(v) for v in _read_all(kafka_bootstrap, config.decisions_topic)]
    moves = [d for d in decisions if d.kind in (UNLOAD, TRANSFER)]
    splits = [d for d in decisions if d.kind == SPLIT]
    assert moves and splits
    tally = Tally((d.kind, d.reason) for d in decisions)
    for kind, reason in kinds:
        got = delta("lbctl_decisions_published_total", kind=kind, reason=reason)
        assert got == tally[(kind, reason)], (kind, reason)
    assert delta("pulsar_lb_unload_bundle_total") == len(moves)
    assert delta("pulsar_lb_unload_broker_total") == len(
        {(d.cycle, d.source_broker) for d in moves}
    )
    assert delta(
        "pulsar_lb_unload_broker_breakdown_total", result="Success", reason="Overloaded"
    ) == len(moves)
    assert delta("pulsar_lb_bundles_split_total") == len(splits) == 1
    assert delta("pulsar_lb_bundles_split_breakdown_total", result="Success", reason="MsgRate") == 1


def test_lbctl_agent_serves_its_reports_leases_and_host_usage(
    kafka_bootstrap, redis_url, fresh_redis, unique_topic, tmp_path
):
    """A real ``lbctl agent`` process: one check (the next is a minute away), then scraped."""
    import os
    import signal
    import subprocess
    import sys
    import threading

    from loadbalance.report_codec import decode_report
    from metadata_store.ownership_redis import RedisStore
    from producers.agent import wall_clock_ms

    prefix, broker = f"t{uuid.uuid4().hex[:8]}", f"agent-{uuid.uuid4().hex[:6]}:8080"
    topic = unique_topic(1, "agent-reports")
    store = RedisStore(fresh_redis, prefix=prefix)
    store.create_namespace("public/default", 4)
    b0, b1, b2, _ = store.get_namespace("public/default").bundle_names
    now = wall_clock_ms()
    for owner in (broker, "someone-else:8080"):
        store.register_broker(owner, now_ms=now, ttl_ms=120_000)
    store.acquire(b0, broker, now_ms=now, ttl_ms=120_000)
    store.acquire(b1, broker, now_ms=now, ttl_ms=120_000)
    store.acquire(b2, "someone-else:8080", now_ms=now, ttl_ms=120_000)
    stats = {"bundles": [b0, b1, b2], "lastStats": {b: {"msgRateIn": 10.0} for b in (b0, b1, b2)}}
    stats_file = tmp_path / "stats.json"
    stats_file.write_text(json.dumps(stats))

    argv = [sys.executable, "-m", "lbctl.main", "agent", "--broker-id", broker,
            "--bootstrap-servers", kafka_bootstrap, "--redis-url", redis_url,
            "--provider", f"file:{stats_file}", "--nic-speed-mbps", "100",
            "--metrics-port", "0",
            "--set", f"loadReportsTopic={topic}", "--set", f"redisKeyPrefix={prefix}",
            "--set", "loadBalancerReportUpdateMinIntervalMillis=60000"]  # fmt: skip
    proc = subprocess.Popen(
        argv, stderr=subprocess.PIPE, text=True, cwd=os.getcwd(), start_new_session=True
    )
    lines: list[str] = []
    found = threading.Event()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if _PORT_RE.search(line):
                found.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        assert found.wait(60), "".join(lines)
        port = int(next(m.group(1) for ln in lines if (m := _PORT_RE.search(ln))))
        deadline = time.monotonic() + 60
        while True:
            now_samples = _scrape(port)
            if _get(now_samples, "lbctl_agent_reports_published_total") >= 1:
                break
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.3)
        time.sleep(0.5)  # nothing else is due for a minute: the values below are final
        s = _scrape(port)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    assert proc.returncode == 0, "".join(lines)

    assert _get(s, "lbctl_agent_reports_published_total") == 1
    assert _get(s, "lbctl_agent_checks_total", published="true") == 1
    assert _get(s, "lbctl_agent_checks_total", published="false") == 0
    # it reported three bundles and holds two: two renewals, someone else's lease untouched
    assert _get(s, "lbctl_lease_renewals_total", result="renewed") == 2
    assert _get(s, "lbctl_lease_renewals_total", result="lost") == 0
    assert store.owner(b2, wall_clock_ms()).broker == "someone-else:8080"

    # the host gauges are the usage of the report it published, in percent
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "m"})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    msg = consumer.poll(30)
    consumer.close()
    assert msg is not None and not msg.error()
    report = decode_report(msg.value(), msg.key().decode())
    assert report.bandwidth_in.limit == pytest.approx(12_500.0)  # --nic-speed-mbps 100
    for name, usage in (
        ("pulsar_lb_cpu_usage", report.cpu),
        ("pulsar_lb_memory_usage", report.memory),
        ("pulsar_lb_directMemory_usage", report.direct_memory),
        ("pulsar_lb_bandwidth_in_usage", report.bandwidth_in),
        ("pulsar_lb_bandwidth_out_usage", report.bandwidth_out),
    ):
        assert _get(s, name, broker=broker) == pytest.approx(usage.percent_usage()), name
    assert _get(s, "pulsar_lb_memory_usage", broker=broker) > 0
