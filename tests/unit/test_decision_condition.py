"""Operators read the measured condition behind a move, not a reason name that can read false."""

from __future__ import annotations

from lbctl.monitor import DecisionRow, measured_condition


def _row(kind: str, source: str, destination: str, reason: str) -> DecisionRow:
    return DecisionRow(at_ms=1, kind=kind, bundle="t/n/0x00000000_0x80000000", outcome="applied",
                       reason="", decision_reason=reason, source=source,
                       destination=destination, decision_id="d1")  # fmt: skip


def test_a_move_names_the_source_usage_and_its_ratio_to_the_mean() -> None:
    usage = {"broker-01": 30.0, "broker-02": 36.2, "broker-03": 44.8}
    text = measured_condition(_row("transfer", "broker-03", "broker-01", "Overloaded"), usage)
    assert text.startswith("broker-03 at 44.8 % is 1.21x the mean (37.0 %)")
    assert "broker-01 at 30.0 %" in text
    assert "Overloaded" not in text


def test_a_move_out_of_the_least_loaded_broker_shows_it_below_the_mean() -> None:
    usage = {"b1": 20.0, "b2": 40.0, "b3": 60.0}
    text = measured_condition(_row("unload", "b1", "", "Underloaded"), usage)
    assert text == "b1 at 20.0 % is 0.50x the mean (40.0 %)"


def test_a_split_or_an_unknown_broker_keeps_the_reason_name() -> None:
    usage = {"b1": 20.0}
    assert measured_condition(_row("split", "b1", "", "MsgRate"), usage) == "MsgRate"
    assert measured_condition(_row("unload", "gone", "", "Overloaded"), usage) == "Overloaded"
