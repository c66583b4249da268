"""Check the services a command needs before it starts work: one line naming the address and
the fix when one is missing.

Why: a command that meets a wrong address late fails badly. A bootstrap server nobody listens
on meant half a minute of librdkafka retries and then a traceback from topic creation; a Redis
URL without its scheme a raw ``ValueError``; a wrong Redis URL under ``lbctl stream`` a Spark
job whose every batch failed, for ever. Checked first, with short timeouts, each of these is a
``ServiceUnavailable`` whose text is the whole message, such as ``cannot reach Kafka at
127.0.0.1:1 within 5 s (connection refused): check --bootstrap-servers /
kafkaBootstrapServers``. It is permanent for the command (retrying the same address cannot
help), so the command line prints it and exits; ``BadAddress`` (a malformed URL) is a usage
error. Addresses are shown with their passwords masked.

``probe_kafka`` / ``probe_redis`` answer the same question without raising (the reason, or
None when the service answers), for a running process that wants to say which service it lost.

``check_redis_settings`` is the start-up check of the services that keep ownership in Redis
(``lbctl control``, ``stream``, ``run``): a ``maxmemory-policy`` that may evict keys ends the
command (``RedisMisconfigured``, one line naming the setting and the fix) unless
``redisAllowEvictingPolicy`` is on; a Redis that persists nothing, or whose ``CONFIG`` is
refused (a managed Redis), is one warning and the command carries on
(``infra.redis_settings``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

import redis
from confluent_kafka.admin import AdminClient

from infra import redis_settings
from infra.client_logging import RepeatFilter
from infra.kafka_auth import KafkaAuthError, list_topics, raise_on_auth_error
from infra.redis_client import connect
from infra.topics import kafka_client_config
from loadbalance.config import LoadBalancerConfig, redact_url

log = logging.getLogger("lbctl.preflight")

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "KAFKA_FIX",
    "REDIS_FIX",
    "BadAddress",
    "RedisMisconfigured",
    "ServiceUnavailable",
    "check_kafka",
    "check_redis",
    "check_redis_settings",
    "check_redis_url",
    "probe_kafka",
    "probe_redis",
]

DEFAULT_TIMEOUT_S = 5.0
KAFKA_FIX = "check --bootstrap-servers / kafkaBootstrapServers"
REDIS_FIX = "check --redis-url / redisUrl"
_REDIS_AUTH_FIX = "check redisUsername / redisPassword or the URL's user:password"
_SCHEMES = ("redis://", "rediss://", "unix://")
# librdkafka: "host:port/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused
# (after 0ms in state CONNECT)"; "Failed to resolve 'nohost:9092': Name or service not known"
_CONNECT_FAILED = re.compile(r"failed: (?P<why>[^(]+?)\s*(\(after|$)")
_RESOLVE_FAILED = re.compile(r"Failed to resolve '[^']*': (?P<why>[^(]+?)\s*(\(after|$)")


class _DebugOnly(logging.Filter):
    """The probe's own client lines only at DEBUG: its one-line verdict says it all."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not logging.getLogger().isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


def _probe_logger() -> logging.Logger:
    logger = logging.getLogger("lbctl.kafka.probe")
    if not logger.filters:
        logger.addFilter(_DebugOnly())
        logger.addFilter(RepeatFilter())
    return logger


class _LastError:
    """The probe's ``error_cb``: a refusal raises ``KafkaAuthError``; anything else is kept
    (the last event names why nothing answered) and said nowhere else."""

    def __init__(self) -> None:
        self.text = ""

    def __call__(self, err: Any) -> None:
        raise_on_auth_error(err)
        self.text = err.str()


class ServiceUnavailable(RuntimeError):
    """A service the command needs does not answer (or refuses it): permanent for the
    command, so it ends in one line. ``service`` is ``kafka`` or ``redis``."""

    def __init__(self, service: str, message: str) -> None:
        super().__init__(message)
        self.service = service


class BadAddress(ServiceUnavailable):
    """A service address that cannot be right whatever the network does (a malformed URL)."""


class RedisMisconfigured(ServiceUnavailable):
    """Redis answers but is set up to lose ownership (an evicting ``maxmemory-policy``)."""


def check_redis_url(url: str) -> None:
    """``BadAddress`` unless redis-py can parse ``url`` (scheme, port, database)."""
    shown = redact_url(url)
    if not url.startswith(_SCHEMES):
        raise BadAddress(
            "redis",
            f"Redis URL {shown!r} has no scheme: write redis://HOST:PORT/DB (rediss:// for TLS, "
            f"unix:// for a socket); {REDIS_FIX}",
        )
    try:
        redis.connection.parse_url(url)
    except ValueError as e:
        raise BadAddress("redis", f"Redis URL {shown!r} is not valid ({e}); {REDIS_FIX}") from None


def probe_redis(
    url: str, config: LoadBalancerConfig | None = None, timeout_s: float = DEFAULT_TIMEOUT_S
) -> str | None:
    """None when Redis at ``url`` answers a PING within ``timeout_s``; else the one-line
    reason ``check_redis`` would raise."""
    try:
        check_redis(url, config, timeout_s)
    except ServiceUnavailable as e:
        return str(e)
    return None


def check_redis(
    url: str, config: LoadBalancerConfig | None = None, timeout_s: float = DEFAULT_TIMEOUT_S
) -> None:
    """``ServiceUnavailable`` unless Redis at ``url`` (with the configuration's ACL user,
    password and TLS files) answers a PING within ``timeout_s``; ``BadAddress`` for a
    malformed URL."""
    check_redis_url(url)
    client = _probe_client(url, config, timeout_s)
    try:
        client.ping()
    except redis.RedisError as e:
        raise _unavailable(e, url, timeout_s) from None
    finally:
        client.close()


def check_redis_settings(
    url: str, config: LoadBalancerConfig, timeout_s: float = DEFAULT_TIMEOUT_S
) -> redis_settings.SettingsVerdict:
    """Read and judge the settings ownership depends on (``infra.redis_settings``):
    ``RedisMisconfigured`` for an evicting policy that ``redisAllowEvictingPolicy`` does not
    allow; each warning logged as one line. Call after ``check_redis``."""
    client = _probe_client(url, config, timeout_s)
    try:
        settings = redis_settings.read_settings(client)
    except redis.RedisError as e:
        raise _unavailable(e, url, timeout_s) from None
    finally:
        client.close()
    verdict = redis_settings.judge(settings, redact_url(url), config.redis_allow_evicting_policy)
    if verdict.refusal is not None:
        raise RedisMisconfigured("redis", verdict.refusal)
    for line in verdict.warnings:
        log.warning("%s", line)
    return verdict


def _probe_client(url: str, config: LoadBalancerConfig | None, timeout_s: float) -> redis.Redis:
    return connect(
        url,
        config,
        purpose="preflight",
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
    )


def _unavailable(error: redis.RedisError, url: str, timeout_s: float) -> ServiceUnavailable:
    """The one-line ``ServiceUnavailable`` for what a probe's command raised; an error that
    is none of refused credentials, a timeout or a lost connection is raised as it is."""
    shown = redact_url(url)
    if isinstance(error, redis.AuthenticationError):
        return ServiceUnavailable(
            "redis", f"Redis at {shown} refused the credentials: {_REDIS_AUTH_FIX}"
        )
    if isinstance(error, redis.ResponseError):  # NOAUTH: a password is required, none given
        if "NOAUTH" not in str(error) and "WRONGPASS" not in str(error):
            raise error
        return ServiceUnavailable(
            "redis", f"Redis at {shown} requires credentials: {_REDIS_AUTH_FIX}"
        )
    if isinstance(error, redis.TimeoutError):
        return ServiceUnavailable(
            "redis",
            f"cannot reach Redis at {shown} within {timeout_s:g} s (timed out): {REDIS_FIX}",
        )
    if isinstance(error, redis.ConnectionError):
        return ServiceUnavailable(
            "redis",
            f"cannot reach Redis at {shown} within {timeout_s:g} s ({_redis_reason(error)}): "
            f"{REDIS_FIX}",
        )
    raise error


def _redis_reason(error: BaseException) -> str:
    text = str(error)
    low = text.lower()
    for words in ("connection refused", "name or service not known", "no route to host"):
        if words in low:
            return words
    if "ssl" in low or "certificate" in low:
        return f"TLS handshake failed: {text[:120]}"
    return text.splitlines()[0][:160] if text else type(error).__name__


def probe_kafka(
    bootstrap_servers: str,
    client_config: Mapping[str, Any] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> str | None:
    """None when Kafka at ``bootstrap_servers`` answers a metadata request within
    ``timeout_s``; else the one-line reason ``check_kafka`` would raise."""
    try:
        check_kafka(bootstrap_servers, client_config, timeout_s)
    except (ServiceUnavailable, KafkaAuthError) as e:
        return str(e)
    return None


def check_kafka(
    bootstrap_servers: str,
    client_config: Mapping[str, Any] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> None:
    """``ServiceUnavailable`` unless a metadata request to ``bootstrap_servers`` is answered
    within ``timeout_s``. A refused login raises ``KafkaAuthError`` (its own one line)."""
    reporter = _LastError()
    config = kafka_client_config(bootstrap_servers, client_config)
    config.update({"error_cb": reporter, "logger": _probe_logger()})
    config.setdefault("socket.connection.setup.timeout.ms", int(timeout_s * 1000))
    try:
        admin = AdminClient(config)
    except Exception as e:  # KafkaException: a configuration librdkafka rejects
        raise ServiceUnavailable(
            "kafka", f"Kafka client settings for {bootstrap_servers} rejected: {e}"
        ) from None
    try:
        list_topics(admin, timeout_s=timeout_s)
    except KafkaAuthError:
        raise
    except Exception:  # KafkaException: no broker answered in time
        raise ServiceUnavailable(
            "kafka",
            f"cannot reach Kafka at {bootstrap_servers} within {timeout_s:g} s "
            f"({_kafka_reason(reporter.text)}): {KAFKA_FIX}",
        ) from None


def _kafka_reason(last_error: str) -> str:
    """A few words from librdkafka's last error event: ``connection refused``, a name that
    does not resolve, or ``no answer`` when nothing more precise was said."""
    for pattern in (_RESOLVE_FAILED, _CONNECT_FAILED):
        m = pattern.search(last_error)
        if m:
            return m.group("why").strip().lower()
    if "brokers are down" in last_error:
        return "all brokers down"
    return "no answer"
