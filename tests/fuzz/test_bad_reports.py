"""55,000 malformed and hostile load reports through the streaming job's own parse step.

``streaming.parse.parse_record`` is the exact per-record function that ``mapInPandas`` runs on
the executors, so what holds here holds in the job: no exception escapes, every bad record
becomes exactly one dead-letter row whose reason comes from the codec (an ``internal:`` reason
would mean our code crashed and was only caught by the last-resort handler), every good record
still becomes a report row, a record whose only faults are per item (a broken reading, an
unusable bundle entry) becomes a report row that names what was ignored, every string handed to
Spark can be encoded by Arrow, and memory stays bounded while the whole corpus streams through.
"""

from __future__ import annotations

import itertools
import json
import tracemalloc
from collections import Counter

import psutil
from hypothesis import given, settings
from hypothesis import strategies as st

from loadbalance.config import LoadBalancerConfig
from loadbalance.cycle import weights_from_config
from streaming.parse import ParseSettings, parse_record
from streaming.schema import DEAD, REPORT, SAMPLES, ParsedRow
from tests.fuzz.corpus import REPORT_CLASSES, TOLERATED_REPORT_CLASSES, Case, report_cases

N_CASES = 55_000
TRACED_CASES = 6_000
RSS_GROWTH_BOUND_BYTES = 32 * 1024 * 1024
SEED = 20261123
# The corpus holds records of up to 1 MiB + 8 KiB and the parser copies one at a time; 64 MiB
# leaves room for that and for the giant templates, and fails if results were being kept.
PEAK_BOUND_BYTES = 64 * 1024 * 1024
# base64 of the 64 KiB value prefix, a key of up to 5,000 bytes, and two capped reason strings
DEAD_LETTER_BOUND_BYTES = 64 * 1024 * 4 // 3 + 5_000 + 4_096

SETTINGS = ParseSettings(
    max_report_bytes=LoadBalancerConfig().max_report_bytes,
    n_shards=8,
    weights=weights_from_config(LoadBalancerConfig()),
)


def _check_strings_encodable(row: tuple) -> None:
    """Arrow encodes every string column as UTF-8: a lone surrogate would fail the batch."""
    for v in row:
        if isinstance(v, str):
            v.encode("utf-8")


def run_report(case_value: bytes | None, key: bytes | None, offset: int) -> list[ParsedRow]:
    rows = parse_record(case_value, key, "reports", 0, offset, 1_700_000_000_000, SETTINGS)
    for row in rows:
        _check_strings_encodable(row)
    return rows


def _check_case(i: int, case: Case, dead: Counter[str]) -> None:
    rows = run_report(case.value, case.key, i)
    if case.cls in TOLERATED_REPORT_CLASSES:
        assert rows[0].kind == REPORT, (i, case.cls, case.note, rows)
        issues = json.loads(rows[0].payload).get("reportIssues", {})
        if case.cls == "unknown_reading":  # Pulsar's own "unknown": not an issue at all
            assert issues == {}, (i, case.note, issues)
        else:
            assert sum(issues.values()) >= 1, (i, case.cls, case.note)
        return
    if case.bad:
        assert len(rows) == 1 and rows[0].kind == DEAD, (i, case.cls, case.note)
        doc = json.loads(rows[0].payload)
        assert doc["reason"], (i, case.cls, case.note)
        assert not doc["reason"].startswith("internal"), (i, case.cls, case.note, doc)
        assert len(rows[0].payload) <= DEAD_LETTER_BOUND_BYTES, (i, case.cls)
        assert doc["offset"] == i and doc["valueBytes"] == len(case.value or b"")
        dead[case.cls] += 1
    else:
        kinds = [r.kind for r in rows]
        assert kinds[0] == REPORT and set(kinds[1:]) <= {SAMPLES}, (i, case.note, rows)


def test_hostile_report_corpus_is_dead_lettered_with_reasons_and_memory_stays_bounded() -> None:
    """tracemalloc costs ~6x here, so it watches the first ``TRACED_CASES`` (every class, the
    1 MiB records included); the process RSS must then stay flat over all the rest."""
    per_class: Counter[str] = Counter()
    dead: Counter[str] = Counter()
    cases = enumerate(report_cases(N_CASES, SEED, max_bytes=SETTINGS.max_report_bytes))
    tracemalloc.start()
    try:
        for i, case in itertools.islice(cases, TRACED_CASES):
            per_class[case.cls] += 1
            _check_case(i, case, dead)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert set(per_class) == set(REPORT_CLASSES) | set(TOLERATED_REPORT_CLASSES), per_class
    rss_before = psutil.Process().memory_info().rss
    for i, case in cases:
        per_class[case.cls] += 1
        _check_case(i, case, dead)
    rss_growth = psutil.Process().memory_info().rss - rss_before
    assert sum(per_class.values()) == N_CASES
    assert all(per_class[c] >= 1_000 for c in per_class), per_class
    tolerated = sum(per_class[c] for c in TOLERATED_REPORT_CLASSES)
    assert sum(dead.values()) == N_CASES - per_class["valid"] - tolerated
    assert peak < PEAK_BOUND_BYTES, f"peak {peak / 2**20:.1f} MiB"
    assert rss_growth < RSS_GROWTH_BOUND_BYTES, f"RSS grew {rss_growth / 2**20:.1f} MiB"


def test_each_class_is_refused_for_its_own_reason() -> None:
    """Spot-check that a class is refused by the rule meant for it, not by an accident."""
    expected = {
        "non_finite": ("finite", "out of range"),
        "negative": ("negative",),
        "overlap": ("overlap",),
        "gigantic": ("exceeds the limit",),
        "deep_nesting": ("RecursionError", "must be a number", "must be a"),
        "invalid_utf8": ("UnicodeDecodeError", "surrogate"),
    }
    seen: Counter[str] = Counter()
    for i, case in enumerate(report_cases(3_000, SEED + 1)):
        if case.cls not in expected:
            continue
        (row,) = run_report(case.value, case.key, i)
        reason = json.loads(row.payload)["reason"]
        assert any(w in reason for w in expected[case.cls]), (case.cls, case.note, reason)
        seen[case.cls] += 1
    assert set(seen) == set(expected)


_json = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=True) | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=30,
)
_keys = st.sampled_from(
    ["cpu", "memory", "msgRateIn", "numTopics", "lastStats", "bundles", "webServiceUrl",
     "lastUpdate", "brokerVersionString", "bandwidthIn"]
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(doc=st.dictionaries(_keys, _json, max_size=8), key=st.none() | st.binary(max_size=20))
def test_arbitrary_documents_never_escape_parse(doc: dict, key: bytes | None) -> None:
    """Hypothesis over the known field names with any JSON values: a row list, never a raise."""
    raw = json.dumps(doc).encode()
    rows = run_report(raw, key, 0)
    assert rows
    if rows[0].kind == DEAD:
        reason = json.loads(rows[0].payload)["reason"]
        assert reason and not reason.startswith("internal"), reason
