"""``lbctl decide --lookup`` and the snapshot's ``policies``: lookups placed as the controller
places them, under the snapshot's placement policies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadbalance.errors import InvalidInput
from loadbalance.snapshot import parse_snapshot
from tests.unit.test_snapshot import ROOT, decide, example

POLICY_EXAMPLE = json.loads((ROOT / "examples" / "snapshot-policies.json").read_text())
B1, B2, B3 = "broker-1:8080", "broker-2:8080", "broker-3:8080"
FULL = "0x00000000_0xffffffff"


def lookups(tmp_path: Path, doc: dict, *bundles: str, extra: tuple[str, ...] = ()) -> list[dict]:
    argv = [a for b in bundles for a in ("--lookup", b)]
    rc, out, err = decide(tmp_path, doc, *argv, *extra)
    assert rc == 0, err
    return [json.loads(line) for line in out.splitlines()]


def test_heartbeat_and_sla_bundles_go_to_their_own_broker(tmp_path: Path) -> None:
    """On the example snapshot the least loaded broker is broker-3; each heartbeat and SLA
    bundle still goes to the broker it names."""
    names = [f"pulsar/use/{B1}/{FULL}", f"pulsar/{B2}/{FULL}", f"sla-monitor/use/{B1}/{FULL}"]
    got = lookups(tmp_path, example(), *names)
    assert [(g["bundle"], g["owner"], g["candidates"]) for g in got] == [
        (names[0], B1, [B1]),
        (names[1], B2, [B2]),
        (names[2], B1, [B1]),
    ]


def test_policies_are_parsed_into_the_view() -> None:
    snap = parse_snapshot(json.dumps(POLICY_EXAMPLE))
    assert snap.view.policies.is_isolated("payments/eu")
    assert snap.view.policies.anti_affinity_group_of("orders/replica-a") == "orders"
    assert parse_snapshot(json.dumps(example())).view.policies.empty


def test_bad_policies_are_refused_naming_the_field() -> None:
    doc = example(policies={"namespaceIsolationPolicies": {"p": {"namespaces": ["a/.*"]}}})
    with pytest.raises(InvalidInput, match=r"snapshot\.policies\.namespaceIsolationPolicies\.p"):
        parse_snapshot(json.dumps(doc))


def test_lookups_honour_isolation_and_anti_affinity(tmp_path: Path) -> None:
    """payments/* only on broker-1; the two orders replicas on different failure domains;
    other namespaces only on the shared brokers 2 and 3."""
    got = lookups(
        tmp_path,
        POLICY_EXAMPLE,
        f"payments/eu/{FULL}",
        f"orders/replica-a/{FULL}",
        f"orders/replica-b/{FULL}",
        f"public/other/{FULL}",
    )
    assert got[0]["owner"] == B1 and got[0]["candidates"] == [B1]
    assert {got[1]["owner"], got[2]["owner"]} == {B2, B3}
    assert got[3]["owner"] in (B2, B3) and B1 not in got[3]["candidates"]


def test_no_eligible_broker_gives_a_null_owner_and_a_reason(tmp_path: Path) -> None:
    doc = json.loads(json.dumps(POLICY_EXAMPLE))
    iso = doc["policies"]["namespaceIsolationPolicies"]["payments-isolation"]
    iso["primary"] = ["broker-9"]
    (got,) = lookups(tmp_path, doc, f"payments/eu/{FULL}")
    assert got["owner"] is None and got["candidates"] == []
    assert "payments-isolation" in got["reason"]


def test_a_reported_bundle_keeps_its_owner(tmp_path: Path) -> None:
    (got,) = lookups(tmp_path, example(), "public/default/0x00000000_0x20000000")
    assert got["owner"] == B1 and got["alreadyOwned"] is True


def test_a_bad_bundle_name_exits_2(tmp_path: Path) -> None:
    rc, out, err = decide(tmp_path, example(), "--lookup", "not-a-bundle")
    assert rc == 2 and out == "" and "not-a-bundle" in err
