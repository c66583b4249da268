"""``lbctl.monitor``: table rows from the streaming job's snapshot documents, and the footer."""

from __future__ import annotations

import pytest

from lbctl.monitor import Snapshot, broker_row, footer_text, render, spread_of


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
    assert "max/mean 1.76" in text  # 90 % and 12.2 % (memory)
    assert "batch 41" in text and "01:00:00Z" in text
    assert snap.complete
    table = render(snap, "t")
    assert table.row_count == 2 and table.caption == text.replace("  |  ", "\n")
