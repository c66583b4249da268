"""``lbctl agent``: run the broker agent beside a real broker.

The shell around ``producers.agent.Agent``: it reads the configuration, builds the psutil host
sampler, the bundle-stats provider, the Kafka publisher and (with ``--redis-url``) the Redis
lease keeper, then loops until SIGTERM/SIGINT. ``--once`` does a single check and exits, which
is handy from cron or to try a provider out.
"""

from __future__ import annotations

import argparse
import sys

from infra import metrics
from infra.config_loading import add_config_arguments, kafka_security, load_from_args
from infra.redis_client import connect
from loadbalance.config import ConfigError, LoadBalancerConfig
from metadata_store.ownership_redis import RedisStore
from producers.agent import Agent, KafkaReportPublisher, LeaseKeeper
from producers.bundle_stats import provider_from_spec
from producers.host_usage import PsutilHostUsage


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "agent",
        help="run beside a broker: publish its load reports and keep its leases",
        description="Sample the host (psutil) and the broker's bundle stats, publish a "
        "LocalBrokerData report to the load-report topic whenever Pulsar's update rule says "
        "so (loadBalancerReportUpdate* knobs), and with --redis-url heartbeat the broker and "
        "renew the leases of the bundles it reports.",
    )
    p.add_argument("--broker-id", required=True, help="broker id; also the Kafka record key")
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
    p.set_defaults(func=run_agent)


def nic_speed_mbps(args: argparse.Namespace, config: LoadBalancerConfig) -> float | None:
    """``--nic-speed-mbps``, else ``loadBalancerOverrideBrokerNicSpeedGbps`` in Mbit/s, else
    ``None`` (detect): the flag is the more specific, so it wins."""
    if args.nic_speed_mbps is not None:
        return float(args.nic_speed_mbps)
    gbps = config.load_balancer_override_broker_nic_speed_gbps
    return gbps * 1000.0 if gbps is not None else None


def run_agent(args: argparse.Namespace) -> int:
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
        web_service_url=args.web_service_url,
        pulsar_service_url=args.pulsar_service_url,
    )
    try:
        return agent.run(once=args.once)
    finally:
        publisher.close()
