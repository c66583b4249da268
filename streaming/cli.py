"""``lbctl stream``: run the streaming job (reports -> averages -> decisions) until stopped.

The shell around ``streaming.job``: options for where things are (Kafka, Redis, checkpoint) and
how the query runs, plus the shared ``--config`` / ``--set`` policy knobs. Kafka and Redis
default to the configuration's ``kafkaBootstrapServers`` and ``redisUrl``; the topics are
created if missing, with the configured partitions, rather than left to a broker's
auto-creation.

A query that fails (typically: Kafka away for longer than the client timeouts, so the source's
offset probe, a task's read or the decision stage's producer flush gives up after 15-120 s) is
restarted in this process, from the same checkpoint and with a fresh decision stage that
re-seeds its view from Redis, exactly as a new process would; that restart is exact (see
``streaming.decide``). The wait before a restart doubles from 1 s to 60 s while restarts keep
failing and starts again at 1 s once a restarted query has completed a batch.
``--max-restarts`` bounds the number of restarts (0: exit on the first failure).

Kafka and Redis are checked before Spark starts (``lbctl`` does it for every command), and
watched while the query runs (``streaming.service_watch``): a service gone for longer than
``--restart-window-s`` (default 120 s) stops the job with one line naming it, its address and
what to check, rather than restarting for ever.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from infra import metrics
from infra.config_loading import (
    add_config_arguments,
    kafka_security,
    load_from_args,
    reports_topic_config,
)
from infra.preflight import probe_kafka, probe_redis
from infra.topics import ensure_topics
from loadbalance.config import ConfigError
from streaming.checkpoint_settings import DEFAULT_SHARDS, CheckpointMismatch, check_shards
from streaming.query_restarts import (
    RESTART_BACKOFF_MAX_S,
    RESTART_BACKOFF_S,
    describe_failure,
    restartable_errors,
    run_with_restarts,
)
from streaming.service_watch import DEFAULT_WINDOW_S, ServiceWatch

log = logging.getLogger("streaming.cli")


def add_stream_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the job reads and keeps things (Kafka, Redis, checkpoint, Spark), then how it runs."""
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
    parser.add_argument(
        "--master",
        default=None,
        help="Spark master, e.g. spark://host:7077 (default: spark-submit's --master, else "
        "local[2])",
    )
    parser.add_argument(
        "--driver-memory",
        default=None,
        metavar="SIZE",
        help="heap of the driver JVM this command starts, e.g. 3g (spark.driver.memory; "
        "Spark's default 1g is too small for about a million bundles)",
    )
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
    _add_query_arguments(parser)


def _add_batching_arguments(parser: argparse.ArgumentParser) -> None:
    """How much one micro-batch reads, and in how many tasks."""
    parser.add_argument(
        "--max-offsets-per-trigger",
        type=_positive_int,
        default=None,
        help="cap records per micro-batch (default: as many reports of maxReportBytes as fit "
        "in --max-bytes-per-trigger, so a catch-up after an outage runs in bounded batches)",
    )
    parser.add_argument(
        "--max-bytes-per-trigger",
        type=_positive_int,
        default=None,
        metavar="BYTES",
        help="without --max-offsets-per-trigger: the record bytes one micro-batch may read, "
        "each record counted at maxReportBytes (default 1 GiB: 1,024 reports of 1 MB)",
    )
    parser.add_argument(
        "--max-records-per-partition",
        type=_positive_int,
        default=None,
        metavar="N",
        help="a Kafka partition's range of more than N records in one micro-batch is read by "
        "several tasks (default: one task per partition). For a catch-up on a topic with "
        "fewer partitions than executor cores; a live batch of a few reports stays one task",
    )


def _add_query_arguments(parser: argparse.ArgumentParser) -> None:
    """State, batching, restarts, configuration and metrics."""
    _add_batching_arguments(parser)
    parser.add_argument(
        "--shards",
        type=int,
        default=DEFAULT_SHARDS,
        help=f"bundle state shards (default {DEFAULT_SHARDS}); recorded in the checkpoint "
        "folder at its first start, and a later start with another count is refused",
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
    parser.add_argument(
        "--max-restarts",
        type=_non_negative_int,
        default=None,
        metavar="N",
        help="restart a failed query (e.g. Kafka away longer than the client timeouts) at most "
        f"N times, from the same checkpoint, waiting {RESTART_BACKOFF_S:g} s doubling to "
        f"{RESTART_BACKOFF_MAX_S:g} s (back to {RESTART_BACKOFF_S:g} s once a batch completes); "
        "0 = exit on the first failure (default: unlimited)",
    )
    parser.add_argument(
        "--restart-window-s",
        type=float,
        default=DEFAULT_WINDOW_S,
        metavar="S",
        help="while Kafka or Redis does not answer (probed every 10 s while the query runs and "
        "after each failure), keep the job waiting and restarting for at most S seconds, then "
        f"stop with one line naming the service and its address (default {DEFAULT_WINDOW_S:g})",
    )
    add_config_arguments(parser)
    metrics.add_metrics_argument(parser)


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
    p.set_defaults(func=run_stream, check_usage=check_stream_usage)


class _Exit(Exception):
    """Leave ``run_stream`` with ``code`` after the message was printed."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def run_stream(args: argparse.Namespace) -> int:
    # pyspark (through streaming.job): every lbctl command registers this one, only this runs Spark
    from streaming.job import spark_session, start_query

    try:
        config, bootstrap = _preflight(args)
    except _Exit as e:
        return e.code
    client_config = kafka_security(config)
    ensure_topics(
        bootstrap,
        {
            t: config.topic_partitions
            for t in (config.load_reports_topic, config.decisions_topic, config.dead_letters_topic)
        },
        client_config,
        topic_configs={config.load_reports_topic: reports_topic_config(config)},
    )
    settings = _stream_settings(args, bootstrap, config.redis_url, client_config)
    if settings.redis_url is None:
        log.warning("no Redis: progress is kept in memory only and a restart starts afresh")
    from pyspark import SparkContext

    # a caller's own session (tests run the command in-process) is the caller's to stop
    own_session = SparkContext._active_spark_context is None
    spark = spark_session(args.master, args.shuffle_partitions, args.driver_memory)
    _quiet_session(spark)
    secrets = tuple(config.secret_values())

    stages: list[Any] = []

    def start(on_batch: Callable[[Any], None]) -> Any:
        # Everything a fresh process builds per query: a new DecisionStage (re-seeded from
        # Redis at its first batch) over the same checkpoint. Topics, the session and the
        # metrics endpoint outlive a query.
        return start_query(spark, settings, config, on_batch=on_batch, stages=stages)

    with _sigterm_as_ctrl_c():
        try:
            return run_with_restarts(
                start,
                max_restarts=getattr(args, "max_restarts", None),
                restartable=restartable_errors(),
                describe=lambda e: describe_failure(e, secrets),
                watch=_service_watch(args, config, settings),
            )
        finally:
            _release_decider(stages)
            if own_session:
                _stop_session(spark)


def _release_decider(stages: list[Any]) -> None:
    """Hand the decider lease back when the job ends (a clean stop, or restarts used up): a
    restarted job then decides at its first batch. A Redis that cannot be reached just leaves
    the lease to expire."""
    for stage in stages:
        try:
            stage.close()
        except Exception as e:  # a completed batch left nothing to deliver
            log.warning("decisions producer not closed cleanly: %s", e)
        try:
            if stage.release_decider():
                log.info("decider lease released")
        except Exception as e:  # any failure: the lease then expires by itself
            log.warning("decider lease not released (it expires by itself): %s", e)


QUERY_STOP_TIMEOUT = "10s"


def _quiet_session(spark: Any) -> None:
    """Keep a lost service down to the job's own lines: the Java Kafka client's per-second
    reconnect warnings, the connector's retry stack traces and py4j's per-callback info lines
    say nothing the watch does not, and a query stopped while its batch hangs on a dead broker
    is abandoned after ``QUERY_STOP_TIMEOUT`` instead of waiting for the client's timeouts."""
    logging.getLogger("py4j").setLevel(logging.WARNING)
    spark.conf.set("spark.sql.streaming.stopTimeout", QUERY_STOP_TIMEOUT)
    try:
        jvm = spark.sparkContext._jvm
        level = jvm.org.apache.logging.log4j.Level.ERROR
        for name in ("org.apache.kafka", "org.apache.spark.sql.kafka010"):
            jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, level)
    except Exception:  # another logging backend: its lines stay as they are
        log.debug("could not quieten the Java Kafka client's logger", exc_info=True)


def _stop_session(spark: Any) -> None:
    """Stop Spark before the interpreter exits, so the listener bus delivers its last events
    while the Python side still answers. The job has said why it ends in its own lines by now:
    what the JVM prints while it shuts down (a query thread abandoned after the stop timeout
    dies with the RPC layer's stack trace) is silenced first."""
    try:
        spark.sparkContext.setLogLevel("OFF")
        jvm = spark.sparkContext._jvm
        jvm.java.lang.System.setErr(
            jvm.java.io.PrintStream(jvm.java.io.OutputStream.nullOutputStream())
        )
        spark.stop()
    except Exception:  # the JVM is already going away (a group kill)
        log.debug("stopping the Spark session failed", exc_info=True)


def check_stream_usage(args: argparse.Namespace) -> int | None:
    """The checks of ``_preflight`` that need no service (configuration, Kafka given, the
    checkpoint's shard count), run by ``lbctl.main`` before it asks Kafka and Redis: a
    refusal that is the operator's arguments is exit 2 whatever the services say."""
    try:
        _local_checks(args)
    except _Exit as e:
        return e.code
    return None


def _local_checks(args: argparse.Namespace) -> tuple[Any, str]:
    """The configuration, the bootstrap servers and the checkpoint's shard count."""
    try:
        config = load_from_args(args)
    except ConfigError as e:
        print(f"lbctl stream: {e}", file=sys.stderr)
        raise _Exit(2) from e
    bootstrap = args.bootstrap_servers or config.kafka_bootstrap_servers
    if not bootstrap:
        print("lbctl stream: no Kafka: give --bootstrap-servers", file=sys.stderr)
        raise _Exit(2)
    try:
        check_shards(args.checkpoint, args.shards)
    except CheckpointMismatch as e:
        print(f"lbctl stream: {e}", file=sys.stderr)
        raise _Exit(2) from e
    return config, bootstrap


def _preflight(args: argparse.Namespace) -> tuple[Any, str]:
    """The configuration and Kafka, the checkpoint's shard count and the metrics endpoint,
    checked before Kafka and the JVM are touched: a refusal costs nothing. ``_Exit(2)``
    after saying what is wrong."""
    config, bootstrap = _local_checks(args)
    try:
        metrics.serve_from_args(args)
    except OSError as e:
        print(f"lbctl stream: metrics endpoint: {e}", file=sys.stderr)
        raise _Exit(2) from e
    return config, bootstrap


def _service_watch(args: argparse.Namespace, config: Any, settings: Any) -> ServiceWatch:
    """The watch over the job's Kafka and Redis, with the configured client settings."""

    def probe() -> str | None:
        lost = probe_kafka(settings.bootstrap_servers, settings.client_config)
        if lost is None and settings.redis_url:
            lost = probe_redis(settings.redis_url, config)
        return lost

    return ServiceWatch(probe, window_s=args.restart_window_s)


def _stream_settings(
    args: argparse.Namespace, bootstrap: str, redis_url: str, client_config: dict[str, str]
) -> Any:
    """The query's ``StreamSettings`` from the command line."""
    # pyspark (through streaming.job), as in run_stream
    from streaming.job import StreamSettings

    return StreamSettings(
        bootstrap_servers=bootstrap,
        checkpoint=args.checkpoint,
        redis_url=args.redis_url or redis_url or None,
        trigger_seconds=args.trigger_seconds,
        available_now=args.available_now,
        source=args.source,
        starting_offsets=args.starting_offsets,
        n_shards=args.shards,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        max_bytes_per_trigger=args.max_bytes_per_trigger,
        max_records_per_partition=args.max_records_per_partition,
        watermark_delay_seconds=args.watermark_delay_seconds,
        client_config=client_config,
    )


@contextlib.contextmanager
def _sigterm_as_ctrl_c() -> Iterator[None]:
    """SIGTERM does what Ctrl-C does while inside; the previous handler comes back after.

    A supervisor (``lbctl run``, systemd, Kubernetes) stops with SIGTERM: treat it exactly like
    Ctrl-C, whose handler (installed by the SparkContext) cancels the running jobs before it
    raises KeyboardInterrupt, so the process exits 130 instead of dying inside a py4j call
    (or in the wait before a restart).
    """
    previous = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is threading.main_thread():
        on_int = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGTERM, on_int if callable(on_int) else _raise_keyboard_interrupt)
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
