"""The state of each service the product depends on, as ``lbctl monitor``, ``lbctl run`` and
``lbctl health`` show it: Kafka, Redis, the streaming job and every controller.

Each state is judged from what the service itself last recorded, by its own wall clock:

* Kafka: whether the monitor's own probe of the load-reports topic answered this refresh;
* Redis: whether this refresh's reads answered;
* the streaming job: ``wall_ms`` of its last commit (``metadata_store.progress``), the time the
  job wrote it; a job with no commit for ``stream_stale_after_s`` is stale, unless the lag probe
  says every report on the topic was read (then it is idle: no reports, no batches);
* each controller: its entry in the process registry (``metadata_store.processes``), which it
  rewrites every second while its loop runs; one silent for ``control_stale_after_s`` is stale,
  one that stopped cleanly says so, one whose Kafka consumer reported an error recently shows it.

A state is ``up``, ``idle`` (nothing to do), ``waiting`` (no batch yet), ``unchecked`` (no
address to check), ``stopped`` (cleanly), or trouble: ``stale``, ``down`` or ``unknown``, shown
in red and listed in ``trouble``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from metadata_store.processes import ProcessEntry

OK_STATES = frozenset({"up", "idle", "stopped", "waiting", "unchecked"})
CONTROL_ERROR_WINDOW_S = 10.0  # a consumer error this recent is shown with the controller


@dataclass(frozen=True)
class ServiceState:
    """One service: its name, its state, one line saying why, and the age of its last sign."""

    name: str
    state: str
    detail: str
    age_s: float | None = None
    last_ms: int | None = None
    extra: tuple[tuple[str, Any], ...] = ()

    @property
    def trouble(self) -> bool:
        return self.state not in OK_STATES

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state,
            "ok": not self.trouble,
            "detail": self.detail,
            "ageS": None if self.age_s is None else round(self.age_s, 1),
            "lastMs": self.last_ms,
            **dict(self.extra),
        }


def redis_state(error: str | None) -> ServiceState:
    if error:
        return ServiceState("redis", "down", f"unreachable: {error}")
    return ServiceState("redis", "up", "answering")


def kafka_state(lag: Any | None, configured: bool) -> ServiceState:
    """From this refresh's lag probe (``lbctl.monitor.Lag``); unknown without Kafka settings."""
    if not configured or lag is None:
        return ServiceState("kafka", "unchecked", "no bootstrap servers given")
    if lag.error:
        return ServiceState("kafka", "down", f"unreachable: {lag.error}")
    return ServiceState("kafka", "up", f"answering ({lag.topic})")


def stream_state(
    batch: int | None,
    wall_ms: int | None,
    now_ms: int,
    stale_after_s: float,
    unread: int | None,
) -> ServiceState:
    """The job's last commit by its own clock; ``unread``: reports not read yet (None:
    unknown), which tells an idle job from a stopped one."""
    if batch is None:
        return ServiceState("stream", "waiting", "no batch committed yet")
    if wall_ms is None:
        return ServiceState("stream", "unknown", f"batch {batch}; the job records no commit time")
    age_s = max(0.0, (now_ms - wall_ms) / 1000)
    extra = (("batch", batch),)
    text = f"batch {batch} committed {age_s:.0f}s ago"
    if age_s <= stale_after_s:
        return ServiceState("stream", "up", text, age_s, wall_ms, extra)
    if unread == 0:
        return ServiceState("stream", "idle", f"{text}; every report read", age_s, wall_ms, extra)
    why = f"{unread} reports unread" if unread else f"limit {stale_after_s:.0f}s"
    return ServiceState("stream", "stale", f"{text} ({why})", age_s, wall_ms, extra)


def controller_states(
    entries: Sequence[ProcessEntry], now_ms: int, stale_after_s: float
) -> list[ServiceState]:
    """One state per registered controller; stopped ones only if stopped within an hour."""
    out = []
    for e in entries:
        beat = e.beat_ms
        age_s = None if beat is None else max(0.0, (now_ms - beat) / 1000)
        poll, sweep = e.ms("lastPollMs"), e.ms("lastSweepMs")
        extra = (
            ("id", e.id),
            ("lastPollMs", poll),
            ("lastSweepMs", sweep),
            ("lastRecordMs", e.ms("lastRecordMs")),
            ("consumed", e.doc.get("consumed")),
            ("group", e.doc.get("group")),
            ("metricsUrl", e.doc.get("metricsUrl")),
            ("lastError", e.doc.get("lastError")),
        )
        name = f"control {e.id}"
        if e.stopped:
            if age_s is not None and age_s > 3600:
                continue
            out.append(ServiceState(name, "stopped", "stopped cleanly", age_s, beat, extra))
            continue
        text = "last poll " + _ago(poll, now_ms) + ", last sweep " + _ago(sweep, now_ms)
        err_ms = e.ms("lastErrorMs")
        if age_s is None or age_s > stale_after_s:
            state, text = "stale", f"silent for {_ago(beat, now_ms)}; {text}"
        elif err_ms is not None and (now_ms - err_ms) / 1000 <= CONTROL_ERROR_WINDOW_S:
            state, text = "down", f"{text}; Kafka consumer error: {e.doc.get('lastError')}"
        else:
            state = "up"
        out.append(ServiceState(name, state, text, age_s, beat, extra))
    return out


def _ago(ms: int | None, now_ms: int) -> str:
    return "never" if ms is None else f"{max(0.0, (now_ms - ms) / 1000):.0f}s ago"


def trouble_lines(states: Sequence[ServiceState]) -> list[str]:
    """One line per service in trouble: ``kafka down: unreachable: ...``."""
    return [f"{s.name} {s.state}: {s.detail}" for s in states if s.trouble]
