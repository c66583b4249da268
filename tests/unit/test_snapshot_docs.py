"""The bundle half of the load snapshot (``metadata_store.load_snapshot``: the state step's shard
blobs are its bundle-shard records) and the driver's view built on it."""

from __future__ import annotations

import numpy as np

from loadbalance.bundles import NamespaceBundles
from metadata_store.load_snapshot import (
    LoadSnapshotData,
    decode_bundle_shard,
    shard_docs,
    shards_from_docs,
)
from streaming.driver_view import DriverView
from streaming.schema import OUTPUT_FIELDS, SHARD, frame
from streaming.shard_state import ShardState, bundle_count

NS = "t/ns"


def docs_from_blobs(blobs: list[bytes]) -> dict:
    return LoadSnapshotData({}, {f"k{i}": b for i, b in enumerate(blobs)}).bundle_docs()


def _state(names: list[str], owner: str, seen_ms: int) -> ShardState:
    state = ShardState()
    rng = np.random.default_rng(7)
    values = rng.uniform(0, 1e6, size=(len(names), 4)) / 3.0  # floats with long reprs
    counts = rng.integers(0, 50, size=(len(names), 3))
    state.apply(names, values, counts, [owner] * len(names), np.full(len(names), seen_ms))
    return state


def _shard_rows(blobs: dict[str, bytes]):
    keys = list(blobs)
    return frame(
        OUTPUT_FIELDS,
        len(keys),
        kind=np.array([SHARD] * len(keys), dtype=object),
        name=np.array(keys, dtype=object),
        event_ms=np.zeros(len(keys), dtype=np.int64),
        payload=np.array([blobs[k] for k in keys], dtype=object),
    )


def _broker_rows(docs: dict[str, dict]):
    """State output rows of brokers that reported ``docs`` (broker -> report document)."""
    import json

    from streaming.schema import BROKER

    return frame(
        OUTPUT_FIELDS,
        len(docs),
        kind=np.array([BROKER] * len(docs), dtype=object),
        name=np.array(list(docs), dtype=object),
        event_ms=np.full(len(docs), 5, dtype=np.int64),
        history_usage=np.full(len(docs), 0.5),
        msg_throughput_ema=np.full(len(docs), 1.0),
        doc=np.array([json.dumps(d) for d in docs.values()], dtype=object),
    )


def test_documents_survive_blobs_bit_for_bit():
    names = NamespaceBundles.initial(NS, 8).bundle_names
    docs = shard_docs(decode_bundle_shard(_state(names, "b1:8080", 1234).to_bytes()))
    back = docs_from_blobs(list(shards_from_docs(docs, n_shards=3).values()))
    assert back == docs
    doc = back[names[0]]
    assert doc["broker"] == "b1:8080" and doc["updatedAtMs"] == 1234
    assert doc["shortTerm"]["numSamples"] == 1 and doc["longTerm"]["numSamples"] == 1


def test_a_bundle_in_two_blobs_keeps_the_newest():
    name = NamespaceBundles.initial(NS, 1).bundle_names[0]
    old, new = _state([name], "old:1", 10), _state([name], "new:1", 20)
    docs = docs_from_blobs([new.to_bytes(), old.to_bytes()])
    assert docs[name]["broker"] == "new:1"


def test_view_leaves_out_bundles_a_split_removed_and_keeps_unknown_namespaces():
    before = NamespaceBundles.initial(NS, 2)
    parent = before.bundle_names[0]
    after = NamespaceBundles(NS, (before.boundaries[0], 0x40000000, *before.boundaries[1:]), 1)
    other = NamespaceBundles.initial("t/unknown", 1).bundle_names[0]
    names = [*before.bundle_names, *after.bundle_names[:2], other]
    view = DriverView()
    view.apply(_shard_rows({"s:0": _state(list(dict.fromkeys(names)), "b1", 5).to_bytes()}))
    assert len(view) == 5
    seen = set(view.cluster_view({NS: before}).bundle_data)
    assert parent in seen and after.bundle_names[0] not in seen and other in seen
    seen = set(view.cluster_view({NS: after}).bundle_data)
    assert parent not in seen and set(after.bundle_names[:2]) <= seen and other in seen


def test_an_emptied_shard_is_removed_from_view_and_snapshot():
    names = NamespaceBundles.initial(NS, 4).bundle_names
    view = DriverView()
    view.apply(_shard_rows({"s:1": _state(names, "b1", 5).to_bytes()}))
    _, _, changed, removed = view.take_changes()
    assert set(changed) == {"s:1"} and not removed and bundle_count(changed["s:1"]) == 4
    view.apply(_shard_rows({"s:1": ShardState().to_bytes()}))
    _, _, changed, removed = view.take_changes()
    assert not changed and removed == {"s:1"} and len(view) == 0
    assert not view.cluster_view({NS: NamespaceBundles.initial(NS, 4)}).bundle_data


def test_a_view_updated_bundle_by_bundle_equals_one_built_from_scratch():
    """Only bundles whose values changed are rebuilt between cycles (and a warm-up may do it
    ahead): the cycle must see exactly what a fresh view of the same blobs gives."""
    names = NamespaceBundles.initial(NS, 64).bundle_names
    first = _state(names, "b1", 5)
    second = ShardState.from_bytes(first.to_bytes())
    moved = names[3:40:4]
    second.apply(moved, np.full((len(moved), 4), 7.0), np.ones((len(moved), 3), dtype=np.int64),
                 ["b2"] * len(moved), np.full(len(moved), 9))  # fmt: skip
    second.short_avg[5, 1] = -0.0 if second.short_avg[5, 1] == 0.0 else second.short_avg[5, 1]
    others = NamespaceBundles.initial("t/other", 64).bundle_names  # each bundle in one shard
    third = _state(others[:50], "b3", 6)
    namespaces = {
        NS: NamespaceBundles.initial(NS, 64),
        "t/other": NamespaceBundles.initial("t/other", 64),
    }
    updated = DriverView()
    shrunk = ShardState.from_bytes(third.to_bytes())
    shrunk.expire(7)  # nothing left: a shard whose bundle list changed is rebuilt whole
    shrunk.index_of(others[60:62])
    rounds = (
        {"s:0": first.to_bytes()},
        {"s:0": second.to_bytes(), "s:1": third.to_bytes()},
        {"s:0": second.to_bytes(), "s:1": shrunk.to_bytes()},
    )
    for blobs in rounds:
        updated.apply(_shard_rows(blobs))
        updated.warm()
        got = updated.cluster_view(namespaces)
        fresh = DriverView()
        fresh.apply(_shard_rows({k: b for k, (b, _) in updated.ledger.records().items()}))
        want = fresh.cluster_view(namespaces)
        assert dict(got.bundle_data) == dict(want.bundle_data)
        assert got.brokers == want.brokers


def test_gc_is_paused_while_any_thread_materialises_and_restored_after():
    import gc
    import threading

    from streaming.gc_pause import GcPause

    gc_paused = GcPause().paused
    assert gc.isenabled()
    inside, leave = threading.Event(), threading.Event()

    def other() -> None:
        with gc_paused():
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=other)
    with gc_paused():
        assert not gc.isenabled()
        t.start()
        assert inside.wait(10)
    assert not gc.isenabled()  # the other thread is still inside
    leave.set()
    t.join(10)
    assert gc.isenabled()

    gc.disable()  # a caller that turned it off itself keeps it off
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_pause_ends_by_freezing_what_is_alive_and_every_tenth_hands_it_back():
    """After a pause the objects then alive are frozen (no collection walks them; reference
    counting still frees them); every ``FREEZES_PER_SWEEP``-th pause unfreezes them and runs a
    full collection, so cyclic garbage made in between is collected. A caller that turned the
    collector off itself gets neither."""
    import gc
    import weakref

    from streaming.gc_pause import FREEZES_PER_SWEEP, GcPause

    gc.unfreeze()
    gc_paused = GcPause().paused

    class Node:
        pass

    with gc_paused():
        cycle = Node()
        cycle.me = cycle  # a reference cycle: only the collector frees it
        gone = weakref.ref(cycle)
        del cycle
    assert gc.get_freeze_count() > 0 and gc.isenabled()
    gc.collect()
    assert gone() is not None  # frozen: a full collection does not walk it
    for _ in range(FREEZES_PER_SWEEP - 2):
        with gc_paused():
            pass
    assert gone() is not None and gc.get_freeze_count() > 0
    with gc_paused():
        pass  # the tenth: handed back and collected
    assert gone() is None and gc.get_freeze_count() == 0
    gc.disable()
    try:
        with gc_paused():
            pass
        assert gc.get_freeze_count() == 0 and not gc.isenabled()
    finally:
        gc.enable()


def test_background_threads_run_nicer_than_the_rest_of_the_process():
    import os
    import sys
    import threading

    import pytest

    from streaming.gc_pause import BACKGROUND_NICE, lower_thread_priority

    if not sys.platform.startswith("linux"):
        pytest.skip("per-thread niceness is a Linux feature; elsewhere it is a no-op")
    main_tid = threading.get_native_id()
    before = os.getpriority(os.PRIO_PROCESS, main_tid)
    seen: list[int] = []

    def work() -> None:
        lower_thread_priority()
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    t = threading.Thread(target=work)
    t.start()
    t.join(10)
    assert seen == [min(19, before + BACKGROUND_NICE)]
    assert os.getpriority(os.PRIO_PROCESS, main_tid) == before


def test_brokers_time_averages_are_the_bits_build_view_would_sum():
    """The view sums brokers' averages from the shard arrays (``math.fsum`` per column); they
    must be exactly ``TimeAverageBrokerData.of`` over the view's bundles, defaults included."""

    from loadbalance.time_average import BundleData, TimeAverageBrokerData

    before = NamespaceBundles.initial(NS, 64)
    names = before.bundle_names
    after = NamespaceBundles(NS, (before.boundaries[0], 0x02000000, *before.boundaries[1:]), 1)
    blobs = {f"s:{k}": _state(names[k::3], f"b{k}", 5).to_bytes() for k in range(3)}
    never_seen = NamespaceBundles.initial("t/quiet", 2).bundle_names
    reports = {
        "b0": names[0::2] + never_seen[:1],
        "b1": [*names[1::2], after.bundle_names[0]],  # a split child nobody has data for
        "b2": [],
    }
    view = DriverView()
    view.apply(_shard_rows(blobs))
    view.apply(_broker_rows({b: {"bundles": names} for b, names in reports.items()}))
    for namespaces in ({NS: before}, {NS: after}):  # after: the split parent is left out
        got = view.cluster_view(namespaces)
        default = BundleData.new()
        for broker, bv in got.brokers.items():
            want = TimeAverageBrokerData.of(
                got.bundle_data.get(b, default) for b in bv.report.bundles
            )
            assert bv.time_average == want, broker
        assert got.brokers["b2"].time_average == TimeAverageBrokerData()
    assert names[0] not in got.bundle_data  # the parent really was left out


def test_the_views_digests_are_what_folding_the_reports_would_work_out() -> None:
    """The driver makes each broker's ``ReportDigest`` from its columns; the split scan skips a
    broker by it and placement counts namespaces by it, so it must be exactly ``view._digest``
    over the view's own reports and averages, and a cycle must decide the same with it as
    without it (the long way)."""
    from dataclasses import replace

    from loadbalance.config import LoadBalancerConfig
    from loadbalance.cycle import CycleState, step
    from loadbalance.view import ReportDigests, _digest

    namespaces = {f"t/n{i}": NamespaceBundles.initial(f"t/n{i}", 16) for i in range(4)}
    names = [b for nb in namespaces.values() for b in nb.bundle_names]
    hot = _state(names[:20], "hot", 5)  # rates up to 3e5 msg/s: over the split limits
    cold = ShardState()
    quiet = names[20:50]
    cold.apply(quiet, np.full((len(quiet), 4), 1.0), np.tile([3, 1, 1], (len(quiet), 1)),
               ["cold"] * len(quiet), np.full(len(quiet), 5))  # fmt: skip
    cold.last_values[3, 2] = np.nan  # a NaN is never a maximum
    cold.long_avg[3, 2] = np.nan
    view = DriverView()
    view.apply(_shard_rows({"s:0": hot.to_bytes(), "s:1": cold.to_bytes()}))
    reports = {"hot": names[:20], "cold": [*quiet, names[0]], "idle": names[50:]}
    cpu = {"usage": 50, "limit": 100}
    view.apply(_broker_rows({b: {"bundles": n, "cpu": cpu} for b, n in reports.items()}))
    got = view.cluster_view(namespaces)
    for broker, bv in got.brokers.items():
        digest = got.report_digests.by_broker[broker]
        want = _digest(bv.report, [got.bundle_data[b] for b in bv.report.last_stats])
        assert digest.report is bv.report
        assert (digest.max_topics, digest.max_sessions) == (want.max_topics, want.max_sessions)
        assert digest.max_long_term_msg_rate == want.max_long_term_msg_rate, broker
        assert digest.max_long_term_msg_throughput == want.max_long_term_msg_throughput, broker
        assert digest.namespace_counts == want.namespace_counts
    assert got.report_digests.by_broker["idle"].max_topics == -1  # no lastStats entry
    config = LoadBalancerConfig()
    long_way = replace(got, report_digests=ReportDigests(got.bundle_data, {}))
    with_digests = step(CycleState(), got, config, now_ms=600_000, cycle="1")
    without = step(CycleState(), long_way, config, now_ms=600_000, cycle="1")
    assert with_digests == without
    assert any(d.kind == "split" for d in with_digests[1].decisions)


def test_short_term_totals_are_the_sums_of_the_made_values_and_shedding_ranks_the_same() -> None:
    """``sheddable_bundles`` asks the driver's lazy ``bundle_data`` for each bundle's short-term
    sum instead of making a value per bundle: the sums must be the made values' own additions
    (NaN, a zero and a negative zero included), ``None`` for a bundle without data or left out,
    and the shedders' ranking the same as over a plain dict of the made values."""
    from loadbalance.shedding.selection import sheddable_bundles

    before = NamespaceBundles.initial(NS, 64)
    after = NamespaceBundles(NS, (before.boundaries[0], 0x02000000, *before.boundaries[1:]), 1)
    names = before.bundle_names
    states = {f"s:{k}": _state(names[k::3], f"b{k}", 5) for k in range(3)}
    states["s:1"].short_avg[0] = [np.nan, 1.0, 0.0, -0.0]
    states["s:2"].short_avg[1] = [1e300, 1e300, 3.0, 4.0]  # an overflow to inf
    view = DriverView()
    view.apply(_shard_rows({k: s.to_bytes() for k, s in states.items()}))
    unknown = NamespaceBundles.initial("t/quiet", 2).bundle_names
    asked = [*names, *after.bundle_names[:1], *unknown]
    view.apply(_broker_rows({"b0": {"bundles": asked}}))
    got = view.cluster_view({NS: after})  # the split parent names[0] is left out
    data = got.bundle_data
    for by_rate in (False, True):
        totals = data.short_term_totals(asked, by_rate)
        for name, total in zip(asked, totals, strict=True):
            d = data.get(name)
            if d is None:
                assert total is None, name
                continue
            s = d.short_term
            want = (
                s.msg_rate_in + s.msg_rate_out
                if by_rate
                else s.msg_throughput_in + s.msg_throughput_out
            )
            assert np.array([total]).view(np.int64)[0] == np.array([want]).view(np.int64)[0]
        plain = replace_data(got, dict(data.items()))
        broker = got.brokers["b0"]
        fast = sheddable_bundles(got, broker, by_msg_rate=by_rate)
        slow = sheddable_bundles(plain, plain.brokers["b0"], by_msg_rate=by_rate)
        assert [(b, repr(v)) for b, v in fast] == [(b, repr(v)) for b, v in slow]  # NaN too
    assert data.short_term_totals([names[0], unknown[0]], False) == [None, None]
    # every name known, the split parent left out: the same as with an unknown name beside
    known = [names[0], *names[2:9]]
    assert repr(data.short_term_totals(known, False)) == repr(
        data.short_term_totals([*known, unknown[0]], False)[:-1]
    )
    assert data.short_term_totals(known, False)[0] is None


def replace_data(view, data):
    """``view`` with ``bundle_data`` a plain dict (no ``short_term_totals``)."""
    from dataclasses import replace

    return replace(view, bundle_data=data)


def test_the_views_own_ranking_of_a_shedding_broker_is_the_generic_one() -> None:
    """``short_term_ranking`` ranks a broker's bundles from the view's numbered rows: the same
    (bundle, sum) list, floats bit for bit, as the generic path over a plain dict of the made
    values, whatever is tied (runs of equal sums, 0.0 beside -0.0, bundles without data),
    excluded (recently unloaded, taken this cycle, a system namespace) or left out by a split.
    It declines (``None``) for a bundle set the view did not take its rows from, and for a NaN
    sum, whose place Python's sort leaves to the input order."""
    from dataclasses import replace

    from loadbalance.shedding.selection import sheddable_bundles
    from loadbalance.shedding.system_namespaces import is_system_bundle

    before = NamespaceBundles.initial(NS, 64)
    after = NamespaceBundles(NS, (before.boundaries[0], 0x02000000, *before.boundaries[1:]), 1)
    names = before.bundle_names
    heartbeat = NamespaceBundles.initial("pulsar/localhost:8080", 1).bundle_names[0]
    states = {f"s:{k}": _state(names[k::3], f"b{k % 2}", 5) for k in range(3)}
    states["s:3"] = _state([heartbeat], "b0", 5)
    # one run of four equal sums across shards, zeros of both signs, an equal msg rate pair
    for key, row in (("s:0", 1), ("s:1", 2), ("s:2", 3), ("s:0", 4)):
        states[key].short_avg[row] = [500.0, 250.0, 7.0, 3.0]
    states["s:1"].short_avg[5] = [0.0, 0.0, 0.0, 0.0]
    states["s:2"].short_avg[6] = [-0.0, -0.0, 9.0, 1.0]
    states["s:0"].short_avg[7] = [0.0, -0.0, 0.0, -0.0]
    view = DriverView()
    view.apply(_shard_rows({k: st.to_bytes() for k, st in states.items()}))
    unknown = NamespaceBundles.initial("t/quiet", 4).bundle_names
    view.apply(
        _broker_rows(
            {
                "b0": {"bundles": [*names[:40], heartbeat, *unknown, *after.bundle_names[:1]]},
                "b1": {"bundles": [*names[40:], names[3]]},  # names[3] is reported twice
            }
        )
    )
    got = view.cluster_view({NS: after})  # the split parent names[0] is left out
    plain = replace(got, bundle_data=dict(got.bundle_data.items()))
    recent = {names[9]: 1, names[44]: 1, unknown[1]: 1}
    taken = {names[11], names[50], unknown[2]}
    got = replace(got, recently_unloaded=recent)
    plain = replace(plain, recently_unloaded=recent)
    used = 0
    for broker in ("b0", "b1"):
        bv = got.brokers[broker]
        for by_rate in (False, True):
            unseen = sheddable_bundles(plain, bv, by_msg_rate=by_rate)[-1][1]
            direct = got.bundle_data.short_term_ranking(
                broker, bv.bundles, recent, taken, is_system_bundle, by_rate, unseen
            )
            used += direct is not None
            fast = sheddable_bundles(got, bv, taken, by_msg_rate=by_rate)
            slow = sheddable_bundles(plain, plain.brokers[broker], taken, by_msg_rate=by_rate)
            assert [(b, repr(v)) for b, v in fast] == [(b, repr(v)) for b, v in slow]
            assert heartbeat not in dict(fast) and names[9] not in dict(fast)
    assert used == 4  # every ranking above came from the view's rows
    bv = got.brokers["b0"]
    asked_unseen = got.bundle_data.short_term_ranking(
        "b0", bv.bundles, (), (), is_system_bundle, False, -1.0
    )
    assert asked_unseen is not None
    without_data = {b for b, v in asked_unseen if v == -1.0}
    assert without_data == {*unknown, after.bundle_names[0], names[0]}  # the parent: left out
    assert (
        got.bundle_data.short_term_ranking(
            "b0", frozenset(list(bv.bundles)), (), (), is_system_bundle, False, 0.0
        )
        is None
    )
    states["s:1"].short_avg[8] = [np.nan, 1.0, 2.0, 3.0]
    view.apply(_shard_rows({"s:1": states["s:1"].to_bytes()}))
    nan_view = view.cluster_view({NS: after})
    nb = nan_view.brokers[view_owner(nan_view, names[1 + 3 * 8])]
    assert (
        nan_view.bundle_data.short_term_ranking(
            nb.broker, nb.bundles, (), (), is_system_bundle, False, 0.0
        )
        is None
    )


def view_owner(view, bundle: str) -> str:
    (owner,) = [b for b, bv in view.brokers.items() if bundle in bv.bundles]
    return owner


def test_a_warm_up_sums_time_averages_ahead_and_a_view_sums_only_what_changed_since(
    monkeypatch,
) -> None:
    """Summing every broker's eight columns exactly is most of a warm view at a million
    bundles, so a view sums again only a broker whose values changed since they were last
    summed, and the warm-up sums ahead: after it, the cycle sums only the brokers whose
    values changed after the warm-up, and every sum is the one a fresh view makes."""
    import math

    names = NamespaceBundles.initial(NS, 12).bundle_names
    owner = {n: f"b{i % 3}" for i, n in enumerate(names)}
    states = {f"s:{k}": _state(names[4 * k : 4 * k + 4], f"b{k}", 5) for k in range(3)}
    for st in states.values():
        st.owners = [owner[n] for n in st.names]
    view = DriverView()
    view.apply(_shard_rows({k: st.to_bytes() for k, st in states.items()}))
    lists = {b: [n for n in names if owner[n] == b] for b in ("b0", "b1", "b2")}
    view.apply(_broker_rows({b: {"bundles": v} for b, v in lists.items()}))
    calls = []
    fsum = math.fsum
    monkeypatch.setattr(math, "fsum", lambda values: calls.append(1) or fsum(values))

    def summed(view) -> tuple[int, dict]:
        calls.clear()
        got = view.cluster_view({NS: NamespaceBundles.initial(NS, 12)})
        return len(calls), {b: bv.time_average for b, bv in got.brokers.items()}

    assert summed(view)[0] == 3 * 8
    assert summed(view)[0] == 0  # nothing changed
    states["s:0"].short_avg[0] = [1.0, 2.0, 3.0, 4.0]  # names[0]: b0's
    view.apply(_shard_rows({"s:0": states["s:0"].to_bytes()}))
    view.warm()
    view.wait_warm()
    states["s:1"].long_avg[1] = [5.0, 6.0, 7.0, 8.0]  # names[5]: b2's, after the warm-up
    view.apply(_shard_rows({"s:1": states["s:1"].to_bytes()}))
    count, sums = summed(view)
    assert count == 8  # b2 alone: b0 was summed ahead, b1 did not change
    fresh = DriverView()
    fresh.apply(_shard_rows({k: st.to_bytes() for k, st in states.items()}))
    fresh.apply(_broker_rows({b: {"bundles": v} for b, v in lists.items()}))
    assert sums == summed(fresh)[1]


def _plain_view(view):
    """``view`` with plain dicts for ``bundle_data`` and every broker's ``lastStats``: the
    generic path of every policy (no bulk hooks)."""
    from dataclasses import replace

    brokers = {
        name: replace(bv, report=replace(bv.report, last_stats=dict(bv.report.last_stats.items())))
        for name, bv in view.brokers.items()
    }
    return replace(view, brokers=brokers, bundle_data=dict(view.bundle_data.items()))


def test_policies_decide_the_same_over_the_views_columns_as_over_plain_values(monkeypatch):
    """The driver's view offers bulk hooks (``short_term_ranking``, ``short_term_totals``,
    ``sample_columns`` and ``stat``) so that a shedder ranking thousands of bundles makes no
    value per bundle. Two cycles of each shedder that ranks that way, over a cluster with
    tied and zero figures, a bundle without data and a bundle moved in the grace period, must
    give the decisions and state the same view gives with plain dicts."""
    from dataclasses import replace

    from loadbalance.config import LoadBalancerConfig
    from loadbalance.cycle import CycleState, step
    from streaming.view_mappings import LastStats

    rng = np.random.default_rng(11)
    nb = NamespaceBundles.initial(NS, 256)
    names = nb.bundle_names
    owner = {n: f"b{i % 6}" for i, n in enumerate(names)}
    states = {}
    for k in range(4):
        part = names[k::4]
        st = _state(part, "b0", 5)
        st.owners = [owner[n] for n in part]
        # few distinct figures, so that many bundles tie on work and ties go by name
        st.last_values[:] = rng.integers(0, 4, size=st.last_values.shape) * 1000.0
        st.last_values[::11] = 0.0  # no work: never moved
        st.short_avg[::5] = st.short_avg[2]
        states[f"s:{k}"] = st
    view = DriverView()
    view.apply(_shard_rows({k: st.to_bytes() for k, st in states.items()}))
    quiet = NamespaceBundles.initial("t/quiet", 1).bundle_names[0]  # no data at all
    docs = {}
    for i in range(6):
        broker = f"b{i}"
        listed = [n for n in names if owner[n] == broker] + ([quiet] if i == 2 else [])
        listed = [listed[j] for j in rng.permutation(len(listed))]  # not in name order
        cpu = 15.0 + 14.0 * i
        docs[broker] = {
            "bundles": listed,
            "cpu": {"usage": cpu, "limit": 100.0},
            "memory": {"usage": 10.0, "limit": 100.0},
            "bandwidthIn": {"usage": cpu * 10, "limit": 1000.0},
            "bandwidthOut": {"usage": cpu * 10, "limit": 1000.0},
            "msgThroughputIn": 4e7 * (i + 1),
            "msgThroughputOut": 4e7 * (i + 1),
        }
    rows = _broker_rows(docs)
    rows["history_usage"] = [0.15 + 0.14 * i for i in range(6)]
    view.apply(rows)
    got = view.cluster_view({NS: nb, "t/quiet": NamespaceBundles.initial("t/quiet", 1)})
    got = replace(got, recently_unloaded={names[5]: 1})
    asked = []
    real = LastStats.sample_columns
    monkeypatch.setattr(
        LastStats,
        "sample_columns",
        lambda self: asked.append(1) or real(self),
    )
    pairs = (
        ("ProjectedUsageShedder", "LeastProjectedUsage"),
        ("ProjectedUsageShedder", "LeastProjectedUsage", 0),  # no grace: pending moves count
        ("ThresholdShedder", "LeastLongTermMessageRate"),
        ("OverloadShedder", "LeastLongTermMessageRate"),
        ("UniformLoadShedder", "LeastLongTermMessageRate"),
    )
    for shedder, placement, *grace in pairs:
        config = LoadBalancerConfig(
            loadBalancerLoadSheddingStrategy=shedder,
            loadBalancerLoadPlacementStrategy=placement,
            loadBalancerBrokerOverloadedThresholdPercentage=50,
            loadBalancerSheddingGracePeriodMinutes=grace[0] if grace else 30,
        )
        results = []
        for v in (got, _plain_view(got)):
            state, out = CycleState(), []
            for i in range(2):
                now_ms = 600_000 + 60_000 * i  # the next shedding interval: moves pending
                state, result = step(state, v, config, now_ms=now_ms, cycle=str(i))
                out.append(result)
            results.append((out, state))
        assert results[0] == results[1], shedder
        assert sum(len(r.decisions) for r in results[0][0]) > 0, shedder
    assert asked  # ProjectedUsageShedder ranked from the columns


def test_prefetch_makes_the_values_placement_reads_and_they_are_the_same() -> None:
    """Placement tells the lazy ``bundle_data`` which moved bundles it will read
    (``prefetch``); the values made together must be the ones made one at a time, and names
    the view does not hold or leaves out are skipped."""
    from dataclasses import replace

    from loadbalance.config import LoadBalancerConfig
    from loadbalance.cycle import CycleState, step

    namespaces = {f"t/n{i}": NamespaceBundles.initial(f"t/n{i}", 16) for i in range(4)}
    names = [b for nb in namespaces.values() for b in nb.bundle_names]
    view = DriverView()
    view.apply(_shard_rows({"s:0": _state(names[:40], "hot", 5).to_bytes(),
                            "s:1": _state(names[40:], "cold", 5).to_bytes()}))  # fmt: skip
    cpu = {"hot": {"usage": 95, "limit": 100}, "cold": {"usage": 10, "limit": 100}}
    view.apply(_broker_rows({b: {"bundles": n, "cpu": cpu[b]}
                             for b, n in (("hot", names[:40]), ("cold", names[40:]))}))  # fmt: skip
    got = view.cluster_view(namespaces)
    one_by_one = view.cluster_view(namespaces)
    asked = [*names[:10], "t/n9/0x00000000_0xffffffff"]
    got.bundle_data.prefetch(asked)
    for name in names[:10]:
        assert got.bundle_data[name] == one_by_one.bundle_data[name]
    seen: list[list[str]] = []

    class Watching(type(got.bundle_data)):
        def prefetch(self, wanted):
            seen.append(list(wanted))
            super().prefetch(wanted)

    lazy = got.bundle_data
    watched = Watching(lazy._made, lazy._where, lazy._outside, lazy._columns, lazy._rows)
    config = LoadBalancerConfig(loadBalancerLoadSheddingStrategy="OverloadShedder")
    _, result = step(CycleState(), replace(got, bundle_data=watched), config, now_ms=600_000,
                     cycle="1")  # fmt: skip
    moved = [d.bundle for d in result.decisions if d.kind == "transfer"]
    assert moved and seen and set(moved) <= set(seen[0])
    _, plain = step(CycleState(), got, config, now_ms=600_000, cycle="1")
    assert result.decisions == plain.decisions


def test_a_bundle_reported_after_its_namespace_split_is_left_out_of_the_next_view() -> None:
    """The view keeps its list of bundles left out while the namespaces and the bundles held
    are the same; a parent a late report brings back (the namespaces unchanged) must still be
    left out."""
    before = NamespaceBundles.initial(NS, 2)
    parent = before.bundle_names[0]
    after = NamespaceBundles(NS, (before.boundaries[0], 0x40000000, *before.boundaries[1:]), 1)
    view = DriverView()
    view.apply(_shard_rows({"s:0": _state(after.bundle_names, "b1", 5).to_bytes()}))
    assert parent not in view.cluster_view({NS: after}).bundle_data
    late = _state([*after.bundle_names, parent], "b1", 6)
    view.apply(_shard_rows({"s:0": late.to_bytes()}))
    seen = view.cluster_view({NS: after}).bundle_data
    assert parent not in seen and set(after.bundle_names) <= set(seen)
