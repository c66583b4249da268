"""Apache Kafka brokers in KRaft mode, run from the cached jars (``infra.jars``) on loopback.

Why Apache Kafka itself: it is what operators run, and a Kafka-protocol stand-in answers some
requests differently. Each node is one JVM in combined mode (``process.roles=broker,controller``)
with a PLAINTEXT (or configured) client listener and a CONTROLLER listener, both on free
loopback ports, its log directories under the given folder, a small heap, and fewer threads than
Kafka's defaults (two cores run the broker beside Spark and Redis). Storage is formatted once
with Kafka's own ``kafka.tools.StorageTool`` and a fresh cluster id; a restarted node keeps its
log, so topics survive a restart as on a real cluster.

``KafkaCluster`` runs one node (the embedded default: replication factor 1 for the internal
topics) or several (a real quorum for fault tests: replication, leader loss, rolling restarts).
Nodes are spawned first and waited for afterwards, because a quorum of three forms only once a
majority runs. Readiness is a metadata response from the node's client listener listing the
node itself.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from confluent_kafka.admin import AdminClient

from infra import jars
from infra.process import free_port, log_tail, port_accepts, spawn, terminate

__all__ = ["KafkaCluster", "KafkaNode", "KafkaStartError", "java_binary"]

HOST = "127.0.0.1"
DEFAULT_HEAP = "-Xmx512m"
_LOG4J2 = """\
status = error
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = OUT
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = INFO
"""


class KafkaStartError(RuntimeError):
    """A Kafka node could not be formatted or did not become ready in time."""


def java_binary() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise KafkaStartError("no 'java' on PATH: Apache Kafka needs Java 17")
    return found


def new_cluster_id() -> str:
    """A random Kafka cluster id (a UUID in URL-safe base64, 22 characters)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):  # Kafka's own generator avoids these (CLI parsing)
            return text


class KafkaNode:
    """One KRaft node (broker and controller) of a ``KafkaCluster``."""

    def __init__(
        self,
        node_id: int,
        data_dir: Path,
        *,
        port: int,
        controller_port: int,
        die_with_parent: bool = True,
    ) -> None:
        self.node_id = node_id
        self.data_dir = Path(data_dir)
        self.port = port
        self.controller_port = controller_port
        self.die_with_parent = die_with_parent
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.data_dir / "kafka.log"

    @property
    def config_path(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def bootstrap_servers(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def write_config(self, properties: Mapping[str, str]) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        text = "".join(f"{k}={v}\n" for k, v in properties.items())
        self.config_path.write_text(text, encoding="utf-8")
        (self.data_dir / "log4j2.properties").write_text(_LOG4J2, encoding="utf-8")

    def _java(self, main_class: str, *args: str, heap: str) -> list[str]:
        return [
            java_binary(),
            heap,
            "-Xss1m",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.data_dir}",
            "-cp",
            jars.classpath("kafka"),
            main_class,
            *args,
        ]

    def format(self, cluster_id: str) -> None:
        """``kafka-storage format`` unless the log directory is formatted already."""
        if (self.data_dir / "logs" / "meta.properties").exists():
            return
        argv = self._java(
            "kafka.tools.StorageTool",
            "format",
            "--cluster-id",
            cluster_id,
            "--config",
            str(self.config_path),
            "--ignore-formatted",
            heap="-Xmx256m",
        )
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise KafkaStartError(
                f"formatting Kafka node {self.node_id} failed: "
                f"{(proc.stdout + proc.stderr).strip()[-2000:]}"
            )

    def spawn(self, heap: str = DEFAULT_HEAP) -> None:
        if self.running:
            return
        argv = self._java("kafka.Kafka", str(self.config_path), heap=heap)
        self._proc = spawn(argv, self.log_path, die_with_parent=self.die_with_parent)

    def answers(
        self, timeout_s: float = 3.0, client_config: Mapping[str, str] | None = None
    ) -> bool:
        """True when this node's listener answers a metadata request that lists it."""
        if not port_accepts(HOST, self.port):
            return False
        conf = {"bootstrap.servers": self.bootstrap_servers, "log_level": 0}
        conf.update(client_config or {})
        try:
            metadata = AdminClient(conf).list_topics(timeout=timeout_s)
        except Exception:
            return False
        return self.node_id in metadata.brokers

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM (Kafka's controlled shutdown), SIGKILL after ``timeout_s``; idempotent."""
        terminate(self._proc, timeout_s)
        self._proc = None

    def kill(self) -> None:
        """SIGKILL at once: a crash, no controlled shutdown."""
        self.stop(timeout_s=0)

    def pause(self) -> None:
        if self._proc is not None:
            os.kill(self._proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self._proc is not None:
            os.kill(self._proc.pid, signal.SIGCONT)


class KafkaCluster:
    """``size`` KRaft nodes on loopback; ``size=1`` is the embedded single broker.

    ``listener_overrides`` replaces the client listener (``name -> (protocol, extra
    properties)``) for security tests; by default the client listener is PLAINTEXT.
    """

    def __init__(
        self,
        log_dir: Path,
        size: int = 1,
        *,
        broker_properties: Mapping[str, str] | None = None,
        client_config: Mapping[str, str] | None = None,
        die_with_parent: bool = True,
        start_timeout_s: float = 60.0,
        heap: str = DEFAULT_HEAP,
    ) -> None:
        if size < 1:
            raise ValueError("a Kafka cluster needs at least one node")
        self.log_dir = Path(log_dir)
        self.size = size
        self.cluster_id = new_cluster_id()
        self.broker_properties = dict(broker_properties or {})
        self.client_config = dict(client_config or {})
        self.start_timeout_s = start_timeout_s
        self.heap = heap
        self.nodes = [
            KafkaNode(
                i + 1,
                self.log_dir / f"kafka-{i + 1}",
                port=free_port(),
                controller_port=free_port(),
                die_with_parent=die_with_parent,
            )
            for i in range(size)
        ]
        self._formatted = False

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(n.bootstrap_servers for n in self.nodes)

    @property
    def port(self) -> int:
        return self.nodes[0].port

    @property
    def pid(self) -> int | None:
        return self.nodes[0].pid

    @property
    def running(self) -> bool:
        return all(n.running for n in self.nodes)

    @property
    def log_path(self) -> Path:
        return self.nodes[0].log_path

    def node(self, node_id: int) -> KafkaNode:
        return self.nodes[node_id - 1]

    def _properties(self, node: KafkaNode) -> dict[str, str]:
        replicas = str(min(3, self.size))
        min_isr = str(min(2, self.size))
        voters = ",".join(f"{n.node_id}@{HOST}:{n.controller_port}" for n in self.nodes)
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://{HOST}:{node.port},CONTROLLER://{HOST}:{node.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{HOST}:{node.port}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(node.data_dir / "logs"),
            "offsets.topic.replication.factor": replicas,
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": min_isr,
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": min_isr,
            "default.replication.factor": replicas,
            "min.insync.replicas": min_isr,
            "group.initial.rebalance.delay.ms": "0",
            "num.network.threads": "2",
            "num.io.threads": "2",
            "background.threads": "2",
            "num.recovery.threads.per.data.dir": "1",
            "num.replica.fetchers": "1",
            "log.segment.bytes": str(64 * 1024 * 1024),
            "log.cleaner.dedupe.buffer.size": str(8 * 1024 * 1024),
        }
        for key, value in self.broker_properties.items():
            props[key] = value.replace("{port}", str(node.port)).replace(
                "{node_id}", str(node.node_id)
            )
        return props

    def start(self) -> None:
        """Format (first time), spawn every node, then wait until each answers."""
        for node in self.nodes:
            node.write_config(self._properties(node))
        if not self._formatted:
            for node in self.nodes:
                node.format(self.cluster_id)
            self._formatted = True
        for node in self.nodes:
            node.spawn(self.heap)
        for node in self.nodes:
            self._wait_ready(node)

    def _wait_ready(self, node: KafkaNode) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if node._proc is not None and node._proc.poll() is not None:
                break
            if node.answers(client_config=self.client_config):
                return
            time.sleep(0.2)
        code = node._proc.poll() if node._proc is not None else None
        why = (
            f"exited with code {code}"
            if code is not None
            else f"no answer in {self.start_timeout_s:.0f}s"
        )
        self.stop()
        raise KafkaStartError(
            f"Kafka node {node.node_id} on {node.bootstrap_servers} {why}\n"
            f"--- {node.log_path} ---\n{log_tail(node.log_path)}"
        )

    def restart_node(self, node_id: int, *, wait: bool = True) -> None:
        """Start a stopped node again on its ports and log (after ``stop``/``kill``)."""
        node = self.node(node_id)
        node.spawn(self.heap)
        if wait:
            self._wait_ready(node)

    def stop(self, timeout_s: float = 20.0) -> None:
        # stop brokers that are not the last voter first, so controlled shutdowns can complete
        for node in reversed(self.nodes):
            with contextlib.suppress(Exception):
                node.resume()
            node.stop(timeout_s)

    def __enter__(self) -> KafkaCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
