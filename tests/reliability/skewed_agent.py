"""A broker agent in its own process with a skewed, drifting monotonic clock (test entry point).

Why a wrapper: the product's agent reads ``time.monotonic``; the real-time nemesis needs agents
whose clocks read ``offset + rate * time.monotonic()`` so that the serve-until rule is exercised
under skew and drift, and it needs their serving intervals afterwards. Nothing in the product
reads an injected clock: this module builds the product's ``Agent``, ``LeaseKeeper``,
``ServingTable`` and ``ServingHook`` with the skewed clock and runs ``Agent.run``.

The broker "serves" every bundle of the namespaces it holds a lease on (its provider lists all
current bundles, the keeper renews those it holds). On SIGTERM the agent stops and writes its
serving intervals (local clock) to ``--out`` as JSON.

``--never-stop`` gives the agent a serve-until rule with an endless TTL: it serves until a
renewal is refused or the store shows another owner, which is how the agent behaved before it
kept a deadline (the most generous reading of "logs renewal failed and carries on").

    python -m tests.reliability.skewed_agent --redis-url URL --broker-id b1 --namespace a/b \
        --offset 500 --rate 1.02 --out b1.json --set loadBalancerOwnershipLeaseTtlSeconds=2
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Callable

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from loadbalance.config import load_config
from loadbalance.model import ResourceUsage
from loadbalance.serving import ServingRule, ServingTable
from metadata_store.ownership_redis import RedisStore
from producers.agent import Agent, LeaseKeeper
from producers.bundle_stats import BundleStatsSnapshot
from producers.host_usage import HostUsage
from producers.serving_hook import ServingHook


class NamespaceBundles:
    """A provider listing every current bundle of the namespaces (what the broker would load)."""

    def __init__(self, store: RedisStore, namespaces: list[str]) -> None:
        self.store = store
        self.namespaces = namespaces

    def fetch(self) -> BundleStatsSnapshot:
        names: set[str] = set()
        for ns in self.namespaces:
            nb = self.store.get_namespace(ns)
            if nb is not None:
                names.update(nb.bundle_names)
        return BundleStatsSnapshot(bundles=frozenset(names))


class IdleHost:
    def sample(self, now_ms: int) -> HostUsage:
        u = ResourceUsage(0.0, 100.0)
        return HostUsage(u, u, u, u, u)


class NoPublisher:
    def publish(self, broker_id: str, payload: bytes) -> None:
        return None


def skewed_clock(offset: float, rate: float) -> Callable[[], float]:
    return lambda: offset + rate * time.monotonic()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--redis-url", required=True)
    p.add_argument("--prefix", default="lb")
    p.add_argument("--broker-id", required=True)
    p.add_argument("--namespace", action="append", required=True)
    p.add_argument("--offset", type=float, default=0.0)
    p.add_argument("--rate", type=float, default=1.0)
    p.add_argument("--out", required=True)
    p.add_argument("--serving-file", default="")
    p.add_argument("--never-stop", action="store_true")
    p.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE")
    args = p.parse_args()
    logging.basicConfig(level=logging.ERROR)
    config, _ = load_config(overrides=dict(s.split("=", 1) for s in args.set))
    client = redis.Redis.from_url(
        args.redis_url, socket_timeout=0.5, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0)
    )
    store = RedisStore(client, args.prefix, clock="server")
    monotonic = skewed_clock(args.offset, args.rate)
    rule = ServingRule.from_config(config)
    if args.never_stop:
        rule = ServingRule(ttl_s=1e9, drift_bound=0.0, stop_margin_s=0.0)
    table = ServingTable(args.broker_id, rule)
    keeper = LeaseKeeper(
        store,
        args.broker_id,
        registration_ttl_ms=int(config.load_balancer_broker_registration_ttl_seconds * 1000),
        lease_ttl_ms=int(config.load_balancer_ownership_lease_ttl_seconds * 1000),
        serving=table,
        monotonic=monotonic,
    )
    agent = Agent(
        config,
        args.broker_id,
        IdleHost(),
        NamespaceBundles(store, args.namespace),
        NoPublisher(),
        lease_keeper=keeper,
        serving_hook=ServingHook(args.serving_file or None, monotonic),
    )
    print(json.dumps({"ready": args.broker_id, "local": monotonic()}), flush=True)
    agent.run()
    table.stop_all(monotonic())  # the broker goes down with its agent here
    doc = {"broker": args.broker_id, "intervals": [i.to_json() for i in table.intervals()]}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
