"""The agent end to end: reports reach the embedded Kafka, keyed by broker id, decodable."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from loadbalance.config import LoadBalancerConfig
from loadbalance.model import ResourceUsage
from loadbalance.report_codec import decode_report
from producers import agent_cli
from producers.agent import Agent, KafkaReportPublisher
from producers.bundle_stats import FileStatsProvider
from producers.host_usage import HostUsage

pytestmark = pytest.mark.integration

B1 = "public/default/0x00000000_0x80000000"
STATS = {
    "bundles": [B1],
    "lastStats": {B1: {"msgRateIn": 12.5, "msgThroughputIn": 1250.0, "topics": 3}},
}


class SteadyHost:
    """Fixed host figures: psutil's CPU on a busy CI machine would trip the 10 % rule."""

    def sample(self, now_ms: int) -> HostUsage:
        r = ResourceUsage(40.0, 200.0)
        return HostUsage(r, ResourceUsage(512.0, 4096.0), ResourceUsage(), r, r)


def read_all(bootstrap: str, topic: str, expected: int, timeout_s: float = 20.0) -> list:
    """Read partition 0 from the beginning (assign, no group join: a join costs a rebalance)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "agent-test", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    out = []
    try:
        deadline = time.monotonic() + timeout_s
        while len(out) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                out.append(msg)
    finally:
        consumer.close()
    return out


def test_agent_publishes_reports_keyed_by_broker_id(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = unique_topic(prefix="agent")
    stats_file = tmp_path / "stats.json"
    stats_file.write_text(json.dumps(STATS))
    publisher = KafkaReportPublisher(kafka_bootstrap, topic)
    agent = Agent(
        LoadBalancerConfig(),
        "broker-1:8080",
        SteadyHost(),
        FileStatsProvider(stats_file),
        publisher,
        clock=lambda: 0,
    )
    assert agent.tick(1_000)
    assert not agent.tick(6_000)  # nothing moved
    stats_file.write_text(
        json.dumps({**STATS, "bundles": [B1, "public/default/0x80000000_0xffffffff"]})
    )
    assert agent.tick(11_000)  # one more bundle: 50 % change
    publisher.close()

    msgs = read_all(kafka_bootstrap, topic, expected=2)
    assert [m.key() for m in msgs] == [b"broker-1:8080", b"broker-1:8080"]
    first, second = (decode_report(m.value(), m.key().decode()) for m in msgs)
    assert first.broker == "broker-1:8080" and first.bundles == {B1}
    assert first.msg_rate_in == 12.5 and first.num_topics == 3 and first.last_update_ms == 1_000
    assert first.cpu == ResourceUsage(40.0, 200.0) and first.memory.limit == 4096.0
    assert second.num_bundles == 2


def test_lbctl_agent_once_publishes_one_report(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = unique_topic(prefix="agent-cli")
    stats_file = tmp_path / "stats.json"
    stats_file.write_text(json.dumps(STATS))
    parser = argparse.ArgumentParser()
    agent_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        [
            "agent",
            "--broker-id",
            "b-cli",
            "--bootstrap-servers",
            kafka_bootstrap,
            "--provider",
            f"file:{stats_file}",
            "--nic-speed-mbps",
            "100",
            "--once",
            "--set",
            f"loadReportsTopic={topic}",
        ]
    )
    assert args.func(args) == 0
    (msg,) = read_all(kafka_bootstrap, topic, expected=1)
    report = decode_report(msg.value(), msg.key().decode())
    assert report.broker == "b-cli" and report.bundles == {B1}
    assert report.bandwidth_in.limit == pytest.approx(12_500.0)  # 100 Mbit/s in KB/s


def test_lbctl_agent_refuses_a_bad_provider_spec(kafka_bootstrap: str) -> None:
    parser = argparse.ArgumentParser()
    agent_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["agent", "--broker-id", "b", "--bootstrap-servers", kafka_bootstrap, "--provider", "ftp:x"]
    )
    assert args.func(args) == 2
