"""``lbctl``: the one command-line entry point of the product.

Each shell package contributes its verbs through a ``register(subparsers)`` function, so the
entry point stays a table of contents: configuration, offline decisions, embedded services,
the streaming job, the controller and its pulsar-admin-like verbs, the simulator and benchmarks,
and the one-command main job.

Before a command runs, the services it would use are checked (``check_services``): a command
with a ``--redis-url`` option needs the Redis it names (or ``redisUrl``), one with
``--bootstrap-servers`` the Kafka it names (or ``kafkaBootstrapServers``), each only when one
is given or configured (a command without one says so itself). A malformed URL, an address
nobody answers on within a few seconds, or refused credentials end the command with one line
naming the address and what to check, before any heavy work (Spark, topic creation, a loop).
The commands that keep ownership in Redis (``control``, ``stream``, ``run``) also read its
``maxmemory-policy`` and persistence settings: an evicting policy ends them in one line
unless ``redisAllowEvictingPolicy`` is on, and a Redis that persists nothing or hides its
``CONFIG`` is one warning (``preflight.check_redis_settings``).
Kinds of trouble met later that a command does not handle itself end it in one line too, never
in a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

import redis
from confluent_kafka import KafkaException

from infra import preflight
from infra.config_loading import load_from_args
from infra.kafka_auth import KafkaAuthError
from loadbalance.config import ConfigError, LoadBalancerConfig

# Modules contributing verbs, in the order ``lbctl --help`` lists them.
COMMAND_MODULES = (
    "lbctl.config_cmd",
    "lbctl.decide_cmd",
    "infra.cli",
    "streaming.cli",
    "controller.cli",
    "producers.cli",
    "lbctl.bench_cmd",
    "producers.agent_cli",
    "lbctl.run_cmd",
    "lbctl.monitor_cmd",
    "lbctl.health_cmd",
)
# Commands that check services themselves or start their own: health and monitor report an
# unreachable service as their answer; infra, bench and run without addresses start embedded ones.
NO_PREFLIGHT = frozenset({"health", "monitor", "infra", "bench", "config", "decide"})
# Of those, the ones that still need a well-formed Redis URL: a malformed one is no service
# state to report, only a usage error.
URL_FORM_ONLY = frozenset({"health", "monitor"})
# Commands that keep ownership in Redis: its eviction policy and persistence are checked too.
REDIS_SETTINGS_CHECKED = frozenset({"control", "stream", "run"})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lbctl",
        description=(
            "Apache Pulsar's broker load manager as a streaming controller: load reports on "
            "Kafka, decisions from a Spark Structured Streaming job, ownership in Redis."
        ),
        epilog="Run 'lbctl COMMAND --help' for the options of one command.",
    )
    parser.add_argument(
        "--log-level", default="INFO", help="logging level (DEBUG, INFO, WARNING; default INFO)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:  # a real missing dependency, not an absent command module
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        check_usage = getattr(args, "check_usage", None)
        refused = check_usage(args) if check_usage is not None else None
        if refused is not None:  # a usage error, said before any service is asked
            return int(refused)
        check_services(args)
        return int(func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except preflight.BadAddress as e:  # a malformed URL: a usage error
        print(f"lbctl: {e}", file=sys.stderr)
        return 2
    except (preflight.ServiceUnavailable, KafkaAuthError) as e:  # one line, no traceback
        print(f"lbctl: {e}", file=sys.stderr)
        return 1
    except (redis.ConnectionError, redis.TimeoutError) as e:  # lost after the check
        print(f"lbctl: Redis became unreachable: {e}; {preflight.REDIS_FIX}", file=sys.stderr)
        return 1
    except KafkaException as e:  # lost after the check: a topic creation or flush gave up
        print(f"lbctl: Kafka request failed: {e}; {preflight.KAFKA_FIX}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into `head` and closed: not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def _service_addresses(args: argparse.Namespace) -> tuple[str, str, LoadBalancerConfig | None]:
    """The Redis URL and the Kafka bootstrap servers the command would use ('' for none),
    and the configuration they come from."""
    if (
        getattr(args, "fast", False)
        or getattr(args, "skip_preflight", False)
        or (args.command in NO_PREFLIGHT and args.command not in URL_FORM_ONLY)
    ):
        return "", "", None
    if not hasattr(args, "redis_url") and not hasattr(args, "bootstrap_servers"):
        return "", "", None
    try:
        config = load_from_args(args, quiet=True)
    except ConfigError:  # the command reports it in its own words
        return "", "", None
    url = ""
    if hasattr(args, "redis_url"):
        url = args.redis_url or str.__str__(config.redis_url)
    bootstrap = ""
    if hasattr(args, "bootstrap_servers") and not getattr(args, "no_events", False):
        bootstrap = args.bootstrap_servers or config.kafka_bootstrap_servers
    return url, bootstrap, config


def check_services(
    args: argparse.Namespace, timeout_s: float = preflight.DEFAULT_TIMEOUT_S
) -> None:
    """Raise ``preflight.ServiceUnavailable`` (or ``BadAddress``) when a service the command
    is about to use does not answer within ``timeout_s``: Redis first (its URL can be checked
    without the network), then Kafka."""
    url, bootstrap, config = _service_addresses(args)
    if config is None:
        return
    if args.command in URL_FORM_ONLY:
        if url:
            preflight.check_redis_url(url)
        return
    if url:
        preflight.check_redis(url, config, timeout_s)
        if args.command in REDIS_SETTINGS_CHECKED:
            preflight.check_redis_settings(url, config, timeout_s)
    if bootstrap:
        preflight.check_kafka(bootstrap, config.kafka_client_settings(), timeout_s)


if __name__ == "__main__":
    sys.exit(main())
