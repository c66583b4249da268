"""The agent keeps its broker registered and its reported bundles' leases alive in real Redis."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from types import MappingProxyType

import pytest
import redis

from loadbalance.config import LoadBalancerConfig
from loadbalance.model import NamespaceBundleStats, ResourceUsage
from metadata_store.ownership_redis import RedisStore
from producers import agent_cli
from producers.agent import Agent, LeaseKeeper, wall_clock_ms
from producers.bundle_stats import BundleStatsSnapshot
from producers.host_usage import HostUsage

pytestmark = pytest.mark.integration

NS = "public/default"
TTL_MS = 10_000


class Host:
    def sample(self, now_ms: int) -> HostUsage:
        r = ResourceUsage(10.0, 100.0)
        return HostUsage(r, r, ResourceUsage(), r, r)


class Stats:
    def __init__(self, bundles: list[str]) -> None:
        self.bundles = bundles

    def fetch(self) -> BundleStatsSnapshot:
        stats = {b: NamespaceBundleStats(msg_rate_in=1.0) for b in self.bundles}
        return BundleStatsSnapshot(frozenset(stats), MappingProxyType(stats))


class Sink:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def publish(self, broker_id: str, payload: bytes) -> None:
        self.sent.append(payload)


def test_agent_heartbeats_and_renews_only_the_leases_it_holds(fresh_redis: redis.Redis) -> None:
    store = RedisStore(fresh_redis, prefix="lb")
    store.create_namespace(NS, 4)
    b0, b1, b2, b3 = store.get_namespace(NS).bundle_names
    for broker in ("broker-a", "broker-b"):
        store.register_broker(broker, now_ms=0, ttl_ms=TTL_MS)
    store.acquire(b0, "broker-a", now_ms=0, ttl_ms=TTL_MS)
    store.acquire(b1, "broker-a", now_ms=0, ttl_ms=TTL_MS)
    theirs = store.acquire(b2, "broker-b", now_ms=0, ttl_ms=TTL_MS)

    keeper = LeaseKeeper(
        store, "broker-a", registration_ttl_ms=TTL_MS, lease_ttl_ms=TTL_MS, info={"v": 1}
    )
    # broker-a reports b0, b1, b2 (b2 is broker-b's in Redis) and b3 (nobody's)
    stats = Stats([b0, b1, b2, b3])
    agent = Agent(LoadBalancerConfig(), "broker-a", Host(), stats, Sink(), lease_keeper=keeper)
    assert agent.tick(8_000)
    assert store.owner(b0, 8_000).expires_at_ms == 18_000
    assert store.owner(b1, 8_000).expires_at_ms == 18_000
    assert store.owner(b2, 8_000) == theirs  # someone else's lease is left alone
    assert store.owner(b3, 8_000) is None  # reporting a bundle does not take it

    # later checks keep both the registration and the leases alive past the first TTL
    assert not agent.tick(13_000)
    assert store.live_brokers(20_000) == ["broker-a"]
    assert store.owner(b0, 20_000).broker == "broker-a"
    assert store.owner(b2, 20_000) is None  # broker-b did not renew and expired

    # a bundle the broker stops reporting is no longer renewed
    stats.bundles = [b0]
    agent.tick(18_000)
    assert store.owner(b0, 27_000) is not None
    assert store.owner(b1, 27_000) is None


def test_unknown_namespace_is_skipped_not_fatal(fresh_redis: redis.Redis) -> None:
    store = RedisStore(fresh_redis, prefix="lb")
    keeper = LeaseKeeper(store, "broker-a", registration_ttl_ms=TTL_MS, lease_ttl_ms=TTL_MS)
    assert keeper.heartbeat(["other/ns/0x00000000_0xffffffff"], now_ms=0) == {}
    assert store.live_brokers(1) == ["broker-a"]


def test_lbctl_agent_with_redis_url_registers_the_broker(
    fresh_redis: redis.Redis, redis_url: str, kafka_bootstrap: str, unique_topic: Callable[..., str]
) -> None:
    parser = argparse.ArgumentParser()
    agent_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        [
            "agent",
            "--broker-id",
            "broker-cli",
            "--bootstrap-servers",
            kafka_bootstrap,
            "--redis-url",
            redis_url,
            "--web-service-url",
            "http://broker-cli:8080",
            "--once",
            "--set",
            f"loadReportsTopic={unique_topic(prefix='agent-redis')}",
        ]
    )
    assert args.func(args) == 0
    store = RedisStore(fresh_redis, prefix="lb")
    assert store.live_brokers(wall_clock_ms()) == ["broker-cli"]
