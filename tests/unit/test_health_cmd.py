"""``lbctl health``'s judgement: healthy while the progress value changed within the limit."""

from __future__ import annotations

from pathlib import Path

from lbctl.health_cmd import Seen, counter_total, judge, load_seen, save_seen

LIMIT_MS = 60_000


def test_no_progress_record_is_unhealthy_and_forgets_what_was_seen() -> None:
    v = judge(Seen("batch 3", 0), None, 1_000, LIMIT_MS)
    assert not v.healthy and v.seen is None


def test_a_new_value_is_progress_now() -> None:
    v = judge(Seen("batch 3", 0), "batch 4", 500_000, LIMIT_MS)
    assert v.healthy and v.seen == Seen("batch 4", 500_000)
    first = judge(None, "batch 9", 7, LIMIT_MS)
    assert first.healthy and first.seen == Seen("batch 9", 7)


def test_the_same_value_is_healthy_until_it_is_older_than_the_limit() -> None:
    seen = Seen("batch 4", 100_000)
    assert judge(seen, "batch 4", 100_000 + LIMIT_MS, LIMIT_MS).healthy
    stuck = judge(seen, "batch 4", 100_000 + LIMIT_MS + 1, LIMIT_MS)
    assert not stuck.healthy and "no progress for 60 s" in stuck.message
    assert stuck.seen == seen  # the stall keeps its start, so it stays unhealthy


def test_a_counter_that_restarted_lower_is_progress() -> None:
    assert judge(Seen("sweeps 812", 0), "sweeps 0", 10**9, LIMIT_MS).healthy


def test_a_wall_clock_step_back_never_makes_a_live_process_unhealthy() -> None:
    v = judge(Seen("batch 4", 900_000), "batch 4", 100_000, LIMIT_MS)
    assert v.healthy and v.seen == Seen("batch 4", 100_000)


def test_memory_round_trips_and_a_broken_file_is_no_memory(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    save_seen(path, Seen("batch 4", 123))
    assert load_seen(path) == Seen("batch 4", 123)
    path.write_text("{not json")
    assert load_seen(path) is None
    save_seen(path, None)
    assert not path.exists()


def test_counter_total_sums_label_sets_and_tells_an_absent_counter() -> None:
    text = (
        "# HELP lbctl_agent_checks_total x\n# TYPE lbctl_agent_checks_total counter\n"
        'lbctl_agent_checks_total{published="true"} 3.0\n'
        'lbctl_agent_checks_total{published="false"} 4.0\n'
    )
    assert counter_total(text, "lbctl_agent_checks_total") == 7.0
    assert counter_total(text, "lbctl_control_sweeps_total") is None


def test_input_position_turns_only_a_stale_batch_with_nothing_unread_into_idle() -> None:
    from lbctl.health_cmd import Verdict, with_input_position

    stale = judge(Seen("batch 5", 0), "batch 5", 120_000, 60_000)
    assert not stale.healthy
    idle = with_input_position(stale, 0, "reports")
    assert idle.healthy and idle.message.startswith("idle:") and idle.seen == stale.seen
    stuck = with_input_position(stale, 3, "reports")
    assert not stuck.healthy and "3 reports unread on reports" in stuck.message
    assert with_input_position(stale, None, "reports") == stale  # unknown: the age decides
    fresh = judge(Seen("batch 5", 0), "batch 6", 120_000, 60_000)
    assert with_input_position(fresh, 9, "reports") == fresh
    nothing = judge(None, None, 0, 60_000)  # no record at all is never idle
    assert with_input_position(nothing, 0, "reports") == nothing
    assert isinstance(nothing, Verdict)
