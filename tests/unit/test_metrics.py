"""The metrics module: Pulsar's names and counting rules, and the HTTP exporter on a free port."""

from __future__ import annotations

import argparse
import urllib.request

from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from lbctl import metrics


def _value(name: str, **labels: str) -> float:
    v = REGISTRY.get_sample_value(name, labels)
    return 0.0 if v is None else v


def test_unloads_follow_pulsars_counting_rule() -> None:
    brokers0 = _value("pulsar_lb_unload_broker_total")
    bundles0 = _value("pulsar_lb_unload_bundle_total")
    over0 = _value("pulsar_lb_unload_broker_breakdown_total", result="Success", reason="Overloaded")
    metrics.record_unloads([("b1", "Overloaded"), ("b1", "Overloaded"), ("b2", "Underloaded")])
    assert _value("pulsar_lb_unload_broker_total") == brokers0 + 2  # distinct brokers
    assert _value("pulsar_lb_unload_bundle_total") == bundles0 + 3
    assert (
        _value("pulsar_lb_unload_broker_breakdown_total", result="Success", reason="Overloaded")
        == over0 + 2
    )
    skip0 = _value("pulsar_lb_unload_broker_breakdown_total", result="Skip", reason="CoolDown")
    metrics.record_unload_skip("CoolDown")
    assert (
        _value("pulsar_lb_unload_broker_breakdown_total", result="Skip", reason="CoolDown")
        == skip0 + 1
    )


def test_splits_count_total_and_breakdown() -> None:
    total0 = _value("pulsar_lb_bundles_split_total")
    topics0 = _value("pulsar_lb_bundles_split_breakdown_total", result="Success", reason="Topics")
    metrics.record_splits(["Topics", "MsgRate"])
    metrics.record_splits(["Unknown"], result="Failure")
    assert _value("pulsar_lb_bundles_split_total") == total0 + 2
    assert (
        _value("pulsar_lb_bundles_split_breakdown_total", result="Success", reason="Topics")
        == topics0 + 1
    )


def test_forget_brokers_drops_departed_series() -> None:
    for b in ("keep-me", "gone"):
        metrics.set_broker_usage(
            b, cpu=10, memory=20, direct_memory=30, bandwidth_in=40, bandwidth_out=50
        )
    assert REGISTRY.get_sample_value("pulsar_lb_cpu_usage", {"broker": "gone"}) == 10
    metrics.forget_brokers(["keep-me"])
    assert REGISTRY.get_sample_value("pulsar_lb_cpu_usage", {"broker": "gone"}) is None
    assert REGISTRY.get_sample_value("pulsar_lb_bandwidth_out_usage", {"broker": "keep-me"}) == 50


def test_serve_none_is_off_and_zero_binds_a_free_port() -> None:
    assert metrics.serve(None) is None
    parser = argparse.ArgumentParser()
    metrics.add_metrics_argument(parser)
    args = parser.parse_args(["--metrics-port", "0"])
    port = metrics.serve_from_args(args)
    try:
        assert port and port > 0
        metrics.set_resource_usage_stats(0.5, 0.125)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            body = resp.read().decode()
        families = {f.name: f for f in text_string_to_metric_families(body)}
        stats = {
            s.labels["stat"]: s.value
            for s in families["pulsar_lb_resource_usage_stats"].samples
            if s.labels.get("feature") == "max_ema"
        }
        assert stats == {"avg": 0.5, "std": 0.125}
        assert "pulsar_lb_unload_broker_total" in body
        assert "_created" not in body
    finally:
        metrics.stop_all()
