"""Which errors from Redis the controller waits out: the one classification the runner uses.

A controller must never exit because Redis is briefly unable to serve it. Besides a dropped
connection or a timeout, Redis answers some commands with an error reply that only says "not
now": ``READONLY`` (this node became a replica in a failover), ``OOM`` (``maxmemory`` reached;
writes come back when memory is freed), ``BUSY`` (another client's script is running),
``MASTERDOWN`` (a replica lost its master), ``LOADING`` (the dataset is being loaded after a
restart), and in clusters or with ``min-replicas-to-write`` ``TRYAGAIN``, ``CLUSTERDOWN`` and
``NOREPLICAS``. redis-py gives some of these their own classes (``ReadOnlyError``,
``OutOfMemoryError`` and ``MasterDownError`` are ``ResponseError`` subclasses, not
``ConnectionError``), others none (``BUSY``), so the reply code is read from the class and from
the message.

``fault_kind(exc)`` names the kind: ``"connection"``, ``"timeout"``, a reply code in lower case
(``TRANSIENT_KINDS``), ``"reply"`` for any other Redis error reply (``WRONGTYPE``, ``NOPERM``,
an error inside a script), or ``"error"`` for an exception that does not come from Redis.

What the runner does with each (``controller.loop``): a transient kind is waited out (the
record being applied is held un-committed and read again after a back-off; a sweep is skipped
and the next one tries again), with a warning. Any other Redis reply and any unexpected
exception is handled the same way, logged as an error (with the traceback for a non-Redis one):
holding a record we cannot apply keeps it for after the fix (an operator repairing a key, a new
release), while exiting would not help, since a restarted controller reads the same record
again and meanwhile nobody sweeps expired leases. The price is that such a record stalls its
partition until then, which the error log, ``lbctl_control_redis_faults_total{kind}`` and the
stalled ``lbctl_control_decisions_total`` show.
"""

from __future__ import annotations

import redis
from redis.exceptions import (
    BusyLoadingError,
    ClusterDownError,
    MasterDownError,
    OutOfMemoryError,
    ReadOnlyError,
    TryAgainError,
)

__all__ = ["TRANSIENT_KINDS", "TRANSIENT_REPLY_CODES", "fault_kind", "is_transient"]

TRANSIENT_REPLY_CODES: tuple[str, ...] = (
    "READONLY",
    "OOM",
    "BUSY",
    "MASTERDOWN",
    "LOADING",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "NOREPLICAS",
)
"""Error replies that mean "Redis cannot serve this now": wait and retry, never exit."""

TRANSIENT_KINDS: frozenset[str] = frozenset(
    {"connection", "timeout", *(code.lower() for code in TRANSIENT_REPLY_CODES)}
)
"""Every ``fault_kind`` the controller waits out as a passing fault."""

_CLASSES: tuple[tuple[type[BaseException], str], ...] = (
    (BusyLoadingError, "loading"),  # a ConnectionError subclass: before it
    (MasterDownError, "masterdown"),  # a ClusterDownError subclass: before it
    (ReadOnlyError, "readonly"),
    (OutOfMemoryError, "oom"),
    (TryAgainError, "tryagain"),
    (ClusterDownError, "clusterdown"),
    (redis.TimeoutError, "timeout"),
    (redis.ConnectionError, "connection"),
)


def fault_kind(exc: BaseException) -> str:
    """The kind of ``exc`` (module docstring): a ``TRANSIENT_KINDS`` member, ``"reply"`` or
    ``"error"``."""
    for cls, kind in _CLASSES:
        if isinstance(exc, cls):
            return kind
    if isinstance(exc, redis.ResponseError):
        text = str(exc)
        code = text.split(" ", 1)[0]
        for known in TRANSIENT_REPLY_CODES:
            # Redis 6 wraps an error met inside a script: "ERR Error running script ... -OOM ..."
            if code == known or f"-{known} " in text:
                return known.lower()
        return "reply"
    if isinstance(exc, redis.RedisError):
        return "reply"
    return "error"


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a passing Redis fault the controller waits out."""
    return fault_kind(exc) in TRANSIENT_KINDS
