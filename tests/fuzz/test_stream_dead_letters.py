"""Hostile load reports through the real streaming job: all dead-lettered, the query lives on.

A few hundred records drawn from every bad class of the corpus (1 MiB+ records, invalid UTF-8,
tombstones, deep nesting, overlapping bundles, ...) are interleaved with good reports on a real
Kafka-protocol topic, and the whole job (Python Kafka source, ``mapInPandas`` parse, the
stateful step, the decision stage) runs over them with ``availableNow``. Every bad record must
come out on the dead-letter topic exactly once, at its own offset, with a reason; the query
must end without an exception; and the good reports around the bad ones must still reach the
load snapshot in Redis.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections import Counter
from pathlib import Path

import redis
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from loadbalance.config import LoadBalancerConfig
from tests.fuzz.corpus import REPORT_CLASSES, report_cases
from tests.integration.test_streaming_job import _run

N_BAD = 330
T0_MS = 1_700_000_000_000


def _publish(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes | None]]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 4_000_000})
    refused: list[str] = []  # a refused record would shift every later offset the test expects

    def delivered(err: object, _msg: object) -> None:
        if err is not None:
            refused.append(str(err))

    for i, (key, value) in enumerate(records):
        p.produce(topic, value=value, key=key, timestamp=T0_MS + i, on_delivery=delivered)
        p.poll(0)
    assert p.flush(60) == 0
    assert not refused, refused[:3]


def _read_all(bootstrap: str, topic: str) -> list[bytes]:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:6]}",
            "enable.partition.eof": True,
        }
    )
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    out = []
    while True:
        m = c.poll(10)
        if m is None or (m.error() and m.error().code() == -191):  # partition EOF
            break
        if not m.error():
            out.append(m.value())
    c.close()
    return out


def test_hostile_records_all_reach_the_dead_letter_topic_and_the_query_survives(
    spark, kafka_bootstrap, redis_url, fresh_redis: redis.Redis, unique_topic, tmp_path: Path
) -> None:
    config = LoadBalancerConfig(
        loadReportsTopic=unique_topic(1, "hostile"),
        decisionsTopic=unique_topic(1, "decisions"),
        deadLettersTopic=unique_topic(1, "dead"),
        redisKeyPrefix=f"f{uuid.uuid4().hex[:8]}",
    )
    records: list[tuple[bytes | None, bytes | None]] = []
    bad_offsets: dict[int, str] = {}
    good_brokers: set[str] = set()
    per_class: Counter[str] = Counter()
    for case in report_cases(N_BAD * 3, seed=99, valid_share=0.08):
        if case.bad and per_class[case.cls] >= N_BAD // len(REPORT_CLASSES[1:]) + 1:
            continue
        if not case.bad and (case.key is None or len(good_brokers) >= 10):
            continue
        per_class[case.cls] += 1
        if case.bad:
            bad_offsets[len(records)] = case.cls
        else:
            good_brokers.add(case.key.decode())
        records.append((case.key, case.value))
        if len(bad_offsets) >= N_BAD and len(good_brokers) >= 10:
            break
    # every refused class is present; tolerated ones (accepted, item ignored) count as good
    assert len(bad_offsets) >= 300 and set(REPORT_CLASSES) <= set(per_class), per_class
    _publish(kafka_bootstrap, config.load_reports_topic, records)

    _run(spark, kafka_bootstrap, redis_url, config, tmp_path / "ckpt", timeout_s=600)

    letters = [json.loads(v) for v in _read_all(kafka_bootstrap, config.dead_letters_topic)]
    by_offset = {d["offset"]: d for d in letters}
    assert len(letters) == len(by_offset), "a record was dead-lettered twice"
    assert set(by_offset) == set(bad_offsets), (
        sorted(set(bad_offsets) - set(by_offset))[:10],
        sorted(set(by_offset) - set(bad_offsets))[:10],
    )
    for offset, doc in by_offset.items():
        assert doc["reason"] and not doc["reason"].startswith("internal"), (
            bad_offsets[offset],
            doc,
        )
        assert doc["topic"] == config.load_reports_topic
        _key, value = records[offset]
        shown = base64.b64decode(doc["value"])
        assert (value or b"").startswith(shown) and doc["valueBytes"] == len(value or b"")
    # the good reports between the bad ones were processed: their brokers are in the snapshot
    seen = {k.decode() for k in fresh_redis.hkeys(f"{config.redis_key_prefix}:load:brokers")}
    assert good_brokers <= seen, (good_brokers - seen, seen)
