"""``lbctl``: the one command-line entry point of the product.

Each shell package contributes its verbs through a ``register(subparsers)`` function, so the
entry point stays a table of contents: configuration, offline decisions, embedded services,
the streaming job, the controller and its pulsar-admin-like verbs, the simulator and benchmarks,
and the one-command main job.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from infra.kafka_auth import KafkaAuthError

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
        return int(func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except KafkaAuthError as e:  # a refused password or certificate: one line, no traceback
        print(f"lbctl: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into `head` and closed: not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
