"""``lbctl stream``: run the streaming job (reports -> averages -> decisions) until stopped.

The shell around ``streaming.job``: options for where things are (Kafka, Redis, checkpoint) and
how the query runs, plus the shared ``--config`` / ``--set`` policy knobs. Kafka and Redis
default to the configuration's ``kafkaBootstrapServers`` and ``redisUrl``; the topics are
created if missing (Tansu, the embedded broker, does not auto-create them).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

log = logging.getLogger("streaming.cli")


def add_stream_arguments(parser: argparse.ArgumentParser) -> None:
    from lbctl.config_cmd import add_config_arguments
    from lbctl.metrics import add_metrics_argument
    from streaming.job import DEFAULT_SHARDS

    parser.add_argument(
        "--bootstrap-servers", default=None, help="Kafka bootstrap servers (default: config)"
    )
    parser.add_argument("--redis-url", default=None, help="Redis URL (default: config redisUrl)")
    parser.add_argument(
        "--checkpoint",
        required=True,
        metavar="DIR",
        help="Spark checkpoint folder (state, offsets)",
    )
    parser.add_argument(
        "--trigger-seconds",
        type=float,
        default=5.0,
        help="micro-batch interval, s (0 = as fast as possible; default 5)",
    )
    parser.add_argument(
        "--available-now",
        action="store_true",
        help="process what is on the topic now, then stop (catch-up or replay runs)",
    )
    parser.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    parser.add_argument(
        "--source",
        choices=("auto", "kafka", "python"),
        default="auto",
        help="Spark's built-in Kafka source (needs its jar), the Python data source, or auto",
    )
    parser.add_argument(
        "--starting-offsets",
        default="earliest",
        help="where a NEW checkpoint starts: earliest or latest (a checkpoint resumes itself)",
    )
    parser.add_argument(
        "--shards",
        type=int,
        default=DEFAULT_SHARDS,
        help=f"bundle state shards, fixed for a checkpoint (default {DEFAULT_SHARDS})",
    )
    parser.add_argument(
        "--max-offsets-per-trigger", type=int, default=None, help="cap records per micro-batch"
    )
    parser.add_argument(
        "--watermark-delay-seconds",
        type=float,
        default=60.0,
        help="how far a report's Kafka timestamp may lag the newest one before Spark drops it "
        "as late; a silent broker is declared gone this much after its report timeout",
    )
    parser.add_argument(
        "--shuffle-partitions", type=int, default=2, help="state partitions for a new checkpoint"
    )
    add_config_arguments(parser)
    add_metrics_argument(parser)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "stream",
        help="run the Spark streaming job: load reports -> averages -> decisions",
        description=(
            "Read LocalBrokerData load reports from Kafka, keep short/long-term averages per "
            "bundle and history usage per broker in Spark state, run the split/shedding/"
            "placement cycle once per micro-batch, publish decisions and dead letters to Kafka "
            "and the averaged view to Redis. Runs until interrupted."
        ),
    )
    add_stream_arguments(p)
    p.set_defaults(func=run_stream)


def run_stream(args: argparse.Namespace) -> int:
    from infra.topics import ensure_topics
    from lbctl import metrics
    from lbctl.config_cmd import load_from_args
    from loadbalance.config import ConfigError
    from streaming.job import StreamSettings, spark_session, start_query

    try:
        config = load_from_args(args)
    except ConfigError as e:
        print(f"lbctl stream: {e}", file=sys.stderr)
        return 2
    bootstrap = args.bootstrap_servers or config.kafka_bootstrap_servers
    if not bootstrap:
        print("lbctl stream: no Kafka: give --bootstrap-servers", file=sys.stderr)
        return 2
    try:
        metrics.serve_from_args(args)
    except OSError as e:
        print(f"lbctl stream: metrics endpoint: {e}", file=sys.stderr)
        return 2
    client_config = kafka_security(config)
    ensure_topics(
        bootstrap,
        {
            t: config.topic_partitions
            for t in (config.load_reports_topic, config.decisions_topic, config.dead_letters_topic)
        },
        client_config,
    )
    settings = StreamSettings(
        bootstrap_servers=bootstrap,
        checkpoint=args.checkpoint,
        redis_url=args.redis_url or config.redis_url or None,
        trigger_seconds=args.trigger_seconds,
        available_now=args.available_now,
        source=args.source,
        starting_offsets=args.starting_offsets,
        n_shards=args.shards,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        watermark_delay_seconds=args.watermark_delay_seconds,
        client_config=client_config,
    )
    if settings.redis_url is None:
        log.warning("no Redis: progress is kept in memory only and a restart starts afresh")
    spark = spark_session(args.master, args.shuffle_partitions)
    query = start_query(spark, settings, config)
    # A supervisor (``lbctl run``, systemd, Kubernetes) stops with SIGTERM: treat it exactly like
    # Ctrl-C, whose handler (installed by the SparkContext) cancels the running jobs before it
    # raises KeyboardInterrupt, so the process exits 130 instead of dying inside a py4j call.
    previous = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is threading.main_thread():
        on_int = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGTERM, on_int if callable(on_int) else _raise_keyboard_interrupt)
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
        return 130
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)
    return 0


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def kafka_security(config: object) -> dict[str, str]:
    """librdkafka security settings from the configuration (only those that are set)."""
    return dict(config.kafka_client_settings())  # type: ignore[attr-defined]
