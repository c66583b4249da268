"""Snapshot validation and ``lbctl decide`` on hostile snapshots: one named test per case that
crashed ``decide`` with a traceback or was silently accepted, each refused with exit code 2 and
one line naming the JSON path; and the snapshot's ``recentlyUnloaded`` reaching the shedder."""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
from pathlib import Path
from typing import Any

import pytest

from lbctl import decide_cmd
from loadbalance.config import LoadBalancerConfig
from loadbalance.cycle import CycleState, step
from loadbalance.decisions import TRANSFER, UNLOAD
from loadbalance.errors import InvalidInput
from loadbalance.snapshot import parse_snapshot

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = json.loads((ROOT / "examples" / "snapshot.json").read_text())
B1 = "broker-1:8080"
HOT = "public/default/0x00000000_0x20000000"
MINUTE = 60_000


def decide(tmp_path: Path, snapshot: Any, *argv: str) -> tuple[int, str, str]:
    """Run ``lbctl decide`` in this process on a snapshot (a document, or raw bytes)."""
    path = tmp_path / "snapshot.json"
    path.write_bytes(snapshot if isinstance(snapshot, bytes) else json.dumps(snapshot).encode())
    parser = argparse.ArgumentParser()
    decide_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["decide", str(path), *argv])
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = decide_cmd.run(args)
    return rc, out.getvalue(), err.getvalue()


def refused(tmp_path: Path, snapshot: Any, path: str, reason: str) -> None:
    """``decide`` exits 2 with exactly one stderr line naming ``path`` and ``reason``."""
    rc, out, err = decide(tmp_path, snapshot)
    assert rc == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    end = "" if path.endswith("/") else ": "  # a path ending in "/" is a prefix
    assert lines[0].startswith(f"lbctl decide: invalid snapshot: {path}{end}"), lines[0]
    assert reason in lines[0], lines[0]


def example(**top: Any) -> dict[str, Any]:
    doc = copy.deepcopy(EXAMPLE)
    doc.update(top)
    return doc


def with_broker(**fields: Any) -> dict[str, Any]:
    doc = example()
    doc["brokers"][B1].update(fields)
    return doc


def with_bundle_data(entry: dict[str, Any]) -> dict[str, Any]:
    return example(bundleData={HOT: entry})


def test_the_example_decides(tmp_path: Path) -> None:
    rc, out, err = decide(tmp_path, EXAMPLE)
    assert rc == 0, err
    assert {json.loads(line)["kind"] for line in out.splitlines()} >= {"split", "transfer"}


# --- cases that crashed with a traceback -----------------------------------------------------


def test_now_ms_nan_is_refused(tmp_path: Path) -> None:
    refused(tmp_path, example(nowMs=float("nan")), "snapshot.nowMs", "finite")


def test_now_ms_beyond_the_float_range_is_refused(tmp_path: Path) -> None:
    raw = json.dumps(EXAMPLE).replace('"nowMs": 1700000000000', '"nowMs": 1e400')
    assert "1e400" in raw
    refused(tmp_path, raw.encode(), "snapshot.nowMs", "finite")


def test_now_ms_text_is_refused(tmp_path: Path) -> None:
    refused(tmp_path, example(nowMs="abc"), "snapshot.nowMs", "must be a number")


def test_history_usage_object_is_refused(tmp_path: Path) -> None:
    path = f'snapshot.brokers["{B1}"].historyUsage'
    refused(tmp_path, with_broker(historyUsage={}), path, "must be a number")


def test_updated_at_ms_text_is_refused(tmp_path: Path) -> None:
    path = f'snapshot.brokers["{B1}"].updatedAtMs'
    refused(tmp_path, with_broker(updatedAtMs="x"), path, "must be a number")


def test_bundle_topics_text_is_refused(tmp_path: Path) -> None:
    path = f'snapshot.bundleData["{HOT}"].topics'
    refused(tmp_path, with_bundle_data({"topics": "many"}), path, "must be a number")


def test_deep_nesting_is_refused(tmp_path: Path) -> None:
    raw = b'{"brokers": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    refused(tmp_path, raw, "snapshot", "nested too deeply")


def test_invalid_utf8_is_refused(tmp_path: Path) -> None:
    raw = json.dumps(EXAMPLE).encode().replace(b"broker-2:8080", b"broker-\xff:8080", 1)
    refused(tmp_path, raw, "snapshot", "not valid UTF-8")


def test_lone_surrogate_escape_in_a_key_is_refused(tmp_path: Path) -> None:
    doc = example()
    doc["brokers"]["b\ud800"] = doc["brokers"].pop(B1)
    raw = json.dumps(doc).encode()  # ASCII: the surrogate travels as a \ud800 escape
    refused(tmp_path, raw, 'snapshot.brokers["b\\ud800"]', "surrogate")


# --- cases that were silently accepted --------------------------------------------------------


def test_history_usage_nan_is_refused(tmp_path: Path) -> None:
    path = f'snapshot.brokers["{B1}"].historyUsage'
    refused(tmp_path, with_broker(historyUsage=float("nan")), path, "finite")


def test_negative_history_usage_is_refused(tmp_path: Path) -> None:
    path = f'snapshot.brokers["{B1}"].historyUsage'
    refused(tmp_path, with_broker(historyUsage=-5), path, "negative")


def test_infinite_throughput_ema_is_refused(tmp_path: Path) -> None:
    path = f'snapshot.brokers["{B1}"].msgThroughputEma'
    refused(tmp_path, with_broker(msgThroughputEma=float("inf")), path, "finite")


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("-inf"), 1e300])
@pytest.mark.parametrize("term", ["shortTerm", "longTerm"])
def test_bad_bundle_rates_are_refused(tmp_path: Path, term: str, value: float) -> None:
    path = f'snapshot.bundleData["{HOT}"].{term}.msgRateIn'
    refused(tmp_path, with_bundle_data({term: {"msgRateIn": value}}), path, "")


def test_negative_num_samples_is_refused(tmp_path: Path) -> None:
    path = f'snapshot.bundleData["{HOT}"].shortTerm.numSamples'
    refused(tmp_path, with_bundle_data({"shortTerm": {"numSamples": -7}}), path, "negative")


def test_num_samples_above_the_window_is_refused(tmp_path: Path) -> None:
    path = f'snapshot.bundleData["{HOT}"].shortTerm.numSamples'
    refused(tmp_path, with_bundle_data({"shortTerm": {"numSamples": 11}}), path, "at most 10")


def test_fractional_num_samples_is_refused(tmp_path: Path) -> None:
    path = f'snapshot.bundleData["{HOT}"].longTerm.numSamples'
    refused(tmp_path, with_bundle_data({"longTerm": {"numSamples": 2.5}}), path, "whole")


def test_negative_now_ms_is_refused(tmp_path: Path) -> None:
    refused(tmp_path, example(nowMs=-(10**18)), "snapshot.nowMs", "negative")


# --- other fields ------------------------------------------------------------------------------


def test_report_errors_carry_the_broker_path(tmp_path: Path) -> None:
    doc = example()
    doc["brokers"][B1]["report"]["msgRateIn"] = -3
    refused(tmp_path, doc, f'snapshot.brokers["{B1}"].report.msgRateIn', "negative")
    doc = example()
    doc["brokers"][B1]["report"]["lastStats"] = ["not", "an", "object"]
    refused(tmp_path, doc, f'snapshot.brokers["{B1}"].report.lastStats', "")


def test_recently_unloaded_time_must_be_an_epoch_ms(tmp_path: Path) -> None:
    for bad in ("soon", -1, 1.5, float("inf")):
        path = f'snapshot.recentlyUnloaded["{HOT}"]'
        refused(tmp_path, example(recentlyUnloaded={HOT: bad}), path, "")


def test_bundle_keys_must_be_bundles(tmp_path: Path) -> None:
    for section, value in (("bundleData", {}), ("recentlyUnloaded", 1), ("topicHashes", [])):
        doc = example(**{section: {"public/default/0x20000000_0x10000000": value}})
        refused(tmp_path, doc, f'snapshot.{section}["public/default/', "lower bound")


def test_topic_hashes_must_be_lists_of_ring_positions(tmp_path: Path) -> None:
    path = f'snapshot.topicHashes["{HOT}"]'
    refused(tmp_path, example(topicHashes={HOT: "0x10"}), path, "must be a list")
    refused(tmp_path, example(topicHashes={HOT: ["0x1_0"]}), f"{path}[0]", "hash value")
    refused(tmp_path, example(topicHashes={HOT: [2**32]}), f"{path}[0]", "ring")
    refused(tmp_path, example(topicHashes={HOT: [float("inf")]}), f"{path}[0]", "finite")


def test_namespace_boundaries_are_checked(tmp_path: Path) -> None:
    path = 'snapshot.namespaces["public/default"]'
    bad = {"public/default": ["0x00000000", "0x80000000"]}
    refused(tmp_path, example(namespaces=bad), path, "0xffffffff")
    bad = {"public/default": ["0x00000000", 1e400, "0xffffffff"]}
    refused(tmp_path, example(namespaces=bad), f"{path}[1]", "finite")
    refused(tmp_path, example(namespaces={"no-slash": []}), 'snapshot.namespaces["no-slash"]', "")


def test_config_values_must_be_finite_scalars(tmp_path: Path) -> None:
    knob = "loadBalancerSheddingIntervalMinutes"
    path = f'snapshot.config["{knob}"]'
    refused(tmp_path, example(config={knob: float("nan")}), path, "finite")
    refused(tmp_path, example(config={knob: "Infinity"}), path, "finite")
    refused(tmp_path, example(config={knob: [1]}), path, "must be a string")
    refused(tmp_path, example(config={"a=b": "1"}), 'snapshot.config["a=b"]', "knob name")
    refused(tmp_path, example(config={knob: "-1"}), path, "greater than 0")
    refused(tmp_path, example(config={"noSuchKnob": 1}), 'snapshot.config["noSuchKnob"]', "")


def test_a_bad_command_line_knob_is_not_blamed_on_the_snapshot(tmp_path: Path) -> None:
    rc, _, err = decide(tmp_path, EXAMPLE, "--set", "loadBalancerHistoryResourcePercentage=7")
    assert rc == 2 and "invalid snapshot" not in err
    assert "loadBalancerHistoryResourcePercentage" in err


def test_infinite_interval_from_the_command_line_exits_cleanly(tmp_path: Path) -> None:
    knobs = ("loadBalancerSheddingIntervalMinutes=inf", "loadBalancerSplitIntervalMinutes=inf")
    rc, _, err = decide(tmp_path, EXAMPLE, "--set", knobs[0], "--set", knobs[1])
    assert rc == 2 and len(err.splitlines()) == 1 and "finite" in err


def test_unknown_top_level_key_and_wrong_version_are_refused(tmp_path: Path) -> None:
    refused(tmp_path, example(recentlyUnload={}), 'snapshot["recentlyUnload"]', "unknown key")
    refused(tmp_path, example(snapshotVersion=True), "snapshot.snapshotVersion", "unsupported")
    refused(tmp_path, example(snapshotVersion=2), "snapshot.snapshotVersion", "unsupported")


def test_a_huge_key_gives_a_short_line(tmp_path: Path) -> None:
    doc = example()
    doc["brokers"]["b" * 100_000] = {"report": {}, "historyUsage": -1}
    rc, _, err = decide(tmp_path, doc)
    assert rc == 2 and len(err.splitlines()) == 1 and len(err) < 1000


def test_bundle_names_are_canonicalised_and_two_spellings_refused() -> None:
    upper = HOT.replace("0x20000000", "0x2000000A")
    lower = upper.lower()
    doc = example(
        bundleData={upper: {"topics": 4}},
        recentlyUnloaded={upper: 5},
        topicHashes={upper: ["0xA"]},
    )
    view = parse_snapshot(json.dumps(doc)).view
    assert view.bundle_data[lower].topics == 4 and upper not in view.bundle_data
    assert dict(view.recently_unloaded) == {lower: 5}
    assert dict(view.topic_hashes) == {lower: (10,)}
    with pytest.raises(InvalidInput, match="spelled twice") as e:
        parse_snapshot(json.dumps(example(recentlyUnloaded={upper: 5, lower: 6})))
    assert e.value.field.startswith("snapshot.recentlyUnloaded[")


def test_null_means_absent() -> None:
    doc = example(bundleData=None, recentlyUnloaded=None, topicHashes=None, config=None)
    doc["brokers"][B1].update(historyUsage=None, msgThroughputEma=None, updatedAtMs=None)
    snap = parse_snapshot(json.dumps(doc))
    assert snap.view.brokers[B1].updated_at_ms == EXAMPLE["brokers"][B1]["report"]["lastUpdate"]


# --- recentlyUnloaded reaches the shedder ------------------------------------------------------

NS = "t/ns"
A, B, C = (f"{NS}/0x00000000_0x40000000", f"{NS}/0x40000000_0x80000000",
           f"{NS}/0x80000000_0xffffffff")  # fmt: skip
NOW = 1_700_000_000_000


def _stats(throughput: float) -> dict[str, float]:
    return {"msgRateIn": 100.0, "msgThroughputIn": throughput, "msgThroughputOut": throughput}


def _report(url: str, cpu: float, stats: dict[str, dict[str, float]]) -> dict[str, Any]:
    return {
        "webServiceUrl": url,
        "cpu": {"usage": cpu, "limit": 100.0},
        "msgThroughputIn": sum(s["msgThroughputIn"] for s in stats.values()),
        "msgThroughputOut": sum(s["msgThroughputOut"] for s in stats.values()),
        "lastStats": stats,
        "lastUpdate": NOW,
    }


def grace_snapshot(recently_unloaded: dict[str, int]) -> dict[str, Any]:
    """busy (95 % CPU) serves A and the larger B, one of which must move; idle serves C."""
    return {
        "nowMs": NOW,
        "config": {
            "loadBalancerLoadSheddingStrategy": "OverloadShedder",
            "loadBalancerAutoBundleSplitEnabled": False,
            "loadBalancerTransferEnabled": False,
        },
        "brokers": {
            "busy": {"report": _report("http://busy", 95.0, {A: _stats(1e6), B: _stats(2e6)})},
            "idle": {"report": _report("http://idle", 5.0, {C: _stats(1e5)})},
        },
        "recentlyUnloaded": recently_unloaded,
    }


def _moved(tmp_path: Path, snapshot: dict[str, Any]) -> list[str]:
    rc, out, err = decide(tmp_path, snapshot)
    assert rc == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    return [x["bundle"] for x in lines if x["kind"] in (UNLOAD, TRANSFER)]


def test_decide_moves_the_largest_bundle_when_nothing_is_in_grace(tmp_path: Path) -> None:
    assert _moved(tmp_path, grace_snapshot({})) == [B]


def test_decide_never_moves_a_snapshot_bundle_in_its_grace_period(tmp_path: Path) -> None:
    assert _moved(tmp_path, grace_snapshot({B: NOW - MINUTE})) == [A]
    # the only sheddable bundle left is in its grace period too: nothing moves
    assert _moved(tmp_path, grace_snapshot({A: NOW - MINUTE, B: NOW - MINUTE})) == []
    rc, _, err = decide(tmp_path, grace_snapshot({A: NOW - MINUTE, B: NOW - MINUTE}))
    assert rc == 0 and "all recently unloaded" in err


def test_decide_moves_a_bundle_again_once_its_grace_period_is_over(tmp_path: Path) -> None:
    grace = LoadBalancerConfig().load_balancer_shedding_grace_period_minutes * MINUTE
    assert _moved(tmp_path, grace_snapshot({B: NOW - grace})) == [B]


def test_the_cycle_merges_view_and_state_grace_entries_newer_time_winning() -> None:
    snap = parse_snapshot(json.dumps(grace_snapshot({B: NOW - 10 * MINUTE})))
    cfg = LoadBalancerConfig(
        loadBalancerLoadSheddingStrategy="OverloadShedder",
        loadBalancerAutoBundleSplitEnabled=False,
        loadBalancerTransferEnabled=False,
    )
    grace = cfg.load_balancer_shedding_grace_period_minutes * MINUTE
    # the state's entry for A joins the view's for B: nothing may move
    state = CycleState(recently_unloaded={A: NOW - MINUTE})
    new_state, res = step(state, snap.view, cfg, now_ms=NOW, cycle="c")
    assert not res.decisions
    assert dict(new_state.recently_unloaded) == {A: NOW - MINUTE, B: NOW - 10 * MINUTE}
    # an older state entry does not cut the view's newer grace period short, nor the reverse
    late = NOW + grace - 20 * MINUTE  # B moved 10 min ago is still in grace, 30 min ago not
    for old_in in ("state", "view"):
        view_b, state_b = (NOW - 10 * MINUTE, NOW - 30 * MINUTE)
        if old_in == "view":
            view_b, state_b = state_b, view_b
        snap = parse_snapshot(json.dumps(grace_snapshot({B: view_b})))
        state = CycleState(recently_unloaded={B: state_b})
        new_state, res = step(state, snap.view, cfg, now_ms=late, cycle="c")
        assert [d.bundle for d in res.decisions] == [A], old_in
        assert new_state.recently_unloaded[B] == NOW - 10 * MINUTE
