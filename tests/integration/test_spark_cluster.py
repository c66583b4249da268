"""The streaming job on a Spark standalone cluster decides what it decides on ``local[2]``, and
Spark's Kafka connector decides what the Python data source does.

A real cluster is started here (``infra.spark_cluster``: a master and two workers, one core
each, on loopback), so the job's tasks run in two executor JVMs, each with its own Python
workers, and its state is written by those executors, not by the driver's JVM. The same
reports go to two topics; ``lbctl stream --available-now`` runs once with ``--master
local[2]`` and once with ``--master spark://...``, each with its own checkpoint and Redis
prefix, each in its own process (a SparkContext per process, and the suite's ``spark`` fixture
already holds one). Then everything the two runs left behind is compared: the decisions (ids
and content), the load snapshot (byte for byte, and as documents against the pure core), the
stream progress, and the checkpoints (batch ids, committed offsets, the shard count).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.process import spawn, terminate
from infra.spark_cluster import StandaloneCluster
from loadbalance.config import LoadBalancerConfig
from loadbalance.decisions import SPLIT, TRANSFER, UNLOAD, decode_decision
from metadata_store.load_snapshot import LoadSnapshot
from metadata_store.progress import RedisProgress
from tests.integration.test_streaming_job import (
    _assert_matches_pure,
    _cluster_round,
    _read_all,
    overloaded_cluster,
)

REPO = Path(__file__).resolve().parents[2]
APP_NAME = "pulsar-lb-stream"  # streaming.job.spark_session's appName
JOB_TIMEOUT_S = 240.0  # a loaded 2-core machine runs each in 60-120 s


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A master and two one-core workers; stopped (every JVM, executors included) at the end,
    also when a test failed."""
    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-cluster"), workers=2)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
        assert cluster.alive() == [], "a JVM of the cluster outlived stop()"


def _start_stream(
    master: str,
    config: LoadBalancerConfig,
    checkpoint: Path,
    kafka_bootstrap: str,
    redis_url: str,
    env: dict[str, str],
    log: Path,
    source: str = "kafka",
) -> subprocess.Popen[bytes]:
    """``lbctl stream --available-now`` on ``source`` in a child process (its own process
    group)."""
    knobs = {
        "loadReportsTopic": config.load_reports_topic,
        "decisionsTopic": config.decisions_topic,
        "deadLettersTopic": config.dead_letters_topic,
        "redisKeyPrefix": config.redis_key_prefix,
        "loadBalancerLoadSheddingStrategy": "OverloadShedder",
        "loadBalancerNamespaceBundleMaxMsgRate": "1000",
    }
    argv = [sys.executable, "-m", "lbctl.main", "stream", "--master", master]
    argv += ["--bootstrap-servers", kafka_bootstrap, "--redis-url", redis_url]
    argv += ["--checkpoint", str(checkpoint), "--available-now", "--source", source]
    argv += ["--shards", "4", "--max-restarts", "0"]
    for knob, value in knobs.items():
        argv += ["--set", f"{knob}={value}"]
    return spawn(argv, log, env=env, cwd=REPO)


def _finish(runs: dict[str, tuple[subprocess.Popen[bytes], Path]]) -> dict[str, float]:
    """Wait for every run to end (those still running at the deadline are killed with their
    JVMs); each run's seconds from now. Fails naming a run that did not exit 0."""
    started = time.monotonic()
    deadline = started + JOB_TIMEOUT_S
    took: dict[str, float] = {}
    try:
        for name, (proc, log) in runs.items():
            try:
                code = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                code = None
            took[name] = time.monotonic() - started
            assert code == 0, f"lbctl stream ({name}) ended with {code}:\n{_tail(log)}"
    finally:
        for proc, _ in runs.values():
            terminate(proc)
    return took


def _tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def _checkpoint(folder: Path, topic: str) -> dict[str, object]:
    """What a checkpoint committed: batch ids, each batch's source offsets (the topic's name
    replaced, as the two runs read different topics) and the recorded shard count."""
    commits = sorted(int(p.name) for p in (folder / "commits").iterdir() if p.name.isdigit())
    offsets = {}
    for p in (folder / "offsets").iterdir():
        if p.name.isdigit():
            # v1, then the batch's metadata (has the run's own timestamps), then the sources
            source_line = p.read_text().splitlines()[2]
            offsets[int(p.name)] = json.loads(source_line.replace(topic, "<reports>"))
    return {
        "commits": commits,
        "offsets": offsets,
        "settings": json.loads((folder / "lbctl-stream.json").read_text()),
        "state operators": sorted(p.name for p in (folder / "state").iterdir()),
    }


def _completed_app(cluster: StandaloneCluster, timeout_s: float = 30.0) -> str:
    """The id of the one application the cluster ran. The master marks it completed when it
    notices the driver left, a moment after the driver's process exited."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = cluster.state()
        apps = [a for a in state["completedapps"] if a["name"] == APP_NAME]
        if apps or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(apps) == 1 and not state["activeapps"], state
    return str(apps[0]["id"])


def _executors_that_ran_tasks(cluster: StandaloneCluster, app_id: str) -> list[int]:
    """Workers whose executor for ``app_id`` logged a task it ran."""
    ran = []
    for i in range(cluster.n_workers):
        logs = list((cluster.worker_dir(i) / app_id).glob("*/stderr"))
        if any("Running task" in log.read_text(errors="replace") for log in logs):
            ran.append(i)
    return ran


def test_the_job_on_a_standalone_cluster_decides_what_it_decides_on_local2(
    spark_cluster, kafka_bootstrap, redis_url, fresh_redis, unique_topic, tmp_path
):
    local_cfg, names = overloaded_cluster(kafka_bootstrap, fresh_redis, unique_topic)
    cluster_cfg, cluster_names = overloaded_cluster(kafka_bootstrap, fresh_redis, unique_topic)
    python_cfg, python_names = overloaded_cluster(kafka_bootstrap, fresh_redis, unique_topic)
    assert names == cluster_names == python_names  # the same namespace, hence the same bundles
    env = spark_cluster.driver_env()

    # all at once: on 2 cores the runs mostly wait (JVM and Python worker starts, batches).
    # "local" and "cluster" read with Spark's Kafka connector, "python" with the Python source.
    runs = {
        name: (_start_stream(master, cfg, tmp_path / name, kafka_bootstrap, redis_url, env,
                             tmp_path / f"{name}.log", source), tmp_path / f"{name}.log")
        for name, master, cfg, source in (
            ("local", "local[2]", local_cfg, "kafka"),
            ("cluster", spark_cluster.master_url, cluster_cfg, "kafka"),
            ("python", "local[2]", python_cfg, "python"),
        )
    }  # fmt: skip
    print("run times, s:", _finish(runs))

    # the cluster run was the cluster's: one application, an executor on each worker ran tasks
    app_id = _completed_app(spark_cluster)
    assert _executors_that_ran_tasks(spark_cluster, app_id) == [0, 1]

    # decisions: the same ids, keys and contents, and the expected ones (not an empty match)
    local_records = _read_all(kafka_bootstrap, local_cfg.decisions_topic)
    cluster_records = _read_all(kafka_bootstrap, cluster_cfg.decisions_topic)
    local_decisions = sorted((decode_decision(v) for _, v, _, _ in local_records), key=_by_id)
    cluster_decisions = sorted((decode_decision(v) for _, v, _, _ in cluster_records), key=_by_id)
    assert cluster_decisions == local_decisions
    assert sorted(k for k, _, _, _ in cluster_records) == sorted(k for k, _, _, _ in local_records)
    kinds = {d.kind for d in cluster_decisions}
    assert SPLIT in kinds and kinds & {UNLOAD, TRANSFER}
    assert _read_all(kafka_bootstrap, cluster_cfg.dead_letters_topic) == []

    # the load snapshot: byte for byte, and the averages the pure core computes
    local_snap = LoadSnapshot(fresh_redis, local_cfg.redis_key_prefix).read()
    cluster_snap = LoadSnapshot(fresh_redis, cluster_cfg.redis_key_prefix).read()
    assert dict(cluster_snap.brokers_raw) == dict(local_snap.brokers_raw)
    assert dict(cluster_snap.shards) == dict(local_snap.shards)
    reports = [r for i in range(3) for r in _cluster_round(names, i)]
    _assert_matches_pure(cluster_snap.bundle_docs(), reports, cluster_cfg)

    # progress (batch, clock, cycle state) and the checkpoints
    local_progress = RedisProgress(fresh_redis, local_cfg.redis_key_prefix).read()
    cluster_progress = RedisProgress(fresh_redis, cluster_cfg.redis_key_prefix).read()
    assert cluster_progress == local_progress
    assert cluster_progress.cycle_state.last_shedding_ms is not None
    local_ckpt = _checkpoint(tmp_path / "local", local_cfg.load_reports_topic)
    cluster_ckpt = _checkpoint(tmp_path / "cluster", cluster_cfg.load_reports_topic)
    assert cluster_ckpt == local_ckpt
    assert local_ckpt["offsets"][max(local_ckpt["commits"])] == {"<reports>": {"0": 12}}

    # the Python source gives the same decisions, snapshot, progress and offsets
    python_records = _read_all(kafka_bootstrap, python_cfg.decisions_topic)
    python_decisions = sorted((decode_decision(v) for _, v, _, _ in python_records), key=_by_id)
    assert python_decisions == local_decisions
    python_snap = LoadSnapshot(fresh_redis, python_cfg.redis_key_prefix).read()
    assert dict(python_snap.brokers_raw) == dict(local_snap.brokers_raw)
    assert dict(python_snap.shards) == dict(local_snap.shards)
    assert RedisProgress(fresh_redis, python_cfg.redis_key_prefix).read() == local_progress
    python_ckpt = _checkpoint(tmp_path / "python", python_cfg.load_reports_topic)
    assert python_ckpt["commits"] == local_ckpt["commits"]
    assert python_ckpt["offsets"] == local_ckpt["offsets"]


def _by_id(decision) -> str:
    return decision.id
