"""Pulsar's report update rule (``needBrokerDataUpdate``) and the agent's tick on a fake clock."""

from __future__ import annotations

import math
import os
import signal
import threading
from dataclasses import replace
from types import MappingProxyType

import pytest

from loadbalance.config import LoadBalancerConfig
from loadbalance.errors import Transient
from loadbalance.model import LocalBrokerData, NamespaceBundleStats, ResourceUsage
from loadbalance.report_codec import decode_report
from loadbalance.report_rule import ReportUpdateRule, max_percent_change, percent_change
from producers.agent import Agent, build_report
from producers.bundle_stats import BundleStatsSnapshot
from producers.host_usage import HostUsage

RULE = ReportUpdateRule(min_interval_ms=5_000, max_interval_ms=15 * 60_000, threshold_percentage=10)
B1 = "t/ns/0x00000000_0x80000000"
B2 = "t/ns/0x80000000_0xffffffff"


def report(
    cpu: float = 50.0,
    rate_in: float = 100.0,
    rate_out: float = 100.0,
    tput_in: float = 1000.0,
    tput_out: float = 1000.0,
    bundles: int = 2,
) -> LocalBrokerData:
    return LocalBrokerData(
        broker="b1",
        cpu=ResourceUsage(cpu, 100.0),
        msg_rate_in=rate_in,
        msg_rate_out=rate_out,
        msg_throughput_in=tput_in,
        msg_throughput_out=tput_out,
        num_bundles=bundles,
    )


def test_percent_change_from_zero_is_infinite_and_zero_to_zero_is_none() -> None:
    assert percent_change(0, 5) == math.inf
    assert percent_change(0, 0) == 0.0
    assert percent_change(100, 111) == pytest.approx(11.0)
    assert percent_change(100, 89) == pytest.approx(11.0)


def test_first_report_is_always_published() -> None:
    v = RULE.verdict(None, None, report(), now_ms=0)
    assert v.publish and v.reason == "first report"


def test_check_due_only_after_the_min_interval() -> None:
    assert RULE.check_due(None, 0)
    assert not RULE.check_due(10_000, 14_999)
    assert RULE.check_due(10_000, 15_000)
    assert RULE.check_due(10_000, 2_000)  # the wall clock stepped back: do not go silent


def test_no_change_within_max_interval_is_not_published() -> None:
    v = RULE.verdict(report(), 0, report(), now_ms=60_000)
    assert not v.publish and v.max_change_percent == 0.0


@pytest.mark.parametrize(
    ("changed", "small"),
    [
        (report(cpu=61.0), report(cpu=59.0)),  # absolute points of max usage: 11 vs 9
        (report(rate_in=123.0), report(rate_in=118.0)),  # rate 200 -> 223 (11.5 %) vs 9 %
        (report(tput_out=1300.0), report(tput_out=1150.0)),  # throughput 15 % vs 7.5 %
        (report(bundles=3), report(bundles=2)),  # 2 -> 3 bundles is 50 %
    ],
    ids=["max_resource_usage", "msg_rate", "msg_throughput", "num_bundles"],
)
def test_publishes_on_more_than_threshold_change_of_each_figure(
    changed: LocalBrokerData, small: LocalBrokerData
) -> None:
    assert RULE.verdict(report(), 0, changed, now_ms=5_000).publish
    assert not RULE.verdict(report(), 0, small, now_ms=5_000).publish


def test_resource_usage_change_is_in_absolute_points_not_relative() -> None:
    # 80 % -> 88 % is 10 % relative but only 8 points: no publish
    assert max_percent_change(report(cpu=80.0), report(cpu=88.0)) == pytest.approx(8.0)
    assert not RULE.verdict(report(cpu=80.0), 0, report(cpu=88.0), now_ms=5_000).publish


def test_zero_to_something_counts_as_infinite_change() -> None:
    idle = report(rate_in=0, rate_out=0, tput_in=0, tput_out=0, bundles=0)
    busy = replace(idle, msg_rate_in=0.001)
    v = RULE.verdict(idle, 0, busy, now_ms=5_000)
    assert v.publish and v.max_change_percent == math.inf
    assert not RULE.verdict(idle, 0, idle, now_ms=5_000).publish


def test_publishes_after_max_interval_without_change() -> None:
    assert not RULE.verdict(report(), 0, report(), now_ms=15 * 60_000).publish
    assert RULE.verdict(report(), 0, report(), now_ms=15 * 60_000 + 1).publish


def test_rule_reads_pulsar_knobs_from_config() -> None:
    config = LoadBalancerConfig(
        **{
            "loadBalancerReportUpdateMinIntervalMillis": 1000,
            "loadBalancerReportUpdateMaxIntervalMinutes": 2,
            "loadBalancerReportUpdateThresholdPercentage": 5,
        }
    )
    assert ReportUpdateRule.from_config(config) == ReportUpdateRule(1000, 120_000, 5.0)


# -- the agent's tick, driven by a fake clock ---------------------------------------------------


class FakeUsage:
    def __init__(self) -> None:
        self.cpu = 10.0

    def sample(self, now_ms: int) -> HostUsage:
        z = ResourceUsage(0.0, 0.0)
        return HostUsage(ResourceUsage(self.cpu, 200.0), ResourceUsage(100, 1000), z, z, z)


class FakeStats:
    def __init__(self) -> None:
        self.rate = 100.0
        self.fail = False

    def fetch(self) -> BundleStatsSnapshot:
        if self.fail:
            raise Transient("broker down")
        stats = {
            B1: NamespaceBundleStats(msg_rate_in=self.rate, topics=3, producer_count=2),
            B2: NamespaceBundleStats(msg_rate_out=50.0, topics=1, consumer_count=4),
        }
        return BundleStatsSnapshot(frozenset(stats), MappingProxyType(stats))


class FakePublisher:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []
        self.fail = False

    def publish(self, broker_id: str, payload: bytes) -> None:
        if self.fail:
            raise Transient("kafka down")
        self.sent.append((broker_id, payload))


def make_agent() -> tuple[Agent, FakeUsage, FakeStats, FakePublisher]:
    usage, stats, pub = FakeUsage(), FakeStats(), FakePublisher()
    agent = Agent(LoadBalancerConfig(), "b1", usage, stats, pub, clock=lambda: 0)
    return agent, usage, stats, pub


def test_build_report_sums_bundle_stats_into_broker_totals() -> None:
    r = build_report("b1", FakeUsage().sample(0), FakeStats().fetch(), 42)
    assert (r.num_bundles, r.num_topics, r.num_producers, r.num_consumers) == (2, 4, 2, 4)
    assert (r.msg_rate_in, r.msg_rate_out, r.last_update_ms) == (100.0, 50.0, 42)


def test_agent_publishes_first_then_only_on_change_or_max_interval() -> None:
    agent, usage, stats, pub = make_agent()
    assert agent.tick(1_000)  # first report
    assert not agent.tick(3_000)  # before the min interval: not even checked
    assert agent.last_check_ms == 1_000
    assert not agent.tick(6_000)  # checked, nothing moved
    stats.rate = 130.0  # 150 -> 180 msg/s total: 20 %
    assert agent.tick(11_000)
    usage.cpu = 20.0  # 5 % -> 10 %: 5 points, under the threshold
    assert not agent.tick(16_000)
    assert agent.tick(11_000 + 15 * 60_000 + 1)  # max interval passed
    assert len(pub.sent) == 3
    key, payload = pub.sent[1]
    decoded = decode_report(payload, key)
    assert key == "b1" and decoded.msg_rate_in == 130.0 and decoded.bundles == {B1, B2}


def test_agent_skips_check_when_provider_fails_and_retries_unpublished_reports() -> None:
    agent, _usage, stats, pub = make_agent()
    stats.fail = True
    assert not agent.tick(0)
    stats.fail = False
    pub.fail = True
    assert not agent.tick(5_000)  # the first report failed to deliver ...
    pub.fail = False
    assert agent.tick(10_000)  # ... so the next check still counts as the first
    assert agent.published_count == 1


def test_run_once_publishes_the_first_report_and_returns_zero() -> None:
    agent, _usage, _stats, pub = make_agent()
    assert agent.run(once=True) == 0
    assert len(pub.sent) == 1


def test_run_stops_cleanly_on_sigterm() -> None:
    agent, _usage, _stats, pub = make_agent()
    before = signal.getsignal(signal.SIGTERM)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        assert agent.run() == 0  # would otherwise wait 5 s for the next check, forever
    finally:
        timer.cancel()
    assert len(pub.sent) == 1
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is put back
