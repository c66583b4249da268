"""Topic lookups and lease renewals against a real embedded Redis, on this machine.

Builds 1,000 namespaces of 100 bundles (100,000 bundles), 1,000 brokers owning 100 bundles each,
then measures, in one process: single lookups (one client, sequential), pipelined batch lookups,
the same through ``controller.lookup_cache.LookupCache`` (cold: every lease read once; warm:
answered from memory), warm cached lookups while another process renews leases at
``--renew-rate`` leases/s (every renewal is an invalidation the cache's tracking thread re-reads),
lease renewals with ``renew_all`` (one call per broker), and as a baseline a plain redis-py
``GET`` loop and a pipelined ``GET`` loop, so the lookup rate can be read as a ratio to what the
client and server do for the simplest command. Prints a table and a JSON line.

    python benchmarks/bench_lookup.py [--namespaces 1000] [--bundles-per-namespace 100]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import statistics
import tempfile
import time
from pathlib import Path

import redis

from controller.lookup_cache import LookupCache
from infra.embedded import EmbeddedRedis
from metadata_store.ownership_redis import RedisStore

TTL = 30_000


def _pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def _renew_paced(url: str, owned: dict[str, dict[str, int]], rate: int, seconds: float) -> None:
    """Child process: renew leases broker by broker at about ``rate`` leases/s, from now_ms=2."""
    store = RedisStore(redis.Redis.from_url(url), prefix="bench")
    t0 = time.perf_counter()
    done = 0
    while time.perf_counter() - t0 < seconds:
        for b, leases in owned.items():
            store.renew_all(b, leases, now_ms=2, ttl_ms=10**12)
            done += len(leases)
            ahead = done / rate - (time.perf_counter() - t0)
            if ahead > 0:
                time.sleep(ahead)
            if time.perf_counter() - t0 >= seconds:
                return


def _timed_singles(lookup, topics: list[str], reps: int = 1) -> tuple[float, list[float], float]:
    """Sequential lookups: (lookups/s, per-lookup latencies in ms, lookups per CPU second).

    The CPU-second rate (``process_time``, all threads of this process, so the cache's
    tracking thread counts too) is what a machine shared with other work still tells.
    """
    lat = []
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(reps):
        for t in topics:
            s = time.perf_counter()
            lookup(t, now_ms=1)
            lat.append((time.perf_counter() - s) * 1000)
    cpu = time.process_time() - c0
    return len(lat) / (time.perf_counter() - t0), lat, len(lat) / max(cpu, 1e-9)


def _timed_batches(
    lookup_many, topics: list[str], size: int, cpu_lat: list[float] | None = None
) -> tuple[float, list[float], float]:
    """Batches of ``size``: (lookups/s, per-batch latencies in ms, lookups per CPU second).

    With ``cpu_lat``, each batch's CPU time on this thread (ms) is appended to it too: the
    difference from the wall-clock latency is time spent waiting for a core.
    """
    blat = []
    c0, t0 = time.process_time(), time.perf_counter()
    for k in range(0, len(topics), size):
        s, sc = time.perf_counter(), time.thread_time()
        lookup_many(topics[k : k + size], now_ms=1)
        blat.append((time.perf_counter() - s) * 1000)
        if cpu_lat is not None:
            cpu_lat.append((time.thread_time() - sc) * 1000)
    cpu = time.process_time() - c0
    return len(topics) / (time.perf_counter() - t0), blat, len(topics) / max(cpu, 1e-9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--namespaces", type=int, default=1000)
    ap.add_argument("--bundles-per-namespace", type=int, default=100)
    ap.add_argument("--lookups", type=int, default=20000)
    ap.add_argument("--cached-reps", type=int, default=5, help="passes over the topics, warm")
    ap.add_argument("--renew-rate", type=int, default=10_000, help="leases/s during lookups")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(Path(tmp)) as server:
        client = redis.Redis.from_url(server.url)
        store = RedisStore(client, prefix="bench")
        rng = random.Random(1)
        n_brokers = max(1, args.namespaces * args.bundles_per_namespace // 100)
        brokers = [f"broker-{i:04d}" for i in range(n_brokers)]
        t0 = time.perf_counter()
        for b in brokers:
            store.register_broker(b, now_ms=0, ttl_ms=10**12)
        owned: dict[str, dict[str, int]] = {b: {} for b in brokers}
        i = 0
        for n in range(args.namespaces):
            ns = f"tenant/ns{n:04d}"
            store.create_namespace(ns, args.bundles_per_namespace)
            for bundle in store.get_namespace(ns).bundle_names:
                broker = brokers[i % n_brokers]
                owned[broker][bundle] = store.acquire(bundle, broker, 0, 10**12).token
                i += 1
        setup_s = time.perf_counter() - t0
        topics = [
            f"persistent://tenant/ns{rng.randrange(args.namespaces):04d}/topic-{k}"
            for k in range(args.lookups)
        ]
        store.lookup_many(topics[:100], now_ms=1)  # warm the boundary cache

        lat = []
        t0 = time.perf_counter()
        for t in topics:
            s = time.perf_counter()
            store.lookup(t, now_ms=1)
            lat.append((time.perf_counter() - s) * 1000)
        single_s = time.perf_counter() - t0

        batch = {}
        for size in (100, 1000):
            t0 = time.perf_counter()
            blat = []
            for k in range(0, len(topics), size):
                s = time.perf_counter()
                store.lookup_many(topics[k : k + size], now_ms=1)
                blat.append((time.perf_counter() - s) * 1000 / size)
            batch[size] = (len(topics) / (time.perf_counter() - t0), _pct(blat, 0.99))

        cached = _bench_cached(store, topics, args.cached_reps)
        cached.update(_bench_cached_under_renewals(store, server.url, topics, owned, args))

        client.set("bench:plain", b"x")
        t0 = time.perf_counter()
        for _ in range(len(topics)):
            client.get("bench:plain")
        get_rate = len(topics) / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(0, len(topics), 1000):
            pipe = client.pipeline(transaction=False)
            for _ in range(1000):
                pipe.get("bench:plain")
            pipe.execute()
        pget_rate = len(topics) / (time.perf_counter() - t0)

        t0 = time.perf_counter()
        renewed = 0
        for b in brokers:
            renewed += sum(store.renew_all(b, owned[b], now_ms=2, ttl_ms=TTL).values())
        renew_s = time.perf_counter() - t0

    single_rate = len(topics) / single_s
    result = {
        "bundles": args.namespaces * args.bundles_per_namespace,
        "brokers": n_brokers,
        "setup_s": round(setup_s, 1),
        "single_lookups_per_s": round(single_rate),
        "single_p50_ms": round(statistics.median(lat), 3),
        "single_p99_ms": round(_pct(lat, 0.99), 3),
        "batch100_lookups_per_s": round(batch[100][0]),
        "batch100_p99_ms_per_lookup": round(batch[100][1], 4),
        "batch1000_lookups_per_s": round(batch[1000][0]),
        "batch1000_p99_ms_per_lookup": round(batch[1000][1], 4),
        **cached,
        "plain_get_per_s": round(get_rate),
        "pipelined_get_per_s": round(pget_rate),
        "single_lookup_vs_get": round(single_rate / get_rate, 2),
        "batch1000_vs_pipelined_get": round(batch[1000][0] / pget_rate, 2),
        "cached_single_vs_get": round(cached["cached_single_lookups_per_s"] / get_rate, 1),
        "lease_renewals_per_s": round(renewed / renew_s),
        "renewed": renewed,
    }
    for k, v in result.items():
        print(f"{k:32s} {v}")
    print(json.dumps(result))


def _bench_cached(store: RedisStore, topics: list[str], reps: int) -> dict[str, float]:
    """LookupCache: one cold pass (fills), then warm single and batch passes from memory."""
    out: dict[str, float] = {}
    with LookupCache(store) as cache:
        rate, _, _ = _timed_singles(cache.lookup, topics)
        out["cached_cold_lookups_per_s"] = round(rate)
        out["cached_cold_misses"] = cache.stats.misses
        rate, lat, per_cpu = _timed_singles(cache.lookup, topics, reps)
        out["cached_single_lookups_per_s"] = round(rate)
        out["cached_single_lookups_per_cpu_s"] = round(per_cpu)
        out["cached_single_p50_ms"] = round(statistics.median(lat), 4)
        out["cached_single_p99_ms"] = round(_pct(lat, 0.99), 4)
        for size in (100, 1000):
            cpu_lat: list[float] = []
            rate, blat, per_cpu = _timed_batches(cache.lookup_many, topics * reps, size, cpu_lat)
            out[f"cached_batch{size}_lookups_per_s"] = round(rate)
            out[f"cached_batch{size}_lookups_per_cpu_s"] = round(per_cpu)
            out[f"cached_batch{size}_p50_ms_per_batch"] = round(statistics.median(blat), 3)
            out[f"cached_batch{size}_p99_ms_per_batch"] = round(_pct(blat, 0.99), 3)
            out[f"cached_batch{size}_p99_cpu_ms_per_batch"] = round(_pct(cpu_lat, 0.99), 3)
        out["cached_warm_misses"] = cache.stats.misses - out["cached_cold_misses"]
        out["cached_fallbacks"] = cache.stats.fallbacks
    return out


def _bench_cached_under_renewals(
    store: RedisStore, url: str, topics: list[str], owned: dict[str, dict[str, int]], args
) -> dict[str, float]:
    """Warm cached single lookups while another process renews leases at --renew-rate/s."""
    with LookupCache(store) as cache:
        cache.lookup_many(topics, now_ms=1)  # warm
        before = (cache.stats.misses, cache.stats.fallbacks, cache.stats.invalidated_keys)
        refreshed = cache.stats.refreshed
        proc = multiprocessing.get_context("fork").Process(
            target=_renew_paced, args=(url, owned, args.renew_rate, 3.0)
        )
        proc.start()
        time.sleep(0.3)  # let the renewals get going
        lat = []
        t0 = time.perf_counter()
        while proc.is_alive() and time.perf_counter() - t0 < 2.5:
            _rate, chunk, _ = _timed_singles(cache.lookup, topics[:2000])
            lat.extend(chunk)
        elapsed = time.perf_counter() - t0
        proc.join()
        return {
            "renewing_cached_single_lookups_per_s": round(len(lat) / elapsed),
            "renewing_cached_single_p99_ms": round(_pct(lat, 0.99), 4),
            "renewing_invalidations_per_s": round(
                (cache.stats.invalidated_keys - before[2]) / elapsed
            ),
            "renewing_refreshed_per_s": round((cache.stats.refreshed - refreshed) / elapsed),
            "renewing_misses": cache.stats.misses - before[0],
            "renewing_fallbacks": cache.stats.fallbacks - before[1],
        }


if __name__ == "__main__":
    main()
