"""The live broker table of ``lbctl run``, read from Redis only.

Why Redis only: the monitor must show what the product believes, not what the simulator knows,
and it must work the same against a real cluster. Everything it needs is already there:

* ``P:load:brokers`` (written by the streaming job): each broker's latest report, which gives the
  CPU, memory and bandwidth percentages, topics and message rates of a row;
* the ownership store (``controller.redis_store.RedisStore``): the bundles each broker owns now;
* ``P:outcome-stream`` (written by the controller): decisions applied, counted by kind; read
  incrementally (only new entries each refresh), so a long run stays cheap;
* ``P:stream:progress``: the streaming job's last completed batch and its event-time clock.

The table follows ``pulsar-perf monitor-brokers`` (one row per broker) with a footer giving the
decisions applied, the spread of broker usage (max/mean and standard deviation of each broker's
largest resource percentage, Pulsar's ``getMaxResourceUsage``) and the last batch.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

DECISION_KINDS = ("split", "unload", "transfer", "merge")
_RESOURCES = ("cpu", "memory", "directMemory", "bandwidthIn", "bandwidthOut")


@dataclass(frozen=True)
class BrokerRow:
    """One broker as the streaming job last saw it, and what it owns in Redis."""

    broker: str
    cpu_pct: float
    memory_pct: float
    bandwidth_in_pct: float
    bandwidth_out_pct: float
    max_pct: float
    bundles: int
    topics: int
    msg_rate_in: float
    msg_rate_out: float


@dataclass(frozen=True)
class Spread:
    """How uneven broker usage is: max/mean and population std, of max usage in percent."""

    max_over_mean: float
    std_pct: float
    max_pct: float
    mean_pct: float

    def as_dict(self) -> dict[str, float]:
        return {
            "maxOverMean": round(self.max_over_mean, 3),
            "stdPct": round(self.std_pct, 2),
            "maxPct": round(self.max_pct, 2),
            "meanPct": round(self.mean_pct, 2),
        }


@dataclass(frozen=True)
class Snapshot:
    """Everything one refresh of the monitor shows."""

    rows: tuple[BrokerRow, ...]
    applied: Mapping[str, int]
    outcomes: Mapping[str, int]
    spread: Spread | None
    owning_brokers: frozenset[str]
    batch: int | None
    batch_event_ms: int | None
    batch_age_s: float | None
    read_at_ms: int

    @property
    def complete(self) -> bool:
        """Every broker that owns a bundle has a report in the snapshot."""
        have = {r.broker for r in self.rows}
        return bool(self.owning_brokers) and self.owning_brokers <= have


def spread_of(max_pcts: list[float]) -> Spread | None:
    """The spread of the given per-broker usages, or None without any broker."""
    if not max_pcts:
        return None
    mean = statistics.fmean(max_pcts)
    std = statistics.pstdev(max_pcts) if len(max_pcts) > 1 else 0.0
    top = max(max_pcts)
    return Spread(top / mean if mean > 0 else 1.0, std, top, mean)


def _pct(report: Mapping[str, Any], key: str) -> float:
    u = report.get(key)
    if not isinstance(u, dict) or not u.get("limit"):
        return 0.0
    return 100.0 * float(u.get("usage", 0.0)) / float(u["limit"])


def broker_row(broker: str, doc: Mapping[str, Any], bundles: int) -> BrokerRow:
    """A table row from a ``P:load:brokers`` document (layout in ``streaming.driver_view``)."""
    r = doc.get("report") or {}
    pcts = {k: _pct(r, k) for k in _RESOURCES}
    return BrokerRow(
        broker=broker,
        cpu_pct=pcts["cpu"],
        memory_pct=pcts["memory"],
        bandwidth_in_pct=pcts["bandwidthIn"],
        bandwidth_out_pct=pcts["bandwidthOut"],
        max_pct=max(pcts.values()),
        bundles=bundles,
        topics=int(r.get("numTopics", 0) or 0),
        msg_rate_in=float(r.get("msgRateIn", 0.0) or 0.0),
        msg_rate_out=float(r.get("msgRateOut", 0.0) or 0.0),
    )


@dataclass
class Monitor:
    """Reads snapshots from one Redis under one key prefix; keeps the outcome counts."""

    client: Any  # redis.Redis
    prefix: str = "lb"
    clock_ms: Callable[[], int] = field(default=lambda: int(time.time() * 1000))
    _last_id: str = "-"
    _applied: dict[str, int] = field(default_factory=dict)
    _outcomes: dict[str, int] = field(default_factory=dict)
    _batch: int | None = None
    _batch_seen_at: float | None = None

    @classmethod
    def from_url(cls, url: str, prefix: str = "lb", **redis_kwargs: Any) -> Monitor:
        """``redis_kwargs``: the configuration's ``redis_client_kwargs()`` (ACL user, TLS)."""
        import redis

        return cls(redis.Redis.from_url(url, socket_timeout=5, **redis_kwargs), prefix)

    def _read_outcomes(self) -> None:
        key = f"{self.prefix}:outcome-stream"
        while True:
            start = "-" if self._last_id == "-" else f"({self._last_id}"
            entries = self.client.xrange(key, min=start, max="+", count=1000)
            if not entries:
                return
            for entry_id, fields in entries:
                self._last_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                doc = {k.decode(): v.decode() for k, v in fields.items()}
                outcome = doc.get("outcome", "?")
                self._outcomes[outcome] = self._outcomes.get(outcome, 0) + 1
                if outcome == "applied":
                    kind = doc.get("kind", "?")
                    self._applied[kind] = self._applied.get(kind, 0) + 1

    def _owned_counts(self, now_ms: int) -> dict[str, int]:
        from controller.redis_store import RedisStore

        store = RedisStore(self.client, self.prefix, clock="server")
        counts: dict[str, int] = {}
        for ns in store.list_namespaces():
            try:
                owners = store.owners(ns, now_ms)
            except Exception:  # the namespace vanished between the two reads
                continue
            for lease in owners.values():
                counts[lease.broker] = counts.get(lease.broker, 0) + 1
        return counts

    def read(self) -> Snapshot:
        """One consistent-enough read (several keys, no transaction: it is a display)."""
        now_ms = self.clock_ms()
        self._read_outcomes()
        owned = self._owned_counts(now_ms)
        raw = self.client.hgetall(f"{self.prefix}:load:brokers")
        rows = []
        for name_b, value in sorted(raw.items()):
            name = name_b.decode()
            try:
                doc = json.loads(value)
            except ValueError:
                continue
            rows.append(broker_row(name, doc, owned.get(name, 0)))
        progress = self.client.hmget(f"{self.prefix}:stream:progress", "batch", "now_ms")
        batch = int(progress[0]) if progress[0] is not None else None
        event_ms = int(progress[1]) if progress[1] is not None else None
        if batch is not None and batch != self._batch:
            self._batch, self._batch_seen_at = batch, time.monotonic()
        age = None if self._batch_seen_at is None else time.monotonic() - self._batch_seen_at
        return Snapshot(
            rows=tuple(rows),
            applied=dict(self._applied),
            outcomes=dict(self._outcomes),
            spread=spread_of([r.max_pct for r in rows]),
            owning_brokers=frozenset(owned),
            batch=batch,
            batch_event_ms=event_ms,
            batch_age_s=age,
            read_at_ms=now_ms,
        )


def footer_text(s: Snapshot) -> str:
    """The footer line: decisions applied, usage spread, last batch."""
    applied = ", ".join(f"{k}s {s.applied.get(k, 0)}" for k in DECISION_KINDS[:3])
    if s.applied.get("merge"):
        applied += f", merges {s.applied['merge']}"
    other = sum(v for k, v in s.outcomes.items() if k != "applied")
    spread = (
        f"usage max/mean {s.spread.max_over_mean:.2f}, std {s.spread.std_pct:.1f} pts"
        if s.spread
        else "usage: no reports yet"
    )
    if s.batch is None:
        batch = "stream: no batch yet"
    else:
        when = time.strftime("%H:%M:%S", time.gmtime((s.batch_event_ms or 0) / 1000))
        age = f", seen {s.batch_age_s:.0f}s ago" if s.batch_age_s is not None else ""
        batch = f"stream: batch {s.batch} (event time {when}Z{age})"
    return f"applied: {applied} (other outcomes {other})  |  {spread}  |  {batch}"


def _rate(per_s: float) -> str:
    """Compact message rates (``55.8k``), so ten columns fit an 80-column terminal."""
    if per_s >= 1e6:
        return f"{per_s / 1e6:.1f}M"
    if per_s >= 1e3:
        return f"{per_s / 1e3:.1f}k"
    return f"{per_s:.0f}"


def render(s: Snapshot, title: str) -> Any:
    """A rich ``Table`` of the snapshot, in the spirit of ``pulsar-perf monitor-brokers``."""
    from rich import box
    from rich.table import Table

    # no vertical rules and short headers: ten columns fit an 80-column terminal
    table = Table(title=title, expand=False, box=box.SIMPLE_HEAD, padding=(0, 0), pad_edge=False)
    for col in (
        "broker", "CPU%", "MEM%", "BWin%", "BWout%", "MAX%",
        "bundles", "topics", "msg/s in", "msg/s out",
    ):  # fmt: skip
        table.add_column(col, justify="left" if col == "broker" else "right", no_wrap=True)
    for r in s.rows:
        table.add_row(
            r.broker,
            f"{r.cpu_pct:.1f}",
            f"{r.memory_pct:.1f}",
            f"{r.bandwidth_in_pct:.1f}",
            f"{r.bandwidth_out_pct:.1f}",
            f"{r.max_pct:.1f}",
            str(r.bundles),
            str(r.topics),
            _rate(r.msg_rate_in),
            _rate(r.msg_rate_out),
            style="bold red" if r.max_pct >= 85 else None,
        )
    table.caption = footer_text(s).replace("  |  ", "\n")  # one line per part
    table.caption_justify = "left"
    return table


def plain_line(s: Snapshot) -> str:
    """One log line per refresh for ``--no-monitor`` (tests, CI)."""
    brokers = " ".join(f"{r.broker}={r.max_pct:.0f}%/{r.bundles}b" for r in s.rows)
    return f"{footer_text(s)}  |  {brokers}"
