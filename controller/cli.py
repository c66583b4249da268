"""pulsar-admin-like verbs over the Redis store: namespaces, bundles, lookups, owners, brokers.

Every verb prints a table, or JSON with ``--json``; errors name what is wrong (unknown
namespace, bundle not found, broker unknown) and exit with status 1 (2 for bad usage). The
Redis URL comes from ``--redis-url``, else the configuration's ``redisUrl``
(``LB_redisUrl``, ``--set redisUrl=...`` or a broker.conf).

Verbs that change ownership (``lookup`` when it assigns, ``unload``, ``split-bundle``) publish
the change to the ownership-events topic when Kafka is configured (``--bootstrap-servers`` or
``kafkaBootstrapServers``), as the control loop does, so followers miss no change made by hand;
``--no-events`` turns that off. ``control --metrics-port`` serves Prometheus metrics;
``control`` rebuilds a Redis that lost its data by itself unless ``--no-auto-recover``
(``controller.recovery.AutoRecovery``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from lbctl import metrics
from lbctl.config_cmd import add_config_arguments, load_from_args
from loadbalance.config import ConfigError, redact_url
from loadbalance.decisions import TRANSFER, UNLOAD, make_decision
from loadbalance.errors import Conflict, InvalidInput, Transient
from loadbalance.split_algorithms import ALL_ALGORITHMS, split_boundaries

if TYPE_CHECKING:  # the Redis client is imported only by the verbs that run
    from controller.events import OwnershipEvent
    from controller.redis_store import RedisStore
    from controller.store import Lease, OwnershipStore
    from loadbalance.bundles import NamespaceBundles
    from loadbalance.config import LoadBalancerConfig


def _now_ms() -> int:
    return int(time.time() * 1000)


def register(subparsers: argparse._SubParsersAction) -> None:
    def verb(name: str, help_text: str, func: Any, parent: Any = subparsers) -> Any:
        p = parent.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--redis-url", default=None, help="Redis URL (default: config redisUrl)")
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
        add_config_arguments(p)
        p.set_defaults(func=lambda a: _run(func, a))
        return p

    ns = subparsers.add_parser("namespaces", help="create and inspect namespaces and bundles")
    ns_sub = ns.add_subparsers(dest="ns_command", metavar="VERB")
    p = verb("create", "create a namespace with N bundles", _ns_create, ns_sub)
    p.add_argument("namespace", help="tenant/namespace")
    p.add_argument("--bundles", type=int, default=None, help="defaultNumberOfNamespaceBundles")
    verb("list", "list namespaces", _ns_list, ns_sub)
    p = verb("bundles", "a namespace's boundaries and bundles", _ns_bundles, ns_sub)
    p.add_argument("namespace")
    ns.set_defaults(func=lambda _a: (ns.print_help(), 2)[1])

    p = verb("lookup", "the bundle and owner serving a topic (assigns a free bundle)", _lookup)
    p.add_argument("topic", help="persistent://tenant/ns/topic or a short name")
    p.add_argument("--no-assign", action="store_true", help="do not assign a free bundle")
    _add_event_arguments(p)
    p = verb("owners", "owners of every bundle of a namespace", _owners)
    p.add_argument("namespace")
    p = verb("split-bundle", "split a bundle now (pulsar-admin namespaces split-bundle)", _split)
    p.add_argument("namespace")
    p.add_argument("--bundle", "-b", required=True, help="0xLLLLLLLL_0xUUUUUUUU")
    p.add_argument(
        "--split-algorithm-name", "-san", default="range_equally_divide", choices=ALL_ALGORITHMS
    )
    p.add_argument("--split-boundaries", "-sb", default="", help="comma list of hex positions")
    _add_event_arguments(p)
    p = verb("unload", "unload a bundle, or move it with --destination-broker", _unload)
    p.add_argument("namespace")
    p.add_argument("--bundle", "-b", required=True, help="0xLLLLLLLL_0xUUUUUUUU")
    p.add_argument("--destination-broker", "-d", default=None)
    _add_event_arguments(p)
    ctl = subparsers.add_parser(
        "control",
        help="consume the decisions topic and apply each decision to Redis",
        description="The controller loop: offsets are committed only after a decision's "
        "outcome is recorded; decisions are de-duplicated by id; bad records get a rejected "
        "outcome; applied changes go to the ownership-events topic.",
    )
    ctl.add_argument("--redis-url", default=None, help="Redis URL (default: config redisUrl)")
    ctl.add_argument("--bootstrap-servers", default=None, help="Kafka (default: config)")
    ctl.add_argument("--group", default="lb-controller", help="consumer group id")
    ctl.add_argument("--max-messages", type=int, default=None, help="stop after N records")
    ctl.add_argument("--dry-run", action="store_true", help="record what would be done only")
    ctl.add_argument(
        "--sweep-interval-s",
        type=float,
        default=5.0,
        help="seconds between sweeps of expired leases (default 5)",
    )
    rec = ctl.add_argument_group(
        "recovery of a lost Redis",
        "By default the loop checks for a data loss (Redis restarted without persistence: the "
        "epoch key P:epoch gone or changed, or brokers reporting bundles of unknown namespaces) "
        "at start, on every sweep and before every decision. On a loss it holds decisions and "
        "sweeps, waits for the brokers to re-register and report, rebuilds namespaces and leases "
        "above the largest token on the ownership-events topic, logs a summary and keeps the "
        "report at P:recovery:last.",
    )
    rec.add_argument(
        "--no-auto-recover",
        action="store_true",
        help="do not detect or recover a data loss; leave it to the operator "
        "(python -m controller.recovery); implied by --dry-run",
    )
    rec.add_argument(
        "--recovery-wait-s",
        type=float,
        default=None,
        metavar="S",
        help="seconds to wait after detecting a loss before rebuilding (default: one report "
        "check interval, loadBalancerReportUpdateMinIntervalMillis)",
    )
    rec.add_argument(
        "--recovery-max-wait-s",
        type=float,
        default=60.0,
        metavar="S",
        help="while no live broker reports a bundle, keep waiting up to this long after the "
        "detection, then rebuild with what there is (default 60)",
    )
    rec.add_argument(
        "--known-namespace",
        action="append",
        default=[],
        metavar="NS=N",
        help="a namespace to re-create with N bundles if no broker reports it (repeatable)",
    )
    metrics.add_metrics_argument(ctl)
    add_config_arguments(ctl)
    ctl.set_defaults(func=_control)
    dec = subparsers.add_parser("decisions", help="decision outcomes recorded by the controller")
    d_sub = dec.add_subparsers(dest="decisions_command", metavar="VERB")
    p = verb("tail", "the latest decision outcomes", _decisions_tail, d_sub)
    p.add_argument("-n", type=int, default=20, help="how many (default 20)")
    dec.set_defaults(func=lambda _a: (dec.print_help(), 2)[1])
    broker = subparsers.add_parser("broker", help="one broker's load as the streaming job sees it")
    br_sub = broker.add_subparsers(dest="broker_command", metavar="VERB")
    p = verb("load-report", "the broker's last averaged load report", _broker_load, br_sub)
    p.add_argument("broker")
    broker.set_defaults(func=lambda _a: (broker.print_help(), 2)[1])
    brokers = subparsers.add_parser("brokers", help="registered brokers")
    b_sub = brokers.add_subparsers(dest="brokers_command", metavar="VERB")
    verb("list", "live brokers", _brokers_list, b_sub)
    brokers.set_defaults(func=lambda _a: (brokers.print_help(), 2)[1])


def _add_event_arguments(p: argparse.ArgumentParser) -> None:
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


def _kafka_client_config(config: LoadBalancerConfig, bootstrap: str) -> dict[str, Any]:
    """``bootstrap.servers`` plus the SASL/SSL settings that are set in the configuration."""
    return {"bootstrap.servers": bootstrap, **config.kafka_client_settings()}


def _publish(
    args: argparse.Namespace, config: LoadBalancerConfig, events: list[OwnershipEvent]
) -> str | None:
    """Deliver a verb's ownership events when Kafka is configured and events are wanted.

    Returns the topic they went to (None when nothing was published). A delivery failure raises
    ``Transient``: the change is already in Redis, and the user must hear that followers
    have not seen it.
    """
    bootstrap = getattr(args, "bootstrap_servers", None) or config.kafka_bootstrap_servers
    if not events or getattr(args, "no_events", False) or not bootstrap:
        return None
    from controller.events import EventPublisher

    client_config = _kafka_client_config(config, bootstrap)
    client_config.pop("bootstrap.servers")
    publisher = EventPublisher(bootstrap, config.ownership_events_topic, client_config)
    publisher.deliver(events, attempts=3, backoff_s=0.5)
    return config.ownership_events_topic


def _run(func: Any, args: argparse.Namespace) -> int:
    import redis

    from controller.redis_store import RedisStore

    url = ""
    try:
        config = load_from_args(args)
        url = args.redis_url or config.redis_url
        if not url:
            print("lbctl: no Redis: pass --redis-url or set redisUrl", file=sys.stderr)
            return 2
        store = RedisStore.from_url(
            url, prefix=config.redis_key_prefix, **config.redis_client_kwargs()
        )
        rows = func(store, args, config)
    except ConfigError as e:
        print(f"lbctl: {e}", file=sys.stderr)
        return 2
    except (InvalidInput, Conflict) as e:
        print(f"lbctl: {e}", file=sys.stderr)
        return 1
    except Transient as e:
        print(f"lbctl: the change is made, but followers were not told: {e}", file=sys.stderr)
        return 1
    except redis.AuthenticationError:
        print(f"lbctl: Redis at {redact_url(url)} refused the credentials", file=sys.stderr)
        return 1
    except redis.ConnectionError as e:
        print(f"lbctl: Redis at {redact_url(url)} unreachable: {e}", file=sys.stderr)
        return 1
    _print(rows, args.json)
    return 0


def _print(rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        print(json.dumps(rows, indent=2, sort_keys=True))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table()
    for col in rows[0] if rows else ["(none)"]:
        table.add_column(col)
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    Console(width=160).print(table)


def _ns_create(
    store: OwnershipStore, args: argparse.Namespace, config: LoadBalancerConfig
) -> list[dict[str, Any]]:
    n = args.bundles or config.default_number_of_namespace_bundles
    store.create_namespace(args.namespace, n)
    return [{"namespace": args.namespace, "bundles": n}]


def _ns_list(
    store: OwnershipStore, args: argparse.Namespace, config: LoadBalancerConfig
) -> list[dict[str, Any]]:
    return [{"namespace": ns} for ns in store.list_namespaces()]


def _require(store: OwnershipStore, ns: str) -> NamespaceBundles:
    nb = store.get_namespace(ns)
    if nb is None:
        raise InvalidInput("namespace", f"unknown namespace {ns}")
    return nb


def _ns_bundles(
    store: OwnershipStore, args: argparse.Namespace, config: LoadBalancerConfig
) -> list[dict[str, Any]]:
    nb = _require(store, args.namespace)
    return [
        {"bundle": r.name, "lower": f"0x{r.lower:08x}", "upper": f"0x{r.upper:08x}",
         "version": nb.version}
        for r in nb.bundles
    ]  # fmt: skip


def _lease_row(bundle: str, lease: Lease | None) -> dict[str, Any]:
    return {
        "bundle": bundle,
        "owner": lease.broker if lease else None,
        "token": lease.token if lease else None,
        "expiresAtMs": lease.expires_at_ms if lease else None,
    }


def _lookup(
    store: RedisStore, args: argparse.Namespace, config: LoadBalancerConfig
) -> list[dict[str, Any]]:
    from controller.placement import lookup_assign_event

    event = None
    if args.no_assign:
        bundle, lease = store.lookup(args.topic, _now_ms())
    else:
        bundle, lease, event = lookup_assign_event(store, args.topic, config, _now_ms())
    _publish(args, config, [event] if event else [])
    return [{"topic": args.topic, **_lease_row(bundle, lease), "assigned": event is not None}]


def _owners(
    store: OwnershipStore, args: argparse.Namespace, config: LoadBalancerConfig
) -> list[dict[str, Any]]:
    nb = _require(store, args.namespace)
    owners = store.owners(args.namespace, _now_ms())
    return [_lease_row(b, owners.get(b)) for b in nb.bundle_names]


def _bundle_name(store: OwnershipStore, ns: str, rng: str) -> str:
    """The canonical name of bundle ``rng`` of ``ns`` as an operator typed it (either hex case,
    as Pulsar's admin tools accept); refused, naming the field, unless it is a current bundle."""
    from loadbalance.bundles import parse_bundle

    nb = _require(store, ns)
    name = parse_bundle(f"{ns}/{rng.strip()}").name
    if not nb.contains(name):
        raise InvalidInput("bundle", f"bundle {name} not found in {ns}")
    return name


def _split(
    store: OwnershipStore, args: argparse.Namespace, config: LoadBalancerConfig
) -> list[dict[str, Any]]:
    from loadbalance.bundles import parse_bundle

    name = _bundle_name(store, args.namespace, args.bundle)
    positions = [int(x, 16) for x in args.split_boundaries.split(",") if x.strip()]
    points = split_boundaries(
        args.split_algorithm_name, parse_bundle(name), positions=positions, topic_hashes=()
    )
    if not points:
        raise InvalidInput("splitBoundaries", f"{args.split_algorithm_name} gives no boundary")
    from controller.events import SPLIT, OwnershipEvent

    now = _now_ms()
    before = store.owner(name, now)
    nb = store.split_bundle(name, points)
    children = nb.children_of_split(name, points)
    event = OwnershipEvent(
        SPLIT,
        name,
        now,
        old_owner=before.broker if before else None,
        old_token=before.token if before else None,
        children=tuple(children),
        reason="Admin",
    )
    _publish(args, config, [event])
    return [{"bundle": b, "version": nb.version} for b in children]


def _unload(
    store: RedisStore, args: argparse.Namespace, config: LoadBalancerConfig
) -> list[dict[str, Any]]:
    from controller.loop import apply_with_events

    name = _bundle_name(store, args.namespace, args.bundle)
    now = _now_ms()
    lease = store.owner(name, now)
    dest = args.destination_broker
    if dest is not None and dest not in store.live_brokers(now):
        raise InvalidInput("destinationBroker", f"broker unknown or not live: {dest}")
    d = make_decision(
        cycle=f"admin-{now}",
        kind=TRANSFER if dest else UNLOAD,
        bundle=name,
        source_broker=lease.broker if lease else None,
        destination_broker=dest,
        reason="Admin",
        strategy="lbctl",
        decided_at_ms=now,
    )
    ttl_ms = int(config.load_balancer_ownership_lease_ttl_seconds * 1000)
    out, events = apply_with_events(store, d, now_ms=now, lease_ttl_ms=ttl_ms)
    if out.outcome == "rejected":
        raise InvalidInput("unload", out.reason)
    _publish(args, config, events)
    return [{"bundle": name, "outcome": out.outcome, "reason": out.reason, "decision": d.id}]


def _brokers_list(
    store: OwnershipStore, args: argparse.Namespace, config: LoadBalancerConfig
) -> list[dict[str, Any]]:
    return [{"broker": b} for b in store.live_brokers(_now_ms())]


def _control(args: argparse.Namespace) -> int:
    from controller.loop import run_loop
    from controller.recovery import AutoRecovery
    from controller.redis_store import RedisStore
    from infra.topics import ensure_topics

    try:
        config = load_from_args(args)
        known = {k: int(v) for k, _, v in (x.partition("=") for x in args.known_namespace)}
    except (ConfigError, ValueError) as e:
        print(f"lbctl control: {e}", file=sys.stderr)
        return 2
    url = args.redis_url or config.redis_url
    bootstrap = args.bootstrap_servers or config.kafka_bootstrap_servers
    if not url or not bootstrap:
        print("lbctl control: needs --redis-url and --bootstrap-servers", file=sys.stderr)
        return 2
    client_config = _kafka_client_config(config, bootstrap)
    # Subscribing to a topic that does not exist yet leaves the group without partitions until
    # the next metadata refresh, so decisions published meanwhile wait; create both topics first
    # (creating an existing topic is not an error).
    security = {k: v for k, v in client_config.items() if k != "bootstrap.servers"}
    topics = (config.decisions_topic, config.ownership_events_topic)
    ensure_topics(bootstrap, dict.fromkeys(topics, config.topic_partitions), security)
    metrics_port = metrics.serve_from_args(args)
    store = RedisStore.from_url(url, prefix=config.redis_key_prefix, **config.redis_client_kwargs())
    lease_ttl_ms = int(config.load_balancer_ownership_lease_ttl_seconds * 1000)
    recovery = None
    if not args.no_auto_recover and not args.dry_run:
        wait_s = args.recovery_wait_s
        if wait_s is None:
            wait_s = config.load_balancer_report_update_min_interval_millis / 1000
        recovery = AutoRecovery(
            store,
            bootstrap,
            config.ownership_events_topic,
            lease_ttl_ms,
            client_config=security,
            wait_s=wait_s,
            max_wait_s=args.recovery_max_wait_s,
            known_namespaces=known,
        )
    try:
        stats = run_loop(
            store,
            client_config=client_config,
            decisions_topic=config.decisions_topic,
            events_topic=config.ownership_events_topic,
            group_id=args.group,
            lease_ttl_ms=lease_ttl_ms,
            max_messages=args.max_messages,
            dry_run=args.dry_run,
            max_decision_bytes=config.max_decision_bytes,
            config=config,
            sweep_interval_s=args.sweep_interval_s,
            recovery=recovery,
        )
    except Transient as e:  # stopped while Kafka refused events: the replay will send them
        print(f"lbctl control: stopped with undelivered events: {e}", file=sys.stderr)
        return 1
    print(json.dumps({**stats.__dict__, "metricsPort": metrics_port}))
    return 0


def _decisions_tail(
    store: RedisStore, args: argparse.Namespace, config: LoadBalancerConfig
) -> list[dict[str, Any]]:
    entries = store.r.xrevrange(f"{store.p}:outcome-stream", count=max(1, args.n))
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]


def _broker_load(
    store: RedisStore, args: argparse.Namespace, config: LoadBalancerConfig
) -> list[dict[str, Any]]:
    raw = store.r.hget(f"{store.p}:load:brokers", args.broker)
    if raw is None:
        raise InvalidInput("broker", f"broker unknown or without a load report: {args.broker}")
    doc = json.loads(raw)
    if args.json:
        return [doc]
    r = doc.get("report", {})
    row = {"broker": args.broker, "historyUsage": doc.get("historyUsage")}
    for k in ("cpu", "memory", "bandwidthIn", "bandwidthOut"):
        u = r.get(k) or {}
        row[f"{k} %"] = round(100 * u["usage"] / u["limit"], 1) if u.get("limit") else None
    for k in ("msgRateIn", "msgRateOut", "numBundles", "numTopics"):
        row[k] = r.get(k)
    return [row]
