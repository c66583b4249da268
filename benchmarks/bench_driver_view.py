"""The streaming job's policy cycle on its driver: the view built from shard blobs, then a step.

``bench_cycle.py`` times the pure core over a ``LoadState`` folded from reports, with report
digests. The streaming job's driver holds something else: the state step's shard blobs and the
brokers' report documents (``streaming.driver_view.DriverView``), and it builds each cycle's
view from those. This script builds that driver state from the same seeded synthetic cluster as
``bench_cycle.py`` (every bundle reported by one broker, 32 shards) and times, in CPU ms
(``time.process_time``; these cores are shared):

* **view, cold**: the first ``cluster_view`` (decode every blob, index every bundle, name every
  namespace's bundles);
* **view, warm**: the next one, nothing changed (a cycle after quiet batches);
* **step**: ``cycle.step`` over that view for the default pair (and the CPU of encoding its
  decisions, as the decision stage publishes them), then two consecutive cycles for each other
  pair of ``bench_cycle.SHEDDERS``, each timed (the digest covers the decisions of both).

``--stream-shape`` makes the brokers as ``bench_stream.py`` does (random CPU per broker), so
the default pair moves thousands of bundles per cycle, as in the streaming job's benchmark.

It prints a digest of each pair's decisions (SHA-256 of ``decision_to_dict``), so two versions
of the driver can be compared for the same decisions: run it from two checkouts (``--root``).

Run: ``.venv/bin/python benchmarks/bench_driver_view.py --bundles 1000000 --brokers 400``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundles", type=int, default=100_000)
    ap.add_argument("--brokers", type=int, default=40)
    ap.add_argument("--shards", type=int, default=32)
    ap.add_argument(
        "--root",
        type=Path,
        default=Path(__file__).resolve().parents[1],
        help="the checkout whose driver to time (default: this one)",
    )
    ap.add_argument(
        "--stream-shape",
        action="store_true",
        help="brokers as bench_stream.py makes them: each bundle 1-200 msg/s of 1,000 bytes, "
        "each broker's CPU drawn from 20-90 %% (ThresholdShedder then moves thousands of "
        "bundles per cycle)",
    )
    args = ap.parse_args(argv)
    sys.path.insert(0, str(args.root))

    import numpy as np

    import streaming.driver_view as driver_view
    from benchmarks.bench_cycle import SHEDDERS, namespaces_for, synthetic_reports
    from loadbalance.config import LoadBalancerConfig
    from loadbalance.cycle import CycleState, step
    from loadbalance.decisions import decision_to_dict, encode_decision
    from streaming.driver_view import DriverView
    from streaming.shard_state import ShardState, shard_of

    now = 600_000
    if args.stream_shape:
        reports = stream_shaped_reports(args.bundles, args.brokers, 1, now)
    else:
        reports = synthetic_reports(args.bundles, args.brokers, 1, now)
    per: dict[int, tuple[list, list, list, list]] = {}
    for broker in sorted(reports):
        for name, s in reports[broker].last_stats.items():
            e = per.setdefault(shard_of(name, args.shards), ([], [], [], []))
            e[0].append(name)
            e[1].append((s.msg_throughput_in, s.msg_throughput_out, s.msg_rate_in, s.msg_rate_out))
            e[2].append((s.topics, s.consumer_count, s.producer_count))
            e[3].append(broker)
    blobs = {}
    for k, (names, values, counts, owners) in per.items():
        state = ShardState()
        state.apply(names, np.array(values), np.array(counts, dtype=np.int64), owners,
                    np.full(len(names), now))  # fmt: skip
        blobs[f"s:{k}"] = state.to_bytes()
    docs = {}
    for broker, r in reports.items():
        doc = {
            key: {"usage": u.usage, "limit": u.limit}
            for key, u in (
                ("cpu", r.cpu),
                ("memory", r.memory),
                ("bandwidthIn", r.bandwidth_in),
                ("bandwidthOut", r.bandwidth_out),
            )
        }
        doc.update(msgThroughputIn=r.msg_throughput_in, msgThroughputOut=r.msg_throughput_out,
                   msgRateIn=r.msg_rate_in, msgRateOut=r.msg_rate_out, numTopics=r.num_topics,
                   numBundles=r.num_bundles, bundles=sorted(r.bundles), lastUpdate=now)  # fmt: skip
        entry = {"report": doc, "historyUsage": r.cpu.usage / r.cpu.limit,
                 "msgThroughputEma": r.msg_throughput_in, "updatedAtMs": now}  # fmt: skip
        docs[broker] = json.dumps(entry)
    view = DriverView.from_snapshot(docs, blobs)
    # the view's own pause; a checkout from before the view owned it (``--root``) has a function
    gc_paused = getattr(view, "gc_paused", None) or driver_view.gc_paused
    namespaces = namespaces_for(args.bundles)

    def digest(decisions: list) -> str:
        text = json.dumps([decision_to_dict(d) for d in decisions], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def cycle(config: LoadBalancerConfig, steps: int) -> tuple[float, list[float], list]:
        with gc_paused():
            t0 = time.process_time()
            cv = view.cluster_view(namespaces)
            t1 = time.process_time()
            view_ms = (t1 - t0) * 1000
            state, decisions, step_ms = CycleState(), [], []
            for i in range(steps):
                state, result = step(state, cv, config, now_ms=now + (i + 1) * 60_000,
                                     cycle=str(i + 1))  # fmt: skip
                decisions += result.decisions
                t2 = time.process_time()
                step_ms.append((t2 - t1) * 1000)
                t1 = t2
        return view_ms, step_ms, decisions

    print(f"{args.bundles:,} bundles on {args.brokers} brokers, {len(blobs)} shards; CPU ms")
    default = LoadBalancerConfig()
    view_ms, (step_ms,), decisions = cycle(default, 1)
    t0 = time.process_time()
    for d in decisions:
        encode_decision(d)
    encode_ms = (time.process_time() - t0) * 1000
    print(f"default pair: view cold {view_ms:,.0f}, step {step_ms:,.0f}, "
          f"{len(decisions)} decisions {digest(decisions)}, "
          f"encoding them {encode_ms:,.0f}")  # fmt: skip
    view_ms, (step_ms,), _ = cycle(default, 1)
    print(f"default pair: view warm {view_ms:,.0f}, step {step_ms:,.0f}")
    for name, (shedder, placement) in SHEDDERS.items():
        config = LoadBalancerConfig(
            loadBalancerLoadSheddingStrategy=shedder, loadBalancerLoadPlacementStrategy=placement
        )
        view_ms, steps_ms, decisions = cycle(config, 2)
        print(f"{name}: view warm {view_ms:,.0f}, "
              f"two steps {' + '.join(f'{ms:,.0f}' for ms in steps_ms)}, "
              f"{len(decisions)} decisions {digest(decisions)}")  # fmt: skip
    return 0


def stream_shaped_reports(n_bundles: int, n_brokers: int, seed: int, now_ms: int) -> dict:
    """Reports of ``bench_stream.py``'s brokers (``broker_report``, seeded), each broker owning a
    block of the bundles; loaded from this script's folder, so ``--root`` can be an older
    checkout."""
    import dataclasses
    import importlib.util
    import random

    from benchmarks.bench_cycle import namespaces_for

    spec = importlib.util.spec_from_file_location(
        "_bench_stream", Path(__file__).with_name("bench_stream.py")
    )
    assert spec is not None and spec.loader is not None
    bench_stream = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_stream)
    rng = random.Random(seed)
    names = [b for ns in namespaces_for(n_bundles).values() for b in ns.bundle_names]
    per = -(-len(names) // n_brokers)
    out = {}
    for k in range(n_brokers):
        report = bench_stream.broker_report(rng, f"broker-{k:03d}", names[k * per : (k + 1) * per])
        out[report.broker] = dataclasses.replace(
            report, num_topics=3 * report.num_bundles, last_update_ms=now_ms
        )
    return out


if __name__ == "__main__":
    sys.exit(main())
