"""The agent's lease keeper on real Redis: what it renews, what a failed renewal does, and the
serve-until deadlines it feeds.

Why: the store refuses a renewal by the wrong broker or with a stale token, so a keeper that
asks for too much is invisible in the store's state; what it answers (bundle -> renewed) is
what the agent counts and logs as lost leases, and what a serve-until rule acts on. A keeper
that dies when Redis is away stops the broker's reports with it. Each test fails when its one
guard in ``producers/agent.py`` is removed (``tests/safety/mutants_agent.py``).
"""

from __future__ import annotations

import socket
from types import MappingProxyType

import pytest
import redis

from infra import metrics
from loadbalance.config import LoadBalancerConfig
from loadbalance.model import NamespaceBundleStats, ResourceUsage
from loadbalance.serving import ServingRule, ServingTable
from metadata_store.ownership_redis import RedisStore
from producers.agent import Agent, LeaseKeeper
from producers.bundle_stats import BundleStatsSnapshot
from producers.host_usage import HostUsage

NS = "acme/agent"
TTL_MS = 10_000
REGISTRATION_TTL_MS = 60_000


def test_the_keeper_renews_only_what_its_broker_holds(fresh_redis: redis.Redis) -> None:
    """b0 is ours, b1 another broker's, b2 nobody's: the keeper asks to renew b0 alone, by the
    lease TTL (not the registration's), and leaves b1 exactly as it was."""
    store = RedisStore(fresh_redis, prefix="keep")
    store.create_namespace(NS, 4)
    b0, b1, b2, _ = store.get_namespace(NS).bundle_names
    for broker in ("mine", "theirs"):
        store.register_broker(broker, now_ms=0, ttl_ms=REGISTRATION_TTL_MS)
    mine = store.acquire(b0, "mine", now_ms=0, ttl_ms=TTL_MS)
    theirs = store.acquire(b1, "theirs", now_ms=0, ttl_ms=TTL_MS)
    keeper = LeaseKeeper(store, "mine", REGISTRATION_TTL_MS, TTL_MS)
    assert keeper.held_leases([b0, b1, b2], now_ms=5_000) == {b0: mine.token}
    assert keeper.heartbeat([b0, b1, b2], now_ms=5_000) == {b0: True}
    assert store.owner(b0, 5_000).expires_at_ms == 5_000 + TTL_MS
    assert store.owner(b1, 5_000) == theirs
    assert store.owner(b2, 5_000) is None


class _Host:
    def sample(self, now_ms: int) -> HostUsage:
        r = ResourceUsage(10.0, 100.0)
        return HostUsage(r, r, ResourceUsage(), r, r)


class _Stats:
    def fetch(self) -> BundleStatsSnapshot:
        stats = {f"{NS}/0x00000000_0x40000000": NamespaceBundleStats(msg_rate_in=1.0)}
        return BundleStatsSnapshot(frozenset(stats), MappingProxyType(stats))


class _Sink:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def publish(self, broker_id: str, payload: bytes) -> None:
        self.sent.append(payload)


def _closed_port() -> int:
    """A loopback port nothing listens on: a connection to it is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_failed_renewal_is_counted_and_the_agent_keeps_reporting() -> None:
    """Redis refuses the connection: the check still publishes its report, counts the failed
    renewal, and the next check tries again (the broker's leases lapse on their own)."""
    client = redis.Redis(port=_closed_port(), socket_connect_timeout=0.5)
    keeper = LeaseKeeper(RedisStore(client, prefix="keep"), "mine", REGISTRATION_TTL_MS, TTL_MS)
    sink = _Sink()
    agent = Agent(LoadBalancerConfig(), "mine", _Host(), _Stats(), sink, lease_keeper=keeper)
    sample = ("lbctl_lease_renewals_total", {"result": "failed"})
    before = metrics.REGISTRY.get_sample_value(*sample) or 0.0
    assert agent.tick(1_000), "the report is published although Redis is away"
    agent.tick(100_000)
    assert len(sink.sent) >= 1
    assert metrics.REGISTRY.get_sample_value(*sample) == before + 2, "both checks tried again"


# -- the serve-until rule, as the keeper feeds it ----------------------------------------------
RULE = ServingRule(ttl_s=10.0, drift_bound=0.01, stop_margin_s=0.5)


class _Clock:
    """The broker's monotonic clock, set by the test; a renewal takes ``RENEWAL_S`` of it."""

    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


RENEWAL_S = 2.0


def _serving_keeper(client: redis.Redis) -> tuple[RedisStore, LeaseKeeper, _Clock, str, int]:
    """A keeper of broker ``mine`` with a serving table, and the bundle it holds, renewed once:
    sent at 10 s, answered at 12 s, so it serves from 12 s until 10 + 9.9 - 0.5 = 19.4 s."""
    store = RedisStore(client, prefix="serve")
    store.create_namespace(NS, 2)
    for broker in ("mine", "theirs"):
        store.register_broker(broker, now_ms=0, ttl_ms=REGISTRATION_TTL_MS)
    bundle = store.get_namespace(NS).bundle_names[0]
    lease = store.acquire(bundle, "mine", now_ms=0, ttl_ms=TTL_MS)
    clock = _Clock()
    real_renew = store.renew_leases

    def slow_renew(*args: object, **kwargs: object) -> object:
        clock.now += RENEWAL_S
        return real_renew(*args, **kwargs)  # type: ignore[arg-type]

    store.renew_leases = slow_renew  # type: ignore[method-assign]
    keeper = LeaseKeeper(store, "mine", REGISTRATION_TTL_MS, TTL_MS,
                         serving=ServingTable("mine", RULE), monotonic=clock)  # fmt: skip
    assert keeper.heartbeat([bundle], now_ms=1_000) == {bundle: True}
    return store, keeper, clock, bundle, lease.token


def test_the_keeper_serves_from_the_reply_until_the_deadline_of_the_send_time(
    fresh_redis: redis.Redis,
) -> None:
    """t0 is read before the renewal is sent: the store ran it at or after t0, never after the
    reply, so counting from the reply would serve past a lease that may have lapsed."""
    _, keeper, _, bundle, token = _serving_keeper(fresh_redis)
    table = keeper.serving
    assert table is not None
    (st,) = table.status(15.0)
    assert (st.bundle, st.token, st.serving) == (bundle, token, True)
    assert st.renew_requested_at == 10.0
    assert st.serve_until == pytest.approx(19.4)
    assert not table.serving(bundle, 11.0), "not before the reply"
    assert table.serving(bundle, 19.3) and not table.serving(bundle, 19.4)


def test_a_refused_renewal_stops_serving_at_once(fresh_redis: redis.Redis) -> None:
    """The lease moves to another broker between the keeper's read and its renewal: the store
    refuses the renewal, and the broker must stop serving when the reply says so (16 s), not
    at the deadline of its previous renewal (19.4 s)."""
    store, keeper, clock, bundle, token = _serving_keeper(fresh_redis)
    table = keeper.serving
    assert table is not None
    real_owners = store.owners

    def owners_then_moved(ns: str, now_ms: int):  # type: ignore[no-untyped-def]
        got = real_owners(ns, now_ms)
        RedisStore(fresh_redis, prefix="serve").transfer(bundle, "mine", token, "theirs",
                                                         now_ms, TTL_MS)  # fmt: skip
        return got

    store.owners = owners_then_moved  # type: ignore[method-assign]
    clock.now = 14.0
    assert keeper.heartbeat([bundle], now_ms=2_000) == {bundle: False}
    assert not table.serving(bundle, 16.0) and table.bundles() == []
    assert [(i.start, i.end) for i in table.intervals()] == [(12.0, 16.0)]


def test_a_bundle_moved_away_stops_being_served_at_the_next_check(
    fresh_redis: redis.Redis,
) -> None:
    """The controller moved the bundle: the keeper no longer holds it, so the next check stops
    serving it when it reads the owners (14 s), without waiting for its old deadline."""
    store, keeper, clock, bundle, token = _serving_keeper(fresh_redis)
    table = keeper.serving
    assert table is not None
    store.transfer(bundle, "mine", token, "theirs", now_ms=1_500, ttl_ms=TTL_MS)
    clock.now = 14.0
    assert keeper.heartbeat([bundle], now_ms=2_000) == {}
    assert not table.serving(bundle, 14.0) and table.bundles() == []
    assert [(i.start, i.end) for i in table.intervals()] == [(12.0, 14.0)]
