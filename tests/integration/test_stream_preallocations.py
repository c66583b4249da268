"""A policy cycle of the streaming job sees the lookups' placements not reported yet.

A lookup records a preallocation with the lease it takes (``P:prealloc:<broker>``); the owner's
report lists the bundle up to a report interval later. The cycle's view carries those entries
(``view.preallocated``) so our shedder does not read a round of reports half before and half after
a lookup burst as uneven (``UsageModel.project_preallocated``). What must hold:

* only entries whose lease that broker still holds count: a bundle unloaded, moved or never
  leased is not load the broker carries;
* the pending record of a due cycle carries them, so a replay of the cycle sees the same set;
* a refused record leaves that broker's entries out of the cycle and the others in.
"""

from __future__ import annotations

import json

import redis

from loadbalance.bundles import NamespaceBundles
from loadbalance.time_average import BundleData
from metadata_store.keys import Keys
from metadata_store.ownership_redis import RedisStore
from metadata_store.progress import MemoryProgress, PendingCycle, RedisProgress
from streaming.decide import _preallocations

NS = "t/ns"
DOC = {
    "shortTerm": {
        "maxSamples": 10,
        "numSamples": 2,
        "msgThroughputIn": 1000.0,
        "msgThroughputOut": 2000.0,
        "msgRateIn": 30.0,
        "msgRateOut": 40.0,
    },
    "longTerm": {
        "maxSamples": 1000,
        "numSamples": 2,
        "msgThroughputIn": 1000.0,
        "msgThroughputOut": 2000.0,
        "msgRateIn": 30.0,
        "msgRateOut": 40.0,
    },
    "topics": 3,
}


def test_only_preallocations_whose_lease_the_broker_holds_reach_the_pending_record(
    fresh_redis: redis.Redis,
) -> None:
    store = RedisStore(fresh_redis, "lb", clock="server")
    store.create_namespace(NS, 4)
    kept, moved, unleased, *_ = NamespaceBundles.initial(NS, 4).bundle_names
    for broker in ("b1", "b2"):
        store.register_broker(broker, 0, 60_000)
    store.acquire(kept, "b1", 0, 60_000)
    store.acquire(moved, "b2", 0, 60_000)  # placed on b1, then moved before b1 reported it
    pre = store.preallocations
    for bundle in (kept, moved, unleased):
        pre.record("b1", bundle, DOC)
    progress = RedisProgress(fresh_redis, "lb")
    held = progress.read_preallocated(["b1", "b2"])
    assert held == {"b1": {kept: DOC}}
    namespaces = {NS: NamespaceBundles.initial(NS, 4)}
    progress.set_pending(3, namespaces, ["b1", "b2"], held)
    assert progress.pending(3) == PendingCycle(namespaces, ["b1", "b2"], held)
    # a record written by a job that did not read them has none
    progress.set_pending(4, namespaces, ["b1"])
    assert progress.pending(4) == PendingCycle(namespaces, ["b1"], {})
    assert b"preallocated" not in fresh_redis.hgetall(Keys("lb").stream_pending())


def test_a_refused_record_leaves_only_its_broker_out() -> None:
    bundle = NamespaceBundles.initial(NS, 2).bundle_names[0]
    bad = {"shortTerm": {"numSamples": "many"}}
    got = _preallocations({"b1": {bundle: DOC}, "b2": {bundle: json.loads(json.dumps(bad))}})
    assert list(got) == ["b1"]
    data = got["b1"][bundle]
    assert isinstance(data, BundleData) and data.short_term.msg_rate_in == 30.0
    assert MemoryProgress().read_preallocated(["b1"]) == {}


def test_an_applied_transfer_of_ours_preallocates_its_bundle_on_the_destination(
    fresh_redis: redis.Redis,
) -> None:
    """The controller's apply path records the averages a transfer carries as a preallocation
    of the destination, which the next cycle's pending record reads (the destination holds the
    lease); a transfer without them (Pulsar's shedders) records nothing."""
    from controller.placement import bundle_data_doc
    from controller.reconciler import apply_with_events
    from loadbalance.decisions import TRANSFER, make_decision
    from loadbalance.time_average import TimeAverageMessageData
    from loadbalance.transfer_preallocation import preallocation_inputs

    store = RedisStore(fresh_redis, "lb", clock="server")
    store.create_namespace(NS, 4)
    ours, theirs, *_ = NamespaceBundles.initial(NS, 4).bundle_names
    for broker in ("b1", "b2"):
        store.register_broker(broker, 0, 60_000)
    store.acquire(ours, "b1", 0, 60_000)
    store.acquire(theirs, "b1", 0, 60_000)
    data = BundleData(
        TimeAverageMessageData(10, 4, 1500.0, 2500.0, 15.5, 25.25),
        TimeAverageMessageData(1000, 4, 1400.0, 2400.0, 14.0, 24.0),
        topics=7,
    )

    def transfer(bundle: str, inputs: dict) -> None:
        d = make_decision(
            cycle="9", kind=TRANSFER, bundle=bundle, source_broker="b1",
            destination_broker="b2", inputs=inputs,
        )  # fmt: skip
        outcome, _ = apply_with_events(store, d, now_ms=1000, lease_ttl_ms=60_000)
        assert outcome.outcome == "applied"

    transfer(ours, {"sourceLoad": 0.9, **preallocation_inputs(data)})
    transfer(theirs, {"sourceLoad": 0.9})
    assert store.preallocations.of("b2") == {ours: bundle_data_doc(data)}
    assert store.preallocations.of("b1") == {}
    assert RedisProgress(fresh_redis, "lb").read_preallocated(["b1", "b2"]) == {
        "b2": {ours: bundle_data_doc(data)}
    }
