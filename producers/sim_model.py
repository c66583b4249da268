"""The simulated cluster: topic traffic, broker capacities, and the load reports they produce.

This module is the *model* half of the simulator and is pure on purpose: no I/O, no clock (virtual
time comes in as ``now_ms``), and every random number is drawn from a ``random.Random`` the caller
passes in. That keeps the fast mode reproducible for a seed and lets a live driver (publishing to
Kafka and following Redis ownership) call exactly the same functions.

How load is produced, and why it is closed-loop:

* Traffic lives on **topics**, never on bundles. A topic's bundle is found on the namespace's
  current boundaries by hash (``NamespaceBundles.find_index``), so a split really divides a
  bundle's topics by hash, and a move of a bundle moves exactly the traffic of its topics.
* A namespace follows one traffic pattern: ``steady``, or ``diurnal`` (a sine wave over a virtual
  day), with a small seeded per-tick wobble; topics inside it can be skewed (Zipf weights), and
  seeded **bursts** multiply a few topics' rate for a while.
* A broker serves exactly the bundles the ownership map gives it. Its report is a function of
  those bundles' traffic and of its own capacity, in Pulsar's units: CPU usage in percent of one
  core against a limit of ``100 x cores``; NIC usage in KB/s against the NIC limit; heap and direct
  memory in MB. CPU grows with messages and bytes handled (``CostModel``), so a broker with twice
  the cores shows half the CPU percentage for the same bundles: the heterogeneity Pulsar's
  message-rate strategies cannot see.

``reports_at`` is the one entry point a driver needs: model + boundaries + ownership + time ->
every live broker's ``LocalBrokerData``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from loadbalance.bundles import NamespaceBundles
from loadbalance.model import LocalBrokerData, NamespaceBundleStats, ResourceUsage

KBYTES = 1024.0
MINUTE_MS = 60_000
STEADY, DIURNAL = "steady", "diurnal"


@dataclass(frozen=True, slots=True)
class BrokerSpec:
    """One simulated broker's hardware; names carry their units."""

    name: str
    cores: float = 8.0
    nic_kbytes_per_s: float = 1_250_000.0
    memory_mb: float = 8192.0
    direct_memory_mb: float = 4096.0

    @property
    def cpu_limit_pct(self) -> float:
        """Pulsar's CPU limit: 100 per core."""
        return 100.0 * self.cores


@dataclass(frozen=True, slots=True)
class CostModel:
    """What serving traffic costs a broker. CPU is in percent of one core."""

    idle_cpu_fraction: float = 0.03
    cpu_pct_per_msg_per_s: float = 0.004
    cpu_pct_per_kbyte_per_s: float = 0.002
    cpu_noise_fraction: float = 0.01
    heap_base_fraction: float = 0.25
    heap_mb_per_topic: float = 0.25
    direct_base_fraction: float = 0.05
    direct_mb_per_kbyte_per_s: float = 0.002


@dataclass(frozen=True, slots=True)
class Topic:
    """One topic's steady-state traffic (before the namespace pattern and bursts)."""

    name: str
    hash: int
    rate_in_per_s: float
    msg_bytes: int
    subscriptions: int
    producers: int
    consumers: int


@dataclass(frozen=True, slots=True)
class NamespaceTraffic:
    """A namespace's topics (sorted by hash) and the pattern its traffic follows over time."""

    namespace: str
    topics: tuple[Topic, ...]
    pattern: str = STEADY
    diurnal_amplitude: float = 0.0
    diurnal_period_ms: int = 24 * 60 * MINUTE_MS
    phase: float = 0.0
    noise: float = 0.0

    @property
    def hashes(self) -> tuple[int, ...]:
        return tuple(t.hash for t in self.topics)


@dataclass(frozen=True, slots=True)
class Burst:
    """``factor`` x the rate of one topic between ``start_ms`` (incl.) and ``end_ms`` (excl.)."""

    namespace: str
    topic_index: int
    start_ms: int
    end_ms: int
    factor: float


@dataclass(frozen=True, slots=True)
class _Agg:
    """Summed base traffic of one bundle's topics."""

    rate_in: float = 0.0
    rate_out: float = 0.0
    thr_in: float = 0.0
    thr_out: float = 0.0
    topics: int = 0
    producers: int = 0
    consumers: int = 0


@dataclass(frozen=True)
class ClusterModel:
    """Everything that defines the simulated world except ownership and boundaries."""

    brokers: Mapping[str, BrokerSpec]
    traffic: Mapping[str, NamespaceTraffic]
    bursts: tuple[Burst, ...] = ()
    cost: CostModel = CostModel()
    _memo: dict = field(default_factory=dict, compare=False, repr=False)

    def bundle_base(self, bundles: NamespaceBundles) -> dict[str, _Agg]:
        """Base traffic per bundle for one boundary layout (memoised: layouts change rarely)."""
        key = (bundles.namespace, bundles.boundaries)
        hit = self._memo.get(key)
        if hit is None:
            hit = _aggregate(self.traffic[bundles.namespace], bundles)
            if len(self._memo) > 4096:
                self._memo.clear()
            self._memo[key] = hit
        return hit


def _aggregate(ns: NamespaceTraffic, bundles: NamespaceBundles) -> dict[str, _Agg]:
    names = bundles.bundle_names
    sums = [[0.0, 0.0, 0.0, 0.0, 0, 0, 0] for _ in names]
    for t in ns.topics:
        s = sums[bundles.find_index(t.hash)]
        out = t.rate_in_per_s * t.subscriptions
        s[0] += t.rate_in_per_s
        s[1] += out
        s[2] += t.rate_in_per_s * t.msg_bytes
        s[3] += out * t.msg_bytes
        s[4] += 1
        s[5] += t.producers
        s[6] += t.consumers
    return {n: _Agg(*s) for n, s in zip(names, sums)}


def zipf_weights(n: int, exponent: float, rng: random.Random) -> list[float]:
    """``n`` weights summing to 1, Zipf-distributed, in a seeded random order (0 = uniform)."""
    raw = [1.0 / (k**exponent) for k in range(1, n + 1)]
    rng.shuffle(raw)
    total = sum(raw)
    return [w / total for w in raw]


def namespace_multiplier(ns: NamespaceTraffic, now_ms: int, rng: random.Random) -> float:
    """The pattern's factor at ``now_ms`` times a seeded wobble (never negative)."""
    base = 1.0
    if ns.pattern == DIURNAL and ns.diurnal_period_ms > 0:
        angle = 2.0 * math.pi * now_ms / ns.diurnal_period_ms + ns.phase
        base = 1.0 + ns.diurnal_amplitude * math.sin(angle)
    if ns.noise > 0:
        base *= 1.0 + rng.gauss(0.0, ns.noise)
    return max(base, 0.0)


def bundle_stats(
    model: ClusterModel,
    namespaces: Mapping[str, NamespaceBundles],
    now_ms: int,
    rng: random.Random,
) -> dict[str, NamespaceBundleStats]:
    """Every bundle's current ``NamespaceBundleStats`` for the given boundaries and time."""
    factors: dict[str, float] = {}
    for ns_name in sorted(model.traffic):
        factors[ns_name] = namespace_multiplier(model.traffic[ns_name], now_ms, rng)
    extra: dict[str, list[float]] = {}
    for burst in model.bursts:
        if not burst.start_ms <= now_ms < burst.end_ms or burst.namespace not in namespaces:
            continue
        topic = model.traffic[burst.namespace].topics[burst.topic_index]
        bundles = namespaces[burst.namespace]
        i = bundles.find_index(topic.hash)
        name = _name_at(bundles, i)
        add = extra.setdefault(name, [0.0, 0.0, 0.0, 0.0])
        more = (burst.factor - 1.0) * topic.rate_in_per_s
        add[0] += more
        add[1] += more * topic.subscriptions
        add[2] += more * topic.msg_bytes
        add[3] += more * topic.subscriptions * topic.msg_bytes
    out: dict[str, NamespaceBundleStats] = {}
    for ns_name in sorted(namespaces):
        if ns_name not in model.traffic:
            continue
        f = factors[ns_name]
        for name, a in model.bundle_base(namespaces[ns_name]).items():
            e = extra.get(name)
            ri, ro, ti, to = a.rate_in, a.rate_out, a.thr_in, a.thr_out
            if e is not None:
                ri, ro, ti, to = ri + e[0], ro + e[1], ti + e[2], to + e[3]
            out[name] = NamespaceBundleStats(
                msg_rate_in=ri * f,
                msg_rate_out=ro * f,
                msg_throughput_in=ti * f,
                msg_throughput_out=to * f,
                topics=a.topics,
                consumer_count=a.consumers,
                producer_count=a.producers,
            )
    return out


def _name_at(bundles: NamespaceBundles, i: int) -> str:
    b = bundles.boundaries
    return f"{bundles.namespace}/0x{b[i]:08x}_0x{b[i + 1]:08x}"


def broker_report(
    spec: BrokerSpec,
    owned: Sequence[str],
    stats: Mapping[str, NamespaceBundleStats],
    cost: CostModel,
    now_ms: int,
    rng: random.Random,
) -> LocalBrokerData:
    """The ``LocalBrokerData`` a broker serving ``owned`` would publish at ``now_ms``."""
    last: dict[str, NamespaceBundleStats] = {}
    ri = ro = ti = to = 0.0
    topics = producers = consumers = 0
    for name in owned:
        s = stats.get(name)
        if s is None:
            continue
        last[name] = s
        ri += s.msg_rate_in
        ro += s.msg_rate_out
        ti += s.msg_throughput_in
        to += s.msg_throughput_out
        topics += s.topics
        producers += s.producer_count
        consumers += s.consumer_count
    kb_per_s = (ti + to) / KBYTES
    cpu = _cpu_pct(spec, cost, ri + ro, kb_per_s, rng)
    heap, direct = _memory_mb(spec, cost, topics, kb_per_s)
    nic_in = min(ti / KBYTES, spec.nic_kbytes_per_s)
    nic_out = min(to / KBYTES, spec.nic_kbytes_per_s)
    return LocalBrokerData(
        broker=spec.name,
        cpu=ResourceUsage(cpu, spec.cpu_limit_pct),
        memory=ResourceUsage(heap, spec.memory_mb),
        direct_memory=ResourceUsage(direct, spec.direct_memory_mb),
        bandwidth_in=ResourceUsage(nic_in, spec.nic_kbytes_per_s),
        bandwidth_out=ResourceUsage(nic_out, spec.nic_kbytes_per_s),
        msg_throughput_in=ti,
        msg_throughput_out=to,
        msg_rate_in=ri,
        msg_rate_out=ro,
        num_topics=topics,
        num_bundles=len(last),
        num_consumers=consumers,
        num_producers=producers,
        bundles=frozenset(last),
        last_stats=last,
        last_update_ms=now_ms,
        web_service_url=f"http://{spec.name}:8080",
        pulsar_service_url=f"pulsar://{spec.name}:6650",
        broker_version="sim",
    )


def _cpu_pct(
    spec: BrokerSpec, cost: CostModel, msg_per_s: float, kb_per_s: float, rng: random.Random
) -> float:
    """CPU in percent: idle share plus a cost per message and per KB, with noise, capped."""
    cpu = (
        cost.idle_cpu_fraction * spec.cpu_limit_pct
        + cost.cpu_pct_per_msg_per_s * msg_per_s
        + cost.cpu_pct_per_kbyte_per_s * kb_per_s
    )
    if cost.cpu_noise_fraction > 0:
        cpu *= 1.0 + rng.gauss(0.0, cost.cpu_noise_fraction)
    return min(max(cpu, 0.0), spec.cpu_limit_pct)


def _memory_mb(
    spec: BrokerSpec, cost: CostModel, topics: int, kb_per_s: float
) -> tuple[float, float]:
    """Heap (a base plus a cost per topic) and direct memory (a base plus a cost per KB/s), MB."""
    heap = min(
        spec.memory_mb * cost.heap_base_fraction + topics * cost.heap_mb_per_topic, spec.memory_mb
    )
    direct = min(
        spec.direct_memory_mb * cost.direct_base_fraction
        + kb_per_s * cost.direct_mb_per_kbyte_per_s,
        spec.direct_memory_mb,
    )
    return heap, direct


def reports_at(
    model: ClusterModel,
    namespaces: Mapping[str, NamespaceBundles],
    owners: Mapping[str, str],
    live_brokers: Sequence[str],
    now_ms: int,
    rng: random.Random,
) -> tuple[dict[str, LocalBrokerData], dict[str, NamespaceBundleStats]]:
    """Every live broker's report at ``now_ms`` for this ownership (bundle -> broker).

    Returns the reports and the per-bundle stats they were cut from. Bundles owned by a broker
    that is not live (crashed, lease not yet expired) are served by nobody and appear nowhere.
    """
    stats = bundle_stats(model, namespaces, now_ms, rng)
    owned: dict[str, list[str]] = {b: [] for b in live_brokers}
    for bundle, broker in owners.items():
        lst = owned.get(broker)
        if lst is not None:
            lst.append(bundle)
    reports = {
        b: broker_report(model.brokers[b], sorted(owned[b]), stats, model.cost, now_ms, rng)
        for b in sorted(live_brokers)
    }
    return reports, stats
