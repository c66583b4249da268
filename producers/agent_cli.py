"""``lbctl agent``: run the broker agent beside a real broker.

The shell around ``producers.agent.Agent``: it reads the configuration, builds the psutil host
sampler, the bundle-stats provider, the Kafka publisher and (with ``--redis-url``) the Redis
lease keeper, then loops until SIGTERM/SIGINT. ``--once`` does a single check and exits, which
is handy from cron or to try a provider out.

``lbctl agent status`` reads the serving file a running agent rewrites after every check
(``producers.serving_hook``) and says, per bundle, whether the broker may serve it now and for
how many seconds more; it needs neither Redis nor Kafka.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from infra import metrics
from infra.config_loading import add_config_arguments, kafka_security, load_from_args
from infra.redis_client import connect
from loadbalance.config import ConfigError, LoadBalancerConfig
from loadbalance.serving import ServingRule, ServingTable
from metadata_store.ownership_redis import RedisStore
from producers.agent import Agent, KafkaReportPublisher, LeaseKeeper
from producers.bundle_stats import provider_from_spec
from producers.host_usage import PsutilHostUsage
from producers.serving_hook import ServingHook, default_serving_file, read_serving_file


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "agent",
        help="run beside a broker: publish its load reports and keep its leases",
        description="Sample the host (psutil) and the broker's bundle stats, publish a "
        "LocalBrokerData report to the load-report topic whenever Pulsar's update rule says "
        "so (loadBalancerReportUpdate* knobs), and with --redis-url heartbeat the broker and "
        "renew the leases of the bundles it reports. 'lbctl agent status' shows, from the "
        "serving file, which bundles the broker may serve now.",
    )
    _add_status_arguments(p)
    p.add_argument(
        "--bootstrap-servers",
        default="",
        help="Kafka bootstrap servers (default: kafkaBootstrapServers)",
    )
    p.add_argument(
        "--provider",
        default="",
        metavar="file:PATH|http:URL|pulsar:URL",
        help="bundle stats: a load-report JSON file, an HTTP URL serving one, or a Pulsar "
        "broker's web service URL (reads /admin/v2/broker-stats/load-report); default: none",
    )
    p.add_argument("--pulsar-token", default="", help="token for a pulsar: provider with auth")
    p.add_argument(
        "--cpu-limit-percent",
        type=float,
        default=None,
        help="CPU limit in percent of one core (default: usable cores x 100)",
    )
    p.add_argument(
        "--nic-speed-mbps",
        type=float,
        default=None,
        help="NIC speed in Mbit/s (default: loadBalancerOverrideBrokerNicSpeedGbps x 1000 if "
        "set, else detected, else 1000)",
    )
    p.add_argument(
        "--redis-url",
        default="",
        help="heartbeat the broker and renew its leases in this Redis (default: redisUrl; "
        "empty = no Redis)",
    )
    p.add_argument("--web-service-url", default="", help="webServiceUrl written in the report")
    p.add_argument(
        "--pulsar-service-url", default="", help="pulsarServiceUrl written in the report"
    )
    p.add_argument("--once", action="store_true", help="one check, then exit (0 = published)")
    add_config_arguments(p)
    metrics.add_metrics_argument(p)
    p.set_defaults(func=run_agent, check_usage=check_agent_usage)


def _add_status_arguments(p: argparse.ArgumentParser) -> None:
    """The action (run or status), the broker id and the serving file both actions share."""
    p.add_argument(
        "action",
        nargs="?",
        choices=("run", "status"),
        default="run",
        help="run (default): the agent loop; status: what the running agent lets its broker "
        "serve now, read from the serving file",
    )
    p.add_argument(
        "--broker-id", default="", help="broker id; also the Kafka record key (needed to run)"
    )
    p.add_argument(
        "--serving-file",
        default=default_serving_file(),
        help="the file the agent rewrites after every check with each bundle's serve-until "
        "time (the broker integration's hook; 'status' reads it; default: %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="status: print JSON")


def check_agent_usage(args: argparse.Namespace) -> int | None:
    """Running needs a broker id; ``status`` reads a local file, so no service is checked."""
    if args.action == "status":
        args.skip_preflight = True
        return None
    if not args.broker_id:
        print("lbctl agent: needs --broker-id (the broker this agent runs beside)", file=sys.stderr)
        return 2
    return None


def agent_status(args: argparse.Namespace) -> int:
    """Print the serving file judged now; exit 1 if there is no readable file."""
    try:
        doc = read_serving_file(args.serving_file, time.monotonic())
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(
            f"lbctl agent status: cannot read the serving file {args.serving_file} ({e}); "
            "is the agent running with --redis-url and this --serving-file?",
            file=sys.stderr,
        )
        return 1
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    print(_status_text(doc))
    return 0


def _status_text(doc: dict[str, Any]) -> str:
    bundles = doc["bundles"]
    on = sum(1 for b in bundles if b["serving"])
    lines = [f"broker {doc.get('broker', '?')}: serving {on} of {len(bundles)} bundles held"]
    for b in bundles:
        state = f"serving, {b['secondsLeft']:.1f} s left" if b["serving"] else "NOT serving"
        lines.append(f"  {b['bundle']}  token {b['token']}  {state}")
    return "\n".join(lines)


def nic_speed_mbps(args: argparse.Namespace, config: LoadBalancerConfig) -> float | None:
    """``--nic-speed-mbps``, else ``loadBalancerOverrideBrokerNicSpeedGbps`` in Mbit/s, else
    ``None`` (detect): the flag is the more specific, so it wins."""
    if args.nic_speed_mbps is not None:
        return float(args.nic_speed_mbps)
    gbps = config.load_balancer_override_broker_nic_speed_gbps
    return gbps * 1000.0 if gbps is not None else None


def run_agent(args: argparse.Namespace) -> int:
    if args.action == "status":
        return agent_status(args)
    try:
        config = load_from_args(args)
    except ConfigError as e:
        print(f"lbctl agent: {e}", file=sys.stderr)
        return 2
    bootstrap = args.bootstrap_servers or config.kafka_bootstrap_servers
    if not bootstrap:
        print("lbctl agent: needs --bootstrap-servers (or kafkaBootstrapServers)", file=sys.stderr)
        return 2
    try:
        provider = provider_from_spec(args.provider, token=args.pulsar_token)
        usage = PsutilHostUsage(args.cpu_limit_percent, nic_speed_mbps(args, config))
    except ValueError as e:
        print(f"lbctl agent: {e}", file=sys.stderr)
        return 2
    try:
        metrics.serve_from_args(args)
    except OSError as e:
        print(f"lbctl agent: metrics endpoint: {e}", file=sys.stderr)
        return 2
    keeper = None
    redis_url = args.redis_url or config.redis_url
    if redis_url:
        client = connect(redis_url, config, purpose="agent")
        store = RedisStore(client, config.redis_key_prefix, clock="server")
        keeper = LeaseKeeper(
            store,
            args.broker_id,
            registration_ttl_ms=int(config.load_balancer_broker_registration_ttl_seconds * 1000),
            lease_ttl_ms=int(config.load_balancer_ownership_lease_ttl_seconds * 1000),
            info={
                "webServiceUrl": args.web_service_url,
                "pulsarServiceUrl": args.pulsar_service_url,
            },
            serving=ServingTable(args.broker_id, ServingRule.from_config(config)),
            monotonic=time.monotonic,
        )
    publisher = KafkaReportPublisher(
        bootstrap, config.load_reports_topic, client_config=kafka_security(config)
    )
    agent = Agent(
        config,
        args.broker_id,
        usage,
        provider,
        publisher,
        lease_keeper=keeper,
        serving_hook=ServingHook(args.serving_file, time.monotonic) if keeper else None,
        web_service_url=args.web_service_url,
        pulsar_service_url=args.pulsar_service_url,
    )
    try:
        return agent.run(once=args.once)
    finally:
        publisher.close()
