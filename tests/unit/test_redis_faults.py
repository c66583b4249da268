"""The controller's one classification of errors (``controller.redis_faults``).

Errors are built the way redis-py builds them from a server's reply (``parse_error`` of the
reply text), so a reply code redis-py maps to its own class (READONLY, OOM, LOADING,
MASTERDOWN) and one it does not (BUSY, NOREPLICAS) are both covered.
"""

from __future__ import annotations

import pytest
import redis
from redis._parsers.base import BaseParser

from controller.redis_faults import TRANSIENT_KINDS, fault_kind, is_transient

REPLIES = {
    "READONLY You can't write against a read only replica.": "readonly",
    "OOM command not allowed when used memory > 'maxmemory'.": "oom",
    "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.": (
        "busy"
    ),
    "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.": (
        "masterdown"
    ),
    "LOADING Redis is loading the dataset in memory": "loading",
    "TRYAGAIN Multiple keys request during rehashing of slot": "tryagain",
    "CLUSTERDOWN The cluster is down": "clusterdown",
    "NOREPLICAS Not enough good replicas to write.": "noreplicas",
    # Redis 6 reports an error met inside a script wrapped in ERR
    "ERR Error running script (call to f_1): @user_script:9: -OOM command not allowed": "oom",
}


@pytest.mark.parametrize("reply", list(REPLIES))
def test_replies_that_mean_not_now_are_transient(reply: str) -> None:
    exc = BaseParser.parse_error(reply)
    assert fault_kind(exc) == REPLIES[reply]
    assert is_transient(exc)


@pytest.mark.parametrize(
    "exc,kind",
    [
        (redis.ConnectionError("Connection closed by server."), "connection"),
        (redis.TimeoutError("Timeout reading from socket"), "timeout"),
        (redis.BusyLoadingError("Redis is loading the dataset in memory"), "loading"),
    ],
)
def test_dropped_connections_and_timeouts_are_transient(exc: Exception, kind: str) -> None:
    assert fault_kind(exc) == kind and is_transient(exc)


@pytest.mark.parametrize(
    "reply",
    [
        "WRONGTYPE Operation against a key holding the wrong kind of value",
        "NOPERM this user has no permissions to run the 'evalsha' command",
        "ERR Error running script: attempt to compare nil with number",
        "ERR unknown command 'FOO'",
    ],
)
def test_other_replies_are_not_transient(reply: str) -> None:
    exc = BaseParser.parse_error(reply)
    assert fault_kind(exc) == "reply" and not is_transient(exc)


def test_an_error_not_from_redis_is_an_error() -> None:
    assert fault_kind(KeyError("x")) == "error" and not is_transient(KeyError("x"))
    assert "reply" not in TRANSIENT_KINDS and "error" not in TRANSIENT_KINDS
