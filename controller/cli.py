"""pulsar-admin-like verbs over the Redis store: namespaces, bundles, lookups, owners, brokers.

Every verb prints a table, or JSON with ``--json``; errors name what is wrong (unknown
namespace, bundle not found, broker unknown) and exit with status 1 (2 for bad usage). The
Redis URL comes from ``--redis-url``, else the configuration's ``redisUrl``
(``LB_redisUrl``, ``--set redisUrl=...`` or a broker.conf).

The pulsar-admin spellings (``namespaces create|bundles|split-bundle|unload``, ``brokers list
[CLUSTER]``, ``broker-stats load-report``) take pulsar-admin's flags and meanings
(``controller.admin_verbs``); the older top-level ``split-bundle`` and ``unload`` stay as
aliases (``split-bundle`` always leaves the new bundles free, as ``-u`` does).

Verbs that change ownership (``lookup`` when it assigns, ``unload``, ``split-bundle``) publish
the change to the ownership-events topic when Kafka is configured (``--bootstrap-servers`` or
``kafkaBootstrapServers``), as the control loop does, so followers miss no change made by hand;
``--no-events`` turns that off. ``control --metrics-port`` serves Prometheus metrics;
``control`` rebuilds a Redis that lost its data by itself unless ``--no-auto-recover``
(``controller.recovery.AutoRecovery``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import sys
from typing import Any

import redis
from rich.console import Console
from rich.table import Table

from controller import admin_verbs as av
from controller import policy_verbs
from controller.loop import run_loop
from controller.placement import base_view, lookup_assign_event
from controller.recovery import AutoRecovery
from infra import metrics
from infra.config_loading import add_config_arguments, load_from_args
from infra.redis_client import connect
from infra.topics import ensure_topics
from loadbalance.config import ConfigError, LoadBalancerConfig, redact_url
from loadbalance.errors import Conflict, InvalidInput, Transient
from loadbalance.placement.pipeline import BrokerSelector
from metadata_store.leases import Lease
from metadata_store.load_snapshot import decode_broker_doc
from metadata_store.ownership_redis import RedisStore
from metadata_store.protocol import OwnershipStore

_now_ms = av.now_ms
_require = av.require_namespace
_bundle_name = av.bundle_name  # canonical spelling: an upper-case hex range reaches the same lease
_publish = av.publish
_kafka_client_config = av.kafka_client_config
_add_event_arguments = av.add_event_arguments


def _verb(parent: Any, name: str, help_text: str, func: Any, *, checks_usage: bool = False) -> Any:
    """A store verb: ``--redis-url``, ``--json`` and the configuration flags, run by ``_run``.

    ``checks_usage``: the verb refuses some argument combinations itself (``UsageError``)
    before it touches the store; ``lbctl.main`` then runs that part first (``check_usage``),
    so a usage error is exit 2 whether or not Redis and Kafka answer."""
    p = parent.add_parser(name, help=help_text, description=help_text)
    p.add_argument("--redis-url", default=None, help="Redis URL (default: config redisUrl)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_config_arguments(p)
    p.set_defaults(func=lambda a: _run(func, a))
    if checks_usage:
        p.set_defaults(check_usage=lambda a: _check_usage(func, a))
    return p


class _StoreNeeded(BaseException):
    """Raised by ``_NoStore`` at a verb's first use of the store: its own argument checks
    passed. A ``BaseException``, so no ``except Exception`` in a verb swallows it."""


class _NoStore:
    """A store that stops the verb at its first use (``_check_usage``'s dry run)."""

    def __getattr__(self, name: str) -> Any:
        raise _StoreNeeded(name)


def _check_usage(func: Any, args: argparse.Namespace) -> int | None:
    """Run ``func`` up to its first use of the store: 2 after printing a usage or
    configuration error, None when the arguments pass (the real run follows)."""
    try:
        func(_NoStore(), args, load_from_args(args, quiet=True))
    except _StoreNeeded:
        return None
    except (ConfigError, av.UsageError) as e:
        print(f"lbctl: {e}", file=sys.stderr)
        return 2
    except Exception:  # anything else is the real run's to report, with the store at hand
        return None
    return None


def _group(subparsers: Any, name: str, help_text: str, dest: str) -> tuple[Any, Any]:
    """A verb group (``namespaces``, ``brokers``, ...) that prints its help when called bare."""
    group = subparsers.add_parser(name, help=help_text)
    group.set_defaults(func=lambda _a: (group.print_help(), 2)[1])
    return group, group.add_subparsers(dest=dest, metavar="VERB")


def register(subparsers: argparse._SubParsersAction) -> None:
    _register_namespaces(subparsers)
    _register_ownership(subparsers)
    _register_control(subparsers)
    _register_reports(subparsers)
    policy_verbs.register(subparsers, _verb, _group)


def _register_namespaces(subparsers: Any) -> None:
    _, ns_sub = _group(
        subparsers,
        "namespaces",
        "create and inspect namespaces, split and unload bundles (pulsar-admin namespaces)",
        "ns_command",
    )
    p = _verb(
        ns_sub,
        "create",
        "create a namespace with N bundles (equal hash ranges)",
        av.create,
        checks_usage=True,
    )
    av.add_create_arguments(p)
    _verb(ns_sub, "list", "list namespaces", _ns_list)
    p = _verb(ns_sub, "bundles", "a namespace's boundaries and bundles", _ns_bundles)
    p.add_argument("namespace", help="tenant/namespace")
    split_help = (
        "split a bundle now (compare-and-set on the namespace version); without -u the new "
        "bundles stay with the parent's owner, as in Pulsar"
    )
    p = _verb(ns_sub, "split-bundle", split_help, av.split, checks_usage=True)
    av.add_split_arguments(p)
    unload_help = (
        "release a bundle, or every owned bundle of the namespace when --bundle is absent, or "
        "move one bundle with --destinationBroker; through the idempotent applier, one row "
        "(and one recorded outcome) per bundle"
    )
    p = _verb(ns_sub, "unload", unload_help, av.unload, checks_usage=True)
    av.add_unload_arguments(p)
    policy_verbs.register_namespace_verbs(ns_sub, _verb)


def _register_ownership(subparsers: Any) -> None:
    """``lookup``, ``owners`` and the older top-level ``split-bundle`` and ``unload``."""
    p = _verb(
        subparsers, "lookup", "the bundle and owner serving a topic (assigns a free bundle)",
        _lookup,
    )  # fmt: skip
    p.add_argument("topic", help="persistent://tenant/ns/topic or a short name")
    p.add_argument("--no-assign", action="store_true", help="do not assign a free bundle")
    _add_event_arguments(p)
    p = _verb(subparsers, "owners", "owners of every bundle of a namespace", _owners)
    p.add_argument("namespace")
    p = _verb(
        subparsers,
        "split-bundle",
        "the older spelling of 'namespaces split-bundle'; the new bundles are always left free "
        "(as with -u), to be placed on their next lookup",
        av.split,
        checks_usage=True,
    )
    av.add_split_arguments(p, unload_by_default=True)
    p = _verb(
        subparsers,
        "unload",
        "the older spelling of 'namespaces unload'",
        av.unload,
        checks_usage=True,
    )
    av.add_unload_arguments(p)


def _register_control(subparsers: Any) -> None:
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
    _add_recovery_arguments(ctl)
    metrics.add_metrics_argument(ctl)
    add_config_arguments(ctl)
    ctl.set_defaults(func=_control)


def _add_recovery_arguments(ctl: argparse.ArgumentParser) -> None:
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


def _register_reports(subparsers: Any) -> None:
    """The read-only report verbs: decisions, broker, broker-stats and brokers."""
    _, d_sub = _group(
        subparsers, "decisions", "decision outcomes recorded by the controller",
        "decisions_command",
    )  # fmt: skip
    p = _verb(d_sub, "tail", "the latest decision outcomes", _decisions_tail)
    p.add_argument("-n", type=int, default=20, help="how many (default 20)")
    _, br_sub = _group(
        subparsers, "broker", "one broker's load as the streaming job sees it", "broker_command"
    )
    p = _verb(br_sub, "load-report", "the broker's last averaged load report", _broker_load)
    p.add_argument("broker")
    _, st_sub = _group(
        subparsers, "broker-stats", "a broker's load report as stored (pulsar-admin broker-stats)",
        "broker_stats_command",
    )  # fmt: skip
    p = _verb(
        st_sub,
        "load-report",
        "print the broker's last load report as JSON (LocalBrokerData field names), as the "
        "streaming job stored it in the load snapshot (P:load:brokers): the report as decoded, "
        "not its raw bytes (fields lbctl does not know are dropped), with lastStats put back "
        "from the bundle state (each reported bundle's last sample from this broker). For the "
        "averaged view (historyUsage, percentages) use 'lbctl broker load-report B'. Output is "
        "always JSON; --json is accepted",
        av.load_report,
    )
    av.add_load_report_arguments(p)
    _, b_sub = _group(subparsers, "brokers", "registered brokers", "brokers_command")
    p = _verb(b_sub, "list", "live brokers (registration not expired)", av.brokers_list)
    av.add_brokers_list_arguments(p)
    _verb(
        b_sub,
        "leader-broker",
        "the decider (the streaming job holding the decider lease: "
        "its host, term and last batch) and the live controllers",
        av.leader_broker,
    )


def _run(func: Any, args: argparse.Namespace) -> int:
    url = ""
    try:
        config = load_from_args(args)
        url = args.redis_url or config.redis_url
        if not url:
            print("lbctl: no Redis: pass --redis-url or set redisUrl", file=sys.stderr)
            return 2
        client = connect(url, config, purpose="admin")
        store = RedisStore(client, config.redis_key_prefix, clock="server")
        rows = func(store, args, config)
    except (ConfigError, av.UsageError) as e:
        print(f"lbctl: {e}", file=sys.stderr)
        return 2
    except av.PartialFailure as e:
        _print(e.rows, args.json)
        print(f"lbctl: {e}", file=sys.stderr)
        return 1
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
    if rows is not None:  # None: the verb printed its own output
        _print(rows, args.json)
    return 0


def _print(rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        doc = rows.pulsar_json if isinstance(rows, av.PulsarShaped) else rows
        print(json.dumps(doc, indent=2, sort_keys=True))
        return

    table = Table()
    for col in rows[0] if rows else ["(none)"]:
        table.add_column(_human_column(col), overflow="fold")
    for row in rows:
        table.add_row(*(_human_cell(k, v) for k, v in row.items()))
    console = Console(width=160) if Console().is_terminal else Console(width=400, soft_wrap=True)
    console.print(table)


def _human_column(key: str) -> str:
    """``expiresAtMs`` -> ``expiresAt``: the cell shows an ISO 8601 time, not milliseconds."""
    return key[:-2] if key.endswith("AtMs") else key


def _human_cell(key: str, value: Any) -> str:
    """A table cell: epoch milliseconds as ISO 8601 (UTC), a bundle without owner as free."""
    if value is None:
        return "free" if key == "owner" else "-"
    if key.endswith("AtMs") and isinstance(value, int) and value > 0:
        return iso_ms(value)
    return str(value)


def iso_ms(ms: int) -> str:
    """Epoch milliseconds as ISO 8601 in UTC, to the millisecond (``2026-11-27T10:00:00.123Z``)."""
    stamp = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def _ns_list(
    store: OwnershipStore, args: argparse.Namespace, config: LoadBalancerConfig
) -> list[dict[str, Any]]:
    return [{"namespace": ns} for ns in store.list_namespaces()]


def _ns_bundles(
    store: OwnershipStore, args: argparse.Namespace, config: LoadBalancerConfig
) -> list[dict[str, Any]]:
    nb = _require(store, args.namespace)
    rows = [
        {"bundle": r.name, "lower": f"0x{r.lower:08x}", "upper": f"0x{r.upper:08x}",
         "version": nb.version}
        for r in nb.bundles
    ]  # fmt: skip
    # pulsar-admin namespaces bundles: BundlesData {"boundaries": [...], "numBundles": N}
    boundaries = [f"0x{b:08x}" for b in nb.boundaries]
    return av.PulsarShaped(rows, {"boundaries": boundaries, "numBundles": len(rows)})


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

    event = None
    if args.no_assign:
        bundle, lease = store.lookup(args.topic, _now_ms())
    else:
        bundle, lease, event = lookup_assign_event(store, args.topic, config, _now_ms())
    _publish(args, config, [event] if event else [])
    row = {"topic": args.topic, **_lease_row(bundle, lease), "assigned": event is not None}
    if lease is None and not args.no_assign:
        row["reason"] = _refusal(store, bundle, config, _now_ms())
    return [row]


def _refusal(store: RedisStore, bundle: str, config: LoadBalancerConfig, now_ms: int) -> str:
    """Why a lookup left ``bundle`` without an owner, as the placement rules say it now (an
    operator asking about a refused lookup wants the rule, such as the isolation policy that
    leaves no live broker, not just an empty owner)."""
    view = base_view(store, config, now_ms)
    if view is None:
        return "no live broker with load data"
    selector = BrokerSelector(view, config, random.Random(0))
    if selector.select(bundle) is not None:
        return "no broker was eligible at the lookup; one is now (retry the lookup)"
    return selector.last_reason


def _owners(
    store: OwnershipStore, args: argparse.Namespace, config: LoadBalancerConfig
) -> list[dict[str, Any]]:
    nb = _require(store, args.namespace)
    owners = store.owners(args.namespace, _now_ms())
    return [_lease_row(b, owners.get(b)) for b in nb.bundle_names]


def _control(args: argparse.Namespace) -> int:
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
    client = connect(url, config, purpose="control")
    store = RedisStore(client, config.redis_key_prefix, clock="server")
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
    return store.outcomes.tail(args.n)


def _broker_load(
    store: RedisStore, args: argparse.Namespace, config: LoadBalancerConfig
) -> list[dict[str, Any]]:
    raw = store.load_snapshot.broker_docs_raw().get(args.broker)
    if raw is None:
        raise InvalidInput("broker", f"broker unknown or without a load report: {args.broker}")
    doc = decode_broker_doc(raw)
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
