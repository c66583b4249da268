"""The streaming job end to end: real Kafka-protocol broker, real Redis, real local Spark.

Reports go in with confluent-kafka; what the job says comes back from the decisions and
dead-letter topics and from the load snapshot in Redis, compared with the pure code.
Every run uses ``availableNow`` (process what is there, then stop), so no test sleeps.
"""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from loadbalance.config import LoadBalancerConfig
from loadbalance.cycle import ingest_kwargs
from loadbalance.decisions import SPLIT, TRANSFER, UNLOAD, decode_decision
from loadbalance.model import LocalBrokerData, NamespaceBundleStats, ResourceUsage
from loadbalance.report_codec import encode_report
from loadbalance.view import LoadState, ingest_many
from metadata_store.load_snapshot import LoadSnapshot, split_field
from metadata_store.ownership_redis import RedisStore
from streaming.checkpoint_settings import SETTINGS_FILE
from streaming.decide import BatchStats
from streaming.job import StreamSettings, start_query

NS = "acme/stream"
T0_MS = 1_700_000_000_000
MINUTE_MS = 60_000


@pytest.fixture(params=["kafka", "python"])
def job_source(request: pytest.FixtureRequest) -> str:
    """The job's Kafka source: Spark's connector (the default) or the Python data source; the
    tests that take it must give the same decisions, dead letters and exactly-once on both."""
    return str(request.param)


def _config(unique_topic, **knobs: object) -> LoadBalancerConfig:
    return LoadBalancerConfig(
        **{
            "loadReportsTopic": unique_topic(1, "reports"),
            "decisionsTopic": unique_topic(1, "decisions"),
            "deadLettersTopic": unique_topic(1, "dead"),
            "redisKeyPrefix": f"t{uuid.uuid4().hex[:8]}",
            **knobs,
        }
    )


def _report(broker: str, cpu: float, stats: dict[str, NamespaceBundleStats]) -> LocalBrokerData:
    return LocalBrokerData(
        broker=broker,
        cpu=ResourceUsage(cpu, 100.0),
        memory=ResourceUsage(1000.0, 4000.0),
        bandwidth_in=ResourceUsage(100.0, 1000.0),
        bandwidth_out=ResourceUsage(100.0, 1000.0),
        msg_rate_in=sum(s.msg_rate_in for s in stats.values()),
        msg_rate_out=sum(s.msg_rate_out for s in stats.values()),
        msg_throughput_in=sum(s.msg_throughput_in for s in stats.values()),
        msg_throughput_out=sum(s.msg_throughput_out for s in stats.values()),
        num_bundles=len(stats),
        bundles=frozenset(stats),
        last_stats=stats,
    )


def _publish(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes, int]]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 4_000_000})
    for key, value, ts in records:
        p.produce(topic, value=value, key=key, timestamp=ts)
    assert p.flush(30) == 0


def _read_all(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes, int, int]]:
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
            out.append((m.key(), m.value(), m.partition(), m.offset()))
    c.close()
    return out


def _run(
    spark,
    kafka_bootstrap,
    redis_url,
    config,
    checkpoint: Path,
    timeout_s: float = 240,
    source: str = "kafka",
    **settings_kw: Any,
) -> list[BatchStats]:
    """One ``availableNow`` run of the job to its end on ``source`` (Spark's connector by
    default); ``settings_kw`` override settings."""
    stats: list[BatchStats] = []
    settings = StreamSettings(
        bootstrap_servers=kafka_bootstrap,
        checkpoint=str(checkpoint),
        redis_url=redis_url,
        available_now=True,
        source=source,
        **{"n_shards": 4, **settings_kw},
    )
    query = start_query(spark, settings, config, on_batch=stats.append)
    query.awaitTermination(timeout_s)
    assert query.exception() is None, query.exception()
    query.stop()
    return stats


def _stats(rate: float, thr: float, topics: int = 4) -> NamespaceBundleStats:
    return NamespaceBundleStats(rate, rate / 2, thr, thr / 2, topics, 2, 3)


def _cluster_round(names: list[str], i: int) -> list[LocalBrokerData]:
    """Four brokers, four bundles each; broker-1 at 95 % CPU, names[5] hot on broker-2."""
    out = []
    for b in range(4):
        stats = {}
        for j, name in enumerate(names[b * 4 : b * 4 + 4]):
            rate = 5000.0 if name == names[5] else 100.0 + 10 * j + i
            stats[name] = _stats(rate, 2e6 + 1e5 * j + 1e3 * i)
        out.append(_report(f"broker-{b + 1}:8080", 95.0 if b == 0 else 30.0 + b, stats))
    return out


def _records(reports: list[LocalBrokerData], ts: int) -> list[tuple[bytes, bytes, int]]:
    return [(r.broker.encode(), encode_report(r), ts + k) for k, r in enumerate(reports)]


def _snapshot_bundles(r: redis.Redis, prefix: str) -> dict[str, dict]:
    return LoadSnapshot(r, prefix).read().bundle_docs()


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _assert_matches_pure(snapshot: dict[str, dict], reports: list[LocalBrokerData], config):
    pure = ingest_many(LoadState(), reports, received_at_ms=0, **ingest_kwargs(config))
    assert set(snapshot) == set(pure.bundles)
    for name, data in pure.bundles.items():
        doc = snapshot[name]
        for side, avg in (("shortTerm", data.short_term), ("longTerm", data.long_term)):
            assert doc[side]["numSamples"] == avg.num_samples, (name, side)
            for key, value in (
                ("msgRateIn", avg.msg_rate_in),
                ("msgRateOut", avg.msg_rate_out),
                ("msgThroughputIn", avg.msg_throughput_in),
                ("msgThroughputOut", avg.msg_throughput_out),
            ):
                assert _close(doc[side][key], value), (name, side, key, doc[side][key], value)
        assert doc["topics"] == data.topics
    return pure


def overloaded_cluster(
    kafka_bootstrap: str, fresh_redis: redis.Redis, unique_topic
) -> tuple[LoadBalancerConfig, list[str]]:
    """Fresh topics and namespace, and three rounds of ``_cluster_round`` on the reports topic:
    broker-1 overloaded (OverloadShedder), names[5] over the split's message-rate limit."""
    config = _config(
        unique_topic,
        loadBalancerLoadSheddingStrategy="OverloadShedder",
        loadBalancerNamespaceBundleMaxMsgRate=1000,
    )
    store = RedisStore(fresh_redis, config.redis_key_prefix)
    store.create_namespace(NS, 16)
    names = store.get_namespace(NS).bundle_names
    records = []
    for i in range(3):
        records += _records(_cluster_round(names, i), T0_MS + i * 5000)
    _publish(kafka_bootstrap, config.load_reports_topic, records)
    return config, names


def test_overloaded_broker_is_shed_and_hot_bundle_split(
    spark, kafka_bootstrap, redis_url, fresh_redis, unique_topic, tmp_path, job_source
):
    config, names = overloaded_cluster(kafka_bootstrap, fresh_redis, unique_topic)

    stats = _run(spark, kafka_bootstrap, redis_url, config, tmp_path / "ckpt", source=job_source)

    assert sum(s.decisions for s in stats) >= 2
    decisions = [
        decode_decision(v) for _, v, _, _ in _read_all(kafka_bootstrap, config.decisions_topic)
    ]
    moves = [d for d in decisions if d.kind in (UNLOAD, TRANSFER)]
    splits = [d for d in decisions if d.kind == SPLIT]
    assert moves and all(d.source_broker == "broker-1:8080" for d in moves)
    assert {d.reason for d in moves} == {"Overloaded"}
    assert all(d.bundle in names[:4] for d in moves)
    assert [(d.bundle, d.reason) for d in splits] == [(names[5], "MsgRate")]
    assert splits[0].split_boundaries
    keys = {k for k, _, _, _ in _read_all(kafka_bootstrap, config.decisions_topic)}
    assert keys == {d.bundle.encode() for d in decisions}


@pytest.mark.parametrize("tasks_of", [None, 5], ids=["one-task", "tasks-of-5-reports"])
def test_state_averages_equal_the_pure_time_average_fold(
    spark, kafka_bootstrap, redis_url, fresh_redis, unique_topic, tmp_path, tasks_of
):
    """The same state whether the batch's reports are read by one task or cut into nine
    (``max_records_per_partition``): a broker's reports then reach the state step from several
    tasks, and its averages and each bundle's owner depend on their order."""
    config = _config(unique_topic)
    names = [f"{NS}/0x{i * 0x10000000:08x}_0x{(i + 1) * 0x10000000:08x}" for i in range(15)]
    reports = []
    for i in range(14):  # past the 10 short-term samples
        for b in range(3):
            own = names[b * 5 : b * 5 + 5]
            if i >= 7 and b == 2:  # a bundle changes owner: its averages must follow it
                own = [*own, names[0]]
            stats = {
                n: _stats(10.0 * (i + 1) + j * 0.37, 1e5 * (j + 1) + 17.3 * i)
                for j, n in enumerate(own)
            }
            if i >= 7 and b == 0:
                stats.pop(names[0])
            # b1 runs past 100 % CPU from the 6th round: its within-limit history usage then
            # reads its bandwidth, its weightedMaxEMA the CPU
            cpu = 80.0 + 5 * i if b == 1 else 20.0 + 3 * i + b
            reports.append(_report(f"b{b}:8080", cpu, stats))
    ts = [T0_MS + k * 1000 for k in range(len(reports))]
    _publish(
        kafka_bootstrap,
        config.load_reports_topic,
        [(r.broker.encode(), encode_report(r), t) for r, t in zip(reports, ts, strict=True)],
    )

    _run(
        spark,
        kafka_bootstrap,
        redis_url,
        config,
        tmp_path / "ckpt",
        max_records_per_partition=tasks_of,
    )

    pure = _assert_matches_pure(
        _snapshot_bundles(fresh_redis, config.redis_key_prefix), reports, config
    )
    brokers = {
        k.decode(): json.loads(v)
        for k, v in fresh_redis.hgetall(f"{config.redis_key_prefix}:load:brokers").items()
    }
    assert set(brokers) == set(pure.brokers)
    for name, load in pure.brokers.items():
        assert _close(brokers[name]["historyUsage"], load.history_usage)
        assert _close(brokers[name]["msgThroughputEma"], load.msg_throughput_ema)
        assert _close(brokers[name]["weightedMaxEma"], load.weighted_max_ema)
    assert pure.brokers["b1:8080"].weighted_max_ema > 1.0 > pure.brokers["b1:8080"].history_usage
    assert _snapshot_bundles(fresh_redis, config.redis_key_prefix)[names[0]]["broker"] == "b2:8080"
    # the new checkpoint dealt its 4 shards out over the 2 state partitions (keys s:1.1 and
    # s:3.6 carry a salt), and the snapshot names the shards s:<n> all the same
    settings = json.loads((tmp_path / "ckpt" / SETTINGS_FILE).read_text())
    assert settings == {"shards": 4, "stateKeyPartitions": 2}
    fields = fresh_redis.hkeys(f"{config.redis_key_prefix}:load:shards")
    published = {split_field(f.decode())[0] for f in fields}
    assert published <= {f"s:{n}" for n in range(4)} and "s:1" in published  # s:1's key: s:1.1


def test_restart_from_checkpoint_continues_state_and_never_republishes_a_batch(
    spark, kafka_bootstrap, redis_url, fresh_redis, unique_topic, tmp_path, job_source
):
    config = _config(
        unique_topic,
        loadBalancerLoadSheddingStrategy="OverloadShedder",
        loadBalancerNamespaceBundleMaxMsgRate=1000,
        loadBalancerSheddingGracePeriodMinutes=0,
    )
    store = RedisStore(fresh_redis, config.redis_key_prefix)
    store.create_namespace(NS, 16)
    names = store.get_namespace(NS).bundle_names
    checkpoint = tmp_path / "ckpt"
    first = [r for i in range(4) for r in _cluster_round(names, i)]
    _publish(kafka_bootstrap, config.load_reports_topic, [
        rec for i in range(4) for rec in _records(first[i * 4 : i * 4 + 4], T0_MS + i * MINUTE_MS)
    ])  # fmt: skip
    before = _run(spark, kafka_bootstrap, redis_url, config, checkpoint, source=job_source)
    assert sum(s.decisions for s in before) >= 1

    # A crash after the batch's Redis commit but before Spark's: the batch is replayed.
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    for p in (checkpoint / "commits").iterdir():
        if p.name in (str(last), f".{last}.crc"):
            p.unlink()
    second = [r for i in range(4, 7) for r in _cluster_round(names, i)]
    _publish(kafka_bootstrap, config.load_reports_topic, [
        rec for i in range(3)
        for rec in _records(second[i * 4 : i * 4 + 4], T0_MS + (4 + i) * MINUTE_MS)
    ])  # fmt: skip
    after: list[BatchStats] = []
    for _ in range(3):  # a source without availableNow support runs one batch per start
        after += _run(spark, kafka_bootstrap, redis_url, config, checkpoint, source=job_source)
        if any(not s.skipped and s.input_rows for s in after):
            break

    replayed = [s for s in after if s.skipped]
    assert [s.batch_id for s in replayed] == [before[-1].batch_id]
    assert min(s.batch_id for s in after if not s.skipped) > before[-1].batch_id
    _assert_matches_pure(
        _snapshot_bundles(fresh_redis, config.redis_key_prefix), first + second, config
    )
    published = [
        decode_decision(v).id for _, v, _, _ in _read_all(kafka_bootstrap, config.decisions_topic)
    ]
    assert published and len(published) == len(set(published))
    assert sorted(published) == sorted(i for s in before + after for i in s.decision_ids)


def test_malformed_records_go_to_dead_letters_and_good_ones_after_them_count(
    spark, kafka_bootstrap, redis_url, fresh_redis, unique_topic, tmp_path, job_source
):
    config = _config(unique_topic, maxReportBytes=4096)
    good = _report("good:8080", 40.0, {f"{NS}/0x00000000_0x80000000": _stats(10.0, 1e4)})
    doc = json.loads(encode_report(good))
    bad: list[tuple[bytes | None, bytes, str]] = [
        (b"b1", b"{this is not json", "record"),
        (b"b2", json.dumps({**doc, "numTopics": "many"}).encode(), "numTopics"),
        (b"b3", json.dumps({**doc, "padding": "x" * 5000}).encode(), "record"),
        (b"b4", json.dumps({**doc, "lastStats": [1]}).encode(), "lastStats"),
        (b"b5", json.dumps({**doc, "msgRateIn": -5}).encode(), "msgRateIn"),
        (b"b6", json.dumps({**doc, "msgRateOut": float("nan")}).encode(), "msgRateOut"),
        (None, json.dumps({**doc, "webServiceUrl": ""}).encode(), "key"),
        (b"b8", b"[1, 2, 3]", "record"),
    ]
    records = [(k, v, T0_MS + i) for i, (k, v, _) in enumerate(bad)]
    records.append((b"good:8080", encode_report(good), T0_MS + 100))
    _publish(kafka_bootstrap, config.load_reports_topic, records)

    stats = _run(spark, kafka_bootstrap, redis_url, config, tmp_path / "ckpt", source=job_source)

    assert sum(s.dead_letters for s in stats) == len(bad)
    letters = sorted(
        (json.loads(v) for _, v, _, _ in _read_all(kafka_bootstrap, config.dead_letters_topic)),
        key=lambda d: d["offset"],
    )
    assert [d["offset"] for d in letters] == list(range(len(bad)))
    for letter, (key, value, field) in zip(letters, bad, strict=True):
        assert letter["topic"] == config.load_reports_topic and letter["partition"] == 0
        assert letter["reason"] and letter["field"].startswith(field), letter
        assert letter["key"] == (key.decode() if key else None)
        assert letter["valueBytes"] == len(value)
    assert letters[2]["valueTruncated"] is False and "exceeds" in letters[2]["reason"]
    brokers = fresh_redis.hkeys(f"{config.redis_key_prefix}:load:brokers")
    assert brokers == [b"good:8080"]


def test_lbctl_stream_available_now_drains_the_topic_into_redis(
    spark, kafka_bootstrap, redis_url, fresh_redis, unique_topic, tmp_path
):
    from lbctl.main import main

    config = _config(unique_topic)
    report = _report("cli:8080", 50.0, {f"{NS}/0x00000000_0xffffffff": _stats(5.0, 1e3)})
    _publish(kafka_bootstrap, config.load_reports_topic,
             [(b"cli:8080", encode_report(report), T0_MS)])  # fmt: skip
    argv = ["stream", "--bootstrap-servers", kafka_bootstrap, "--redis-url", redis_url,
            "--checkpoint", str(tmp_path / "ckpt"), "--available-now", "--shards", "2"]  # fmt: skip
    knobs = {
        "loadReportsTopic": config.load_reports_topic,
        "decisionsTopic": config.decisions_topic,
        "deadLettersTopic": config.dead_letters_topic,
        "redisKeyPrefix": config.redis_key_prefix,
    }
    for knob, value in knobs.items():
        argv += ["--set", f"{knob}={value}"]

    assert main(argv) == 0

    prefix = config.redis_key_prefix
    assert fresh_redis.hkeys(f"{prefix}:load:brokers") == [b"cli:8080"]
    assert int(fresh_redis.hget(f"{prefix}:stream:progress", "now_ms")) == T0_MS


def test_a_batch_that_expires_bundles_and_updates_others_keeps_the_query_alive(
    spark, kafka_bootstrap, redis_url, fresh_redis, unique_topic, tmp_path
):
    """The state step's concatenated output (updates + expiries) must not come out as chunked
    Arrow strings (as it can under pandas 3), or Spark fails the query on it."""
    config = _config(unique_topic)
    bounds = ((0, 1 << 30), (1 << 30, 1 << 31), (1 << 31, 0xFFFFFFFF))
    gone, kept, new = (f"{NS}/0x{a:08x}_0x{b:08x}" for a, b in bounds)
    first = _report("b1:8080", 40.0, {gone: _stats(10.0, 1e4), kept: _stats(20.0, 2e4)})
    later = _report("b1:8080", 40.0, {kept: _stats(20.0, 2e4), new: _stats(30.0, 3e4)})
    _publish(kafka_bootstrap, config.load_reports_topic,
             [(b"b1:8080", encode_report(first), T0_MS),
              (b"b1:8080", encode_report(later), T0_MS + 10 * MINUTE_MS)])  # fmt: skip
    _run(
        spark, kafka_bootstrap, redis_url, config, tmp_path / "ckpt",
        n_shards=1,  # one shard: the update and the expiry meet in one state call
        bundle_ttl_seconds=60.0,
    )  # fmt: skip
    assert set(_snapshot_bundles(fresh_redis, config.redis_key_prefix)) == {kept, new}


def test_a_silent_broker_is_gone_after_the_report_timeout_and_a_reporting_one_is_not(
    spark, kafka_bootstrap, redis_url, fresh_redis, unique_topic, tmp_path
):
    """The broker timer: b1 reports at 0 s and 5 s, b2 keeps reporting. When b1's first
    deadline (10 s) passes, b1 has reported since, so it stays (the timer is armed again for
    15 s); once the watermark passes 15 s, b1 is gone and b2 is not."""
    config = _config(unique_topic, loadBalancerBrokerReportTimeoutSeconds=10)
    names = [f"{NS}/0x00000000_0x80000000", f"{NS}/0x80000000_0xffffffff"]
    b1, b2 = (_report(f"b{i + 1}:8080", 30.0, {names[i]: _stats(10.0, 1e4)}) for i in range(2))

    def run(records: list[tuple[LocalBrokerData, int]]) -> set[str]:
        timed = [(r.broker.encode(), encode_report(r), T0_MS + s * 1000) for r, s in records]
        _publish(kafka_bootstrap, config.load_reports_topic, timed)
        _run(
            spark, kafka_bootstrap, redis_url, config, tmp_path / "ckpt",
            n_shards=1, watermark_delay_seconds=1.0,
        )  # fmt: skip
        brokers = fresh_redis.hkeys(f"{config.redis_key_prefix}:load:brokers")
        return {b.decode() for b in brokers}

    assert run([(b1, 0), (b2, 0)]) == {"b1:8080", "b2:8080"}
    assert run([(b1, 5), (b2, 5), (b2, 12)]) == {"b1:8080", "b2:8080"}, "b1 reported at 5 s"
    assert run([(b2, 20)]) == {"b2:8080"}, "b1 silent past 5 s + 10 s"
