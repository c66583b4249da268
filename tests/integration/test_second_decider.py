"""Regression: a second decider (a streaming job started by mistake beside the real one, or an
old driver still alive after a restart, or an older job without the decider lease) cannot get
a decision applied.

Through the real decision stage (``streaming.decide.DecisionStage``, its Kafka sink captured in
memory and its policy cycle replaced by one that returns a chosen decision) and the real
reconciler against a real Redis. Without the decider lease this fails: the second stage
completes the cycle it finds pending and publishes its move, and the controller applies it.
Only names that exist with or without the lease are imported, so it fails at its assertion.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import pandas as pd
import pytest
import redis

import streaming.decide as decide
from controller.apply import APPLIED
from controller.reconciler import Reconciler
from loadbalance.config import LoadBalancerConfig
from loadbalance.cycle import CycleResult
from loadbalance.decisions import (
    TRANSFER,
    Decision,
    decode_decision,
    encode_decision,
    make_decision,
)
from metadata_store.ownership_redis import RedisStore
from metadata_store.progress import Progress, RedisProgress

PREFIX = "od"
NS = "acme/one"
FOREVER = 10**13


def _store(client: redis.Redis) -> tuple[RedisStore, str]:
    store = RedisStore(client, prefix=PREFIX)
    store.create_namespace(NS, 1)
    for b in ("b1", "b2"):
        store.register_broker(b, now_ms=0, ttl_ms=FOREVER)
    [bundle] = store.get_namespace(NS).bundle_names
    store.acquire(bundle, "b1", now_ms=0, ttl_ms=FOREVER)
    return store, bundle


def _move(bundle: str, src: str, dst: str, cycle: str, term: int = 0) -> Decision:
    d = make_decision(cycle=cycle, kind=TRANSFER, bundle=bundle, source_broker=src,
                      destination_broker=dst, reason="Overloaded")  # fmt: skip
    return decode_decision(_wire(d, term))


def _wire(d: Decision, term: int) -> bytes:
    return encode_decision(d, term=term, decider=f"test:{term}") if term else encode_decision(d)


# -- the decision stage --------------------------------------------------------------------------
class _Captured:
    """The stage's ``KafkaSink``, in memory: what each stage would have published."""

    records: ClassVar[list[tuple[str, bytes]]] = []

    def __init__(self, *_a: Any, **_kw: Any) -> None: ...

    def send(self, topic: str, _key: Any, value: bytes) -> None:
        self.records.append((topic, value))

    def flush(self) -> None: ...


class _Batch:
    """A micro-batch with no rows (the stage only completes the pending cycle it finds)."""

    def toPandas(self) -> pd.DataFrame:
        return pd.DataFrame({"kind": [], "payload": [], "event_ms": []})


def _stage(redis_url: str, holder: str, **knobs: Any) -> decide.DecisionStage:
    config = LoadBalancerConfig(redisKeyPrefix=PREFIX, **knobs)
    stage = decide.DecisionStage(config, "unused:9092", redis_url=redis_url)
    if hasattr(stage, "decider_id"):  # the job's id (one per process otherwise)
        stage.decider_id = holder
    return stage


def _pending_cycle(
    client: redis.Redis, batch: int, monkeypatch: Any, d: Decision, then: Any = None
) -> list[int]:
    """Redis says ``batch``'s cycle is due and unpublished; the cycle decides ``d`` (and runs
    ``then`` first, if given). The list returned counts the cycles run."""
    RedisProgress(client, PREFIX).commit(
        Progress(batch=batch, now_ms=1_000 * batch, cycle_pending=True), {}, [], {}, []
    )
    ran: list[int] = []

    def step(state: Any, *_a: Any, **_k: Any) -> tuple[Any, CycleResult]:
        ran.append(batch)
        if then is not None:
            then()
        return state, CycleResult((d,))

    monkeypatch.setattr(decide, "step", step)
    return ran


def _published(since: int) -> list[Decision]:
    return [decode_decision(v) for t, v in _Captured.records[since:] if "decision" in t]


def capture(monkeypatch: Any) -> type[_Captured]:
    """Replace the stage's Kafka sink by ``_Captured`` (emptied)."""
    _Captured.records = []
    monkeypatch.setattr(decide, "KafkaSink", _Captured)
    return _Captured


@pytest.fixture
def captured(monkeypatch: Any) -> type[_Captured]:
    return capture(monkeypatch)


def test_a_second_decider_cannot_get_a_decision_applied(
    fresh_redis: redis.Redis, redis_url: str, monkeypatch: Any, captured: type[_Captured]
) -> None:
    store, bundle = _store(fresh_redis)
    rec = Reconciler(store, publish=lambda _e: None, clock=lambda: 1_000)
    first = _stage(redis_url, "host-a:1:aaaa")
    second = _stage(redis_url, "host-b:2:bbbb")  # started by mistake beside the first

    _pending_cycle(fresh_redis, 5, monkeypatch, _move(bundle, "b1", "b2", "5"))
    first(_Batch(), 5)
    [moved] = _published(0)
    assert rec.reconcile(moved).outcome == APPLIED

    # the second job's own view wants the bundle back
    back = _move(bundle, "b2", "b1", "6")
    _pending_cycle(fresh_redis, 6, monkeypatch, back)
    second(_Batch(), 6)
    for d in _published(1):
        rec.reconcile(d)
    # and an older job (no lease, no term) publishing the same move beside it
    rec.reconcile(back)

    assert store.owner(bundle, 1_000).broker == "b2"
    assert _published(1) == []  # the second decider published nothing
    assert all(doc["outcome"] != APPLIED or d == moved.id
               for d, doc in _outcomes(fresh_redis).items())  # fmt: skip


def _outcomes(client: redis.Redis) -> dict[str, dict[str, Any]]:
    raw = client.hgetall(f"{PREFIX}:outcomes")
    return {k.decode(): json.loads(v) for k, v in raw.items()}
