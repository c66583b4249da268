"""Load the effective configuration of a process: ``broker.conf``, the environment, ``--set``.

The shell side of ``loadbalance.config``: it reads the ``broker.conf`` file and the process
environment, hands the text and mappings to the pure loader, and reports problems in one line
that names the knob, never with a secret in it. A stock Pulsar ``broker.conf`` holds dozens of
settings that mean nothing to a load balancer: they get one summary warning line, and
``--verbose`` lists them, with why the inert Pulsar knobs it names (``loadManagerClassName``,
``loadBalancerDebugModeEnabled``, ...: ``loadbalance.config.INERT_KNOBS``) have no effect here.
An inert knob set to anything but its default, from any source, is logged as one warning
naming it (logger ``lbctl.config``), so an operator who tuned it learns that it does nothing.

Why it sits in the infrastructure layer: every long-running process (the streaming job, the
controller, the agent, the simulator) and every ``lbctl`` command loads its configuration the
same way, so the runtime packages and the command line both import it from here.

Every process loads its configuration through ``load_from_args``, so that is where the log
redaction goes in: once the secrets are known, ``infra.redaction.SecretFilter`` is put on the
root logger's handlers, and from then on no log line of any process (the controller, the
streaming job's driver, the agent) can print a configured password, whoever wrote the line.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from infra.redaction import SecretFilter, install_secret_filter
from loadbalance.config import (
    ConfigError,
    ConfigLoad,
    LoadBalancerConfig,
    load_config_details,
)

log = logging.getLogger("lbctl.config")


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config FILE`` (a Pulsar-style broker.conf) and repeatable ``--set knob=value``."""
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="Pulsar-style broker.conf (key=value); unknown keys are reported and ignored",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="override a knob by its Pulsar name, e.g. --set loadBalancerSheddingIntervalMinutes=2",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="list the broker.conf keys ignored as not load-balancer settings, and explain the "
        "recognised Pulsar keys that are not knobs here",
    )


def _overrides(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise ConfigError(pair, "expected KNOB=VALUE")
        k, v = pair.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def load_from_args(args: argparse.Namespace, *, quiet: bool = False) -> LoadBalancerConfig:
    """Load the effective configuration for a command; raises ``ConfigError``."""
    conf_path: Path | None = getattr(args, "config", None)
    conf_text = None
    if conf_path is not None:
        try:
            conf_text = conf_path.read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError("--config", f"cannot read {conf_path}: {e.strerror}") from None
    config, found = load_config_details(
        conf_text=conf_text, env=os.environ, overrides=_overrides(getattr(args, "set", []))
    )
    if not quiet:
        print_config_load(found, verbose=bool(getattr(args, "verbose", False)))
        log_inert_settings(found)
    redact_logs(config)
    return config


def print_config_load(found: ConfigLoad, *, verbose: bool, file: Any = None) -> None:
    """Warnings always (one line each); with ``verbose`` the ignored keys and the notes."""
    out = file or sys.stderr
    for w in found.warnings:
        print(f"lbctl: warning: {w}", file=out)
    if verbose:
        for key in found.ignored_keys:
            print(f"lbctl: ignored broker.conf key (not a load-balancer setting): {key}", file=out)
        for note in found.notes:
            print(f"lbctl: note: {note}", file=out)


def log_inert_settings(found: ConfigLoad) -> None:
    """One logged warning per inert knob set to anything but its default."""
    for line in found.inert:
        log.warning("configuration: %s", line)


def redact_logs(config: LoadBalancerConfig) -> None:
    """Mask ``config``'s secrets in every log record of this process (idempotent: a second
    configuration adds its secrets to the filter already installed).

    Installed even when the configuration holds no secret: a password given only inside a URL
    (``--redis-url redis://user:pass@host``, a SASL bootstrap URL) is masked by the filter's
    URL rule, which needs no configured value."""
    secrets = config.secret_values()
    root = logging.getLogger()
    for flt in root.filters:
        if isinstance(flt, SecretFilter):
            flt.secrets = sorted(set(flt.secrets) | set(secrets))
            for handler in root.handlers:
                if flt not in handler.filters:
                    handler.addFilter(flt)
            return
    install_secret_filter(config, root)


def kafka_security(config: LoadBalancerConfig) -> dict[str, str]:
    """librdkafka security settings from the configuration (only those that are set): the one
    place the Kafka clients of every process take their ``security.protocol``/SASL/TLS from."""
    return dict(config.kafka_client_settings())


def ensure_pipeline_topics(bootstrap_servers: str, config: LoadBalancerConfig) -> None:
    """Create the product's four topics (load reports, decisions, dead letters, ownership
    events) with the configured partitions, where they do not exist yet."""
    from infra.topics import ensure_topics

    topics = (
        config.load_reports_topic,
        config.decisions_topic,
        config.dead_letters_topic,
        config.ownership_events_topic,
    )
    ensure_topics(
        bootstrap_servers,
        dict.fromkeys(topics, config.topic_partitions),
        kafka_security(config),
        topic_configs={config.load_reports_topic: reports_topic_config(config)},
    )


def reports_topic_config(config: LoadBalancerConfig) -> dict[str, str]:
    """The reports topic's ``max.message.bytes``: twice ``maxReportBytes``, so a report over the
    product's limit still reaches the job and is dead-lettered with its reason, where Kafka's
    1 MB default would have the broker refuse a large broker's report at the producer."""
    return {"max.message.bytes": str(2 * config.max_report_bytes)}
