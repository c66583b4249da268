"""Prometheus metrics of every long-running process (stream, control, agent, simulator).

One module defines every metric object, so that a name is declared once, two processes never
disagree on a label set, and a dashboard written for one process reads the same names in another.
Where Pulsar's load manager has a metric we use its exact name and labels (``pulsar_lb_*``, see
``ModularLoadManagerImpl`` / ``BrokerLoadData.toMetrics`` / ``UnloadCounter`` / ``SplitCounter`` /
``AssignCounter``), so Pulsar's Grafana panels keep working; everything Pulsar has no name for is
prefixed ``lbctl_``.

Deviations from Pulsar, on purpose:

- Pulsar exports a ``Metrics`` object per dimension set with ``cluster`` and ``metric``
  (``loadBalancing``, ``bundleUnloading``, ``bundlesSplit``, ``assign``) labels; ``metric`` is
  constant per name and ``cluster`` is constant per deployment, so we leave both to the scrape
  config (Prometheus' ``job``/``instance`` or ``external_labels``). The usage gauges keep the
  ``broker`` label: here one process (the stream job) exports every broker's usage, where a Pulsar
  broker exports only its own.
- Pulsar's unload/split counters carry the leader's ``broker`` label; our decider is not a broker,
  so they have none.
- Counters are exposed the Prometheus-client way: ``<name>_total`` (Pulsar's names already end in
  ``_total``), and the ``_created`` series are disabled to keep the exposition Pulsar-shaped.

Who counts what (so that a sum over processes never counts one thing twice):

- the stream job (the decider) exports the ``pulsar_lb_*`` usage gauges of every broker from its
  averaged view, the score stats, and the unload/split counters and breakdowns of the decisions
  it published (Pulsar counts them where it decides, too);
- the control loop counts what applying each decision did in ``lbctl_control_decisions_total``
  (kind, outcome), ownership events and lookups, and ``pulsar_lb_assign_broker_breakdown_total``
  for placements it makes; it does not count unloads or splits again;
- a broker agent exports its own host usage under the ``pulsar_lb_*`` names (as a Pulsar broker
  does), its reports and its lease renewals; the simulator its cycles and reports.

Each process serves only its own families (``ROLE_FAMILIES``, chosen by the command's name in
``serve_from_args``): every object is defined here, but the controller's endpoint carries no
stream gauges at zero, and the stream's no controller counters.

Updating a metric costs a lock and an add; callers update per batch or per cycle, never per record,
so the hot path is not measurably slower.

Usage in a process::

    from infra import metrics
    metrics.add_metrics_argument(parser)             # --metrics-port, --metrics-addr
    ...
    metrics.serve(args.metrics_port, args.metrics_addr)
    metrics.DECISIONS_PUBLISHED.labels(kind="unload", reason="Overloaded").inc()
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import threading
from collections import Counter as Tally
from collections.abc import Iterable
from typing import Any

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    start_http_server,
)

log = logging.getLogger(__name__)

# Pulsar's exposition has no ``_created`` series; ours should look the same.
disable_created_metrics()

# --------------------------------------------------------------------------------------------
# Pulsar's names (ModularLoadManagerImpl, extensible BrokerLoadData/UnloadCounter/SplitCounter)
# --------------------------------------------------------------------------------------------

#: Per-broker resource usage in percent (0-100), from the averaged view of its load reports.
BROKER_CPU_USAGE = Gauge("pulsar_lb_cpu_usage", "Broker CPU usage, percent", ["broker"])
BROKER_MEMORY_USAGE = Gauge("pulsar_lb_memory_usage", "Broker JVM heap usage, percent", ["broker"])
BROKER_DIRECT_MEMORY_USAGE = Gauge(
    "pulsar_lb_directMemory_usage", "Broker direct memory usage, percent", ["broker"]
)
BROKER_BANDWIDTH_IN_USAGE = Gauge(
    "pulsar_lb_bandwidth_in_usage", "Broker inbound NIC usage, percent", ["broker"]
)
BROKER_BANDWIDTH_OUT_USAGE = Gauge(
    "pulsar_lb_bandwidth_out_usage", "Broker outbound NIC usage, percent", ["broker"]
)

#: Extensible load manager's broker score: ``feature="max"`` is the weighted max usage (0-1) of the
#: latest report, ``feature="max_ema"`` its exponential moving average (what the shedders rank by).
BROKER_RESOURCE_USAGE = Gauge(
    "pulsar_lb_resource_usage",
    "Broker score: weighted max resource usage (max) and its moving average (max_ema), 0-1",
    ["broker", "feature"],
)
#: Cluster-wide average and standard deviation of the brokers' scores (TransferShedder's input).
RESOURCE_USAGE_STATS = Gauge(
    "pulsar_lb_resource_usage_stats",
    "Average (stat=avg) and standard deviation (stat=std) of the broker scores",
    ["feature", "stat"],
)

UNLOAD_BROKER_TOTAL = Counter(
    "pulsar_lb_unload_broker_total", "Brokers that had bundles unloaded, counted per shedding cycle"
)
UNLOAD_BUNDLE_TOTAL = Counter("pulsar_lb_unload_bundle_total", "Bundles unloaded by the shedder")
#: ``result`` is Success, Skip or Failure; ``reason`` is Pulsar's: Overloaded, Underloaded, Admin,
#: Balanced, NoBundles, CoolDown, OutDatedData, NoLoadData, NoBrokers, HitCount, Unknown.
UNLOAD_BROKER_BREAKDOWN_TOTAL = Counter(
    "pulsar_lb_unload_broker_breakdown_total",
    "Unload decisions and skipped shedding cycles by result and reason",
    ["result", "reason"],
)
BUNDLES_SPLIT_TOTAL = Counter("pulsar_lb_bundles_split_total", "Bundles split")
#: ``reason`` is Pulsar's: Topics, Sessions, MsgRate, Bandwidth, Admin, Unknown.
BUNDLES_SPLIT_BREAKDOWN_TOTAL = Counter(
    "pulsar_lb_bundles_split_breakdown_total",
    "Bundle splits by result and reason",
    ["result", "reason"],
)
#: ``result`` is Success, Skip, Empty or Failure (Pulsar's AssignCounter).
ASSIGN_BROKER_BREAKDOWN_TOTAL = Counter(
    "pulsar_lb_assign_broker_breakdown_total", "Bundle assignments by result", ["result"]
)

# --------------------------------------------------------------------------------------------
# Ours: the streaming job
# --------------------------------------------------------------------------------------------

#: Buckets from a fast micro-batch (tens of ms) to a slow one on a loaded 2-core box (minutes).
_BATCH_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

STREAM_BATCH_DURATION = Histogram(
    "lbctl_stream_batch_duration_seconds",
    "Wall time of one micro-batch on the driver: Spark plan, policies, publishing, Redis commit",
    buckets=_BATCH_BUCKETS_S,
)
STREAM_BATCH_SPARK_DURATION = Histogram(
    "lbctl_stream_batch_spark_seconds",
    "Of the batch duration: running the Spark plan (source, parse, state step)",
    buckets=_BATCH_BUCKETS_S,
)
STREAM_BATCHES = Counter("lbctl_stream_batches_total", "Micro-batches handled by the driver")
STREAM_LAST_BATCH_ID = Gauge("lbctl_stream_last_batch_id", "Id of the last micro-batch handled")
STREAM_INPUT_ROWS = Counter(
    "lbctl_stream_input_rows_total", "Load-report records read from Kafka (good and bad)"
)
STREAM_DEAD_LETTERS = Counter(
    "lbctl_stream_dead_letters_total", "Records rejected to the dead-letter topic"
)
STREAM_DECIDER_TERM = Gauge(
    "lbctl_stream_decider_term",
    "Term of the decider lease this job holds; 0 while another job holds it (this one decides "
    "nothing)",
)
STREAM_BROKERS = Gauge("lbctl_stream_brokers", "Brokers in the averaged view")
STREAM_BUNDLES = Gauge("lbctl_stream_bundles", "Bundles in the averaged view")
#: ``kind`` is the decision kind (split, unload, transfer, ...); ``reason`` Pulsar's reason name.
DECISIONS_PUBLISHED = Counter(
    "lbctl_decisions_published_total", "Decisions published to Kafka", ["kind", "reason"]
)

# --------------------------------------------------------------------------------------------
# Ours: the control loop and lookups
# --------------------------------------------------------------------------------------------

#: ``outcome`` is what applying it did (applied, noop, stale, rejected, failed, ...).
CONTROL_DECISIONS = Counter(
    "lbctl_control_decisions_total", "Decisions read by the control loop", ["kind", "outcome"]
)
CONTROL_CYCLE_DURATION = Histogram(
    "lbctl_control_cycle_duration_seconds",
    "Wall time of one control-loop cycle",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
#: ``event`` is the ownership event type (assigned, released, expired, split, ...).
OWNERSHIP_EVENTS_PUBLISHED = Counter(
    "lbctl_ownership_events_published_total", "Ownership events published", ["event"]
)
CONTROL_SWEEPS = Counter(
    "lbctl_control_sweeps_total", "Sweeps of expired leases the control loop completed"
)
CONTROL_LEASES_EXPIRED = Counter(
    "lbctl_control_leases_expired_total", "Expired leases the control loop's sweeps removed"
)
CONTROL_RECOVERIES = Counter(
    "lbctl_control_recoveries_total",
    "Rebuilds of a store that lost its data (Redis without persistence), run by the control loop",
)
#: ``kind`` is ``controller.redis_faults.fault_kind``: connection, timeout, readonly, oom, busy,
#: masterdown, loading, ... (waited out), reply (another Redis error reply) or error (not Redis).
CONTROL_REDIS_FAULTS = Counter(
    "lbctl_control_redis_faults_total",
    "Errors the control loop backed off from (a record held un-committed, a sweep skipped)",
    ["kind"],
)
#: ``reason``: broker_not_alive (the chosen destination's registration lapsed), namespace_changed
#: (the bundle was split or merged meanwhile), malformed_key (a lease key that is no lease).
CONTROL_SWEEP_SKIPS = Counter(
    "lbctl_control_sweep_skips_total",
    "Bundles and lease keys a sweep left as they were (not placed now, or not a lease)",
    ["reason"],
)
#: ``result`` is owned (an owner answered), assigned (placed on lookup), none, or failure.
LOOKUPS = Counter("lbctl_lookups_total", "Bundle owner lookups", ["result"])
#: ``reason`` is one of ``REFUSAL_REASONS``: the kind of refusal, not its text (which names a
#: namespace or a broker, and would give a series per namespace).
LOOKUPS_REFUSED = Counter(
    "lbctl_lookups_refused_total",
    "Placements that found no eligible broker (the placement rules or no live broker left none)",
    ["reason"],
)
LOOKUP_DURATION = Histogram(
    "lbctl_lookup_duration_seconds",
    "Latency of one bundle owner lookup",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
)

# --------------------------------------------------------------------------------------------
# Ours: the broker agent and the simulator
# --------------------------------------------------------------------------------------------

AGENT_REPORTS_PUBLISHED = Counter(
    "lbctl_agent_reports_published_total", "Load reports the broker agent published"
)
AGENT_CHECKS = Counter(
    "lbctl_agent_checks_total", "Report checks by the agent, published or not", ["published"]
)
#: ``result`` is renewed, lost (the lease is no longer ours) or failed (the store did not answer).
LEASE_RENEWALS = Counter(
    "lbctl_lease_renewals_total", "Bundle lease renewals by result", ["result"]
)
#: ``kind`` is ``loadbalance.model.ISSUE_KINDS``; ``source`` is where the report was read.
REPORT_ISSUES = Counter(
    "lbctl_report_issues_total",
    "Items ignored in accepted load reports (broken readings, unusable bundle entries, "
    "documents without bundle data)",
    ["source", "kind"],
)
#: ``reason`` is invalid (the document was refused) or unreachable (no document).
AGENT_PROVIDER_FAILURES = Counter(
    "lbctl_agent_provider_failures_total",
    "Agent checks whose bundle-stats provider gave no usable document",
    ["reason"],
)
#: 1 while the broker may serve the bundle by its own clock (loadbalance.serving), else 0.
AGENT_SERVING = Gauge(
    "lbctl_agent_serving",
    "1 while the broker may serve the bundle (before its local serve-until), else 0",
    ["bundle"],
)
AGENT_SERVING_SECONDS_LEFT = Gauge(
    "lbctl_agent_serving_seconds_left",
    "Seconds until the broker must stop serving the bundle unless a renewal succeeds",
    ["bundle"],
)
SIMULATOR_CYCLES = Counter("lbctl_simulator_cycles_total", "Simulator ticks")
SIMULATOR_REPORTS_PUBLISHED = Counter(
    "lbctl_simulator_reports_published_total", "Load reports the simulator published"
)

_BROKER_GAUGES = (
    BROKER_CPU_USAGE,
    BROKER_MEMORY_USAGE,
    BROKER_DIRECT_MEMORY_USAGE,
    BROKER_BANDWIDTH_IN_USAGE,
    BROKER_BANDWIDTH_OUT_USAGE,
)


class BrokerSeries:
    """The per-broker series of the usage and score gauges that this process set, so that
    departed brokers' series can be removed without the client's private label table, and
    each broker's children are looked up once (``labels()`` validates and locks on every call).

    An object, not module state: the process's one (``BROKER_SERIES``) sits beside the gauges
    it tracks, and a test makes its own over its own gauges and throws it away."""

    def __init__(self, usage_gauges: tuple[Any, ...], score_gauge: Any) -> None:
        self._usage_gauges, self._score_gauge = usage_gauges, score_gauge
        self._usage: dict[str, tuple] = {}  # broker -> its children of the usage gauges
        self._score: dict[tuple[str, str], Any] = {}  # (broker, feature) -> its score child
        self._lock = threading.Lock()

    def usage(self, broker: str) -> tuple:
        """The broker's children of the usage gauges, in ``usage_gauges`` order."""
        children = self._usage.get(broker)
        if children is None:
            children = tuple(g.labels(broker=broker) for g in self._usage_gauges)
            with self._lock:
                self._usage[broker] = children
        return children

    def score(self, broker: str, feature: str) -> Any:
        """The broker's child of the score gauge for ``feature``."""
        child = self._score.get((broker, feature))
        if child is None:
            child = self._score_gauge.labels(broker=broker, feature=feature)
            with self._lock:
                self._score[(broker, feature)] = child
        return child

    def forget(self, keep: Iterable[str]) -> None:
        """Remove the series of every broker not in ``keep``."""
        keep_set = set(keep)
        with self._lock:
            gone = [b for b in self._usage if b not in keep_set]
            for b in gone:
                del self._usage[b]
            gone_scored = [key for key in self._score if key[0] not in keep_set]
            for key in gone_scored:
                del self._score[key]
        for broker in gone:
            for gauge in self._usage_gauges:
                gauge.remove(broker)
        for broker, feature in gone_scored:
            self._score_gauge.remove(broker, feature)


BROKER_SERIES = BrokerSeries(_BROKER_GAUGES, BROKER_RESOURCE_USAGE)
"""The series this process set on its gauges (``set_broker_usage``, ``set_broker_score``)."""

# --------------------------------------------------------------------------------------------
# Recording helpers: one call per batch or cycle, Pulsar's counting rules in one place
# --------------------------------------------------------------------------------------------


def set_broker_usage(
    broker: str,
    *,
    cpu: float,
    memory: float,
    direct_memory: float,
    bandwidth_in: float,
    bandwidth_out: float,
) -> None:
    """Set one broker's usage gauges (percent, as Pulsar's ``LocalBrokerData`` usage)."""
    children = BROKER_SERIES.usage(broker)
    for child, value in zip(children, (cpu, memory, direct_memory, bandwidth_in, bandwidth_out)):
        child.set(value)


def set_agent_serving(bundle: str, serving: bool, seconds_left: float) -> None:
    """The agent's serving state of one bundle (``lbctl_agent_serving*``)."""
    AGENT_SERVING.labels(bundle=bundle).set(1 if serving else 0)
    AGENT_SERVING_SECONDS_LEFT.labels(bundle=bundle).set(seconds_left)


def forget_agent_serving(bundles: Iterable[str]) -> None:
    """Drop the serving gauges of bundles the agent no longer holds."""
    for b in bundles:
        for gauge in (AGENT_SERVING, AGENT_SERVING_SECONDS_LEFT):
            with contextlib.suppress(KeyError):
                gauge.remove(b)


def forget_brokers(keep: Iterable[str]) -> None:
    """Drop the per-broker series of every broker not in ``keep``.

    Why: a broker that left the cluster must not keep exporting its last usage forever (a stale
    gauge looks like a live, idle broker on a dashboard).
    """
    BROKER_SERIES.forget(keep)


def set_broker_score(broker: str, *, max_ema: float, latest_max: float | None = None) -> None:
    """Set one broker's score gauges (``pulsar_lb_resource_usage``, 0-1)."""
    BROKER_SERIES.score(broker, "max_ema").set(max_ema)
    if latest_max is not None:
        BROKER_SERIES.score(broker, "max").set(latest_max)


def set_resource_usage_stats(avg: float, std: float, feature: str = "max_ema") -> None:
    """Set the cluster-wide average and standard deviation of the broker scores."""
    RESOURCE_USAGE_STATS.labels(feature=feature, stat="avg").set(avg)
    RESOURCE_USAGE_STATS.labels(feature=feature, stat="std").set(std)


def record_unloads(unloads: Iterable[tuple[str, str]]) -> None:
    """Count one shedding cycle's unloads: ``(source broker, reason)`` per unloaded bundle.

    Pulsar's rule: ``unload_broker_total`` grows by the number of distinct brokers shed in the
    cycle, ``unload_bundle_total`` by the number of bundles, and the breakdown by one
    ``result="Success"`` per unload decision with its reason.
    """
    items = list(unloads)
    if not items:
        return
    UNLOAD_BROKER_TOTAL.inc(len({broker for broker, _ in items}))
    UNLOAD_BUNDLE_TOTAL.inc(len(items))
    # one increment per reason: a cycle at a million bundles unloads tens of thousands
    for reason, n in Tally(reason or "Unknown" for _, reason in items).items():
        UNLOAD_BROKER_BREAKDOWN_TOTAL.labels(result="Success", reason=reason).inc(n)


def record_unload_skip(reason: str, result: str = "Skip") -> None:
    """Count a shedding cycle that unloaded nothing (``Skip``) or failed (``Failure``)."""
    UNLOAD_BROKER_BREAKDOWN_TOTAL.labels(result=result, reason=reason or "Unknown").inc()


REFUSAL_REASONS = ("isolation", "heartbeat", "no_live_broker", "strategy", "other")
"""The ``reason`` label values of ``lbctl_lookups_refused_total``."""


def refusal_kind(reason: str) -> str:
    """The bounded label for a placement's refusal text (``BrokerSelector.last_reason``):
    an isolation policy left no broker, a heartbeat bundle's broker is not live, no broker is
    live at all, or the strategy chose none."""
    text = reason.lower()
    if "isolation policy" in text or "isolated by policy" in text:
        return "isolation"
    if "heartbeat" in text or "pinned to its own broker" in text:
        return "heartbeat"
    if "no live broker" in text or not text:
        return "no_live_broker"
    if "strategy" in text:
        return "strategy"
    return "other"


def record_lookup_refused(reason: str) -> str:
    """Count one placement that found no eligible broker; returns the label it counted."""
    kind = refusal_kind(reason)
    LOOKUPS_REFUSED.labels(reason=kind).inc()
    return kind


def record_splits(reasons: Iterable[str], result: str = "Success") -> None:
    """Count bundle splits, one reason (Topics, Sessions, MsgRate, Bandwidth, Admin) each."""
    n = 0
    for reason in reasons:
        BUNDLES_SPLIT_BREAKDOWN_TOTAL.labels(result=result, reason=reason or "Unknown").inc()
        n += 1
    if n and result == "Success":
        BUNDLES_SPLIT_TOTAL.inc(n)


# --------------------------------------------------------------------------------------------
# The HTTP exporter
# --------------------------------------------------------------------------------------------

_USAGE = ("pulsar_lb_cpu_usage", "pulsar_lb_memory_usage", "pulsar_lb_directMemory_usage",
          "pulsar_lb_bandwidth_in_usage", "pulsar_lb_bandwidth_out_usage",
          "pulsar_lb_resource_usage")  # fmt: skip

#: Which metric families each process exports (name prefixes): a process serves its own
#: families only, so a scrape of the controller shows no zero-valued stream gauges that a
#: dashboard would sum or alert on. A role not listed here exports every family.
ROLE_FAMILIES: dict[str, tuple[str, ...]] = {
    "stream": (*_USAGE, "pulsar_lb_resource_usage_stats", "pulsar_lb_unload_",
               "pulsar_lb_bundles_split", "lbctl_stream_", "lbctl_decisions_published",
               "lbctl_report_issues"),
    "control": ("lbctl_control_", "lbctl_ownership_events_", "lbctl_lookup",
                "pulsar_lb_assign_broker_breakdown"),
    "agent": (*_USAGE, "lbctl_agent_", "lbctl_lease_renewals", "lbctl_report_issues"),
    "simulate": (*_USAGE, "lbctl_simulator_"),
}  # fmt: skip


class _RoleCollector:
    """The families of ``REGISTRY`` whose names start with one of ``prefixes``."""

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        self.prefixes = prefixes

    def collect(self) -> Iterable[Any]:
        for family in REGISTRY.collect():
            if family.name.startswith(self.prefixes):
                yield family


def role_registry(role: str | None) -> Any:
    """The registry a process of ``role`` serves: only its families (``ROLE_FAMILIES``)."""
    prefixes = ROLE_FAMILIES.get(role or "")
    if prefixes is None:
        return REGISTRY
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_RoleCollector(prefixes))
    return registry


class Exporters:
    """The ``/metrics`` HTTP servers a process started and their URLs (an object, so that a
    test can make its own and stop it; the process's one is ``EXPORTERS``)."""

    def __init__(self) -> None:
        self._servers: list = []
        self._urls: list[str] = []
        self._lock = threading.Lock()

    def add(self, httpd: Any, url: str) -> None:
        with self._lock:
            self._servers.append(httpd)
            self._urls.append(url)

    def urls(self) -> list[str]:
        with self._lock:
            return list(self._urls)

    def stop_all(self) -> None:
        """Shut down every server added (tests; processes just exit)."""
        with self._lock:
            servers, self._servers, self._urls = self._servers, [], []
        for httpd in servers:
            httpd.shutdown()
            httpd.server_close()


EXPORTERS = Exporters()
"""The exporters this process serves (``serve``, ``served_urls``, ``stop_all``)."""


def served_urls() -> list[str]:
    """The ``/metrics`` URLs this process serves (the process registry publishes them)."""
    return EXPORTERS.urls()


def serve(port: int | None, addr: str = "127.0.0.1", role: str | None = None) -> int | None:
    """Start the ``/metrics`` HTTP exporter on a daemon thread; return the bound port.

    ``None`` means metrics are off (nothing is started, ``None`` is returned); ``0`` binds a free
    port, which tests use so that nothing depends on a fixed port. The default address is loopback
    because an exporter should only face the network when the operator says so.
    """
    if port is None:
        return None
    httpd, _thread = start_http_server(port, addr=addr, registry=role_registry(role))
    bound = int(httpd.server_port)
    shown = f"[{addr}]" if ":" in addr else addr
    EXPORTERS.add(
        httpd, f"http://{'127.0.0.1' if addr in ('0.0.0.0', '') else shown}:{bound}/metrics"
    )
    log.info("metrics on http://%s:%d/metrics", shown, bound)
    return bound


def stop_all() -> None:
    """Shut down every exporter this process started (tests; processes just exit)."""
    EXPORTERS.stop_all()


def add_metrics_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--metrics-port`` (and ``--metrics-addr``) to a command's parser."""
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics on http://ADDR:PORT/metrics (0 = a free port; "
        "default: no metrics endpoint)",
    )
    parser.add_argument(
        "--metrics-addr",
        default="127.0.0.1",
        metavar="ADDR",
        help="address the metrics endpoint binds (default 127.0.0.1; 0.0.0.0 to expose it)",
    )


def serve_from_args(args: argparse.Namespace) -> int | None:
    """``serve`` with the options ``add_metrics_argument`` added, for the command's role (its
    name: ``stream``, ``control``, ``agent``, ``simulate``)."""
    return serve(
        getattr(args, "metrics_port", None),
        getattr(args, "metrics_addr", "127.0.0.1"),
        role=getattr(args, "command", None),
    )
