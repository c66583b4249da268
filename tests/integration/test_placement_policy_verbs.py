"""pulsar-admin's placement-policy verbs run as ``lbctl`` against real Redis: the lines an
operator types from Pulsar's documentation (``admin-api-clusters.md``,
``administration-isolation.md``, ``admin-api-namespaces.md``), what they print (Pulsar's JSON
shapes), what they leave in the store, and one-line errors naming the field."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
import redis

from lbctl.main import main
from metadata_store.ownership_redis import RedisStore
from metadata_store.placement_policies import PlacementPoliciesStore

Run = Callable[..., tuple[int, str, str]]
ISO_FLAGS = (
    "--namespaces", "my-tenant/my-ns.*",
    "--primary", "broker-0[01].*",
    "--secondary", "broker-02.*",
    "--auto-failover-policy-type", "min_available",
    "--auto-failover-policy-params", "min_limit=1,usage_threshold=80",
)  # fmt: skip


@pytest.fixture
def store(fresh_redis: redis.Redis) -> RedisStore:
    return RedisStore(fresh_redis)


@pytest.fixture
def run(redis_url: str, capsys: pytest.CaptureFixture[str]) -> Run:
    """``lbctl ARGS --redis-url URL`` in process: (exit status, stdout, stderr)."""

    def _run(*argv: str) -> tuple[int, str, str]:
        try:
            code = main([*argv, "--redis-url", redis_url])
        except SystemExit as e:  # argparse refused the command line
            code = int(e.code or 0)
        out = capsys.readouterr()
        return code, out.out, out.err

    return _run


def test_ns_isolation_policy_set_get_list_delete(run: Run, store: RedisStore) -> None:
    code, out, err = run("ns-isolation-policy", "set", "my-cluster", "policy-1", *ISO_FLAGS)
    assert (code, out, err) == (0, "", "")
    expected = {
        "namespaces": ["my-tenant/my-ns.*"],
        "primary": ["broker-0[01].*"],
        "secondary": ["broker-02.*"],
        "auto_failover_policy": {
            "policy_type": "min_available",
            "parameters": {"min_limit": "1", "usage_threshold": "80"},
        },
    }
    code, out, _ = run("ns-isolation-policy", "get", "my-cluster", "policy-1")
    assert code == 0 and json.loads(out) == expected
    code, out, _ = run("ns-isolation-policy", "list", "my-cluster")
    assert code == 0 and json.loads(out) == {"policy-1": expected}
    # the placement path reads the same policy
    policy = store.placement_policies.read().isolation_policy_of("my-tenant/my-ns-1")
    assert policy is not None and policy.is_primary("broker-01:8080")
    assert run("ns-isolation-policy", "delete", "my-cluster", "policy-1")[0] == 0
    assert store.placement_policies.read().isolation == {}
    code, _, err = run("ns-isolation-policy", "get", "my-cluster", "policy-1")
    assert code == 1 and "policyName" in err and "Traceback" not in err


def test_ns_isolation_policy_flags_take_comma_lists(run: Run, store: RedisStore) -> None:
    code, _, _ = run(
        "ns-isolation-policy", "set", "c1", "p",
        "--namespaces", "t/a,t/b", "--namespaces", "t/c",
        "--primary", "host-1,host-2",
        "--auto-failover-policy-type", "min_available",
        "--auto-failover-policy-params", "min_limit=2,usage_threshold=100",
    )  # fmt: skip
    assert code == 0
    policy = store.placement_policies.isolation_policy("c1", "p")
    assert policy.namespaces == ("t/a", "t/b", "t/c")
    assert policy.primary == ("host-1", "host-2")
    assert policy.auto_failover.min_limit == 2


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (("--primary", "broker-(["), "--primary"),
        (("--namespaces", " , "), "--namespaces"),
        (("--auto-failover-policy-type", "max_available"), "--auto-failover-policy-type"),
        (("--auto-failover-policy-params", "min_limit=1"), "--auto-failover-policy-params"),
        (("--auto-failover-policy-params", "min_limit"), "--auto-failover-policy-params"),
        (
            ("--auto-failover-policy-params", "min_limit=x,usage_threshold=80"),
            "--auto-failover-policy-params",
        ),
    ],
)
def test_ns_isolation_policy_set_refuses_bad_flags_naming_them(
    run: Run, store: RedisStore, change: tuple[str, str], field: str
) -> None:
    flags = list(ISO_FLAGS)
    i = flags.index(change[0])
    flags[i + 1] = change[1]
    code, out, err = run("ns-isolation-policy", "set", "my-cluster", "p", *flags)
    assert code == 1
    assert err.startswith(f"lbctl: {field}") and err.count("\n") == 1, err
    assert "Traceback" not in err and out == ""
    assert store.placement_policies.version() == 0  # nothing written


def test_ns_isolation_policy_set_needs_pulsars_required_flags(run: Run) -> None:
    code, _, err = run("ns-isolation-policy", "set", "my-cluster", "p", "--namespaces", "t/.*")
    assert code == 2 and "--primary" in err


def test_a_second_cluster_name_is_refused(run: Run) -> None:
    assert run("ns-isolation-policy", "set", "my-cluster", "p", *ISO_FLAGS)[0] == 0
    code, _, err = run("ns-isolation-policy", "list", "other-cluster")
    assert code == 1 and err.startswith("lbctl: cluster:") and "my-cluster" in err
    code, _, err = run("clusters", "create-failure-domain", "other-cluster", "--domain-name", "d")
    assert code == 1 and "cluster" in err


def test_ns_isolation_policy_brokers_lists_live_brokers_named_by_policies(
    run: Run, store: RedisStore
) -> None:
    now = int(time.time() * 1000)
    for b in ("broker-00:8080", "broker-02:8080", "broker-05:8080"):
        store.register_broker(b, now, 600_000)
    assert run("ns-isolation-policy", "set", "my-cluster", "p", *ISO_FLAGS)[0] == 0
    code, out, _ = run("ns-isolation-policy", "brokers", "my-cluster")
    assert code == 0
    assert [(r["brokerName"], r["isPrimary"]) for r in json.loads(out)] == [
        ("broker-00:8080", True),
        ("broker-02:8080", False),
    ]
    code, out, _ = run("ns-isolation-policy", "broker", "my-cluster", "--broker", "broker-02:8080")
    assert [r["policyName"] for r in json.loads(out)] == ["p"]


def test_anti_affinity_group_verbs(run: Run, store: RedisStore) -> None:
    for ns in ("my-tenant/ns1", "my-tenant/ns2"):
        store.create_namespace(ns, 4)
        code, out, _ = run("namespaces", "set-anti-affinity-group", ns, "--group", "group-1")
        assert (code, out) == (0, "")
    code, out, _ = run("namespaces", "get-anti-affinity-group", "my-tenant/ns1")
    assert (code, out) == (0, "group-1\n")
    code, out, _ = run(
        "namespaces", "get-anti-affinity-namespaces", "--cluster", "my-cluster", "--group",
        "group-1", "-p", "my-tenant",
    )  # fmt: skip
    assert code == 0 and json.loads(out) == ["my-tenant/ns1", "my-tenant/ns2"]
    assert run("namespaces", "delete-anti-affinity-group", "my-tenant/ns1")[0] == 0
    code, out, _ = run("namespaces", "get-anti-affinity-group", "my-tenant/ns1", "--json")
    assert (code, json.loads(out)) == (0, None)
    assert dict(store.placement_policies.read().anti_affinity_groups) == {
        "my-tenant/ns2": "group-1"
    }


def test_anti_affinity_verbs_refuse_an_unknown_namespace_and_an_empty_group(
    run: Run, store: RedisStore
) -> None:
    code, _, err = run("namespaces", "set-anti-affinity-group", "t/missing", "--group", "g")
    assert code == 1 and err.startswith("lbctl: namespace:")
    store.create_namespace("t/ns", 1)
    code, _, err = run("namespaces", "set-anti-affinity-group", "t/ns", "--group", "")
    assert code == 1 and err.startswith("lbctl: group:")
    assert store.placement_policies.version() == 0


def test_failure_domain_verbs(run: Run, store: RedisStore) -> None:
    code, out, _ = run(
        "clusters", "create-failure-domain", "my-cluster", "--domain-name", "domain-1",
        "--broker-list", "broker-00:8080,broker-01:8080",
    )  # fmt: skip
    assert (code, out) == (0, "")
    code, out, _ = run("clusters", "get-failure-domain", "my-cluster", "--domain-name", "domain-1")
    assert json.loads(out) == {"brokers": ["broker-00:8080", "broker-01:8080"]}
    # a broker already in another domain: refused, naming the field and the domain
    code, _, err = run(
        "clusters", "create-failure-domain", "my-cluster", "--domain-name", "domain-2",
        "--broker-list", "broker-01:8080,broker-02:8080",
    )  # fmt: skip
    assert code == 1 and err.startswith("lbctl: brokers:") and "domain-1" in err
    code, _, _ = run(
        "clusters", "update-failure-domain", "my-cluster", "--domain-name", "domain-2",
        "--broker-list", "broker-02:8080",
    )  # fmt: skip
    assert code == 0
    code, out, _ = run("clusters", "list-failure-domains", "my-cluster")
    assert json.loads(out) == {
        "domain-1": {"brokers": ["broker-00:8080", "broker-01:8080"]},
        "domain-2": {"brokers": ["broker-02:8080"]},
    }
    assert (
        run("clusters", "delete-failure-domain", "my-cluster", "--domain-name", "domain-1")[0] == 0
    )
    assert store.placement_policies.read().domain_of("broker-00:8080") is None
    code, _, err = run(
        "clusters", "delete-failure-domain", "my-cluster", "--domain-name", "domain-1"
    )
    assert code == 1 and err.startswith("lbctl: domainName:")
    code, _, err = run("clusters", "get-failure-domain", "my-cluster", "--domain-name", "nope")
    assert code == 1 and "does not exist" in err


def test_policy_reads_are_refused_cleanly_when_redis_is_unreachable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["ns-isolation-policy", "list", "c", "--redis-url", "redis://127.0.0.1:1"])
    err = capsys.readouterr().err
    assert code == 1 and "cannot reach Redis at redis://127.0.0.1:1" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_store_and_verbs_share_one_document(run: Run, fresh_redis: redis.Redis) -> None:
    assert run("clusters", "create-failure-domain", "c", "--domain-name", "d")[0] == 0
    assert PlacementPoliciesStore(fresh_redis).failure_domain("c", "d") == frozenset()
