"""The run's picture and summary mark the periods a service was in trouble."""

from __future__ import annotations

from pathlib import Path

import pytest

from lbctl.monitor import Snapshot
from lbctl.monitor_cmd import record
from lbctl.monitor_services import ServiceState
from lbctl.plots import UsageHistory, write_usage_png
from lbctl.run_cmd import _summary_text


def _snap(*services: ServiceState) -> Snapshot:
    from lbctl.monitor import broker_row

    doc = {"report": {"cpu": {"usage": 40.0, "limit": 100.0}}}
    return Snapshot(rows=(broker_row("b1", doc, 1),), applied={}, outcomes={}, spread=None,
                    owning_brokers=frozenset({"b1"}), batch=1, batch_event_ms=1, batch_age_s=0.0,
                    read_at_ms=0, services=services)  # fmt: skip


UP = ServiceState("kafka", "up", "answering")
DOWN = ServiceState("kafka", "down", "unreachable: refused")


def test_a_period_of_trouble_is_an_outage_and_a_gap_in_the_usage_lines() -> None:
    history = UsageHistory()
    for t, kafka in ((0, UP), (2, DOWN), (4, DOWN), (6, UP), (8, UP)):
        record(history, _snap(kafka), float(t), 0)
    assert history.outages() == [("kafka down", 2.0, 6.0)]
    assert history.usage_pct["b1"] == [40.0, None, None, 40.0, 40.0]  # no flat line


def test_an_outage_still_open_at_the_end_lasts_to_the_last_refresh() -> None:
    history = UsageHistory()
    for t, kafka in ((0, UP), (2, DOWN), (4, DOWN)):
        record(history, _snap(kafka), float(t), 0)
    assert history.outages() == [("kafka down", 2.0, 4.0)]


def test_the_summary_names_each_outage() -> None:
    s = {"ended": "duration reached", "seconds": 170.0, "applied": {}, "spreadStart": None,
         "spreadEnd": None, "firstBatchAfterS": 14.0, "balancedAfterS": 28.3, "runDir": "d",
         "outages": [{"service": "kafka down", "fromS": 65.0, "toS": 170.0}],
         "troubleAtEnd": ["kafka down: unreachable: refused"]}  # fmt: skip
    text = _summary_text(s)
    assert "TROUBLE during the run: kafka down 65s-170s" in text
    assert "TROUBLE at the end: kafka down: unreachable: refused" in text


def test_the_picture_is_written_with_the_outage_band(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    history = UsageHistory()
    for t, kafka in ((0, UP), (2, DOWN), (4, UP)):
        record(history, _snap(kafka), float(t), 0)
    out = write_usage_png(history, tmp_path / "u.png", title="t", overloaded_pct=85.0)
    assert out is not None and out.stat().st_size > 0
