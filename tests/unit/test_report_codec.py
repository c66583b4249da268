"""Load-report decoding: Pulsar's LocalBrokerData JSON in, validated model out, errors named."""

from __future__ import annotations

import contextlib
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadbalance.errors import InvalidReport
from loadbalance.model import LocalBrokerData, NamespaceBundleStats, ResourceUsage
from loadbalance.report_codec import decode_report, encode_report, report_to_dict

BUNDLE = "public/default/0x00000000_0x40000000"

# Shaped like `pulsar-admin broker-stats load-report` output, with fields we do not model.
REAL_REPORT = {
    "webServiceUrl": "http://broker-1.example:8080",
    "webServiceUrlTls": "https://broker-1.example:8443",
    "pulsarServiceUrl": "pulsar://broker-1.example:6650",
    "persistentTopicsEnabled": True,
    "nonPersistentTopicsEnabled": True,
    "cpu": {"usage": 350.0, "limit": 800.0},
    "memory": {"usage": 1024.5, "limit": 4096.0},
    "directMemory": {"usage": 256.0, "limit": 2048.0},
    "bandwidthIn": {"usage": 50000.0, "limit": 1250000.0},
    "bandwidthOut": {"usage": 100000.0, "limit": 1250000.0},
    "msgThroughputIn": 1.5e6,
    "msgThroughputOut": 3.0e6,
    "msgRateIn": 1500.0,
    "msgRateOut": 3000.0,
    "lastUpdate": 1700000000123,
    "lastStats": {
        BUNDLE: {
            "msgRateIn": 1500.0,
            "msgThroughputIn": 1.5e6,
            "msgRateOut": 3000.0,
            "msgThroughputOut": 3.0e6,
            "consumerCount": 4,
            "producerCount": 2,
            "topics": 7,
            "cacheSize": 0,
        }
    },
    "numTopics": 7,
    "numBundles": 1,
    "numConsumers": 4,
    "numProducers": 2,
    "bundles": [BUNDLE],
    "lastBundleGains": [],
    "lastBundleLosses": [],
    "brokerVersionString": "4.0.1",
    "protocols": {},
    "advertisedListeners": {},
    "loadReportType": "LocalBrokerData",
    "maxResourceUsage": 0.4375,
}


def test_real_pulsar_report_is_accepted_with_unknown_fields_ignored() -> None:
    r = decode_report(json.dumps(REAL_REPORT).encode(), "broker-1.example:8080")
    assert r.broker == "broker-1.example:8080"
    assert r.cpu == ResourceUsage(350.0, 800.0)
    assert r.bundles == frozenset({BUNDLE})
    s = r.last_stats[BUNDLE]
    assert (s.msg_rate, s.topics, s.sessions) == (4500.0, 7, 6)
    assert r.max_resource_usage() == pytest.approx(0.4375)
    assert r.last_update_ms == 1700000000123


def test_broker_id_falls_back_to_web_service_url() -> None:
    r = decode_report(json.dumps(REAL_REPORT))
    assert r.broker == "broker-1.example:8080"


def test_round_trip_through_encode() -> None:
    r = decode_report(json.dumps(REAL_REPORT), "b1")
    again = decode_report(encode_report(r), "b1")
    assert report_to_dict(again) == report_to_dict(r)


def _with(path: list[str], value: object) -> bytes:
    doc = json.loads(json.dumps(REAL_REPORT))
    node = doc
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("raw", "field", "words"),
    [
        (b"not json", "record", "not valid JSON"),
        (b"[1,2]", "record", "JSON object"),
        (_with(["msgRateIn"], "fast"), "msgRateIn", "must be a number"),
        (_with(["msgRateIn"], -1), "msgRateIn", "negative"),
        (_with(["msgRateOut"], True), "msgRateOut", "must be a number"),
        (_with(["cpu"], {"usage": 10.0}), "cpu.limit", "without limit"),
        (_with(["cpu"], 5), "cpu", "usage and limit"),
        (_with(["cpu", "usage"], 1e9), "cpu.usage", "its limit"),
        (_with(["numTopics"], 1.5), "numTopics", "whole number"),
        (_with(["bundles"], ["public/default/0x1_0x2"]), "bundles[0]", "0xLLLLLLLL"),
        (_with(["bundles"], ["public/default/0x80000000_0x40000000"]), "bundles[0]", "lower"),
        (_with(["bundles"], "x"), "bundles", "list"),
        (_with(["lastStats"], {"bad-name": {}}), "lastStats['bad-name']", "tenant/ns"),
        (_with(["lastStats", BUNDLE, "topics"], -3), f"lastStats['{BUNDLE}'].topics", "negative"),
        (_with(["lastStats", BUNDLE], []), f"lastStats['{BUNDLE}']", "object"),
    ],
)
def test_bad_reports_name_the_field(raw: bytes, field: str, words: str) -> None:
    with pytest.raises(InvalidReport) as e:
        decode_report(raw, "b1")
    assert e.value.field == field
    assert words in e.value.reason


def test_nan_and_infinity_are_rejected() -> None:
    raw = json.dumps(REAL_REPORT).replace("1500.0", "NaN", 1).encode()
    with pytest.raises(InvalidReport, match="finite"):
        decode_report(raw, "b1")
    raw = json.dumps(REAL_REPORT).replace("3000.0", "Infinity", 1).encode()
    with pytest.raises(InvalidReport, match="finite"):
        decode_report(raw, "b1")


def test_size_limit_is_checked_before_parsing() -> None:
    huge = b"{" + b" " * 2000 + b"}"
    with pytest.raises(InvalidReport, match="exceeds the limit of 1000"):
        decode_report(huge, "b1", max_bytes=1000)


def test_record_without_key_or_url_is_rejected() -> None:
    with pytest.raises(InvalidReport) as e:
        decode_report(b"{}")
    assert e.value.field == "key"


def test_invalid_utf8_and_deep_nesting_are_errors_not_crashes() -> None:
    with pytest.raises(InvalidReport):
        decode_report(b'{"cpu": "\xff\xfe"}', "b1")
    with pytest.raises(InvalidReport):
        decode_report(b"[" * 100_000 + b"]" * 100_000, "b1", max_bytes=10**6)


json_values = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=True) | st.integers() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)
report_keys = st.sampled_from(
    ["cpu", "memory", "bandwidthIn", "msgRateIn", "numTopics", "bundles", "lastStats", "lastUpdate",
     "webServiceUrl", "brokerVersionString"]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(report_keys, json_values, max_size=6))
def test_arbitrary_documents_give_a_model_or_invalid_report(doc: dict) -> None:
    raw = json.dumps(doc, allow_nan=True).encode()
    try:
        r = decode_report(raw, "b1")
    except InvalidReport as e:
        assert e.field and e.reason
        return
    assert isinstance(r, LocalBrokerData)
    for v in (r.msg_rate_in, r.msg_throughput_in, r.cpu.usage, r.cpu.limit):
        assert math.isfinite(v) and v >= 0


@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_crash(raw: bytes) -> None:
    with contextlib.suppress(InvalidReport):
        decode_report(raw, "b1")


def test_capped_weighted_usage_ignores_signals_over_100_percent() -> None:
    r = LocalBrokerData(
        broker="b",
        cpu=ResourceUsage(1200, 800),  # 150 %: a measurement glitch per ThresholdShedder
        bandwidth_in=ResourceUsage(60, 100),
    )
    assert r.max_resource_usage_with_weight(1, 0, 0, 1, 1) == pytest.approx(1.5)
    assert r.max_resource_usage_with_weight_capped(1, 0, 0, 1, 1) == pytest.approx(0.6)


def test_bundle_stats_sums() -> None:
    s = NamespaceBundleStats(1, 2, 3, 4, 5, 6, 7)
    assert (s.msg_rate, s.msg_throughput, s.sessions) == (3, 7, 13)
