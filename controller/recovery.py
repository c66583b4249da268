"""Rebuild a valid store after Redis lost its data, from what the brokers report, and say so.

Why: with AOF persistence on, a Redis restart keeps ranges and leases (docs/reliability.md).
Without it (or after a failover to an empty replica) every key is gone, while the brokers keep
serving their bundles. Pulsar would rebuild ownership from the brokers re-registering their
ephemeral nodes; here the brokers re-register (``P:broker:<id>``, every agent check) and keep
reporting the bundles they serve, so the controller can rebuild:

1. **detect** (``detect_loss``): the epoch key ``P:epoch`` (written with the first namespace,
   see ``RedisStore.create_namespace``) is missing or differs from the one this controller saw,
   or it is missing while brokers report bundles of namespaces Redis does not know;
2. **rebuild namespaces** (``recover``) from the claimed bundles: claims are taken narrowest
   first (a split's children win over a stale report of their parent), overlapping ones are
   refused, and every gap between claimed ranges becomes one unowned bundle, so each namespace
   covers the ring exactly; namespaces nobody reports come back with their default bundles if
   the caller names them (``known_namespaces``), else they stay lost and the report says so;
3. **re-grant leases** to the claimants that are registered and live, after raising the fencing
   counter to ``token_floor`` (the highest token anyone may still hold: the largest trusted
   token on the ownership-events topic, ``scan_events``), so every new token is above every
   old one and a broker's remembered token is refused. The topic is input like any other:
   invalid records are skipped and counted, a token far above the others is not trusted
   (``trusted_floor``), and everything is validated before the first write, so a bad record
   can neither crash the controller nor leave a half-written store;
4. **report** (``RecoveryReport``, also stored at ``P:recovery:last`` and streamed to
   ``P:recovery-log``): what was rebuilt, from what, and what is lost for good.

``lbctl control`` runs this by itself (``AutoRecovery``, called by ``controller.loop.run_loop``):
it holds decisions and sweeps from the detection until the recovery, logs a one-line
``summary``, and announces the re-granted leases on the ownership-events topic
(``recovery_events``). ``python -m controller.recovery`` stays for ``--no-auto-recover``.

Namespace versions restart at the recovery time in ms, above any version the lost store could
have had, so a cache keyed by version (lookups, the streaming job) cannot take the rebuilt
boundaries for the ones it saw. Time is an argument (``now_ms``), as everywhere in the store.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from controller.events import ASSIGNED, MAX_TOKEN, InvalidEvent, OwnershipEvent, decode_event
from infra import preflight
from infra.config_loading import add_config_arguments, load_from_args
from infra.offsets import latest_offsets
from infra.redis_client import connect
from infra.topics import kafka_client_config
from loadbalance.bundles import FULL_LOWER, FULL_UPPER, NamespaceBundles, parse_bundle
from loadbalance.config import ConfigError, LoadBalancerConfig
from loadbalance.errors import Conflict, InvalidInput, Transient
from metadata_store.leases import BrokerNotAlive
from metadata_store.ownership_redis import RedisStore

log = logging.getLogger("lbctl.recovery")

# What no broker can give back; listed in every report so an operator knows what to expect.
ALWAYS_LOST = (
    "decision outcomes (de-duplication history): a decision replayed from Kafka is applied "
    "again as a level-based hint, re-checked against the rebuilt state",
    "split/merge history: namespace versions restart at the recovery time",
    "load snapshot, stream progress and preallocations: the streaming job rewrites the snapshot "
    "from the next reports; its cycle state (grace periods) starts afresh",
)


def current_epoch(store: RedisStore) -> str | None:
    return store.recovery_state.epoch()


def claims_from_snapshot(store: RedisStore, now_ms: int) -> dict[str, list[str]]:
    """broker -> bundles it reports, from the load snapshot the streaming job rewrites after
    the loss, keeping only brokers registered and live again."""
    live = set(store.live_brokers(now_ms))
    claims: dict[str, list[str]] = {}
    for bundle, broker in store.load_snapshot.read().owners().items():
        if broker in live:
            claims.setdefault(broker, []).append(bundle)
    return {b: sorted(v) for b, v in sorted(claims.items())}


def detect_loss(
    store: RedisStore, known_epoch: str | None, claims: Mapping[str, Iterable[str]]
) -> str | None:
    """Why we think Redis lost its data, or None if it did not."""
    epoch = current_epoch(store)
    if known_epoch is not None and epoch is None:
        return f"the epoch key {store.keys.epoch()} is gone (this controller saw {known_epoch})"
    if known_epoch is not None and epoch != known_epoch:
        return f"the epoch changed from {known_epoch} to {epoch} (another dataset)"
    if epoch is None:
        known = set(store.list_namespaces())
        unknown = sorted({parse_bundle(b).namespace for bs in claims.values() for b in bs} - known)
        if unknown:
            return f"no epoch key, and brokers report bundles of unknown namespaces: {unknown}"
    return None


@dataclass
class NamespaceRebuild:
    """How one namespace was rebuilt."""

    bundles: int
    from_reports: int
    gaps_filled: int
    source: str  # "reports" or "default"


@dataclass
class RecoveryReport:
    """What ``recover`` did and what is lost; stored as JSON at ``P:recovery:last``."""

    reason: str
    at_ms: int
    epoch: str
    token_floor: int
    namespaces: dict[str, NamespaceRebuild] = field(default_factory=dict)
    leases_granted: dict[str, tuple[str, int]] = field(default_factory=dict)
    unowned: list[str] = field(default_factory=list)
    refused: list[tuple[str, str, str]] = field(default_factory=list)  # bundle, broker, why
    lost: list[str] = field(default_factory=list)
    events_read: int = 0
    events_skipped: int = 0
    tokens_ignored: int = 0
    event_problems: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def _rebuild_boundaries(
    claims: list[tuple[str, str]],
) -> tuple[list[int], list[tuple[str, str]], list[tuple[str, str, str]]]:
    """Boundaries covering the ring from (bundle, broker) claims of one namespace.

    Returns (boundaries, accepted claims, refused claims with a reason)."""
    ranges = sorted(
        ((parse_bundle(b), b, broker) for b, broker in claims),
        key=lambda x: (x[0].upper - x[0].lower, x[0].lower, x[2]),
    )
    taken: list[tuple[int, int]] = []
    accepted: list[tuple[str, str]] = []
    refused: list[tuple[str, str, str]] = []
    for r, name, broker in ranges:
        clash = next(((lo, hi) for lo, hi in taken if r.lower < hi and lo < r.upper), None)
        if clash is not None:
            why = f"overlaps 0x{clash[0]:08x}_0x{clash[1]:08x}, claimed narrower or first"
            refused.append((name, broker, why))
            continue
        taken.append((r.lower, r.upper))
        accepted.append((name, broker))
    points = {FULL_LOWER, FULL_UPPER}
    for lo, hi in taken:
        points.update((lo, hi))
    return sorted(points), accepted, refused


def recover(
    store: RedisStore,
    claims: Mapping[str, Iterable[str]],
    *,
    now_ms: int,
    lease_ttl_ms: int,
    token_floor: int,
    reason: str,
    known_namespaces: Mapping[str, int] | None = None,
    events: EventScan | None = None,
) -> RecoveryReport:
    """Rebuild namespaces and leases from ``claims`` (broker -> bundles it serves).

    Meant for an empty (or partly rewritten) store: a namespace that still exists in Redis is
    left as it is, and its claimed bundles are only re-leased. See the module docstring.
    ``token_floor`` must be an integer that leaves room for the grants below 2**53-1
    (``InvalidInput`` otherwise, raised before anything is written); ``events``, the scan it
    came from, puts the counts of skipped records and ignored tokens in the report.
    """
    grants_max = _check_floor(claims, token_floor, events)
    epoch = uuid.uuid4().hex
    report = RecoveryReport(reason, now_ms, epoch, token_floor, lost=list(ALWAYS_LOST))
    if events is not None:
        report.events_read = events.read
        report.events_skipped = events.skipped
        report.tokens_ignored = len(events.ignored_tokens)
        report.event_problems = list(events.problems)
    by_ns = _claims_by_namespace(claims, report)
    # Everything is computed and validated before the first write, so nothing in the input can
    # leave a half-written store: the fence, the namespaces, then the leases.
    existing = set(store.list_namespaces())
    grants, writes = _plan_namespaces(by_ns, existing, known_namespaces or {}, report, now_ms)
    # fence first: every token granted from here on is above anything handed out before. A
    # counter that is not an integer in range (written by hand) is refused before any write.
    store.recovery_state.raise_fence(token_floor, MAX_TOKEN - grants_max)
    for ns, bounds in writes:
        _write_namespace(store, ns, bounds, now_ms)
    granted = _grant_leases(store, grants, report, now_ms, lease_ttl_ms)
    for ns in sorted(report.namespaces):
        nb = store.get_namespace(ns)
        assert nb is not None
        report.unowned += [b for b in nb.bundle_names if b not in granted]
    report.lost.append(
        "namespaces that no broker reports and the caller did not name cannot be known; "
        f"the store now holds {sorted(existing | set(report.namespaces))}"
    )
    store.recovery_state.finish(epoch, report.to_json())
    return report


def _check_floor(
    claims: Mapping[str, Iterable[str]], token_floor: int, events: EventScan | None
) -> int:
    """Refuse a token floor that is not an integer leaving room for every grant below
    2**53-1 (or differs from the scan's); the most grants the claims can give."""
    if events is not None and events.floor != token_floor:
        raise InvalidInput("token_floor", "differs from the floor of the events scan given")
    grants_max = sum(len(set(b)) for b in claims.values())
    if not isinstance(token_floor, int) or isinstance(token_floor, bool):
        raise InvalidInput("token_floor", f"expected an integer, got {type(token_floor).__name__}")
    if not 0 <= token_floor <= MAX_TOKEN - grants_max:
        raise InvalidInput("token_floor", f"{token_floor} leaves no room below 2**53-1")
    return grants_max


def _claims_by_namespace(
    claims: Mapping[str, Iterable[str]], report: RecoveryReport
) -> dict[str, list[tuple[str, str]]]:
    """Namespace -> ``(bundle, broker)`` claims, in a stable order; names that are no bundle
    go to ``report.refused``."""
    by_ns: dict[str, list[tuple[str, str]]] = {}
    for broker, bundles in sorted(claims.items()):
        for b in sorted(set(bundles)):
            try:
                by_ns.setdefault(parse_bundle(b).namespace, []).append((b, broker))
            except InvalidInput as e:
                report.refused.append((b, broker, f"not a bundle name: {e}"))
    return by_ns


def _plan_namespaces(
    by_ns: Mapping[str, list[tuple[str, str]]],
    existing: set[str],
    known_namespaces: Mapping[str, int],
    report: RecoveryReport,
    now_ms: int,
) -> tuple[list[tuple[str, str]], list[tuple[str, list[int]]]]:
    """The leases to grant and the namespaces to write, validated, without writing anything.

    A namespace still in the store keeps its boundaries (its claims are only re-leased); a
    claimed one is rebuilt from its claims; a named one nobody claims gets its default bundles.
    """
    grants: list[tuple[str, str]] = []
    writes: list[tuple[str, list[int]]] = []
    for ns, ns_claims in sorted(by_ns.items()):
        if ns in existing:
            grants += ns_claims
            continue
        bounds, accepted, refused = _rebuild_boundaries(ns_claims)
        NamespaceBundles(ns, tuple(bounds), now_ms)  # validates: covers the ring, increasing
        report.refused += refused
        grants += accepted
        writes.append((ns, bounds))
        report.namespaces[ns] = NamespaceRebuild(
            len(bounds) - 1, len(accepted), len(bounds) - 1 - len(accepted), "reports"
        )
    for ns, n in sorted(known_namespaces.items()):
        if ns not in by_ns and ns not in existing:
            bounds = list(NamespaceBundles.initial(ns, n).boundaries)
            writes.append((ns, bounds))
            report.namespaces[ns] = NamespaceRebuild(n, 0, n, "default")
    return grants, writes


def _grant_leases(
    store: RedisStore,
    grants: list[tuple[str, str]],
    report: RecoveryReport,
    now_ms: int,
    lease_ttl_ms: int,
) -> set[str]:
    """Lease each claimed bundle to its claimant; the bundles granted. A claimant that is not
    live, or a lease that cannot be taken, is refused in the report, not raised."""
    granted = set()
    for bundle, broker in grants:
        try:
            lease = store.acquire(bundle, broker, now_ms, lease_ttl_ms)
        except BrokerNotAlive:
            report.refused.append((bundle, broker, "broker not registered and live"))
            continue
        except (Conflict, InvalidInput) as e:
            report.refused.append((bundle, broker, str(e)))
            continue
        report.leases_granted[bundle] = (broker, lease.token)
        granted.add(bundle)
    return granted


def _write_namespace(store: RedisStore, ns: str, bounds: list[int], now_ms: int) -> None:
    """Create ``ns`` with ``bounds`` unless it exists (a racing creator wins, we re-lease)."""
    NamespaceBundles(ns, tuple(bounds), now_ms)  # validates: covers the ring, increasing
    store.recovery_state.write_namespace(ns, bounds, now_ms)


# A token more than this above every lower token on the topic is not trusted as the floor.
MAX_TOKEN_GAP = 2**20
# At most this many skipped-record reasons are kept in a report (the counts are exact).
MAX_PROBLEMS = 20


@dataclass
class EventScan:
    """What one read of the ownership-events topic found: the trusted floor and the rest."""

    floor: int = 0
    read: int = 0
    skipped: int = 0
    ignored_tokens: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def problem(self, text: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text)


def trusted_floor(tokens: Iterable[int]) -> tuple[int, list[int]]:
    """The largest token that can be trusted as the fence floor, and the outliers above it.

    The rule: sort the distinct tokens; walking down from the largest, a token is trusted when
    another distinct token lies at most ``MAX_TOKEN_GAP`` below it, or when it is the smallest
    one (there is nothing to compare it with, and ``decode_event`` already bounded it to
    1..2**53-1). The first trusted token is the floor; the ones above it are ignored.

    Why a gap: every real token is a value of one Redis counter (``P:fence``, ``INCR``) that
    grows by one per grant, and every grant a controller makes is announced here. So the real
    tokens near the top of the topic lie close together: between two of them there are only
    the grants nobody announced (a lookup made without Kafka) or records the topic's retention
    or compaction dropped. A token more than 2**20 grants (about twelve days of one grant a
    second, all unannounced) above the next is not the counter's: it is a corrupt record (a
    flipped high bit, a stray 10**12), and trusting it would spend the token space or, near
    2**63, overflow the counter mid-recovery. A median or a percentile would be worse: it moves
    with how many bundles a namespace has, and one bundle that changes owner often legitimately
    sits far above the median. Distinct tokens count, so a duplicated record (publishing is at
    least once) cannot vouch for itself.

    What the rule does not cover: two or more forged tokens placed close together vouch for
    each other (the topic's write ACL is the defence against a forger, not this rule); and a
    real gap above ``MAX_TOKEN_GAP`` would give a floor too low. Either way every ignored token
    is logged and reported, so an operator can raise ``P:fence`` by hand.
    """
    distinct = sorted(set(tokens), reverse=True)
    ignored: list[int] = []
    for i, t in enumerate(distinct):
        below = distinct[i + 1] if i + 1 < len(distinct) else None
        if below is None or t - below <= MAX_TOKEN_GAP:
            return t, sorted(ignored)
        ignored.append(t)
    return 0, sorted(ignored)


def scan_events(
    bootstrap_servers: str,
    topic: str,
    client_config: Mapping[str, Any] | None = None,
    timeout_s: float = 30.0,
) -> EventScan:
    """Read the ownership-events topic to its end and find the fence floor (``trusted_floor``
    of the ``oldToken``/``newToken`` of every valid event).

    Why this source: it lives outside Redis, so it survives the loss, and every lease the
    controller granted or moved was announced there. Events are keyed by bundle, so even a
    compacted topic keeps each bundle's newest token. Reads every partition to the end offset
    it had when called; raises ``Transient`` if it cannot, because a floor that is too low
    would let a new token equal one a stale broker still holds.

    A record that ``decode_event`` refuses (not UTF-8, not JSON, nested too deeply, a missing
    key, a wrong type, a token outside 1..2**53-1, a bad bundle name) is skipped, counted and
    logged with its partition, offset and reason; nothing on the topic can make this raise
    anything but ``Transient``.
    """

    ends = latest_offsets(bootstrap_servers, topic, client_config, timeout_s=timeout_s)
    left = {p: end for p, end in ends.items() if end > 0}
    conf = kafka_client_config(bootstrap_servers, client_config)
    conf.update({"group.id": f"lb-recovery-{uuid.uuid4().hex[:8]}",
                 "enable.auto.commit": False, "enable.partition.eof": True})  # fmt: skip
    consumer = Consumer(conf)
    scan = EventScan()
    tokens: set[int] = set()
    deadline = time.monotonic() + timeout_s
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in left])
        while left and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    left.pop(m.partition(), None)
                continue
            _scan_record(scan, tokens, topic, m)
            if m.offset() + 1 >= left.get(m.partition(), 0):
                left.pop(m.partition(), None)
    finally:
        consumer.close()
    if left:
        raise Transient(f"{topic}: could not read partitions {sorted(left)} to their end")
    _set_floor(scan, tokens)
    return scan


def _scan_record(scan: EventScan, tokens: set[int], topic: str, m: Any) -> None:
    """Count one record; keep its tokens, or skip it (counted and logged) when invalid."""
    scan.read += 1
    try:
        e = decode_event(m.value() or b"")
    except InvalidEvent as err:
        scan.skipped += 1
        where = f"{topic}/{m.partition()}@{m.offset()}"
        scan.problem(f"{where}: {err}")
        log.warning("skipped ownership event %s: %s", where, err)
    else:
        tokens.update(t for t in (e.old_token, e.new_token) if t is not None)


def _set_floor(scan: EventScan, tokens: set[int]) -> None:
    """The fence floor of the tokens read; a token not trusted, and skipped records, logged."""
    scan.floor, scan.ignored_tokens = trusted_floor(tokens)
    for t in scan.ignored_tokens:
        scan.problem(f"token {t} ignored: more than {MAX_TOKEN_GAP} above every lower token")
        log.warning("ownership events: token %d not trusted as the fence floor (more than %d "
                    "above every lower token); floor %d", t, MAX_TOKEN_GAP, scan.floor)  # fmt: skip
    if scan.skipped:
        log.warning("ownership events: %d of %d records skipped as invalid",
                    scan.skipped, scan.read)  # fmt: skip


def token_floor_from_events(
    bootstrap_servers: str,
    topic: str,
    client_config: Mapping[str, Any] | None = None,
    timeout_s: float = 30.0,
) -> int:
    """``scan_events(...).floor``: the largest trusted token on the ownership-events topic."""
    return scan_events(bootstrap_servers, topic, client_config, timeout_s).floor


def last_report(store: RedisStore) -> dict[str, Any] | None:
    return store.recovery_state.last_report()


def summary(report: RecoveryReport, report_key: str = "P:recovery:last") -> str:
    """One log line: what was rebuilt, granted, left unowned, refused, and lost for good."""
    rebuilt = ", ".join(
        f"{ns} ({r.bundles} bundles: {r.from_reports} reported, {r.gaps_filled} gaps, {r.source})"
        for ns, r in sorted(report.namespaces.items())
    )
    return (
        f"recovered from a Redis data loss ({report.reason}): "
        f"{len(report.namespaces)} namespaces rebuilt [{rebuilt}]; "
        f"{len(report.leases_granted)} leases granted above token floor {report.token_floor}; "
        f"{len(report.unowned)} bundles unowned; {len(report.refused)} claims refused; "
        f"ownership events: {report.events_read} read, {report.events_skipped} skipped as "
        f"invalid, {report.tokens_ignored} tokens not trusted; "
        "lost for good: decision outcomes (de-duplication history), split/merge history, "
        f"stream progress and preallocations; new epoch {report.epoch}; "
        f"full report at {report_key}"
    )


def recovery_events(report: RecoveryReport) -> list[OwnershipEvent]:
    """An ``assigned`` event per lease ``recover`` granted, so followers learn the new tokens
    (and a later recovery's token floor, read from the same topic, is above them)."""
    return [
        OwnershipEvent(
            ASSIGNED,
            bundle,
            report.at_ms,
            new_owner=broker,
            new_token=token,
            reason=f"recovered after a Redis data loss (epoch {report.epoch})",
        )
        for bundle, (broker, token) in sorted(report.leases_granted.items())
    ]


@dataclass
class AutoRecovery:
    """The control loop's recovery: detect a loss, wait for the brokers, then ``recover``.

    The loop calls ``check`` at start, on every sweep and before every decision while
    ``suspect`` or ``pending`` says so. States:

    * **watching**: ``known_epoch`` is the epoch this controller last saw (adopted the first time
      one exists: a cluster's first namespace writes it). A read of ``P:epoch`` equal to it is
      the whole check, so a Redis restart that kept its data (AOF) costs one GET per check.
    * **pending** (``reason`` set): a loss was detected (``detect_loss``). The loop holds its
      decisions and skips its sweeps. After ``wait_s`` (one report interval: brokers re-register
      on every check and the streaming job rewrites the snapshot), the claims are read again;
      while there are none (and no ``known_namespaces``), it waits another ``wait_s``, up to
      ``max_wait_s`` after the detection, then recovers with what there is.
    * **recovering**: the token floor is read from the ownership-events topic (outside Redis;
      ``Transient`` if unreadable: stay pending and try again after ``wait_s``), ``recover``
      rebuilds and writes the report and the new epoch, which becomes ``known_epoch``.

    Why an epoch that differs from ours is adopted when ``P:recovery:last`` names it: another
    controller (or the operator's ``python -m controller.recovery``) already rebuilt the store;
    recovering again would only replace that epoch, which the other controller would then take
    for a loss, and so on.
    """

    store: RedisStore
    bootstrap_servers: str
    events_topic: str
    lease_ttl_ms: int
    client_config: Mapping[str, Any] | None = None
    wait_s: float = 5.0
    max_wait_s: float = 60.0
    known_namespaces: Mapping[str, int] = field(default_factory=dict)
    floor_timeout_s: float = 30.0
    monotonic: Callable[[], float] = time.monotonic
    known_epoch: str | None = None
    reason: str | None = None
    detected_at: float = 0.0
    next_look: float = 0.0

    @property
    def pending(self) -> bool:
        return self.reason is not None

    def suspect(self) -> bool:
        """Cheap check (one GET) for the loop's hot path: the epoch is not the one we saw."""
        return self.known_epoch is not None and current_epoch(self.store) != self.known_epoch

    def _recovered_epoch(self, epoch: str | None) -> bool:
        report = last_report(self.store) if epoch is not None else None
        return report is not None and report.get("epoch") == epoch

    def check(self, now_ms: int) -> RecoveryReport | None:
        """Detect or progress a loss; the report when this call recovered, else None.

        Raises Redis connection errors (the caller retries) and ``Transient`` when the token
        floor cannot be read (the loss stays pending)."""
        t = self.monotonic()
        if self.pending and t < self.next_look:
            return None
        epoch = current_epoch(self.store)
        if not self.pending:
            self._detect(epoch, t, now_ms)
            return None
        return self._progress(epoch, t, now_ms)

    def _detect(self, epoch: str | None, t: float, now_ms: int) -> None:
        """No loss pending: adopt a known or recovered epoch, or note a loss and its time."""
        if epoch is not None and epoch == self.known_epoch:
            return
        if epoch is not None and self.known_epoch is not None and self._recovered_epoch(epoch):
            log.warning("the store was recovered elsewhere: adopting epoch %s", epoch)
            self.known_epoch = epoch
            return
        # detect_loss reads the claims only when no epoch was ever seen: skip a big read else
        unseen = epoch is None and self.known_epoch is None
        claims = claims_from_snapshot(self.store, now_ms) if unseen else {}
        reason = detect_loss(self.store, self.known_epoch, claims)
        if reason is None:
            self.known_epoch = epoch if epoch is not None else self.known_epoch
            return
        self.reason, self.detected_at, self.next_look = reason, t, t + self.wait_s
        log.warning(
            "Redis lost its data (%s): holding decisions and sweeps; recovering in %.1f s, "
            "once brokers re-register and report",
            reason,
            self.wait_s,
        )

    def _progress(self, epoch: str | None, t: float, now_ms: int) -> RecoveryReport | None:
        """A loss pending: give it up if the data came back or was recovered elsewhere, wait
        for claims, else recover; the report when this call recovered."""
        if epoch is not None and epoch == self.known_epoch:
            log.warning("the epoch %s is back (a failover back to the data): no recovery", epoch)
            self.reason = None
            return None
        if self._recovered_epoch(epoch):
            log.warning("the store was recovered elsewhere: adopting epoch %s", epoch)
            self.known_epoch, self.reason = epoch, None
            return None
        claims = claims_from_snapshot(self.store, now_ms)
        if not claims and not self.known_namespaces and t - self.detected_at < self.max_wait_s:
            self.next_look = t + self.wait_s
            log.info("no live broker reports bundles yet: recovery waits %.1f s more", self.wait_s)
            return None
        self.next_look = t + self.wait_s  # if reading the floor fails, try again then
        scan = scan_events(
            self.bootstrap_servers, self.events_topic, self.client_config, self.floor_timeout_s
        )
        try:
            report = recover(
                self.store,
                claims,
                now_ms=now_ms,
                lease_ttl_ms=self.lease_ttl_ms,
                token_floor=scan.floor,
                reason=self.reason or "",
                known_namespaces=self.known_namespaces,
                events=scan,
            )
        except (InvalidInput, ResponseError) as e:  # refused before any write: try again later
            raise Transient(f"recovery refused, nothing written: {e}") from e
        self.known_epoch, self.reason = report.epoch, None
        return report


# Exit status of ``python -m controller.recovery`` (its contract, in ``main``'s docstring).
EXIT_OK, EXIT_LOST, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3


def main(argv: list[str] | None = None) -> int:
    """``python -m controller.recovery``: check for a data loss and, if found, recover.

    Why a module entry point: ``lbctl control`` recovers by itself unless started with
    ``--no-auto-recover``; then (or with no controller running) this is the operator's command
    after a Redis without persistence restarted. It publishes no ownership events. Exit
    status: 0 nothing lost, or recovered; 1 a loss found with ``--check``; 2 bad usage; 3
    Redis or Kafka unreachable or refusing the credentials, so nothing could be decided (one
    line on stderr says which and what to check). The report is printed as JSON.
    """

    parser = argparse.ArgumentParser(prog="python -m controller.recovery", description=__doc__)
    parser.add_argument("--redis-url", default=None, help="Redis URL (default: config redisUrl)")
    parser.add_argument("--bootstrap-servers", default=None, help="Kafka (default: config)")
    parser.add_argument("--epoch", default=None, help="the epoch the store had, if known")
    parser.add_argument(
        "--known-namespace",
        action="append",
        default=[],
        metavar="NS=N",
        help="a namespace to re-create with N bundles if no broker reports it (repeatable)",
    )
    parser.add_argument("--check", action="store_true", help="only detect and say why")
    parser.add_argument("--force", action="store_true", help="recover even if no loss is detected")
    add_config_arguments(parser)
    args = parser.parse_args(argv)
    try:
        config = load_from_args(args, quiet=True)
        known = {k: int(v) for k, _, v in (x.partition("=") for x in args.known_namespace)}
    except (ConfigError, ValueError) as e:
        print(f"recovery: {e}", file=sys.stderr)
        return EXIT_USAGE
    url = args.redis_url or config.redis_url
    bootstrap = args.bootstrap_servers or config.kafka_bootstrap_servers
    if not url or not bootstrap:
        print("recovery: needs --redis-url and --bootstrap-servers", file=sys.stderr)
        return EXIT_USAGE
    try:
        preflight.check_redis(url, config)
        store = RedisStore(connect(url, config, purpose="recovery"), config.redis_key_prefix,
                           clock="server")  # fmt: skip
        return _check_or_recover(store, args, config, bootstrap, known)
    except preflight.BadAddress as e:
        print(f"recovery: {e}", file=sys.stderr)
        return EXIT_USAGE
    except preflight.ServiceUnavailable as e:
        print(f"recovery: {e}; nothing was decided", file=sys.stderr)
        return EXIT_UNREACHABLE
    except (RedisConnectionError, RedisTimeoutError) as e:  # lost after the check
        print(f"recovery: Redis became unreachable: {e}; {preflight.REDIS_FIX}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except Transient as e:  # the events topic could not be read: nothing was written
        print(f"recovery: {e}; {preflight.KAFKA_FIX}", file=sys.stderr)
        return EXIT_UNREACHABLE


def _check_or_recover(
    store: RedisStore,
    args: argparse.Namespace,
    config: LoadBalancerConfig,
    bootstrap: str,
    known: dict[str, int],
) -> int:
    """Detect a loss; with ``--check`` (or nothing lost) say so, else recover and report."""
    now_ms = int(time.time() * 1000)
    claims = claims_from_snapshot(store, now_ms)
    reason = detect_loss(store, args.epoch, claims) or ("forced" if args.force else None)
    if reason is None or args.check:
        print(json.dumps({"lost": reason is not None, "reason": reason, "claims": claims}))
        return EXIT_LOST if reason is not None else EXIT_OK
    scan = scan_events(bootstrap, config.ownership_events_topic, config.kafka_client_settings())
    report = recover(
        store,
        claims,
        now_ms=now_ms,
        lease_ttl_ms=int(config.load_balancer_ownership_lease_ttl_seconds * 1000),
        token_floor=scan.floor,
        reason=reason,
        known_namespaces=known,
        events=scan,
    )
    print(report.to_json())
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
