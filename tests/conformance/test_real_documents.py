"""Real Pulsar documents (``documents/``, sources in its README) through every reader we have.

Each load report of the three load managers, of several Pulsar versions, must be accepted and
read the same way by the report codec, the columnar decoder, the streaming job's parse step,
``lbctl decide``'s snapshot reader and the agent's provider; and Pulsar's stock ``broker.conf``
must load with one summary warning. The expected figures are copied from the documents by hand,
so a reader that drops or misreads a field fails here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from loadbalance.bundles import parse_bundle
from loadbalance.config import LoadBalancerConfig, load_config_details
from loadbalance.cycle import weights_from_config
from loadbalance.model import (
    BROKER_LOAD_DATA,
    LOAD_REPORT,
    LOCAL_BROKER_DATA,
    NO_BUNDLE_DATA,
    LocalBrokerData,
    ResourceUsage,
)
from loadbalance.report_codec import decode_report, decode_report_columns
from loadbalance.report_columns import columns_from_report
from loadbalance.snapshot import parse_snapshot
from producers.agent import build_report
from producers.bundle_stats import FileStatsProvider
from producers.host_usage import HostUsage
from streaming.parse import ParseSettings, parse_record
from streaming.schema import REPORT, SAMPLES
from streaming.shard_state import shard_of

DOCUMENTS = Path(__file__).parent / "documents"
UNKNOWN = ResourceUsage(0.0, 0.0)  # a resource the document does not carry


@dataclass(frozen=True)
class Expected:
    """What a document says, read by hand."""

    key: str | None  # the Kafka record key; None: the broker id comes from the document
    broker: str
    report_type: str
    cpu: ResourceUsage
    memory: ResourceUsage
    direct_memory: ResourceUsage
    bandwidth_in: ResourceUsage
    last_update_ms: int = 0
    bundles: dict[str, tuple[int, int]] = field(default_factory=dict)  # name: (topics, consumers)
    system_bundles: frozenset[str] = frozenset()
    msg_rate_in: float = 0.0
    msg_throughput_out: float = 0.0
    num_bundles: int = 0
    num_topics: int = 0
    issues: tuple[str, ...] = ()
    max_resource_usage: float | None = None  # Pulsar's own figure, where the document has it
    version: str = ""


HEARTBEAT = "pulsar/pulsar/10.244.2.23:8080/0x00000000_0xffffffff"
MY_BUNDLE = "my-tenant/my-namespace/0x4ccccccb_0x66666664"

CASES = {
    "simple-LoadReport-3.1.json": Expected(
        key=None,
        broker="broker-1:8080",
        report_type=LOAD_REPORT,
        cpu=ResourceUsage(6.224803359552059, 800.0),
        memory=ResourceUsage(152.0, 2096.0),
        direct_memory=ResourceUsage(0.0, 256.0),
        bandwidth_in=ResourceUsage(0.595387281695773, 1.0e7),
        last_update_ms=1691042931108,
        version="3.1.0-SNAPSHOT",
    ),
    "modular-LocalBrokerData-3.1.json": Expected(
        key="broker-1:8080",
        broker="broker-1:8080",
        report_type=LOCAL_BROKER_DATA,
        cpu=ResourceUsage(7.311714728372232, 800.0),
        memory=ResourceUsage(124.0, 2096.0),
        direct_memory=ResourceUsage(36.0, 256.0),
        bandwidth_in=ResourceUsage(0.8324254085661579, 1.0e7),
        last_update_ms=1690979816792,
        bundles={MY_BUNDLE: (1, 2)},
        num_bundles=1,
        num_topics=1,
        max_resource_usage=0.140625,
        version="3.1.0-SNAPSHOT",
    ),
    "extensible-BrokerLoadData-3.1.json": Expected(
        key="broker-1:8080",
        broker="broker-1:8080",
        report_type=BROKER_LOAD_DATA,
        cpu=ResourceUsage(14.397985201479854, 800.0),
        memory=ResourceUsage(300.0, 2096.0),
        direct_memory=ResourceUsage(40.0, 256.0),
        bandwidth_in=ResourceUsage(0.7817884878178855, 1.0e7),
        last_update_ms=1691043751060,
        msg_rate_in=0.03333931866971176,
        msg_throughput_out=3.0005621893825616,
        num_bundles=3,
        num_topics=3,
        issues=(NO_BUNDLE_DATA,),
        max_resource_usage=0.15625,
    ),
    "modular-LocalBrokerData-2.11-heartbeat.json": Expected(
        key=None,
        broker="10.244.2.23:8080",
        report_type=LOCAL_BROKER_DATA,
        cpu=ResourceUsage(3.1577712104798255, 100.0),
        memory=ResourceUsage(614.0, 1228.0),
        direct_memory=ResourceUsage(32.0, 1228.0),
        bandwidth_in=ResourceUsage(0.0, 0.0),
        last_update_ms=1650886425227,
        bundles={HEARTBEAT: (1, 0)},
        system_bundles=frozenset({HEARTBEAT}),
        num_bundles=1,
        num_topics=1,
        version="2.11.0-hw-0.0.4-SNAPSHOT",
    ),
    "modular-LocalBrokerData-2.x-docs.json": Expected(
        key="broker-2x:8080",
        broker="broker-2x:8080",
        report_type=LOCAL_BROKER_DATA,
        cpu=ResourceUsage(5.7353247655435915, 2400.0),
        memory=UNKNOWN,
        direct_memory=ResourceUsage(1.0, 16384.0),
        bandwidth_in=ResourceUsage(4.256510416666667, 10240000.0),
    ),
    "simple-LoadReport-2.x-docs.json": Expected(
        key="broker-2x:8080",
        broker="broker-2x:8080",
        report_type=LOAD_REPORT,
        cpu=ResourceUsage(0.0, 2400.0),
        memory=ResourceUsage(3903.0, 8192.0),
        direct_memory=ResourceUsage(1.0, 16384.0),
        bandwidth_in=ResourceUsage(0.0, 10240000.0),
    ),
}


def test_the_corpus_is_complete() -> None:
    """Every document is checked, and the corpus holds all three load managers' documents."""
    on_disk = {p.name for p in DOCUMENTS.glob("*.json")}
    assert on_disk == set(CASES)
    assert {e.report_type for e in CASES.values()} == {
        LOAD_REPORT,
        LOCAL_BROKER_DATA,
        BROKER_LOAD_DATA,
    }
    readme = (DOCUMENTS / "README.md").read_text()
    for name in [*on_disk, "broker.conf"]:
        assert f"`{name}`" in readme, f"{name} has no source in the README"


def _raw(name: str) -> bytes:
    return (DOCUMENTS / name).read_bytes()


def _check(r: LocalBrokerData, e: Expected) -> None:
    assert r.broker == e.broker
    assert (r.cpu, r.memory, r.direct_memory, r.bandwidth_in) == (
        e.cpu,
        e.memory,
        e.direct_memory,
        e.bandwidth_in,
    )
    assert r.last_update_ms == e.last_update_ms
    assert r.bundles == frozenset(e.bundles)
    assert {b for b in r.bundles if parse_bundle(b).is_system_service} == e.system_bundles
    assert r.msg_rate_in == pytest.approx(e.msg_rate_in)
    assert r.msg_throughput_out == pytest.approx(e.msg_throughput_out)
    assert (r.num_bundles, r.num_topics) == (e.num_bundles, e.num_topics)
    assert r.broker_version == e.version
    if e.max_resource_usage is not None:
        assert r.max_resource_usage() == pytest.approx(e.max_resource_usage)


@pytest.mark.parametrize("name", sorted(CASES))
def test_codec_reads_the_document(name: str) -> None:
    e = CASES[name]
    r = decode_report(_raw(name), e.key)
    _check(r, e)
    assert r.report_type == e.report_type
    assert r.has_bundle_data == (e.report_type != BROKER_LOAD_DATA)
    assert tuple(i.kind for i in r.issues) == e.issues
    for bundle, (topics, consumers) in e.bundles.items():
        s = r.last_stats[bundle]
        assert (s.topics, s.consumer_count) == (topics, consumers)


@pytest.mark.parametrize("name", sorted(CASES))
def test_columnar_decoder_agrees_with_the_codec(name: str) -> None:
    e = CASES[name]
    got = decode_report_columns(_raw(name), e.key)
    assert got == columns_from_report(decode_report(_raw(name), e.key))
    _check(got.head, e)
    assert sorted(got.names) == sorted(e.bundles)


SETTINGS = ParseSettings(
    max_report_bytes=LoadBalancerConfig().max_report_bytes,
    n_shards=4,
    weights=weights_from_config(LoadBalancerConfig()),
)


@pytest.mark.parametrize("name", sorted(CASES))
def test_streaming_parse_makes_a_report_row(name: str) -> None:
    e = CASES[name]
    key = e.key.encode() if e.key else None
    rows = parse_record(_raw(name), key, "reports", 0, 7, 1_700_000_000_000, SETTINGS)
    assert rows[0][1] == REPORT and rows[0][2] == e.broker
    assert [r[1] for r in rows[1:]] == [SAMPLES] * len(rows[1:])
    assert len(rows) - 1 == len({shard_of(b, SETTINGS.n_shards) for b in e.bundles})
    doc = json.loads(rows[0][-1])
    assert doc.get("reportIssues", {}) == {k: 1 for k in e.issues}
    # the row's document is re-read by the driver and the snapshot: same figures
    again = decode_report(json.dumps(doc), e.broker)
    _check(again, e)
    assert again.report_type == e.report_type


@pytest.mark.parametrize("name", sorted(CASES))
def test_decide_snapshot_reads_the_report(name: str) -> None:
    e = CASES[name]
    doc = json.loads(_raw(name))
    snapshot = {"snapshotVersion": 1, "brokers": {e.broker: {"report": doc}}}
    view = parse_snapshot(json.dumps(snapshot)).view
    _check(view.brokers[e.broker].report, e)


class _Host:
    """psutil's view: host RAM, no direct memory; the broker's own figures must win."""

    def sample(self, now_ms: int) -> HostUsage:
        r = ResourceUsage(1.0, 2.0)
        return HostUsage(r, ResourceUsage(60_000.0, 64_000.0), ResourceUsage(0.0, 0.0), r, r)


@pytest.mark.parametrize("name", sorted(CASES))
def test_agent_provider_reads_the_document(name: str, tmp_path: Path) -> None:
    e = CASES[name]
    path = tmp_path / name
    path.write_bytes(_raw(name))
    snap = FileStatsProvider(path).fetch()
    assert snap.report_type == e.report_type
    assert snap.bundles == frozenset(e.bundles)
    assert tuple(i.kind for i in snap.issues) == e.issues
    host = _Host().sample(0)
    r = build_report("agent-broker", host, snap, 0)
    for attr in ("cpu", "memory", "direct_memory", "bandwidth_in"):
        own = getattr(e, attr)
        assert getattr(r, attr) == (own if own.known else getattr(host, attr)), attr


def test_stock_broker_conf_loads_with_one_summary_line() -> None:
    config, found = load_config_details(conf_text=(DOCUMENTS / "broker.conf").read_text())
    (warning,) = found.warnings
    assert "not load-balancer settings" in warning and "--verbose" in warning
    assert len(found.ignored_keys) > 100 and "brokerServicePort" in found.ignored_keys
    assert not any(k.startswith("loadBalancer") for k in found.ignored_keys)
    noted = {n.split(":", 2)[1].strip().split("=")[0] for n in found.notes}
    assert {"loadManagerClassName", "loadBalancerDebugModeEnabled"} <= noted
    # the stock values are read (ThresholdShedder is the stock shedder, memory weight 1.0 in
    # the deprecated section), and the empty NIC override means "what the OS reports"
    assert config.shedding_strategy_name == "ThresholdShedder"
    assert config.placement_strategy_name == "LeastLongTermMessageRate"
    assert config.load_balancer_memory_resource_weight == 1.0
    assert config.load_balancer_override_broker_nic_speed_gbps is None
    assert config.load_balancer_namespace_maximum_bundles == 128
