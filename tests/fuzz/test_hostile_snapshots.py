"""``lbctl decide`` over hostile snapshots: decisions, or exit 2 with one line naming a JSON
path; never a traceback.

A valid snapshot that fills every field the format has (broker entries with their history,
bundle data in both windows, namespaces, grace entries, topic hashes, config) is mutated by
hypothesis: any field or key set to NaN, infinity, a number beyond the float range, huge,
negative, fractional, of the wrong type, deeply nested, or a string with a lone surrogate;
keys renamed or deleted; invalid UTF-8 bytes spliced into the file. The command runs in this
process, so an exception anywhere in parsing, configuration or the policy cycle fails the test
with its traceback and the shrunk snapshot.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import io
import json
import math
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lbctl import decide_cmd
from loadbalance.bundles import parse_bundle
from loadbalance.report_codec import MAX_NUMBER
from loadbalance.snapshot import parse_snapshot

ROOT = Path(__file__).resolve().parents[2]
NS = "public/default"
HOT = f"{NS}/0x00000000_0x20000000"
COLD = f"{NS}/0x80000000_0xc0000000"
# Placeholders replaced in the JSON text: values ``json.dumps`` cannot write.
BEYOND_FLOAT = "\x00beyond-float\x00"
DEEP = "\x00deep\x00"
DEEP_LEVELS = 50_000


def _base() -> dict[str, Any]:
    doc = json.loads((ROOT / "examples" / "snapshot.json").read_text())
    now = doc["nowMs"]
    b1 = doc["brokers"]["broker-1:8080"]
    b1.update(historyUsage=0.9, msgThroughputEma=6.5e7, updatedAtMs=now - 1000)
    term = {"msgRateIn": 2e4, "msgRateOut": 2e4, "msgThroughputIn": 1.5e7,
            "msgThroughputOut": 1.5e7}  # fmt: skip
    doc["bundleData"] = {
        HOT: {
            "shortTerm": {**term, "numSamples": 10},
            "longTerm": {**term, "numSamples": 600},
            "topics": 40,
        },
        COLD: {
            "shortTerm": {**term, "numSamples": 3},
            "longTerm": {**term, "numSamples": 3},
            "topics": 10,
        },
    }
    doc["recentlyUnloaded"] = {COLD: now - 60_000}
    doc["topicHashes"] = {HOT: ["0x00000010", "0x00000020", 48, "0x1fffffff"]}
    doc["config"].update(
        loadBalancerSheddingGracePeriodMinutes=30,
        loadBalancerTransferEnabled=True,
        loadBalancerMergeEnabled="true",
        loadBalancerSplitIntervalMinutes="1",
    )
    return doc


BASE = _base()


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into the document: object members and list items, inner and leaf."""
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


PATHS = _paths(BASE)


def _at(doc: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        doc = doc[step]
    return doc


DICT_PATHS = [(), *[p for p in PATHS if isinstance(_at(BASE, p), dict)]]

HOSTILE_NUMBERS = [float("nan"), float("inf"), float("-inf"), BEYOND_FLOAT, 10**30, 2**53 + 1,
                   1e300, -1, -1e-9, -(10**18), 0, 0.5, 1.5, 2**32, 2**63]  # fmt: skip
# Accepted, but at the edges: the policies must cope with them.
EXTREME_NUMBERS = [0, 0.0, 5e-324, 1e-300, 2**53, float(2**53), 2**53 - 1, 1e15, 1]
HOSTILE_OTHERS = [None, True, False, "", "abc", "NaN", "Infinity", "-5", "1e400", "0x1_0",
                  "\ud800", "é" * 3, "x" * 5000, [], [1, "a"], {}, {"a": {}}, DEEP]  # fmt: skip
hostile_values = (
    st.sampled_from(HOSTILE_NUMBERS + HOSTILE_OTHERS)
    | st.sampled_from(EXTREME_NUMBERS)
    | st.floats()
    | st.integers()
)
hostile_keys = st.sampled_from(
    ["", " ", "a=b", "\ud800", "x" * 400, HOT.upper().replace("0X", "0x"), f"{NS}/0x1_0x2",
     f"{NS}/0x20000000_0x10000000", "t/n/0x00000000_0xffffffff\n", "broker-1:8080", "nowMs"]
)  # fmt: skip


@st.composite
def mutation(draw: st.DrawFn) -> tuple[str, tuple[Any, ...], Any]:
    kind = draw(st.sampled_from(["set", "set", "set", "delete", "rename", "add"]))
    if kind == "set":
        return kind, draw(st.sampled_from(PATHS)), draw(hostile_values)
    if kind == "delete":
        return kind, draw(st.sampled_from(PATHS)), None
    return kind, draw(st.sampled_from(DICT_PATHS)), (draw(hostile_keys), draw(hostile_values))


def _apply(doc: dict[str, Any], kind: str, path: tuple[Any, ...], arg: Any) -> None:
    if kind in ("set", "delete"):
        try:
            parent = _at(doc, path[:-1])
        except (KeyError, IndexError, TypeError):
            return  # an earlier mutation removed or replaced the parent
        last = path[-1]
        if (isinstance(parent, dict) and last in parent) or (
            isinstance(parent, list) and isinstance(last, int) and last < len(parent)
        ):
            if kind == "set":
                parent[last] = arg
            else:
                del parent[last]
        return
    try:
        node = _at(doc, path)
    except (KeyError, IndexError, TypeError):
        return
    if not isinstance(node, dict):
        return
    key, value = arg
    if kind == "rename" and node:
        node[key] = node.pop(sorted(node)[0])
    else:
        node[key] = value


def _encode(doc: dict[str, Any]) -> bytes:
    text = json.dumps(doc)  # ASCII, NaN and Infinity as Python's json writes them
    text = text.replace(json.dumps(BEYOND_FLOAT), "1e400")
    return text.replace(json.dumps(DEEP), "[" * DEEP_LEVELS + "]" * DEEP_LEVELS).encode()


BAD_BYTES = [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x00", b"\xe2\x82"]


@st.composite
def hostile_snapshot(draw: st.DrawFn) -> bytes:
    doc = copy.deepcopy(BASE)
    for kind, path, arg in draw(st.lists(mutation(), min_size=1, max_size=4)):
        _apply(doc, kind, path, arg)
    raw = _encode(doc)
    if draw(st.integers(0, 19)) == 0:
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.sampled_from(BAD_BYTES)) + raw[at:]
    return raw


def run_decide(path: Path, raw: bytes, *argv: str) -> tuple[int, str, str]:
    path.write_bytes(raw)
    parser = argparse.ArgumentParser()
    decide_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["decide", str(path), *argv])
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = decide_cmd.run(args)
    return rc, out.getvalue(), err.getvalue()


def _numbers(value: Any) -> list[float]:
    """Every number held by a view's value objects (dataclasses, nested)."""
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [value]
    if dataclasses.is_dataclass(value):
        return [n for f in dataclasses.fields(value) for n in _numbers(getattr(value, f.name))]
    if isinstance(value, Mapping):
        return [n for v in value.values() for n in _numbers(v)]
    return []


def check_accepted(raw: bytes) -> None:
    """What was accepted reaches the policies clean: every number finite and non-negative, those
    read from the snapshot at most 2^53 too (the report codec's rule), every time a whole
    number, every bundle name canonical."""
    snap = parse_snapshot(raw)
    view = snap.view
    # The reports are the codec's to judge (it keeps an unknown resource as Pulsar's -1).
    numbers = [snap.now_ms, *_numbers(dict(view.bundle_data))]
    for b in view.brokers.values():
        numbers.append(b.updated_at_ms)
        # Sums (the time averages; the default throughput EMA, the report's in + out) and the
        # default history usage, derived from the report: finite and non-negative, not capped.
        derived = [b.history_usage, b.msg_throughput_ema, *_numbers(b.time_average)]
        assert all(math.isfinite(n) and n >= 0 for n in derived)
    numbers += list(view.recently_unloaded.values())
    assert all(math.isfinite(n) and 0 <= n <= MAX_NUMBER for n in numbers)
    assert isinstance(snap.now_ms, int)
    assert all(type(t) is int for t in view.recently_unloaded.values())
    assert all(type(b.updated_at_ms) is int for b in view.brokers.values())
    for names in (view.bundle_data, view.recently_unloaded, view.topic_hashes):
        assert all(parse_bundle(name).name == name for name in names)
    for data in view.bundle_data.values():
        for term in (data.short_term, data.long_term):
            assert type(term.num_samples) is int and term.num_samples <= term.max_samples


def check_outcome(rc: int, out: str, err: str, raw: bytes) -> None:
    """Decisions (each a JSON line) from a clean view, or a clean refusal: exit 2, one line
    naming a JSON path."""
    if rc == 0:
        for line in out.splitlines():
            assert json.loads(line)["kind"] in ("split", "unload", "transfer", "merge")
        check_accepted(raw)
        return
    assert rc == 2 and out == "", (rc, out, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("lbctl decide: invalid snapshot: snapshot"), lines[0]
    assert len(lines[0]) <= 1000


def test_the_unmutated_base_decides(tmp_path: Path) -> None:
    rc, out, err = run_decide(tmp_path / "s.json", _encode(BASE), "--cycles", "2")
    assert rc == 0, err
    assert {json.loads(line)["kind"] for line in out.splitlines()} >= {"split", "transfer"}


def test_a_long_refused_knob_value_still_gives_one_bounded_line(tmp_path: Path) -> None:
    """The refusal echoes the value; the whole line, prefix included, stays within 1,000."""
    doc = copy.deepcopy(BASE)
    doc["config"] = {"loadBalancerLoadSheddingStrategy": "x" * 5000}
    raw = _encode(doc)
    rc, out, err = run_decide(tmp_path / "s.json", raw, "--cycles", "2")
    check_outcome(rc, out, err, raw)
    assert rc == 2 and len(err.splitlines()[0]) == 1000


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(raw=hostile_snapshot())
def test_hostile_snapshot_decides_or_exits_2_naming_a_path(tmp_path: Path, raw: bytes) -> None:
    check_outcome(*run_decide(tmp_path / "s.json", raw, "--cycles", "2"), raw)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    raw=st.binary(max_size=300)
    | st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass"))
)
def test_arbitrary_bytes_never_crash_decide(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        check_outcome(*run_decide(Path(d) / "s.json", raw), raw)
