"""The two parse paths give the same rows for the same records.

The job parses reports either in ``mapInPandas`` after the source (``parse.parse_batches``, one
call per Arrow batch) or inside the Kafka source's reading task (``kafka_reads.
read_parsed_offset_range``: records decoded a chunk at a time, each broker's latest document
chosen over the whole run, then one Arrow batch). The state step must not be able to tell which
ran, so over many generated runs (good reports of a few brokers at clashing event times, and the
fuzz corpus's hostile and tolerated ones) both paths must yield equal ``ParsedRow`` lists, field
by field, payload bytes included.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from typing import Any

import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadbalance.config import LoadBalancerConfig
from loadbalance.cycle import weights_from_config
from streaming import kafka_reads, kafka_source, parse
from streaming.schema import PARSED_FIELDS, ParsedRow
from tests.fuzz.corpus import report_cases, valid_report

SETTINGS = parse.ParseSettings(
    max_report_bytes=64 * 1024,
    n_shards=4,
    weights=weights_from_config(LoadBalancerConfig()),
)
TOPIC, PARTITION = "reports", 3


def _records(seed: int, n: int) -> list[tuple[bytes | None, bytes | None, int, int]]:
    """(value, key, offset, event_ms): good reports of three brokers, at event times that
    clash and go back, mixed with the corpus's bad and tolerated reports."""
    rng = random.Random(seed)
    bad = report_cases(n, seed, valid_share=0.0, max_bytes=SETTINGS.max_report_bytes)
    out = []
    for offset in range(n):
        event_ms = 1_700_000_000_000 + rng.choice((0, 0, 5, 10, 10, 15)) * 1000
        if rng.random() < 0.6:
            broker = f"b{rng.randint(1, 3)}:8080"
            doc = valid_report(rng, broker)
            value, key = json.dumps(doc).encode(), broker.encode()
        else:
            case = next(bad)
            value, key = case.value, case.key
        out.append((value, key, offset, event_ms))
    return out


def _by_mapinpandas(records: list[tuple[Any, ...]]) -> list[ParsedRow]:
    pdf = pd.DataFrame(
        {
            "value": [r[0] for r in records],
            "key": [r[1] for r in records],
            "topic": [TOPIC] * len(records),
            "partition": [PARTITION] * len(records),
            "offset": [r[2] for r in records],
            "timestamp_ms": [r[3] for r in records],
        }
    )
    out = pd.concat(list(parse.parse_batches(SETTINGS)(iter([pdf]))), ignore_index=True)
    assert list(out.columns) == [name for name, _ in PARSED_FIELDS]
    return [ParsedRow(*row) for row in out.itertuples(index=False, name=None)]


def _by_source(
    records: list[tuple[Any, ...]], cuts: list[int], monkeypatch: Any
) -> list[ParsedRow]:
    """The source's reading task, its consumer replaced by chunks cut at ``cuts``."""
    bounds = [0, *sorted({c % (len(records) + 1) for c in cuts}), len(records)]

    def chunks(config: Any, part: Any, chunk_bytes: int = 0) -> Any:
        for lo, hi in itertools.pairwise(bounds):
            if lo < hi:
                part_records = records[lo:hi]
                yield {
                    "key": [r[1] for r in part_records],
                    "value": [r[0] for r in part_records],
                    "topic": [TOPIC] * len(part_records),
                    "partition": [PARTITION] * len(part_records),
                    "offset": [r[2] for r in part_records],
                    "timestamp": [r[3] * 1000 for r in part_records],
                    "timestampType": [0] * len(part_records),
                }

    monkeypatch.setattr(kafka_reads, "_read_columns", chunks)
    config = kafka_source.KafkaSourceConfig("unused:9092", (TOPIC,), parse=SETTINGS.to_json())
    part = kafka_source.KafkaOffsetRange(TOPIC, PARTITION, 0, len(records))
    batches = list(kafka_reads.read_parsed_offset_range(config, part))
    return [ParsedRow(**d) for b in batches for d in b.to_pylist()]


def _comparable(row: ParsedRow) -> tuple[Any, ...]:
    """A row with NaN made equal to itself and numbers as Python numbers."""
    out = []
    for v in row:
        if isinstance(v, float) and math.isnan(v):
            out.append("NaN")
        elif hasattr(v, "item"):  # a NumPy scalar from pandas
            out.append(v.item())
        else:
            out.append(v)
    return tuple(out)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 30),
    cuts=st.lists(st.integers(0, 30), max_size=4),
)
def test_both_parse_paths_give_equal_rows(monkeypatch, seed: int, n: int, cuts: list[int]) -> None:
    records = _records(seed, n)
    plain = _by_mapinpandas(records)
    in_source = _by_source(records, cuts, monkeypatch)
    assert [_comparable(r) for r in in_source] == [_comparable(r) for r in plain]
    # every broker's latest report kept its whole document (the choice finish_rows makes over
    # the run, which the source makes over its chunks put together)
    reports = [r for r in plain if r.kind == "report"]
    full = [r.key for r in reports if r.payload is not None and b'"webServiceUrl"' in r.payload]
    assert sorted(full) == sorted({r.key for r in reports})


def test_rows_are_read_by_name_and_stay_plain_tuples() -> None:
    rows = parse.parse_record(
        json.dumps(valid_report(random.Random(1), "b1:8080")).encode(),
        b"b1:8080",
        TOPIC,
        PARTITION,
        7,
        1_700_000_000_000,
        SETTINGS,
    )
    head = rows[0]
    assert isinstance(head, tuple) and ParsedRow._fields == tuple(n for n, _ in PARSED_FIELDS)
    assert (head.kind, head.broker, head.offset, head.partition) == ("report", "b1:8080", 7, 3)
    assert json.loads(head.payload)["webServiceUrl"] == "http://b1:8080"
