"""The broker agent: samples a broker's load, publishes reports by Pulsar's rule, keeps leases.

Why a separate agent: a real broker (Pulsar or not) knows its bundles but not our Kafka topic or
Redis leases. The agent runs beside it, every ``loadBalancerReportUpdateMinIntervalMillis``:

1. samples the host (``producers.host_usage``) and the broker's bundle stats (a provider from
   ``producers.bundle_stats``) and builds a ``LocalBrokerData``; the broker's own readings
   (JVM heap, direct memory, its CPU and NIC view) win over the host's where the provider has
   them, since they are what Pulsar's load manager would report;
2. if a Redis store is wired in, heartbeats the broker's registration and renews the leases of
   the bundles it reports (every check, so a lease never waits for a report to be published),
   and keeps per bundle the local time until which the broker may serve it
   (``loadbalance.serving``: from the monotonic send time of the last successful renewal), which
   it publishes in the serving file (``producers.serving_hook``) and the ``lbctl_agent_serving``
   gauges; a broker cut off from Redis thus stops serving before its lease can lapse;
3. asks ``loadbalance.report_rule`` whether the report moved enough to publish, and if so writes
   it to the load-report topic keyed by broker id.

A bad document from the provider is a report problem, not a sign the broker is gone: the check
still heartbeats and renews the leases of the bundles last reported well, and only skips
publishing. An unreachable provider (``Transient``: the broker itself may be down) skips the
whole check, so a dead broker's leases lapse as they should.

Time comes in as ``now_ms`` to ``tick``, so tests drive the agent with a fake clock and never
sleep; ``run`` is the thin loop around it with a clean stop on SIGTERM/SIGINT.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from confluent_kafka import Producer

from infra import kafka_auth, metrics
from infra.topics import kafka_client_config
from loadbalance.bundles import bundle_namespace
from loadbalance.config import LoadBalancerConfig
from loadbalance.errors import InvalidInput, LoadBalancerError, Transient
from loadbalance.model import LocalBrokerData
from loadbalance.report_codec import encode_report
from loadbalance.report_rule import PublishVerdict, ReportUpdateRule
from loadbalance.serving import ServingTable
from producers.bundle_stats import BundleStatsProvider, BundleStatsSnapshot
from producers.host_usage import HostUsage
from producers.serving_hook import ServingHook

log = logging.getLogger(__name__)

Clock = Callable[[], int]


def wall_clock_ms() -> int:
    """Epoch milliseconds: reports and Redis leases are stamped in wall-clock time."""
    return time.time_ns() // 1_000_000


class UsageSource(Protocol):
    def sample(self, now_ms: int) -> HostUsage: ...


class ReportPublisher(Protocol):
    def publish(self, broker_id: str, payload: bytes) -> None: ...


class LeaseStore(Protocol):
    """The part of ``metadata_store.ownership_redis.RedisStore`` the agent uses."""

    def register_broker(
        self, broker: str, now_ms: int, ttl_ms: int, info: Mapping[str, Any] | None = None
    ) -> None: ...

    def owners(self, ns: str, now_ms: int) -> Mapping[str, Any]: ...

    def renew_all(
        self, broker: str, leases: Mapping[str, int], now_ms: int, ttl_ms: int
    ) -> dict[str, bool]: ...

    def renew_leases(
        self, broker: str, leases: Mapping[str, int], now_ms: int, ttl_ms: int
    ) -> Mapping[str, Any]: ...

    def ack_handover(self, broker: str, bundle: str, token: int) -> bool: ...


def build_report(
    broker_id: str,
    usage: HostUsage,
    stats: BundleStatsSnapshot,
    now_ms: int,
    *,
    web_service_url: str = "",
    pulsar_service_url: str = "",
) -> LocalBrokerData:
    """One ``LocalBrokerData``: the broker's own readings where the provider has known ones,
    else the host's, plus bundle stats, with the broker totals summed from the bundles (as
    Pulsar's broker does when it fills its own report)."""
    s = stats.last_stats.values()
    own = stats.usage
    return LocalBrokerData(
        broker=broker_id,
        cpu=own.get("cpu", usage.cpu),
        memory=own.get("memory", usage.memory),
        direct_memory=own.get("direct_memory", usage.direct_memory),
        bandwidth_in=own.get("bandwidth_in", usage.bandwidth_in),
        bandwidth_out=own.get("bandwidth_out", usage.bandwidth_out),
        msg_rate_in=sum(x.msg_rate_in for x in s),
        msg_rate_out=sum(x.msg_rate_out for x in s),
        msg_throughput_in=sum(x.msg_throughput_in for x in s),
        msg_throughput_out=sum(x.msg_throughput_out for x in s),
        num_topics=sum(x.topics for x in s),
        num_bundles=len(stats.bundles),
        num_consumers=sum(x.consumer_count for x in s),
        num_producers=sum(x.producer_count for x in s),
        bundles=stats.bundles,
        last_stats=stats.last_stats,
        last_update_ms=now_ms,
        web_service_url=web_service_url,
        pulsar_service_url=pulsar_service_url,
    )


class KafkaReportPublisher:
    """Writes encoded reports to the load-report topic, keyed by broker id, and waits for each.

    Waiting per report is deliberate: reports are seconds apart, and an undelivered one must
    not count as published, or the rule would compare the next sample against a report nobody
    saw. ``client_config`` passes SASL/SSL settings straight to librdkafka.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        client_config: Mapping[str, Any] | None = None,
        flush_timeout_s: float = 10.0,
    ) -> None:

        self.topic = topic
        self.flush_timeout_s = flush_timeout_s
        conf = kafka_client_config(bootstrap_servers, client_config)
        # a report counts as published once every in-sync replica has it (acks=all is what
        # min.insync.replicas guards), and a retry after a leader change never writes it twice,
        # which the job would count as a second sample
        conf.setdefault("acks", "all")
        conf.setdefault("enable.idempotence", True)
        self._producer = Producer(conf)
        self._errors: list[str] = []

    def _on_delivery(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self._errors.append(str(err))

    def publish(self, broker_id: str, payload: bytes) -> None:
        self._errors.clear()
        try:
            self._producer.produce(
                self.topic, key=broker_id.encode(), value=payload, on_delivery=self._on_delivery
            )
        except BufferError as e:
            raise Transient(f"producer queue full: {e}") from None
        remaining = kafka_auth.flush(self._producer, self.flush_timeout_s)
        if remaining or self._errors:
            detail = "; ".join(self._errors) or f"{remaining} still queued"
            raise Transient(f"report not delivered to {self.topic}: {detail}")

    def close(self) -> None:
        kafka_auth.flush(self._producer, self.flush_timeout_s)


class LeaseKeeper:
    """Keeps the broker registered and its reported bundles' leases alive in the store.

    Only leases this broker already holds are renewed (with the token it holds them by); a
    reported bundle that Redis gives to someone else is left alone: the store is the truth,
    and the fencing tokens would refuse the renewal anyway.

    With a ``serving`` table, every renewal is stamped with ``monotonic()`` read just before the
    request is sent (``t0`` of the serve-until rule) and when its reply came, and a renewal's
    handover wait (``Lease.wait_ms``) holds the start back; a bundle that the store no longer
    gives this broker is dropped from the table at once, and only then is the handover
    acknowledged (``ack_handover``: the next holder need not wait for the old lease's expiry).
    An acknowledgement leaves ``ack_delay_s`` after the stop (default ``leaseStopMarginMs``: the
    broker's poll of the serving file and closing the bundle, as before a deadline); with
    ``defer_acks`` only ``send_acks`` sends them: the agent does after it rewrote the serving
    file the broker stops by.
    """

    def __init__(
        self,
        store: LeaseStore,
        broker_id: str,
        registration_ttl_ms: int,
        lease_ttl_ms: int,
        info: Mapping[str, Any] | None = None,
        *,
        serving: ServingTable | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        ack_delay_s: float | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.store = store
        self.broker_id = broker_id
        self.registration_ttl_ms = registration_ttl_ms
        self.lease_ttl_ms = lease_ttl_ms
        self.info = dict(info or {})
        self.serving = serving
        self.monotonic = monotonic
        self.defer_acks = False
        if ack_delay_s is None:
            ack_delay_s = serving.rule.stop_margin_s if serving is not None else 0.0
        self.ack_delay_s = ack_delay_s
        self.sleep = sleep
        # (bundle, token, local time it may be acknowledged): stopped, not yet acknowledged
        self._acks: list[tuple[str, int, float]] = []

    def held_leases(self, bundles: Iterable[str], now_ms: int) -> dict[str, int]:
        """bundle -> fencing token of the reported bundles this broker holds right now."""
        by_ns: dict[str, list[str]] = defaultdict(list)
        for b in bundles:
            by_ns[bundle_namespace(b)].append(b)
        held: dict[str, int] = {}
        for ns, names in sorted(by_ns.items()):
            try:
                owners = self.store.owners(ns, now_ms)
            except InvalidInput:  # namespace not in the store (yet): nothing to renew
                continue
            for b in names:
                lease = owners.get(b)
                if lease is not None and lease.broker == self.broker_id:
                    held[b] = lease.token
        return held

    def heartbeat(self, bundles: Iterable[str], now_ms: int) -> dict[str, bool]:
        """Register/heartbeat, then renew; returns bundle -> renewed. A bundle the broker
        stops serving here is acknowledged after the stop (``send_acks``)."""
        self.store.register_broker(self.broker_id, now_ms, self.registration_ttl_ms, self.info)
        held = self.held_leases(bundles, now_ms)
        table = self.serving
        if table is None:
            return self.store.renew_all(self.broker_id, held, now_ms, self.lease_ttl_ms)
        seen_at = self.monotonic()
        for b in table.bundles():
            if b not in held:  # another owner, released, split away or no longer reported
                token = table.token(b)
                table.lost(b, seen_at)
                self._stopped(b, token)
        requested_at = self.monotonic()
        answers = self.store.renew_leases(self.broker_id, held, now_ms, self.lease_ttl_ms)
        replied_at = self.monotonic()
        for b, lease in answers.items():
            if lease is not None:
                table.renewed(b, held[b], requested_at, replied_at, lease.wait_ms / 1000.0)
            else:
                table.lost(b, replied_at)
                self._stopped(b, held[b])
        if not self.defer_acks:
            self.send_acks()
        return {b: lease is not None for b, lease in answers.items()}

    def stop_lost(self, held: Iterable[str]) -> None:
        """Stop serving every bundle of the table not in ``held`` (what the store gives this
        broker, read by the caller), then acknowledge unless deferred: the live simulator's
        first pass, so a move completes in the cycle every broker saw it."""
        table = self.serving
        if table is None:
            return
        keep = set(held)
        seen_at = self.monotonic()
        for b in table.bundles():
            if b not in keep:
                token = table.token(b)
                table.lost(b, seen_at)
                self._stopped(b, token)
        if not self.defer_acks:
            self.send_acks()

    def _stopped(self, bundle: str, token: int | None) -> None:
        if token is not None:
            self._acks.append((bundle, token, self.monotonic() + self.ack_delay_s))

    def send_acks(self, *, wait: bool = False) -> int:
        """Acknowledge the handovers this broker stopped serving for, once ``ack_delay_s`` has
        passed since each stop (``wait``: sleep until the last is due); one that fails is
        retried at the next call. Returns the acknowledgements sent."""
        while wait and self._acks:
            left = max(due for _b, _t, due in self._acks) - self.monotonic()
            if left <= 0:
                break
            self.sleep(left)
        sent = 0
        now = self.monotonic()
        for item in list(self._acks):
            bundle, token, due = item
            if due <= now:
                self.store.ack_handover(self.broker_id, bundle, token)
                self._acks.remove(item)
                sent += 1
        return sent


class Agent:
    """One broker's agent; ``tick`` is one check, ``run`` the loop the CLI runs."""

    def __init__(
        self,
        config: LoadBalancerConfig,
        broker_id: str,
        usage_source: UsageSource,
        stats_provider: BundleStatsProvider,
        publisher: ReportPublisher,
        clock: Clock = wall_clock_ms,
        *,
        lease_keeper: LeaseKeeper | None = None,
        serving_hook: ServingHook | None = None,
        web_service_url: str = "",
        pulsar_service_url: str = "",
    ) -> None:
        if not broker_id or broker_id != broker_id.strip():
            raise ValueError("broker id must be non-empty and trimmed")
        self.config = config
        self.broker_id = broker_id
        self.usage_source = usage_source
        self.stats_provider = stats_provider
        self.publisher = publisher
        self.clock = clock
        self.lease_keeper = lease_keeper
        self.serving_hook = serving_hook
        if lease_keeper is not None and serving_hook is not None:
            lease_keeper.defer_acks = True  # acknowledge once the serving file says stop
        self.web_service_url = web_service_url
        self.pulsar_service_url = pulsar_service_url
        self.rule = ReportUpdateRule.from_config(config)
        self.last_check_ms: int | None = None
        self.last_published: LocalBrokerData | None = None
        self.last_published_ms: int | None = None
        self.last_verdict: PublishVerdict | None = None
        self.published_count = 0
        self.last_good_stats: BundleStatsSnapshot | None = None
        self._warned: set[str] = set()
        self._stop = threading.Event()

    def tick(self, now_ms: int | None = None) -> bool:
        """One check at ``now_ms`` (default: the clock); True if a report was published.

        An unreachable provider (``Transient``) skips the whole check, heartbeat included: the
        broker may be down, and its leases must then lapse. Any other provider failure is a
        report problem: the check heartbeats and renews the bundles last reported well, and
        publishes nothing.
        """
        now_ms = self.clock() if now_ms is None else now_ms
        if not self.rule.check_due(self.last_check_ms, now_ms):
            return False
        self.last_check_ms = now_ms
        try:
            return self._check(now_ms)
        finally:
            self._publish_serving()
            self._send_acks()

    def _check(self, now_ms: int) -> bool:
        stats = self._fetch_stats(now_ms)
        if stats is None:
            return False
        self.last_good_stats = stats
        self._count_issues(stats)
        report = build_report(
            self.broker_id,
            self.usage_source.sample(now_ms),
            stats,
            now_ms,
            web_service_url=self.web_service_url,
            pulsar_service_url=self.pulsar_service_url,
        )
        self._keep_leases(report.bundles, now_ms)
        self._host_gauges(report)
        verdict = self.rule.verdict(self.last_published, self.last_published_ms, report, now_ms)
        self.last_verdict = verdict
        if not verdict.publish:
            metrics.AGENT_CHECKS.labels(published="false").inc()
            return False
        return self._publish(report, verdict, now_ms)

    def _fetch_stats(self, now_ms: int) -> BundleStatsSnapshot | None:
        """The provider's bundle stats, or None after a failure was logged and counted (for a
        refused answer, the bundles last reported well keep their leases)."""
        try:
            return self.stats_provider.fetch()
        except Transient as e:
            log.warning("bundle stats unreachable, skipping this check: %s", e)
            metrics.AGENT_PROVIDER_FAILURES.labels(reason="unreachable").inc()
            return None
        except Exception as e:  # a report problem: keep the broker's leases, publish nothing
            kept = self.last_good_stats.bundles if self.last_good_stats else frozenset()
            log.warning(
                "bundle stats refused (%s); heartbeat and %d leases kept, no report: %s",
                type(e).__name__,
                len(kept),
                e,
            )
            metrics.AGENT_PROVIDER_FAILURES.labels(reason="invalid").inc()
            metrics.AGENT_CHECKS.labels(published="false").inc()
            self._keep_leases(kept, now_ms)
            return None

    def _publish(self, report: LocalBrokerData, verdict: PublishVerdict, now_ms: int) -> bool:
        """Publish ``report``; True when Kafka took it (a failure waits for the next check)."""
        try:
            self.publisher.publish(self.broker_id, encode_report(report))
        except LoadBalancerError as e:
            log.warning("report not published, retrying at the next check: %s", e)
            metrics.AGENT_CHECKS.labels(published="false").inc()
            return False
        self.last_published, self.last_published_ms = report, now_ms
        self.published_count += 1
        metrics.AGENT_CHECKS.labels(published="true").inc()
        metrics.AGENT_REPORTS_PUBLISHED.inc()
        log.info(
            "published report broker=%s bundles=%d max_usage=%.1f%% msg_rate=%.1f/s "
            "throughput=%.0fB/s (%s)",
            self.broker_id,
            report.num_bundles,
            report.max_resource_usage() * 100.0,
            report.msg_rate,
            report.msg_throughput,
            verdict.reason,
        )
        return True

    def _host_gauges(self, report: LocalBrokerData) -> None:
        """This broker's usage under Pulsar's names, as a Pulsar broker exports its own."""
        metrics.set_broker_usage(
            self.broker_id,
            cpu=report.cpu.percent_usage(),
            memory=report.memory.percent_usage(),
            direct_memory=report.direct_memory.percent_usage(),
            bandwidth_in=report.bandwidth_in.percent_usage(),
            bandwidth_out=report.bandwidth_out.percent_usage(),
        )

    def _count_issues(self, stats: BundleStatsSnapshot) -> None:
        """Count what the codec ignored in the provider's document; warn once per kind."""
        for kind, n in stats.issue_counts:
            metrics.REPORT_ISSUES.labels(source="agent", kind=kind).inc(n)
        for issue in stats.issues:
            if issue.kind not in self._warned:
                self._warned.add(issue.kind)
                log.warning(
                    "bundle stats of %s: %s ignored (%s: %s); counted in "
                    "lbctl_report_issues_total, warned once",
                    self.broker_id,
                    issue.kind,
                    issue.field,
                    issue.reason,
                )

    def _keep_leases(self, bundles: Iterable[str], now_ms: int) -> None:
        if self.lease_keeper is None:
            return
        try:
            renewed = self.lease_keeper.heartbeat(bundles, now_ms)
        except Exception as e:  # Redis down: keep reporting, the next check retries
            log.warning("broker heartbeat/lease renewal failed: %s", e)
            metrics.LEASE_RENEWALS.labels(result="failed").inc()
            return
        lost = sorted(b for b, ok in renewed.items() if not ok)
        metrics.LEASE_RENEWALS.labels(result="renewed").inc(len(renewed) - len(lost))
        metrics.LEASE_RENEWALS.labels(result="lost").inc(len(lost))
        if lost:
            log.warning("leases not renewed (lost to another owner?): %s", ", ".join(lost))

    def _publish_serving(self) -> None:
        """Rewrite the serving file and gauges after every check, whatever it did: the
        deadlines only move on a successful renewal, but seconds left and lapses show."""
        keeper = self.lease_keeper
        if self.serving_hook is None or keeper is None or keeper.serving is None:
            return
        try:
            self.serving_hook.publish(keeper.serving)
        except OSError as e:
            log.warning("serving file not written: %s", e)

    def _send_acks(self) -> None:
        """Acknowledge the handovers of bundles the serving file no longer lists (it was just
        rewritten, so the broker stops by it before the next holder is told to serve)."""
        keeper = self.lease_keeper
        if keeper is None or keeper.serving is None:
            return
        try:
            keeper.send_acks(wait=True)
        except Exception as e:  # Redis away: the next check retries; the fence expires anyway
            log.warning("handover acknowledgement failed: %s", e)

    def stop(self) -> None:
        """Ask ``run`` to return after the current check."""
        self._stop.set()

    def run(self, *, once: bool = False) -> int:
        """Check every min interval until stopped; ``once``: one check, exit 0 iff published."""
        installed = self._install_signal_handlers()
        try:
            interval_s = self.rule.min_interval_ms / 1000.0
            while not self._stop.is_set():
                published = self.tick(self.clock())
                if once:
                    return 0 if published else 1
                self._stop.wait(interval_s)
            log.info("agent for %s stopped after %d reports", self.broker_id, self.published_count)
            return 0
        finally:
            for sig, previous in installed:
                signal.signal(sig, previous)

    def _install_signal_handlers(self) -> list[tuple[int, Any]]:
        if threading.current_thread() is not threading.main_thread():
            return []
        installed = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            installed.append((sig, signal.getsignal(sig)))
            signal.signal(sig, lambda _s, _f: self.stop())
        return installed
