"""50,000 malformed and hostile decision records through the controller's own gate and applier.

The control loop (``controller.loop.run_loop``) calls ``decode_decision(value,
max_bytes=maxDecisionBytes)`` on every record and turns an ``InvalidDecision`` into a ``rejected``
outcome with ``str(error)`` as the reason; anything else it lets escape. So the properties are:
decode raises nothing but ``InvalidDecision`` (with a non-empty, short reason) for every bad
record and returns a ``Decision`` for every good one; and ``apply_decision`` against the real
Redis store, fed a few thousand decodable but stale or contradictory decisions (unknown
namespaces, bundles no longer current, dead destinations, wrong owners, replays), always ends
with a recorded outcome and never raises, leaving every namespace's ring covered exactly.
"""

from __future__ import annotations

import itertools
import json
import random
import tracemalloc
from collections import Counter

import psutil
import redis

from controller.apply import (
    ALREADY_SATISFIED,
    APPLIED,
    CONFLICT,
    DUPLICATE,
    REJECTED,
    apply_decision,
    outcome_of,
)
from controller.redis_store import RedisStore
from loadbalance.bundles import check_boundaries
from loadbalance.config import LoadBalancerConfig
from loadbalance.decisions import Decision, decode_decision
from loadbalance.errors import InvalidDecision
from tests.fuzz.corpus import DECISION_CLASSES, NAMESPACES, Case, decision_cases, valid_decision

N_CASES = 50_000
TRACED_CASES = 6_000
APPLY_CASES = 4_000
SEED = 611
MAX_BYTES = LoadBalancerConfig().max_decision_bytes
PEAK_BOUND_BYTES = 16 * 1024 * 1024
RSS_GROWTH_BOUND_BYTES = 32 * 1024 * 1024
NOW_MS = 1_700_000_000_000


def _check_case(case: Case, dead: Counter[str]) -> None:
    try:
        d = decode_decision(case.value or b"", max_bytes=MAX_BYTES)
    except InvalidDecision as e:
        assert case.bad, (case.note, str(e))
        assert e.reason and len(str(e)) <= 700, (case.cls, case.note, str(e))
        dead[case.cls] += 1
        return
    assert not case.bad, (case.cls, case.note, d)
    assert isinstance(d, Decision)


def test_hostile_decision_corpus_is_rejected_with_reasons_and_memory_stays_bounded() -> None:
    per_class: Counter[str] = Counter()
    rejected: Counter[str] = Counter()
    cases = iter(decision_cases(N_CASES, SEED, max_bytes=MAX_BYTES))
    tracemalloc.start()
    try:
        for case in itertools.islice(cases, TRACED_CASES):
            per_class[case.cls] += 1
            _check_case(case, rejected)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    rss_before = psutil.Process().memory_info().rss
    for case in cases:
        per_class[case.cls] += 1
        _check_case(case, rejected)
    rss_growth = psutil.Process().memory_info().rss - rss_before
    assert sum(per_class.values()) == N_CASES
    assert set(per_class) == set(DECISION_CLASSES)
    assert all(per_class[c] >= 1_000 for c in DECISION_CLASSES), per_class
    assert sum(rejected.values()) == N_CASES - per_class["valid"]
    assert peak < PEAK_BOUND_BYTES, f"peak {peak / 2**20:.1f} MiB"
    assert rss_growth < RSS_GROWTH_BOUND_BYTES, f"RSS grew {rss_growth / 2**20:.1f} MiB"


def _stale_decision(rng: random.Random) -> bytes:
    """A decodable decision that the store's current state makes wrong in some way."""
    kind = rng.random()
    if kind < 0.35:
        doc = valid_decision(rng)  # current bundles (4 per namespace at the start)
    elif kind < 0.55:
        doc = valid_decision(rng, pieces=rng.choice((2, 8, 16)))  # not current (or not yet)
    elif kind < 0.65:
        doc = valid_decision(rng, ns="ghost/ns")  # unknown namespace
    else:
        doc = valid_decision(rng)
        doc["sourceBroker"] = f"broker-{rng.randint(1, 99)}:8080"  # maybe not the owner
        if doc.get("destinationBroker"):
            doc["destinationBroker"] = f"broker-{rng.randint(6, 12)}:8080"  # 8+ are dead
            if doc["destinationBroker"] == doc["sourceBroker"]:
                doc["sourceBroker"] = None
    if rng.random() < 0.1:
        doc["id"] = "replayed-0001"  # the same id again: a duplicate after the first
    return json.dumps(doc).encode()


def test_decodable_but_stale_decisions_always_end_with_a_recorded_outcome(
    fresh_redis: redis.Redis,
) -> None:
    store = RedisStore(fresh_redis, prefix="fuzz")
    for ns in NAMESPACES:
        store.create_namespace(ns, 4)
    for b in range(1, 8):
        store.register_broker(f"broker-{b}:8080", NOW_MS, 10**9)
    rng = random.Random(SEED)
    for ns in NAMESPACES:
        for name in store.get_namespace(ns).bundle_names:
            if rng.random() < 0.7:
                store.acquire(name, f"broker-{rng.randint(1, 5)}:8080", NOW_MS, 10**9)
    outcomes: Counter[str] = Counter()
    for i in range(APPLY_CASES):
        raw = _stale_decision(rng)
        d = decode_decision(raw, max_bytes=MAX_BYTES)
        out = apply_decision(store, d, now_ms=NOW_MS + i, lease_ttl_ms=30_000)
        assert out.outcome in {APPLIED, ALREADY_SATISFIED, CONFLICT, REJECTED, DUPLICATE}, out
        if out.outcome in (REJECTED, CONFLICT):
            assert out.reason, out
        assert outcome_of(store, d.id) is not None
        outcomes[out.outcome] += 1
    # every kind of ending happened, so the sample really exercised the applier's branches
    assert {APPLIED, REJECTED, DUPLICATE, ALREADY_SATISFIED} <= set(outcomes), outcomes
    for ns in NAMESPACES:
        check_boundaries(store.get_namespace(ns).boundaries)  # still covers the ring exactly
    assert store.get_namespace("ghost/ns") is None
