"""MemoryStore on its own: invariants under arbitrary operation sequences (hypothesis).

The shared behaviour with RedisStore is in ``tests/integration/test_store_contract.py``; here
hypothesis searches for an operation sequence that breaks an invariant of the contract: the
ring stays covered, the version counts the reshapes, tokens only grow, and no lease survives on
a bundle that is no longer current.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from loadbalance.bundles import check_boundaries
from loadbalance.errors import Conflict, InvalidInput
from metadata_store.leases import Lease
from metadata_store.ownership_memory import MemoryStore
from metadata_store.protocol import OwnershipStore

NS = "acme/mem"
BROKERS = ("b0", "b1", "b2")

_op = st.tuples(
    st.sampled_from(["acquire", "renew", "release", "transfer", "split", "merge", "sweep"]),
    st.integers(0, 63),  # which bundle (modulo the current count)
    st.sampled_from(BROKERS),
    st.integers(0, 200),  # how far the clock moves before the call, ms
    st.integers(1, 2**32 - 2),  # a split position, clamped into the bundle
)


def test_memory_store_is_an_ownership_store() -> None:
    assert isinstance(MemoryStore(), OwnershipStore)


@settings(max_examples=150, deadline=None)
@given(st.lists(_op, max_size=80))
def test_random_operations_keep_the_contracts_invariants(ops) -> None:
    s = MemoryStore()
    s.create_namespace(NS, 4)
    for b in BROKERS:
        s.register_broker(b, now_ms=0, ttl_ms=10**9)
    now, reshapes, last_token = 0, 0, 0
    held: dict[str, Lease] = {}
    for kind, idx, broker, dt, pos in ops:
        now += dt
        nb = s.get_namespace(NS)
        r = nb.bundles[idx % len(nb)]
        try:
            if kind == "acquire":
                lease = s.acquire(r.name, broker, now, ttl_ms=150)
                assert lease.token > last_token
                last_token = lease.token
                held[r.name] = lease
            elif kind == "renew" and r.name in held:
                x = held[r.name]
                ok = s.renew_all(x.broker, {r.name: x.token}, now, ttl_ms=150)[r.name]
                live = s.owner(r.name, now)
                assert ok == (live is not None)
                if ok:  # the renewed lease: same holder and token, a later expiry
                    assert live is not None and (live.broker, live.token) == (x.broker, x.token)
                    held[r.name] = live
            elif kind == "release" and r.name in held:
                x = held.pop(r.name)
                # a release is taken when its holder and token are the live lease's (a renew
                # since may have moved the expiry the caller's copy shows)
                live = s.owner(r.name, now)
                was_live = live is not None and (live.broker, live.token) == (x.broker, x.token)
                assert s.release(r.name, x.broker, x.token, now) is was_live
            elif kind == "transfer" and r.name in held:
                x = held.pop(r.name)
                dest = BROKERS[(BROKERS.index(x.broker) + 1) % len(BROKERS)]
                moved = s.transfer(r.name, x.broker, x.token, dest, now, ttl_ms=150)
                assert moved.token > last_token
                last_token = moved.token
                held[r.name] = moved
            elif kind == "split" and r.can_split():
                point = r.lower + 1 + pos % (r.upper - r.lower - 1)
                s.split_bundle(r.name, [point], expected_version=nb.version)
                reshapes += 1
            elif kind == "merge" and len(nb) > 1:
                other = nb.bundles[(idx + 1) % len(nb)] if idx % len(nb) < len(nb) - 1 else None
                if other is not None:
                    s.merge_bundles(r.name, other.name, expected_version=nb.version)
                    reshapes += 1
            elif kind == "sweep":
                assert all(x.expires_at_ms <= now for x in s.sweep_expired(now))
        except (Conflict, InvalidInput):
            pass
        after = s.get_namespace(NS)
        check_boundaries(after.boundaries)
        assert after.version == reshapes
        owners = s.owners(NS, now)
        assert all(s.owner(b, now) == x for b, x in owners.items())
        assert {b for b in s._leases} <= set(after.bundle_names), "no lease on a gone bundle"


def test_owned_by_lists_only_a_brokers_live_leases() -> None:
    s = MemoryStore()
    s.create_namespace(NS, 4)
    for b in BROKERS:
        s.register_broker(b, now_ms=0, ttl_ms=10**9, info={"id": b})
    names = s.get_namespace(NS).bundle_names
    s.acquire(names[0], "b0", now_ms=0, ttl_ms=100)
    keep = s.acquire(names[1], "b0", now_ms=0, ttl_ms=1_000)
    s.acquire(names[2], "b1", now_ms=0, ttl_ms=1_000)
    assert s.owned_by("b0", now_ms=100) == {names[1]: keep}
    assert s.broker_info("b1") == {"id": "b1"} and s.broker_info("ghost") is None


def test_placement_runs_on_the_memory_store_and_announces_only_its_own_grant() -> None:
    """``controller.placement.place`` needs only the OwnershipStore interface."""
    import json

    from controller.events import ASSIGNED, OwnershipEvent
    from controller.placement import place
    from loadbalance.config import LoadBalancerConfig
    from loadbalance.model import LocalBrokerData, ResourceUsage
    from loadbalance.report_codec import report_to_dict
    from loadbalance.snapshot import parse_snapshot

    def report(name: str, cpu: float, rate: float) -> dict:
        r = LocalBrokerData(broker=name, cpu=ResourceUsage(cpu, 100), msg_rate_in=rate)
        return {"report": report_to_dict(r)}

    s = MemoryStore()
    s.create_namespace(NS, 4)
    for b in ("busy", "idle"):
        s.register_broker(b, now_ms=0, ttl_ms=10**9)
    snap = {"nowMs": 5, "brokers": {"busy": report("busy", 95, 5000), "idle": report("idle", 5, 1)}}
    view = parse_snapshot(json.dumps(snap)).view
    cfg = LoadBalancerConfig(loadBalancerDistributeBundlesEvenlyEnabled=False)
    bundle = s.get_namespace(NS).bundle_names[2]
    first = place(s, bundle, view, cfg, now_ms=5, reason="test")
    assert first.lease is not None and first.lease.broker == "idle"
    assert first.event == OwnershipEvent(ASSIGNED, bundle, 5, new_owner="idle",
                                         new_token=first.lease.token, reason="test")  # fmt: skip
    assert first.preallocated is not None
    again = place(s, bundle, view, cfg, now_ms=6)
    assert again.lease == first.lease and again.event is None, "the owner is kept, not re-granted"
    assert place(s, bundle, None, cfg, now_ms=6).lease is None
