"""``lbctl health control`` through the process registry: is each controller doing its work?

A controller does two things, and both are checked: it consumes the decisions topic (its
consumer group's committed offsets reach the end of the topic, or have moved within the age
limit), and it sweeps expired leases (its registry entry's ``lastSweepMs``). Its registry entry
(``metadata_store.processes``, rewritten every second by the loop) also says that its loop runs
and where it serves metrics, so the probe needs no port: a controller started without
``--metrics-port`` is checked the same way. A sweep needs only Redis, so a controller cut off
from Kafka keeps sweeping; the consumption check is what catches that.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from infra.offsets import GroupOffsets, latest_offsets, partitions_for
from metadata_store.processes import ProcessEntry


@dataclass(frozen=True)
class Check:
    """One thing the probe looked at: its name, whether it passed, and what it saw."""

    name: str
    ok: bool
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


@dataclass
class ControlReport:
    """Every check of every registered controller, and the verdict."""

    checks: list[Check] = field(default_factory=list)
    controllers: list[dict[str, Any]] = field(default_factory=list)
    committed: int | None = None  # total committed offset of the group (progress memory)

    @property
    def healthy(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def message(self) -> str:
        bad = [c for c in self.checks if not c.ok]
        shown = bad or self.checks
        return "; ".join(f"{c.name}: {c.detail}" for c in shown) or "nothing checked"


def live_controllers(entries: list[ProcessEntry]) -> list[ProcessEntry]:
    """Controllers that have not stopped cleanly (dead ones included: they are the trouble)."""
    return [e for e in entries if not e.stopped]


def judge_entries(entries: list[ProcessEntry], now_ms: int, max_age_s: float) -> list[Check]:
    """Per controller: its loop beat and its last sweep, each within ``max_age_s``."""
    if not entries:
        return [Check("registry", False, "no controller registered in Redis (none running?)")]
    checks = []
    for e in entries:
        beat_age = _age_s(e.beat_ms, now_ms)
        sweep_age = _age_s(e.ms("lastSweepMs"), now_ms)
        checks.append(
            Check(
                f"{e.id} loop",
                beat_age is not None and beat_age <= max_age_s,
                f"last beat {_text(beat_age)}",
            )
        )
        checks.append(
            Check(
                f"{e.id} sweeps",
                sweep_age is not None and sweep_age <= max_age_s,
                f"last sweep {_text(sweep_age)}",
            )
        )
    return checks


def consumption(
    bootstrap: str,
    topic: str,
    group: str,
    client_config: dict[str, Any] | None,
    *,
    previous_committed: int | None,
    previous_since_ms: int | None,
    now_ms: int,
    max_age_s: float,
    timeout_s: float = 5.0,
) -> tuple[Check, int | None]:
    """Whether ``group`` keeps up with ``topic``: no lag, or its committed offsets moved within
    ``max_age_s`` (compared with the previous probe's total); the total committed now."""
    try:
        parts = partitions_for(bootstrap, topic, client_config, timeout_s)
        end = latest_offsets(bootstrap, topic, client_config, timeout_s=timeout_s)
        reader = GroupOffsets(bootstrap, group, topic, client_config)
        try:
            committed = reader.committed(parts, timeout_s)
        finally:
            reader.close()
    except Exception as e:  # Kafka away: the controller cannot consume either
        return Check("consumption", False, f"Kafka unreachable: {type(e).__name__}: {e}"), None
    total = sum(committed.values())
    lag = sum(max(0, o - committed.get(p, 0)) for p, o in end.items())
    if lag == 0:
        return Check("consumption", True, f"group {group} read every decision on {topic}"), total
    if previous_committed is not None and total != previous_committed:
        return Check("consumption", True, f"group {group} consuming ({lag} behind)"), total
    since = previous_since_ms if previous_since_ms is not None else now_ms
    age_s = (now_ms - since) / 1000
    ok = age_s <= max_age_s
    detail = f"group {group}: {lag} decisions unread, offsets unchanged for {age_s:.0f}s"
    return Check("consumption", ok, detail), total


def _age_s(ms: int | None, now_ms: int) -> float | None:
    return None if ms is None else max(0.0, (now_ms - ms) / 1000)


def _text(age_s: float | None) -> str:
    return "never" if age_s is None else f"{age_s:.0f}s ago"


def wall_ms() -> int:
    return int(time.time() * 1000)
