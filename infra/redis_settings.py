"""The Redis server settings ownership depends on, read and judged.

Why: ownership (leases, namespaces, the fencing counter) lives only in Redis. A
``maxmemory-policy`` other than ``noeviction`` lets Redis delete keys when memory runs short:
an evicted lease is a bundle silently unowned, an evicted namespace a hole in the ring, and
nothing tells the controller, because eviction is not a data loss it can detect (the epoch key
may survive). So the services refuse such a Redis unless the operator accepts it
(``redisAllowEvictingPolicy``). A Redis that persists nothing (``appendonly no`` and
``save ""``) loses everything on a restart; that the controller detects and rebuilds from the
brokers' reports (``controller.recovery``), so it is only warned about. A managed Redis often
disables or renames ``CONFIG``: then the settings cannot be read, which is said in a warning,
and the command carries on. ``docs/reliability.md`` ("Supported Redis deployments") says which
deployments are supported and what each can lose.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import redis

__all__ = ["EVICTION_FIX", "RedisSettings", "SettingsVerdict", "judge", "read_settings"]

EVICTION_FIX = (
    "run CONFIG SET maxmemory-policy noeviction (and set it in redis.conf), or set "
    "redisAllowEvictingPolicy=true to accept evicted ownership"
)
_NAMES = ("maxmemory-policy", "maxmemory", "appendonly", "appendfsync", "save")


@dataclass(frozen=True)
class RedisSettings:
    """What ``CONFIG GET`` said; every value None when it was refused (``unreadable`` says
    why)."""

    maxmemory_policy: str | None = None
    maxmemory: str | None = None
    appendonly: str | None = None
    appendfsync: str | None = None
    save: str | None = None
    unreadable: str | None = None

    @property
    def evicting(self) -> bool:
        """The policy is known and may delete keys."""
        return self.maxmemory_policy is not None and self.maxmemory_policy != "noeviction"

    @property
    def persists_nothing(self) -> bool:
        """Known to keep nothing across a restart: no AOF and no RDB snapshot schedule."""
        return self.appendonly == "no" and self.save is not None and not self.save.strip()

    def describe(self) -> str:
        """``maxmemory-policy noeviction, appendonly yes (appendfsync everysec), save ''``."""
        if self.unreadable is not None:
            return f"settings unreadable ({self.unreadable})"
        aof = f"appendonly {self.appendonly}"
        if self.appendonly == "yes":
            aof += f" (appendfsync {self.appendfsync})"
        return f"maxmemory-policy {self.maxmemory_policy}, {aof}, save {self.save!r}"

    def as_dict(self) -> dict[str, Any]:
        return {_camel(k): v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class SettingsVerdict:
    """``refusal``: the one line a service start ends with (None: accepted); ``warnings``:
    one line each, the command carries on."""

    refusal: str | None
    warnings: tuple[str, ...]

    @property
    def state(self) -> str:
        return "refused" if self.refusal else "warning" if self.warnings else "ok"


def read_settings(client: redis.Redis) -> RedisSettings:
    """``CONFIG GET`` of the settings that matter; a refused ``CONFIG`` (renamed, disabled,
    or not granted to the ACL user) gives an unreadable ``RedisSettings``, not an error.
    Connection errors propagate."""
    values: dict[str, str] = {}
    try:
        for name in _NAMES:
            values.update({_text(k): _text(v) for k, v in client.config_get(name).items()})
    except redis.ResponseError as e:  # unknown command / NOPERM
        return RedisSettings(unreadable=f"CONFIG GET refused: {str(e).splitlines()[0][:120]}")
    return RedisSettings(*(values.get(name) for name in _NAMES))


def judge(settings: RedisSettings, shown_url: str, allow_evicting: bool) -> SettingsVerdict:
    """Refuse an evicting policy unless allowed; warn when it is allowed, when nothing is
    persisted, and when the settings cannot be read."""
    where = f"Redis at {shown_url}"
    if settings.unreadable is not None:
        return SettingsVerdict(
            None,
            (
                f"{where}: cannot check maxmemory-policy and persistence "
                f"({settings.unreadable}): make sure the policy is noeviction and AOF is on",
            ),
        )
    warnings: list[str] = []
    refusal = None
    if settings.evicting:
        policy = settings.maxmemory_policy
        if allow_evicting:
            warnings.append(
                f"{where} has maxmemory-policy {policy} (allowed by redisAllowEvictingPolicy): "
                "under memory pressure it deletes leases and namespaces without notice"
            )
        else:
            refusal = (
                f"{where} has maxmemory-policy {policy}, which may evict leases and "
                f"namespaces (ownership silently lost): {EVICTION_FIX}"
            )
    if settings.persists_nothing:
        warnings.append(
            f"{where} persists nothing (appendonly no, save ''): a restart loses every lease "
            "and namespace and the controller rebuilds them from broker reports; run CONFIG "
            "SET appendonly yes (and set it in redis.conf) to keep them"
        )
    return SettingsVerdict(refusal, tuple(warnings))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.title() for w in rest)
