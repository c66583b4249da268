"""One test per controller guard the store cannot enforce alone, on real Redis.

Why: the store's scripts refuse a write by a broker that lost its lease, to a dead broker or on
a stale namespace version, but a controller pre-check decides what a *decision* means: a
transfer from a broker that no longer owns the bundle is stale and must not move it (the store
would happily move it from its current owner), a dry run must answer what the real run would,
a transfer to the current owner must not fence it with a new token, and a split or merge
computed from a namespace version that moved must not be applied on the new one; the sweep
must keep a bundle it could not place for the next sweep. Each test here fails when its one
guard in ``controller/apply.py`` or ``controller/sweep.py`` is removed
(``tests/safety/mutants_controller.py`` names the mutant); the applier's tests end with the
independent history checker over what the store granted.
"""

from __future__ import annotations

import pytest
import redis

from controller.apply import ALREADY_SATISFIED, CONFLICT, REJECTED, apply_decision
from controller.events import ASSIGNED, EXPIRED
from controller.placement import put_load_snapshot
from controller.sweep import SweepState, sweep_and_reassign
from loadbalance.config import LoadBalancerConfig
from loadbalance.decisions import MERGE, SPLIT, TRANSFER, Decision, make_decision
from loadbalance.lease_checker import check_history
from loadbalance.lease_history import HistoryRecorder
from loadbalance.model import LocalBrokerData, ResourceUsage
from loadbalance.report_codec import report_to_dict
from metadata_store.ownership_redis import RedisStore

NS = "acme/ctl"
TTL = 30_000
FOREVER = 10**12
NOW = 1_000


def _store(client: redis.Redis, rec: HistoryRecorder | None = None) -> RedisStore:
    """Four bundles of ``NS``: b1 owns the first two, b2 the third, the fourth is free; b1..b3
    are live for ever, ``gone`` was registered and expired."""
    s = RedisStore(client, "ctl", recorder=rec)
    s.create_namespace(NS, 4)
    for b in ("b1", "b2", "b3"):
        s.register_broker(b, now_ms=0, ttl_ms=FOREVER)
    s.register_broker("gone", now_ms=0, ttl_ms=10)
    names = s.get_namespace(NS).bundle_names
    for name, owner in zip(names[:3], ("b1", "b1", "b2")):
        s.acquire(name, owner, now_ms=0, ttl_ms=FOREVER)
    return s


def _clean(rec: HistoryRecorder) -> None:
    assert check_history(rec.snapshot(), ordered=True) == []


def test_a_transfer_from_a_broker_that_lost_the_bundle_is_rejected(
    fresh_redis: redis.Redis,
) -> None:
    """The decision moved the bundle off b2, but b1 owns it now: moving b1's lease would apply
    a decision made on load that no longer exists."""
    rec = HistoryRecorder()
    s = _store(fresh_redis, rec)
    bundle = s.get_namespace(NS).bundle_names[0]
    before = s.owner(bundle, NOW)
    d = make_decision(cycle="1", kind=TRANSFER, bundle=bundle, source_broker="b2",
                      destination_broker="b3")  # fmt: skip
    out = apply_decision(s, d, now_ms=NOW, lease_ttl_ms=TTL)
    assert (out.outcome, out.reason) == (REJECTED, "owner changed: now b1")
    assert s.owner(bundle, NOW) == before, "the lease did not move and kept its token"
    _clean(rec)


def test_a_transfer_to_a_dead_broker_is_rejected_even_in_a_dry_run(
    fresh_redis: redis.Redis,
) -> None:
    """A dry run answers what the real run would: a move to an expired registration is refused
    before any write, with the reason the operator reads."""
    rec = HistoryRecorder()
    s = _store(fresh_redis, rec)
    bundle = s.get_namespace(NS).bundle_names[0]
    before = s.owner(bundle, NOW)
    for i, dry in enumerate((True, False)):
        d = make_decision(cycle=str(i), kind=TRANSFER, bundle=bundle, source_broker="b1",
                          destination_broker="gone")  # fmt: skip
        out = apply_decision(s, d, now_ms=NOW, lease_ttl_ms=TTL, dry_run=dry)
        assert (out.outcome, out.reason) == (REJECTED, "broker gone: gone is not live"), dry
    assert s.owner(bundle, NOW) == before
    _clean(rec)


def test_a_transfer_to_the_current_owner_grants_nothing(fresh_redis: redis.Redis) -> None:
    """A transfer already done (or decided twice) must not fence the owner with a new token:
    its downstream writes with the old token would be refused for nothing."""
    rec = HistoryRecorder()
    s = _store(fresh_redis, rec)
    bundle = s.get_namespace(NS).bundle_names[0]
    before = s.owner(bundle, NOW)
    d = make_decision(cycle="1", kind=TRANSFER, bundle=bundle, source_broker=None,
                      destination_broker="b1")  # fmt: skip
    out = apply_decision(s, d, now_ms=NOW, lease_ttl_ms=TTL)
    assert (out.outcome, out.reason) == (ALREADY_SATISFIED, "already owned by b1")
    assert s.owner(bundle, NOW) == before
    _clean(rec)


def test_a_merge_of_differently_owned_bundles_is_rejected(fresh_redis: redis.Redis) -> None:
    """Merging b1's and b2's bundles would end a lease of a broker the decision never named."""
    rec = HistoryRecorder()
    s = _store(fresh_redis, rec)
    names = s.get_namespace(NS).bundle_names
    owners = [s.owner(n, NOW) for n in names[1:3]]
    d = make_decision(cycle="1", kind=MERGE, bundle=names[1], merge_bundle=names[2],
                      source_broker=None)  # fmt: skip
    out = apply_decision(s, d, now_ms=NOW, lease_ttl_ms=TTL)
    assert (out.outcome, out.reason) == (
        REJECTED, "owner changed: the bundles have different owners"
    )  # fmt: skip
    assert s.get_namespace(NS).bundle_names == names
    assert [s.owner(n, NOW) for n in names[1:3]] == owners
    _clean(rec)


def _reshape(kind: str, names: list[str]) -> Decision:
    """A split of the free fourth bundle, or a merge of b1's first two."""
    if kind == SPLIT:
        return make_decision(cycle="1", kind=SPLIT, bundle=names[3], source_broker=None,
                             split_boundaries=(0xE0000000,))  # fmt: skip
    return make_decision(cycle="1", kind=MERGE, bundle=names[0], merge_bundle=names[1],
                         source_broker=None)  # fmt: skip


@pytest.mark.parametrize("kind", [SPLIT, MERGE])
def test_a_reshape_computed_from_a_version_that_moved_is_a_conflict(
    fresh_redis: redis.Redis, kind: str
) -> None:
    """Another controller splits the third bundle between this applier's read of the namespace
    and its script: the decision was checked against the old version, so it must end
    ``conflict`` (the next cycle decides again), not be applied to the new boundaries."""
    rec = HistoryRecorder()
    s = _store(fresh_redis, rec)
    other = RedisStore(fresh_redis, "ctl", recorder=rec)
    names = s.get_namespace(NS).bundle_names
    d = _reshape(kind, names)
    real = s.get_namespace
    calls: list[int] = []

    def read_then_overtaken(ns: str):  # type: ignore[no-untyped-def]
        nb = real(ns)
        calls.append(nb.version if nb else -1)
        if len(calls) == 1:
            other.split_bundle(names[2], [0xA0000000])
        return nb

    s.get_namespace = read_then_overtaken  # type: ignore[method-assign]
    out = apply_decision(s, d, now_ms=NOW, lease_ttl_ms=TTL)
    assert calls[0] == 0, "the applier read the namespace before the other split"
    assert out.outcome == CONFLICT and "version is 1" in out.reason, out
    after = real(NS)
    assert after.version == 1 and len(after) == 5, "only the other controller's split landed"
    assert names[0] in after.bundle_names and names[3] in after.bundle_names
    assert s.owner(names[0], NOW).broker == "b1", "the merge ended no lease"
    _clean(rec)


def test_a_bundle_whose_destination_lapsed_is_placed_by_the_next_sweep(
    fresh_redis: redis.Redis,
) -> None:
    """The broker the sweep chose lets its registration lapse between the view and the
    acquire: the bundle is announced expired, passed over now, and placed by the next sweep
    (dropping it would leave it free until some client's lookup)."""
    store = RedisStore(fresh_redis, "sw")
    store.create_namespace(NS, 4)
    store.register_broker("dying", now_ms=0, ttl_ms=FOREVER)
    store.register_broker("alive", now_ms=0, ttl_ms=FOREVER)
    report = LocalBrokerData(broker="alive", cpu=ResourceUsage(10, 100))
    put_load_snapshot(store, {"alive": {"report": report_to_dict(report), "updatedAtMs": 0}}, {})
    bundle = store.get_namespace(NS).bundle_names[0]
    old = store.acquire(bundle, "dying", now_ms=0, ttl_ms=500)
    real_acquire = store.acquire_placed
    lapsed: list[str] = []

    def lapse_then_acquire(b: str, dest: str, *args: object, **kwargs: object) -> object:
        if not lapsed:  # the chosen broker's registration ends right before the acquire
            lapsed.append(dest)
            store.register_broker(dest, now_ms=0, ttl_ms=1)
        return real_acquire(b, dest, *args, **kwargs)  # type: ignore[arg-type]

    store.acquire_placed = lapse_then_acquire  # type: ignore[method-assign]
    state = SweepState()
    first = sweep_and_reassign(store, LoadBalancerConfig(), 2_000, state=state)
    assert [(e.event, e.bundle, e.old_token) for e in first] == [(EXPIRED, bundle, old.token)]
    assert lapsed == ["alive"] and list(state.unplaced) == [bundle], "kept for the next sweep"
    store.register_broker("alive", now_ms=2_000, ttl_ms=FOREVER)  # it heartbeats again
    second = sweep_and_reassign(store, LoadBalancerConfig(), 2_001, state=state)
    owner = store.owner(bundle, 2_001)
    assert owner is not None and owner.broker == "alive" and owner.token > old.token
    assert [(e.event, e.bundle, e.new_token) for e in second] == [(ASSIGNED, bundle, owner.token)]
    assert state.unplaced == {}
