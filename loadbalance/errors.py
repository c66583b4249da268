"""A small error taxonomy whose classes are the retry policy.

* ``InvalidInput``: the input is bad and will stay bad; never retry, route it to the dead-letter
  output (reports) or the outcome stream (decisions) with ``reason``.
* ``Conflict``: somebody else changed the state first (a compare-and-set lost); re-read and
  retry a bounded number of times, then report the conflict.
* ``Transient``: the world is briefly unavailable (broker down, Redis restarting); retry with
  bounded backoff.
* ``ConfigError`` lives in ``loadbalance.config``: fail at load time, never retry.
"""

from __future__ import annotations


class LoadBalancerError(Exception):
    """Base class for every error the product raises on purpose."""


class InvalidInput(LoadBalancerError):
    """Input that can never be processed; ``field`` names where it is wrong."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}" if field else reason)
        self.field = field
        self.reason = reason


class InvalidReport(InvalidInput):
    """A load report that fails validation."""


class InvalidDecision(InvalidInput):
    """A decision record that fails validation."""


class InvalidBundle(InvalidInput):
    """A bundle name or range that is not a valid range of the 32-bit hash ring."""


class Conflict(LoadBalancerError):
    """A versioned write lost a race; re-read and retry."""


class Transient(LoadBalancerError):
    """A dependency is briefly unavailable; retry with backoff."""
