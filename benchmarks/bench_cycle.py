"""Decision speed: one policy cycle over N bundles on M brokers (default 100,000 on 20).

AutoMQ reports about 200 ms to decide over 100k partitions on 20 brokers; this script times the
same shape of problem for our pure core, per shedder (``docs/benchmarks.md`` runs it at 10k,
100k and 1M bundles on 400 brokers):

* **ingest**: folding the brokers' reports (all their bundles in ``lastStats``) into the
  ``LoadState`` with ``loadbalance.view.ingest_many`` (the part the Spark job does per key; it
  also works out each report's digest, which ``build_view`` and the split scan read);
* **build_view**: assembling the ``ClusterView`` for one cycle;
* **step**: ``loadbalance.cycle.step`` = split + shedding + placement of the shed bundles (merge
  off, as by default).

Every figure is wall time from ``time.perf_counter`` loops (no pytest), several repetitions,
reported as median and p90 in milliseconds, with the median process CPU time
(``time.process_time``) beside it for machines whose cores are shared. The cluster is
synthetic and seeded: Zipf-skewed bundle rates, a few bundles over the split threshold, and
broker usage spread from ~35 % to ~95 % so every shedder has work to do. Stateful shedders
(TransferShedder's hit count) are primed with warm-up cycles first; each timed repetition
restarts from that primed state.

Run: ``.venv/bin/python benchmarks/bench_cycle.py [--bundles 100000] [--brokers 20] [--reps 7]``
(``--usage stream`` draws the brokers as ``bench_stream.py`` does, so the default pair moves
thousands of bundles a cycle: ~16k at 1M bundles on 400 brokers)
(add ``--profile SHEDDER`` to print a ``cProfile`` of one cycle of that shedder's pair).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadbalance.bundles import NamespaceBundles
from loadbalance.config import LoadBalancerConfig
from loadbalance.cycle import CycleState, ingest_kwargs, step
from loadbalance.model import LocalBrokerData, NamespaceBundleStats, ResourceUsage
from loadbalance.view import LoadState, build_view, ingest_many

MINUTE_MS = 60_000
_IMPL = "org.apache.pulsar.broker.loadbalance.impl."
SHEDDERS = {
    "ThresholdShedder": (_IMPL + "ThresholdShedder", _IMPL + "LeastLongTermMessageRate"),
    "UniformLoadShedder": (_IMPL + "UniformLoadShedder", _IMPL + "LeastLongTermMessageRate"),
    "OverloadShedder": (_IMPL + "OverloadShedder", _IMPL + "LeastLongTermMessageRate"),
    "TransferShedder": (
        "org.apache.pulsar.broker.loadbalance.extensions.scheduler.TransferShedder",
        _IMPL + "LeastResourceUsageWithWeight",
    ),
    "ProjectedUsageShedder": ("ProjectedUsageShedder", "LeastProjectedUsage"),
}


BUNDLES_PER_NAMESPACE = 100


def namespaces_for(n_bundles: int) -> dict[str, NamespaceBundles]:
    """Namespaces of 100 bundles each: under ``loadBalancerNamespaceMaximumBundles`` (128), so
    hot bundles may split, as in a real cluster that big (Pulsar caps bundles per namespace)."""
    n_ns = max(1, n_bundles // BUNDLES_PER_NAMESPACE)
    return {
        f"bench/ns-{i}": NamespaceBundles.initial(f"bench/ns-{i}", BUNDLES_PER_NAMESPACE)
        for i in range(n_ns)
    }


def synthetic_reports(
    n_bundles: int, n_brokers: int, seed: int, now_ms: int, usage: str = "spread"
) -> dict[str, LocalBrokerData]:
    """The brokers' reports over ``n_bundles`` bundles, 100 per namespace (seeded).

    ``usage="spread"``: Zipf-skewed rates, usage spread evenly from ~35 % to ~95 %.
    ``usage="stream"``: what ``bench_stream.py``'s reports look like (``stream_reports``)."""
    if usage == "stream":
        return stream_reports(n_bundles, n_brokers, seed, now_ms)
    rng = random.Random(seed)
    names = [b for ns in namespaces_for(n_bundles).values() for b in ns.bundle_names]
    brokers = [f"broker-{i:02d}" for i in range(n_brokers)]
    owned: dict[str, list[str]] = {b: [] for b in brokers}
    for i, name in enumerate(names):
        owned[brokers[i % n_brokers]].append(name)
    out: dict[str, LocalBrokerData] = {}
    for k, broker in enumerate(brokers):
        stats: dict[str, NamespaceBundleStats] = {}
        for j, name in enumerate(owned[broker]):
            rate = 20.0 / (1 + (j % 97)) ** 0.7 * rng.uniform(0.5, 1.5)
            if j < 2 and k < 3:
                rate = 20_000.0
            stats[name] = NamespaceBundleStats(
                msg_rate_in=rate,
                msg_rate_out=rate,
                msg_throughput_in=rate * 1024,
                msg_throughput_out=rate * 1024,
                topics=3,
                consumer_count=1,
                producer_count=1,
            )
        usage_pct = 35.0 + 60.0 * k / max(n_brokers - 1, 1)
        ri = sum(s.msg_rate_in for s in stats.values())
        out[broker] = LocalBrokerData(
            broker=broker,
            cpu=ResourceUsage(usage_pct * 8, 800.0),
            memory=ResourceUsage(2048.0, 8192.0),
            bandwidth_in=ResourceUsage(ri, 1_250_000.0),
            bandwidth_out=ResourceUsage(ri, 1_250_000.0),
            msg_rate_in=ri,
            msg_rate_out=ri,
            msg_throughput_in=ri * 1024,
            msg_throughput_out=ri * 1024,
            num_topics=3 * len(stats),
            num_bundles=len(stats),
            bundles=frozenset(stats),
            last_stats=stats,
            last_update_ms=now_ms,
        )
    return out


def stream_reports(
    n_bundles: int, n_brokers: int, seed: int, now_ms: int
) -> dict[str, LocalBrokerData]:
    """Reports drawn as ``bench_stream.py``'s brokers draw them (each bundle 1-200 msg/s of
    1,000 bytes, each broker's CPU 20-90 %): the default pair (ThresholdShedder +
    LeastLongTermMessageRate) then sheds and places thousands of bundles per cycle at a million
    bundles, as the live job does. The same reports as ``bench_driver_view.py --stream-shape``."""
    from benchmarks.bench_driver_view import stream_shaped_reports

    return stream_shaped_reports(n_bundles, n_brokers, seed, now_ms)


class _Samples(list[float]):
    """Wall-clock samples (ms), with the process CPU time of each beside them (``cpu``)."""

    def __init__(self) -> None:
        super().__init__()
        self.cpu: list[float] = []


def _timed(fn: Callable[[], Any], reps: int) -> tuple[_Samples, Any]:
    samples, result = _Samples(), None
    for _ in range(reps):
        c0, t0 = time.process_time(), time.perf_counter()
        result = fn()
        samples.append((time.perf_counter() - t0) * 1000.0)
        samples.cpu.append((time.process_time() - c0) * 1000.0)
    return samples, result


def _summary(samples: _Samples) -> dict[str, float]:
    """Median and p90 of the wall time, and the median CPU time: on cores shared with other
    work the wall time includes waiting for a core, the CPU time does not."""
    s = sorted(samples)
    return {
        "median_ms": round(statistics.median(s), 1),
        "p90_ms": round(s[min(len(s) - 1, round(0.9 * (len(s) - 1)))], 1),
        "cpu_median_ms": round(statistics.median(samples.cpu), 1),
    }


def run(
    n_bundles: int, n_brokers: int, reps: int, shedders: list[str], usage: str = "spread"
) -> dict[str, Any]:
    now = 10 * MINUTE_MS
    reports = synthetic_reports(n_bundles, n_brokers, 1, now, usage)
    base = LoadBalancerConfig()
    kw = ingest_kwargs(base)

    def fold(state: LoadState) -> LoadState:
        ordered = [reports[name] for name in sorted(reports)]
        return ingest_many(state, ordered, received_at_ms=now, **kw)

    primed = fold(LoadState())
    ingest_ms, state = _timed(lambda: fold(primed), reps)
    namespaces = namespaces_for(n_bundles)
    view_ms, view = _timed(lambda: build_view(state, namespaces=namespaces), reps)
    out: dict[str, Any] = {
        "bundles": sum(len(r.bundles) for r in reports.values()),
        "brokers": n_brokers,
        "reps": reps,
        "ingest": _summary(ingest_ms),
        "build_view": _summary(view_ms),
        "step": {},
    }
    for name in shedders:
        shedder, placement = SHEDDERS[name]
        config = LoadBalancerConfig(
            loadBalancerLoadSheddingStrategy=shedder,
            loadBalancerLoadPlacementStrategy=placement,
        )
        cstate, t = CycleState(), now
        for i in range(config.load_balancer_shedding_condition_hit_count_threshold):
            cstate, _ = step(cstate, view, config, now_ms=t, cycle=f"warm-{i}")
            cstate = CycleState(shedder_state=cstate.shedder_state)
            t += MINUTE_MS
        pre, at = cstate, t
        samples, (_, result) = _timed(
            lambda pre=pre, at=at, config=config: step(pre, view, config, now_ms=at, cycle="b"),
            reps,
        )
        kinds: dict[str, int] = {}
        for d in result.decisions:
            kinds[d.kind] = kinds.get(d.kind, 0) + 1
        out["step"][name] = {**_summary(samples), "decisions": kinds}
    return out


def profile(
    n_bundles: int, n_brokers: int, shedder: str, top: int = 30, usage: str = "spread"
) -> None:
    """Print a ``cProfile`` of one cycle (``build_view`` + ``step``) of this shedder's pair,
    the functions sorted by their own time; the reports are folded first, outside it."""
    import cProfile
    import pstats

    now = 10 * MINUTE_MS
    reports = synthetic_reports(n_bundles, n_brokers, 1, now, usage)
    config = LoadBalancerConfig(
        loadBalancerLoadSheddingStrategy=SHEDDERS[shedder][0],
        loadBalancerLoadPlacementStrategy=SHEDDERS[shedder][1],
    )
    ordered = [reports[name] for name in sorted(reports)]
    state = ingest_many(LoadState(), ordered, received_at_ms=now, **ingest_kwargs(config))
    namespaces = namespaces_for(n_bundles)
    prof = cProfile.Profile()
    prof.enable()
    view = build_view(state, namespaces=namespaces)
    step(CycleState(), view, config, now_ms=now, cycle="p")
    prof.disable()
    pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(top)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundles", type=int, default=100_000)
    p.add_argument("--brokers", type=int, default=20)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--shedders", default=",".join(SHEDDERS))
    p.add_argument(
        "--profile", default=None, help="print a cProfile of one cycle of this shedder's pair"
    )
    p.add_argument(
        "--usage",
        choices=("spread", "stream"),
        default="spread",
        help="spread: usage 35-95 %% evenly; stream: random per broker as bench_stream.py",
    )
    args = p.parse_args(argv)
    if args.profile:
        profile(args.bundles, args.brokers, args.profile, usage=args.usage)
        return 0
    res = run(args.bundles, args.brokers, args.reps, args.shedders.split(","), args.usage)
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
