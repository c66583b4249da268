"""The policy cycle: intervals, grace period, placement of shed bundles, determinism, and the
offline ``lbctl decide`` on the example snapshot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadbalance.config import LoadBalancerConfig
from loadbalance.cycle import CycleState, step
from loadbalance.decisions import SPLIT, TRANSFER, UNLOAD
from loadbalance.snapshot import parse_snapshot

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "snapshot.json"
MINUTE = 60_000


def _config(**knobs: object) -> LoadBalancerConfig:
    return LoadBalancerConfig(**knobs)


def _example(**knobs: object):
    snap = parse_snapshot(EXAMPLE.read_text())
    cfg = _config(**{"loadBalancerLoadSheddingStrategy": "OverloadShedder", **knobs})
    return snap, cfg


def test_example_gives_a_split_of_the_hot_bundle_and_a_transfer_off_the_overloaded_broker():
    snap, cfg = _example()
    _, res = step(CycleState(), snap.view, cfg, now_ms=snap.now_ms, cycle="c1")
    kinds = {(d.kind, d.reason) for d in res.decisions}
    assert (SPLIT, "MsgRate") in kinds or (SPLIT, "Bandwidth") in kinds
    moved = [d for d in res.decisions if d.kind in (UNLOAD, TRANSFER)]
    assert moved and all(d.source_broker == "broker-1:8080" for d in moved)
    assert all(d.destination_broker != d.source_broker for d in moved)
    split_bundles = {d.bundle for d in res.decisions if d.kind == SPLIT}
    assert not split_bundles & {d.bundle for d in moved}, "a bundle split now is not also moved"


def test_transfer_disabled_keeps_plain_unloads():
    snap, cfg = _example(loadBalancerTransferEnabled=False)
    _, res = step(CycleState(), snap.view, cfg, now_ms=snap.now_ms, cycle="c1")
    moved = [d for d in res.decisions if d.kind in (UNLOAD, TRANSFER)]
    assert moved and all(d.kind == UNLOAD and d.destination_broker is None for d in moved)


def test_same_input_and_cycle_key_give_identical_decisions():
    snap, cfg = _example()
    a = step(CycleState(), snap.view, cfg, now_ms=snap.now_ms, cycle="42")[1]
    b = step(CycleState(), snap.view, cfg, now_ms=snap.now_ms, cycle="42")[1]
    assert [d.id for d in a.decisions] == [d.id for d in b.decisions]
    assert a.decisions == b.decisions


def test_shedding_waits_for_its_interval_and_grace_period_blocks_repeat_moves():
    snap, cfg = _example(loadBalancerAutoBundleSplitEnabled=False)
    t0 = snap.now_ms
    state, first = step(CycleState(), snap.view, cfg, now_ms=t0, cycle="1")
    moved = {d.bundle for d in first.decisions}
    assert moved and first.shedding_ran
    state, early = step(state, snap.view, cfg, now_ms=t0 + MINUTE // 2, cycle="2")
    assert not early.shedding_ran and not early.decisions
    state, later = step(state, snap.view, cfg, now_ms=t0 + MINUTE, cycle="3")
    assert later.shedding_ran
    assert not moved & {d.bundle for d in later.decisions}, "grace period must hold"
    grace = cfg.load_balancer_shedding_grace_period_minutes * MINUTE
    assert all(t0 + grace > t for t in state.recently_unloaded.values())
    state, after = step(state, snap.view, cfg, now_ms=t0 + grace + MINUTE, cycle="4")
    assert after.shedding_ran
    assert moved & {d.bundle for d in after.decisions}, "after the grace period it may move again"


def test_disabled_load_balancer_decides_nothing():
    snap, cfg = _example(loadBalancerEnabled=False)
    _, res = step(CycleState(), snap.view, cfg, now_ms=snap.now_ms, cycle="1")
    assert res.decisions == () and res.skips[0].reason == "Disabled"


@pytest.mark.parametrize(
    "strategy", ["ThresholdShedder", "OverloadShedder", "UniformLoadShedder", "TransferShedder"]
)
def test_every_shedder_runs_in_the_cycle(strategy: str):
    snap, cfg = _example(loadBalancerLoadSheddingStrategy=strategy)
    state = CycleState()
    for i in range(6):
        state, res = step(state, snap.view, cfg, now_ms=snap.now_ms + i * MINUTE, cycle=str(i))
        for d in res.decisions:
            assert d.destination_broker != d.source_broker


def _lbctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lbctl.main", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def test_lbctl_decide_prints_decisions_as_json_lines():
    out = _lbctl("decide", str(EXAMPLE))
    assert out.returncode == 0, out.stderr
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    assert {x["kind"] for x in lines} >= {"split", "transfer"}
    assert all(x["schemaVersion"] == 1 and len(x["id"]) == 32 for x in lines)
    again = _lbctl("decide", str(EXAMPLE))
    assert again.stdout == out.stdout, "offline decisions are deterministic"


def test_lbctl_decide_transfer_shedder_needs_its_debounce():
    args = ("decide", str(EXAMPLE), "--set", "loadBalancerLoadSheddingStrategy=TransferShedder")
    one = _lbctl(*args, "--skips")
    assert one.returncode == 0, one.stderr
    first = [json.loads(x) for x in one.stdout.splitlines()]
    assert not [x for x in first if x.get("kind") in ("transfer", "unload")]
    assert any(x.get("skip", {}).get("reason") == "HitCount" for x in first)
    many = _lbctl(*args, "--cycles", "5")
    moved = [json.loads(x) for x in many.stdout.splitlines()]
    assert [x for x in moved if x["kind"] in ("transfer", "unload")]


def test_lbctl_decide_reports_bad_snapshot_and_bad_knob(tmp_path: Path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"brokers": {}}')
    out = _lbctl("decide", str(bad))
    assert out.returncode == 2 and "brokers" in out.stderr
    out = _lbctl("decide", str(EXAMPLE), "--set", "loadBalancerHistoryResourcePercentage=7")
    assert out.returncode == 2 and "loadBalancerHistoryResourcePercentage" in out.stderr
    out = _lbctl("decide", str(tmp_path / "missing.json"))
    assert out.returncode == 2 and "cannot read" in out.stderr
