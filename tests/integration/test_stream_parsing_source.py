"""The Kafka source that parses as it reads gives the parse stage's rows for the same records.

Real Apache Kafka, no Spark: the source's executor-side reader (``read_parsed_offset_range``) is
run on a partition range and compared with ``streaming.parse.parse_batches`` (the
``mapInPandas`` stage the built-in Kafka source feeds) over the same records read raw; plus the
rule that only each broker's latest report of a run keeps its document, which the state step
relies on.
"""

from __future__ import annotations

import pandas as pd
import pytest
from confluent_kafka import Producer

from loadbalance.bundles import NamespaceBundles
from loadbalance.model import LocalBrokerData, NamespaceBundleStats, ResourceUsage
from loadbalance.report_codec import encode_report
from loadbalance.view import UsageWeights
from streaming.job import records_read
from streaming.kafka_reads import read_offset_range, read_parsed_offset_range
from streaming.kafka_source import KafkaOffsetRange, KafkaSourceConfig
from streaming.parse import ParseSettings, parse_batches, parse_records
from streaming.schema import PARSED_FIELDS, REPORT

pytestmark = [pytest.mark.integration]

SETTINGS = ParseSettings(4 * 1024 * 1024, 4, UsageWeights(1.0, 0.25, 0.0, 0.1, 1.0 / 3.0))
NAMES = NamespaceBundles.initial("acme/parse", 8).bundle_names


def _report(broker: str, i: int) -> bytes:
    stats = {n: NamespaceBundleStats(10.0 + i + k, 5.0, 1e5, 5e4, 2, 1, 1) for k, n in
             enumerate(NAMES[:4] if broker.startswith("a") else NAMES[4:])}  # fmt: skip
    return encode_report(
        LocalBrokerData(
            broker=broker,
            cpu=ResourceUsage(30.0 + i, 100.0),
            bandwidth_in=ResourceUsage(10.0, 100.0),
            msg_throughput_in=1e5 * (i + 1),
            bundles=frozenset(stats),
            last_stats=stats,
        )
    )


def _publish(bootstrap: str, topic: str) -> list[tuple[bytes, bytes, int]]:
    records = []
    for i in range(3):
        for broker in ("a:8080", "b:8080"):
            records.append((broker.encode(), _report(broker, i), 1_700_000_000_000 + 1000 * i))
    records.append((b"a:8080", b"{not json", 1_700_000_003_000))  # a dead letter among them
    p = Producer({"bootstrap.servers": bootstrap})
    for key, value, ts in records:
        p.produce(topic, key=key, value=value, timestamp=ts, partition=0)
    assert p.flush(10) == 0
    return records


def _value(v: object) -> object:
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    return str(v) if isinstance(v, str) else v  # RowKind members as their text


def _rows(frame: pd.DataFrame) -> list[tuple]:
    return [tuple(_value(v) for v in row) for row in frame.itertuples(index=False)]


def test_parsing_source_rows_equal_the_parse_stage_rows_of_the_same_records(
    kafka_bootstrap, unique_topic
):
    topic = unique_topic(1, "parsing")
    records = _publish(kafka_bootstrap, topic)
    part = KafkaOffsetRange(topic, 0, 0, len(records))
    raw_config = KafkaSourceConfig(kafka_bootstrap, (topic,))
    raw = pd.concat([b.to_pandas() for b in read_offset_range(raw_config, part)])
    raw["timestamp_ms"] = raw["timestamp"].dt.as_unit("ms").astype("int64")
    expected = pd.concat(list(parse_batches(SETTINGS)(iter([raw]))), ignore_index=True)

    parsing = KafkaSourceConfig(kafka_bootstrap, (topic,), parse=SETTINGS.to_json())
    got = pd.concat([b.to_pandas() for b in read_parsed_offset_range(parsing, part)])

    assert list(got.columns) == [name for name, _ in PARSED_FIELDS]
    assert _rows(got) == _rows(expected)
    kinds = got["kind"].tolist()
    assert kinds.count("report") == 6 and kinds.count("dead") == 1
    # only the latest report of each broker carries its document
    with_doc = got[(got["kind"] == "report") & got["payload"].notna()]
    assert sorted(with_doc["offset"].tolist()) == [4, 5]


def test_only_each_brokers_latest_report_of_a_run_keeps_its_document():
    # offsets out of event-time order: the latest is by (event_ms, partition, offset)
    values = [_report("a:8080", 0), _report("a:8080", 1), _report("b:8080", 0),
              _report("a:8080", 2)]  # fmt: skip
    keys = [b"a:8080", b"a:8080", b"b:8080", b"a:8080"]
    rows = parse_records(values, keys, ["t"] * 4, [0, 0, 0, 1], [10, 11, 12, 3],
                         [5000, 9000, 1000, 9000], SETTINGS)  # fmt: skip
    reports = [r for r in rows if r[1] == REPORT]
    kept = {(r[2], r[5]) for r in reports if r[-1] is not None}
    assert kept == {("a:8080", 3), ("b:8080", 12)}  # a: event 9000 on partition 1 beats 0
    # every report keeps its usage and throughput, which the state step folds
    assert [r[5] for r in reports] == [10, 11, 12, 3]
    assert all(r[6] > 0 and r[7] > 0 for r in reports)


def test_parse_settings_cross_the_reader_option_bit_for_bit():
    assert ParseSettings.from_json(SETTINGS.to_json()) == SETTINGS


def test_records_read_counts_kafka_records_from_the_batch_offsets():
    batch = [{"startOffset": {"t": {"0": 5, "1": 7}}, "endOffset": {"t": {"0": 9, "1": 7}}}]
    assert records_read(batch) == 4
    first = [{"startOffset": None, "endOffset": '{"t": {"0": 3, "1": 4}}'}]
    assert records_read(first) is None
    assert records_read(first, unknown_start=0) == 7


def test_a_new_checkpoints_first_batch_is_counted_from_where_the_log_starts():
    """The Python data source's progress writes a first batch's start as the text ``None``;
    the job knows the start (earliest: the log's first offsets) and counts from there."""
    first = [{"startOffset": "None", "endOffset": '{"t": {"0": 14, "1": 4}}'}]
    assert records_read(first) is None
    assert records_read(first, {"t": {"0": 0, "1": 2}}) == 16
    assert records_read(first, {"t": {"0": 10}}) == 4  # a partition it does not know: not counted


def test_a_dropped_document_keeps_its_report_issues_for_the_batch_count():
    """An earlier report's document is dropped, but what the codec ignored in it is still
    summed into the latest report's ``reportIssues`` by the state step."""
    import json

    from streaming.state import with_batch_issues

    broken = json.loads(_report("a:8080", 0))
    broken["cpu"]["usage"] = "not a number"  # ignored and counted: reading_ignored
    values = [json.dumps(broken).encode(), _report("a:8080", 1)]
    rows = parse_records(values, [b"a:8080"] * 2, ["t"] * 2, [0, 0], [10, 11], [5000, 9000],
                         SETTINGS)  # fmt: skip
    reports = [r for r in rows if r[1] == REPORT]
    dropped, latest = reports[0][-1], reports[1][-1]
    assert json.loads(dropped) == {"reportIssues": {"reading_ignored": 1}}
    assert "reportIssues" not in json.loads(latest)
    merged = json.loads(with_batch_issues([p for p in (dropped, latest) if p is not None]))
    assert merged["reportIssues"] == {"reading_ignored": 1}
    assert merged["cpu"] == json.loads(latest)["cpu"]  # otherwise the latest report's own
