"""No knob is silently inert: every knob in force is read by some code path, every inert one
says so (``config show``) and is read by none, and setting an inert one warns once.

"Read" is searched for in the source: the field's attribute name in a product module other
than ``loadbalance/config.py``, or used by a method of the configuration itself (the Kafka and
Redis client settings, the strategy names), i.e. more than its definition there.
"""

from __future__ import annotations

import argparse
import logging
import re
from pathlib import Path

import pytest

from infra.config_loading import load_from_args
from lbctl.config_cmd import run_show
from loadbalance.config import (
    FIELDS,
    INERT_KNOBS,
    LoadBalancerConfig,
    config_rows,
    knob_status,
    load_config_details,
)

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "loadbalance",
    "metadata_store",
    "infra",
    "streaming",
    "controller",
    "producers",
    "lbctl",
)
CONFIG = ROOT / "loadbalance" / "config.py"


def _sources() -> dict[str, str]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path != CONFIG:
                out[path.relative_to(ROOT).as_posix()] = path.read_text(encoding="utf-8")
    return out


def _readers(name: str, sources: dict[str, str]) -> list[str]:
    word = re.compile(rf"\b{name}\b")
    found = [p for p, text in sources.items() if word.search(text)]
    if len(word.findall(CONFIG.read_text(encoding="utf-8"))) > 1:
        found.append("loadbalance/config.py (a method)")
    return found


def test_every_knob_in_force_is_read_by_some_code_path() -> None:
    sources = _sources()
    unread = [
        f.alias
        for name, f in FIELDS.items()
        if f.alias not in INERT_KNOBS and not _readers(name, sources)
    ]
    assert unread == [], f"listed as in force, read by nothing: {unread}"


def test_an_inert_knob_is_a_field_read_by_nothing_and_marked_inert() -> None:
    sources = _sources()
    by_alias = {f.alias: name for name, f in FIELDS.items()}
    for alias, reason in INERT_KNOBS.items():
        assert alias in by_alias, f"{alias} is not a knob"
        assert reason
        readers = _readers(by_alias[alias], sources)
        assert readers == [], f"{alias} is read by {readers}: it is not inert"
        assert knob_status(alias) == f"inert: {reason}"
    rows = {knob: desc for knob, _, _, desc in config_rows(LoadBalancerConfig())}
    assert rows["loadBalancerDebugModeEnabled"].startswith("Inert here: ")
    assert not rows["loadBalancerAutoUnloadSplitBundlesEnabled"].startswith("Inert")
    assert knob_status("namespaceBundleUnloadingTimeoutMs") == "in force"


def test_the_knobs_the_issue_named_are_inert_or_read() -> None:
    assert {
        "loadBalancerInFlightServiceUnitStateWaitingTimeInMillis",
        "loadBalancerServiceUnitStateMonitorIntervalInSeconds",
        "loadBalancerServiceUnitStateTombstoneDelayTimeInSeconds",
        "loadBalancerHostUsageCheckIntervalMinutes",
        "loadBalancerDebugModeEnabled",
    } <= set(INERT_KNOBS)
    for alias in (
        "loadBalancerAutoUnloadSplitBundlesEnabled",
        "namespaceBundleUnloadingTimeoutMs",
        "preferLaterVersions",
        "loadBalancerSheddingBundlesWithPoliciesEnabled",
    ):
        assert alias not in INERT_KNOBS


def test_a_broker_conf_setting_inert_knobs_warns_once_per_knob(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "loadBalancerDebugModeEnabled=true\n"
        "loadBalancerHostUsageCheckIntervalMinutes=5\n"
        "loadBalancerServiceUnitStateTombstoneDelayTimeInSeconds=3600\n"  # the default: quiet
        "loadBalancerSheddingIntervalMinutes=2\n",  # in force: quiet
        encoding="utf-8",
    )
    args = argparse.Namespace(config=conf, set=[], verbose=False)
    with caplog.at_level(logging.WARNING, logger="lbctl.config"):
        config = load_from_args(args)
    assert config.load_balancer_debug_mode_enabled is True
    lines = [r.getMessage() for r in caplog.records if r.name == "lbctl.config"]
    assert len(lines) == 2, lines
    assert "loadBalancerDebugModeEnabled=true has no effect here" in lines[0]
    assert "loadBalancerHostUsageCheckIntervalMinutes=5 has no effect here" in lines[1]


def test_an_inert_knob_at_its_default_gives_no_warning() -> None:
    _, found = load_config_details(conf_text="loadBalancerDebugModeEnabled=false\n")
    assert found.inert == () and found.warnings == ()
    assert any("loadBalancerDebugModeEnabled" in n for n in found.notes)


def test_config_show_marks_inert_knobs(capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(config=None, set=[], verbose=False, json=False)
    assert run_show(args) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "loadBalancerDebugModeEnabled" in line)
    assert "inert" in row
    row = next(line for line in out.splitlines() if "namespaceBundleUnloadingTimeoutMs" in line)
    assert "in force" in row
