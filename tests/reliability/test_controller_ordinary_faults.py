"""The running control loop survives every ordinary fault and loses nothing.

Each case injects one fault into a running ``run_loop`` (real Redis, the embedded Kafka) while a
decision waits and two leases have expired, then clears it, and checks what a follower and an
operator see: the loop kept running, the decision was not committed while it was held and is
applied once afterwards, every expired lease has its ``expired`` event before its bundle's
``assigned`` event, and every bundle that can be placed was placed again.

Real faults where they are cheap: READONLY and MASTERDOWN (the Redis made a replica of a port
nobody listens on), OOM (``maxmemory 1``), BUSY (a busy-looping script on another connection),
the destination's registration lapsing and the bundle split between the sweep's view and its
acquire (``_RacingStore`` changes Redis right before the acquire), malformed lease keys. LOADING
and a dropped connection are raised by a thin client wrapper (``FaultyRedis``) with redis-py's
own exception classes, since a real one cannot be held open on demand.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from confluent_kafka import Consumer, Producer, TopicPartition
from redis.client import Pipeline

from controller.apply import APPLIED, outcome_of
from controller.events import ASSIGNED, EXPIRED, RELEASED
from controller.loop import LoopStats, run_loop
from controller.placement import put_load_snapshot
from infra import metrics
from loadbalance.config import LoadBalancerConfig
from loadbalance.decisions import UNLOAD, encode_decision, make_decision
from loadbalance.model import LocalBrokerData, ResourceUsage
from loadbalance.report_codec import report_to_dict
from metadata_store.ownership_redis import RedisStore
from tests.integration.test_assignment import read_events
from tests.reliability.invariants import wait_for

pytestmark = pytest.mark.integration

NS = "acme/faults"
NOW = 10_000
LONG_MS = 10**13
FAULT_HELD_S = 2.0


def _load(name: str) -> dict:
    r = LocalBrokerData(broker=name, cpu=ResourceUsage(10, 100), msg_rate_in=10)
    return {"report": report_to_dict(r), "updatedAtMs": 0}


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FaultyRedis(redis.Redis):
    """A client that raises ``fault()`` instead of sending any command while ``fault`` is set
    (pipelines included): the exact redis-py class a real reply or a dropped connection gives."""

    fault: Callable[[], Exception] | None = None
    raised = 0

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self._maybe_fail()
        return super().execute_command(*args, **options)

    def _maybe_fail(self) -> None:
        fault = self.fault
        if fault is not None:
            self.raised += 1
            raise fault()

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Pipeline:
        return _FaultyPipeline(self, transaction, shard_hint)


class _FaultyPipeline(Pipeline):
    def __init__(self, owner: FaultyRedis, transaction: bool, shard_hint: Any) -> None:
        super().__init__(owner.connection_pool, owner.response_callbacks, transaction, shard_hint)
        self.owner = owner

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        self.owner._maybe_fail()
        return super().execute(raise_on_error)


class _RacingStore(RedisStore):
    """Runs ``race(bundle)`` once, right before the first placement acquire of ``bundle``:
    what another process (an expiring registration, an operator's split) does between the
    sweep's view and its acquire."""

    race: Callable[[str], None] | None = None
    target = ""

    def acquire_placed(self, bundle: Any, broker: str, *args: Any, **kw: Any) -> Any:
        if self.race is not None and str(bundle) == self.target:
            race, self.race = self.race, None
            race(broker)
        return super().acquire_placed(bundle, broker, *args, **kw)


@dataclass
class Scene:
    """The store before the fault: two bundles on a broker whose leases expired, one live
    lease the waiting decision unloads, one free bundle."""

    store: RedisStore
    admin: redis.Redis
    names: list[str]
    doomed: dict[str, int] = field(default_factory=dict)  # bundle -> its expired token


def _scene(url: str, client: redis.Redis, prefix: str, store_cls: type = RedisStore) -> Scene:
    admin = redis.Redis.from_url(url)
    admin.flushall()
    store = store_cls(client, prefix=prefix)
    store.create_namespace(NS, 4)
    for b in ("b1", "b2"):
        store.register_broker(b, now_ms=0, ttl_ms=LONG_MS)
    store.register_broker("gone", now_ms=0, ttl_ms=LONG_MS)
    put_load_snapshot(store, {"b1": _load("b1"), "b2": _load("b2")}, {})
    names = store.get_namespace(NS).bundle_names
    scene = Scene(store, admin, names)
    for b in names[:2]:
        scene.doomed[b] = store.acquire(b, "gone", now_ms=0, ttl_ms=NOW // 2).token
    store.acquire(names[2], "b1", now_ms=0, ttl_ms=LONG_MS)
    return scene


@dataclass
class Fault:
    """How to start and clear one fault, and what it is expected to leave behind."""

    start: Callable[[Scene], None]
    clear: Callable[[Scene], None]
    holds_decisions: bool = True  # a Redis fault holds the waiting decision un-committed
    not_reassigned: tuple[int, ...] = ()  # doomed bundles (by index) that no longer exist
    client: str = "plain"  # "faulty": the store's client is a FaultyRedis
    store_cls: type = RedisStore
    kinds: tuple[str, ...] = ()  # lbctl_control_redis_faults_total kinds it must have counted


def _replica_of_nowhere(stale: str) -> Callable[[Scene], None]:
    def start(s: Scene) -> None:
        s.admin.config_set("replica-serve-stale-data", stale)
        s.admin.execute_command("REPLICAOF", "127.0.0.1", str(_dead_port()))

    return start


def _master_again(s: Scene) -> None:
    s.admin.execute_command("REPLICAOF", "NO", "ONE")
    s.admin.config_set("replica-serve-stale-data", "yes")


_busy_threads: list[threading.Thread] = []


def _busy_start(s: Scene) -> None:
    s.admin.config_set("busy-reply-threshold", 50)
    looper = redis.Redis(connection_pool=redis.ConnectionPool.from_url(_url_of(s.admin)))

    def loop() -> None:
        try:
            looper.eval("local i = 0 while true do i = i + 1 end", 0)
        except redis.RedisError:
            pass  # killed by SCRIPT KILL
        finally:
            looper.close()

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    _busy_threads.append(t)
    time.sleep(0.3)


def _busy_clear(s: Scene) -> None:
    wait_for("the busy script killed", lambda: _script_kill(s.admin), 10)
    _busy_threads.pop().join(10)
    wait_for("Redis answers again", lambda: _answers(s.admin), 10)
    s.admin.config_set("busy-reply-threshold", 5000)


def _script_kill(r: redis.Redis) -> bool:
    try:
        r.script_kill()
    except redis.ResponseError as e:
        return "NOTBUSY" in str(e)
    return True


def _answers(r: redis.Redis) -> bool:
    try:
        return bool(r.ping())
    except redis.ResponseError:  # BUSY until the killed script has stopped
        return False


def _url_of(r: redis.Redis) -> str:
    kw = r.connection_pool.connection_kwargs
    return f"redis://{kw['host']}:{kw['port']}/0"


def _oom_start(s: Scene) -> None:
    s.admin.config_set("maxmemory-policy", "noeviction")
    s.admin.config_set("maxmemory", 1)


def _oom_clear(s: Scene) -> None:
    s.admin.config_set("maxmemory", 0)


def _wrapper(make: Callable[[], Exception]) -> Callable[[Scene], None]:
    def start(s: Scene) -> None:
        s.store.r.fault = make  # type: ignore[attr-defined]

    return start


def _wrapper_clear(s: Scene) -> None:
    s.store.r.fault = None  # type: ignore[attr-defined]


def _race(action: Callable[[Scene, str], None]) -> Callable[[Scene], None]:
    def start(s: Scene) -> None:
        store = s.store
        assert isinstance(store, _RacingStore)
        store.target = s.names[0]
        store.race = lambda dest: action(s, dest)

    return start


def _lapse(s: Scene, dest: str) -> None:
    s.store.register_broker(dest, now_ms=0, ttl_ms=1)  # its registration ended before NOW


def _split(s: Scene, _dest: str) -> None:
    s.store.split_bundle(s.names[0], [0x20000000])


def _malformed_string(s: Scene) -> None:
    s.admin.set(s.store.keys.lease(s.names[3]), "not a lease")


def _malformed_hash(s: Scene) -> None:
    s.admin.hset(s.store.keys.lease(s.names[3]), mapping={"broker": "b9", "token": 3})


def _nothing(_s: Scene) -> None:
    pass


FAULTS: dict[str, Fault] = {
    "readonly": Fault(_replica_of_nowhere("yes"), _master_again, kinds=("readonly",)),
    "masterdown": Fault(_replica_of_nowhere("no"), _master_again, kinds=("masterdown",)),
    "oom": Fault(_oom_start, _oom_clear, kinds=("oom",)),
    "busy": Fault(_busy_start, _busy_clear, kinds=("busy",)),
    "loading": Fault(
        _wrapper(lambda: redis.BusyLoadingError("Redis is loading the dataset in memory")),
        _wrapper_clear,
        client="faulty",
        kinds=("loading",),
    ),
    "connection": Fault(
        _wrapper(lambda: redis.ConnectionError("Connection closed by server.")),
        _wrapper_clear,
        client="faulty",
        kinds=("connection",),
    ),
    "broker_not_alive": Fault(
        _race(_lapse), _nothing, holds_decisions=False, store_cls=_RacingStore
    ),
    "split": Fault(
        _race(_split), _nothing, holds_decisions=False, not_reassigned=(0,), store_cls=_RacingStore
    ),
    "string_key": Fault(_malformed_string, _nothing, holds_decisions=False),
    "hash_without_expires": Fault(_malformed_hash, _nothing, holds_decisions=False),
}


def _committed(bootstrap: str, group: str, topic: str) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        [tp] = c.committed([TopicPartition(topic, 0)], timeout=10)
        return int(tp.offset)
    finally:
        c.close()


def _faults_counted() -> dict[str, float]:
    """``lbctl_control_redis_faults_total`` by kind."""
    return {
        sample.labels["kind"]: sample.value
        for family in metrics.REGISTRY.collect()
        if family.name == "lbctl_control_redis_faults"
        for sample in family.samples
        if sample.name == "lbctl_control_redis_faults_total"
    }


@pytest.fixture
def clean_redis(redis_url: str) -> Iterator[str]:
    """The session Redis, put back to a writable master with no memory limit afterwards."""
    yield redis_url
    r = redis.Redis.from_url(redis_url)
    _script_kill(r)
    r.execute_command("REPLICAOF", "NO", "ONE")
    r.config_set("replica-serve-stale-data", "yes")
    r.config_set("maxmemory", 0)
    r.config_set("busy-reply-threshold", 5000)
    r.close()


@pytest.mark.parametrize("kind", list(FAULTS))
def test_the_running_loop_survives_the_fault_and_loses_nothing(
    kind: str, kafka_bootstrap: str, unique_topic, clean_redis: str
) -> None:
    fault = FAULTS[kind]
    decisions, events = unique_topic(1, "decisions"), unique_topic(1, "events")
    client = (FaultyRedis if fault.client == "faulty" else redis.Redis).from_url(clean_redis)
    s = _scene(clean_redis, client, f"f{kind[:6]}", fault.store_cls)
    unload = make_decision(cycle="1", kind=UNLOAD, bundle=s.names[2], source_broker="b1",
                           reason="Overloaded")  # fmt: skip
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    p.produce(decisions, value=encode_decision(unload))
    p.flush(10)
    group = f"ctl-{kind}"
    result: dict[str, Any] = {}
    before = _faults_counted()

    def run() -> None:
        try:
            result["stats"] = run_loop(
                s.store, client_config={"bootstrap.servers": kafka_bootstrap},
                decisions_topic=decisions, events_topic=events, group_id=group,
                max_messages=2, clock=lambda: NOW, config=LoadBalancerConfig(),
                sweep_interval_s=0.1,
            )  # fmt: skip
        except BaseException as e:  # the test reports it
            result["error"] = e

    fault.start(s)
    loop = threading.Thread(target=run, daemon=True)
    loop.start()
    try:
        time.sleep(FAULT_HELD_S + 4.0)  # the group join (~3 s), then the fault hits
        assert loop.is_alive(), f"the loop ended during the fault: {result.get('error')!r}"
        if fault.holds_decisions:
            assert _committed(kafka_bootstrap, group, decisions) < 1, "held record committed"
    finally:
        fault.clear(s)
    check = redis.Redis.from_url(clean_redis)
    wait_for("the decision applied", lambda: outcome_of(s.store, unload.id) is not None, 30)
    placeable = [b for i, b in enumerate(s.names[:2]) if i not in fault.not_reassigned]
    wait_for(
        "the expired bundles placed again",
        lambda: all(s.store.owner(b, NOW) is not None for b in placeable),
        30,
    )
    assert loop.is_alive(), f"the loop ended: {result.get('error')!r}"
    p.produce(decisions, value=encode_decision(unload))  # the second record ends the run
    p.flush(10)
    loop.join(60)
    assert not loop.is_alive() and "error" not in result, result.get("error")
    stats: LoopStats = result["stats"]
    assert stats.consumed == 2 and stats.applied == 1 and stats.other == 1
    assert outcome_of(s.store, unload.id).outcome == APPLIED
    assert _committed(kafka_bootstrap, group, decisions) == 2
    seen = [e for _, e in read_events(kafka_bootstrap, events)]
    kinds = [(e.event, e.bundle) for e in seen]
    assert kinds.count((RELEASED, s.names[2])) == 1
    for i, (b, token) in enumerate(s.doomed.items()):
        expired = [j for j, e in enumerate(seen) if e.event == EXPIRED and e.bundle == b]
        assert len(expired) == 1, f"{b}: expired events {kinds}"
        assert seen[expired[0]].old_owner == "gone" and seen[expired[0]].old_token == token
        assigned = [j for j, e in enumerate(seen) if e.event == ASSIGNED and e.bundle == b]
        if i in fault.not_reassigned:
            assert assigned == []
            continue
        assert len(assigned) == 1 and assigned[0] > expired[0], kinds
        owner = s.store.owner(b, NOW)
        assert owner is not None and owner.token == seen[assigned[0]].new_token
        assert owner.broker in ("b1", "b2")
    counted = _faults_counted()
    for k in fault.kinds:
        assert counted.get(k, 0.0) > before.get(k, 0.0), f"{k} reached the loop and was counted"
    if kind in ("string_key", "hash_without_expires"):
        assert check.exists(s.store.keys.lease(s.names[3])), "a malformed key is left alone"
    check.close()
    s.admin.close()
    client.close()
