"""Topic lookups and lease renewals against a real embedded Redis, on this machine.

Builds 1,000 namespaces of 100 bundles (100,000 bundles), 1,000 brokers owning 100 bundles each,
then measures, in one process: single lookups (one client, sequential), pipelined batch lookups,
lease renewals with ``renew_all`` (one call per broker), and as a baseline a plain redis-py
``GET`` loop and a pipelined ``GET`` loop, so the lookup rate can be read as a ratio to what the
client and server do for the simplest command. Prints a table and a JSON line.

    python benchmarks/bench_lookup.py [--namespaces 1000] [--bundles-per-namespace 100]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import redis

from controller.redis_store import RedisStore
from infra.embedded import EmbeddedRedis

TTL = 30_000


def _pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--namespaces", type=int, default=1000)
    ap.add_argument("--bundles-per-namespace", type=int, default=100)
    ap.add_argument("--lookups", type=int, default=20000)
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
        "plain_get_per_s": round(get_rate),
        "pipelined_get_per_s": round(pget_rate),
        "single_lookup_vs_get": round(single_rate / get_rate, 2),
        "batch1000_vs_pipelined_get": round(batch[1000][0] / pget_rate, 2),
        "lease_renewals_per_s": round(renewed / renew_s),
        "renewed": renewed,
    }
    for k, v in result.items():
        print(f"{k:32s} {v}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
