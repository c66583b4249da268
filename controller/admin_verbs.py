"""The verbs a Pulsar operator types from habit, with pulsar-admin's flags and meanings.

``lbctl namespaces create|split-bundle|unload``, ``lbctl brokers list [CLUSTER]``,
``lbctl brokers leader-broker`` (the decider and the controllers) and
``lbctl broker-stats load-report``, over the Redis store. ``controller.cli`` registers them (and
the older top-level spellings ``split-bundle`` and ``unload``) and runs them through its
``_run``; this module holds their arguments, their checks and what they do, so the pulsar-admin
surface can be read in one place.

Where pulsar-admin's meaning is kept on purpose (checked against ``CmdNamespaces`` and
``NamespaceService.splitAndOwnBundle``):

* ``--split-boundaries``/``-sb`` are decimal longs (picocli's ``Long.valueOf``), repeated or
  comma separated (JCommander's list form in older releases). A ``0x`` spelling, which
  pulsar-admin refuses, is accepted as hex, so no command Pulsar accepts changes meaning.
* ``split-bundle`` without ``--unload`` leaves the children with the parent's owner (here: each
  child's lease is taken for that broker, fenced, right after the split); with ``-u`` they stay
  free and are placed on their next lookup.
* ``-bt LARGEST|HOT`` picks the bundle to split from the load snapshot: most topics, or the
  highest long-term throughput (in + out) among bundles with topics.
* ``unload NS`` without ``--bundle`` releases every owned bundle of the namespace;
  ``--destinationBroker`` needs ``--bundle`` and loses a leading ``http://``/``https://``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from typing import Any

from controller.events import ASSIGNED, SPLIT, EventPublisher, OwnershipEvent
from controller.reconciler import apply_with_events
from infra import topics
from loadbalance.bundles import NamespaceBundles, parse_bundle
from loadbalance.config import LoadBalancerConfig
from loadbalance.decisions import TRANSFER, UNLOAD, make_decision
from loadbalance.errors import Conflict, InvalidInput, LoadBalancerError
from loadbalance.split_algorithms import (
    ALL_ALGORITHMS,
    SPECIFIED_POSITIONS_DIVIDE,
    split_boundaries,
)
from loadbalance.values import DecisionReason, OutcomeKind
from metadata_store.decider_lease import DeciderLease
from metadata_store.leases import BrokerNotAlive
from metadata_store.load_snapshot import decode_broker_doc
from metadata_store.ownership_redis import RedisStore
from metadata_store.protocol import OwnershipStore

Rows = list[dict[str, Any]]


class PulsarShaped(list):
    """Table rows that print, with ``--json``, as the document pulsar-admin prints for the same
    verb (``pulsar_json``), so scripts written against pulsar-admin parse it unchanged."""

    def __init__(self, rows: list[dict[str, Any]], pulsar_json: Any) -> None:
        super().__init__(rows)
        self.pulsar_json = pulsar_json


BUNDLE_TYPES = ("LARGEST", "HOT")
_URL_SCHEMES = ("http://", "https://")


class UsageError(LoadBalancerError):
    """The command line itself is wrong (exit status 2), found before any change is made."""


class PartialFailure(LoadBalancerError):
    """Some rows failed: print every row, then the message, and exit with status 1."""

    def __init__(self, rows: Rows, message: str) -> None:
        super().__init__(message)
        self.rows = rows


def now_ms() -> int:
    return int(time.time() * 1000)


# -- shared by every Redis verb ------------------------------------------------------------------
def kafka_client_config(config: LoadBalancerConfig, bootstrap: str) -> dict[str, Any]:
    """``bootstrap.servers`` plus the SASL/SSL settings that are set in the configuration,
    through the builder every Kafka client shares (a refused login raises ``KafkaAuthError``)."""
    return topics.kafka_client_config(bootstrap, config.kafka_client_settings())


def publish(
    args: argparse.Namespace, config: LoadBalancerConfig, events: Sequence[OwnershipEvent]
) -> str | None:
    """Deliver a verb's ownership events when Kafka is configured and events are wanted.

    Returns the topic they went to (None when nothing was published). A delivery failure raises
    ``Transient``: the change is already in Redis, and the user must hear that followers
    have not seen it.
    """
    bootstrap = getattr(args, "bootstrap_servers", None) or config.kafka_bootstrap_servers
    if not events or getattr(args, "no_events", False) or not bootstrap:
        return None

    client_config = kafka_client_config(config, bootstrap)
    client_config.pop("bootstrap.servers")
    publisher = EventPublisher(bootstrap, config.ownership_events_topic, client_config)
    publisher.deliver(list(events), attempts=3, backoff_s=0.5)
    return config.ownership_events_topic


def require_namespace(store: OwnershipStore, ns: str) -> NamespaceBundles:
    nb = store.get_namespace(ns)
    if nb is None:
        raise InvalidInput("namespace", f"unknown namespace {ns}")
    return nb


def bundle_name(store: OwnershipStore, ns: str, rng: str) -> str:
    """The canonical name of bundle ``rng`` of ``ns`` as an operator typed it (either hex case,
    as Pulsar's admin tools accept); refused, naming the field, unless it is a current bundle.
    Why canonical: the name is the lease key, so ``0xC0000000`` must reach ``0xc0000000``'s."""

    nb = require_namespace(store, ns)
    name = parse_bundle(f"{ns}/{rng.strip()}").name
    if not nb.contains(name):
        raise InvalidInput("bundle", f"bundle {name} not found in {ns}")
    return name


def add_event_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--bootstrap-servers",
        default=None,
        help="Kafka for ownership events (default: config kafkaBootstrapServers; none: no events)",
    )
    p.add_argument(
        "--no-events",
        action="store_true",
        help="do not publish the ownership change to the ownership-events topic",
    )


# -- namespaces create ---------------------------------------------------------------------------
def add_create_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("namespace", help="tenant/namespace")
    p.add_argument(
        "--bundles",
        "-b",
        type=int,
        default=0,
        metavar="N",
        help="number of bundles (equal hash ranges); 0 or absent: defaultNumberOfNamespaceBundles",
    )
    p.add_argument(
        "--clusters",
        "-c",
        action="append",
        default=[],
        metavar="CLUSTER",
        help="accepted for pulsar-admin's form and echoed; lbctl serves the one cluster whose "
        "Redis it is pointed at, so replication clusters have no effect",
    )


def create(store: OwnershipStore, args: argparse.Namespace, config: LoadBalancerConfig) -> Rows:
    if args.bundles < 0:
        raise UsageError(f"--bundles must be 0 (the default) or more, got {args.bundles}")
    n = args.bundles or config.default_number_of_namespace_bundles
    store.create_namespace(args.namespace, n)
    row: dict[str, Any] = {"namespace": args.namespace, "bundles": n}
    clusters = [c for x in args.clusters for c in x.split(",") if c.strip()]
    if clusters:
        row["ignoredClusters"] = ",".join(clusters)
    return [row]


# -- namespaces split-bundle ---------------------------------------------------------------------
def split_positions(text: str) -> list[int]:
    """``-sb`` values: decimal longs, comma separated; ``0x`` hex as an lbctl extension."""
    out = []
    for part in (x.strip() for x in text.split(",")):
        if not part:
            continue
        try:
            out.append(int(part, 16) if part.lower().startswith("0x") else int(part, 10))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{part!r} is not a decimal long (pulsar-admin's form) or 0x-prefixed hex"
            ) from None
    return out


def add_split_arguments(p: argparse.ArgumentParser, *, unload_by_default: bool = False) -> None:
    p.add_argument("namespace", help="tenant/namespace")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--bundle", "-b", help="{start-boundary}_{end-boundary}, e.g. 0x00000000_0x80000000"
    )
    which.add_argument(
        "--bundle-type",
        "-bt",
        type=str.upper,
        choices=BUNDLE_TYPES,
        help="split the namespace's LARGEST bundle (most topics) or its HOT one (highest "
        "long-term throughput in + out), both from the load snapshot",
    )
    p.add_argument(
        "--unload",
        "-u",
        action="store_true",
        default=unload_by_default,
        help="leave the new bundles free, to be placed on their next lookup"
        + (
            " (always so for this spelling)"
            if unload_by_default
            else "; without it they stay with the parent's owner, as in Pulsar"
        ),
    )
    p.add_argument(
        "--split-algorithm-name",
        "-san",
        default=None,
        choices=ALL_ALGORITHMS,
        help="default: defaultNamespaceBundleSplitAlgorithm; must be one of "
        "supportedNamespaceBundleSplitAlgorithms",
    )
    p.add_argument(
        "--split-boundaries",
        "-sb",
        action="append",
        type=split_positions,
        default=[],
        metavar="POS[,POS...]",
        help="hash positions for specified_positions_divide, as decimal longs like "
        "pulsar-admin (repeat the flag or separate with commas; 0x... is read as hex)",
    )
    add_event_arguments(p)


def pick_bundle(store: RedisStore, ns: str, bundle_type: str) -> str:
    """Pulsar's ``BundleType``: the current bundle with the most topics (LARGEST) or the
    highest long-term throughput among bundles with topics (HOT), from the load snapshot."""

    nb = require_namespace(store, ns)
    docs = store.load_snapshot.read().bundle_docs()
    best, best_value = None, -1.0
    for name in nb.bundle_names:
        doc = docs.get(name)
        if not doc or int(doc.get("topics") or 0) <= 0:
            continue
        long_term = doc.get("longTerm") or {}
        value = (
            float(doc["topics"])
            if bundle_type == "LARGEST"
            else float(long_term.get("msgThroughputIn", 0))
            + float(long_term.get("msgThroughputOut", 0))
        )
        if value > best_value:
            best, best_value = name, value
    if best is None:
        raise InvalidInput(
            "bundleType",
            f"no {bundle_type} bundle in {ns}: no bundle with topics in the load snapshot",
        )
    return best


def split(store: RedisStore, args: argparse.Namespace, config: LoadBalancerConfig) -> Rows:
    algo, positions = _split_algorithm(args, config)
    if args.bundle:
        name = bundle_name(store, args.namespace, args.bundle)
    else:
        name = pick_bundle(store, args.namespace, args.bundle_type)
    points = _split_points(algo, name, positions)
    now = now_ms()
    before = store.owner(name, now)
    nb = store.split_bundle(name, points)
    children = nb.children_of_split(name, points)
    events: list[OwnershipEvent] = [
        OwnershipEvent(
            SPLIT,
            name,
            now,
            old_owner=before.broker if before else None,
            old_token=before.token if before else None,
            children=tuple(children),
            reason=DecisionReason.ADMIN,
        )
    ]
    owners: dict[str, str | None] = dict.fromkeys(children)
    if before is not None and not args.unload:
        ttl_ms = int(config.load_balancer_ownership_lease_ttl_seconds * 1000)
        events += _keep_children(store, name, children, before.broker, now, ttl_ms, owners)
    publish(args, config, events)
    return [
        {"bundle": c, "owner": owners[c], "version": nb.version, "algorithm": algo}
        for c in children
    ]


def _split_algorithm(args: argparse.Namespace, config: LoadBalancerConfig) -> tuple[str, list[int]]:
    """The split algorithm and its positions, refused unless they go together and the
    configuration supports the algorithm."""
    algo = args.split_algorithm_name or config.default_namespace_bundle_split_algorithm
    positions = sorted({p for group in args.split_boundaries for p in group})
    if positions and algo != SPECIFIED_POSITIONS_DIVIDE:
        raise UsageError(
            f"--split-boundaries only works with -san {SPECIFIED_POSITIONS_DIVIDE} "
            f"(the algorithm is {algo})"
        )
    if algo == SPECIFIED_POSITIONS_DIVIDE and not positions:
        raise UsageError(f"-san {SPECIFIED_POSITIONS_DIVIDE} needs --split-boundaries")
    if algo not in config.supported_namespace_bundle_split_algorithms:
        supported = ", ".join(config.supported_namespace_bundle_split_algorithms)
        raise InvalidInput(
            "splitAlgorithmName",
            f"unsupported split algorithm {algo}; "
            f"supportedNamespaceBundleSplitAlgorithms: {supported}",
        )
    return algo, positions


def _split_points(algo: str, name: str, positions: list[int]) -> list[int]:
    """The boundaries ``algo`` gives for bundle ``name``; ``InvalidInput`` saying why if none."""
    rng = parse_bundle(name)
    points = split_boundaries(algo, rng, positions=positions, topic_hashes=())
    if not points:
        why = {
            SPECIFIED_POSITIONS_DIVIDE: f"no position lies strictly inside 0x{rng.lower:08x}.."
            f"0x{rng.upper:08x} (decimal {rng.lower}..{rng.upper})",
            "range_equally_divide": "the range is too narrow to split",
        }.get(algo, "it needs the bundle's topics, which lbctl does not know")
        raise InvalidInput("splitBoundaries", f"{algo} gives no boundary for {name}: {why}")
    return points


def _keep_children(
    store: RedisStore,
    parent: str,
    children: Sequence[str],
    broker: str,
    now: int,
    ttl_ms: int,
    owners: dict[str, str | None],
) -> list[OwnershipEvent]:
    """Lease the split's children to the parent's owner, as Pulsar does without ``-u``; fill
    ``owners`` and return the ``assigned`` events. A child placed meanwhile, or an owner that
    is gone, is left as it is."""
    events = []
    for child in children:
        try:
            lease = store.acquire(child, broker, now, ttl_ms)
        except (Conflict, BrokerNotAlive):  # placed meanwhile, or the owner is gone
            continue
        owners[child] = lease.broker
        events.append(
            OwnershipEvent(
                ASSIGNED,
                child,
                now,
                new_owner=lease.broker,
                new_token=lease.token,
                reason=f"split of {parent}",
            )
        )
    return events


# -- namespaces unload ---------------------------------------------------------------------------
def add_unload_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("namespace", help="tenant/namespace")
    p.add_argument(
        "--bundle",
        "-b",
        default=None,
        help="{start-boundary}_{end-boundary}; absent: every owned bundle of the namespace",
    )
    p.add_argument(
        "--destinationBroker",
        "--destination-broker",
        "-d",
        dest="destination_broker",
        default=None,
        metavar="BROKER",
        help="move the bundle to this live broker instead of releasing it (needs --bundle; a "
        "leading http:// or https:// is dropped, as Pulsar does)",
    )
    add_event_arguments(p)


def unload(store: RedisStore, args: argparse.Namespace, config: LoadBalancerConfig) -> Rows:
    dest = args.destination_broker
    for scheme in _URL_SCHEMES:
        if dest and dest.startswith(scheme):
            dest = dest[len(scheme) :]
    if dest is not None and args.bundle is None:
        raise UsageError("--destinationBroker cannot be set when --bundle is not specified")
    if args.bundle is not None:
        names = [bundle_name(store, args.namespace, args.bundle)]
    else:
        names = require_namespace(store, args.namespace).bundle_names
    now = now_ms()
    if dest is not None and dest not in store.live_brokers(now):
        raise InvalidInput("destinationBroker", f"broker unknown or not live: {dest}")
    ttl_ms = int(config.load_balancer_ownership_lease_ttl_seconds * 1000)
    rows: Rows = []
    events: list[OwnershipEvent] = []
    for name in names:
        lease = store.owner(name, now)
        d = make_decision(
            cycle=f"admin-{now}",
            kind=TRANSFER if dest else UNLOAD,
            bundle=name,
            source_broker=lease.broker if lease else None,
            destination_broker=dest,
            reason=DecisionReason.ADMIN,
            strategy="lbctl",
            decided_at_ms=now,
        )
        out, evs = apply_with_events(store, d, now_ms=now, lease_ttl_ms=ttl_ms)
        events.extend(evs)
        rows.append(
            {
                "bundle": name,
                "owner": lease.broker if lease else None,
                "outcome": out.outcome,
                "reason": out.reason,
                "decision": d.id,
            }
        )
    publish(args, config, events)
    failed = [r for r in rows if r["outcome"] in (OutcomeKind.REJECTED, OutcomeKind.CONFLICT)]
    if failed:
        if len(rows) == 1:
            raise InvalidInput("unload", failed[0]["reason"])
        raise PartialFailure(
            rows,
            f"{len(failed)} of {len(rows)} bundles not unloaded: "
            + "; ".join(f"{r['bundle']}: {r['reason']}" for r in failed),
        )
    return rows


# -- brokers list, broker-stats load-report ------------------------------------------------------
def add_brokers_list_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "cluster",
        nargs="?",
        default=None,
        help="accepted for pulsar-admin's form; lbctl serves the one cluster whose Redis it is "
        "pointed at, so every live broker is listed whatever the name",
    )


def brokers_list(
    store: OwnershipStore, args: argparse.Namespace, config: LoadBalancerConfig
) -> Rows:
    brokers = store.live_brokers(now_ms())
    # pulsar-admin brokers list: a JSON array of "host:port" strings
    return PulsarShaped([{"broker": b} for b in brokers], list(brokers))


def add_load_report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--broker",
        "-b",
        default=None,
        help="the broker id (as in 'brokers list'); may be left out when one broker reports "
        "(pulsar-admin asks the broker it is connected to)",
    )


def stored_report(store: RedisStore, broker: str | None) -> tuple[str, dict[str, Any]]:
    """The broker's last report as the streaming job stored it, with its ``lastStats`` put
    back from the bundle state (the last sample of each reported bundle this broker sent)."""

    snapshot = store.load_snapshot.read()
    raw = snapshot.brokers_raw
    if broker is None:
        if not raw:
            raise InvalidInput("broker", "no broker has a load report in the snapshot")
        if len(raw) > 1:
            raise UsageError(
                f"{len(raw)} brokers report ({', '.join(sorted(raw))}): pass -b BROKER"
            )
        [broker] = raw
    if broker not in raw:
        raise InvalidInput("broker", f"broker unknown or without a load report: {broker}")
    report = dict(decode_broker_doc(raw[broker]).get("report") or {})
    docs = snapshot.bundle_docs()
    stats = {
        b: docs[b]["lastStats"]
        for b in sorted(report.get("bundles") or ())
        if b in docs and docs[b].get("broker") == broker
    }
    out: dict[str, Any] = {}
    for key, value in report.items():
        out[key] = value
        if key == "bundles":
            out["lastStats"] = stats
    out.setdefault("lastStats", stats)
    return broker, out


def load_report(store: RedisStore, args: argparse.Namespace, config: LoadBalancerConfig) -> None:
    _, report = stored_report(store, args.broker)
    print(json.dumps(report, indent=2))


# -- brokers leader-broker -----------------------------------------------------------------------
CONTROLLER_STALE_AFTER_MS = 10_000
"""A controller beats every second (``controller.heartbeat``); silent this long, it is stale."""


def leader_broker(store: RedisStore, args: argparse.Namespace, config: LoadBalancerConfig) -> Rows:
    """pulsar-admin ``brokers leader-broker``: who decides. Pulsar's leader broker runs the load
    manager; here the streaming job holding the decider lease does
    (``metadata_store.decider_lease``), and the controllers apply what it decides. With
    ``--json``, Pulsar's ``{"serviceUrl", "brokerId"}`` (the holder's metrics URL when the
    process registry has one, and its id) extended with ``decider`` (host, term, expiry, the
    last batch that renewed it) and ``controllers`` (the registry's running ones)."""
    info = DeciderLease.of(store).read()  # type: ignore[union-attr]
    wall = now_ms()
    entries = store.processes.entries()
    controllers = [_controller_doc(e.id, e.doc, e.beat_ms, wall) for e in entries
                   if e.role == "control" and not e.stopped]  # fmt: skip
    decider = None if info is None else _decider_doc(info)
    url = None
    if info is not None:
        pid = f"{info.host}:{info.pid}"
        url = next((e.doc.get("metricsUrl") for e in entries
                    if e.role == "stream" and e.id == pid), None)  # fmt: skip
    doc = {"serviceUrl": url, "brokerId": None if info is None else info.holder,
           "decider": decider, "controllers": controllers}  # fmt: skip
    rows = [_leader_row("decider", decider)] + [_leader_row("controller", c) for c in controllers]
    return PulsarShaped(rows, doc)


def _decider_doc(info: Any) -> dict[str, Any]:
    return {
        "holder": info.holder, "host": info.host, "pid": info.pid, "term": info.term,
        "live": info.live, "expiresAtMs": info.expires_ms, "acquiredAtMs": info.acquired_at_ms,
        "renewedAtMs": info.renewed_at_ms, "lastBatch": info.last_batch,
        "lastBatchAtMs": info.last_batch_at_ms, "newestTerm": info.newest_term,
    }  # fmt: skip


def _controller_doc(pid: str, doc: Any, beat_ms: int | None, wall_ms: int) -> dict[str, Any]:
    live = beat_ms is not None and wall_ms - beat_ms <= CONTROLLER_STALE_AFTER_MS
    return {"id": pid, "host": doc.get("host"), "pid": doc.get("pid"), "group": doc.get("group"),
            "beatAtMs": beat_ms, "live": live}  # fmt: skip


def _leader_row(role: str, doc: dict[str, Any] | None) -> dict[str, Any]:
    """One table row per process: the decider's term and last batch, a controller's beat."""
    if doc is None:
        return {"role": role, "id": None, "host": None, "term": None, "state": "none",
                "lastBatch": None, "lastAtMs": None}  # fmt: skip
    if role == "decider":
        state = "live" if doc["live"] else "expired"
        return {"role": role, "id": doc["holder"], "host": doc["host"], "term": doc["term"],
                "state": state, "lastBatch": doc["lastBatch"],
                "lastAtMs": doc["lastBatchAtMs"]}  # fmt: skip
    return {"role": role, "id": doc["id"], "host": doc["host"], "term": None,
            "state": "live" if doc["live"] else "stale", "lastBatch": None,
            "lastAtMs": doc["beatAtMs"]}  # fmt: skip
