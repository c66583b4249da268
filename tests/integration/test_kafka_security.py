"""Security end to end on a real Apache Kafka broker and a real Redis: SASL/SCRAM-SHA-512
over TLS with ACLs, Redis ACL users over TLS, and what a wrong password looks like.

One secured single-node cluster for the module (``KafkaCluster(security=...)``: a SASL_SSL
client listener and nothing else, ``StandardAuthorizer``, SCRAM users made at format time)
and one Redis that speaks TLS only with an ACL user and the default user off. Each role has
its own principal with only the ACLs its job needs; the product's processes run as users run
them (``python -m lbctl.main`` with ``LB_*`` knobs), and every byte they print is searched for
the passwords.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from infra.embedded import EmbeddedRedis, redis_supports_tls
from infra.kafka_auth import KafkaAuthError, java_client_settings
from infra.kafka_server import KafkaCluster, KafkaSecurity
from infra.topics import ensure_topics, kafka_client_config
from loadbalance.config import load_config
from tests.integration.tls_certs import Pem, issue, make_ca

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
REPORTS, DECISIONS, DEAD, EVENTS = (
    "lb-load-reports",
    "lb-decisions",
    "lb-dead-letters",
    "lb-ownership-events",
)
ROLES = ("admin", "agent", "job", "controller", "monitor", "operator")
PASSWORDS = {role: f"{role}-Scram-{i}f3a9c" for i, role in enumerate(ROLES)}
WRONG = "wrong-Guess-77d1e"
REDIS_USER, REDIS_PASSWORD = "lb-app", "redis-Acl-5b2e8"
SECRETS = (*PASSWORDS.values(), WRONG, REDIS_PASSWORD)
NAMESPACE = "acme/secure"

_R, _W, _D = AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE
# principal -> (resource type, name, operation): each role's job and nothing else
GRANTS = {
    "agent": [(ResourceType.TOPIC, REPORTS, op) for op in (_W, _D)],
    "job": [(ResourceType.TOPIC, REPORTS, op) for op in (_R, _D)]
    + [(ResourceType.TOPIC, t, op) for t in (DECISIONS, DEAD) for op in (_W, _D)],
    "controller": [(ResourceType.TOPIC, DECISIONS, op) for op in (_R, _D)]
    + [(ResourceType.GROUP, "lb-controller", _R)]
    + [(ResourceType.TOPIC, EVENTS, op) for op in (_R, _W, _D)],
    "monitor": [(ResourceType.TOPIC, REPORTS, _D)],
    "operator": [(ResourceType.TOPIC, EVENTS, op) for op in (_W, _D)],
}


@dataclass
class Secured:
    kafka: KafkaCluster
    security: KafkaSecurity
    redis: EmbeddedRedis
    ca: Pem
    tmp: Path

    def kafka_settings(self, role: str, password: str | None = None) -> dict[str, str]:
        """librdkafka settings of ``role`` (what the knobs below produce)."""
        return {
            "bootstrap.servers": self.kafka.bootstrap_servers,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": role,
            "sasl.password": password or PASSWORDS[role],
            "ssl.ca.location": str(self.ca.cert),
        }

    def env(self, role: str, password: str | None = None) -> dict[str, str]:
        """``LB_*`` knobs: Kafka as ``role``, Redis as the ACL user over TLS."""
        return {
            "LB_kafkaBootstrapServers": self.kafka.bootstrap_servers,
            "LB_kafkaSecurityProtocol": "SASL_SSL",
            "LB_kafkaSaslMechanism": "SCRAM-SHA-512",
            "LB_kafkaSaslUsername": role,
            "LB_kafkaSaslPassword": password or PASSWORDS[role],
            "LB_kafkaSslCaLocation": str(self.ca.cert),
            "LB_redisUrl": self.redis_url,
            "LB_redisUsername": REDIS_USER,
            "LB_redisPassword": REDIS_PASSWORD,
            "LB_redisSslCaCerts": str(self.ca.cert),
        }

    @property
    def redis_url(self) -> str:
        return f"rediss://127.0.0.1:{self.redis.port}/0"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    if not redis_supports_tls():
        pytest.skip("redis-server has no TLS (install Debian's redis-server)")
    tmp = tmp_path_factory.mktemp("kafka-security")
    ca = make_ca(tmp / "tls")
    broker, server = issue(ca, "broker"), issue(ca, "redis")
    security = KafkaSecurity(ca.cert, broker.cert, broker.key, scram_users=PASSWORDS)
    redis_server = EmbeddedRedis(
        tmp / "redis",
        username=REDIS_USER,
        password=REDIS_PASSWORD,
        tls_cert_file=server.cert,
        tls_key_file=server.key,
        tls_ca_file=ca.cert,
    )
    with KafkaCluster(tmp / "kafka", security=security) as kafka, redis_server:
        admin_conf = {"bootstrap.servers": kafka.bootstrap_servers, **security.admin_config}
        ensure_topics(
            kafka.bootstrap_servers, dict.fromkeys((REPORTS, DECISIONS, DEAD, EVENTS), 2),
            security.admin_config,
        )  # fmt: skip
        bindings = [
            AclBinding(
                rtype,
                name,
                ResourcePatternType.LITERAL,
                f"User:{role}",
                "*",
                op,
                AclPermissionType.ALLOW,
            )
            for role, grants in GRANTS.items()
            for rtype, name, op in grants
        ]
        admin = AdminClient(admin_conf)  # kept alive until the futures are done
        for future in admin.create_acls(bindings).values():
            future.result(timeout=30)
        any_acl = AclBindingFilter(
            ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
            AclOperation.ANY, AclPermissionType.ANY,
        )  # fmt: skip
        deadline = time.monotonic() + 30  # the broker's authorizer applies them from its log
        while len(admin.describe_acls(any_acl).result(timeout=10)) < len(bindings):
            assert time.monotonic() < deadline, "the ACLs never reached the authorizer"
            time.sleep(0.2)
        yield Secured(kafka, security, redis_server, ca, tmp)


def _lbctl(
    *argv: str, env: dict[str, str], timeout: float = 120
) -> tuple[subprocess.CompletedProcess[str], float]:
    """The real CLI in a child process at DEBUG (the most it ever logs); output and wall time."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LB_")}
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "lbctl.main", "--log-level", "DEBUG", *argv],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done, time.monotonic() - start


def _no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"secret {secret[:6]}... leaked:\n{text[-3000:]}"


def _assert_refused_clearly(done: subprocess.CompletedProcess[str], wall_s: float) -> None:
    """A wrong password: exit 1 within seconds, one line naming the refusal, no traceback."""
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert wall_s < 15, f"took {wall_s:.1f}s: {out[-2000:]}"
    assert "Traceback" not in out, out
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("lbctl: Kafka refused")]
    assert len(lines) == 1, out
    assert "SASL authentication error" in lines[0] and "SCRAM-SHA-512" in lines[0], lines
    _no_secret(out)


def _count(secured: Secured, topic: str) -> int:
    """Records on ``topic`` (end minus start offsets), read as the super user."""
    conf = kafka_client_config(
        secured.kafka.bootstrap_servers, {**secured.security.admin_config, "group.id": "count"}
    )
    consumer = Consumer(conf)
    try:
        total = 0
        for p in (0, 1):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            total += high - low
        return total
    finally:
        consumer.close()


def test_each_principal_does_its_own_job_and_is_refused_the_rest(secured: Secured) -> None:
    agent = Producer(
        kafka_client_config(secured.kafka.bootstrap_servers, secured.kafka_settings("agent"))
    )
    errors: list[KafkaError] = []
    agent.produce(REPORTS, b"{}", key=b"acl-probe", on_delivery=lambda e, _m: errors.append(e))
    assert agent.flush(15) == 0 and errors == [None], errors
    for role, topic in (("agent", DECISIONS), ("monitor", REPORTS), ("operator", REPORTS)):
        consumer = Consumer(
            kafka_client_config(
                secured.kafka.bootstrap_servers,
                {**secured.kafka_settings(role), "group.id": f"{role}-probe",
                 "auto.offset.reset": "earliest"},
            )
        )  # fmt: skip
        consumer.assign([TopicPartition(topic, 0, 0)])
        refused = None
        deadline = time.monotonic() + 15
        while refused is None and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is not None:
                refused = msg.error().code()
        consumer.close()
        assert refused in (
            KafkaError.TOPIC_AUTHORIZATION_FAILED,
            KafkaError.GROUP_AUTHORIZATION_FAILED,
        ), (role, topic, refused)
    for role, topic in (("monitor", REPORTS), ("job", EVENTS), ("operator", DECISIONS)):
        producer = Producer(
            kafka_client_config(secured.kafka.bootstrap_servers, secured.kafka_settings(role))
        )
        got: list[KafkaError] = []
        producer.produce(topic, b"x", on_delivery=lambda e, _m, got=got: got.append(e))
        producer.flush(15)
        assert got and got[0] is not None, (role, topic)
        assert got[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, (role, topic, got)


def test_a_wrong_password_raises_kafka_auth_error_at_once_in_a_library_client(
    secured: Secured,
) -> None:
    start = time.monotonic()
    with pytest.raises(KafkaAuthError) as e:
        ensure_topics(
            secured.kafka.bootstrap_servers, {REPORTS: 2},
            {k: v for k, v in secured.kafka_settings("agent", WRONG).items()
             if k != "bootstrap.servers"},
        )  # fmt: skip
    assert time.monotonic() - start < 10
    assert "SASL authentication error" in str(e.value)
    _no_secret(str(e.value) + repr(e.value))


def test_the_connector_gets_a_jaas_line_built_from_the_knobs() -> None:
    config, _ = load_config(
        overrides={
            "kafkaSecurityProtocol": "SASL_SSL",
            "kafkaSaslMechanism": "SCRAM-SHA-512",
            "kafkaSaslUsername": "job",
            "kafkaSaslPassword": 'pa"ss\\word',
            "kafkaSslCaLocation": "/ca.pem",
        }
    )
    java = java_client_settings(config.kafka_client_settings())
    assert java == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="job" password="pa\\"ss\\\\word";',
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": "/ca.pem",
    }


def test_agent_stream_controller_monitor_and_a_verb_run_secured_end_to_end(
    secured: Secured,
) -> None:
    """The pipeline, each process as its own principal over SASL_SSL and Redis over TLS with
    the ACL user: agents publish, the job (Spark's connector) reads them into Redis, the monitor
    reads Redis and the report topic's offsets, a split publishes an ownership event, the
    controller consumes a decision with its group. Nothing printed holds a password."""
    outputs: list[str] = []
    done, _ = _lbctl(
        "namespaces", "create", NAMESPACE, "--bundles", "4", env=secured.env("operator")
    )
    outputs.append(done.stdout + done.stderr)
    assert done.returncode == 0, outputs[-1]
    before = _count(secured, REPORTS)
    for broker in ("b1", "b2"):
        done, _ = _lbctl(
            "agent", "--once", "--broker-id", broker, env=secured.env("agent"),
        )  # fmt: skip
        outputs.append(done.stdout + done.stderr)
        assert done.returncode == 0, outputs[-1]
    assert _count(secured, REPORTS) == before + 2

    checkpoint = secured.tmp / "checkpoint"
    done, _ = _lbctl(
        "stream", "--available-now", "--source", "kafka", "--checkpoint", str(checkpoint),
        "--starting-offsets", "earliest", env=secured.env("job"), timeout=400,
    )  # fmt: skip
    outputs.append(done.stdout + done.stderr)
    assert done.returncode == 0, outputs[-1][-4000:]
    assert "with the kafka source" in outputs[-1], outputs[-1][-3000:]

    done, _ = _lbctl(
        "monitor", "--once", "--json", "--checkpoint", str(checkpoint),
        env=secured.env("monitor"),
    )  # fmt: skip
    outputs.append(done.stdout + done.stderr)
    assert done.returncode == 0, outputs[-1]
    doc = json.loads(done.stdout)
    assert {"b1", "b2"} <= {b["broker"] for b in doc["brokers"]}, doc["brokers"]
    assert sum(doc["stream"]["endOffsets"].values()) == _count(secured, REPORTS), doc["stream"]
    assert doc["stream"]["processedOffsets"] == doc["stream"]["endOffsets"], doc["stream"]

    events_before = _count(secured, EVENTS)
    done, _ = _lbctl(
        "namespaces", "split-bundle", NAMESPACE, "--bundle", "0x00000000_0x40000000",
        env=secured.env("operator"),
    )  # fmt: skip
    outputs.append(done.stdout + done.stderr)
    assert done.returncode == 0, outputs[-1]
    assert _count(secured, EVENTS) == events_before + 1, "the split event was published"

    decision = json.dumps({"kind": "unload", "id": "not-a-valid-decision"}).encode()
    admin = Producer(
        kafka_client_config(secured.kafka.bootstrap_servers, secured.kafka_settings("admin"))
    )
    admin.produce(DECISIONS, decision, partition=0)
    assert admin.flush(15) == 0
    done, _ = _lbctl(
        "control", "--max-messages", "1", "--no-auto-recover", env=secured.env("controller"),
        timeout=90,
    )  # fmt: skip
    outputs.append(done.stdout + done.stderr)
    assert done.returncode == 0, outputs[-1]
    committed = Consumer(
        kafka_client_config(
            secured.kafka.bootstrap_servers,
            {**secured.security.admin_config, "group.id": "lb-controller"},
        )
    )
    try:
        offsets = committed.committed([TopicPartition(DECISIONS, 0)], timeout=10)
    finally:
        committed.close()
    assert offsets[0].offset >= 1, offsets
    for text in outputs:
        _no_secret(text)


@pytest.mark.parametrize(
    "argv",
    [
        ("agent", "--once", "--broker-id", "b9"),
        ("control", "--max-messages", "1", "--no-auto-recover"),
        ("monitor", "--once", "--json"),
        ("namespaces", "split-bundle", "acme/wrongpw", "--bundle", "0x00000000_0x80000000"),
        ("stream", "--available-now", "--source", "kafka"),
    ],
    ids=["agent", "control", "monitor", "split-bundle", "stream"],
)
def test_a_wrong_kafka_password_ends_each_command_with_one_clear_line(
    secured: Secured, argv: tuple[str, ...]
) -> None:
    role = {"agent": "agent", "control": "controller", "monitor": "monitor",
            "namespaces": "operator", "stream": "job"}[argv[0]]  # fmt: skip
    extra = ["--checkpoint", str(secured.tmp / "cp-wrong")] if argv[0] == "stream" else []
    if argv[0] == "namespaces":  # Redis only: the split then fails on its ownership event
        made, _ = _lbctl("namespaces", "create", argv[2], "-b", "2", env=secured.env(role))
        assert made.returncode == 0, made.stderr
    done, wall = _lbctl(*argv, *extra, env=secured.env(role, WRONG))
    if argv[0] == "monitor":  # it keeps showing Redis, and says why Kafka is missing
        out = done.stdout + done.stderr
        assert done.returncode == 0 and wall < 15 and "Traceback" not in out, out
        lag_error = json.loads(done.stdout)["stream"]["lagError"]
        assert "Kafka refused the connection" in lag_error, lag_error
        assert "SASL authentication error" in lag_error, lag_error
        _no_secret(out)
        return
    _assert_refused_clearly(done, wall)


def test_a_refused_password_is_not_retried_as_a_transient_kafka_problem() -> None:
    assert not issubclass(KafkaAuthError, KafkaException)
