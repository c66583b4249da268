"""Redis AUTH and ACL end to end, and secrets kept out of ``config show``, logs and errors.

Two embedded Redis servers of our own: one with ``requirepass`` and one with an ACL user and
the default user switched off (how a managed Redis usually looks). The store and the CLI must
work with the right credentials, whether they come in the URL or in the ``redisUsername`` /
``redisPassword`` knobs; with wrong ones they must fail with an authentication error whose text,
like everything the CLI prints or logs, holds no secret.
"""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from confluent_kafka import KafkaError, Producer

from infra.client_logging import KafkaErrorReporter, client_logger
from infra.embedded import EmbeddedRedis
from infra.kafka_auth import KafkaAuthError
from infra.redaction import SecretFilter, install_secret_filter, redact_text
from infra.topics import kafka_client_config
from loadbalance.config import load_config
from metadata_store.ownership_redis import RedisStore

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "pw-Requirepass-7f3a"
ACL_USER = "lbctl-app"
ACL_PASSWORD = "acl-S3cret-91c2"
WRONG = "wrong-Guess-55e0"
SASL_PASSWORD = "sasl-Secret-2b8d"
KEY_PASSWORD = "sslkey-Secret-4e11"
ALL_SECRETS = (PASSWORD, ACL_PASSWORD, WRONG, SASL_PASSWORD, KEY_PASSWORD)


@pytest.fixture(scope="module")
def auth_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis(tmp_path_factory.mktemp("redis-auth"), password=PASSWORD) as server:
        yield server


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    log_dir = tmp_path_factory.mktemp("redis-acl")
    with EmbeddedRedis(log_dir, password=ACL_PASSWORD, username=ACL_USER) as server:
        yield server


def _plain_url(server: EmbeddedRedis) -> str:
    return f"redis://127.0.0.1:{server.port}/0"


def _lbctl(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real CLI in a child process, as a user runs it (tracebacks included)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LB_")}
    return subprocess.run(
        [sys.executable, "-m", "lbctl.main", *argv],
        cwd=ROOT,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _assert_no_secret(text: str) -> None:
    for secret in ALL_SECRETS:
        assert secret not in text, f"secret {secret[:6]}... leaked: {text[-2000:]}"


def test_store_works_with_requirepass_in_the_url_and_fails_clearly_without(
    auth_redis: EmbeddedRedis,
) -> None:
    store = RedisStore.from_url(auth_redis.url, prefix="sec-requirepass")
    assert store.r.exists("sec-requirepass:ns:acme/auth") == 0, "this test's own prefix"
    assert store.create_namespace("acme/auth", 4, exist_ok=True) is True, "created"
    assert store.create_namespace("acme/auth", 4, exist_ok=True) is False, "already there"
    assert len(store.get_namespace("acme/auth").bundle_names) == 4
    with pytest.raises(redis.AuthenticationError) as e:
        RedisStore.from_url(
            f"redis://:{WRONG}@127.0.0.1:{auth_redis.port}/0", prefix="sec"
        ).list_namespaces()
    _assert_no_secret(str(e.value) + repr(e.value))
    with pytest.raises(redis.AuthenticationError):  # no password at all
        RedisStore.from_url(_plain_url(auth_redis), prefix="sec").list_namespaces()


def test_acl_user_from_the_config_knobs_reaches_redis_py(acl_redis: EmbeddedRedis) -> None:
    config, _ = load_config(overrides={"redisUsername": ACL_USER, "redisPassword": ACL_PASSWORD})
    kwargs = config.redis_client_kwargs()
    assert kwargs == {"username": ACL_USER, "password": ACL_PASSWORD}
    store = RedisStore.from_url(_plain_url(acl_redis), prefix="sec", **kwargs)
    store.create_namespace("acme/acl", 2, exist_ok=True)
    assert store.get_namespace("acme/acl") is not None
    assert store.r.acl_whoami() in (ACL_USER, ACL_USER.encode())
    # the default user is off: no credentials, or the right password for the wrong user, fail
    with pytest.raises(redis.AuthenticationError):
        RedisStore.from_url(_plain_url(acl_redis), prefix="sec").list_namespaces()
    bad, _ = load_config(overrides={"redisUsername": ACL_USER, "redisPassword": WRONG})
    with pytest.raises(redis.AuthenticationError) as e:
        RedisStore.from_url(
            _plain_url(acl_redis), prefix="sec", **bad.redis_client_kwargs()
        ).list_namespaces()
    _assert_no_secret(str(e.value) + repr(e.value) + repr(bad))


def test_cli_with_acl_credentials_works_and_wrong_ones_fail_without_the_secret(
    acl_redis: EmbeddedRedis,
) -> None:
    good = acl_redis.url  # redis://lbctl-app:acl-S3cret-91c2@127.0.0.1:PORT/0
    ok = _lbctl("namespaces", "create", "acme/cli", "--bundles", "2", "--redis-url", good)
    assert ok.returncode == 0, ok.stderr
    listed = _lbctl("namespaces", "list", "--json", env={"LB_redisUrl": good})
    assert listed.returncode == 0, listed.stderr
    assert "acme/cli" in listed.stdout
    bad_url = f"redis://{ACL_USER}:{WRONG}@127.0.0.1:{acl_redis.port}/0"
    failed = _lbctl("--log-level", "DEBUG", "namespaces", "list", "--redis-url", bad_url)
    assert failed.returncode != 0
    out = failed.stdout + failed.stderr
    assert failed.returncode == 1
    assert f"redis://{ACL_USER}:******@127.0.0.1:{acl_redis.port}/0 refused the credentials" in out
    assert "Traceback" not in out, out  # one line that names the problem, not a stack
    _assert_no_secret(out)


def test_config_show_never_prints_a_secret() -> None:
    env = {
        "LB_redisPassword": PASSWORD,
        "LB_kafkaSaslPassword": SASL_PASSWORD,
        "LB_redisUrl": f"redis://{ACL_USER}:{ACL_PASSWORD}@redis.example:6379/0",
    }
    for fmt in (["--json"], []):
        shown = _lbctl(
            "config", "show", "--set", f"kafkaSslKeyPassword={KEY_PASSWORD}", *fmt, env=env
        )
        assert shown.returncode == 0, shown.stderr
        _assert_no_secret(shown.stdout + shown.stderr)
    doc = json.loads(_lbctl("config", "show", "--json", env=env).stdout)
    assert doc["redisPassword"] == "******"
    assert doc["redisUrl"] == f"redis://{ACL_USER}:******@redis.example:6379/0"
    # a bad value next to a secret: the error names the knob, never quotes the secret
    err = _lbctl("config", "show", "--set", "topicPartitions=zero", env=env)
    assert err.returncode == 2 and "topicPartitions" in err.stderr
    _assert_no_secret(err.stdout + err.stderr)


def test_a_failing_connection_logged_with_the_filter_shows_no_secret(
    auth_redis: EmbeddedRedis,
) -> None:
    config, _ = load_config(
        overrides={
            "redisUrl": f"redis://:{WRONG}@127.0.0.1:{auth_redis.port}/0",
            "kafkaSaslPassword": SASL_PASSWORD,
        }
    )
    stream = io.StringIO()
    log = logging.getLogger("test.security")
    handler = logging.StreamHandler(stream)
    log.addHandler(handler)
    log.propagate = False
    flt = install_secret_filter(config, log)
    try:
        try:
            redis.Redis.from_url(config.redis_url).ping()
        except redis.RedisError:
            # the careless ways: the URL and the whole config interpolated, and a traceback
            log.exception(
                "cannot reach %s with %s", str(config.redis_url), config.kafka_sasl_password
            )
        log.warning("config: %r, url %r", config, config.redis_url)
    finally:
        log.removeHandler(handler)
        log.removeFilter(flt)
    text = stream.getvalue()
    assert "cannot reach redis://:******@127.0.0.1" in text, text
    assert "AuthenticationError" in text  # the traceback is kept, only secrets are masked
    _assert_no_secret(text)
    assert redact_text(f"x redis://u:{PASSWORD}@h:1/0 y") == "x redis://u:******@h:1/0 y"
    assert SecretFilter([SASL_PASSWORD]).secrets == [SASL_PASSWORD]


def test_kafka_security_settings_reach_the_client_config() -> None:
    """SASL/SSL knobs become librdkafka settings for every confluent-kafka client and the
    Python Spark source (which reads the ``kafka.``-prefixed options), unchanged; the real
    handshakes are in ``test_kafka_security.py``."""
    config, _ = load_config(
        overrides={
            "kafkaSecurityProtocol": "SASL_SSL",
            "kafkaSaslMechanism": "SCRAM-SHA-512",
            "kafkaSaslUsername": "lb",
            "kafkaSaslPassword": SASL_PASSWORD,
            "kafkaSslCaLocation": "/etc/ssl/ca.pem",
            "kafkaSslKeyPassword": KEY_PASSWORD,
        }
    )
    settings = config.kafka_client_settings()
    assert settings["sasl.password"] == SASL_PASSWORD and type(settings["sasl.password"]) is str
    spark_options = {f"kafka.{k}": v for k, v in settings.items()}
    merged = kafka_client_config("127.0.0.1:1", spark_options)
    reporter = merged.pop("error_cb")  # a refused login raises, once
    assert isinstance(reporter, KafkaErrorReporter) and reporter.bootstrap_servers == "127.0.0.1:1"
    with pytest.raises(KafkaAuthError):
        reporter(KafkaError(KafkaError._AUTHENTICATION, "SASL authentication failed"))
    assert merged.pop("logger") is client_logger()  # librdkafka's lines through logging
    assert merged == {**settings, "bootstrap.servers": "127.0.0.1:1"}
    # librdkafka accepts the SASL keys (a misspelt key raises KafkaException at construction)
    plain = {k: v for k, v in merged.items() if not k.startswith("ssl.")}
    producer = Producer({**plain, "security.protocol": "SASL_PLAINTEXT", "log_level": 0})
    producer.flush(0)
    _assert_no_secret(repr(config) + str(config))


def test_every_command_masks_configured_secrets_in_its_log_lines() -> None:
    """``load_from_args`` (how every lbctl command loads its config) installs the filter."""
    code = (
        "import argparse, logging\n"
        "from infra.config_loading import add_config_arguments, load_from_args\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "p = argparse.ArgumentParser()\n"
        "add_config_arguments(p)\n"
        "load_from_args(p.parse_args([]))\n"
        "log = logging.getLogger('lbctl.control')\n"
        f"log.warning('SASL login with %s failed', {SASL_PASSWORD!r})\n"
        f"logging.getLogger('redis').error('cannot connect to redis://u:{PASSWORD}@h:1/0')\n"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LB_")}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**clean, "LB_kafkaSaslPassword": SASL_PASSWORD},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "SASL login with ****** failed" in done.stderr, done.stderr
    assert "cannot connect to redis://u:******@h:1/0" in done.stderr, done.stderr
    _assert_no_secret(done.stdout + done.stderr)


URL_PASSWORD = "urlOnly-Secret-6d0c"
SASL_URL_PASSWORD = "saslUrl-Secret-8a3f"


def test_a_password_only_inside_a_url_is_masked_in_every_log_line_without_configured_secrets(
    tmp_path: Path,
) -> None:
    """No secret in the configuration (no LB_* variables, no --set): a password that exists
    only inside ``--redis-url`` or a SASL bootstrap URL must still be masked, in the message,
    in its arguments, in an exception's traceback and in a stack trace, on a real handler."""
    code = (
        "import argparse, logging, sys\n"
        "from infra.config_loading import add_config_arguments, load_from_args\n"
        "logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s: %(message)s')\n"
        "p = argparse.ArgumentParser()\n"
        "add_config_arguments(p)\n"
        "p.add_argument('--redis-url')\n"
        "args = p.parse_args(sys.argv[1:])\n"
        "config = load_from_args(args)\n"
        "assert config.secret_values() == [], config.secret_values()\n"
        "log = logging.getLogger('lbctl.control')\n"
        "log.info('connecting to %s', args.redis_url)\n"
        f"log.warning('kafka at sasl_ssl://lb:{SASL_URL_PASSWORD}@k1:9093 refused us')\n"
        "try:\n"
        "    raise ConnectionError(f'cannot reach {args.redis_url}')\n"
        "except ConnectionError:\n"
        "    logging.getLogger('redis').exception('lost %r', args.redis_url)\n"
        "log.warning('with a stack for %s', args.redis_url, stack_info=True)\n"
    )
    url = f"redis://app:{URL_PASSWORD}@127.0.0.1:1/0"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LB_")}
    done = subprocess.run(
        [sys.executable, "-c", code, "--redis-url", url],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    err = done.stderr
    assert "INFO lbctl.control: connecting to redis://app:******@127.0.0.1:1/0" in err, err
    assert "kafka at sasl_ssl://lb:******@k1:9093 refused us" in err, err
    assert "ERROR redis: lost 'redis://app:******@127.0.0.1:1/0'" in err, err
    assert "ConnectionError: cannot reach redis://app:******@127.0.0.1:1/0" in err, err
    assert "Stack (most recent call last)" in err, err
    for secret in (URL_PASSWORD, SASL_URL_PASSWORD):
        assert secret not in done.stdout + err, err


def test_the_secret_filter_masks_urls_in_message_args_exception_and_stack_on_a_real_logger() -> (
    None
):
    stream = io.StringIO()
    log = logging.getLogger("test.security.urls")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    flt = install_secret_filter(None, log)
    url = f"redis://app:{URL_PASSWORD}@h:6379/0"
    try:
        log.info("plain redis://app:%s@h:6379/0 in the message", URL_PASSWORD)
        log.info(
            "in args: %s and %r",
            url,
            {"bootstrap": f"sasl_plaintext://u:{SASL_URL_PASSWORD}@k:9092"},
        )
        try:
            raise RuntimeError(f"boom at {url}")
        except RuntimeError:
            log.exception("failed")
        log.info("stack", stack_info=True, extra={"u": url})
        log.info("user only redis://app@h:6379/0 stays")
    finally:
        log.removeHandler(handler)
        log.removeFilter(flt)
    text = stream.getvalue()
    assert "INFO plain redis://app:******@h:6379/0 in the message" in text, text
    assert "INFO in args: redis://app:******@h:6379/0 and {'bootstrap': " in text, text
    assert "sasl_plaintext://u:******@k:9092" in text, text
    assert "RuntimeError: boom at redis://app:******@h:6379/0" in text, text
    assert "INFO user only redis://app@h:6379/0 stays" in text, text
    assert URL_PASSWORD not in text and SASL_URL_PASSWORD not in text, text
