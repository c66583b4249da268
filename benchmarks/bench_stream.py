"""Benchmark of the streaming job: throughput, report-to-decision latency, state size.

What it runs (everything local: embedded Apache Kafka and Redis, Spark ``local[2]``):

1. **Backlog phase.** ``--rounds`` rounds of reports (``--brokers`` x ``--bundles`` bundles per
   broker, every broker reporting once per ``--report-interval-s`` of *event* time) are put on
   the reports topic first. A plain confluent-kafka consumer and Kafka's own
   ``kafka-consumer-perf-test`` (``org.apache.kafka.tools.ConsumerPerformance``, from the cached
   Kafka jars) read them back (the ceilings: how fast a bare client gets the same bytes), then
   the job drains them; throughput is bundle
   samples per second over the batches after the first (the first one pays for starting the
   Python workers), from Spark's own progress reports.
2. **Live phase.** For ``--live-seconds`` every broker publishes one report per interval, spread
   over the interval, stamped with the wall clock. A report's latency is the time from its
   publication to the end of the first decision-stage batch whose newest event time reaches it
   (decisions published, Redis written). p50 and p99 over all live reports.
3. **State size.** Bytes per bundle of the shard blobs (what the value state holds) and of
   RocksDB's SST files (what the checkpoint holds), from the query's state-operator metrics.

The broker writes its log under the work folder: the default run (40 x 2,500 = 100,000
bundles, 600 KB reports, 10 backlog rounds + 180 s live) writes about 1.2 GB there.

    .venv/bin/python benchmarks/bench_stream.py [--brokers 40 --bundles 2500 ...]

It prints its figures as the Markdown table of docs/benchmarks.md's streaming section; the doc
keeps one current table, so paste it there rather than appending runs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.embedded import EmbeddedKafka, EmbeddedRedis
from infra.topics import ensure_topics
from loadbalance.bundles import NamespaceBundles
from loadbalance.config import LoadBalancerConfig
from loadbalance.model import LocalBrokerData, NamespaceBundleStats, ResourceUsage
from loadbalance.report_codec import DEFAULT_MAX_REPORT_BYTES, encode_report
from streaming import stage_timing
from streaming.decide import BatchStats
from streaming.job import StreamSettings, records_read, spark_session, start_query
from streaming.shard_state import ShardState, shard_of

VARIANTS = 3  # pre-encoded reports per broker, rotated, so averages move without re-encoding


def make_reports(brokers: int, bundles: int, seed: int) -> tuple[list[list[bytes]], list[str]]:
    """Pre-encoded reports: ``VARIANTS`` per broker; namespaces of at most 100 bundles each."""
    rng = random.Random(seed)
    names: list[str] = []
    per_ns = 100
    for ns in range((brokers * bundles + per_ns - 1) // per_ns):
        names += NamespaceBundles.initial(f"bench/ns{ns}", per_ns).bundle_names
    out = []
    for b in range(brokers):
        own = names[b * bundles : (b + 1) * bundles]
        variants = [
            encode_report(broker_report(rng, f"broker-{b}:8080", own)) for _ in range(VARIANTS)
        ]
        out.append(variants)
    return out, names[: brokers * bundles]


def broker_report(rng: random.Random, broker: str, own: list[str]) -> LocalBrokerData:
    """One report of the benchmark's brokers: each bundle 1-200 msg/s in and out of 1,000
    bytes, the broker's CPU 20-90 % and bandwidth 10-90 %, all drawn anew (so ThresholdShedder
    moves thousands of bundles per cycle at a million bundles)."""
    stats = {}
    for n in own:
        rate = rng.uniform(1, 200)
        stats[n] = NamespaceBundleStats(rate, rate, rate * 1000, rate * 1000, 3, 2, 2)
    return LocalBrokerData(
        broker=broker,
        cpu=ResourceUsage(rng.uniform(20, 90), 100.0),
        memory=ResourceUsage(2000.0, 8000.0),
        bandwidth_in=ResourceUsage(rng.uniform(100, 900), 1000.0),
        bandwidth_out=ResourceUsage(rng.uniform(100, 900), 1000.0),
        msg_rate_in=sum(s.msg_rate_in for s in stats.values()),
        msg_rate_out=sum(s.msg_rate_out for s in stats.values()),
        msg_throughput_in=sum(s.msg_throughput_in for s in stats.values()),
        msg_throughput_out=sum(s.msg_throughput_out for s in stats.values()),
        num_bundles=len(stats),
        bundles=frozenset(stats),
        last_stats=stats,
    )


def producer(bootstrap: str):
    from confluent_kafka import Producer

    return Producer(
        {"bootstrap.servers": bootstrap, "message.max.bytes": 8_000_000, "linger.ms": 5}
    )


def publish_backlog(bootstrap: str, topic: str, reports, rounds: int, t0_ms: int, step_ms: int):
    p = producer(bootstrap)
    for r in range(rounds):
        for b, variants in enumerate(reports):
            p.produce(topic, key=f"broker-{b}:8080", value=variants[r % VARIANTS],
                      timestamp=t0_ms + r * step_ms + b)  # fmt: skip
            p.poll(0)
        p.flush(60)
    assert p.flush(60) == 0


def consumer_baseline(bootstrap: str, topic: str, partitions: int, expected: int) -> float:
    """Records per second a bare confluent-kafka consumer reads the topic at."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-baseline",
                  "enable.partition.eof": True, "fetch.max.bytes": 64_000_000})  # fmt: skip
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    got, eof, started = 0, 0, time.perf_counter()
    while got < expected and eof < partitions:
        m = c.poll(5)
        if m is None:
            break
        if m.error():
            eof += m.error().code() == -191
            continue
        got += 1
    elapsed = time.perf_counter() - started
    c.close()
    return got / elapsed


def consumer_perf_test(bootstrap: str, topic: str, expected: int) -> float:
    """Records per second Kafka's own consumer (``kafka-consumer-perf-test``) reads the topic
    at, timed by the tool from its first fetch to its last (JVM start-up excluded)."""
    import subprocess

    from infra import jars
    from infra.kafka_server import java_binary

    argv = [java_binary(), "-Xmx512m", "-cp", jars.classpath("kafka"),
            "org.apache.kafka.tools.ConsumerPerformance", "--bootstrap-server", bootstrap,
            "--topic", topic, "--messages", str(expected), "--timeout", "60000",
            "--fetch-size", str(64_000_000), "--hide-header"]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True).stdout
    # start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, ...
    fields = [f.strip() for f in out.strip().splitlines()[-1].split(",")]
    return float(fields[5])


def live_phase(bootstrap, topic, reports, seconds: float, interval_s: float, sent: list[int]):
    """Publish in real time; every broker once per interval, spread over it."""
    p = producer(bootstrap)
    n = len(reports)
    start = time.time()
    k = 0
    while True:
        due = start + k * interval_s / n
        if due - start >= seconds:
            break
        time.sleep(max(0.0, due - time.time()))
        b = k % n
        now_ms = int(time.time() * 1000)
        p.produce(topic, key=f"broker-{b}:8080", value=reports[b][(k // n) % VARIANTS],
                  timestamp=now_ms)  # fmt: skip
        p.poll(0)
        sent.append(now_ms)
        k += 1
    p.flush(60)


def print_live_breakdown(live: list[BatchStats], progress: list[dict]) -> None:
    """Where a live batch's time goes: Spark's phases, the state operator, the decision stage."""
    if not live or not progress:
        return
    parts: dict[str, float] = {}
    for p in progress:
        for k, v in p["durationMs"].items():
            parts[k] = parts.get(k, 0.0) + v / len(progress)
        for op in p.get("stateOperators", []):
            for k in ("commitTimeMs", "allUpdatesTimeMs", "allRemovalsTimeMs"):
                parts["state." + k] = parts.get("state." + k, 0.0) + op.get(k, 0) / len(progress)
    rows = statistics.mean(reports_of(p) for p in progress)
    # joined by batch id: Spark reports progress for batches the decision stage never saw
    # (one without data) and the other way round (the last one, stopped before its progress)
    stage = {s.batch_id: (round(s.duration_ms - s.collect_ms), s.decisions) for s in live}
    print("live batches (batch id, reports, total ms, decision stage ms, decisions):",
          [(p["batchId"], reports_of(p), p["durationMs"]["triggerExecution"],
            *stage.get(p["batchId"], (None, None))) for p in progress])  # fmt: skip
    for s in live:
        if s.decisions:
            print(f"  batch {s.batch_id} with a policy cycle ({s.decisions} decisions), ms:",
                  {k: round(v) for k, v in s.phases.items()})  # fmt: skip
    print(f"live: {len(live)} batches, {rows:.1f} reports per batch; mean ms per batch:",
          {k: round(v) for k, v in sorted(parts.items())},
          f"of which Spark plan {statistics.mean(s.collect_ms for s in live):.0f}, decision "
          f"stage {statistics.mean(s.duration_ms - s.collect_ms for s in live):.0f}")  # fmt: skip


def print_breakdown(
    label: str,
    progress: list[dict],
    stats: list[BatchStats],
    stages: stage_timing.Sums,
) -> dict[str, float]:
    """Mean ms per batch: Spark's phases, the state operator, the executor stages (summed over
    parallel tasks) and the decision stage's steps; printed, and returned for the figures."""
    n = max(1, len(progress))
    out: dict[str, float] = {}
    for p in progress:
        for k, v in p["durationMs"].items():
            out["spark." + k] = out.get("spark." + k, 0.0) + v / n
        for op in p.get("stateOperators", []):
            for k in ("commitTimeMs", "allUpdatesTimeMs", "allRemovalsTimeMs"):
                out["stateop." + k] = out.get("stateop." + k, 0.0) + op.get(k, 0) / n
    for stage, (wall, cpu, _items, _lines) in sorted(stages.items()):
        out[f"tasks.{stage} (wall)"] = wall / n
        out[f"tasks.{stage} (cpu)"] = cpu / n
    if stats:
        out["driver.collect(spark plan)"] = statistics.mean(s.collect_ms for s in stats)
        for k in sorted({k for s in stats for k in getattr(s, "phases", {})}):
            out["driver." + k] = sum(getattr(s, "phases", {}).get(k, 0.0) for s in stats) / len(
                stats
            )
        out["driver.total"] = statistics.mean(s.duration_ms for s in stats)
    rows = statistics.mean(reports_of(p) for p in progress) if progress else 0
    print(f"{label}: {len(progress)} batches, {rows:.1f} reports per batch; mean ms per batch:")
    for k, v in out.items():
        print(f"  {k:42s} {v:9.1f}")
    return out


def process_cpu() -> dict[str, float]:
    """CPU seconds so far of this process and everything it started, by kind of process
    (Spark's JVM, its Python workers, the Kafka broker, Redis, this driver), ended children
    included."""
    import psutil

    me = psutil.Process()
    out: dict[str, float] = {}
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            argv = p.cmdline()
        except psutil.Error:
            continue
        cmd = " ".join(argv[:3])
        # by executable first: Redis's binary lives in the venv's site-packages, whose path
        # holds "python"; the broker is a JVM too, told apart by its main class
        name = p.name().lower()
        kind = ("driver (python)" if p.pid == me.pid else "kafka" if "kafka.Kafka" in argv
                else "redis" if "redis" in name else "spark jvm" if "java" in cmd
                else "python workers" if "pyspark" in cmd or "python" in cmd
                else p.name())  # fmt: skip
        out[kind] = out.get(kind, 0.0) + t.user + t.system
        if p.pid != me.pid:  # children this one waited for (ended Python workers)
            out[kind] += t.children_user + t.children_system
    return out


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: round(after.get(k, 0.0) - before.get(k, 0.0), 1) for k in sorted(after)}


def python_workers() -> set[int]:
    """Process ids of Spark's Python workers now running under this process."""
    import psutil

    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if "pyspark" in " ".join(p.cmdline()[:4]):
                out.add(p.pid)
        except psutil.Error:
            pass
    return out


class MemorySampler:
    """Peak memory of the job's processes, sampled twice a second in a background thread.

    What is counted: the driver's JVM heap in use (``Runtime.totalMemory - freeMemory``, read
    through the session's py4j gateway) and its limit, the JVM's resident set, this driver
    process's resident set (the decision stage's view and the batch it collected), and the
    sum of the proportional set sizes of Spark's Python workers (state step and source; they
    are forked from one daemon and share pages, so resident sets would count those twice). The
    Kafka broker and Redis are not counted: they stand in for services a real deployment runs
    elsewhere."""

    def __init__(self, spark: object) -> None:
        self.spark = spark
        self.peaks: dict[str, float] = {}
        self.workers: set[int] = set()  # Python worker processes seen (a new one costs imports)
        self.cpu_s = 0.0  # the sampler's own CPU time, which the job's driver process pays
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)

    def start(self) -> MemorySampler:
        self._thread.start()
        return self

    def reset(self) -> dict[str, float]:
        """The peaks so far (MB), and start afresh (one figure per phase)."""
        out, self.peaks = self.peaks, {}
        return {k: round(v) for k, v in out.items()}

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.reset()

    def _sample(self) -> dict[str, float]:
        import psutil

        mb = 1024 * 1024
        me = psutil.Process()
        # reading a worker's PSS walks its whole page map (about 25 ms of this process's CPU
        # per sample at a million bundles): every fourth sample, every 2 s
        pss = self.samples % 4 == 0
        out = {"driver_python_rss_mb": me.memory_info().rss / mb, "python_workers_pss_mb": 0.0}
        for p in me.children(recursive=True):
            try:
                head = " ".join(p.cmdline()[:4])
                if "java" in head.split(" ", 1)[0]:
                    out["driver_jvm_rss_mb"] = p.memory_info().rss / mb
                elif "pyspark" in head:  # proportional: forked workers share pages
                    self.workers.add(p.pid)
                    if pss:
                        out["python_workers_pss_mb"] += p.memory_full_info().pss / mb
            except psutil.Error:
                pass
        try:
            runtime = self.spark._jvm.java.lang.Runtime.getRuntime()  # type: ignore[attr-defined]
            out["driver_heap_used_mb"] = (runtime.totalMemory() - runtime.freeMemory()) / mb
            out["driver_heap_max_mb"] = runtime.maxMemory() / mb
        except Exception:  # the session is stopping
            pass
        return out

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            started = time.thread_time()
            try:
                sample = self._sample()
            except Exception:
                continue
            finally:
                self.cpu_s += time.thread_time() - started
                self.samples += 1
            for k, v in sample.items():
                self.peaks[k] = max(self.peaks.get(k, 0.0), v)


def jcmd(*command: str) -> bool:
    """Run ``jcmd <Spark's JVM> command...``; whether it ran."""
    import subprocess

    import psutil

    for p in psutil.Process().children(recursive=True):
        if "java" in " ".join(p.cmdline()[:1]):
            subprocess.run(["jcmd", str(p.pid), *command], check=False, capture_output=True)
            return True
    return False


def reports_of(p: dict) -> int:
    """Reports (Kafka records) a batch read: from its offsets, else its input rows (the Python
    source's rows are parse rows, several per report)."""
    n = records_read(p.get("sources"), unknown_start=0)  # the bench's topic starts at 0
    return p["numInputRows"] if n is None else n


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def machine_speed(raw: bytes, repeats: int = 9) -> float:
    """CPU ms (median) of a fixed piece of the job's own kind of work on one core: decoding one
    report and sorting a million floats. Taken before the services start and after the live
    phase, it shows how fast the machine ran that run: on these shared cores the same work
    takes measurably longer in some runs (other tenants of the host), which moves every
    latency of the run with it."""
    import numpy as np

    from loadbalance.report_codec import decode_report_columns

    values = np.random.default_rng(0).random(1_000_000)
    times = []
    for _ in range(repeats):
        started = time.process_time()
        decode_report_columns(raw, "broker-0:8080", max_bytes=len(raw))
        np.sort(values)
        times.append((time.process_time() - started) * 1000)
    return statistics.median(times)


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def progress_reading_ms(query: Any, repeats: int = 5) -> dict[str, float]:
    """Milliseconds to read the query's last progress as a Python object, median of
    ``repeats``: PySpark's field-by-field reading (``fromJObject``, what a plain
    ``StreamingQueryListener`` gets per batch) against one JSON text (what the job's listener
    reads, ``streaming.job._JsonProgress``), on the same progress in the same process."""
    from pyspark.sql.streaming.listener import StreamingQueryProgress

    jprogress = query._jsq.lastProgress()

    def median_ms(read: Callable[[], Any]) -> float:
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            read()
            times.append((time.perf_counter() - started) * 1000)
        return round(statistics.median(times), 1)

    return {
        "field_by_field": median_ms(lambda: StreamingQueryProgress.fromJObject(jprogress)),
        "json": median_ms(lambda: StreamingQueryProgress.fromJson(json.loads(jprogress.json()))),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--brokers", type=int, default=40)
    ap.add_argument("--bundles", type=int, default=2500, help="bundles per broker")
    ap.add_argument("--rounds", type=int, default=10, help="backlog rounds")
    ap.add_argument("--live-seconds", type=float, default=180.0)
    ap.add_argument("--report-interval-s", type=float, default=5.0)
    ap.add_argument("--partitions", type=int, default=2, help="partitions of the reports topic")
    ap.add_argument("--shards", type=int, default=32)
    ap.add_argument("--trigger-seconds", type=float, default=1.0)
    ap.add_argument("--max-offsets-per-trigger", type=int, default=None,
                    help="reports per batch (default: the job's own cap)")  # fmt: skip
    ap.add_argument("--source", default="auto", choices=("auto", "kafka", "python"))
    ap.add_argument("--driver-memory", default=None, help="spark.driver.memory, e.g. 3g")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jfr", metavar="FILE", default=None,
                    help="record a Java Flight Recording of Spark's JVM over the backlog "
                         "batches after the first (jcmd)")  # fmt: skip
    ap.add_argument("--backlog-only", action="store_true",
                    help="stop after the backlog phase (no live phase)")  # fmt: skip
    ap.add_argument("--settle-seconds", type=float, default=30.0,
                    help="latency is also reported for reports sent after this much of the live "
                         "phase, when the backlog's effects are over")  # fmt: skip
    ap.add_argument(
        "--max-records-per-partition",
        type=int,
        default=0,
        help="reports one reading task takes at most (lbctl stream "
        "--max-records-per-partition); 0, the default: one task per Kafka partition",
    )
    ap.add_argument(
        "--keep-work", action="store_true", help="keep the services' and checkpoint's folder"
    )
    ap.add_argument(
        "--latencies-out",
        metavar="FILE",
        default=None,
        help="write each live report's [seconds into the live phase, latency ms] as JSON (where "
        "the tail falls)",
    )
    ap.add_argument(
        "--log-driver",
        action="store_true",
        help="log the decision stage's batches and view warm-ups, with times (to stderr)",
    )
    # accepted for old command lines; the script never writes the doc
    ap.add_argument("--no-append", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    if args.log_driver:
        logging.getLogger("streaming.decide").setLevel(logging.INFO)
        logging.getLogger("streaming.driver_view").setLevel(logging.DEBUG)
    work = Path(tempfile.mkdtemp(prefix="bench-stream-"))
    try:
        return run(args, work)
    finally:
        # the broker's log and the checkpoint: about 2 GB for a 152-round backlog
        if args.keep_work:
            print(f"kept {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, work: Path) -> int:
    """The benchmark in the folder ``work``: services, backlog, live phase, figures."""
    print(f"building {args.brokers} x {args.bundles} reports ...", flush=True)
    reports, names = make_reports(args.brokers, args.bundles, args.seed)
    report_bytes = statistics.mean(len(v) for vs in reports for v in vs)
    speed_before = machine_speed(reports[0][0])
    print(f"machine speed before the run: {speed_before:.1f} CPU ms for the fixed work")
    samples_per_round = args.brokers * args.bundles
    step_ms = int(args.report_interval_s * 1000)
    with EmbeddedKafka(work) as kafka, EmbeddedRedis(work) as redis_server:
        bs = kafka.bootstrap_servers
        # the codec's default limit (1 MB) unless a report is larger: the job's default cap of
        # reports per batch is sized by it (streaming.kafka_source)
        largest = max(len(v) for vs in reports for v in vs)
        config = LoadBalancerConfig(**{"maxReportBytes": max(DEFAULT_MAX_REPORT_BYTES, largest)})
        ensure_topics(bs, {config.load_reports_topic: args.partitions,
                           config.decisions_topic: 1, config.dead_letters_topic: 1})  # fmt: skip
        t0_ms = int(time.time() * 1000) - args.rounds * step_ms - 60_000
        print(f"publishing {args.rounds} backlog rounds ({report_bytes / 1e3:.0f} KB reports)")
        publish_backlog(bs, config.load_reports_topic, reports, args.rounds, t0_ms, step_ms)
        backlog_records = args.rounds * args.brokers
        baseline_rps = consumer_baseline(bs, config.load_reports_topic, args.partitions,
                                         backlog_records)  # fmt: skip
        print(f"plain consumer: {baseline_rps:.1f} reports/s = "
              f"{baseline_rps * args.bundles:,.0f} bundle samples/s")  # fmt: skip
        perf_rps = consumer_perf_test(bs, config.load_reports_topic, backlog_records)
        print(f"kafka-consumer-perf-test: {perf_rps:.1f} reports/s = "
              f"{perf_rps * args.bundles:,.0f} bundle samples/s")  # fmt: skip

        batches: list[tuple[BatchStats, float]] = []
        lock = threading.Lock()

        def on_batch(s: BatchStats) -> None:
            with lock:
                batches.append((s, time.time()))

        timings = str(work / "stage-timings.txt")
        os.environ[stage_timing.ENV] = timings  # inherited by Spark's Python workers
        spark = spark_session("local[2]", 2, args.driver_memory)
        spark.sparkContext.setLogLevel("ERROR")
        settings = StreamSettings(
            bootstrap_servers=bs,
            checkpoint=str(work / "ckpt"),
            redis_url=redis_server.url,
            trigger_seconds=args.trigger_seconds,
            source=args.source,
            n_shards=args.shards,
            max_offsets_per_trigger=args.max_offsets_per_trigger,
            max_records_per_partition=args.max_records_per_partition or None,
        )
        cpu_before = process_cpu()
        memory = MemorySampler(spark).start()
        query = start_query(spark, settings, config, on_batch=on_batch)
        last_ts = t0_ms + (args.rounds - 1) * step_ms + args.brokers - 1
        deadline = time.time() + 1800
        jfr_started = False
        cpu_first: dict[str, float] | None = None  # CPU when the first batch was done
        workers: set[int] = set()  # Python worker processes seen (a new one costs imports)
        while time.time() < deadline:
            workers |= python_workers()
            with lock:
                if any(s.max_event_ms >= last_ts for s, _ in batches):
                    break
                if batches and cpu_first is None:
                    cpu_first = process_cpu()
                if args.jfr and batches and not jfr_started:
                    jfr_started = jcmd("JFR.start", "name=bench", f"filename={args.jfr}")
            if query.exception() is not None:
                raise RuntimeError(query.exception())
            time.sleep(0.5)
        # the batch callback runs before Spark posts the batch's progress: wait for it
        settle = time.time() + 60
        while (
            time.time() < settle
            and sum(reports_of(p) for p in query.recentProgress if p["numInputRows"] > 0)
            < backlog_records
        ):
            time.sleep(0.2)
        progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
        steady = progress[1:] or progress
        print("first batch's sources:", progress[0].get("sources") if progress else None)
        rows = sum(reports_of(p) for p in steady)
        secs = sum(p["durationMs"]["triggerExecution"] for p in steady) / 1000
        job_rps = rows / secs if secs else float("nan")
        parts: dict[str, float] = {}
        for p in steady:
            for k, v in p["durationMs"].items():
                parts[k] = parts.get(k, 0.0) + v / len(steady)
        with lock:
            done = [s for s, _ in batches[1:]] or [s for s, _ in batches]
            every = [s for s, _ in batches if not s.skipped]
        spark_ms = statistics.mean(s.collect_ms for s in done)
        driver_ms = statistics.mean(s.duration_ms - s.collect_ms for s in done)
        if jfr_started:
            jcmd("JFR.stop", "name=bench")
        print(f"Python worker processes seen during the backlog: {len(workers)}")
        stages, timing_pos = stage_timing.read(timings)
        cpu_backlog = cpu_delta(cpu_before, process_cpu())
        print("CPU seconds during the backlog, by process:", cpu_backlog,
              f"total {sum(cpu_backlog.values()):.1f}")  # fmt: skip
        if cpu_first is not None and len(progress) > 1:
            cpu_steady = cpu_delta(cpu_first, process_cpu())
            n_steady = sum(reports_of(p) for p in progress[1:])
            total = sum(cpu_steady.values())
            job = sum(v for k, v in cpu_steady.items() if k not in ("kafka", "redis"))
            print(f"CPU after the first batch: {total:.1f} s for {n_steady} reports = "
                  f"{total / n_steady * 1000:.1f} ms per report, the job's own (without Kafka "
                  f"and Redis) {job / n_steady * 1000:.1f};",
                  {k: round(v / n_steady * 1000, 1) for k, v in cpu_steady.items()},
                  f"ms per report; at 2 cores this bounds throughput to "
                  f"{2 * n_steady / total * args.bundles:,.0f} bundle samples/s")  # fmt: skip
        sizes = [(reports_of(p), p["durationMs"]["triggerExecution"]) for p in progress]
        print("backlog batches (reports, total ms):", sizes)
        print_breakdown("backlog, every batch", progress, every, stages)
        wall = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000
        all_rows = sum(reports_of(p) for p in progress)
        print(f"job (backlog): {job_rps:.1f} reports/s = {job_rps * args.bundles:,.0f} "
              f"bundle samples/s over {len(steady)} batches after the first; "
              f"{all_rows / wall * args.bundles:,.0f} over all {len(progress)} "
              f"({wall:.1f} s)")  # fmt: skip
        print(f"job / plain consumer: {job_rps / baseline_rps:.3f}; load average {loadavg()}")
        memory_backlog = memory.reset()
        print("peak memory during the backlog (MB):", memory_backlog)
        if args.backlog_only:
            memory.stop()
            query.stop()
            spark.stop()
            return 0

        sent: list[int] = []
        seen_before = len(batches)
        cpu_before = process_cpu()
        live_phase(bs, config.load_reports_topic, reports, args.live_seconds,
                   args.report_interval_s, sent)  # fmt: skip
        time.sleep(3 * max(args.trigger_seconds, 1.0) + 5)
        with lock:
            live = [(s.max_event_ms, done) for s, done in batches[seen_before:] if s.max_event_ms]
        latencies, settled, series = [], [], []
        for ts in sent:
            done = next((d for m, d in live if m >= ts), None)
            if done is not None:
                latencies.append(done * 1000 - ts)
                series.append([round((ts - sent[0]) / 1000, 3), round(done * 1000 - ts)])
                if ts - sent[0] >= args.settle_seconds * 1000:
                    settled.append(done * 1000 - ts)
        if args.latencies_out:
            Path(args.latencies_out).write_text(json.dumps(series))
        live_rate = len(sent) * args.bundles / args.live_seconds
        live_batches = [s for s, _ in batches[seen_before:] if not s.skipped]
        live_progress = [p for p in query.recentProgress
                         if p["batchId"] > (steady[-1]["batchId"] if steady else -1)]  # fmt: skip
        print_live_breakdown(live_batches, live_progress)
        cpu_live = cpu_delta(cpu_before, process_cpu())
        print("CPU seconds during the live phase, by process:", cpu_live)
        live_cpu_ms = {  # per live report: everything, and the job's own (no Kafka, no Redis)
            "all": round(sum(cpu_live.values()) / max(1, len(sent)) * 1000, 1),
            "job": round(
                sum(v for k, v in cpu_live.items() if k not in ("kafka", "redis"))
                / max(1, len(sent))
                * 1000,
                1,
            ),
        }
        print("CPU ms per live report:", live_cpu_ms)
        stages, timing_pos = stage_timing.read(timings, timing_pos)
        print_breakdown("live", live_progress, live_batches, stages)
        state = query.lastProgress["stateOperators"][0] if query.lastProgress else {}
        sst = state.get("customMetrics", {}).get("rocksdbSstFileSize", 0)
        rows_total = state.get("numRowsTotal", 0)
        memory_live = memory.stop()
        print("peak memory during the live phase (MB):", memory_live)
        print(f"Python worker processes seen over the run: {len(memory.workers)}; the memory "
              f"sampler's own CPU: {memory.cpu_s:.1f} s over {memory.samples} samples")  # fmt: skip
        progress_read = progress_reading_ms(query)
        print("reading the last progress event (ms, median of 5):", progress_read)
        query.stop()
        spark.stop()
        speed_after = machine_speed(reports[0][0])
        print(f"machine speed after the live phase: {speed_after:.1f} CPU ms for the fixed work")

    blob = ShardState()
    sample = [n for n in names if shard_of(n, args.shards) == 0]
    blob.index_of(sample)
    for i in range(len(sample)):
        blob.owners[i] = "broker-10:8080"
    blob_per_bundle = len(blob.to_bytes()) / max(1, len(sample))
    figures = {
        "bundles": samples_per_round,
        "max_records_per_partition": args.max_records_per_partition or None,
        "report_kb": round(report_bytes / 1e3, 1),
        "job_samples_per_s": round(job_rps * args.bundles),
        "consumer_samples_per_s": round(baseline_rps * args.bundles),
        "job_over_consumer": round(job_rps / baseline_rps, 3),
        "perf_test_samples_per_s": round(perf_rps * args.bundles),
        "live_samples_per_s": round(live_rate),
        "live_reports": len(sent),
        "latency_measured": len(latencies),
        "latency_p50_ms": round(percentile(latencies, 0.5)),
        "latency_p99_ms": round(percentile(latencies, 0.99)),
        "latency_p50_p99_after_settle_ms": [
            round(percentile(settled, 0.5)),
            round(percentile(settled, 0.99)),
        ],
        "live_cpu_ms_per_report": live_cpu_ms,
        "state_blob_bytes_per_bundle": round(blob_per_bundle, 1),
        "rocksdb_sst_bytes_per_bundle": round(sst / samples_per_round, 1) if sst else None,
        "state_rows": rows_total,
        "spark_plan_ms_per_batch": round(spark_ms),
        "decision_stage_ms_per_batch": round(driver_ms),
        "progress_event_read_ms": progress_read,
        "machine_speed_ms_before_after": [round(speed_before, 1), round(speed_after, 1)],
        "peak_memory_backlog_mb": memory_backlog,
        "peak_memory_live_mb": memory_live,
    }
    print(json.dumps(figures, indent=2))
    print_doc_table(args, figures)
    return 0


def _mb(peaks: dict[str, float], key: str) -> str:
    return f"{peaks[key]:,.0f}" if key in peaks else "n/a"


def print_doc_table(args: argparse.Namespace, f: dict) -> None:
    argv = " ".join(sys.argv[1:])
    text = f"""
## Streaming job

Script: `benchmarks/bench_stream.py` (method in its docstring). Command, on the 2-core machine:

```
.venv/bin/python benchmarks/bench_stream.py {argv}
```

{args.brokers} brokers x {args.bundles} bundles = {f["bundles"]:,} bundles, reports of
{f["report_kb"]} KB, {args.shards} state shards, trigger {args.trigger_seconds} s, source
`{args.source}`, local[2], embedded Apache Kafka and Redis on the same 2 cores.

| figure | value |
|---|---|
| job throughput, backlog (bundle samples/s) | {f["job_samples_per_s"]:,} |
| plain confluent-kafka consumer, same topic (bundle samples/s) | {f["consumer_samples_per_s"]:,} |
| kafka-consumer-perf-test, same topic (bundle samples/s) | {f["perf_test_samples_per_s"]:,} |
| job / consumer | {f["job_over_consumer"]} |
| live load offered (bundle samples/s) | {f["live_samples_per_s"]:,} |
| report-to-decision latency p50 / p99 (ms, {f["latency_measured"]} reports) | \
{f["latency_p50_ms"]:,} / {f["latency_p99_ms"]:,} |
| state blob per bundle (bytes) | {f["state_blob_bytes_per_bundle"]} |
| RocksDB SST per bundle (bytes) | {f["rocksdb_sst_bytes_per_bundle"]} |
| peak driver heap used / limit, live (MB) | \
{_mb(f["peak_memory_live_mb"], "driver_heap_used_mb")} / \
{_mb(f["peak_memory_live_mb"], "driver_heap_max_mb")} |
| peak memory, live: driver JVM RSS / driver Python RSS / Python workers PSS (MB) | \
{_mb(f["peak_memory_live_mb"], "driver_jvm_rss_mb")} / \
{_mb(f["peak_memory_live_mb"], "driver_python_rss_mb")} / \
{_mb(f["peak_memory_live_mb"], "python_workers_pss_mb")} |
"""
    print(text)


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    sys.exit(main())
