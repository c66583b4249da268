"""pulsar-admin-like verbs against real Redis: tables, --json, and errors that name the problem."""

from __future__ import annotations

import json
import time

import pytest
import redis

from lbctl.main import main
from metadata_store.ownership_redis import RedisStore


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_namespace_lifecycle_lookup_owners_split_and_unload(
    redis_url: str, fresh_redis: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    u = ("--redis-url", redis_url)
    code, out, _ = _run(capsys, "namespaces", "create", "acme/web", "--bundles", "2", *u)
    assert code == 0 and "acme/web" in out
    code, out, _ = _run(capsys, "namespaces", "bundles", "acme/web", "--json", *u)
    assert json.loads(out) == {  # pulsar-admin's BundlesData
        "boundaries": ["0x00000000", "0x80000000", "0xffffffff"],
        "numBundles": 2,
    }
    code, out, _ = _run(capsys, "lookup", "persistent://acme/web/orders", "--json", *u)
    assert code == 0 and json.loads(out)[0]["owner"] is None
    store = RedisStore(fresh_redis)
    now = int(time.time() * 1000)
    for b in ("b1", "b2"):
        store.register_broker(b, now, 60_000)
    store.acquire("acme/web/0x00000000_0x80000000", "b1", now, 60_000)
    code, out, _ = _run(capsys, "owners", "acme/web", "--json", *u)
    assert json.loads(out)[0]["owner"] == "b1"
    code, out, _ = _run(
        capsys, "unload", "acme/web", "-b", "0x00000000_0x80000000", "-d", "b2", "--json", *u
    )
    assert code == 0 and json.loads(out)[0]["outcome"] == "applied"
    assert store.owner("acme/web/0x00000000_0x80000000", now + 1).broker == "b2"
    code, out, _ = _run(capsys, "split-bundle", "acme/web", "-b", "0x80000000_0xffffffff", *u)
    assert code == 0 and "0xbfffffff" in out
    code, out, _ = _run(capsys, "brokers", "list", "--json", *u)
    assert json.loads(out) == ["b1", "b2"]  # pulsar-admin brokers list: an array of strings


def test_errors_name_the_problem_and_exit_non_zero(
    redis_url: str, fresh_redis: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    u = ("--redis-url", redis_url)
    code, _, err = _run(capsys, "owners", "ghost/ns", *u)
    assert code == 1 and "unknown namespace ghost/ns" in err
    _run(capsys, "namespaces", "create", "acme/api", *u)
    code, _, err = _run(capsys, "unload", "acme/api", "-b", "0x00000000_0x00000010", *u)
    assert code == 1 and "not found" in err
    code, _, err = _run(
        capsys, "unload", "acme/api", "-b", "0x00000000_0x40000000", "-d", "nobody", *u
    )
    assert code == 1 and "nobody" in err
    code, _, err = _run(capsys, "namespaces", "create", "acme/api", *u)
    assert code == 1 and "already exists" in err


def test_decisions_tail_and_broker_load_report(
    redis_url: str, fresh_redis: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    from controller.placement import put_load_snapshot
    from loadbalance.model import LocalBrokerData, ResourceUsage
    from loadbalance.report_codec import report_to_dict

    u = ("--redis-url", redis_url)
    _run(capsys, "namespaces", "create", "acme/tail", "--bundles", "2", *u)
    store = RedisStore(fresh_redis)
    now = int(time.time() * 1000)
    store.register_broker("b1", now, 60_000)
    store.acquire("acme/tail/0x00000000_0x80000000", "b1", now, 60_000)
    _run(capsys, "unload", "acme/tail", "-b", "0x00000000_0x80000000", *u)
    code, out, _ = _run(capsys, "decisions", "tail", "-n", "5", "--json", *u)
    rows = json.loads(out)
    assert code == 0 and rows[0]["outcome"] == "applied" and rows[0]["kind"] == "unload"
    report = LocalBrokerData(broker="b1", cpu=ResourceUsage(40, 100), msg_rate_in=12.0)
    put_load_snapshot(store, {"b1": {"report": report_to_dict(report)}}, {})
    code, out, _ = _run(capsys, "broker", "load-report", "b1", *u)
    assert code == 0 and "40.0" in out
    code, _, err = _run(capsys, "broker", "load-report", "ghost", *u)
    assert code == 1 and "ghost" in err


def test_older_unload_spelling_takes_pulsar_admin_forms_too(
    redis_url: str, fresh_redis: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    """The top-level ``unload`` is the same verb as ``namespaces unload``: without ``-b`` it
    releases every owned bundle, and ``--destinationBroker`` is Pulsar's name for ``-d``."""
    u = ("--redis-url", redis_url)
    _run(capsys, "namespaces", "create", "acme/all", "-b", "2", *u)
    store = RedisStore(fresh_redis)
    now = int(time.time() * 1000)
    for b in ("b1", "b2"):
        store.register_broker(b, now, 60_000)
    first, second = store.get_namespace("acme/all").bundle_names
    store.acquire(first, "b1", now, 60_000)
    code, out, _ = _run(
        capsys,
        "unload",
        "acme/all",
        "-b",
        first.rsplit("/", 1)[1],
        "--destinationBroker",
        "b2",
        "--json",
        *u,
    )
    assert code == 0 and store.owner(first, now + 1).broker == "b2"
    store.acquire(second, "b1", now, 60_000)
    code, out, _ = _run(capsys, "unload", "acme/all", "--json", *u)
    assert code == 0 and [r["outcome"] for r in json.loads(out)] == ["applied", "applied"]
    assert store.owners("acme/all", now + 1) == {}
