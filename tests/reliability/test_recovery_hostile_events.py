"""Recovery reads the ownership-events topic, which anything with write access can fill: one
hostile or corrupt record among good ones must neither crash the controller nor poison the
store. Real Redis and the embedded Kafka; the controller's own path (``AutoRecovery.check``,
which reads the token floor from the topic and calls ``recover``).

Each case puts good events (largest token 57) and ONE bad record on the topic, loses the data,
and expects: the recovery completes, the fence floor is 57 (the bad record's token, if it has
one, is not trusted), every claimed bundle is leased again above 57, the report counts the
skipped or ignored record, and the store passes the independent invariant checker.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import redis
from confluent_kafka import Producer

from controller.events import OwnershipEvent, encode_event
from controller.recovery import AutoRecovery, last_report, recover, scan_events, summary
from loadbalance.errors import InvalidInput
from metadata_store.load_snapshot import shards_from_docs
from metadata_store.ownership_redis import RedisStore
from tests.reliability.invariants import check_invariants

pytestmark = pytest.mark.integration

NS = "acme/hostile"
NOW_MS = 1_700_000_000_000
TTL_MS = 60_000
GOOD_FLOOR = 57
B0, B1 = f"{NS}/0x00000000_0x80000000", f"{NS}/0x80000000_0xffffffff"


def _good_events() -> list[OwnershipEvent]:
    return [
        OwnershipEvent("assigned", B0, 1, new_owner="b1", new_token=3),
        OwnershipEvent(
            "transferred", B0, 2, old_owner="b1", new_owner="b2", old_token=3, new_token=GOOD_FLOOR
        ),
        OwnershipEvent("assigned", B1, 3, new_owner="b1", new_token=12),
        OwnershipEvent("expired", B1, 4, old_owner="b1", old_token=12),
        OwnershipEvent("assigned", B1, 5, new_owner="b1", new_token=40),
    ]


def _event_doc(token: object, **extra: object) -> bytes:
    doc = json.loads(encode_event(OwnershipEvent("assigned", B1, 6, new_owner="b1", new_token=1)))
    doc["newToken"] = token
    doc.update(extra)
    return json.dumps(doc).encode()


def _deep(depth: int) -> bytes:
    inner = "[" * depth + "]" * depth
    return f'{{"event":"assigned","bundle":"{B1}","atMs":6,"newToken":{inner}}}'.encode()


BAD_RECORDS: dict[str, Callable[[], bytes]] = {
    "token 10**30": lambda: _event_doc(10**30),
    "token 2**63-1": lambda: _event_doc(2**63 - 1),
    "token 2**53 (not JSON-safe)": lambda: _event_doc(2**53),
    "token far above the others": lambda: _event_doc(10**12),
    "nested 100k deep": lambda: _deep(100_000),
    "missing bundle and event": lambda: json.dumps({"newToken": 90, "atMs": 1}).encode(),
    "token as a string": lambda: _event_doc("99"),
    "invalid utf-8": lambda: _event_doc(91, reason="x").replace(b'"x"', b'"\xff\xfe"'),
    "invalid bundle name": lambda: _event_doc(92, bundle="acme/hostile/0xzz"),
}


def _lose_and_prepare(store: RedisStore) -> None:
    """An empty store after the loss: brokers re-registered, the snapshot says who serves what."""
    store.r.flushall()
    for b in ("b1", "b2"):
        store.register_broker(b, NOW_MS, TTL_MS)
    docs = {B0: {"broker": "b2"}, B1: {"broker": "b1"}}
    store.r.hset(store.keys.load_shards(), mapping=shards_from_docs(docs))


@pytest.mark.parametrize("case", sorted(BAD_RECORDS))
def test_one_bad_event_among_good_ones_is_skipped_and_recovery_completes(
    case: str, kafka_bootstrap: str, unique_topic: Callable[..., str], fresh_redis: redis.Redis
) -> None:
    topic = unique_topic(2, "events")
    p = Producer({"bootstrap.servers": kafka_bootstrap, "message.max.bytes": 2_000_000})
    good = _good_events()
    for i, e in enumerate(good[:3]):
        p.produce(topic, key=e.bundle.encode(), value=encode_event(e), partition=i % 2)
    p.produce(topic, key=B1.encode(), value=BAD_RECORDS[case](), partition=1)
    for i, e in enumerate(good[3:]):
        p.produce(topic, key=e.bundle.encode(), value=encode_event(e), partition=i % 2)
    assert p.flush(10) == 0

    store = RedisStore(fresh_redis, "hostile")
    _lose_and_prepare(store)
    clock = iter(range(100)).__next__
    recovery = AutoRecovery(
        store,
        kafka_bootstrap,
        topic,
        TTL_MS,
        wait_s=0.0,
        known_epoch="the-lost-epoch",
        monotonic=lambda: float(clock()),
    )
    assert recovery.check(NOW_MS) is None and recovery.pending  # detected: the epoch is gone
    report = recovery.check(NOW_MS)

    assert report is not None, "recovered on the second check"
    assert report.token_floor == GOOD_FLOOR, case
    assert report.events_read == len(good) + 1
    assert report.events_skipped + report.tokens_ignored == 1, (case, report.event_problems)
    assert report.event_problems, "the reason is reported"
    assert sorted(report.leases_granted) == [B0, B1]
    assert all(token > GOOD_FLOOR for _, token in report.leases_granted.values())
    state = check_invariants(fresh_redis, "hostile", NOW_MS)
    assert state.fence == GOOD_FLOOR + 2, "the fence was raised to the floor, then two grants"
    stored = last_report(store)
    assert stored is not None and stored["events_skipped"] == report.events_skipped


@pytest.mark.parametrize("fence", [b"1000000000000000000000000000000", b"1e5", b"-3", b"abc"])
def test_recover_refuses_before_writing_anything_when_the_fence_cannot_take_the_floor(
    fence: bytes, fresh_redis: redis.Redis
) -> None:
    store = RedisStore(fresh_redis, "hostile")
    _lose_and_prepare(store)
    fresh_redis.set("hostile:fence", fence)
    keys_before = sorted(fresh_redis.keys("*"))
    claims = {"b1": [B1], "b2": [B0]}
    with pytest.raises(redis.ResponseError, match="fence counter holds"):
        recover(store, claims, now_ms=NOW_MS, lease_ttl_ms=TTL_MS, token_floor=57, reason="t")
    with pytest.raises(InvalidInput, match="no room"):
        recover(store, claims, now_ms=NOW_MS, lease_ttl_ms=TTL_MS, token_floor=2**53, reason="t")
    with pytest.raises(InvalidInput, match="token_floor"):
        recover(store, claims, now_ms=NOW_MS, lease_ttl_ms=TTL_MS, token_floor=True, reason="t")
    assert sorted(fresh_redis.keys("*")) == keys_before, "nothing written"
    assert fresh_redis.get("hostile:fence") == fence


def test_the_summary_line_counts_skipped_records_and_ignored_tokens(
    kafka_bootstrap: str, unique_topic: Callable[..., str], fresh_redis: redis.Redis
) -> None:
    topic = unique_topic(1, "events")
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    for e in _good_events():
        p.produce(topic, key=e.bundle.encode(), value=encode_event(e))
    for raw in (BAD_RECORDS["nested 100k deep"](), BAD_RECORDS["token far above the others"]()):
        p.produce(topic, key=B1.encode(), value=raw)
    assert p.flush(10) == 0
    store = RedisStore(fresh_redis, "hostile")
    _lose_and_prepare(store)
    scan = scan_events(kafka_bootstrap, topic)
    assert (scan.floor, scan.read, scan.skipped, scan.ignored_tokens) == (57, 7, 1, [10**12])
    claims = {"b1": [B1], "b2": [B0]}
    report = recover(store, claims, now_ms=NOW_MS, lease_ttl_ms=TTL_MS, token_floor=scan.floor,
                     reason="t", events=scan)  # fmt: skip
    line = summary(report)
    assert "ownership events: 7 read, 1 skipped as invalid, 1 tokens not trusted" in line, line
    assert any("nested too deeply" in x for x in report.event_problems), report.event_problems
