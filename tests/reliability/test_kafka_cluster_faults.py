"""The whole pipeline on a three-broker Apache Kafka cluster while brokers fail.

One KRaft cluster of three nodes on loopback (``infra.kafka_server.KafkaCluster``: replication
factor 3, ``min.insync.replicas`` 2), every topic created with three replicas. One streaming job
(``lbctl stream`` on Spark's Kafka connector, a real process with its own JVM) and two
controllers (``lbctl control`` in one consumer group, one partition of the decisions topic
each) run through the whole module; the tests inject one fault each, in order:

a. SIGKILL of the leader of a load-report partition (restarted afterwards);
b. SIGKILL of the leader of a decisions partition (restarted afterwards);
c. a rolling restart of the three brokers (stop, start, wait until back in every ISR, next);
d. SIGKILL of one controller: the other takes over its partition;
e. SIGSTOP of the controllers' group coordinator past the consumer session timeout (6 s) and
   Kafka's broker session timeout (9 s), then SIGCONT.

Load is four brokers' reports, written round by round through the product's own report
publisher (``producers.live_sim.TimestampedReportPublisher``, the simulator's), one virtual
minute apart: broker-1 overloaded, one bundle over the split limit, so every policy cycle
decides something and the controllers apply unloads and a split. A round goes out just before
each fault and one just after it, so the fault meets a batch and produces in flight.

After every fault, exactly:

* no report lost from the state, none counted twice: the job's checkpoint reaches every offset
  the publisher was acknowledged, and the averages in Redis equal the pure fold of every report
  published (``_assert_matches_pure``);
* every decision published has exactly one recorded outcome and none was applied twice;
* the ring and the leases are those of one pass over the decisions: a fresh store set up the
  same way and given each decision once, in the recorded order, ends equal (boundaries, owners,
  tokens drawn, fence), and the invariants of ``invariants.check_invariants`` hold.

The time to recover is printed per fault (``figure:`` lines) and kept in docs/reliability.md.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from infra.config_loading import ensure_pipeline_topics
from infra.kafka_server import KafkaCluster
from infra.offsets import latest_offsets
from lbctl.monitor_lag import checkpoint_offsets
from loadbalance.config import LoadBalancerConfig
from loadbalance.decisions import decode_decision
from loadbalance.model import LocalBrokerData
from loadbalance.report_codec import encode_report
from metadata_store.ownership_redis import RedisStore
from producers.live_sim import TimestampedReportPublisher
from tests.integration.test_streaming_job import MINUTE_MS, _assert_matches_pure, _cluster_round
from tests.reliability.invariants import kill_group, lbctl, set_args, stop, wait_for
from tests.reliability.kafka_cluster import (
    assert_one_outcome_each_applied_once,
    assert_store_equals_one_pass,
    first_copies,
    group_assignment,
    group_committed,
    group_coordinator,
    in_sync_everywhere,
    outcome_entries,
    partition_leaders,
)
from tests.reliability.test_stream_faults import _progress, _read_values, _snapshot

pytestmark = [pytest.mark.integration, pytest.mark.spark]

NS = "acme/cluster"
HOUR_MS = 3_600_000
PARTITIONS = 2  # two decisions partitions: one per controller of the group
STALL_S = 12.0  # past the consumers' session timeout (6 s) and Kafka's broker session (9 s)
RECOVER_S = 150.0  # generous: the whole suite shares two cores
RESTART_LINE = re.compile(r"streaming query failed after .*; restart \d+")
BATCH_LINE = re.compile(r"batch (\d+): \d+ rows, \d+ dead letters, (\d+) decisions")
LEADER_KILL_BATCH_S = 50.0
"""Bound on the fault-to-batch time after a leader crash. Why: Spark's offset lookup aimed at
the crashed leader waited for Kafka's 60 s ``default.api.timeout.ms`` before retrying (measured
70-93 s to the next batch); with the job's connector defaults (``streaming.source``) it is
about 20 s."""


@dataclass
class Pipeline:
    """The cluster, the running processes and everything published so far."""

    cluster: KafkaCluster
    r: redis.Redis
    redis_url: str
    prefix: str
    knobs: dict[str, object]
    names: list[str]
    publisher: TimestampedReportPublisher
    checkpoint: Path
    logs: Path
    job: subprocess.Popen[bytes]
    controllers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    reports: list[LocalBrokerData] = field(default_factory=list)
    rounds: int = 0
    checks: int = 0
    t0_ms: int = field(default_factory=lambda: int(time.time() * 1000))

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap_servers

    @property
    def config(self) -> LoadBalancerConfig:
        return LoadBalancerConfig(**self.knobs)

    @property
    def topics(self) -> list[str]:
        c = self.config
        return [c.load_reports_topic, c.decisions_topic, c.dead_letters_topic,
                c.ownership_events_topic]  # fmt: skip

    @property
    def group(self) -> str:
        return f"{self.prefix}-controller"

    def publish_round(self) -> float:
        """Publish the next round of four reports with the product's publisher (acks from its
        own configuration), waiting for delivery; the seconds it took."""
        started = time.monotonic()
        reports = _cluster_round(self.names, self.rounds)
        ts = self.t0_ms + self.rounds * MINUTE_MS
        self.publisher.publish_all([(r.broker, encode_report(r)) for r in reports], ts)
        self.reports += reports
        self.rounds += 1
        return time.monotonic() - started

    @property
    def last_ts(self) -> int:
        return self.t0_ms + (self.rounds - 1) * MINUTE_MS

    def alive(self) -> None:
        assert self.job.poll() is None, f"the job exited: see {self.logs / 'stream.log'}"

    def job_caught_up(self) -> bool:
        """The job committed a batch past every report offset the publisher was told of, and
        its progress names the newest round."""
        self.alive()
        done = checkpoint_offsets(self.checkpoint, self.config.load_reports_topic) or {}
        delivered = self.publisher.delivered
        return all(done.get(p, 0) >= o for p, o in delivered.items()) and (
            _progress(self.r, self.prefix)[1] == self.last_ts
        )

    def decisions(self) -> list:
        return [decode_decision(v) for v in _read_values(self.bootstrap,
                                                         self.config.decisions_topic)]  # fmt: skip

    def every_decision_decided(self) -> bool:
        """Each decision on the topic has an outcome and the group committed to the end."""
        store = RedisStore(self.r, self.prefix)
        topic = self.config.decisions_topic
        try:
            if not all(store.outcomes.get(d.id) for d in self.decisions()):
                return False
            end = latest_offsets(self.bootstrap, topic)
            done = group_committed(self.bootstrap, self.group, topic, end)
        except (KafkaException, AssertionError):  # a reader that met the fault: ask again
            return False
        # an empty partition has no committed offset (negative) and nothing to commit
        return all(
            done.get(part, -1) == o or (o == 0 > done.get(part, -1)) for part, o in end.items()
        )

    def decisions_logged(self) -> int:
        """Decisions the job says it published: the most any log line of a batch id names (a
        batch replayed after a failure logs again and publishes the same ids)."""
        text = (self.logs / "stream.log").read_text(errors="replace")
        most: dict[int, int] = {}
        for batch, n in BATCH_LINE.findall(text):
            most[int(batch)] = max(most.get(int(batch), 0), int(n))
        return sum(most.values())

    def restarts(self) -> int:
        path = self.logs / "stream.log"
        return len(RESTART_LINE.findall(path.read_text(errors="replace"))) if path.exists() else 0


def _setup_store(store: RedisStore, now: int) -> list[str]:
    """16 bundles, four per reporting broker, each leased to the broker that reports it."""
    store.create_namespace(NS, 16)
    names = store.get_namespace(NS).bundle_names
    for b in range(4):
        broker = f"broker-{b + 1}:8080"
        store.register_broker(broker, now, HOUR_MS)
        for name in names[b * 4 : b * 4 + 4]:
            store.acquire(name, broker, now, HOUR_MS)
    return names


def _start_controller(p: Pipeline, i: int) -> subprocess.Popen[bytes]:
    argv = ["control", "--redis-url", p.redis_url, "--bootstrap-servers", p.bootstrap,
            "--group", p.group, *set_args(p.knobs)]  # fmt: skip
    return lbctl(argv, p.logs / f"control-{i}.log")


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Pipeline]:
    logs = tmp_path_factory.mktemp("cluster-faults")
    started = time.monotonic()
    cluster = KafkaCluster(tmp_path_factory.mktemp("kafka-cluster"), size=3)
    cluster.start()
    print(f"figure: three-node cluster up in {time.monotonic() - started:.1f} s")
    r = redis.Redis.from_url(redis_url)
    prefix = f"kcf{uuid.uuid4().hex[:6]}"
    knobs: dict[str, object] = {
        "loadBalancerLoadSheddingStrategy": "OverloadShedder",
        "loadBalancerNamespaceBundleMaxMsgRate": 1000,
        "loadBalancerSheddingGracePeriodMinutes": 0,
        "loadBalancerOwnershipLeaseTtlSeconds": 3600,
        "redisKeyPrefix": prefix,
        "loadReportsTopic": f"reports-{prefix}",
        "decisionsTopic": f"dec-{prefix}",
        "deadLettersTopic": f"dead-{prefix}",
        "ownershipEventsTopic": f"ev-{prefix}",
        "topicPartitions": PARTITIONS,
    }
    procs: list[subprocess.Popen[bytes]] = []
    publisher = None
    try:
        config = LoadBalancerConfig(**knobs)
        topics = (config.load_reports_topic, config.decisions_topic, config.dead_letters_topic,
                  config.ownership_events_topic)  # fmt: skip
        # the product's own topic creation, as lbctl run and the controller do it: the topics
        # must get the cluster's replication factor, not one replica
        ensure_pipeline_topics(cluster.bootstrap_servers, config)
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})

        def all_topics_known() -> object:
            # a broker's metadata may lag the controller's topic creation for a moment
            meta = admin.list_topics(timeout=10)
            return meta if set(topics) <= set(meta.topics) else None

        described = wait_for("the new topics in the metadata", all_topics_known, timeout_s=30)
        for topic in topics:
            replicas = {len(p.replicas) for p in described.topics[topic].partitions.values()}
            assert replicas == {3}, f"{topic} has {replicas} replicas per partition, not 3"
        names = _setup_store(RedisStore(r, prefix), int(time.time() * 1000))
        publisher = TimestampedReportPublisher(
            cluster.bootstrap_servers, config.load_reports_topic, flush_timeout_s=90.0
        )
        checkpoint = logs / "ckpt"
        job = lbctl(
            ["stream", "--bootstrap-servers", cluster.bootstrap_servers, "--redis-url",
             redis_url, "--checkpoint", str(checkpoint), "--source", "kafka", "--shards", "2",
             "--trigger-seconds", "1", *set_args(knobs)],
            logs / "stream.log",
        )  # fmt: skip
        procs.append(job)
        p = Pipeline(cluster, r, redis_url, prefix, knobs, names, publisher, checkpoint, logs, job)
        p.controllers = [_start_controller(p, i) for i in range(2)]
        procs += p.controllers
        p.publish_round()
        wait_for("the job's first batch", p.job_caught_up, timeout_s=240)
        print(f"figure: cluster start to the job's first batch {time.monotonic() - started:.1f} s")
        wait_for(
            "both controllers to hold a decisions partition each",
            lambda: (
                sorted(map(sorted, group_assignment(cluster.bootstrap_servers, p.group)))
                == [[0], [1]]
            ),
            timeout_s=60,
        )
        _check_exact(p, "start")
        yield p
    finally:
        for proc in procs:
            stop(proc)
        if publisher is not None:
            publisher.close()
        cluster.stop()


def _check_exact(p: Pipeline, fault: str) -> None:
    """Wait until everything published is processed and decided, then the exact checks."""
    wait_for(f"{fault}: the job to process every report", p.job_caught_up, timeout_s=RECOVER_S)
    wait_for(f"{fault}: every decision decided and its offset committed", p.every_decision_decided,
             timeout_s=RECOVER_S)  # fmt: skip
    _assert_matches_pure(_snapshot(p.r, p.prefix), p.reports, p.config)
    published = p.decisions()
    decisions = first_copies(published)
    assert p.decisions_logged() == len(decisions), "every decision the job made is on the topic"
    store = RedisStore(p.r, p.prefix)
    entries = outcome_entries(p.r, p.prefix)
    order = assert_one_outcome_each_applied_once(store, decisions, entries)
    p.checks += 1
    reference = RedisStore(p.r, f"{p.prefix}-ref{p.checks}")
    assert _setup_store(reference, int(time.time() * 1000)) == p.names
    try:
        assert_store_equals_one_pass(p.r, p.prefix, reference, decisions, order, p.config)
    finally:
        for key in p.r.scan_iter(match=f"{p.prefix}-ref{p.checks}:*", count=1000):
            p.r.delete(key)
    kinds = sorted({store.outcomes.get(i)["outcome"] for i in decisions})
    print(f"figure: {fault}: {p.rounds} rounds, {len(decisions)} decisions "
          f"({len(published) - len(decisions)} re-sent), {len(entries)} outcome entries, "
          f"outcomes {kinds}, job restarts so far {p.restarts()}")  # fmt: skip


def _recover(p: Pipeline, fault: str, fault_at: float) -> float:
    """Publish a round after the fault and time the pipeline's way back: the round delivered
    (the producer found the new leader), the job's batch over it, its decisions decided."""
    decided_before = {d.id for d in p.decisions()}
    sent_s = p.publish_round()
    delivered = time.monotonic() - fault_at
    wait_for(f"{fault}: the job's batch over the round after the fault", p.job_caught_up,
             timeout_s=RECOVER_S)  # fmt: skip
    batch = time.monotonic() - fault_at
    wait_for(f"{fault}: new decisions decided, committed", p.every_decision_decided,
             timeout_s=RECOVER_S)  # fmt: skip
    decided = time.monotonic() - fault_at
    new = len({d.id for d in p.decisions()} - decided_before)
    print(
        f"figure: {fault}: report round delivered +{delivered:.1f} s (publish {sent_s:.1f} s), "
        f"job batch +{batch:.1f} s, {new} new decisions all decided +{decided:.1f} s"
    )
    assert new >= 1, "the round after the fault produced decisions"
    return batch


def _kill_leader_of(p: Pipeline, topic: str, fault: str) -> None:
    ends = latest_offsets(p.bootstrap, topic)
    busiest = max(ends, key=lambda part: ends[part])
    leader = partition_leaders(p.bootstrap, topic)[busiest]
    p.publish_round()  # in flight when the leader dies
    p.cluster.node(leader).kill()
    fault_at = time.monotonic()
    print(f"figure: {fault}: node {leader} (leader of {topic}/{busiest}) SIGKILLed")
    try:
        wait_for(f"{fault}: a new leader", lambda: partition_leaders(p.bootstrap, topic)[busiest]
                 not in (-1, leader), timeout_s=60, step_s=0.1)  # fmt: skip
        print(f"figure: {fault}: new leader elected +{time.monotonic() - fault_at:.1f} s")
        batch_s = _recover(p, fault, fault_at)
    finally:
        p.cluster.restart_node(leader)
    wait_for(f"{fault}: node {leader} back in sync",
             lambda: in_sync_everywhere(p.bootstrap, leader, p.topics), timeout_s=120)  # fmt: skip
    print(f"figure: {fault}: node {leader} back in every ISR +{time.monotonic() - fault_at:.1f} s")
    _check_exact(p, fault)
    assert batch_s < LEADER_KILL_BATCH_S, f"the job's batch came {batch_s:.0f} s after the crash"


def test_a_report_partition_leader_killed_loses_no_report_and_applies_nothing_twice(pipeline):
    _kill_leader_of(pipeline, pipeline.config.load_reports_topic, "report leader kill")


def test_a_decisions_partition_leader_killed_loses_no_decision_and_applies_nothing_twice(
    pipeline,
):
    _kill_leader_of(pipeline, pipeline.config.decisions_topic, "decisions leader kill")


def test_a_rolling_restart_of_every_broker_keeps_the_pipeline_exact(pipeline):
    p = pipeline
    started = time.monotonic()
    for node in p.cluster.nodes:
        p.publish_round()
        t0 = time.monotonic()
        node.stop()  # SIGTERM: Kafka's controlled shutdown moves leadership first
        stopped = time.monotonic() - t0
        p.publish_round()  # written while the node is down
        p.cluster.restart_node(node.node_id)
        wait_for(f"node {node.node_id} back in sync",
                 lambda n=node.node_id: in_sync_everywhere(p.bootstrap, n, p.topics),
                 timeout_s=120)  # fmt: skip
        print(f"figure: rolling restart: node {node.node_id} stopped in {stopped:.1f} s, "
              f"back in every ISR +{time.monotonic() - t0:.1f} s")  # fmt: skip
        p.alive()
    print(f"figure: rolling restart: three nodes in {time.monotonic() - started:.1f} s")
    _recover(p, "rolling restart", started)
    _check_exact(p, "rolling restart")


def test_a_controller_killed_hands_its_partition_to_the_other_in_the_group(pipeline):
    p = pipeline
    live = [c for c in p.controllers if c.poll() is None]
    assert len(live) == 2, "both controllers ran through the broker faults"
    assert sorted(map(sorted, group_assignment(p.bootstrap, p.group))) == [[0], [1]]
    p.publish_round()  # its decisions reach the controller about to die
    kill_group(live[0])
    live[0].wait(10)
    fault_at = time.monotonic()
    print("figure: controller kill: one of two controllers SIGKILLed")
    wait_for("the survivor to hold both partitions",
             lambda: [sorted(a) for a in group_assignment(p.bootstrap, p.group)] == [[0, 1]],
             timeout_s=60, step_s=0.2)  # fmt: skip
    print(f"figure: controller kill: survivor holds both partitions "
          f"+{time.monotonic() - fault_at:.1f} s")  # fmt: skip
    _recover(p, "controller kill", fault_at)
    assert live[1].poll() is None, f"the survivor exited: see {p.logs}"
    _check_exact(p, "controller kill")


def test_a_broker_stalled_past_the_session_timeout_then_resumed_keeps_the_pipeline_exact(
    pipeline,
):
    p = pipeline
    coordinator = group_coordinator(p.bootstrap, p.group)
    node = p.cluster.node(coordinator)
    p.publish_round()
    node.pause()
    fault_at = time.monotonic()
    print(f"figure: stall: node {coordinator} (the controllers' group coordinator) SIGSTOPped")
    # a round goes out during the stall from another thread: the producer may wait on the
    # stalled node (a leader) while the stall still ends on time
    failed: list[BaseException] = []

    def send() -> None:
        try:
            p.publish_round()
        except BaseException as e:  # re-raised in the test's thread below
            failed.append(e)

    sending = threading.Thread(target=send, daemon=True)
    try:
        sending.start()
        time.sleep(STALL_S)
    finally:
        node.resume()
    print(f"figure: stall: SIGCONT after {time.monotonic() - fault_at:.1f} s")
    sending.join(RECOVER_S)
    assert not sending.is_alive() and not failed, f"the round sent in the stall: {failed}"
    since = time.monotonic() - fault_at
    print(f"figure: stall: the round sent during the stall delivered +{since:.1f} s")
    _recover(p, "stall", fault_at)
    wait_for("the stalled node back in sync",
             lambda: in_sync_everywhere(p.bootstrap, coordinator, p.topics),
             timeout_s=120)  # fmt: skip
    print(
        f"figure: stall: node {coordinator} back in every ISR +{time.monotonic() - fault_at:.1f} s"
    )
    _check_exact(p, "stall")
    assert all(c.poll() is None for c in p.controllers[1:]), "the controller kept running"
