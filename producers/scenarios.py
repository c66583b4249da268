"""Simulator scenarios: small JSON files under ``producers/scenarios/`` turned into a world.

A scenario file says what the cluster looks like (brokers and their hardware), what traffic its
namespaces carry (topic counts, totals, skew, diurnal waves, bursts, deliberately hot topics),
how bundles start out owned, what happens during the run (brokers added, removed, crashed or
restarted at given cycles) and which configuration knobs differ from the defaults. Everything
random (topic weights, hot topic names, burst times, a random initial assignment) is drawn here
from the seeded generator the caller passes, so one seed gives one world.

The files are data, not code, so that a reader can see a scenario at a glance and a user can
write a new one without touching Python. Field reference: ``docs/scoreboard.md``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from loadbalance.bundles import NamespaceBundles, topic_hash
from loadbalance.errors import InvalidInput
from loadbalance.placement.anti_affinity import filter_anti_affinity_group_owned_brokers
from loadbalance.placement.heartbeat import pinned_broker
from loadbalance.placement.isolation import namespace_candidates
from loadbalance.placement.policies import NO_POLICIES, PlacementPolicies
from producers.sim_model import (
    DIURNAL,
    KBYTES,
    MINUTE_MS,
    STEADY,
    BrokerSpec,
    Burst,
    ClusterModel,
    CostModel,
    NamespaceTraffic,
    Topic,
    zipf_weights,
)

ADD_BROKERS, REMOVE_BROKERS, CRASH, RESTART = "add_brokers", "remove_brokers", "crash", "restart"
EVENT_KINDS = (ADD_BROKERS, REMOVE_BROKERS, CRASH, RESTART)
BALANCED, RANDOM, ROUND_ROBIN = "balanced", "random", "round_robin"
GBIT_KBYTES_PER_S = 1e9 / 8 / KBYTES


@dataclass(frozen=True, slots=True)
class Event:
    """Something that happens to the cluster at the start of cycle ``at_cycle``.

    ``restart`` takes ``names`` down gracefully one after another, ``every_cycles`` apart, each for
    ``down_cycles``; a ``crash`` leaves the broker's bundles unserved until their leases expire.
    """

    at_cycle: int
    kind: str
    names: tuple[str, ...] = ()
    brokers: tuple[BrokerSpec, ...] = ()
    down_cycles: int = 2
    every_cycles: int = 5


@dataclass(frozen=True)
class Scenario:
    """A loaded scenario: the world, its starting point and its script."""

    name: str
    description: str
    cycles: int
    tick_ms: int
    model: ClusterModel
    initial_brokers: tuple[str, ...]
    namespaces: Mapping[str, NamespaceBundles]
    initial_assignment: str
    events: tuple[Event, ...] = ()
    config: Mapping[str, Any] = field(default_factory=dict)
    policies: PlacementPolicies = NO_POLICIES
    """Placement policies (the scenario's optional ``policies``: Pulsar's admin JSON, as in a
    snapshot), put into every view the fast simulator builds."""

    @property
    def first_event_cycle(self) -> int | None:
        return min((e.at_cycle for e in self.events), default=None)

    @property
    def kinds(self) -> set[str]:
        return {e.kind for e in self.events}


def scenario_dir() -> Path:
    return Path(str(resources.files("producers") / "scenarios"))


def available_scenarios() -> list[str]:
    """Names of the bundled scenario files, in a stable order."""
    return sorted(p.stem for p in scenario_dir().glob("*.json"))


def _brokers(specs: Sequence[Mapping[str, Any]]) -> list[BrokerSpec]:
    out: list[BrokerSpec] = []
    for spec in specs:
        prefix = spec.get("prefix", "broker")
        start = int(spec.get("start", 0))
        gbps = float(spec.get("nic_gbps", 10.0))
        cores = float(spec.get("cores", 8.0))
        for i in range(int(spec.get("count", 1))):
            out.append(
                BrokerSpec(
                    name=f"{prefix}-{start + i:02d}",
                    cores=cores,
                    nic_kbytes_per_s=gbps * GBIT_KBYTES_PER_S,
                    memory_mb=float(spec.get("memory_mb", 1024.0 * cores)),
                    direct_memory_mb=float(spec.get("direct_memory_mb", 512.0 * cores)),
                )
            )
    return out


def _namespace(spec: Mapping[str, Any], name: str, rng: random.Random) -> NamespaceTraffic:
    n = int(spec.get("topics", 100))
    weights = zipf_weights(n, float(spec.get("zipf_exponent", 0.0)), rng)
    total = float(spec.get("rate_in_per_s", 10_000.0))
    msg_bytes = int(spec.get("msg_bytes", 1024))
    subs = int(spec.get("subscriptions", 1))
    topics = [
        Topic(
            name=f"persistent://{name}/topic-{i}",
            hash=topic_hash(f"persistent://{name}/topic-{i}"),
            rate_in_per_s=total * w,
            msg_bytes=msg_bytes,
            subscriptions=subs,
            producers=1,
            consumers=subs,
        )
        for i, w in enumerate(weights)
    ]
    return NamespaceTraffic(
        namespace=name,
        topics=tuple(topics),
        pattern=spec.get("pattern", STEADY),
        diurnal_amplitude=float(spec.get("diurnal_amplitude", 0.0)),
        diurnal_period_ms=int(float(spec.get("diurnal_period_minutes", 1440)) * MINUTE_MS),
        phase=rng.uniform(0.0, 6.283) if spec.get("pattern") == DIURNAL else 0.0,
        noise=float(spec.get("noise", 0.0)),
    )


def _hot_topics(
    spec: Mapping[str, Any], ns: NamespaceTraffic, bundles: NamespaceBundles
) -> NamespaceTraffic:
    """Add topics whose names hash into one chosen bundle, so that bundle runs hot."""
    target = bundles.bundles[int(spec.get("bundle_index", 0))]
    want = int(spec.get("count", 4))
    rate = float(spec.get("rate_in_per_s", 1000.0))
    added: list[Topic] = []
    i = 0
    while len(added) < want:
        name = f"persistent://{ns.namespace}/hot-{i}"
        h = topic_hash(name)
        if target.contains_hash(h):
            added.append(Topic(name, h, rate, int(spec.get("msg_bytes", 1024)), 1, 1, 1))
        i += 1
    topics = tuple(sorted((*ns.topics, *added), key=lambda t: t.hash))
    return NamespaceTraffic(
        ns.namespace,
        topics,
        ns.pattern,
        ns.diurnal_amplitude,
        ns.diurnal_period_ms,
        ns.phase,
        ns.noise,
    )


def _bursts(
    spec: Mapping[str, Any],
    traffic: Mapping[str, NamespaceTraffic],
    cycles: int,
    tick_ms: int,
    rng: random.Random,
) -> tuple[Burst, ...]:
    out: list[Burst] = []
    per_hour = float(spec.get("per_hour", 0.0))
    length_ms = int(float(spec.get("duration_minutes", 5)) * MINUTE_MS)
    factor = float(spec.get("factor", 4.0))
    horizon_ms = cycles * tick_ms
    count = int(per_hour * horizon_ms / (60 * MINUTE_MS))
    names = sorted(traffic)
    for _ in range(count):
        ns = names[rng.randrange(len(names))]
        idx = rng.randrange(len(traffic[ns].topics))
        start = rng.randrange(0, max(horizon_ms, 1), MINUTE_MS)
        out.append(Burst(ns, idx, start, start + length_ms, factor))
    return tuple(out)


def _events(docs: Sequence[Mapping[str, Any]]) -> tuple[Event, ...]:
    out: list[Event] = []
    for doc in docs:
        kind = doc.get("kind")
        if kind not in EVENT_KINDS:
            raise InvalidInput("events.kind", f"unknown event {kind!r}; use {EVENT_KINDS}")
        out.append(
            Event(
                at_cycle=int(doc["at_cycle"]),
                kind=kind,
                names=tuple(doc.get("names", ())),
                brokers=tuple(_brokers(doc.get("brokers", ()))),
                down_cycles=int(doc.get("down_cycles", 2)),
                every_cycles=int(doc.get("every_cycles", 5)),
            )
        )
    return tuple(sorted(out, key=lambda e: e.at_cycle))


def parse_scenario(doc: Mapping[str, Any], rng: random.Random) -> Scenario:
    """Build a ``Scenario`` from its JSON document; ``rng`` draws everything random."""
    name = str(doc.get("name", "unnamed"))
    tick_ms = int(float(doc.get("tick_seconds", 60)) * 1000)
    cycles = int(doc.get("cycles", 120))
    brokers = _brokers(doc.get("brokers", ()))
    if not brokers:
        raise InvalidInput("brokers", f"scenario {name} has no broker")
    events = _events(doc.get("events", ()))
    all_specs = {b.name: b for b in brokers}
    for e in events:
        all_specs.update({b.name: b for b in e.brokers})
    traffic: dict[str, NamespaceTraffic] = {}
    layouts: dict[str, NamespaceBundles] = {}
    for spec in doc.get("namespaces", ()):
        for k in range(int(spec.get("count", 1))):
            ns_name = spec["name"] if int(spec.get("count", 1)) == 1 else f"{spec['name']}-{k}"
            traffic[ns_name] = _namespace(spec, ns_name, rng)
            layouts[ns_name] = NamespaceBundles.initial(ns_name, int(spec.get("bundles", 4)))
    for spec in doc.get("hot_topics", ()):
        ns_name = spec["namespace"]
        traffic[ns_name] = _hot_topics(spec, traffic[ns_name], layouts[ns_name])
    cost = CostModel(**doc.get("cost", {}))
    model = ClusterModel(
        brokers=all_specs,
        traffic=traffic,
        bursts=_bursts(doc.get("bursts", {}), traffic, cycles, tick_ms, rng),
        cost=cost,
    )
    return Scenario(
        name=name,
        description=str(doc.get("description", "")),
        cycles=cycles,
        tick_ms=tick_ms,
        model=model,
        initial_brokers=tuple(b.name for b in brokers),
        namespaces=layouts,
        initial_assignment=str(doc.get("initial_assignment", BALANCED)),
        events=events,
        config=dict(doc.get("config", {})),
        policies=PlacementPolicies.from_admin_json(doc.get("policies"), "policies"),
    )


def load_scenario(name_or_path: str, seed: int = 0) -> Scenario:
    """Load a bundled scenario by name, or any scenario file by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = scenario_dir() / f"{name_or_path}.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        known = ", ".join(available_scenarios())
        raise InvalidInput("scenario", f"no scenario {name_or_path!r}; known: {known}") from e
    return parse_scenario(doc, random.Random(seed))


def bundle_cpu_pct(model: ClusterModel, bundles: NamespaceBundles) -> dict[str, float]:
    """Each bundle's base CPU cost in percent of one core (for the initial placement only)."""
    c = model.cost
    return {
        name: c.cpu_pct_per_msg_per_s * (a.rate_in + a.rate_out)
        + c.cpu_pct_per_kbyte_per_s * (a.thr_in + a.thr_out) / KBYTES
        for name, a in model.bundle_base(bundles).items()
    }


def _initial_owners_under_policies(
    scenario: Scenario, brokers: list[str], cost: Mapping[str, float], rng: random.Random
) -> dict[str, str]:
    """``initial_owners`` when the scenario has placement policies: a heartbeat or SLA-monitor
    bundle on its own broker (a lookup pins it there, so starting elsewhere would be a violation
    no strategy caused), every other bundle only among the brokers its isolation policy and
    anti-affinity group allow (placed largest first, so the group counts see the bundles placed
    before); a bundle no broker may take starts unowned."""
    load = {b: 0.0 for b in brokers}
    limit = {b: scenario.model.brokers[b].cpu_limit_pct for b in brokers}
    owned: dict[str, list[str]] = {b: [] for b in brokers}
    out: dict[str, str] = {}
    order = sorted(cost, key=lambda n: (-cost[n], n))
    for i, bundle in enumerate(order):
        pin = pinned_broker(bundle, brokers)
        if pin is not None:
            allowed = [pin.broker] if pin.broker is not None else []
        else:
            ns = bundle.rsplit("/", 1)[0]
            allowed = namespace_candidates(ns, brokers, scenario.policies, {})
            allowed = filter_anti_affinity_group_owned_brokers(
                allowed, bundle, scenario.policies, owned, domains_enabled=True
            )
        if not allowed:
            continue
        if scenario.initial_assignment == RANDOM:
            best = allowed[rng.randrange(len(allowed))]
        elif scenario.initial_assignment == ROUND_ROBIN:
            best = allowed[i % len(allowed)]
        else:
            best = min(allowed, key=lambda b: ((load[b] + cost[bundle]) / limit[b], b))
        load[best] += cost[bundle]
        owned[best].append(bundle)
        out[bundle] = best
    return out


def initial_owners(scenario: Scenario, rng: random.Random) -> dict[str, str]:
    """Where bundles start, the same for every strategy pair so comparisons are fair.

    ``balanced``: largest bundle first onto the broker with the lowest CPU fraction (a good
    operator's starting point); ``random``: uniformly at random (what a cold cluster's lookups
    look like); ``round_robin``: by count, blind to capacity (a heterogeneous cluster's trap).
    """
    brokers = sorted(scenario.initial_brokers)
    cost: dict[str, float] = {}
    for ns in sorted(scenario.namespaces):
        cost.update(bundle_cpu_pct(scenario.model, scenario.namespaces[ns]))
    names = sorted(cost)
    if not scenario.policies.empty:
        return _initial_owners_under_policies(scenario, brokers, cost, rng)
    if scenario.initial_assignment == RANDOM:
        return {b: brokers[rng.randrange(len(brokers))] for b in names}
    if scenario.initial_assignment == ROUND_ROBIN:
        return {b: brokers[i % len(brokers)] for i, b in enumerate(names)}
    load = {b: 0.0 for b in brokers}
    limit = {b: scenario.model.brokers[b].cpu_limit_pct for b in brokers}
    out: dict[str, str] = {}
    for bundle in sorted(names, key=lambda n: (-cost[n], n)):
        best = min(brokers, key=lambda b: ((load[b] + cost[bundle]) / limit[b], b))
        load[best] += cost[bundle]
        out[bundle] = best
    return out
