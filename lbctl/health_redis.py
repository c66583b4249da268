"""``lbctl health``'s look at the Redis settings ownership depends on.

Why in the health probe: ``lbctl control`` and ``lbctl stream`` check ``maxmemory-policy``
and persistence when they start (``infra.preflight.check_redis_settings``), but a Redis can be
reconfigured under running processes (``CONFIG SET``, a failover to a differently configured
replica). The probe reads the same settings every time it runs and judges them the same way
(``infra.redis_settings.judge``): an evicting policy that ``redisAllowEvictingPolicy`` does not
allow makes the verdict unhealthy, since ownership can vanish without notice; no persistence
or an unreadable ``CONFIG`` is shown as a warning and leaves the exit status alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from infra.redis_settings import RedisSettings, SettingsVerdict, judge, read_settings
from loadbalance.config import LoadBalancerConfig, redact_url


@dataclass(frozen=True)
class RedisCheck:
    """The settings read and their verdict, or why they could not be read at all."""

    settings: RedisSettings | None
    verdict: SettingsVerdict | None
    error: str | None = None

    @property
    def refusal(self) -> str | None:
        return self.verdict.refusal if self.verdict is not None else None

    def lines(self) -> list[str]:
        """The ``redis:`` lines of the text output: the settings and verdict, then warnings."""
        if self.settings is None or self.verdict is None:
            return [f"redis: settings not read: {self.error}"]
        head = f"redis: {self.settings.describe()}: {self.verdict.state}"
        if self.verdict.refusal:
            head += f": {self.verdict.refusal}"
        return [head, *(f"redis: warning: {w}" for w in self.verdict.warnings)]

    def as_dict(self) -> dict[str, Any]:
        """The ``redis`` member of ``--json``."""
        if self.settings is None or self.verdict is None:
            return {"verdict": "unknown", "error": self.error}
        return {
            **self.settings.as_dict(),
            "verdict": self.verdict.state,
            "refusal": self.verdict.refusal,
            "warnings": list(self.verdict.warnings),
        }


def inspect(client: redis.Redis, url: str, config: LoadBalancerConfig) -> RedisCheck:
    """Read and judge the settings of the Redis at ``url`` over ``client``; a Redis that does
    not answer is a ``RedisCheck`` with ``error`` (the progress checks already judge an
    unreachable one)."""
    try:
        settings = read_settings(client)
    except redis.RedisError as e:
        return RedisCheck(None, None, f"Redis at {redact_url(url)}: {e}")
    verdict = judge(settings, redact_url(url), config.redis_allow_evicting_policy)
    return RedisCheck(settings, verdict)
