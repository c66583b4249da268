"""The stored placement policies reach the live placement paths: the controller's lookups (real
``controller.placement`` over real Redis) and the streaming job's policy cycle."""

from __future__ import annotations

import json

import redis

import streaming.decide as decide
from controller.placement import lookup_assign_event, put_load_snapshot
from lbctl.main import main
from loadbalance.config import LoadBalancerConfig
from loadbalance.cycle import CycleResult
from loadbalance.model import LocalBrokerData, ResourceUsage
from loadbalance.placement.policies import NamespaceIsolationPolicy
from loadbalance.report_codec import report_to_dict
from metadata_store.ownership_redis import RedisStore
from metadata_store.progress import Progress, RedisProgress

ISOLATED = "acme/iso"
SHARED = "acme/shared"
BROKERS = ("broker-00:8080", "broker-01:8080", "broker-02:8080", "broker-03:8080")
ISO = NamespaceIsolationPolicy(namespaces=("acme/iso.*",), primary=("broker-0[01]",))


def _broker(name: str) -> dict:
    r = LocalBrokerData(
        broker=name, cpu=ResourceUsage(10, 100), msg_rate_in=100, msg_throughput_in=100_000
    )
    return {"report": report_to_dict(r), "updatedAtMs": 0}


def _cluster(fresh_redis: redis.Redis, ttl_ms: dict[str, int] | None = None) -> RedisStore:
    store = RedisStore(fresh_redis, prefix="pp")
    for ns in (ISOLATED, SHARED):
        store.create_namespace(ns, 16)
    for b in BROKERS:
        store.register_broker(b, now_ms=0, ttl_ms=(ttl_ms or {}).get(b, 10**12))
    put_load_snapshot(store, {b: _broker(b) for b in BROKERS}, {})
    return store


def _owners(store: RedisStore, ns: str, cfg: LoadBalancerConfig, now_ms: int) -> set[str | None]:
    owners = set()
    for i in range(40):
        _, lease, _ = lookup_assign_event(store, f"persistent://{ns}/t{i}", cfg, now_ms)
        owners.add(lease.broker if lease else None)
    return owners


def test_lookups_of_an_isolated_namespace_land_only_on_its_primary_brokers(
    fresh_redis: redis.Redis,
) -> None:
    store = _cluster(fresh_redis)
    store.placement_policies.set_isolation_policy("use", "iso", ISO)
    cfg = LoadBalancerConfig()
    assert _owners(store, ISOLATED, cfg, 10) == {"broker-00:8080", "broker-01:8080"}
    # a namespace without a policy keeps off the isolated brokers (shared brokers only)
    assert _owners(store, SHARED, cfg, 10) == {"broker-02:8080", "broker-03:8080"}


def test_an_isolated_namespace_whose_primaries_are_gone_gets_no_owner(
    fresh_redis: redis.Redis,
) -> None:
    store = _cluster(fresh_redis, {"broker-00:8080": 5, "broker-01:8080": 5})
    store.placement_policies.set_isolation_policy("use", "iso", ISO)
    assert _owners(store, ISOLATED, LoadBalancerConfig(), 10) == {None}
    assert store.owners(ISOLATED, 10) == {}


def test_the_streaming_cycle_steps_over_the_stored_policies(
    fresh_redis: redis.Redis, redis_url: str, monkeypatch
) -> None:
    """The job's decision stage puts ``P:policies`` into the view of every cycle it runs."""
    config = LoadBalancerConfig(redisKeyPrefix="pp")
    RedisStore(fresh_redis, prefix="pp").placement_policies.set_isolation_policy("use", "iso", ISO)
    seen = []

    def step(state, view, config, **_kw):
        seen.append(view.policies)
        return state, CycleResult()

    class Sink:
        def __init__(self, *_a, **_kw) -> None: ...

        def send(self, *_a) -> None: ...

        def flush(self) -> None: ...

    monkeypatch.setattr(decide, "step", step)
    monkeypatch.setattr(decide, "KafkaSink", Sink)
    stage = decide.DecisionStage(config, "unused:9092", redis_url=redis_url)
    stage._start()
    stage._complete_cycle(Progress(0, 1000, cycle_pending=True), None)
    assert len(seen) == 1 and dict(seen[0].isolation) == {"iso": ISO}


def test_health_and_monitor_flag_an_isolated_namespace_whose_brokers_are_all_gone(
    fresh_redis: redis.Redis, redis_url: str, tmp_path, capsys
) -> None:
    """Accepted as Pulsar accepts it, but named by ``lbctl health`` and ``lbctl monitor``."""
    store = RedisStore(fresh_redis, prefix="pp")
    for ns in (ISOLATED, SHARED):
        store.create_namespace(ns, 4)
    server_ms = store.server_time_ms()
    store.register_broker("broker-02:8080", server_ms, 600_000)  # a shared broker, live
    store.register_broker("broker-00:8080", server_ms - 700_000, 1)  # a primary, long gone
    put_load_snapshot(store, {b: _broker(b) for b in BROKERS}, {})
    store.placement_policies.set_isolation_policy("use", "iso-a", ISO)

    argv = ["--redis-url", redis_url, "--set", "redisKeyPrefix=pp"]
    RedisProgress(fresh_redis, "pp").commit(Progress(batch=1, now_ms=1), {}, [], {}, [])
    code = main(["health", "stream", *argv, "--state-file", str(tmp_path / "s.json")])
    out = capsys.readouterr().out.splitlines()
    assert code == 0  # the job is making progress; the policy is not its fault
    flagged = [line for line in out if line.startswith("placement:")]
    assert len(flagged) == 1 and ISOLATED in flagged[0] and "iso-a" in flagged[0]

    code = main(["monitor", "--once", "--json", *argv])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    [problem] = doc["policyProblems"]
    assert ISOLATED in problem and "iso-a" in problem

    # a primary comes back: nothing to flag
    store.register_broker("broker-01:8080", store.server_time_ms(), 600_000)
    main(["health", "stream", *argv, "--state-file", str(tmp_path / "s.json")])
    assert "placement:" not in capsys.readouterr().out
