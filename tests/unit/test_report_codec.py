"""Load-report decoding: Pulsar's LocalBrokerData JSON in, validated model out, errors named."""

from __future__ import annotations

import contextlib
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadbalance.bundles import is_system_service_bundle, parse_bundle
from loadbalance.errors import InvalidReport
from loadbalance.model import (
    BUNDLE_SKIPPED,
    READING_IGNORED,
    UNKNOWN_USAGE,
    LocalBrokerData,
    NamespaceBundleStats,
    ResourceUsage,
)
from loadbalance.report_codec import (
    MAX_USAGE_OVER_LIMIT,
    decode_report,
    decode_report_columns,
    encode_report,
    report_to_dict,
)
from loadbalance.report_columns import bundle_columns, columns_from_report

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
        (_with(["numTopics"], 1.5), "numTopics", "whole number"),
        (_with(["bundles"], "x"), "bundles", "list"),
        (_with(["lastStats"], "x"), "lastStats", "object"),
        (
            _with(["bundles"], [BUNDLE, "public/default/0x20000000_0x60000000"]),
            "bundles",
            "overlap",
        ),
    ],
)
def test_structurally_broken_reports_are_refused_naming_the_field(
    raw: bytes, field: str, words: str
) -> None:
    with pytest.raises(InvalidReport) as e:
        decode_report(raw, "b1")
    assert e.value.field == field
    assert words in e.value.reason


@pytest.mark.parametrize(
    ("raw", "kind", "field", "words"),
    [
        (_with(["cpu"], {"usage": 10.0}), READING_IGNORED, "cpu.limit", "without limit"),
        (_with(["cpu"], 5), READING_IGNORED, "cpu", "usage and limit"),
        (_with(["cpu", "usage"], 1e9), READING_IGNORED, "cpu.usage", "its limit"),
        (_with(["cpu", "usage"], "90%"), READING_IGNORED, "cpu.usage", "must be a number"),
        (_with(["bundles"], ["public/default/0x1_0x2"]), BUNDLE_SKIPPED, "bundles[0]", "0xLLL"),
        (
            _with(["bundles"], ["public/default/0x80000000_0x40000000"]),
            BUNDLE_SKIPPED,
            "bundles[0]",
            "lower",
        ),
        (
            _with(["lastStats"], {"bad-name": {}, BUNDLE: {"msgRateIn": 1.0}}),
            BUNDLE_SKIPPED,
            "lastStats['bad-name']",
            "tenant/ns",
        ),
        (
            _with(["lastStats", BUNDLE, "topics"], -3),
            READING_IGNORED,
            f"lastStats['{BUNDLE}'].topics",
            "negative",
        ),
        (_with(["lastStats", BUNDLE], []), READING_IGNORED, f"lastStats['{BUNDLE}']", "object"),
    ],
)
def test_a_broken_item_is_ignored_and_named_and_the_rest_of_the_report_stands(
    raw: bytes, kind: str, field: str, words: str
) -> None:
    r = decode_report(raw, "b1")
    (issue,) = r.issues
    assert (issue.kind, issue.field) == (kind, field)
    assert words in issue.reason
    assert dict(r.issue_counts) == {kind: 1}
    # everything else is read as in the clean report
    clean = decode_report(json.dumps(REAL_REPORT), "b1")
    assert r.msg_rate_in == clean.msg_rate_in and r.bandwidth_out == clean.bandwidth_out
    if field.startswith("cpu"):
        assert r.cpu == UNKNOWN_USAGE and r.bundles == clean.bundles
        assert r.max_resource_usage() == pytest.approx(1024.5 / 4096.0)  # memory, not cpu
    if field.startswith(f"lastStats['{BUNDLE}']"):
        assert BUNDLE in r.bundles and BUNDLE not in r.last_stats  # owned, stats unusable
    if field.startswith("bundles"):
        assert r.bundles == clean.bundles


def test_minus_one_is_unknown_and_left_out_of_max_usage() -> None:
    """Pulsar 2.10 on a host without a NIC reading (GenericBrokerHostUsageImpl) keeps
    bandwidth at ResourceUsage(-1, -1), its initial value; a limit of 0 is unknown too."""
    doc = json.loads(json.dumps(REAL_REPORT))
    doc["bandwidthIn"] = {"usage": -1.0, "limit": -1.0}
    doc["bandwidthOut"] = {"usage": -1.0, "limit": -1.0}
    doc["directMemory"] = {"usage": 12.0, "limit": 0.0}
    r = decode_report(json.dumps(doc), "b1")
    assert r.issues == () and r.issue_counts == ()
    assert r.bandwidth_in == ResourceUsage(-1.0, -1.0) and not r.bandwidth_in.known
    assert not r.direct_memory.known and r.direct_memory.percent_usage() == 0.0
    assert r.max_resource_usage() == pytest.approx(350.0 / 800.0)  # cpu, the largest known
    assert r.max_resource_usage_with_weight(0, 0, 1, 1, 1) == 0.0
    assert r.max_resource_usage_with_weight_capped(1, 1, 1, 1, 1) == pytest.approx(0.4375)
    # a negative usage against a known limit is unknown as well
    doc["cpu"] = {"usage": -1.0, "limit": 800.0}
    r = decode_report(json.dumps(doc), "b1")
    assert r.cpu.percent_usage() == 0.0
    assert r.max_resource_usage() == pytest.approx(1024.5 / 4096.0)
    # and it survives a round trip through the encoder
    assert decode_report(encode_report(r), "b1").cpu == ResourceUsage(-1.0, 800.0)


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
    for v in (r.msg_rate_in, r.msg_throughput_in):
        assert math.isfinite(v) and v >= 0
    for res in (r.cpu, r.memory, r.bandwidth_in):
        assert math.isfinite(res.usage) and math.isfinite(res.limit)
        assert 0.0 <= res.percent_usage() <= 100.0 * MAX_USAGE_OVER_LIMIT
    assert len(r.issues) <= sum(n for _, n in r.issue_counts)


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


def test_threshold_shedder_test_memory_5000_of_100_is_ignored_other_readings_count() -> None:
    """Pulsar's ThresholdShedderTest feeds memory 5000 of 100 (50x its limit): the codec ignores
    that reading (counted) and the broker is judged by its other readings. Between 100 % and
    10x a reading is kept, and only the within-limit max leaves it out, as Pulsar's does."""
    doc = json.loads(json.dumps(REAL_REPORT))
    doc["memory"] = {"usage": 5000.0, "limit": 100.0}
    r = decode_report(json.dumps(doc), "b1")
    assert r.memory == UNKNOWN_USAGE and dict(r.issue_counts) == {READING_IGNORED: 1}
    assert r.max_resource_usage() == pytest.approx(0.4375)
    doc["memory"] = {"usage": 500.0, "limit": 100.0}
    r = decode_report(json.dumps(doc), "b1")
    assert r.memory == ResourceUsage(500.0, 100.0) and r.issues == ()
    assert r.max_resource_usage() == pytest.approx(5.0)
    assert r.max_resource_usage_with_weight_capped(1, 1, 1, 1, 1) == pytest.approx(0.4375)


def test_bundle_stats_sums() -> None:
    s = NamespaceBundleStats(1, 2, 3, 4, 5, 6, 7)
    assert (s.msg_rate, s.msg_throughput, s.sessions) == (3, 7, 13)


def test_pulsar_system_namespaces_are_accepted_flagged_and_counted_like_any_bundle() -> None:
    """Every broker owns its heartbeat namespace (v1 ``pulsar/<cluster>/<host:port>``, v2
    ``pulsar/<host:port>``) and may own ``sla-monitor/<cluster>/<host:port>``
    (``NamespaceService``'s patterns); they appear in real ``bundles``/``lastStats``."""
    system = [
        "pulsar/us-west/broker-1.example:8080/0x00000000_0xffffffff",
        "pulsar/broker-1.example:8080/0x00000000_0xffffffff",
        "sla-monitor/us-west/broker-1.example:8080/0x00000000_0xffffffff",
        "pulsar/system/0x00000000_0x40000000",
    ]
    doc = json.loads(json.dumps(REAL_REPORT))
    doc["bundles"] += system
    for name in system:
        doc["lastStats"][name] = {"msgRateIn": 1.0, "topics": 1}
    r = decode_report(json.dumps(doc), "b1")
    assert r.issues == () and r.bundles == {BUNDLE, *system}
    assert {b for b in r.bundles if parse_bundle(b).is_system_service} == set(system)
    assert all(is_system_service_bundle(b) for b in system)
    assert not parse_bundle(BUNDLE).is_system_service
    # the column checks take such a report as it is (a real broker's report always carries its
    # heartbeat bundle), with the per-bundle rules' result
    assert bundle_columns(doc["lastStats"], doc["bundles"]) is not None
    assert decode_report_columns(json.dumps(doc), "b1") == columns_from_report(r)


@pytest.mark.parametrize(
    "name",
    [
        "tenant/cluster/ns/0x00000000_0xffffffff",  # an ordinary v1 namespace: not supported
        "pulsar/us-west/broker-1:http/0x00000000_0xffffffff",  # no port
        "sla-monitor/us-west/a/b:80/0x00000000_0xffffffff",  # five parts
    ],
)
def test_other_three_part_namespaces_are_skipped_not_fatal(name: str) -> None:
    doc = json.loads(json.dumps(REAL_REPORT))
    doc["bundles"].append(name)
    r = decode_report(json.dumps(doc), "b1")
    assert r.bundles == {BUNDLE}
    assert [(i.kind, i.field) for i in r.issues] == [(BUNDLE_SKIPPED, "bundles[1]")]


def test_simple_load_report_bundle_stats_are_read_and_its_totals_summed() -> None:
    """``LoadReport``'s getters sum its ``bundleStats``; its written ``msgThroughputIn`` is the
    msg rate (a Pulsar getter bug), so the codec sums the stats instead."""
    other = "public/default/0x40000000_0x80000000"
    doc = {
        "name": "broker-9:8080",
        "loadReportType": "LoadReport",
        "timestamp": 1700000000000,
        "msgThroughputIn": 7.0,  # really msgRateIn
        "systemResourceUsage": {"cpu": {"usage": 100.0, "limit": 400.0}},
        "cpu": {"usage": 1.0, "limit": 2.0},  # Jackson's top-level copy: not used when nested
        "bundleStats": {
            BUNDLE: {"msgRateIn": 3.0, "msgThroughputIn": 300.0, "topics": 2, "producerCount": 1},
            other: {"msgRateIn": 4.0, "msgThroughputIn": 400.0, "topics": 5, "consumerCount": 3},
        },
    }
    r = decode_report(json.dumps(doc))
    assert (r.broker, r.report_type, r.last_update_ms) == (
        "broker-9:8080",
        "LoadReport",
        1700000000000,
    )
    assert r.bundles == {BUNDLE, other} and r.num_bundles == 2
    assert (r.msg_rate_in, r.msg_throughput_in) == (7.0, 700.0)
    assert (r.num_topics, r.num_consumers, r.num_producers) == (7, 3, 1)
    assert r.cpu == ResourceUsage(100.0, 400.0)
    # re-encoded as LocalBrokerData, re-read with its kind kept
    again = decode_report(encode_report(r), r.broker)
    assert again.report_type == "LoadReport" and again.last_stats == r.last_stats


def _leaf_paths(doc: object, prefix: tuple = ()) -> list[tuple]:
    """Every path to a leaf value of a JSON document (dict keys and list indexes)."""
    if isinstance(doc, dict):
        return [p for k, v in doc.items() for p in _leaf_paths(v, (*prefix, k))] or [prefix]
    if isinstance(doc, list):
        return [p for i, v in enumerate(doc) for p in _leaf_paths(v, (*prefix, i))] or [prefix]
    return [prefix]


_REPORT_PATHS = _leaf_paths(REAL_REPORT)
_HOSTILE = (
    st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e308, -1.0, -(10**18), 2**63])
    | st.sampled_from([None, True, "x", "", [], {}, {"usage": "a"}, [1, 2]])
    | json_values
)


@settings(max_examples=400, deadline=None)
@given(path=st.sampled_from(_REPORT_PATHS), value=_HOSTILE)
def test_a_real_report_with_one_hostile_field_is_read_or_refused_naming_it(
    path: tuple, value: object
) -> None:
    """Every case is valid JSON shaped like a real report with one field made hostile, so the
    decoder's validation paths run (random bytes almost never reach them). The answer is a
    refusal that names a field, or a model whose figures are all finite and in range."""
    doc = json.loads(json.dumps(REAL_REPORT))
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    raw = json.dumps(doc, allow_nan=True).encode()
    try:
        r = decode_report(raw, "b1")
    except InvalidReport as e:
        assert e.field and e.reason
        return
    for v in (r.msg_rate_in, r.msg_rate_out, r.msg_throughput_in, r.msg_throughput_out):
        assert math.isfinite(v) and v >= 0
    for res in (r.cpu, r.memory, r.direct_memory, r.bandwidth_in, r.bandwidth_out):
        assert math.isfinite(res.usage) and math.isfinite(res.limit)
        assert 0.0 <= res.percent_usage() <= 100.0 * MAX_USAGE_OVER_LIMIT
    for name, stats in r.last_stats.items():
        assert parse_bundle(name).name == name
        for v in (stats.msg_rate_in, stats.msg_rate_out, stats.msg_throughput_in):
            assert math.isfinite(v) and v >= 0
        assert stats.topics >= 0 and stats.consumer_count >= 0
