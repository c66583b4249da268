"""The agent beside a real Pulsar broker: a bad document never costs the broker its leases, the
broker's own readings win over the host's, and the NIC-speed knob works.

The lease tests run against a real Redis (the ``fresh_redis`` fixture starts one).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import redis

from infra import metrics
from loadbalance.config import LoadBalancerConfig, load_config
from loadbalance.errors import Transient
from loadbalance.model import (
    BROKER_LOAD_DATA,
    BUNDLE_SKIPPED,
    LOAD_REPORT,
    NO_BUNDLE_DATA,
    READING_IGNORED,
    ResourceUsage,
)
from metadata_store.ownership_redis import RedisStore
from producers import agent_cli
from producers.agent import Agent, LeaseKeeper, build_report
from producers.bundle_stats import BundleStatsSnapshot, FileStatsProvider, parse_stats_document
from producers.host_usage import HostUsage

NS = "public/default"
TTL_MS = 10_000
HOST_CPU = ResourceUsage(10.0, 200.0)
HOST_RAM = ResourceUsage(30_000.0, 64_000.0)  # host RAM in MB: not what Pulsar reports


class Host:
    def sample(self, now_ms: int) -> HostUsage:
        nic = ResourceUsage(100.0, 125_000.0)
        return HostUsage(HOST_CPU, HOST_RAM, ResourceUsage(0.0, 0.0), nic, nic)


class Sink:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def publish(self, broker_id: str, payload: bytes) -> None:
        self.sent.append(payload)


def _report(bundles: list[str]) -> dict:
    return {
        "webServiceUrl": "http://broker-a:8080",
        "cpu": {"usage": 150.0, "limit": 800.0},
        "memory": {"usage": 614.0, "limit": 1228.0},
        "directMemory": {"usage": 32.0, "limit": 1228.0},
        "bandwidthIn": {"usage": -1.0, "limit": -1.0},
        "bandwidthOut": {"usage": -1.0, "limit": -1.0},
        "bundles": bundles,
        "lastStats": {b: {"msgRateIn": 10.0, "topics": 1} for b in bundles},
        "loadReportType": "LocalBrokerData",
    }


def _counter(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_garbage_provider_never_stops_heartbeats_and_lease_renewal(
    fresh_redis: redis.Redis, tmp_path: Path
) -> None:
    store = RedisStore(fresh_redis, prefix="lb")
    store.create_namespace(NS, 4)
    b0, b1, _, _ = store.get_namespace(NS).bundle_names
    store.register_broker("broker-a", now_ms=0, ttl_ms=TTL_MS)
    store.acquire(b0, "broker-a", now_ms=0, ttl_ms=TTL_MS)
    store.acquire(b1, "broker-a", now_ms=0, ttl_ms=TTL_MS)
    path = tmp_path / "load-report.json"
    path.write_text(json.dumps(_report([b0, b1])))
    keeper = LeaseKeeper(store, "broker-a", registration_ttl_ms=TTL_MS, lease_ttl_ms=TTL_MS)
    sink = Sink()
    agent = Agent(
        LoadBalancerConfig(), "broker-a", Host(), FileStatsProvider(path), sink, lease_keeper=keeper
    )
    assert agent.tick(1_000)
    failures = _counter("lbctl_agent_provider_failures_total", reason="invalid")

    # the broker now writes garbage, check after check, far past every TTL
    for i, garbage in enumerate(["{not json", "[1, 2]", '{"lastStats": 7}', "null"] * 3):
        path.write_text(garbage)
        now = 6_000 + i * 5_000
        assert not agent.tick(now)
        assert store.live_brokers(now + 1) == ["broker-a"]
        assert store.owner(b0, now + 1).broker == "broker-a"
        assert store.owner(b1, now + 1).expires_at_ms == now + TTL_MS
    assert len(sink.sent) == 1  # nothing was published from a garbage document
    assert _counter("lbctl_agent_provider_failures_total", reason="invalid") == failures + 12

    # an unreachable provider (the broker may be down) skips the whole check: leases lapse
    path.unlink()
    last = 6_000 + 11 * 5_000
    for now in range(last + 5_000, last + 5_000 + 3 * TTL_MS, 5_000):
        assert not agent.tick(now)
    assert store.owner(b0, last + 3 * TTL_MS) is None
    assert store.live_brokers(last + 3 * TTL_MS) == []


def test_one_bad_bundle_entry_does_not_cost_the_other_leases(
    fresh_redis: redis.Redis, tmp_path: Path
) -> None:
    store = RedisStore(fresh_redis, prefix="lb")
    store.create_namespace(NS, 2)
    b0, b1 = store.get_namespace(NS).bundle_names
    store.register_broker("broker-a", now_ms=0, ttl_ms=TTL_MS)
    store.acquire(b0, "broker-a", now_ms=0, ttl_ms=TTL_MS)
    store.acquire(b1, "broker-a", now_ms=0, ttl_ms=TTL_MS)
    doc = _report([b0, b1])
    doc["bundles"].append("public/default/0xZZ_0x1")  # skipped and counted
    doc["lastStats"][b1]["msgRateIn"] = "fast"  # b1's stats ignored, b1 still owned
    doc["msgRateIn"] = "not read by the agent"  # broker totals are not the agent's business
    path = tmp_path / "load-report.json"
    path.write_text(json.dumps(doc))
    skipped = _counter("lbctl_report_issues_total", source="agent", kind=BUNDLE_SKIPPED)
    keeper = LeaseKeeper(store, "broker-a", registration_ttl_ms=TTL_MS, lease_ttl_ms=TTL_MS)
    sink = Sink()
    agent = Agent(
        LoadBalancerConfig(), "broker-a", Host(), FileStatsProvider(path), sink, lease_keeper=keeper
    )
    assert agent.tick(8_000)
    assert store.owner(b0, 8_000).expires_at_ms == 18_000
    assert store.owner(b1, 8_000).expires_at_ms == 18_000
    published = json.loads(sink.sent[0])
    assert sorted(published["bundles"]) == [b0, b1]
    assert list(published["lastStats"]) == [b0]
    assert _counter("lbctl_report_issues_total", source="agent", kind=BUNDLE_SKIPPED) == (
        skipped + 1
    )


def test_the_brokers_own_readings_win_over_the_host_readings() -> None:
    """A Pulsar broker reports JVM heap and Netty direct memory; psutil only knows host RAM.
    Unknown readings (-1) fall back to the host's."""
    snap = parse_stats_document(json.dumps(_report(["t/ns/0x00000000_0xffffffff"])), "test")
    assert snap.usage["memory"] == ResourceUsage(614.0, 1228.0)
    assert "bandwidth_in" not in snap.usage  # -1: unknown, the host's NIC reading is used
    r = build_report("broker-a", Host().sample(0), snap, 0)
    assert r.memory == ResourceUsage(614.0, 1228.0)
    assert r.direct_memory == ResourceUsage(32.0, 1228.0)
    assert r.cpu == ResourceUsage(150.0, 800.0)
    assert r.bandwidth_in == ResourceUsage(100.0, 125_000.0)
    # without a reading from the provider, the host's is used
    assert build_report("b", Host().sample(0), BundleStatsSnapshot(), 0).memory == HOST_RAM


def test_simple_and_extensible_documents_feed_the_agent() -> None:
    bundle = "my-tenant/my-namespace/0x4ccccccb_0x66666664"
    simple = {
        "name": "broker-1:8080",
        "loadReportType": "LoadReport",
        "systemResourceUsage": {"memory": {"usage": 152.0, "limit": 2096.0}},
        "bundleStats": {bundle: {"msgRateIn": 5.0, "consumerCount": 2, "topics": 1}},
    }
    snap = parse_stats_document(json.dumps(simple), "test")
    assert snap.report_type == LOAD_REPORT and snap.bundles == {bundle}
    assert snap.last_stats[bundle].consumer_count == 2
    assert snap.usage["memory"] == ResourceUsage(152.0, 2096.0)
    extensible = {"cpu": {"usage": 14.4, "limit": 800.0}, "bundleCount": 3, "topics": 3}
    snap = parse_stats_document(json.dumps(extensible), "test")
    assert snap.report_type == BROKER_LOAD_DATA and snap.bundles == frozenset()
    assert [i.kind for i in snap.issues] == [NO_BUNDLE_DATA]
    assert snap.usage["cpu"] == ResourceUsage(14.4, 800.0)


def test_a_broken_reading_is_ignored_and_the_hosts_is_used() -> None:
    doc = _report(["t/ns/0x00000000_0xffffffff"])
    doc["memory"] = {"usage": 5000.0, "limit": 100.0}  # 50x its limit: a broken sensor
    snap = parse_stats_document(json.dumps(doc), "test")
    assert "memory" not in snap.usage
    assert [(i.kind, i.field) for i in snap.issues] == [(READING_IGNORED, "memory.usage")]
    assert build_report("b", Host().sample(0), snap, 0).memory == HOST_RAM


def _agent_args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    agent_cli.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["agent", "--broker-id", "b", *extra])


def test_nic_speed_knob_works_and_the_agent_flag_overrides_it() -> None:
    config, warnings = load_config(conf_text="loadBalancerOverrideBrokerNicSpeedGbps=2.5\n")
    assert warnings == []
    assert config.load_balancer_override_broker_nic_speed_gbps == 2.5
    assert agent_cli.nic_speed_mbps(_agent_args(), config) == 2500.0
    assert agent_cli.nic_speed_mbps(_agent_args("--nic-speed-mbps", "400"), config) == 400.0
    assert agent_cli.nic_speed_mbps(_agent_args(), LoadBalancerConfig()) is None  # detect


def test_unreachable_provider_is_transient_not_a_report_problem(tmp_path: Path) -> None:
    with pytest.raises(Transient):
        FileStatsProvider(tmp_path / "absent.json").fetch()
