"""What ``lbctl monitor`` and ``lbctl run`` show, read from Redis (and Kafka for the lag).

Why Redis: the monitor must show what the product believes, not what a simulator knows, so it
works the same against a real cluster. Everything it needs is already there:

* ``P:load:brokers`` (written by the streaming job): each broker's latest report (CPU, memory,
  direct memory and bandwidth percentages, topics, producers, consumers, message rates and
  throughput) and its event time ``updatedAtMs``;
* the ownership store (``metadata_store.ownership_redis.RedisStore``): the bundles of every
  namespace and the live lease of each, so the owners, the unowned bundles and the leases
  about to expire;
* ``P:brokers`` / ``P:broker:<id>`` (the registry): who is registered and until when;
* ``P:outcome-stream`` (written by the controller): every decision's outcome with the decision's
  reason; read incrementally (only new entries each refresh), so a long run stays cheap;
* ``P:stream:progress``: the streaming job's last completed batch, its event-time clock and the
  job's own wall-clock time of the commit (how long ago the job last committed);
* ``P:processes`` (the process registry): each controller's last poll, sweep and consumer error,
  which with this refresh's Kafka probe and Redis reads give each service's state
  (``lbctl.monitor_services``); a Redis that does not answer is a snapshot saying so.
* ``P:policies``: the placement policies, to name each namespace they leave with no eligible
  live broker (``lbctl.policy_check``).

Time: leases and registrations are judged against Redis's ``TIME`` (the clock the store's
scripts use), report freshness against the job's event-time clock (a simulator stamps virtual
time, and the job's clock follows the reports, so the comparison holds for both).

The Kafka lag comes from ``lbctl.monitor_lag``; rendering and the ``lbctl monitor`` verb are in
``lbctl.monitor_cmd``.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import redis

from infra.redis_client import PROBE_TIMEOUT_S, connect
from lbctl.monitor_services import (
    ServiceState,
    controller_states,
    kafka_state,
    redis_state,
    stream_state,
    trouble_lines,
)
from lbctl.policy_check import policy_problems
from loadbalance.config import LoadBalancerConfig
from loadbalance.values import DecisionKind, OutcomeKind
from metadata_store.load_snapshot import decode_broker_docs
from metadata_store.ownership_redis import RedisStore
from metadata_store.progress import RedisProgress

DECISION_KINDS = DecisionKind.values()
_RESOURCES = ("cpu", "memory", "directMemory", "bandwidthIn", "bandwidthOut")


@dataclass(frozen=True)
class BrokerRow:
    """One broker as the streaming job last saw it, and what it owns in Redis.

    The columns are those of ``pulsar-perf monitor-brokers`` (SYSTEM, COUNT and LATEST rows of
    its per-broker table), one row per broker.
    """

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
    direct_memory_pct: float = 0.0
    producers: int = 0
    consumers: int = 0
    throughput_in_kb_per_s: float = 0.0
    throughput_out_kb_per_s: float = 0.0
    updated_at_ms: int | None = None


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
class DecisionRow:
    """One entry of the controller's outcome stream: what was asked, why, and how it ended."""

    at_ms: int
    kind: str
    bundle: str
    outcome: str
    reason: str  # the outcome's reason ("owner changed: now b2"), often empty when applied
    decision_reason: str  # the policy's reason ("Overloaded", "HighRate")
    source: str
    destination: str
    decision_id: str
    # what the monitor measured when it first read the decision ("b3 at 44.8 % is 1.21x the
    # mean (37.0 %)"): shown to operators, where a reason name alone can read false
    condition: str = ""


@dataclass(frozen=True)
class ExpiringLease:
    bundle: str
    broker: str
    expires_in_s: float


@dataclass(frozen=True)
class Health:
    """Leases and registry: what an operator checks before trusting the table."""

    bundles: int = 0
    owned: int = 0
    expiring: tuple[ExpiringLease, ...] = ()  # live leases that end within the window
    expiring_window_s: float = 0.0
    registered: tuple[str, ...] = ()
    live: tuple[str, ...] = ()
    registration_expired: Mapping[str, float] = field(default_factory=dict)  # -> s since beat
    reports_stale: Mapping[str, float] = field(default_factory=dict)  # -> s behind the job
    without_report: tuple[str, ...] = ()  # live, registered, no load report
    unregistered_reporting: tuple[str, ...] = ()  # a report, no live registration
    # namespaces the placement policies leave with no eligible live broker (one line each)
    policy_problems: tuple[str, ...] = ()

    @property
    def unowned(self) -> int:
        return self.bundles - self.owned

    @property
    def stale_brokers(self) -> list[str]:
        """Brokers whose registration expired or whose reports stopped, sorted."""
        return sorted({*self.registration_expired, *self.reports_stale})


@dataclass(frozen=True)
class Lag:
    """The streaming job's position on the load-reports topic (see ``LagProbe``)."""

    topic: str
    end_offsets: Mapping[int, int]
    processed_offsets: Mapping[int, int] | None  # None: the job's offsets are not readable here
    checked_at_ms: int
    error: str = ""

    @property
    def records(self) -> int | None:
        if self.processed_offsets is None:
            return None
        return sum(
            max(0, e - self.processed_offsets.get(p, 0)) for p, e in self.end_offsets.items()
        )


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
    decisions: tuple[DecisionRow, ...] = ()  # the latest, newest first
    new_decisions: tuple[DecisionRow, ...] = ()  # read by this refresh, oldest first
    health: Health | None = None
    lag: Lag | None = None
    overloaded_pct: float = 85.0
    balanced_max_over_mean: float = 1.10
    services: tuple[ServiceState, ...] = ()  # Kafka, Redis, the job, each controller
    batch_wall_ms: int | None = None  # the job's own clock at its last commit

    @property
    def trouble(self) -> list[str]:
        """One line per service in trouble (down, stale), empty when all is well."""
        return trouble_lines(self.services)

    def service(self, name: str) -> ServiceState | None:
        return next((s for s in self.services if s.name == name), None)

    @property
    def complete(self) -> bool:
        """Every broker that owns a bundle has a report in the snapshot."""
        have = {r.broker for r in self.rows}
        return bool(self.owning_brokers) and self.owning_brokers <= have

    @property
    def balanced(self) -> bool | None:
        if self.spread is None:
            return None
        return self.spread.max_over_mean <= self.balanced_max_over_mean

    def as_dict(self) -> dict[str, Any]:
        """The ``--json`` document: every value the screen shows, in Pulsar's spelling."""
        h = self.health or Health()
        lag = self.lag
        return {
            "readAtMs": self.read_at_ms,
            "brokers": [
                {**camel(r), "overloaded": r.max_pct >= self.overloaded_pct} for r in self.rows
            ],
            "spread": self.spread.as_dict() if self.spread else None,
            "balanced": self.balanced,
            "balancedMaxOverMean": self.balanced_max_over_mean,
            "overloadedThresholdPct": self.overloaded_pct,
            "applied": dict(self.applied),
            "outcomes": dict(self.outcomes),
            "decisions": [camel(d) for d in self.decisions],
            "leases": {
                "bundles": h.bundles,
                "owned": h.owned,
                "unowned": h.unowned,
                "expiringWithinS": h.expiring_window_s,
                "expiring": [camel(e) for e in h.expiring],
            },
            "registry": {
                "registered": list(h.registered),
                "live": list(h.live),
                "registrationExpired": {k: round(v, 1) for k, v in h.registration_expired.items()},
                "reportsStale": {k: round(v, 1) for k, v in h.reports_stale.items()},
                "withoutReport": list(h.without_report),
                "unregisteredReporting": list(h.unregistered_reporting),
                "staleBrokers": h.stale_brokers,
            },
            "policyProblems": list(h.policy_problems),
            "services": [s.as_dict() for s in self.services],
            "trouble": self.trouble,
            "stream": {
                "batch": self.batch,
                "eventTimeMs": self.batch_event_ms,
                "committedAtMs": self.batch_wall_ms,
                "batchAgeS": None if self.batch_age_s is None else round(self.batch_age_s, 1),
                "topic": lag.topic if lag else None,
                "endOffsets": {str(p): o for p, o in lag.end_offsets.items()} if lag else None,
                "processedOffsets": (
                    {str(p): o for p, o in lag.processed_offsets.items()}
                    if lag and lag.processed_offsets is not None
                    else None
                ),
                "lagRecords": lag.records if lag else None,
                "lagError": lag.error if lag and lag.error else None,
            },
        }


def camel(value: Any) -> dict[str, Any]:
    """A frozen row as a JSON object: camelCase keys (units kept), floats to 3 decimals."""

    def key(name: str) -> str:
        head, *rest = name.split("_")
        return head + "".join(w.capitalize() for w in rest)

    return {key(k): round(v, 3) if isinstance(v, float) else v for k, v in asdict(value).items()}


def spread_of(max_pcts: list[float]) -> Spread | None:
    """The spread of the given per-broker usages, or None without any broker."""
    if not max_pcts:
        return None
    mean = statistics.fmean(max_pcts)
    std = statistics.pstdev(max_pcts) if len(max_pcts) > 1 else 0.0
    top = max(max_pcts)
    return Spread(top / mean if mean > 0 else 1.0, std, top, mean)


def _pct(report: Mapping[str, Any], key: str) -> float:
    """Pulsar's ``ResourceUsage.percentUsage``; an unknown reading (limit <= 0) counts 0."""
    u = report.get(key)
    if not isinstance(u, dict):
        return 0.0
    try:
        usage, limit = float(u.get("usage", 0.0)), float(u.get("limit") or 0.0)
    except (TypeError, ValueError):
        return 0.0
    return 100.0 * usage / limit if limit > 0 and usage >= 0 else 0.0


def _num(report: Mapping[str, Any], key: str) -> float:
    try:
        return float(report.get(key, 0.0) or 0.0)
    except (TypeError, ValueError):
        return 0.0


def broker_row(broker: str, doc: Mapping[str, Any], bundles: int) -> BrokerRow:
    """A table row from a ``P:load:brokers`` document (layout in ``streaming.driver_view``)."""
    r = doc.get("report") or {}
    pcts = {k: _pct(r, k) for k in _RESOURCES}
    updated = doc.get("updatedAtMs")
    return BrokerRow(
        broker=broker,
        cpu_pct=pcts["cpu"],
        memory_pct=pcts["memory"],
        bandwidth_in_pct=pcts["bandwidthIn"],
        bandwidth_out_pct=pcts["bandwidthOut"],
        max_pct=max(pcts.values()),
        bundles=bundles,
        topics=int(_num(r, "numTopics")),
        msg_rate_in=_num(r, "msgRateIn"),
        msg_rate_out=_num(r, "msgRateOut"),
        direct_memory_pct=pcts["directMemory"],
        producers=int(_num(r, "numProducers")),
        consumers=int(_num(r, "numConsumers")),
        throughput_in_kb_per_s=_num(r, "msgThroughputIn") / 1024,
        throughput_out_kb_per_s=_num(r, "msgThroughputOut") / 1024,
        updated_at_ms=int(updated) if isinstance(updated, int | float) else None,
    )


def _text(fields: Mapping[bytes, bytes], key: str) -> str:
    value = fields.get(key.encode())
    return value.decode(errors="replace") if value is not None else ""


def decision_row(fields: Mapping[bytes, bytes]) -> DecisionRow:
    """An outcome-stream entry (fields in ``metadata_store.outcomes``)."""
    try:
        at_ms = int(_text(fields, "atMs") or 0)
    except ValueError:
        at_ms = 0
    return DecisionRow(
        at_ms=at_ms,
        kind=_text(fields, "kind") or "?",
        bundle=_text(fields, "bundle"),
        outcome=_text(fields, "outcome") or "?",
        reason=_text(fields, "reason"),
        decision_reason=_text(fields, "decisionReason"),
        source=_text(fields, "source"),
        destination=_text(fields, "destination"),
        decision_id=_text(fields, "id"),
    )


def measured_condition(row: DecisionRow, usage: Mapping[str, float]) -> str:
    """The measured condition behind a move, for operators: the source broker's largest usage
    and its ratio to the mean of all brokers (and the destination's usage), from the reports
    read with the decision. The decision record keeps Pulsar's reason name; a name such as
    "Overloaded" can read false for a broker at 45 % in a cluster whose mean is 37 %. Splits
    and other kinds keep their reason name, which already names the measured quantity."""
    if row.kind not in ("unload", "transfer") or row.source not in usage or not usage:
        return row.decision_reason
    mean = statistics.fmean(usage.values())
    src = usage[row.source]
    text = f"{row.source} at {src:.1f} %"
    if mean > 0:
        text += f" is {src / mean:.2f}x the mean ({mean:.1f} %)"
    if row.destination in usage:
        text += f"; {row.destination} at {usage[row.destination]:.1f} %"
    return text


@dataclass
class Monitor:
    """Reads snapshots from one Redis under one key prefix; keeps the outcome counts.

    ``lag_probe``: a callable giving the current ``Lag`` (``lbctl.monitor_lag.LagProbe``), or
    None to leave Kafka out. ``expiring_window_s``: leases ending within this are listed;
    ``stale_after_s``: a broker whose last report is this far behind the job's clock is stale.
    """

    client: Any  # redis.Redis
    prefix: str = "lb"
    clock_ms: Callable[[], int] = field(default=lambda: int(time.time() * 1000))
    lag_probe: Callable[[], Lag | None] | None = None
    expiring_window_s: float = 10.0
    stale_after_s: float = 60.0
    overloaded_pct: float = 85.0
    balanced_max_over_mean: float = 1.10
    recent: int = 10
    stream_stale_after_s: float = 30.0  # no commit by the job's clock for this long: stale
    control_stale_after_s: float = 10.0  # a controller beats every second
    kafka_configured: bool = False
    _last_id: str = "-"
    _applied: dict[str, int] = field(default_factory=dict)
    _outcomes: dict[str, int] = field(default_factory=dict)
    _recent: deque = field(default_factory=lambda: deque(maxlen=50))
    _batch: int | None = None
    _batch_seen_at: float | None = None
    _store: RedisStore | None = field(default=None, init=False, repr=False)

    @property
    def store(self) -> RedisStore:
        """The ownership store over ``client`` (Redis's clock), whose repositories give the rest."""
        if self._store is None:
            self._store = RedisStore(self.client, self.prefix, clock="server")
        return self._store

    @classmethod
    def connect(cls, url: str, config: LoadBalancerConfig) -> Monitor:
        """A monitor over the configuration's Redis client (``infra.redis_client``), with
        probe timeouts: a Redis that does not answer is shown, not waited for."""
        client = connect(url, config, purpose="monitor", socket_timeout=PROBE_TIMEOUT_S)
        return cls(client, config.redis_key_prefix)

    def _read_outcomes(self, usage: Mapping[str, float]) -> list[DecisionRow]:
        new: list[DecisionRow] = []
        while True:
            entries = self.store.outcomes.read_after(self._last_id, 1000)
            if not entries:
                break
            for entry_id, fields in entries:
                self._last_id = entry_id
                row = decision_row(fields)
                row = replace(row, condition=measured_condition(row, usage))
                self._outcomes[row.outcome] = self._outcomes.get(row.outcome, 0) + 1
                if row.outcome == OutcomeKind.APPLIED:
                    self._applied[row.kind] = self._applied.get(row.kind, 0) + 1
                new.append(row)
        self._recent.extend(new[-self._recent.maxlen :])
        return new

    def _server_ms(self) -> int:
        return self.store.server_time_ms()

    def _leases(self, now_ms: int) -> tuple[dict[str, int], int, int, list[ExpiringLease]]:
        """Owned-bundle counts per broker, bundles, owned bundles, leases ending soon."""
        store = self.store
        counts: dict[str, int] = {}
        bundles = owned = 0
        soon: list[ExpiringLease] = []
        window_ms = self.expiring_window_s * 1000
        for ns in store.list_namespaces():
            try:
                nb = store.get_namespace(ns)
                owners = store.owners(ns, now_ms)
            except Exception:  # the namespace vanished between the two reads
                continue
            bundles += len(nb.bundle_names) if nb is not None else 0
            for lease in owners.values():
                owned += 1
                counts[lease.broker] = counts.get(lease.broker, 0) + 1
                left_ms = lease.expires_at_ms - now_ms
                if left_ms <= window_ms:
                    soon.append(ExpiringLease(lease.bundle, lease.broker, round(left_ms / 1000, 1)))
        soon.sort(key=lambda e: (e.expires_in_s, e.bundle))
        return counts, bundles, owned, soon

    def _registry(self, now_ms: int) -> tuple[list[str], list[str], dict[str, float]]:
        """Registered ids, live ids, and expired registrations -> seconds since the heartbeat."""
        registrations = self.store.registrations()
        live, expired = [], {}
        for b, (beat, expires) in registrations.items():
            if expires is not None and expires > now_ms:
                live.append(b)
            else:
                expired[b] = (now_ms - beat) / 1000 if beat is not None else float("inf")
        return list(registrations), live, expired

    def read(self) -> Snapshot:
        """One refresh. A Redis that does not answer gives a snapshot that says so (with
        Kafka's state), not an exception: the screen must show the outage."""
        try:
            return self._read()
        except (redis.ConnectionError, redis.TimeoutError) as e:
            lag = self.lag_probe() if self.lag_probe is not None else None
            services = (kafka_state(lag, self.kafka_configured), redis_state(str(e) or "no answer"))
            return Snapshot(
                rows=(), applied=dict(self._applied), outcomes=dict(self._outcomes), spread=None,
                owning_brokers=frozenset(), batch=self._batch, batch_event_ms=None,
                batch_age_s=None, read_at_ms=self.clock_ms(),
                decisions=tuple(reversed(list(self._recent)[-self.recent :])), lag=lag,
                overloaded_pct=self.overloaded_pct,
                balanced_max_over_mean=self.balanced_max_over_mean, services=services,
            )  # fmt: skip

    def _services(self, batch: int | None, wall_ms: int | None, lag: Lag | None) -> tuple:
        """Kafka, Redis (it answered: this is called after the reads), the job, controllers."""
        now_ms = self.clock_ms()
        unread = lag.records if lag is not None and not lag.error else None
        return (
            kafka_state(lag, self.kafka_configured),
            redis_state(None),
            stream_state(batch, wall_ms, now_ms, self.stream_stale_after_s, unread),
            *controller_states(
                self.store.processes.entries("control"), now_ms, self.control_stale_after_s
            ),
        )

    def _broker_rows(self, owned: Mapping[str, int]) -> list[BrokerRow]:
        """One row per broker document of the load snapshot, sorted; unreadable ones skipped."""
        docs = decode_broker_docs(self.store.load_snapshot.broker_docs_raw(), skip_unreadable=True)
        return [broker_row(name, docs[name], owned.get(name, 0)) for name in sorted(docs)]

    def _read(self) -> Snapshot:
        """One consistent-enough read (several keys, no transaction: it is a display)."""
        now_ms = self.clock_ms()
        server_ms = self._server_ms()
        owned, n_bundles, n_owned, soon = self._leases(server_ms)
        registered, live, expired = self._registry(server_ms)
        rows = self._broker_rows(owned)
        new = self._read_outcomes({r.broker: r.max_pct for r in rows})
        progress = RedisProgress(self.client, self.prefix)
        batch, event_ms = progress.batch_and_clock()
        wall_ms = progress.committed_wall_ms()
        if batch is not None and batch != self._batch:
            self._batch, self._batch_seen_at = batch, time.monotonic()
        if wall_ms is not None:  # the job's own clock: a stopped job ages from its last commit
            age = max(0.0, (now_ms - wall_ms) / 1000)
        else:
            age = None if self._batch_seen_at is None else time.monotonic() - self._batch_seen_at
        stale = {}
        if event_ms is not None:
            for r in rows:
                behind_s = (event_ms - r.updated_at_ms) / 1000 if r.updated_at_ms else None
                if behind_s is not None and behind_s > self.stale_after_s:
                    stale[r.broker] = behind_s
        reporting = {r.broker for r in rows}
        health = Health(
            bundles=n_bundles,
            owned=n_owned,
            expiring=tuple(soon),
            expiring_window_s=self.expiring_window_s,
            registered=tuple(registered),
            live=tuple(live),
            registration_expired=expired,
            reports_stale=stale,
            without_report=tuple(b for b in live if b not in reporting),
            unregistered_reporting=tuple(sorted(reporting - set(live))),
            policy_problems=tuple(
                policy_problems(self.store, live, {r.broker: r.max_pct for r in rows})
            ),
        )
        lag = self.lag_probe() if self.lag_probe is not None else None
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
            decisions=tuple(reversed(list(self._recent)[-self.recent :])),
            new_decisions=tuple(new),
            health=health,
            lag=lag,
            overloaded_pct=self.overloaded_pct,
            balanced_max_over_mean=self.balanced_max_over_mean,
            services=self._services(batch, wall_ms, lag),
            batch_wall_ms=wall_ms,
        )
