"""Each process's metrics endpoint carries its own families only."""

from __future__ import annotations

import urllib.request

import pytest

from infra import metrics


def _families(role: str | None) -> set[str]:
    port = metrics.serve(0, role=role)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    finally:
        metrics.stop_all()
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}


@pytest.mark.parametrize(
    ("role", "own", "foreign"),
    [
        ("control", "lbctl_control_sweeps_total", "pulsar_lb_cpu_usage"),
        ("stream", "lbctl_stream_batches_total", "lbctl_control_sweeps_total"),
        ("stream", "pulsar_lb_bundles_split_total", "lbctl_simulator_cycles_total"),
        ("stream", "pulsar_lb_unload_broker_total", "lbctl_agent_checks_total"),
        ("simulate", "lbctl_simulator_cycles_total", "lbctl_stream_batches_total"),
        ("agent", "lbctl_agent_checks_total", "lbctl_control_decisions_total"),
    ],
)
def test_a_process_exports_its_families_and_not_another_roles(
    role: str, own: str, foreign: str
) -> None:
    families = _families(role)
    assert own in families
    assert foreign not in families


def test_the_served_url_is_published_for_the_process_registry() -> None:
    port = metrics.serve(0, role="control")
    try:
        assert metrics.served_urls() == [f"http://127.0.0.1:{port}/metrics"]
    finally:
        metrics.stop_all()
    assert metrics.served_urls() == []
