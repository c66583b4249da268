"""One named test per hole the fuzzer found, so each stays closed on its own.

Each of these records was accepted, or crashed a codec into the ``internal:`` last resort, before
the hardening in ``loadbalance/report_codec.py`` and ``loadbalance/decisions.py``; the secret
tests pin the ``SecretText`` behaviour the clients rely on (``str`` is the value, ``repr`` is
masked, pickling keeps both).
"""

from __future__ import annotations

import json
import pickle

import pytest

from loadbalance.config import SecretText, load_config, redact_url
from loadbalance.decisions import decode_decision
from loadbalance.errors import InvalidDecision, InvalidReport
from loadbalance.report_codec import MAX_REASON_CHARS, decode_report

NS = "acme/orders"
B0, B1 = f"{NS}/0x00000000_0x40000000", f"{NS}/0x40000000_0x80000000"


def _report(**fields: object) -> bytes:
    doc = {"webServiceUrl": "http://broker-1:8080", "lastStats": {B0: {"msgRateIn": 1.0}}}
    doc.update(fields)
    return json.dumps(doc).encode()


def _decision(**fields: object) -> bytes:
    doc = {
        "schemaVersion": 1,
        "id": "0123456789abcdef",
        "kind": "unload",
        "bundle": B0,
        "sourceBroker": "broker-1:8080",
    }
    doc.update(fields)
    return json.dumps(doc).encode()


def test_integer_beyond_float_range_is_a_reason_not_an_internal_error() -> None:
    with pytest.raises(InvalidReport, match="out of range"):
        decode_report(_report(msgRateIn=10**400))


def test_number_above_2_pow_53_is_implausible() -> None:
    with pytest.raises(InvalidReport, match="implausibly large"):
        decode_report(_report(msgThroughputIn=1e300))


def test_overlapping_bundles_in_one_report_are_refused() -> None:
    with pytest.raises(InvalidReport, match="overlap"):
        decode_report(_report(bundles=[B0, f"{NS}/0x20000000_0x60000000"]))
    # adjacent bundles and the same range in two namespaces are fine
    decode_report(_report(bundles=[B0, B1, "other/ns/0x00000000_0x40000000"]))


def test_encoded_and_escaped_surrogates_are_refused() -> None:
    with pytest.raises(InvalidReport, match="UnicodeDecodeError"):
        decode_report(_report().replace(b"broker-1", b"broker-\xed\xa0\x80"), "k")
    with pytest.raises(InvalidReport, match="surrogate"):
        decode_report(_report(brokerVersionString="4.0\ud800"), "k")
    with pytest.raises(InvalidDecision, match="surrogate"):
        decode_decision(_decision(reason="Overloaded\udfff"))


def test_bundle_name_with_a_trailing_newline_is_refused() -> None:
    # a report skips the name (and names it); the rest of the report stands
    r = decode_report(_report(bundles=["acme/orders\n/0x00000000_0x40000000"]))
    assert r.bundles == {B0}
    assert "unprintable" in r.issues[0].reason
    with pytest.raises(InvalidDecision, match="unprintable"):
        decode_decision(_decision(bundle="acme/orders\n/0x00000000_0x40000000"))


def test_reasons_of_huge_records_are_capped() -> None:
    name = f"{NS}/" + "x" * 500_000
    (issue,) = decode_report(_report(lastStats={name: {}}), "k").issues
    assert len(issue.reason) <= MAX_REASON_CHARS and len(issue.field) <= MAX_REASON_CHARS
    long_ns = "acme/" + "x" * 500_000  # a refusal naming two such bundles is capped too
    overlapping = [f"{long_ns}/0x00000000_0x40000000", f"{long_ns}/0x20000000_0x60000000"]
    with pytest.raises(InvalidReport) as e:
        decode_report(_report(bundles=overlapping), "k")
    assert "chars in all" in e.value.reason and len(e.value.reason) <= MAX_REASON_CHARS


def test_schema_version_true_is_not_version_1() -> None:
    with pytest.raises(InvalidDecision, match="schemaVersion"):
        decode_decision(_decision(schemaVersion=True))


def test_split_points_must_lie_strictly_inside_the_bundle() -> None:
    for points in (["0x00000000"], ["0x40000000"], ["0x50000000"], ["0x10000000", "0x10000000"]):
        with pytest.raises(InvalidDecision, match="splitBoundaries"):
            decode_decision(_decision(kind="split", splitBoundaries=points))
    d = decode_decision(_decision(kind="split", splitBoundaries=["0x20000000"]))
    assert d.split_boundaries == (0x20000000,)


def test_merge_needs_an_adjacent_bundle_of_the_same_namespace() -> None:
    for other in (B0, f"{NS}/0x80000000_0xc0000000", "other/ns/0x40000000_0x80000000"):
        with pytest.raises(InvalidDecision, match="mergeBundle"):
            decode_decision(_decision(kind="merge", mergeBundle=other))
    assert decode_decision(_decision(kind="merge", mergeBundle=B1)).merge_bundle == B1


def test_decided_at_beyond_int64_is_refused() -> None:
    with pytest.raises(InvalidDecision, match="decidedAtMs"):
        decode_decision(_decision(decidedAtMs=2**64))


def test_secret_text_is_the_value_for_clients_and_masked_for_people() -> None:
    c, _ = load_config(
        overrides={"redisPassword": "hunter2", "redisUrl": "redis://u:p@ss@h:6379/0"}
    )
    assert isinstance(c.redis_password, SecretText)
    assert str(c.redis_password) == "hunter2" and f"{c.redis_password}" == "hunter2"
    assert repr(c.redis_password) == "'******'"
    assert repr(c.redis_url) == "'redis://u:******@h:6379/0'"  # up to the last @
    assert "hunter2" not in repr(c.model_dump())
    again = pickle.loads(pickle.dumps(c))  # the executors get the config pickled
    assert again.redis_password == "hunter2" and repr(again.redis_password) == "'******'"
    assert sorted(c.secret_values()) == ["hunter2", "p@ss"]
    assert redact_url("redis://h:6379") == "redis://h:6379"
    assert redact_url("rediss://:pw@h") == "rediss://:******@h"
