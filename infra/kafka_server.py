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

Security (``KafkaSecurity``): the client listener can instead require SASL_SSL with
SCRAM-SHA-512 or SSL with client certificates, with Kafka's ``StandardAuthorizer`` on. The
choices, and why:

* There is no PLAINTEXT client listener at all: every client, the readiness probe included,
  goes through the secured one, so a test that passes proves the secured path. The probe and
  inter-broker traffic use the super user (``KafkaSecurity.admin_config``).
* SCRAM users are written into the bootstrap metadata when the storage is formatted
  (``kafka-storage format --add-scram``), so they exist before the first client connects and
  no unauthenticated admin request is ever needed.
* The KRaft CONTROLLER listener stays PLAINTEXT on loopback; a broker reaches its controller
  there as ``User:ANONYMOUS``, which therefore is a super user. That is safe only because no
  client listener can yield ``ANONYMOUS``: SASL gives the SASL user, and SSL is only offered
  with ``ssl.client.auth=required`` (the certificate's CN is the principal).
* Keys and certificates are PEM files (``ssl.keystore.type=PEM``), no JKS.
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
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka.admin import AdminClient

from infra import jars
from infra.process import StartStop, free_ports, log_tail, port_accepts, spawn, terminate

__all__ = ["KafkaCluster", "KafkaNode", "KafkaSecurity", "KafkaStartError", "java_binary"]

HOST = "127.0.0.1"
DEFAULT_HEAP = "-Xmx512m"
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
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


SECURE_LISTENER = "SECURE"


@dataclass(frozen=True)
class KafkaSecurity:
    """A secured client listener for ``KafkaCluster`` (see the module docstring).

    ``protocol``: ``SASL_SSL`` (SCRAM, ``mechanism``) or ``SSL`` (client certificates
    required; the principal is the certificate's CN). ``ca_file`` signs every certificate;
    ``cert_file``/``key_file`` are the brokers' (PEM, the key unencrypted PKCS#8, the
    certificate valid for ``127.0.0.1``); with ``SSL`` the brokers present them as clients too,
    so their CN (``broker_principal``) is a super user. ``scram_users`` (name -> password) are
    created at format time and must include ``super_user``.
    """

    ca_file: Path
    cert_file: Path
    key_file: Path
    protocol: str = "SASL_SSL"
    mechanism: str = "SCRAM-SHA-512"
    scram_users: Mapping[str, str] = field(default_factory=dict)
    super_user: str = "admin"
    broker_principal: str = "broker"

    def __post_init__(self) -> None:
        if self.protocol not in ("SASL_SSL", "SSL"):
            raise ValueError(f"protocol must be SASL_SSL or SSL, got {self.protocol!r}")
        if self.protocol == "SASL_SSL" and self.super_user not in self.scram_users:
            raise ValueError("the super user needs a SCRAM password in scram_users")
        for name, password in self.scram_users.items():
            if not name or any(c in name + password for c in ',[]="\\\n'):
                raise ValueError(f"SCRAM user {name!r}: name or password has a reserved character")

    @property
    def super_users(self) -> str:
        """``super.users``: the admin, the brokers' own principal, and ``ANONYMOUS`` for the
        loopback CONTROLLER listener (no client listener yields it)."""
        return ";".join(f"User:{p}" for p in (self.super_user, self.broker_principal, "ANONYMOUS"))

    @property
    def admin_config(self) -> dict[str, str]:
        """librdkafka settings of the super user: the readiness probe and test set-up."""
        conf = {"security.protocol": self.protocol, "ssl.ca.location": str(self.ca_file)}
        if self.protocol == "SASL_SSL":
            conf.update(
                {
                    "sasl.mechanism": self.mechanism,
                    "sasl.username": self.super_user,
                    "sasl.password": self.scram_users[self.super_user],
                }
            )
        else:
            conf.update(
                {
                    "ssl.certificate.location": str(self.cert_file),
                    "ssl.key.location": str(self.key_file),
                }
            )
        return conf

    def scram_arguments(self) -> list[str]:
        """``kafka-storage format`` arguments creating the SCRAM users."""
        if self.protocol != "SASL_SSL":
            return []
        args: list[str] = []
        for name, password in self.scram_users.items():
            args += ["--add-scram", f"{self.mechanism}=[name={name},password={password}]"]
        return args

    def broker_properties(self, keystore: Path) -> dict[str, str]:
        """The listener, TLS, SASL and authorizer settings (``keystore``: key + chain, PEM)."""
        name = SECURE_LISTENER.lower()
        props = {
            "listener.security.protocol.map": (
                f"{SECURE_LISTENER}:{self.protocol},CONTROLLER:PLAINTEXT"
            ),
            "inter.broker.listener.name": SECURE_LISTENER,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_file),
            "ssl.endpoint.identification.algorithm": "https",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": self.super_users,
            "allow.everyone.if.no.acl.found": "false",
        }
        if self.protocol == "SASL_SSL":
            password = self.scram_users[self.super_user]
            props.update(
                {
                    "sasl.enabled.mechanisms": self.mechanism,
                    "sasl.mechanism.inter.broker.protocol": self.mechanism,
                    f"listener.name.{name}.{self.mechanism.lower()}.sasl.jaas.config": (
                        "org.apache.kafka.common.security.scram.ScramLoginModule required "
                        f'username="{self.super_user}" password="{password}";'
                    ),
                }
            )
        else:
            props.update(
                {
                    "ssl.client.auth": "required",
                    "ssl.principal.mapping.rules": "RULE:^CN=([^,]+).*$/$1/,DEFAULT",
                }
            )
        return props


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

    def format(self, cluster_id: str, extra_args: list[str] | None = None) -> None:
        """``kafka-storage format`` unless the log directory is formatted already.

        ``extra_args``: more format arguments, such as ``--add-scram`` for the SCRAM users
        (their passwords are never quoted in the error)."""
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
            *(extra_args or []),
            heap="-Xmx256m",
        )
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            text = (proc.stdout + proc.stderr).strip()[-2000:]
            for arg in extra_args or []:
                text = text.replace(arg, "<format argument>")
            raise KafkaStartError(f"formatting Kafka node {self.node_id} failed: {text}")

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
        """SIGKILL at once: a crash, no controlled shutdown (no SIGTERM first, which would
        start Kafka's shutdown hook), then reap the process."""
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=30)
        self.stop()

    def pause(self) -> None:
        if self._proc is not None:
            os.kill(self._proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self._proc is not None:
            os.kill(self._proc.pid, signal.SIGCONT)


class KafkaCluster(StartStop):
    """``size`` KRaft nodes on loopback; ``size=1`` is the embedded single broker.

    By default the client listener is PLAINTEXT. ``security`` makes it a secured listener with
    ACLs (``KafkaSecurity``); the readiness probe then logs in as its super user unless
    ``client_config`` says otherwise. ``broker_properties`` are applied last, over either.
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
        security: KafkaSecurity | None = None,
    ) -> None:
        if size < 1:
            raise ValueError("a Kafka cluster needs at least one node")
        self.log_dir = Path(log_dir)
        self.size = size
        self.cluster_id = new_cluster_id()
        self.broker_properties = dict(broker_properties or {})
        self.security = security
        if client_config is None and security is not None:
            client_config = security.admin_config
        self.client_config = dict(client_config or {})
        self.start_timeout_s = start_timeout_s
        self.heap = heap
        ports = free_ports(2 * size)  # distinct: nodes' ports are bound only when they start
        self.nodes = [
            KafkaNode(
                i + 1,
                self.log_dir / f"kafka-{i + 1}",
                port=ports[2 * i],
                controller_port=ports[2 * i + 1],
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
            # Retention is judged by record timestamps, and the simulator and the tests stamp
            # reports with virtual or fixed past times: with Kafka's 7-day default their
            # segments would be deleted within minutes. Size, not age, bounds these logs.
            "log.retention.ms": "-1",
            # Kafka 4 rejects a record stamped more than an hour ahead of the broker's clock
            # (log.message.timestamp.after.max.ms); the simulator's virtual time runs 30x
            # ahead, so a demo run longer than two minutes would have every report refused.
            "log.message.timestamp.after.max.ms": str(2**63 - 1),
            # Reports of large brokers pass Kafka's 1 MB default; the product's topics ask for
            # what maxReportBytes needs (infra.config_loading), a test's topics get this much
            "message.max.bytes": str(MAX_MESSAGE_BYTES),
            "replica.fetch.max.bytes": str(MAX_MESSAGE_BYTES),
            "log.retention.bytes": str(1024 * 1024 * 1024),
            "log.cleaner.dedupe.buffer.size": str(8 * 1024 * 1024),
        }
        if self.security is not None:
            listener = SECURE_LISTENER
            props["listeners"] = (
                f"{listener}://{HOST}:{node.port},CONTROLLER://{HOST}:{node.controller_port}"
            )
            props["advertised.listeners"] = f"{listener}://{HOST}:{node.port}"
            props.update(self.security.broker_properties(self._keystore_path()))
        for key, value in self.broker_properties.items():
            props[key] = value.replace("{port}", str(node.port)).replace(
                "{node_id}", str(node.node_id)
            )
        return props

    def _keystore_path(self) -> Path:
        return self.log_dir / "broker-keystore.pem"

    def _write_keystore(self) -> None:
        """The brokers' PEM keystore: Kafka wants the key and its chain in one file."""
        assert self.security is not None
        path = self._keystore_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        key = Path(self.security.key_file).read_text(encoding="ascii")
        chain = Path(self.security.cert_file).read_text(encoding="ascii")
        path.write_text(key.rstrip("\n") + "\n" + chain, encoding="ascii")
        path.chmod(0o600)

    def start(self) -> None:
        """Format (first time), spawn every node, then wait until each answers."""
        if self.security is not None:
            self._write_keystore()
        for node in self.nodes:
            node.write_config(self._properties(node))
        if not self._formatted:
            extra = self.security.scram_arguments() if self.security is not None else []
            for node in self.nodes:
                node.format(self.cluster_id, extra)
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
