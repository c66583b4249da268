"""The agent's side of the serve-until rule: send-time stamps, the serving file, the gauges and
``lbctl agent status`` (a fake store and a fake monotonic clock; nothing sleeps)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from lbctl.main import main
from loadbalance.serving import ServingRule, ServingTable
from metadata_store.leases import Lease
from producers.agent import LeaseKeeper
from producers.serving_hook import ServingHook, read_serving_file

NS = "acme/ns"
B1 = f"{NS}/0x00000000_0x80000000"
B2 = f"{NS}/0x80000000_0xffffffff"
RULE = ServingRule(ttl_s=30.0, drift_bound=0.001, stop_margin_s=1.0)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class SlowStore:
    """Holds ``held`` for broker b1; each renewal takes ``renew_s`` of the fake clock and
    answers ``answer`` per bundle (or raises ``fail``)."""

    def __init__(self, clock: FakeClock, held: Mapping[str, int]) -> None:
        self.clock = clock
        self.held = dict(held)
        self.renew_s = 2.0
        self.answer: dict[str, bool] = {}
        self.fail: Exception | None = None
        self.wait_ms = 0  # the handover wait every renewal answers
        self.acks: list[tuple[str, int, float]] = []

    def register_broker(self, *a: Any, **k: Any) -> None:
        if self.fail:
            raise self.fail

    def owners(self, ns: str, now_ms: int) -> dict[str, Lease]:
        return {b: Lease(b, "b1", t, 0) for b, t in self.held.items()}

    def renew_all(
        self, broker: str, leases: Mapping[str, int], now_ms: int, ttl_ms: int
    ) -> dict[str, bool]:
        self.clock.now += self.renew_s
        return {b: self.answer.get(b, True) for b in leases}

    def renew_leases(
        self, broker: str, leases: Mapping[str, int], now_ms: int, ttl_ms: int
    ) -> dict[str, Lease | None]:
        ok = self.renew_all(broker, leases, now_ms, ttl_ms)
        wait = self.wait_ms
        return {b: Lease(b, broker, t, 0, 0, wait) if ok[b] else None for b, t in leases.items()}

    def ack_handover(self, broker: str, bundle: str, token: int) -> bool:
        self.acks.append((bundle, token, self.clock.now))
        return True


def _keeper(held: Mapping[str, int]) -> tuple[LeaseKeeper, SlowStore, FakeClock, ServingTable]:
    clock = FakeClock()
    store = SlowStore(clock, held)
    table = ServingTable("b1", RULE)
    return (
        LeaseKeeper(store, "b1", 30_000, 30_000, serving=table, monotonic=clock),
        store,
        clock,
        table,
    )


def test_the_deadline_counts_from_when_the_renewal_was_sent_not_answered() -> None:
    keeper, _store, clock, table = _keeper({B1: 4})
    keeper.heartbeat([B1], 0)  # sent at 100, answered at 102
    (st,) = table.status(clock())
    assert st.renew_requested_at == 100.0
    assert st.serve_until == pytest.approx(100.0 + 30 * 0.999 - 1.0)
    assert table.intervals()[0].start == 102.0


def test_redis_unreachable_keeps_the_deadline_and_the_broker_stops_at_it() -> None:
    keeper, store, clock, table = _keeper({B1: 4})
    keeper.heartbeat([B1], 0)
    store.fail = ConnectionError("redis down")
    for _ in range(6):  # 102 -> 132: past the deadline at 128.97
        clock.now += 5
        with pytest.raises(ConnectionError):
            keeper.heartbeat([B1], 0)
        # serves while the first renewal still covers it, never after
        assert table.serving(B1, clock()) == (clock() < 100.0 + 28.97)
    assert not table.serving(B1, clock())


def test_a_refused_renewal_or_another_owner_stops_serving_at_once() -> None:
    keeper, store, clock, table = _keeper({B1: 4, B2: 5})
    keeper.heartbeat([B1, B2], 0)
    store.answer[B1] = False
    del store.held[B2]  # the store shows someone else (or nobody) on B2
    keeper.heartbeat([B1, B2], 0)
    assert not table.serving(B1, clock()) and not table.serving(B2, clock())
    # B2 when the owners read showed it gone (102), B1 when its renewal was refused (104)
    assert [(i.bundle, i.end) for i in table.intervals()] == [(B2, 102.0), (B1, 104.0)]


def _gauge(name: str, bundle: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"bundle": bundle})


def test_the_hook_writes_the_file_and_the_gauges(tmp_path: Path) -> None:
    keeper, store, clock, table = _keeper({B1: 4, B2: 5})
    keeper.heartbeat([B1, B2], 0)
    path = tmp_path / "serving.json"
    hook = ServingHook(path, clock)
    hook.publish(table)
    doc = read_serving_file(path, clock())
    assert doc["broker"] == "b1" and doc["leaseStopMarginMs"] == 1000
    assert [(b["bundle"], b["token"], b["serving"]) for b in doc["bundles"]] == [
        (B1, 4, True),
        (B2, 5, True),
    ]
    assert doc["bundles"][0]["secondsLeft"] == pytest.approx(100 + 28.97 - 102)
    assert _gauge("lbctl_agent_serving", B1) == 1.0
    assert _gauge("lbctl_agent_serving_seconds_left", B1) == pytest.approx(26.97)
    clock.now += 60  # the deadline passed: a reader of the old file stops too
    assert not read_serving_file(path, clock())["bundles"][0]["serving"]
    hook.publish(table)
    assert _gauge("lbctl_agent_serving", B1) == 0.0
    store.held.clear()
    keeper.heartbeat([B1, B2], 0)
    hook.publish(table)
    assert _gauge("lbctl_agent_serving", B1) is None  # a lost bundle's series is dropped
    assert read_serving_file(path, clock())["bundles"] == []
    assert [p.name for p in tmp_path.iterdir()] == ["serving.json"]  # no temporary left


def test_lbctl_agent_status_reads_the_file_without_any_service(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = ServingTable("b1", RULE)
    now = time.monotonic()
    table.renewed(B1, 4, now, now)
    table.renewed(B2, 5, now - 40, now - 40)  # lapsed
    path = tmp_path / "serving.json"
    ServingHook(path, time.monotonic).publish(table)
    env = {"LB_redisUrl": "redis://127.0.0.1:1/0"}  # nobody there: status must not ask
    os.environ.update(env)
    try:
        assert main(["agent", "status", "--serving-file", str(path), "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert [b["serving"] for b in doc["bundles"]] == [True, False]
        assert main(["agent", "status", "--serving-file", str(path)]) == 0
        out = capsys.readouterr().out
        assert "serving 1 of 2 bundles" in out and "NOT serving" in out
        assert main(["agent", "status", "--serving-file", str(tmp_path / "none.json")]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "cannot read the serving file" in err[0]
    finally:
        for k in env:
            os.environ.pop(k)


def test_lbctl_agent_without_a_broker_id_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["agent", "--bootstrap-servers", "127.0.0.1:1"]) == 2
    assert "needs --broker-id" in capsys.readouterr().err
