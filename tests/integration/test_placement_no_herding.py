"""Placement never herds: every assignment counts before the next one decides.

Through the live path against real Redis: topic lookups (``lookup_assign_event``), from several
OS processes at once, and ``lbctl namespaces unload`` followed by lookups while the previous
owners' reports still list the bundles. One broker is clearly the least loaded, so a placement
that does not see the assignments made just before it sends every bundle there.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import time
import zlib
from collections import Counter

import pytest
import redis

from controller.admin_verbs import unload
from controller.placement import load_view, lookup_assign_event, put_load_snapshot
from loadbalance.bundles import NamespaceBundles, normalize_topic
from loadbalance.config import LoadBalancerConfig
from loadbalance.model import LocalBrokerData, ResourceUsage
from loadbalance.report_codec import report_to_dict
from loadbalance.time_average import (
    NUM_LONG_SAMPLES,
    NUM_SHORT_SAMPLES,
    BundleData,
    TimeAverageMessageData,
)
from metadata_store.ownership_redis import RedisStore
from metadata_store.placement_state import PlacementChanged, PlacementRead

NS = "public/app-1"
BASE_NS = "public/base"
BUNDLES = 16
PREFIX = "herd"
TTL_MS = 10**9
BROKERS = ("broker-00", "broker-01", "broker-02", "broker-03", "broker-04", "broker-05")
IDLE = "broker-00"  # the least loaded: where a herd goes


def _now() -> int:
    return int(time.time() * 1000)


def _topics(nb: NamespaceBundles) -> dict[str, str]:
    """bundle -> one topic of this namespace that hashes into it."""
    out: dict[str, str] = {}
    i = 0
    while len(out) < len(nb):
        topic = f"persistent://{NS}/t{i}"
        h = zlib.crc32(normalize_topic(topic).encode("utf-8"))
        out.setdefault(nb.bundle_names[nb.find_index(h)], topic)
        i += 1
    return out


def _data(rate: float) -> BundleData:
    def avg(n: int) -> TimeAverageMessageData:
        return TimeAverageMessageData(n, n, rate * 1000, rate * 1000, rate, rate)

    return BundleData(avg(NUM_SHORT_SAMPLES), avg(NUM_LONG_SAMPLES), 4)


def _setup(client: redis.Redis, reported: dict[str, list[str]]) -> tuple[RedisStore, dict]:
    """Six live brokers, the namespace, and a snapshot: IDLE carries nothing, the others some
    load, each reporting the bundles of ``reported``."""
    store = RedisStore(client, PREFIX, clock="server")
    store.create_namespace(NS, BUNDLES)
    now = _now()
    for b in BROKERS:
        store.register_broker(b, now_ms=now, ttl_ms=TTL_MS)
    # the loaded brokers each serve a bundle of another namespace with real traffic
    base = NamespaceBundles.initial(BASE_NS, len(BROKERS)).bundle_names
    data = {name: _data(1000.0) for name in base}
    docs = {}
    for i, b in enumerate(BROKERS):
        own = set(reported.get(b, ())) | ({base[i]} if b != IDLE else set())
        rate = 0.0 if b == IDLE else 2000.0
        r = LocalBrokerData(
            broker=b,
            cpu=ResourceUsage(5 if b == IDLE else 30, 100),
            msg_rate_in=rate,
            msg_throughput_in=rate * 1000,
            bundles=frozenset(own),
        )
        docs[b] = {"report": report_to_dict(r), "updatedAtMs": now}
    nb = store.get_namespace(NS)
    assert nb is not None
    data.update({name: _data(100.0) for name in nb.bundle_names})
    put_load_snapshot(store, docs, data)
    return store, _topics(nb)


def _owners(store: RedisStore) -> Counter[str]:
    leases = store.owners(NS, _now())
    assert len(leases) == BUNDLES, "every bundle was placed"
    return Counter(lease.broker for lease in leases.values())


def _assert_spread(counts: Counter[str]) -> None:
    """As Pulsar's placement spreads a namespace when each assignment sees the ones before it
    (``loadBalancerDistributeBundlesEvenlyEnabled``): every broker gets some, none more than
    its share rounded up, no two brokers more than one bundle apart."""
    assert len(counts) == len(BROKERS), counts
    assert max(counts.values()) <= math.ceil(BUNDLES / len(BROKERS)), counts
    assert max(counts.values()) - min(counts.values()) <= 1, counts


def _lookup_worker(url: str, topics: list[str], start: object, out: object) -> None:
    """One process: wait for the others, then look its topics up one after the other."""
    store = RedisStore(redis.Redis.from_url(url), PREFIX, clock="server")
    cfg = LoadBalancerConfig()
    start.wait()  # type: ignore[attr-defined]
    for topic in topics:
        bundle, lease, _ = lookup_assign_event(store, topic, cfg, _now())
        out.put((bundle, lease.broker if lease else None))  # type: ignore[attr-defined]


def test_a_burst_of_lookups_from_several_processes_spreads_the_namespace(
    fresh_redis: redis.Redis, redis_url: str
) -> None:
    store, topics = _setup(fresh_redis, {})
    workers = 8
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(workers)
    out = ctx.Queue()
    names = sorted(topics)
    procs = [
        ctx.Process(
            target=_lookup_worker,
            args=(redis_url, [topics[b] for b in names[i::workers]], start, out),
        )
        for i in range(workers)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    answers = dict(out.get(timeout=5) for _ in range(BUNDLES))
    counts = _owners(store)
    assert answers == {b: lease.broker for b, lease in store.owners(NS, _now()).items()}
    _assert_spread(counts)


def test_unloading_a_namespace_whose_owners_still_report_it_spreads_it_again(
    fresh_redis: redis.Redis,
) -> None:
    # 16 bundles on five loaded brokers (3-4 each), as their reports say; IDLE serves none
    nb = NamespaceBundles.initial(NS, BUNDLES)
    holders = BROKERS[1:]
    reported = {b: nb.bundle_names[i :: len(holders)] for i, b in enumerate(holders)}
    store, topics = _setup(fresh_redis, reported)
    for b, names in reported.items():
        for name in names:
            store.acquire(name, b, _now(), TTL_MS)

    cfg = LoadBalancerConfig()
    args = argparse.Namespace(
        namespace=NS, bundle=None, destination_broker=None, bootstrap_servers=None, no_events=True
    )
    rows = unload(store, args, cfg)
    assert {r["outcome"] for r in rows} == {"applied"}
    assert store.owners(NS, _now()) == {}

    # the reports are unchanged: every previous owner still lists its bundles
    for name in sorted(topics):
        _, lease, event = lookup_assign_event(store, topics[name], cfg, _now())
        assert lease is not None and event is not None
    counts = _owners(store)
    _assert_spread(counts)


def test_a_placement_overtaken_by_another_counts_it_and_chooses_again(
    fresh_redis: redis.Redis,
) -> None:
    """Deterministic form of the burst: another process records a placement between this
    one's read of the preallocations and its lease; this one must not record its choice made
    on the old read (both would take IDLE), but read again and count the other's."""
    store, topics = _setup(fresh_redis, {})
    other = RedisStore(fresh_redis, PREFIX, clock="server")
    cfg = LoadBalancerConfig()
    first, second = sorted(topics)[:2]
    real_read = store.preallocations.read
    reads: list[int] = []

    def read_then_overtaken(brokers: list[str]) -> PlacementRead:
        got = real_read(brokers)
        reads.append(got.version)
        if len(reads) == 1:
            _, lease, _ = lookup_assign_event(other, topics[second], cfg, _now())
            assert lease is not None and lease.broker == IDLE
        return got

    store.preallocations.read = read_then_overtaken  # type: ignore[method-assign]
    _, lease, event = lookup_assign_event(store, topics[first], cfg, _now())
    assert lease is not None and event is not None
    assert reads == [0, 1], "the first choice was refused and the placement read again"
    assert lease.broker != IDLE, "the second read counted the other placement"
    assert set(store.preallocations.of(lease.broker)) == {first}
    assert set(store.preallocations.of(IDLE)) == {second}


def test_a_stale_placement_version_takes_no_lease_and_records_nothing(
    fresh_redis: redis.Redis,
) -> None:
    store, topics = _setup(fresh_redis, {})
    a, b = sorted(topics)[:2]
    doc = {"shortTerm": {}, "longTerm": {}, "topics": 1}
    version = store.preallocations.version()
    store.acquire_placed(a, IDLE, _now(), TTL_MS, placement_version=version, preallocation=doc)
    assert store.preallocations.version() == version + 1
    with pytest.raises(PlacementChanged):
        store.acquire_placed(
            b, "broker-01", _now(), TTL_MS, placement_version=version, preallocation=doc
        )
    assert store.owner(b, _now()) is None
    assert store.preallocations.of("broker-01") == {}
    assert store.preallocations.of(IDLE) == {a: doc}


def test_a_preallocation_outlives_another_brokers_stale_report_and_ends_with_its_lease(
    fresh_redis: redis.Redis,
) -> None:
    """After an unload the previous owner's report still lists the bundle: that must not end
    the new owner's preallocation (it did, and every lookup then saw the same idle broker);
    a release before the new owner reported it must."""
    nb = NamespaceBundles.initial(NS, BUNDLES)
    x = nb.bundle_names[0]
    store, topics = _setup(fresh_redis, {"broker-01": [x]})
    cfg = LoadBalancerConfig()
    _, lease, _ = lookup_assign_event(store, topics[x], cfg, _now())
    assert lease is not None and lease.broker == IDLE
    view = load_view(store, cfg, _now(), NS)
    assert view is not None
    assert set(view.preallocated.get(IDLE, {})) == {x}
    assert x not in view.brokers["broker-01"].report.bundles, "not counted on its old owner"
    # placing a bundle of another namespace counts it through the stored preallocation alone
    view = load_view(store, cfg, _now(), BASE_NS)
    assert view is not None and set(view.preallocated.get(IDLE, {})) == {x}
    assert set(store.preallocations.of(IDLE)) == {x}
    assert store.release(x, IDLE, lease.token, _now())
    view = load_view(store, cfg, _now(), NS)
    assert view is not None and IDLE not in view.preallocated
    assert store.preallocations.of(IDLE) == {}
