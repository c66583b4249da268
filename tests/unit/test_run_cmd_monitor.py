"""``lbctl.monitor`` / ``lbctl.monitor_cmd``: rows from the streaming job's snapshot documents,
the status lines, colours by threshold, the checkpoint lag, and the usage picture."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from lbctl.monitor import Health, Lag, Snapshot, broker_row, spread_of
from lbctl.monitor_cmd import _style, broker_table, footer_text, render
from lbctl.monitor_lag import checkpoint_offsets
from lbctl.plots import UsageHistory, write_usage_png


def _doc(cpu: float, mem: float = 1000.0, bw_in: float = 0.0) -> dict:
    return {
        "report": {
            "cpu": {"usage": cpu, "limit": 800.0},
            "memory": {"usage": mem, "limit": 8192.0},
            "bandwidthIn": {"usage": bw_in, "limit": 1_250_000.0},
            "bandwidthOut": {"usage": 0.0, "limit": 1_250_000.0},
            "numTopics": 12,
            "msgRateIn": 1500.0,
            "msgRateOut": 3000.0,
        },
        "historyUsage": 0.5,
    }


def test_a_row_shows_percentages_of_the_limits_and_the_largest_one() -> None:
    row = broker_row("broker-00", _doc(cpu=400.0, bw_in=125_000.0), bundles=3)
    assert row.cpu_pct == pytest.approx(50.0)
    assert row.bandwidth_in_pct == pytest.approx(10.0)
    assert row.max_pct == pytest.approx(50.0)
    assert (row.bundles, row.topics, row.msg_rate_out) == (3, 12, 3000.0)


def test_a_row_survives_a_document_without_limits() -> None:
    row = broker_row("b", {"report": {"cpu": {"usage": 5, "limit": 0}}}, bundles=0)
    assert row.cpu_pct == 0.0 and row.max_pct == 0.0 and row.topics == 0


def test_spread_is_max_over_mean_and_population_std() -> None:
    s = spread_of([90.0, 30.0, 30.0, 30.0])
    assert s is not None
    assert s.max_over_mean == pytest.approx(2.0)
    assert s.std_pct == pytest.approx(25.98, abs=0.01)
    assert spread_of([]) is None
    even = spread_of([40.0, 40.0])
    assert even is not None and even.max_over_mean == pytest.approx(1.0) and even.std_pct == 0


def test_footer_counts_applied_decisions_by_kind_and_names_the_last_batch() -> None:
    rows = (broker_row("a", _doc(cpu=720.0), 1), broker_row("b", _doc(cpu=80.0), 5))
    snap = Snapshot(
        rows=rows,
        applied={"split": 2, "transfer": 5},
        outcomes={"applied": 7, "rejected": 1},
        spread=spread_of([r.max_pct for r in rows]),
        owning_brokers=frozenset({"a", "b"}),
        batch=41,
        batch_event_ms=3_600_000,
        batch_age_s=3.0,
        read_at_ms=0,
    )
    text = footer_text(snap)
    assert "splits 2" in text and "transfers 5" in text and "unloads 0" in text
    assert "other outcomes 1" in text
    assert "max/mean 1.76 (not balanced at <= 1.10)" in text  # 90 % and 12.2 % (memory)
    assert "batch 41" in text and "01:00:00Z" in text
    assert snap.complete
    assert broker_table(snap, "t").row_count == 2
    assert render(snap, "t", width=80) is not None


def _snap(max_pcts: dict[str, float], **kw) -> Snapshot:
    rows = tuple(broker_row(b, _doc(cpu=8.0 * pct), 1) for b, pct in max_pcts.items())
    return Snapshot(
        rows=rows, applied={}, outcomes={}, spread=spread_of([r.max_pct for r in rows]),
        owning_brokers=frozenset(max_pcts), batch=None, batch_event_ms=None, batch_age_s=None,
        read_at_ms=0, **kw,
    )  # fmt: skip


def test_colours_follow_the_overload_threshold_the_balance_band_and_staleness() -> None:
    snap = _snap({"hot": 90.0, "warm": 60.0, "cool": 30.0, "quiet": 30.0}, overloaded_pct=85.0)
    # mean 52.5: the band ends at 57.75 with the default 1.10
    assert _style(snap, 90.0, "hot") == "bold red"
    assert _style(snap, 60.0, "warm") == "yellow"
    assert _style(snap, 30.0, "cool") is None
    stale = _snap({"a": 30.0}, health=Health(reports_stale={"a": 75.0}))
    assert _style(stale, 30.0, "a") == "dim"
    wider = _snap({"hot": 90.0, "warm": 60.0, "cool": 30.0, "quiet": 30.0},
                  balanced_max_over_mean=1.25)  # fmt: skip
    assert _style(wider, 60.0, "warm") is None, "the band is the knob's, not a constant"


def test_json_document_names_overloaded_brokers_and_the_balance_verdict() -> None:
    doc = _snap({"hot": 90.0, "cool": 30.0}, overloaded_pct=85.0).as_dict()
    assert {b["broker"]: b["overloaded"] for b in doc["brokers"]} == {"hot": True, "cool": False}
    assert doc["balanced"] is False and doc["balancedMaxOverMean"] == pytest.approx(1.10)
    assert json.loads(json.dumps(doc)) == doc


def _checkpoint(root: Path, batches: dict[int, dict], committed: list[int]) -> Path:
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    for batch, offsets in batches.items():
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": 0}
        text = f"v1\n{json.dumps(meta)}\n{json.dumps(offsets)}"
        (root / "offsets" / str(batch)).write_text(text)
    for batch in committed:
        (root / "commits" / str(batch)).write_text("v1\n{}")
    return root


def test_lag_uses_the_offsets_of_the_last_committed_batch_not_the_last_planned(
    tmp_path: Path,
) -> None:
    cp = _checkpoint(
        tmp_path / "cp",
        {0: {"lb-reports": {"0": 5, "1": 3}}, 1: {"lb-reports": {"0": 9, "1": 7}},
         2: {"lb-reports": {"0": 20, "1": 20}}},
        committed=[0, 1],
    )  # fmt: skip
    processed = checkpoint_offsets(cp, "lb-reports")
    assert processed == {0: 9, 1: 7}
    assert Lag("lb-reports", {0: 12, 1: 7}, processed, 0).records == 3
    assert Lag("lb-reports", {0: 12}, None, 0).records is None
    assert checkpoint_offsets(cp, "other-topic") is None
    assert checkpoint_offsets(tmp_path / "missing", "lb-reports") is None


def test_history_leaves_gaps_for_brokers_missing_from_a_sample() -> None:
    h = UsageHistory()
    h.sample(0.0, {"a": 50.0})
    h.sample(2.0, {"a": 40.0, "b": 10.0})
    h.sample(4.0, {"b": 20.0})
    assert h.usage_pct == {"a": [50.0, 40.0, None], "b": [None, 10.0, 20.0]}


def test_usage_png_is_written_with_markers_and_threshold(tmp_path: Path) -> None:
    h = UsageHistory()
    for t in range(5):
        h.sample(float(t), {"a": 90.0 - 10 * t, "b": 20.0 + 10 * t})
    h.mark(1.0, "split")
    h.mark(2.0, "transfer")
    h.mark(2.0, "transfer")
    out = write_usage_png(h, tmp_path / "u.png", title="t", overloaded_pct=85.0)
    assert out is not None and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_one_line_says_how_to_install_it_and_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    h = UsageHistory()
    h.sample(0.0, {"a": 1.0})
    h.sample(1.0, {"a": 2.0})
    assert write_usage_png(h, tmp_path / "u.png", title="t", overloaded_pct=85.0) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "[plots]" in err[0]
    assert not (tmp_path / "u.png").exists()
