"""``lbctl monitor --once --json`` against real Redis and Kafka, over state written the way the
product writes it: brokers and leases through ``RedisStore``, outcomes through ``apply_decision``,
the load snapshot and progress through the streaming job's ``RedisProgress.commit``, load
reports on a Kafka topic, and a Spark-style checkpoint of the job's processed offsets."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import redis

from controller.apply import apply_decision
from lbctl.main import main
from loadbalance.decisions import TRANSFER, make_decision
from metadata_store.ownership_redis import RedisStore
from metadata_store.progress import Progress, RedisProgress


def _server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _broker_doc(cpu_pct: float, updated_at_ms: int, topics: int) -> str:
    report = {
        "cpu": {"usage": 8.0 * cpu_pct, "limit": 800.0},
        "memory": {"usage": 1024.0, "limit": 8192.0},
        "directMemory": {"usage": 256.0, "limit": 1024.0},
        "bandwidthIn": {"usage": 0.0, "limit": 1_250_000.0},
        "bandwidthOut": {"usage": 0.0, "limit": 1_250_000.0},
        "numTopics": topics, "numProducers": 2 * topics, "numConsumers": 3 * topics,
        "msgRateIn": 100.0 * topics, "msgRateOut": 200.0 * topics,
        "msgThroughputIn": 2048.0 * topics, "msgThroughputOut": 4096.0 * topics,
    }  # fmt: skip
    return json.dumps(
        {"report": report, "historyUsage": cpu_pct / 100, "msgThroughputEma": 0.0,
         "updatedAtMs": updated_at_ms}
    )  # fmt: skip


def _checkpoint(root: Path, topic: str, committed: dict[str, int]) -> Path:
    """A checkpoint as Spark leaves it: batch 3 committed, batch 4 planned but not done."""
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    meta = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}})
    (root / "offsets" / "3").write_text(f"v1\n{meta}\n{json.dumps({topic: committed})}")
    (root / "offsets" / "4").write_text(f"v1\n{meta}\n{json.dumps({topic: {'0': 99}})}")
    (root / "commits" / "3").write_text('v1\n{"nextBatchWatermarkMs":0}')
    return root


def test_monitor_once_json_shows_brokers_decisions_expiring_leases_stale_brokers_and_lag(
    redis_url: str,
    fresh_redis: redis.Redis,
    kafka_bootstrap: str,
    unique_topic,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from confluent_kafka import Producer

    prefix = f"mon{uuid.uuid4().hex[:8]}"
    topic = unique_topic(partitions=1, prefix="reports")
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for _ in range(5):
        producer.produce(topic, key=b"broker-a", value=b"{}", partition=0)
    assert producer.flush(15) == 0

    store = RedisStore(fresh_redis, prefix)  # caller clock, fed Redis's own time
    now = _server_ms(fresh_redis)
    store.create_namespace("public/mon", 4)
    b0, b1, b2, _b3 = store.get_namespace("public/mon").bundle_names
    for broker in ("broker-a", "broker-b", "broker-c"):
        store.register_broker(broker, now, 60_000)
    store.register_broker("broker-gone", now - 5_000, 1_000)  # heartbeats stopped 5 s ago
    store.acquire(b0, "broker-a", now, 60_000)
    store.acquire(b1, "broker-a", now, 4_000)  # about to expire
    store.acquire(b2, "broker-b", now, 60_000)  # b3 stays without an owner

    moved = make_decision(
        cycle="c1", kind=TRANSFER, bundle=b2, source_broker="broker-b",
        destination_broker="broker-c", reason="Overloaded", strategy="test", decided_at_ms=now,
    )  # fmt: skip
    refused = make_decision(
        cycle="c2", kind=TRANSFER, bundle=b0, source_broker="broker-a",
        destination_broker="broker-gone", reason="HighRate", strategy="test", decided_at_ms=now,
    )  # fmt: skip
    assert apply_decision(store, moved, now_ms=now, lease_ttl_ms=60_000).outcome == "applied"
    assert apply_decision(store, refused, now_ms=now, lease_ttl_ms=60_000).outcome == "rejected"

    job_now = 1_700_000_000_000  # the job's event-time clock (a simulator's is virtual)
    docs = {
        "broker-a": _broker_doc(90.0, job_now, topics=4),
        "broker-b": _broker_doc(20.0, job_now - 45_000, topics=1),  # reports stopped
        "broker-c": _broker_doc(40.0, job_now - 2_000, topics=2),
    }
    progress = RedisProgress(fresh_redis, prefix)
    progress.commit(Progress(batch=12, now_ms=job_now), docs, [], {}, [])
    checkpoint = _checkpoint(tmp_path / "cp", topic, {"0": 3})

    code = main(
        ["monitor", "--once", "--json", "--redis-url", redis_url,
         "--bootstrap-servers", kafka_bootstrap, "--checkpoint", str(checkpoint),
         "--expiring-within", "10", "--stale-after", "30",
         "--set", f"redisKeyPrefix={prefix}", "--set", f"loadReportsTopic={topic}"]
    )  # fmt: skip
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0 and len(out) == 1, out
    doc = json.loads(out[0])

    rows = {b["broker"]: b for b in doc["brokers"]}
    assert sorted(rows) == ["broker-a", "broker-b", "broker-c"]
    a = rows["broker-a"]
    assert a["cpuPct"] == pytest.approx(90.0) and a["maxPct"] == pytest.approx(90.0)
    assert a["memoryPct"] == pytest.approx(12.5) and a["directMemoryPct"] == pytest.approx(25.0)
    assert (a["topics"], a["producers"], a["consumers"]) == (4, 8, 12)
    assert a["msgRateIn"] == 400.0 and a["throughputInKbPerS"] == pytest.approx(8.0)
    assert a["overloaded"] is True and rows["broker-c"]["overloaded"] is False
    assert {b: r["bundles"] for b, r in rows.items()} == {
        "broker-a": 2, "broker-b": 0, "broker-c": 1
    }  # fmt: skip
    assert doc["spread"]["maxOverMean"] == pytest.approx(
        90 / ((90 + 25 + 40) / 3), abs=1e-3
    )  # b: direct 25 %
    assert doc["balanced"] is False and doc["balancedMaxOverMean"] == pytest.approx(1.10)

    newest, older = doc["decisions"][:2]
    assert (newest["kind"], newest["bundle"], newest["outcome"]) == ("transfer", b0, "rejected")
    assert newest["decisionReason"] == "HighRate" and "broker gone" in newest["reason"]
    assert (older["bundle"], older["outcome"], older["decisionReason"]) == (
        b2, "applied", "Overloaded"
    )  # fmt: skip
    assert (older["source"], older["destination"]) == ("broker-b", "broker-c")
    assert doc["applied"] == {"transfer": 1} and doc["outcomes"] == {"applied": 1, "rejected": 1}

    leases = doc["leases"]
    assert (leases["bundles"], leases["owned"], leases["unowned"]) == (4, 3, 1)
    assert [(e["bundle"], e["broker"]) for e in leases["expiring"]] == [(b1, "broker-a")]
    assert 0 < leases["expiring"][0]["expiresInS"] <= 4.0

    reg = doc["registry"]
    assert reg["live"] == ["broker-a", "broker-b", "broker-c"]
    assert list(reg["registrationExpired"]) == ["broker-gone"]
    assert 5.0 <= reg["registrationExpired"]["broker-gone"] < 30.0
    assert reg["reportsStale"] == {"broker-b": 45.0}
    assert reg["staleBrokers"] == ["broker-b", "broker-gone"]
    assert reg["withoutReport"] == [] and reg["unregisteredReporting"] == []

    stream = doc["stream"]
    assert (stream["batch"], stream["eventTimeMs"]) == (12, job_now)
    assert stream["topic"] == topic and stream["endOffsets"] == {"0": 5}
    assert stream["processedOffsets"] == {"0": 3} and stream["lagRecords"] == 2
    assert stream["lagError"] is None


def test_monitor_once_table_names_the_problems(
    redis_url: str,
    fresh_redis: redis.Redis,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The human view carries the same facts: the overloaded broker, the stale one, the
    expiring lease, and the decision with its reason (no Kafka given: no lag line)."""
    monkeypatch.setenv("COLUMNS", "200")  # one status line per line, as on a wide terminal
    monkeypatch.delenv("LB_kafkaBootstrapServers", raising=False)
    prefix = f"mon{uuid.uuid4().hex[:8]}"
    store = RedisStore(fresh_redis, prefix)
    now = _server_ms(fresh_redis)
    store.create_namespace("public/tbl", 2)
    b0, b1 = store.get_namespace("public/tbl").bundle_names
    store.register_broker("broker-a", now, 60_000)
    store.register_broker("broker-b", now, 60_000)
    store.acquire(b0, "broker-a", now, 3_000)
    store.acquire(b1, "broker-a", now, 60_000)
    d = make_decision(
        cycle="c", kind=TRANSFER, bundle=b1, source_broker="broker-a",
        destination_broker="broker-b", reason="Overloaded", strategy="test", decided_at_ms=now,
    )  # fmt: skip
    apply_decision(store, d, now_ms=now, lease_ttl_ms=60_000)
    job_now = 1_700_000_000_000
    docs = {
        "broker-a": _broker_doc(95.0, job_now, 3),
        "broker-b": _broker_doc(10.0, job_now - 90_000, 1),
    }
    progress = RedisProgress(fresh_redis, prefix)
    progress.commit(Progress(batch=3, now_ms=job_now), docs, [], {}, [])

    code = main(
        ["monitor", "--once", "--redis-url", redis_url, "--stale-after", "30",
         "--set", f"redisKeyPrefix={prefix}"]
    )  # fmt: skip
    text = capsys.readouterr().out
    assert code == 0
    assert "broker-a" in text and "95.0" in text
    assert "not balanced at <= 1.10" in text
    assert f"1 ending within 10s: {b0} (broker-a" in text
    assert "reports stopped: broker-b (90s behind the job)" in text
    # the decision's measured condition, not its reason name ("Overloaded")
    assert "broker-a at 95.0 % is" in text and "x the mean" in text and "applied" in text
    assert "stream: batch 3" in text and "lag" not in text
