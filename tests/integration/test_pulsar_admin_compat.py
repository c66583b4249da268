"""pulsar-admin command lines from Pulsar's documentation, run as ``lbctl`` against real Redis.

Each case is a line an operator would type from habit (sources: apache/pulsar-site
``docs/admin-api-namespaces.md``, ``docs/administration-load-balance.md``,
``docs/admin-api-brokers.md``, the ``pulsar-admin`` reference, and pulsar-admin's
``CmdNamespaces`` for flags the pages do not show), with ``pulsar-admin`` replaced by ``lbctl``
and the Redis URL appended. What is asserted is the state left in Redis (boundaries, leases,
fencing tokens, recorded outcomes), not only the exit status.

The bad-usage cases run against a Redis URL on which nothing listens: exit status 2 (not 1,
"unreachable") shows they were refused before anything was contacted.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
import redis

from lbctl.main import main
from metadata_store.keys import Keys
from metadata_store.load_snapshot import shards_from_docs
from metadata_store.ownership_redis import RedisStore

TTL_MS = 600_000
Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def store(fresh_redis: redis.Redis) -> RedisStore:
    return RedisStore(fresh_redis)


@pytest.fixture
def run(redis_url: str, capsys: pytest.CaptureFixture[str]) -> Run:
    """``lbctl ARGS --redis-url URL`` in process: (exit status, stdout, stderr)."""

    def _run(*argv: str, url: str = redis_url) -> tuple[int, str, str]:
        try:
            code = main([*argv, "--redis-url", url])
        except SystemExit as e:  # argparse refused the command line
            code = int(e.code or 0)
        out = capsys.readouterr()
        return code, out.out, out.err

    return _run


def _now() -> int:
    return int(time.time() * 1000)


def _brokers(store: RedisStore, *names: str) -> None:
    for b in names:
        store.register_broker(b, _now(), TTL_MS)


def _outcomes(fresh_redis: redis.Redis) -> dict[str, dict]:
    return {k.decode(): json.loads(v) for k, v in fresh_redis.hgetall("lb:outcomes").items()}


# -- namespaces create ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "bundles"),
    [
        # admin-api-namespaces.md: default bundle count (defaultNumberOfNamespaceBundles)
        (["namespaces", "create", "test-tenant/test-namespace"], 4),
        # administration-load-balance.md
        (
            [
                "namespaces",
                "create",
                "test-tenant/test-namespace",
                "--clusters",
                "us-west",
                "--bundles",
                "64",
            ],
            64,
        ),
        # CmdNamespaces Create: -b is --bundles
        (["namespaces", "create", "test-tenant/test-namespace", "-b", "16"], 16),
        # the older lbctl spelling still works
        (["namespaces", "create", "test-tenant/test-namespace", "--bundles", "2"], 2),
    ],
)
def test_namespaces_create_makes_n_equal_bundles(
    run: Run, store: RedisStore, argv: list[str], bundles: int
) -> None:
    code, _, err = run(*argv)
    assert code == 0, err
    nb = store.get_namespace("test-tenant/test-namespace")
    assert nb is not None and len(nb) == bundles and nb.version == 0
    seg = (1 << 32) // bundles
    assert nb.boundaries[:-1] == tuple(i * seg for i in range(bundles))


def test_namespaces_bundles_lists_the_boundaries_in_redis(run: Run, store: RedisStore) -> None:
    store.create_namespace("test-tenant/test-namespace", 4)
    store.split_bundle("test-tenant/test-namespace/0x00000000_0x40000000", [0x20000000])
    code, out, _ = run("namespaces", "bundles", "test-tenant/test-namespace", "--json")
    doc = json.loads(out)  # pulsar-admin's BundlesData, exactly its two fields
    nb = store.get_namespace("test-tenant/test-namespace")
    assert code == 0 and set(doc) == {"boundaries", "numBundles"}
    assert doc["boundaries"] == [f"0x{b:08x}" for b in nb.boundaries]
    assert doc["numBundles"] == len(nb.bundle_names) == 5
    code, out, _ = run("namespaces", "bundles", "test-tenant/test-namespace")
    assert code == 0 and "0x20000000" in out  # the table keeps one row per bundle


# -- namespaces split-bundle ---------------------------------------------------------------------
def test_split_bundle_keeps_the_children_with_the_owner_unless_unload(
    run: Run, store: RedisStore
) -> None:
    """admin-api-namespaces.md: ``namespaces split-bundle --bundle 0x00000000_0xffffffff NS``.
    Pulsar's ``splitAndOwnBundle`` leaves both halves with the broker that owned the parent;
    ``-u`` unloads them."""
    ns = "test-tenant/namespace1"
    store.create_namespace(ns, 1)
    _brokers(store, "b1")
    parent = store.acquire(f"{ns}/0x00000000_0xffffffff", "b1", _now(), TTL_MS)
    code, out, err = run(
        "namespaces", "split-bundle", "--bundle", "0x00000000_0xffffffff", ns, "--json"
    )
    assert code == 0, err
    assert store.get_namespace(ns).boundaries == (0, 0x7FFFFFFF, 0xFFFFFFFF)
    low, high = f"{ns}/0x00000000_0x7fffffff", f"{ns}/0x7fffffff_0xffffffff"
    assert [(r["bundle"], r["owner"]) for r in json.loads(out)] == [(low, "b1"), (high, "b1")]
    for child in (low, high):
        lease = store.owner(child, _now())
        assert lease is not None and lease.broker == "b1" and lease.token > parent.token
    assert store.owner(f"{ns}/0x00000000_0xffffffff", _now()) is None

    lease_before = store.owner(low, _now())
    code, out, _ = run(
        "namespaces", "split-bundle", ns, "-b", "0x00000000_0x7FFFFFFF", "-u", "--json"
    )
    assert code == 0
    quarter = [f"{ns}/0x00000000_0x3fffffff", f"{ns}/0x3fffffff_0x7fffffff"]
    assert [(r["bundle"], r["owner"]) for r in json.loads(out)] == [(b, None) for b in quarter]
    assert all(store.owner(b, _now()) is None for b in quarter)
    assert lease_before is not None and store.owner(low, _now()) is None


def test_older_split_bundle_spelling_always_leaves_the_children_free(
    run: Run, store: RedisStore
) -> None:
    ns = "acme/old"
    store.create_namespace(ns, 1)
    _brokers(store, "b1")
    store.acquire(f"{ns}/0x00000000_0xffffffff", "b1", _now(), TTL_MS)
    assert run("split-bundle", ns, "-b", "0x00000000_0xffffffff")[0] == 0
    assert store.owners(ns, _now()) == {}


@pytest.mark.parametrize(
    "sb",
    [
        ["-sb", "1073741824", "-sb", "3221225472"],  # picocli: the flag repeated, decimal longs
        ["-sb", "1073741824,3221225472"],  # JCommander's comma-separated list
        ["--split-boundaries", "3221225472", "-sb", "0x40000000"],  # 0x: lbctl's extension
    ],
)
def test_split_at_specified_positions_takes_decimal_longs(
    run: Run, store: RedisStore, sb: list[str]
) -> None:
    ns = "acme/pos"
    store.create_namespace(ns, 1)
    code, _, err = run(
        "namespaces",
        "split-bundle",
        ns,
        "-b",
        "0x00000000_0xffffffff",
        "-san",
        "specified_positions_divide",
        *sb,
    )
    assert code == 0, err
    assert store.get_namespace(ns).boundaries == (0, 0x40000000, 0xC0000000, 0xFFFFFFFF)


@pytest.mark.parametrize(("bundle_type", "expected"), [("LARGEST", 2), ("HOT", 1), ("hot", 1)])
def test_split_bundle_type_picks_the_bundle_from_the_load_snapshot(
    run: Run, store: RedisStore, fresh_redis: redis.Redis, bundle_type: str, expected: int
) -> None:
    """``-bt LARGEST``: most topics; ``-bt HOT``: highest long-term throughput (in + out)."""
    ns = "acme/bt"
    store.create_namespace(ns, 4)
    names = store.get_namespace(ns).bundle_names
    docs = {
        names[1]: {"topics": 3, "longTerm": {"msgThroughputIn": 9e6, "msgThroughputOut": 1e6}},
        names[2]: {"topics": 7, "longTerm": {"msgThroughputIn": 1e6, "msgThroughputOut": 1e6}},
        names[3]: {"topics": 0, "longTerm": {"msgThroughputIn": 5e7, "msgThroughputOut": 0.0}},
    }
    fresh_redis.hset(Keys("lb").load_shards(), mapping=shards_from_docs(docs))
    code, _, err = run("namespaces", "split-bundle", ns, "-bt", bundle_type, "--json")
    assert code == 0, err
    after = store.get_namespace(ns)
    assert names[expected] not in after.bundle_names and len(after) == 5
    assert all(b in after.bundle_names for i, b in enumerate(names) if i != expected)


# -- namespaces unload ---------------------------------------------------------------------------
def test_unload_one_bundle_releases_its_lease_and_records_the_outcome(
    run: Run, store: RedisStore, fresh_redis: redis.Redis
) -> None:
    """admin-api-namespaces.md: ``namespaces unload --bundle 0x00000000_0xffffffff NS``."""
    ns = "test-tenant/namespace1"
    store.create_namespace(ns, 1)
    _brokers(store, "b1")
    store.acquire(f"{ns}/0x00000000_0xffffffff", "b1", _now(), TTL_MS)
    code, out, err = run("namespaces", "unload", "--bundle", "0x00000000_0xffffffff", ns, "--json")
    [row] = json.loads(out)
    assert code == 0 and row["outcome"] == "applied", err
    assert store.owner(f"{ns}/0x00000000_0xffffffff", _now()) is None
    assert _outcomes(fresh_redis)[row["decision"]]["outcome"] == "applied"


@pytest.mark.parametrize(
    ("argv", "ns", "bundle", "dest"),
    [
        # admin-api-namespaces.md
        (
            [
                "namespaces",
                "unload",
                "--bundle",
                "0x00000000_0xffffffff",
                "--destinationBroker",
                "broker1.use.org.com:8080",
                "test-tenant/namespace1",
            ],
            "test-tenant/namespace1",
            "0x00000000_0xffffffff",
            "broker1.use.org.com:8080",
        ),
        # administration-load-balance.md (a 32-bundle namespace has 0x00000000_0x08000000)
        (
            [
                "namespaces",
                "unload",
                "tenant/namespace",
                "--bundle",
                "0x00000000_0x08000000",
                "--destinationBroker",
                "broker-2.example.com:8080",
            ],
            "tenant/namespace",
            "0x00000000_0x08000000",
            "broker-2.example.com:8080",
        ),
        # -d, an http:// prefix (Pulsar drops it) and the older lbctl flag spelling
        (
            [
                "namespaces",
                "unload",
                "acme/d",
                "-b",
                "0x00000000_0x08000000",
                "-d",
                "http://b2:8080",
            ],
            "acme/d",
            "0x00000000_0x08000000",
            "b2:8080",
        ),
        (
            ["unload", "acme/d", "-b", "0x00000000_0x08000000", "--destination-broker", "b2:8080"],
            "acme/d",
            "0x00000000_0x08000000",
            "b2:8080",
        ),
    ],
)
def test_unload_with_destination_broker_moves_the_lease(
    run: Run, store: RedisStore, argv: list[str], ns: str, bundle: str, dest: str
) -> None:
    store.create_namespace(ns, 32 if bundle.endswith("0x08000000") else 1)
    _brokers(store, "b1", dest)
    first = store.acquire(f"{ns}/{bundle}", "b1", _now(), TTL_MS)
    code, out, err = run(*argv, "--json")
    assert code == 0 and json.loads(out)[0]["outcome"] == "applied", err
    moved = store.owner(f"{ns}/{bundle}", _now())
    assert moved is not None and moved.broker == dest and moved.token > first.token


def test_unload_a_whole_namespace_releases_every_owned_bundle(
    run: Run, store: RedisStore, fresh_redis: redis.Redis
) -> None:
    """administration-load-balance.md: ``namespaces unload tenant/namespace``: one row and one
    recorded outcome per bundle, through the same applier; free bundles are already satisfied."""
    ns = "tenant/namespace"
    store.create_namespace(ns, 4)
    _brokers(store, "b1", "b2")
    names = store.get_namespace(ns).bundle_names
    for name, broker in zip(names[:3], ("b1", "b2", "b1"), strict=True):
        store.acquire(name, broker, _now(), TTL_MS)
    code, out, err = run("namespaces", "unload", ns, "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert [(r["bundle"], r["owner"], r["outcome"]) for r in rows] == [
        (names[0], "b1", "applied"),
        (names[1], "b2", "applied"),
        (names[2], "b1", "applied"),
        (names[3], None, "already_satisfied"),
    ]
    assert store.owners(ns, _now()) == {}
    recorded = _outcomes(fresh_redis)
    assert [recorded[r["decision"]]["bundle"] for r in rows] == names
    assert len({r["decision"] for r in rows}) == 4


def test_namespaces_unload_reaches_the_lease_of_an_upper_case_spelling(
    run: Run, store: RedisStore, fresh_redis: redis.Redis
) -> None:
    ns = "acme/case"
    store.create_namespace(ns, 4)
    _brokers(store, "b1")
    store.acquire(f"{ns}/0xc0000000_0xffffffff", "b1", _now(), TTL_MS)
    code, out, _ = run("namespaces", "unload", ns, "-b", "0xC0000000_0xFFFFFFFF", "--json")
    [row] = json.loads(out)
    assert code == 0 and row["outcome"] == "applied"
    assert row["bundle"] == f"{ns}/0xc0000000_0xffffffff"
    assert store.owners(ns, _now()) == {}
    assert fresh_redis.keys("lb:lease:*") == []


# -- brokers list, broker-stats load-report ------------------------------------------------------
def test_brokers_list_with_a_cluster_name_lists_the_live_brokers(
    run: Run, store: RedisStore
) -> None:
    """admin-api-brokers.md: ``brokers list use``."""
    _brokers(store, "localhost:8080", "broker-2:8080")
    store.register_broker("gone:8080", _now() - 10_000, 1_000)
    for argv in (["brokers", "list", "use"], ["brokers", "list"]):
        code, out, _ = run(*argv, "--json")
        assert code == 0
        assert json.loads(out) == ["broker-2:8080", "localhost:8080"]


def _put_report(fresh_redis: redis.Redis, broker: str, report: dict) -> None:
    doc = {"report": report, "historyUsage": 0.4, "msgThroughputEma": 1.0, "updatedAtMs": 5}
    fresh_redis.hset("lb:load:brokers", broker, json.dumps(doc))


def test_broker_stats_load_report_prints_the_stored_report_with_its_bundle_stats(
    run: Run, fresh_redis: redis.Redis
) -> None:
    """pulsar-admin reference: ``broker-stats load-report`` dumps the broker's report JSON."""
    mine, moved = "acme/r/0x00000000_0x80000000", "acme/r/0x80000000_0xffffffff"
    report = {
        "webServiceUrl": "http://localhost:8080",
        "cpu": {"usage": 40.0, "limit": 100.0},
        "msgRateIn": 12.5,
        "numBundles": 2,
        "bundles": [mine, moved],
        "lastUpdate": 7,
    }
    _put_report(fresh_redis, "localhost:8080", report)
    last = {
        "msgRateIn": 12.5,
        "msgRateOut": 3.0,
        "msgThroughputIn": 100.0,
        "msgThroughputOut": 30.0,
        "topics": 2,
        "consumerCount": 1,
        "producerCount": 4,
    }
    docs = {
        mine: {"broker": "localhost:8080", "lastStats": last, "topics": 2},
        moved: {"broker": "other:8080", "lastStats": last, "topics": 2},
    }
    fresh_redis.hset(Keys("lb").load_shards(), mapping=shards_from_docs(docs))
    code, out, err = run("broker-stats", "load-report")
    assert code == 0, err
    printed = json.loads(out)
    assert {k: v for k, v in printed.items() if k != "lastStats"} == report
    assert printed["lastStats"] == {mine: last}  # the other bundle's last sample is not ours
    assert run("broker-stats", "load-report", "-b", "localhost:8080")[1] == out


def test_broker_stats_load_report_needs_a_broker_when_several_report(
    run: Run, fresh_redis: redis.Redis
) -> None:
    _put_report(fresh_redis, "b1:8080", {"msgRateIn": 1.0})
    _put_report(fresh_redis, "b2:8080", {"msgRateIn": 2.0})
    code, _, err = run("broker-stats", "load-report")
    assert code == 2 and "b1:8080, b2:8080" in err and "-b BROKER" in err
    code, out, _ = run("broker-stats", "load-report", "--broker", "b2:8080")
    assert code == 0 and json.loads(out)["msgRateIn"] == 2.0
    code, _, err = run("broker-stats", "load-report", "-b", "ghost:8080")
    assert code == 1 and "ghost:8080" in err


# -- refused before anything is contacted --------------------------------------------------------
DEAD_REDIS = "redis://127.0.0.1:9"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["namespaces", "split-bundle", "a/b"], "--bundle"),
        (["namespaces", "split-bundle", "a/b", "-b", "0x0_0x1", "-bt", "HOT"], "not allowed"),
        (["namespaces", "split-bundle", "a/b", "-bt", "COLD"], "invalid choice"),
        (
            [
                "namespaces",
                "split-bundle",
                "a/b",
                "-b",
                "0x00000000_0xffffffff",
                "-san",
                "specified_positions_divide",
                "-sb",
                "4000000a",
            ],
            "'4000000a' is not a decimal",
        ),
        (
            ["namespaces", "split-bundle", "a/b", "-b", "0x00000000_0xffffffff", "-sb", "100"],
            "only works with -san specified_positions_divide",
        ),
        (
            [
                "namespaces",
                "split-bundle",
                "a/b",
                "-b",
                "0x00000000_0xffffffff",
                "-san",
                "specified_positions_divide",
            ],
            "needs --split-boundaries",
        ),
        (
            ["namespaces", "unload", "a/b", "--destinationBroker", "b2:8080"],
            "--destinationBroker cannot be set when --bundle is not specified",
        ),
        (["namespaces", "create", "a/b", "-b", "-1"], "--bundles must be 0"),
    ],
)
def test_bad_usage_exits_2_before_contacting_redis(run: Run, argv: list[str], says: str) -> None:
    code, _, err = run(*argv, url=DEAD_REDIS)
    assert code == 2 and says in err, err


def test_a_split_that_finds_no_boundary_says_why(run: Run, store: RedisStore) -> None:
    store.create_namespace("acme/nb", 1)
    code, _, err = run(
        "namespaces",
        "split-bundle",
        "acme/nb",
        "-b",
        "0x00000000_0xffffffff",
        "-san",
        "specified_positions_divide",
        "-sb",
        "0",
        "-sb",
        "4294967295",
    )
    assert code == 1 and "no position lies strictly inside" in err
    code, _, err = run("namespaces", "split-bundle", "acme/nb", "-bt", "LARGEST")
    assert code == 1 and "no LARGEST bundle in acme/nb" in err
    assert store.get_namespace("acme/nb").version == 0
