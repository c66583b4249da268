"""A policy cycle of the streaming job considers only the brokers live in the registry.

The job learns that a broker stopped reporting only when its report timeout passes, a cycle or
more after a graceful leave ended the broker's registration; until then a cycle that counted it
planned transfers to it, which the controller refused. What must hold:

* the pending record of a due cycle carries the registry's live brokers (read with Redis's own
  clock, as the controller judges registrations), and only for that batch, so a replay of the
  cycle sees the same set;
* the cycle's view keeps only those brokers; an empty registry (agents without Redis) keeps every
  reporting broker.
"""

from __future__ import annotations

import json

import numpy as np
import redis

from loadbalance.bundles import NamespaceBundles
from loadbalance.model import LocalBrokerData, ResourceUsage
from loadbalance.report_codec import encode_report
from metadata_store.keys import Keys
from metadata_store.ownership_redis import RedisStore
from metadata_store.progress import MemoryProgress, PendingCycle, RedisProgress
from streaming.driver_view import DriverView
from streaming.schema import BROKER, OUTPUT_FIELDS, frame

NS = "t/ns"


def _broker_rows(names: list[str]):
    docs = [
        encode_report(LocalBrokerData(broker=n, cpu=ResourceUsage(10.0 * (i + 1), 100))).decode()
        for i, n in enumerate(names)
    ]
    return frame(
        OUTPUT_FIELDS,
        len(names),
        kind=np.array([BROKER] * len(names), dtype=object),
        name=np.array(names, dtype=object),
        event_ms=np.full(len(names), 1_000, dtype=np.int64),
        history_usage=np.array([0.1 * (i + 1) for i in range(len(names))]),
        msg_throughput_ema=np.zeros(len(names)),
        doc=np.array(docs, dtype=object),
    )


def test_the_cycle_view_keeps_only_the_live_brokers_or_all_without_a_registry() -> None:
    view = DriverView()
    view.apply(_broker_rows(["b1", "b2", "b3"]))
    namespaces = {NS: NamespaceBundles.initial(NS, 4)}
    assert set(view.cluster_view(namespaces).brokers) == {"b1", "b2", "b3"}
    assert set(view.cluster_view(namespaces, ["b1", "b3"]).brokers) == {"b1", "b3"}
    assert set(view.cluster_view(namespaces, None).brokers) == {"b1", "b2", "b3"}


def test_the_pending_record_carries_the_registrys_live_brokers_for_its_batch_only(
    fresh_redis: redis.Redis,
) -> None:
    store = RedisStore(fresh_redis, "lb", clock="server")
    store.register_broker("b1", 0, 60_000)
    store.register_broker("b2", 0, 60_000)
    store.register_broker("gone", 0, 60_000)
    store.register_broker("gone", 0, 0)  # a graceful leave: the registration ends now
    progress = RedisProgress(fresh_redis, "lb")
    live = progress.read_live_brokers()
    assert live == ["b1", "b2"]
    namespaces = {NS: NamespaceBundles.initial(NS, 2)}
    progress.set_pending(7, namespaces, live)
    assert progress.pending(7) == PendingCycle(namespaces, ["b1", "b2"])
    assert progress.pending(8) is None  # another batch's record
    # a record written without brokers (an older job) means: no filter
    progress.set_pending(9, namespaces)
    assert progress.pending(9) == PendingCycle(namespaces, None)
    raw = fresh_redis.hgetall(Keys("lb").stream_pending())
    assert json.loads(raw[b"namespaces"]) and b"brokers" not in raw


def test_without_redis_every_reporting_broker_takes_part() -> None:
    progress = MemoryProgress()
    assert progress.read_live_brokers() == []
    progress.set_pending(1, {}, ["b1"])
    assert progress.pending(1) is None
