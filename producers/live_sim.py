"""Live mode: the simulated cluster publishes real reports to Kafka and follows Redis ownership.

Fast mode (``producers.fast_sim``) keeps ownership in memory and runs the policy itself. Live mode
is the same world (``producers.sim_model`` with the same scenario, seed and RNG stream) plugged
into the product instead: the Spark job reads the reports it publishes, the controller applies
the job's decisions to Redis, and the simulated brokers serve exactly what Redis says they own,
so a transfer applied in Redis shows up in the next cycle's reports (the loop is closed:
docs/architecture.md, Constraints).

Three clocks, on purpose:

* **Model time** = ``cycle x tick`` (from 0), exactly as in fast mode, so diurnal waves, bursts
  and every random draw line up with a fast run of the same scenario and seed.
* **Virtual time** = ``start_ms + cycle x tick``: the Kafka record timestamp and ``lastUpdate``
  of every report. The streaming job takes ``now_ms`` from the newest record timestamp, never
  the wall clock, so the policy knobs written in minutes (shedding interval, grace period,
  history) work at demo speed: with the default one-minute tick and ``--cycle-seconds 2``, a
  virtual minute passes every 2 s of wall time. ``start_ms`` is the wall clock at start, or one
  tick after the newest report already on the topic if that is later (``resume_start_ms``): a
  restarted simulator must not move the job's clock backwards. Virtual time runs ahead of the
  wall clock (30x by default); Kafka 3.x accepts future timestamps by default, but a broker
  with a finite ``log.message.timestamp.after.max.ms`` rejects reports once the lead exceeds it.
* **Wall time** (``clock``): leases, broker registrations and lookups in Redis. The controller,
  its lease sweep and the admin verbs judge leases against the wall clock, so the simulated
  brokers must renew against it too. Hence a crash takes ``loadBalancerOwnershipLeaseTtlSeconds``
  of *wall* time (15 cycles at 2 s) to free the bundles, where fast mode frees them after one
  cycle's worth of virtual time.

One cycle, in fast mode's order:

1. Scenario events: a join registers the broker (it reports from now on); a graceful leave
   releases its leases (fenced by token) and ends its registration; a crash only stops the
   broker, which then neither reports nor renews, so its leases expire in Redis and the
   controller's sweep (or the next lookup) reassigns; a restart is a leave and a later join.
2. Namespace boundaries and live leases are read from Redis (never from memory: a split or a
   transfer applied by the controller is what the next reports show).
3. Every unowned bundle with topics is looked up through ``controller.placement.lookup_and_assign``
   with one of its topics, as a Pulsar client's lookup assigns a free bundle.
4. Every live broker heartbeats its registration and renews the leases it holds in Redis
   (``LeaseKeeper``, the broker agent's piece, fenced by token), which moves its local
   serve-until per bundle (``loadbalance.serving``, the agent's rule: send time of the last
   successful renewal + ``ttl * (1 - leaseClockDriftBound) - leaseStopMarginMs`` on the
   broker's monotonic clock). A lease that came by a move (the controller's transfer, unload,
   split or merge) starts only once the store answers no handover wait; a broker that lost a
   bundle stops it and then acknowledges the handover (``metadata_store.handover``; a simulated
   broker stops at once, so with no stop margin). Every broker drops what it lost before any
   renews, so a move's new owner serves from the first cycle that sees the move.
5. ``sim_model.reports_at`` computes the reports for exactly the bundles each live broker owns
   in Redis *and* may still serve by its own clock; each is published as ``LocalBrokerData``
   JSON keyed by broker id, stamped with the cycle's virtual time. ``serving_intervals()``
   gives what every simulated broker served, for ``loadbalance.serving_checker``.

``run`` paces cycles to ``cycle_seconds`` of wall time and returns promptly after ``stop()``.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import redis
from confluent_kafka import Consumer, TopicPartition

from controller.events import ASSIGNED, RELEASED, EventPublisher, OwnershipEvent
from controller.placement import lookup_and_assign
from infra.offsets import earliest_offsets, latest_offsets, probe_consumer_config
from loadbalance.bundles import NamespaceBundles, bundle_namespace
from loadbalance.config import LoadBalancerConfig
from loadbalance.cycle import weights_from_config
from loadbalance.errors import Conflict, InvalidInput, Transient
from loadbalance.model import LocalBrokerData
from loadbalance.report_codec import encode_report
from loadbalance.serving import ServingInterval, ServingRule, ServingTable
from metadata_store.leases import Lease
from metadata_store.ownership_redis import RedisStore
from producers.agent import KafkaReportPublisher, LeaseKeeper, wall_clock_ms
from producers.fast_sim import BROKER_CRASH, BROKER_DOWN, BROKER_UP, event_schedule
from producers.scenarios import Scenario, initial_owners
from producers.sim_model import reports_at

log = logging.getLogger(__name__)


class TimestampedReportPublisher(KafkaReportPublisher):
    """The agent's Kafka publisher, plus one call that writes a cycle's reports with an explicit
    record timestamp (the virtual time) and waits for all of them at once.

    ``delivered`` holds, per partition, the offset after the last report delivered: a caller
    that waits for the streaming job to have read everything published (the live scoreboard's
    lockstep) compares it with the job's checkpoint instead of asking Kafka for end offsets."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.delivered: dict[int, int] = {}

    def _on_delivery(self, err: Any, msg: Any) -> None:
        super()._on_delivery(err, msg)
        if err is None and msg is not None and msg.offset() is not None and msg.offset() >= 0:
            p = msg.partition()
            self.delivered[p] = max(self.delivered.get(p, 0), msg.offset() + 1)

    def publish_all(self, reports: Sequence[tuple[str, bytes]], timestamp_ms: int) -> None:
        self._errors.clear()
        try:
            for broker_id, payload in reports:
                self._producer.produce(
                    self.topic,
                    key=broker_id.encode(),
                    value=payload,
                    timestamp=timestamp_ms,
                    on_delivery=self._on_delivery,
                )
        except BufferError as e:
            raise Transient(f"producer queue full: {e}") from None
        remaining = self._producer.flush(self.flush_timeout_s)
        if remaining or self._errors:
            detail = "; ".join(self._errors) or f"{remaining} still queued"
            raise Transient(f"reports not delivered to {self.topic}: {detail}")

    def close(self) -> None:
        """Flush, then let the client go, so no connection outlives the simulator."""
        if self._producer is None:
            return
        super().close()
        self._producer = None  # type: ignore[assignment]


def newest_record_ms(
    bootstrap_servers: str,
    topic: str,
    client_config: Mapping[str, Any] | None = None,
    timeout_s: float = 10.0,
) -> int | None:
    """The largest record timestamp at the end of ``topic``'s partitions (None when empty).

    Why: virtual time runs ahead of the wall clock, so a simulator restarted on the same topic
    must continue after the newest report, not at "now": the streaming job's clock is the
    newest timestamp it has seen, and reports older than that would count as late.
    """

    low = earliest_offsets(bootstrap_servers, topic, client_config, timeout_s)
    high = latest_offsets(bootstrap_servers, topic, client_config, timeout_s=timeout_s)
    last = {p: end - 1 for p, end in high.items() if end > low.get(p, 0)}
    if not last:
        return None
    consumer = Consumer(probe_consumer_config(bootstrap_servers, client_config))
    newest: int | None = None
    try:
        consumer.assign([TopicPartition(topic, p, off) for p, off in sorted(last.items())])
        pending = set(last)
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None or msg.error() is not None or msg.offset() != last.get(msg.partition()):
                continue
            pending.discard(msg.partition())
            ts = msg.timestamp()[1]
            newest = ts if newest is None else max(newest, ts)
    finally:
        consumer.close()
    return newest


def resume_start_ms(newest_ms: int | None, now_ms: int, tick_ms: int) -> int:
    """Virtual time of cycle 0: now, or one tick after the newest report if that is later."""
    return now_ms if newest_ms is None else max(now_ms, newest_ms + tick_ms)


@dataclass(frozen=True)
class LiveCycle:
    """What one live cycle did; ``line()`` is the progress line, ``to_json()`` the JSON row."""

    cycle: int
    virtual_ms: int
    wall_ms: int
    brokers: tuple[str, ...]
    bundles: int
    owned: int
    assigned: int
    moved: int
    published: int
    events: tuple[str, ...]
    usage: Mapping[str, float]
    reports: Mapping[str, LocalBrokerData]
    owners: Mapping[str, str] = field(default_factory=dict)
    looked_up: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "cycle": self.cycle,
            "virtualMs": self.virtual_ms,
            "wallMs": self.wall_ms,
            "brokers": list(self.brokers),
            "bundles": self.bundles,
            "ownedBundles": self.owned,
            "assigned": self.assigned,
            "moved": self.moved,
            "reportsPublished": self.published,
            "events": list(self.events),
            "usage": dict(self.usage),
        }

    def line(self) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.virtual_ms / 1000))
        values = list(self.usage.values())
        peak = max(values, default=0.0) * 100
        mean = (sum(values) / len(values) * 100) if values else 0.0
        extra = f"  lookups {self.assigned}" if self.assigned else ""
        extra += f"  moved {self.moved}" if self.moved else ""
        extra += f"  events {','.join(self.events)}" if self.events else ""
        return (
            f"cycle {self.cycle:4d}  virtual {stamp}  brokers {len(self.brokers):2d}  "
            f"owned {self.owned:4d}/{self.bundles:<4d}  reports {self.published:2d}  "
            f"max {peak:5.1f}%  mean {mean:5.1f}%{extra}"
        )


class LiveSim:
    """One scenario played against real Kafka and Redis; ``tick(c)`` is one cycle."""

    def __init__(
        self,
        scenario: Scenario,
        config: LoadBalancerConfig,
        store: RedisStore,
        publisher: TimestampedReportPublisher,
        *,
        seed: int = 0,
        start_ms: int | None = None,
        clock: Callable[[], int] = wall_clock_ms,
        stop_event: threading.Event | None = None,
        monotonic: Callable[[], float] | None = None,
        events: EventPublisher | None = None,
    ) -> None:
        self.scenario = scenario
        # the ownership-events feed: every lease this simulator grants or ends is announced on
        # it, as lbctl lookup and the controller announce theirs (None: tests without Kafka)
        self.events = events
        self.config = config
        self.store = store
        self.publisher = publisher
        self.seed = seed
        self.clock = clock
        self.tick_ms = scenario.tick_ms
        self.start_ms = clock() if start_ms is None else start_ms
        # Same RNG stream as FastSim: initial_owners first (it draws for a random assignment),
        # then reports_at once per cycle.
        self.rng = random.Random(seed)
        self.initial = initial_owners(scenario, self.rng)
        self.schedule = event_schedule(scenario, 1)  # its "expire" entries are Redis' job here
        self.live: set[str] = set(scenario.initial_brokers)
        self.lease_ttl_ms = int(config.load_balancer_ownership_lease_ttl_seconds * 1000)
        self.registration_ttl_ms = int(config.load_balancer_broker_registration_ttl_seconds * 1000)
        self.weights = weights_from_config(config)
        self.serving_rule = ServingRule.from_config(config)
        # the brokers' local clock: the host's monotonic clock, or an injected wall clock's
        # seconds (tests drive leases with a fake clock, and serving must follow the same one)
        self.monotonic = monotonic or (
            time.monotonic if clock is wall_clock_ms else lambda: clock() / 1000.0
        )
        self._keepers: dict[str, LeaseKeeper] = {}
        self._probe = self._topics_by_bundle_index()
        self._stop = stop_event if stop_event is not None else threading.Event()
        self.cycles_done = 0
        self.last: LiveCycle | None = None
        self._owners_before: dict[str, str] = {}

    # --- helpers -------------------------------------------------------------------------------

    def virtual_ms(self, cycle: int) -> int:
        return self.start_ms + cycle * self.tick_ms

    def _keeper(self, broker: str) -> LeaseKeeper:
        keeper = self._keepers.get(broker)
        if keeper is None:
            info = {"simulated": True, "webServiceUrl": f"http://{broker}:8080"}
            keeper = LeaseKeeper(
                self.store,
                broker,
                self.registration_ttl_ms,
                self.lease_ttl_ms,
                info,
                serving=ServingTable(broker, self.serving_rule),
                monotonic=self.monotonic,
                ack_delay_s=0.0,  # a simulated broker stops the instant its table says so
            )
            self._keepers[broker] = keeper
        return keeper

    def serving_intervals(self) -> list[ServingInterval]:
        """What every simulated broker served so far, on its (monotonic) clock."""
        return [
            i
            for k in self._keepers.values()
            if k.serving is not None
            for i in k.serving.intervals()
        ]

    def _serving(self, broker: str, bundle: str, now: float) -> bool:
        table = self._keeper(broker).serving
        return table is not None and table.serving(bundle, now)

    def _register(self, broker: str, now_ms: int) -> None:
        k = self._keeper(broker)
        self.store.register_broker(broker, now_ms, self.registration_ttl_ms, k.info)

    def _topics_by_bundle_index(self) -> dict[str, list[tuple[int, str]]]:
        """(hash, topic name) per namespace, sorted: a lookup needs one topic of a bundle."""
        return {
            ns: sorted((t.hash, t.name) for t in traffic.topics)
            for ns, traffic in self.scenario.model.traffic.items()
        }

    def namespaces(self) -> dict[str, NamespaceBundles]:
        """The scenario's namespaces as Redis has them now (splits and merges included)."""
        out: dict[str, NamespaceBundles] = {}
        for ns in sorted(self.scenario.namespaces):
            nb = self.store.get_namespace(ns)
            if nb is not None:
                out[ns] = nb
        return out

    def leases(self, namespaces: Mapping[str, NamespaceBundles], now_ms: int) -> dict[str, Lease]:
        out: dict[str, Lease] = {}
        for ns in sorted(namespaces):
            try:
                out.update(self.store.owners(ns, now_ms))
            except InvalidInput:  # deleted between the two reads
                continue
        return out

    # --- setup and events ----------------------------------------------------------------------

    def setup(self) -> int:
        """Create the namespaces (equal split) if absent, store the scenario's placement policies
        (when it has any), register the initial brokers and acquire the scenario's initial
        ownership for bundles nobody owns; returns the leases acquired."""
        now_ms = self.clock()
        for ns, nb in sorted(self.scenario.namespaces.items()):
            self.store.create_namespace(ns, len(nb), exist_ok=True)
        if not self.scenario.policies.empty:
            # the scenario's placement policies, where the controller and the job read them
            policies = self.scenario.policies
            self.store.placement_policies.update(lambda _current: policies)
        for broker in sorted(self.live):
            self._register(broker, now_ms)
        namespaces = self.namespaces()
        owned = self.leases(namespaces, now_ms)
        acquired = 0
        for bundle, broker in sorted(self.initial.items()):
            ns = namespaces.get(bundle_namespace(bundle))
            if bundle in owned or broker not in self.live or ns is None or not ns.contains(bundle):
                continue
            try:
                lease = self.store.acquire(bundle, broker, now_ms, self.lease_ttl_ms)
                acquired += 1
            except Conflict:  # taken meanwhile by someone else: that owner stands
                continue
            self._announce(
                OwnershipEvent(ASSIGNED, bundle, now_ms, new_owner=broker,
                               new_token=lease.token, reason="the scenario's initial owner")
            )  # fmt: skip
        return acquired

    def _announce(self, event: OwnershipEvent) -> None:
        if self.events is not None:
            self.events.deliver([event], should_stop=self._stop.is_set)

    def _apply_events(self, cycle: int, now_ms: int) -> list[str]:
        done: list[str] = []
        for action, name in self.schedule.get(cycle, ()):
            if action == BROKER_UP:
                self.live.add(name)
                self._register(name, now_ms)
            elif action == BROKER_DOWN and name in self.live:
                table = self._keeper(name).serving
                if table is not None:  # it stops serving first, then releases and acknowledges
                    table.stop_all(self.monotonic())
                self._release_all(name, now_ms)
                # a heartbeat with a zero TTL ends the registration: gone, not just silent
                self.store.register_broker(name, now_ms, 0)
                self.live.discard(name)  # last, so a Redis error here is retried whole
            elif action == BROKER_CRASH:
                self.live.discard(name)  # no release, no renewal: the leases run out in Redis
            else:
                continue
            done.append(f"{action}:{name}")
        return done

    def _release_all(self, broker: str, now_ms: int) -> None:
        for lease in self.leases(self.namespaces(), now_ms).values():
            if lease.broker == broker:
                self.store.release(lease.bundle, broker, lease.token, now_ms)
                self.store.ack_handover(broker, lease.bundle, lease.token)  # it stopped already
                self._announce(
                    OwnershipEvent(RELEASED, lease.bundle, now_ms, old_owner=broker,
                                   old_token=lease.token, reason=f"{broker} left")
                )  # fmt: skip

    # --- one cycle -----------------------------------------------------------------------------

    def _lookups(
        self, namespaces: Mapping[str, NamespaceBundles], leases: dict[str, Lease], now_ms: int
    ) -> list[str]:
        """Look up every unowned bundle that has topics (Pulsar assigns on lookup); the bundles
        the lookups assigned."""
        assigned: list[str] = []
        for ns_name, nb in namespaces.items():
            base = self.scenario.model.bundle_base(nb)
            wanted = {b for b, agg in base.items() if agg.topics > 0 and b not in leases}
            if not wanted:
                continue
            probes: dict[str, str] = {}
            names = nb.bundle_names
            for h, topic in self._probe.get(ns_name, ()):
                name = names[nb.find_index(h)]
                if name in wanted:
                    probes.setdefault(name, topic)
            for bundle in sorted(probes):
                try:
                    found, lease = lookup_and_assign(
                        self.store, probes[bundle], self.config, now_ms, publisher=self.events
                    )
                except (Conflict, InvalidInput, Transient) as e:  # a race: next cycle
                    log.warning("lookup of %s failed: %s", bundle, e)
                    continue
                if lease is not None:
                    leases[found] = lease
                    assigned.append(found)
        return assigned

    def tick(self, cycle: int) -> LiveCycle:
        """Play cycle ``cycle``: events, Redis reads, lookups, reports to Kafka, renewals."""
        now_ms = self.clock()
        virtual_ms = self.virtual_ms(cycle)
        events = self._apply_events(cycle, now_ms)
        namespaces = self.namespaces()
        leases = self.leases(namespaces, now_ms)
        assigned = self._lookups(namespaces, leases, now_ms)
        owners = {b: lease.broker for b, lease in leases.items()}
        # owner changes made outside the simulator since the last cycle (the controller's)
        moved = sum(1 for b, o in owners.items() if self._owners_before.get(b, o) != o)
        self._owners_before = owners
        live = sorted(self.live)
        self._renew_held(cycle, live, owners, now_ms)
        mono = self.monotonic()
        served = {b: o for b, o in owners.items() if self._serving(o, b, mono)}
        model_reports, _ = reports_at(
            self.scenario.model, namespaces, served, live, cycle * self.tick_ms, self.rng
        )
        reports = {b: replace(r, last_update_ms=virtual_ms) for b, r in model_reports.items()}
        published = 0
        try:
            self.publisher.publish_all(
                [(b, encode_report(reports[b])) for b in sorted(reports)], virtual_ms
            )
            published = len(reports)
        except Transient as e:
            log.warning("cycle %d: %s", cycle, e)
        self.cycles_done = cycle + 1
        self.last = LiveCycle(
            cycle=cycle,
            virtual_ms=virtual_ms,
            wall_ms=now_ms,
            brokers=tuple(live),
            bundles=sum(len(nb) for nb in namespaces.values()),
            owned=sum(1 for b in owners.values() if b in self.live),
            assigned=len(assigned),
            moved=moved,
            published=published,
            events=tuple(events),
            usage={b: self.weights.weighted_max(r) for b, r in reports.items()},
            reports=reports,
            owners=owners,
            looked_up=tuple(assigned),
        )
        return self.last

    def _renew_held(
        self, cycle: int, live: Sequence[str], owners: Mapping[str, str], now_ms: int
    ) -> None:
        """Heartbeat every live broker and renew the leases Redis gives it, before it serves
        them: a broker serves a bundle only after a renewal of its own succeeded. First every
        broker stops (and acknowledges) what Redis no longer gives it, so a move's new owner
        finds no handover wait left in the same cycle."""
        for broker in live:
            try:
                self._keeper(broker).stop_lost(b for b, o in owners.items() if o == broker)
            except Exception as e:  # an acknowledgement not sent: retried at the next cycle
                log.warning("cycle %d: handover acknowledgement of %s failed: %s", cycle, broker, e)
        for broker in live:
            mine = [b for b, o in owners.items() if o == broker]
            try:
                renewed = self._keeper(broker).heartbeat(mine, now_ms)
            except Exception as e:  # Redis hiccup: it serves on until its serve-until
                log.warning("cycle %d: heartbeat of %s failed: %s", cycle, broker, e)
                continue
            lost = sorted(b for b, ok in renewed.items() if not ok)
            if lost:
                log.info("%s lost %d leases to another owner", broker, len(lost))

    def renew(self) -> int:
        """Heartbeat every live broker and renew the leases it served in the last cycle, between
        cycles: a caller that holds the next cycle back (waiting for the streaming job) must not
        let the leases run out meanwhile. Returns the brokers renewed."""
        if self.last is None:
            return 0
        now_ms = self.clock()
        done = 0
        for broker in sorted(self.live):
            report = self.last.reports.get(broker)
            try:
                self._keeper(broker).heartbeat(report.bundles if report else frozenset(), now_ms)
                done += 1
            except Exception as e:  # as in tick: the next renewal is well within the TTL
                log.warning("renewal of %s failed: %s", broker, e)
        return done

    # --- the paced loop ------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask ``run`` to return after the current cycle (safe from a signal handler)."""
        self._stop.set()

    def run(
        self,
        cycles: int | None = None,
        cycle_seconds: float = 2.0,
        on_cycle: Callable[[LiveCycle], None] | None = None,
    ) -> int:
        """``setup()``, then one cycle every ``cycle_seconds`` of wall time until ``cycles`` are
        done or ``stop()``; a cycle that overruns starts the next at once, without catching up
        in a burst. Returns the number of cycles played."""
        if self._stop.is_set():
            return 0
        self.setup()
        cycle = 0
        next_at = time.monotonic()
        while not self._stop.is_set() and (cycles is None or cycle < cycles):
            try:
                result = self.tick(cycle)
            except redis.RedisError as e:
                # Every Redis read of a cycle comes before the RNG draw and the publish, and the
                # events are idempotent, so the same cycle is simply played again next period.
                log.warning("cycle %d: Redis unavailable, retrying: %s", cycle, e)
                self._stop.wait(max(cycle_seconds, 0.5))
                continue
            cycle += 1
            if on_cycle is not None:
                on_cycle(result)
            if cycles is not None and cycle >= cycles:
                break
            next_at += cycle_seconds
            delay = next_at - time.monotonic()
            if delay > 0:
                self._stop.wait(delay)
            else:
                next_at = time.monotonic()
        return cycle
