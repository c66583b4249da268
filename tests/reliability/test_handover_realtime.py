"""A bundle that changes hands by a move is never served by two brokers at one real instant.

Why: a transfer, an unload or a split ends the old lease in Redis at once, while the old holder
serves on until its next check. The handover fence (``metadata_store.handover``) makes the new
holder wait until the old one acknowledged (after it stopped) or its old lease's expiry passed.
These tests run real Redis with its own clock, judge what the brokers *served* with
``loadbalance.serving_checker`` on the test's ``time.monotonic`` (one clock for every process
on the host), and time the move:

* a cooperative transfer completes within about two checks (the old holder's, then the new's)
  plus the stop margin the old holder leaves before it acknowledges;
* an old holder frozen by SIGSTOP in its own process (``tests.reliability.skewed_agent``) holds
  the new one back until its old lease's expiry, and no longer;
* a split child placed on another broker waits for the parent's holder in the same way.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from loadbalance.serving import ServingInterval, ServingRule, ServingTable
from loadbalance.serving_checker import ClockBound, check_serving
from metadata_store.ownership_redis import RedisStore
from producers.agent import LeaseKeeper
from producers.serving_hook import read_serving_file

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TTL_MS = 4_000
CHECK_S = 0.2
RULE = ServingRule(ttl_s=TTL_MS / 1000, drift_bound=0.01, stop_margin_s=0.05)
# every process on the host reads one CLOCK_MONOTONIC: the reference itself, anchored near the
# test so the rate allowance does not widen intervals by the clock's whole reading
_ANCHOR = time.monotonic()
EXACT = ClockBound(_ANCHOR, _ANCHOR, 1 - 1e-6, 1 + 1e-6, 0.0)


def _store(url: str, prefix: str) -> RedisStore:
    client = redis.Redis.from_url(
        url, socket_timeout=2.0, socket_connect_timeout=2.0, retry=Retry(NoBackoff(), 0)
    )
    return RedisStore(client, prefix, clock="server")


def _setup(redis_url: str, ns: str) -> tuple[RedisStore, dict[str, LeaseKeeper]]:
    store = _store(redis_url, f"ho{os.getpid()}{time.monotonic_ns() % 10**6}")
    store.create_namespace(ns, 2)
    keepers = {
        b: LeaseKeeper(
            store, b, 60_000, TTL_MS, serving=ServingTable(b, RULE), monotonic=time.monotonic
        )
        for b in ("A", "B")
    }
    for b in keepers:
        store.register_broker(b, 0, 60_000)
    return store, keepers


def _intervals(*keepers: LeaseKeeper) -> list[ServingInterval]:
    return [i for k in keepers if k.serving is not None for i in k.serving.intervals()]


def _assert_one_at_a_time(intervals: list[ServingInterval]) -> None:
    found = check_serving(intervals, {i.broker: EXACT for i in intervals})
    assert found == [], "\n".join(v.message for v in found)


def test_a_cooperative_transfer_waits_for_the_old_holder_and_takes_about_two_checks(
    redis_url: str,
) -> None:
    store, k = _setup(redis_url, "acme/ho-transfer")
    bundle = store.get_namespace("acme/ho-transfer").bundle_names[0]  # type: ignore[union-attr]
    a_lease = store.acquire(bundle, "A", 0, TTL_MS)
    k["A"].heartbeat([bundle], 0)
    assert k["A"].serving.serving(bundle, time.monotonic())  # type: ignore[union-attr]
    moved_at = time.monotonic()
    new = store.transfer(bundle, "A", a_lease.token, "B", 0, TTL_MS)
    assert new.wait_ms > TTL_MS // 2  # A's lease had most of its TTL left
    b_table = k["B"].serving
    assert b_table is not None
    checks = 0
    for checks in range(1, 20):  # noqa: B007 (B checks, then A; each every CHECK_S)
        k["B"].heartbeat([bundle], 0)
        if b_table.serving(bundle, time.monotonic()):
            break
        time.sleep(CHECK_S / 2)
        k["A"].heartbeat([bundle], 0)
        k["A"].send_acks(wait=True)  # as the agent does once its serving file is rewritten
        time.sleep(CHECK_S / 2)
    started = b_table.intervals()[0].start
    _assert_one_at_a_time(_intervals(k["A"], k["B"]))
    (a_int,) = k["A"].serving.intervals()  # type: ignore[union-attr]
    assert a_int.end <= started  # A stopped (and acknowledged) before B began
    print(f"transfer completed in {started - moved_at:.3f} s ({checks} checks of B)")
    assert started - moved_at < 3 * CHECK_S, "a cooperative move costs about two checks"
    assert store.handover_fences("acme/ho-transfer", 0) == []


def test_a_split_child_on_another_broker_waits_for_the_parents_holder(redis_url: str) -> None:
    ns = "acme/ho-split"
    store, k = _setup(redis_url, ns)
    parent = store.get_namespace(ns).bundle_names[0]  # type: ignore[union-attr]
    store.acquire(parent, "A", 0, TTL_MS)
    k["A"].heartbeat([parent], 0)
    r = store.get_namespace(ns).bundles[0]  # type: ignore[union-attr]
    nb = store.split_bundle(parent, [(r.lower + r.upper) // 2])
    split_at = time.monotonic()
    child = nb.bundle_names[1]
    assert store.acquire(child, "B", 0, TTL_MS).wait_ms > 0
    b_table = k["B"].serving
    assert b_table is not None
    k["B"].heartbeat([child], 0)
    assert not b_table.serving(child, time.monotonic())  # the parent's holder still serves
    time.sleep(CHECK_S)
    k["A"].heartbeat(nb.bundle_names, 0)  # A's check: the parent is gone; stop, then ack
    k["A"].send_acks(wait=True)
    k["B"].heartbeat([child], 0)
    assert b_table.serving(child, time.monotonic())
    assert b_table.intervals()[0].start - split_at < 3 * CHECK_S
    _assert_one_at_a_time(_intervals(k["A"], k["B"]))


def test_a_frozen_old_holder_holds_the_new_one_back_until_its_expiry(
    redis_url: str, tmp_path: Path
) -> None:
    ns = "acme/ho-frozen"
    prefix = f"hf{os.getpid()}{time.monotonic_ns() % 10**6}"
    store = _store(redis_url, prefix)
    store.create_namespace(ns, 2)
    bundle = store.get_namespace(ns).bundle_names[0]  # type: ignore[union-attr]
    store.register_broker("B", 0, 60_000)
    serving_file = tmp_path / "A.serving.json"
    knobs = {
        "loadBalancerOwnershipLeaseTtlSeconds": TTL_MS / 1000,
        "loadBalancerReportUpdateMinIntervalMillis": int(CHECK_S * 1000),
        "leaseClockDriftBound": RULE.drift_bound,
        "leaseStopMarginMs": int(RULE.stop_margin_s * 1000),
    }
    argv = [sys.executable, "-m", "tests.reliability.skewed_agent", "--redis-url", redis_url,
            "--prefix", prefix, "--broker-id", "A", "--namespace", ns,
            "--out", str(tmp_path / "A.json"), "--serving-file", str(serving_file)]  # fmt: skip
    argv += [a for kv in knobs.items() for a in ("--set", f"{kv[0]}={kv[1]}")]
    agent = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert agent.stdout is not None and json.loads(agent.stdout.readline())["ready"] == "A"
        lease = None
        deadline = time.monotonic() + 10
        while lease is None and time.monotonic() < deadline:
            try:
                lease = store.acquire(bundle, "A", 0, TTL_MS)
            except Exception:  # A not registered yet
                time.sleep(0.05)
        assert lease is not None
        while not _file_serves(serving_file, bundle):  # A renewed it and serves
            assert time.monotonic() < deadline, "agent A never served its bundle"
            time.sleep(0.05)
        agent.send_signal(signal.SIGSTOP)
        owned = store.owner(bundle, 0)
        assert owned is not None and owned.broker == "A"
        new = store.transfer(bundle, "A", owned.token, "B", 0, TTL_MS)
        expiry_in = new.wait_ms / 1000.0
        moved_at = time.monotonic()
        keeper = LeaseKeeper(
            store, "B", 60_000, TTL_MS, serving=ServingTable("B", RULE), monotonic=time.monotonic
        )
        table = keeper.serving
        assert table is not None
        while not table.serving(bundle, time.monotonic()):
            assert time.monotonic() < moved_at + 3 * TTL_MS / 1000, "B never served"
            keeper.heartbeat([bundle], 0)
            time.sleep(CHECK_S / 4)
        started = table.intervals()[0].start
        waited = started - moved_at
        print(f"B waited {waited:.3f} s for a frozen A whose lease had {expiry_in:.3f} s left")
        assert waited >= expiry_in - 0.01, "B served before A's old lease could lapse"
        assert waited <= expiry_in + 4 * CHECK_S, "B waited longer than A's old lease"
    finally:
        agent.send_signal(signal.SIGCONT)
        agent.send_signal(signal.SIGTERM)
        agent.wait(15)
    doc = json.loads((tmp_path / "A.json").read_text())
    a_intervals = [ServingInterval.from_json(d) for d in doc["intervals"]]
    assert a_intervals, "A served before it was frozen"
    _assert_one_at_a_time(a_intervals + table.intervals())


def _file_serves(path: Path, bundle: str) -> bool:
    try:
        doc = read_serving_file(path, time.monotonic())
    except (OSError, ValueError):
        return False
    return any(b["bundle"] == bundle and b["serving"] for b in doc["bundles"])
