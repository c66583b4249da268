"""50,000 malformed and hostile decision records through the controller's own gate and applier.

The control loop (``controller.loop.run_loop``) calls ``decode_decision(value,
max_bytes=maxDecisionBytes)`` on every record and turns an ``InvalidDecision`` into a ``rejected``
outcome with ``str(error)`` as the reason; anything else it lets escape. So the properties are:
decode raises nothing but ``InvalidDecision`` (with a non-empty, short reason) for every bad
record and returns a ``Decision`` for every good one; and ``apply_decision`` against the real
Redis store, fed 1,500 decodable but stale or contradictory decisions (unknown namespaces,
bundles no longer current, dead destinations, wrong owners, replays), gives for each the one
outcome and reason that an independent oracle (``_expected``, over a raw read of the keys)
predicts, records it, changes nothing unless it applied, and leaves every ring covered exactly
and every lease consistent as ``tests.reliability.invariants`` reads them from raw keys.
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
    DRY_RUN,
    DUPLICATE,
    REJECTED,
    apply_decision,
)
from loadbalance.bundles import parse_bundle
from loadbalance.config import LoadBalancerConfig
from loadbalance.decisions import MERGE, SPLIT, UNLOAD, Decision, decode_decision
from loadbalance.errors import InvalidDecision
from metadata_store.ownership_redis import RedisStore
from tests.fuzz.corpus import DECISION_CLASSES, NAMESPACES, Case, decision_cases, valid_decision
from tests.reliability.invariants import StoreState, check_invariants, read_state

N_CASES = 50_000
TRACED_CASES = 6_000
# each case reads every key twice for the oracle, so fewer than the decode-only corpus
ORACLE_CASES = 1_500
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


LIVE = frozenset(f"broker-{b}:8080" for b in range(1, 8))  # registered below; 8+ never are


def _expected(state: StoreState, recorded: dict[str, str], d: Decision, now_ms: int) -> tuple:
    """The one outcome and reason ``apply_decision`` must give, from a raw read of the keys.

    An oracle written from the controller's documented rules (level-based: re-read, check the
    transition, return early if it holds), not from its code; it sees Redis only through
    ``read_state`` (raw ``P:ns:*``/``P:lease:*`` keys), so a store object that validates itself
    cannot hide a broken ring or lease from it."""
    if d.id in recorded and recorded[d.id] not in (DRY_RUN, CONFLICT):
        return DUPLICATE, f"already {recorded[d.id]}"
    r = parse_bundle(d.bundle)
    if r.namespace not in state.boundaries:
        return REJECTED, f"unknown namespace {r.namespace}"
    current = set(state.bundles(r.namespace))
    bounds = set(state.boundaries[r.namespace])
    if d.kind == SPLIT:
        if d.bundle in current:
            return APPLIED, ""
        if {r.lower, r.upper, *d.split_boundaries} <= bounds:
            return ALREADY_SATISFIED, "the split already happened"
        return REJECTED, f"bundle gone: {d.bundle} is no longer current"
    if d.kind == MERGE:
        other = parse_bundle(d.merge_bundle or "")
        if d.bundle not in current or other.name not in current:
            lo, hi = min(r.lower, other.lower), max(r.upper, other.upper)
            if f"{r.namespace}/0x{lo:08x}_0x{hi:08x}" in current:
                return ALREADY_SATISFIED, "the merge already happened"
            return REJECTED, "bundle gone: a merged bundle is no longer current"
        if state.live_owner(d.bundle, now_ms) != state.live_owner(other.name, now_ms):
            return REJECTED, "owner changed: the bundles have different owners"
        return APPLIED, ""
    if d.bundle not in current:
        return REJECTED, f"bundle gone: {d.bundle} is no longer current"
    owner = state.live_owner(d.bundle, now_ms)
    if d.kind == UNLOAD:
        if owner is None:
            return ALREADY_SATISFIED, "the bundle is not owned"
        if d.source_broker and owner != d.source_broker:
            return REJECTED, f"owner changed: now {owner}"
        return APPLIED, ""
    dest = d.destination_broker or ""
    if owner is not None and owner == dest:
        return ALREADY_SATISFIED, f"already owned by {dest}"
    if owner is not None and d.source_broker and owner != d.source_broker:
        return REJECTED, f"owner changed: now {owner}"
    if dest not in LIVE:
        return REJECTED, f"broker gone: {dest} is not live"
    return APPLIED, ""


def _recorded(r: redis.Redis) -> dict[str, str]:
    return {k.decode(): json.loads(v)["outcome"] for k, v in r.hgetall("fuzz:outcomes").items()}


def test_decodable_but_stale_decisions_each_end_with_the_one_expected_outcome_and_reason(
    fresh_redis: redis.Redis,
) -> None:
    store = RedisStore(fresh_redis, prefix="fuzz")
    for ns in NAMESPACES:
        store.create_namespace(ns, 4)
    for b in sorted(LIVE):
        store.register_broker(b, NOW_MS, 10**9)
    rng = random.Random(SEED)
    for ns in NAMESPACES:
        for name in store.get_namespace(ns).bundle_names:
            if rng.random() < 0.7:
                store.acquire(name, f"broker-{rng.randint(1, 5)}:8080", NOW_MS, 10**9)
    outcomes: Counter[str] = Counter()
    previous: tuple[StoreState, str] | None = None
    for i in range(ORACLE_CASES):
        raw = _stale_decision(rng)
        d = decode_decision(raw, max_bytes=MAX_BYTES)
        now = NOW_MS + i
        before = read_state(fresh_redis, "fuzz")
        if previous is not None and previous[1] != APPLIED:  # nothing else changed the store
            assert (before.boundaries, before.leases) == (
                previous[0].boundaries, previous[0].leases
            ), f"case {i - 1} was {previous[1]} yet changed the store"  # fmt: skip
        seen = _recorded(fresh_redis)
        want = _expected(before, seen, d, now)
        out = apply_decision(store, d, now_ms=now, lease_ttl_ms=30_000)
        assert (out.outcome, out.reason) == want, (i, d, before.boundaries)
        # the hash keeps the first outcome of an id; a duplicate leaves it as it was
        assert _recorded(fresh_redis).get(d.id) == (seen[d.id] if want[0] == DUPLICATE
                                                    else want[0]), (i, d)  # fmt: skip
        if i % 25 == 0:
            check_invariants(fresh_redis, "fuzz", now)  # raw keys: ring covered, leases sane
        previous = (before, out.outcome)
        outcomes[out.outcome] += 1
    check_invariants(fresh_redis, "fuzz", NOW_MS + ORACLE_CASES)
    # every kind of ending happened, so the sample really exercised the applier's branches
    assert {APPLIED, REJECTED, DUPLICATE, ALREADY_SATISFIED} <= set(outcomes), outcomes
    assert not fresh_redis.exists("fuzz:ns:ghost/ns")
