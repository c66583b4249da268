"""The one place a process builds its Redis client.

Why one place: the credentials (``redisUsername``, ``redisPassword``), the TLS files
(``redisSslCaCerts``, ``redisSslCertfile``, ``redisSslKeyfile``), the timeouts and the client
name must reach every client the product opens. When each command built its own, one of them
(the recovery command) forgot the credentials and took an authentication error for a data loss.
``tests/unit/test_redis_client_factory.py`` fails when a production module builds a client
anywhere else.

Every client gets:

* the configuration's ACL user, password and TLS files (``LoadBalancerConfig.
  redis_client_kwargs``), which win over credentials in the URL, as redis-py does;
* a connect timeout (5 s) and a read timeout (30 s for a running process, 5 s for a probe):
  without them a Redis host that vanished (a failover, a dropped route) leaves a process
  blocked on a socket for as long as TCP keeps it open, where a timeout is an error the
  process already handles (``redis.TimeoutError``);
* a health check of idle connections (a PING before reusing one idle for 30 s), so a
  connection cut during a failover is found before a command is sent on it;
* a client name ``lbctl-<purpose>`` (``CLIENT LIST`` shows which process holds which
  connection). A Redis whose ACL refuses ``CLIENT SETNAME`` refuses the connection: grant the
  user ``+client|setname`` (or ``+@connection``).
"""

from __future__ import annotations

import re
from typing import Any

import redis

from loadbalance.config import LoadBalancerConfig

__all__ = [
    "CONNECT_TIMEOUT_S",
    "HEALTH_CHECK_INTERVAL_S",
    "PROBE_TIMEOUT_S",
    "PROCESS_TIMEOUT_S",
    "client_kwargs",
    "connect",
]

CONNECT_TIMEOUT_S = 5.0
PROCESS_TIMEOUT_S = 30.0  # longer than any script the store runs on a busy server
PROBE_TIMEOUT_S = 5.0
HEALTH_CHECK_INTERVAL_S = 30
_PURPOSE = re.compile(r"^[A-Za-z0-9._-]{1,40}$")


def client_kwargs(
    config: LoadBalancerConfig | None,
    *,
    purpose: str,
    socket_timeout: float = PROCESS_TIMEOUT_S,
    socket_connect_timeout: float = CONNECT_TIMEOUT_S,
) -> dict[str, Any]:
    """The redis-py keyword arguments ``connect`` gives beside the URL; for a constructor
    that takes a URL and keyword arguments (``RedisStore.from_url``)."""
    if not _PURPOSE.match(purpose):
        raise ValueError(f"client purpose {purpose!r}: letters, digits, '.', '_' or '-'")
    kwargs: dict[str, Any] = dict(config.redis_client_kwargs()) if config is not None else {}
    kwargs.update(
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_connect_timeout,
        health_check_interval=HEALTH_CHECK_INTERVAL_S,
        client_name=f"lbctl-{purpose}",
    )
    return kwargs


def connect(
    url: str,
    config: LoadBalancerConfig | None,
    *,
    purpose: str,
    socket_timeout: float = PROCESS_TIMEOUT_S,
    socket_connect_timeout: float = CONNECT_TIMEOUT_S,
    **extra: Any,
) -> redis.Redis:
    """A client for ``url`` with the configuration's credentials and TLS (``config`` None:
    only what the URL says, for a server this process started itself). ``extra`` redis-py
    arguments (a server's own CA file) go last. No connection is opened until the first
    command."""
    kwargs = client_kwargs(
        config,
        purpose=purpose,
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_connect_timeout,
    )
    kwargs.update(extra)
    return redis.Redis.from_url(url, **kwargs)
