"""The metrics module: Pulsar's names and counting rules, and the HTTP exporter on a free port."""

from __future__ import annotations

import argparse
import json
import urllib.request
import uuid
from types import MappingProxyType

import numpy as np
import pandas as pd
import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from infra import metrics
from loadbalance.config import LoadBalancerConfig
from loadbalance.cycle import CycleResult
from loadbalance.decisions import SPLIT, TRANSFER, UNLOAD, Skip, make_decision
from loadbalance.errors import Transient
from loadbalance.model import NamespaceBundleStats, ResourceUsage
from producers.agent import Agent
from producers.bundle_stats import BundleStatsSnapshot
from producers.host_usage import HostUsage
from streaming.schema import BROKER, BROKER_GONE, SHARD
from streaming.stream_metrics import StreamMetrics, usage_percents


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


# -- the stream job's per-batch updates ------------------------------------------------------


def _report_doc(cpu: float, bundles: int = 3) -> str:
    doc = {
        "webServiceUrl": "http://b:8080",
        "cpu": {"usage": cpu, "limit": 200.0},
        "memory": {"usage": 1.0, "limit": 4.0},
        "directMemory": {"usage": 0.0, "limit": 0.0},
        "bandwidthIn": {"usage": 5.0, "limit": 10.0},
        "bandwidthOut": {"usage": 1.0, "limit": 10.0},
        "bundles": [f"t/n/0x{i:08x}_0x{i + 1:08x}" for i in range(bundles)],
        "numTopics": 1,
    }
    return json.dumps(doc, separators=(",", ":"))


def test_usage_percents_reads_the_head_and_falls_back_to_the_whole_document() -> None:
    assert usage_percents(_report_doc(50.0)) == (25.0, 25.0, 0.0, 50.0, 10.0)
    # no "bundles" key, or in another order: the full parse gives the same answer
    reordered = json.dumps({"bundles": ["x"], **json.loads(_report_doc(50.0), strict=True)})
    assert usage_percents(reordered) == (25.0, 25.0, 0.0, 50.0, 10.0)
    assert usage_percents("{}") == (0.0, 0.0, 0.0, 0.0, 0.0)


def _broker_rows(rows: list[tuple[str, str, str, float]]) -> pd.DataFrame:
    """(kind, name, doc, history usage) rows among shard rows, as the state step emits them."""
    bundle = (SHARD, "s:0", "{}", 0.0)
    kinds, names, docs, usage = zip(*([bundle, *rows, bundle]), strict=True)
    return pd.DataFrame(
        {"kind": kinds, "name": names, "doc": docs, "history_usage": np.array(usage)}
    )


def test_stream_metrics_set_usage_scores_and_their_stats_and_drop_gone_brokers() -> None:
    tag = uuid.uuid4().hex[:6]
    a, b, c = (f"{x}-{tag}" for x in "abc")
    m = StreamMetrics("OverloadShedder")
    m.brokers(
        _broker_rows([(BROKER, a, _report_doc(20.0), 0.2), (BROKER, b, _report_doc(100.0), 0.6)])
    )
    assert _value("pulsar_lb_cpu_usage", broker=a) == 10.0
    assert _value("pulsar_lb_cpu_usage", broker=b) == 50.0
    assert _value("pulsar_lb_resource_usage", broker=b, feature="max_ema") == 0.6
    assert _value("pulsar_lb_resource_usage_stats", feature="max_ema", stat="avg") == pytest.approx(
        0.4
    )
    assert _value("pulsar_lb_resource_usage_stats", feature="max_ema", stat="std") == pytest.approx(
        0.2
    )
    # the stats stay over the whole cluster when only one broker reports; a gone one is dropped
    m.brokers(_broker_rows([(BROKER, c, _report_doc(40.0), 0.4), (BROKER_GONE, a, "{}", 0.2)]))
    assert REGISTRY.get_sample_value("pulsar_lb_cpu_usage", {"broker": a}) is None
    assert (
        REGISTRY.get_sample_value("pulsar_lb_resource_usage", {"broker": a, "feature": "max_ema"})
        is None
    )
    assert _value("pulsar_lb_resource_usage_stats", feature="max_ema", stat="avg") == pytest.approx(
        0.5
    )
    assert _value("pulsar_lb_cpu_usage", broker=b) == 50.0
    # a broker that reported in the same batch as its timer fired stays
    m.brokers(_broker_rows([(BROKER_GONE, c, "{}", 0.4), (BROKER, c, _report_doc(40.0), 0.4)]))
    assert _value("pulsar_lb_cpu_usage", broker=c) == 20.0


def _decision(kind: str, bundle: str, source: str, reason: str) -> object:
    return make_decision(
        cycle="7", kind=kind, bundle=bundle, source_broker=source, reason=reason,
        destination_broker="dst" if kind == TRANSFER else None,
        split_boundaries=(0x80000000,) if kind == SPLIT else (),
    )  # fmt: skip


def test_stream_metrics_count_decisions_and_a_skipped_shedding_cycle_once() -> None:
    m = StreamMetrics("ThresholdShedder")
    keys = [
        ("lbctl_decisions_published_total", {"kind": UNLOAD, "reason": "Overloaded"}),
        ("lbctl_decisions_published_total", {"kind": TRANSFER, "reason": "Overloaded"}),
        ("lbctl_decisions_published_total", {"kind": SPLIT, "reason": "Topics"}),
        ("pulsar_lb_unload_broker_total", {}),
        ("pulsar_lb_unload_bundle_total", {}),
        ("pulsar_lb_bundles_split_total", {}),
        ("pulsar_lb_unload_broker_breakdown_total", {"result": "Skip", "reason": "CoolDown"}),
        ("pulsar_lb_unload_broker_breakdown_total", {"result": "Skip", "reason": "Balanced"}),
        ("pulsar_lb_unload_broker_breakdown_total", {"result": "Success", "reason": "Overloaded"}),
    ]
    before = [_value(n, **lb) for n, lb in keys]
    decisions = [
        _decision(UNLOAD, "t/n/0x00000000_0x20000000", "b1", "Overloaded"),
        _decision(UNLOAD, "t/n/0x20000000_0x40000000", "b3", "Overloaded"),
        _decision(TRANSFER, "t/n/0x40000000_0x80000000", "b1", "Overloaded"),
        _decision(SPLIT, "t/n/0x80000000_0xffffffff", "b2", "Topics"),
    ]
    m.decisions(decisions, CycleResult(tuple(decisions), (), True, True))
    # a cycle that shed nothing: one Skip with the shedder's first reason (split skips ignored)
    skips = (
        Skip("BundleSplitterTask", "HitCount"),
        Skip("ThresholdShedder", "CoolDown", "b3"),
        Skip("ThresholdShedder", "NoBundles", "b4"),
    )
    m.decisions((), CycleResult((), skips, True, False))
    m.decisions((), CycleResult((), (), True, False))  # ran, nothing to say: Balanced
    m.decisions((), CycleResult((), (), False, False))  # shedding not due: nothing counted
    after = [_value(n, **lb) for n, lb in keys]
    # two brokers shed three bundles (two unloads of one reason, counted as two)
    assert [x - y for x, y in zip(after, before, strict=True)] == [2, 1, 1, 2, 3, 1, 1, 1, 3]


# -- the broker agent --------------------------------------------------------------------------


class _Host:
    def sample(self, now_ms: int) -> HostUsage:
        return HostUsage(
            ResourceUsage(50.0, 200.0), ResourceUsage(1.0, 4.0), ResourceUsage(),
            ResourceUsage(3.0, 10.0), ResourceUsage(1.0, 10.0),
        )  # fmt: skip


class _Stats:
    def fetch(self) -> BundleStatsSnapshot:
        stats = {"t/n/0x00000000_0xffffffff": NamespaceBundleStats(msg_rate_in=1.0)}
        return BundleStatsSnapshot(frozenset(stats), MappingProxyType(stats))


class _FlakyPublisher:
    def __init__(self) -> None:
        self.fail = True

    def publish(self, broker_id: str, payload: bytes) -> None:
        if self.fail:
            raise Transient("kafka down")


class _Keeper:
    serving = None  # no serve-until table: this test counts reports and lease results only

    def __init__(self) -> None:
        self.fail = True

    def heartbeat(self, bundles: object, now_ms: int) -> dict[str, bool]:
        if self.fail:
            raise ConnectionError("redis down")
        return {"t/n/0x00000000_0xffffffff": True, "t/n/other": False}


def test_agent_counts_failed_and_published_reports_and_lease_results() -> None:
    broker = f"agent-{uuid.uuid4().hex[:6]}"
    keys = [
        ("lbctl_agent_checks_total", {"published": "false"}),
        ("lbctl_agent_checks_total", {"published": "true"}),
        ("lbctl_agent_reports_published_total", {}),
        ("lbctl_lease_renewals_total", {"result": "failed"}),
        ("lbctl_lease_renewals_total", {"result": "renewed"}),
        ("lbctl_lease_renewals_total", {"result": "lost"}),
    ]
    before = [_value(n, **lb) for n, lb in keys]
    publisher, keeper = _FlakyPublisher(), _Keeper()
    agent = Agent(LoadBalancerConfig(), broker, _Host(), _Stats(), publisher, lease_keeper=keeper)  # type: ignore[arg-type]
    assert not agent.tick(0)  # Kafka and Redis down
    publisher.fail = keeper.fail = False
    assert agent.tick(5_000)
    after = [_value(n, **lb) for n, lb in keys]
    assert [x - y for x, y in zip(after, before, strict=True)] == [1, 1, 1, 1, 1, 1]
    assert _value("pulsar_lb_cpu_usage", broker=broker) == 25.0
    assert _value("pulsar_lb_bandwidth_in_usage", broker=broker) == 30.0
