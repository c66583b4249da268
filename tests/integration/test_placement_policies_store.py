"""The placement-policies repository (``P:policies``) against real Redis: round trips in Pulsar's
admin shapes, the version that every write raises, compare-and-set conflicts, the one cluster a
store serves, and failure domains that never share a broker."""

from __future__ import annotations

import threading

import pytest
import redis

from loadbalance.errors import Conflict, InvalidInput
from loadbalance.placement.policies import (
    AutoFailoverPolicy,
    NamespaceIsolationPolicy,
    PlacementPolicies,
)
from metadata_store.keys import Keys
from metadata_store.placement_policies import PlacementPoliciesStore

ISO = NamespaceIsolationPolicy(
    namespaces=("tenant-a/.*",),
    primary=("broker-0[01]",),
    secondary=("broker-0[23]",),
    auto_failover=AutoFailoverPolicy(min_limit=1, usage_threshold=80.0),
)


@pytest.fixture
def policies(fresh_redis: redis.Redis) -> PlacementPoliciesStore:
    return PlacementPoliciesStore(fresh_redis)


def test_an_empty_store_reads_as_no_policy_at_version_zero(
    policies: PlacementPoliciesStore,
) -> None:
    stored = policies.read_versioned()
    assert (stored.version, stored.cluster) == (0, None)
    assert policies.read().empty
    assert policies.isolation_policies("any-cluster") == {}


def test_isolation_policy_round_trips_in_pulsar_shape_and_raises_the_version(
    policies: PlacementPoliciesStore, fresh_redis: redis.Redis
) -> None:
    stored = policies.set_isolation_policy("use", "iso-a", ISO)
    assert stored.version == 1
    assert policies.isolation_policy("use", "iso-a") == ISO
    # a second store over the same Redis (another process) reads the same document
    other = PlacementPoliciesStore(redis.Redis(connection_pool=fresh_redis.connection_pool))
    assert other.read().isolation["iso-a"].to_admin_json() == {
        "namespaces": ["tenant-a/.*"],
        "primary": ["broker-0[01]"],
        "secondary": ["broker-0[23]"],
        "auto_failover_policy": {
            "policy_type": "min_available",
            "parameters": {"min_limit": "1", "usage_threshold": "80"},
        },
    }
    assert fresh_redis.hget(Keys().policies(), "cluster") == b"use"
    assert policies.delete_isolation_policy("use", "iso-a") is True
    assert policies.delete_isolation_policy("use", "iso-a") is False
    assert policies.version() == 2
    with pytest.raises(InvalidInput) as err:
        policies.isolation_policy("use", "iso-a")
    assert err.value.field == "policyName"


def test_a_stale_version_loses_the_compare_and_set(policies: PlacementPoliciesStore) -> None:
    base = policies.read_versioned()
    policies.set_anti_affinity_group("t/ns1", "g1")
    stale = PlacementPolicies(anti_affinity_groups={"t/ns2": "g2"})
    with pytest.raises(Conflict):
        policies.compare_and_set(base.version, stale)
    # the write that won is intact, the stale one left no trace
    assert dict(policies.read().anti_affinity_groups) == {"t/ns1": "g1"}
    assert policies.version() == 1


def test_concurrent_writers_of_different_policies_all_land(redis_url: str, fresh_redis) -> None:
    """Each writer re-reads and retries on a lost compare-and-set, so none overwrites another."""
    errors: list[BaseException] = []

    def write(i: int) -> None:
        try:
            store = PlacementPoliciesStore(redis.Redis.from_url(redis_url))
            for j in range(5):
                store.set_anti_affinity_group(f"t/ns-{i}-{j}", f"g{i}")
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    store = PlacementPoliciesStore(fresh_redis)
    assert len(store.read().anti_affinity_groups) == 20
    assert store.version() == 20


def test_read_reparses_only_when_the_version_moves(policies: PlacementPoliciesStore) -> None:
    policies.set_anti_affinity_group("t/ns1", "g1")
    first = policies.read()
    assert policies.read() is first  # same version: the cached value
    policies.set_anti_affinity_group("t/ns2", "g1")
    assert set(policies.read().anti_affinity_groups) == {"t/ns1", "t/ns2"}


def test_a_store_serves_the_one_cluster_its_first_write_named(
    policies: PlacementPoliciesStore,
) -> None:
    policies.set_failure_domain("use", "rack-1", ["broker-00", "broker-01"])
    for call in (
        lambda: policies.set_isolation_policy("usw", "iso", ISO),
        lambda: policies.failure_domains("usw"),
        lambda: policies.anti_affinity_namespaces("usw", "g"),
    ):
        with pytest.raises(InvalidInput) as err:
            call()
        assert err.value.field == "cluster"
        assert "usw" in str(err.value) and "use" in str(err.value)
    assert policies.read().isolation == {}
    # the script judges the cluster too, so a writer that checked before another's first write
    # cannot record a second name
    with pytest.raises(InvalidInput) as err:
        policies.compare_and_set(policies.version(), PlacementPolicies(), "usw")
    assert err.value.field == "cluster"
    assert policies.cluster() == "use"


def test_anti_affinity_groups_and_their_namespaces(policies: PlacementPoliciesStore) -> None:
    policies.set_anti_affinity_group("t/a", "g1")
    policies.set_anti_affinity_group("t/b", "g1")
    policies.set_anti_affinity_group("t/c", "g2")
    assert policies.anti_affinity_group("t/a") == "g1"
    assert policies.anti_affinity_namespaces("use", "g1") == ["t/a", "t/b"]
    assert policies.delete_anti_affinity_group("t/a") is True
    assert policies.anti_affinity_group("t/a") is None
    assert policies.anti_affinity_namespaces("use", "g1") == ["t/b"]
    with pytest.raises(InvalidInput) as err:
        policies.set_anti_affinity_group("t/a", " ")
    assert err.value.field == "group"


def test_a_broker_belongs_to_at_most_one_failure_domain(policies: PlacementPoliciesStore) -> None:
    policies.set_failure_domain("use", "rack-1", ["broker-00", "broker-01"])
    with pytest.raises(InvalidInput) as err:
        policies.set_failure_domain("use", "rack-2", ["broker-01", "broker-02"])
    assert err.value.field == "brokers"
    assert "broker-01" in str(err.value) and "rack-1" in str(err.value)
    assert set(policies.failure_domains("use")) == {"rack-1"}
    # updating a domain with its own brokers is no conflict
    policies.set_failure_domain("use", "rack-1", ["broker-00", "broker-01", "broker-03"])
    assert policies.failure_domain("use", "rack-1") == {"broker-00", "broker-01", "broker-03"}
    assert policies.read().domain_of("broker-03") == "rack-1"


def test_deleting_a_missing_failure_domain_names_the_domain(
    policies: PlacementPoliciesStore,
) -> None:
    policies.set_failure_domain("use", "rack-1", ["broker-00"])
    policies.delete_failure_domain("use", "rack-1")
    assert policies.failure_domains("use") == {}
    with pytest.raises(InvalidInput) as err:
        policies.delete_failure_domain("use", "rack-1")
    assert err.value.field == "domainName"
    with pytest.raises(InvalidInput):
        policies.failure_domain("use", "rack-1")
