"""Check that this checkout's streaming job continues a checkpoint written by another version.

The state step reads one store layout (``streaming/shard_store.py``); a new version either
carries on over an older one's checkpoint with the same averages, or refuses it with one line
when the older one stored another layout (docs/deploy.md, "Upgrading a checkpoint"). This tells
which, running the real pipeline on embedded Apache Kafka, Redis and Spark ``local[2]``:

1. the older version (``--old``, a git revision, checked out in a temporary worktree) reads
   the first half of a generated report stream in small batches, so its shards hold a whole
   record and several deltas;
2. this checkout continues over the same checkpoint with the second half;
3. this checkout reads the whole stream into a new checkpoint (the reference);

and compares every shard record in the two load snapshots, byte for byte. Exit status 0 when
they are equal, 3 when this checkout refused the older checkpoint (upgrade with a new one), 1
when the records differ, 2 when a run did not finish. It takes a few minutes; it is a tool for
a change of the state layout, not part of the test suite.

Run: ``.venv/bin/python scripts/check_checkpoint_upgrade.py --old <revision>``
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BROKERS, BUNDLES_PER_BROKER, T0_MS = 4, 64, 1_700_000_000_000


def reports(rng: random.Random, first: int, count: int) -> list[tuple[bytes, bytes, int]]:
    """``count`` rounds of one report per broker, each with about 40 % of its bundles."""
    from loadbalance.bundles import NamespaceBundles
    from loadbalance.model import LocalBrokerData, NamespaceBundleStats, ResourceUsage
    from loadbalance.report_codec import encode_report

    names = NamespaceBundles.initial("upgrade/ns", BROKERS * BUNDLES_PER_BROKER).bundle_names
    out = []
    for i in range(first, first + count):
        for b in range(BROKERS):
            own = names[b * BUNDLES_PER_BROKER : (b + 1) * BUNDLES_PER_BROKER]
            picked = [n for n in own if rng.random() < 0.4] or own[:1]
            stats = {
                n: NamespaceBundleStats(
                    rng.uniform(1, 100), 1.0, rng.uniform(1e3, 1e5), 2.0, 3, 1, 1
                )
                for n in picked
            }
            report = LocalBrokerData(
                broker=f"b{b}:8080",
                cpu=ResourceUsage(30.0, 100.0),
                memory=ResourceUsage(1.0, 4.0),
                bandwidth_in=ResourceUsage(1.0, 10.0),
                bandwidth_out=ResourceUsage(1.0, 10.0),
                msg_rate_in=1.0,
                msg_rate_out=1.0,
                msg_throughput_in=1.0,
                msg_throughput_out=1.0,
                num_bundles=len(stats),
                bundles=frozenset(stats),
                last_stats=stats,
            )
            out.append((report.broker.encode(), encode_report(report), T0_MS + i * 5000 + b))
    return out


def publish(bootstrap: str, topic: str, records: list[tuple[bytes, bytes, int]]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 4_000_000})
    for key, value, ts in records:
        producer.produce(topic, key=key, value=value, timestamp=ts)
    if producer.flush(30) != 0:
        raise RuntimeError(f"reports not delivered to {topic}")


def committed(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return len([p for p in commits.iterdir() if p.name.isdigit()]) if commits.is_dir() else 0


def run_job(
    root: Path, services: tuple[str, str], topic: str, prefix: str, checkpoint: Path, batches: int
) -> int:
    """Run ``root``'s job until ``batches`` batches are committed in ``checkpoint``, then stop
    it (SIGINT); return the batches committed."""
    bootstrap, redis_url = services
    log_path = checkpoint.parent / f"{checkpoint.name}-{root.name}.log"
    command = [
        sys.executable, "-m", "streaming.submit", "--bootstrap-servers", bootstrap,
        "--redis-url", redis_url, "--checkpoint", str(checkpoint), "--trigger-seconds", "0.5",
        "--max-offsets-per-trigger", str(BROKERS), "--shards", "4", "--source", "python",
        "--set", f"loadReportsTopic={topic}", "--set", f"redisKeyPrefix={prefix}",
        "--set", f"decisionsTopic={topic}-decisions", "--set", f"deadLettersTopic={topic}-dead",
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(root))
    with open(log_path, "w") as log:
        job = subprocess.Popen(command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and committed(checkpoint) < batches:
            if job.poll() is not None or refused(checkpoint, root):
                break  # a refused checkpoint is refused again at every restart
            time.sleep(1)
        time.sleep(3)
        job.send_signal(signal.SIGINT)
        try:
            job.wait(60)
        except subprocess.TimeoutExpired:
            job.kill()
    n = committed(checkpoint)
    print(f"  {root}: {n} batches committed in {checkpoint.name} (log {log_path})", flush=True)
    return n


def refused(checkpoint: Path, root: Path = ROOT) -> str | None:
    """The state step's one-line refusal of an older layout, if ``root``'s run over
    ``checkpoint`` logged it (``streaming.shard_store.OlderStateLayout``)."""
    log_path = checkpoint.parent / f"{checkpoint.name}-{root.name}.log"
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    for line in text.splitlines():
        if "OlderStateLayout" in line and "older layout" in line:
            return line[max(line.find("the checkpoint's state"), 0) :].strip()
    return None


def shard_records(redis_url: str, prefix: str) -> tuple[dict[str, bytes], list[str]]:
    """Every shard of the load snapshot, whole record and deltas merged; and the fields."""
    import redis

    from metadata_store.load_snapshot import LoadSnapshot, encode_bundle_shard

    client = redis.Redis.from_url(redis_url)
    try:
        data = LoadSnapshot(client, prefix).read()
    finally:
        client.close()
    return {k: encode_bundle_shard(v) for k, v in data.records.items()}, sorted(data.shards)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", required=True, help="git revision of the version that writes first")
    ap.add_argument("--rounds", type=int, default=8, help="report rounds per half (default 8)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder and worktree")
    args = ap.parse_args(argv)

    from infra.embedded import EmbeddedKafka, EmbeddedRedis
    from infra.topics import ensure_topics

    work = Path(tempfile.mkdtemp(prefix="lb-upgrade-"))
    old = work / "old"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old), args.old],
        check=True,
        capture_output=True,
    )
    try:
        with EmbeddedKafka(work) as kafka, EmbeddedRedis(work) as redis_server:
            services = (kafka.bootstrap_servers, redis_server.url)
            topic = "upgrade-reports"
            ensure_topics(services[0], {topic: 1, f"{topic}-decisions": 1, f"{topic}-dead": 1})
            rng = random.Random(5)
            first, second = reports(rng, 0, args.rounds), reports(rng, args.rounds, args.rounds)
            print(f"1. {args.old} reads the first {args.rounds} rounds", flush=True)
            publish(services[0], topic, first)
            done = run_job(old, services, topic, "upgraded", work / "upgraded", args.rounds)
            print(f"  snapshot fields it wrote: {shard_records(services[1], 'upgraded')[1]}")
            publish(services[0], topic, second)
            print("2. this checkout continues with the next rounds", flush=True)
            after = run_job(
                ROOT, services, topic, "upgraded", work / "upgraded", done + args.rounds
            )
            refusal = refused(work / "upgraded")
            if refusal:
                print(f"this checkout refuses the checkpoint: {refusal}")
                return 3
            print("3. this checkout reads everything into a new checkpoint", flush=True)
            ref = run_job(ROOT, services, topic, "reference", work / "reference", 2 * args.rounds)
            if done < args.rounds or after < done + args.rounds or ref < 2 * args.rounds:
                print("a run stopped before reading its reports; see its log")
                return 2
            upgraded, _ = shard_records(services[1], "upgraded")
            reference, _ = shard_records(services[1], "reference")
            equal = set(upgraded) == set(reference) and all(
                upgraded[k] == reference[k] for k in reference
            )
            sizes = {k: len(v) for k, v in sorted(reference.items())}
            print(f"shard records equal: {equal} (record bytes {sizes})")
            return 0 if equal else 1
    finally:
        if not args.keep:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)],
                check=False,
                capture_output=True,
            )
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")


if __name__ == "__main__":
    sys.exit(main())
