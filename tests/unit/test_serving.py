"""The serve-until rule and the real-time serving checker, on hand-made clocks and histories."""

from __future__ import annotations

import pytest

from loadbalance.config import LoadBalancerConfig
from loadbalance.serving import ServingInterval, ServingRule, ServingTable
from loadbalance.serving_checker import ClockBound, check_serving

NS = "acme/ns"
PARENT = f"{NS}/0x00000000_0x80000000"
LEFT = f"{NS}/0x00000000_0x40000000"
RIGHT = f"{NS}/0x40000000_0x80000000"
OTHER = f"{NS}/0x80000000_0xffffffff"
RULE = ServingRule(ttl_s=10.0, drift_bound=0.01, stop_margin_s=0.5)


def test_serve_until_is_the_send_time_plus_the_shortened_ttl_minus_the_margin() -> None:
    assert RULE.serve_until(100.0) == pytest.approx(100.0 + 10.0 * 0.99 - 0.5)
    config = LoadBalancerConfig.model_validate(
        {"loadBalancerOwnershipLeaseTtlSeconds": 30, "leaseClockDriftBound": 0.001,
         "leaseStopMarginMs": 1000}
    )  # fmt: skip
    rule = ServingRule.from_config(config)
    assert rule.serve_until(0.0) == pytest.approx(30 * 0.999 - 1.0)
    with pytest.raises(ValueError):
        ServingRule(10.0, 1.0, 0.0)


def test_a_bundle_is_served_from_the_reply_until_the_deadline_of_the_send_time() -> None:
    t = ServingTable("b1", RULE)
    assert not t.serving(PARENT, 0.0)
    t.renewed(PARENT, 7, requested_at=1.0, replied_at=1.2)
    assert not t.serving(PARENT, 1.1)  # not before the broker knows
    assert t.serving(PARENT, 1.2)
    assert t.serving(PARENT, 10.39) and not t.serving(PARENT, 10.4)
    (st,) = t.status(5.0)
    assert (st.token, st.serving, st.serve_until) == (7, True, pytest.approx(10.4))
    assert st.seconds_left == pytest.approx(5.4)
    assert t.status(11.0)[0].serving is False and t.status(11.0)[0].seconds_left == 0.0


def test_renewals_in_time_extend_one_interval_and_a_late_one_opens_another() -> None:
    t = ServingTable("b1", RULE)
    t.renewed(PARENT, 7, 1.0, 1.1)
    t.renewed(PARENT, 7, 5.0, 5.1)  # in time: one interval to 14.4
    assert t.serving(PARENT, 14.0)
    t.renewed(PARENT, 7, 20.0, 20.1)  # after the lapse at 14.4: a new interval
    (a, b) = t.intervals()
    assert (a.start, a.end, a.renewals) == (1.1, pytest.approx(14.4), (1.0, 5.0))
    assert (b.start, b.end, b.renewals) == (20.1, pytest.approx(29.4), (20.0,))
    assert (a.namespace, a.lower, a.upper) == (NS, 0, 0x80000000)


def test_a_reply_after_its_own_deadline_serves_nothing() -> None:
    t = ServingTable("b1", RULE)
    t.renewed(PARENT, 7, requested_at=1.0, replied_at=12.0)  # Redis answered 11 s late
    assert not t.serving(PARENT, 12.0)
    assert t.intervals() == []


def test_a_lost_lease_stops_at_once_and_a_new_token_is_a_new_interval() -> None:
    t = ServingTable("b1", RULE)
    t.renewed(PARENT, 7, 1.0, 1.1)
    t.lost(PARENT, 3.0)
    assert not t.serving(PARENT, 3.0) and t.bundles() == []
    t.renewed(PARENT, 9, 4.0, 4.1)
    t.renewed(PARENT, 11, 5.0, 5.1)  # granted again under another token
    ends = [(i.token, i.start, i.end) for i in t.intervals()]
    assert ends == [(7, 1.1, 3.0), (9, 4.1, 5.1), (11, 5.1, pytest.approx(14.4))]


def _iv(broker: str, bundle: str, start: float, end: float, token: int = 1) -> ServingInterval:
    r = ServingInterval.from_json(
        {"broker": broker, "bundle": bundle, "token": token, "start": start, "end": end,
         "renewals": [start]}
    )  # fmt: skip
    assert ServingInterval.from_json(r.to_json()) == r
    return r


EXACT = ClockBound.skewed(0.0, 1.0)


def test_overlapping_ranges_served_at_once_by_two_brokers_are_a_violation() -> None:
    # a parent served by b1 while b2 serves its right child: ranges, not names, are compared
    found = check_serving(
        [_iv("b1", PARENT, 0, 10), _iv("b2", RIGHT, 9.5, 20)], {"b1": EXACT, "b2": EXACT}
    )
    assert [v.kind for v in found] == ["real_time_overlap"]
    assert "b1" in found[0].message and "b2" in found[0].message
    # disjoint ranges, one after the other, or the same broker: fine
    ok = [_iv("b1", LEFT, 0, 10), _iv("b2", OTHER, 0, 10), _iv("b2", LEFT, 10.5, 20)]
    ok.append(_iv("b1", PARENT, 9, 12))  # same broker as the LEFT interval it overlaps
    assert [v.message for v in check_serving(ok[:3], {"b1": EXACT, "b2": EXACT})] == []
    assert [v.kind for v in check_serving(ok, {"b1": EXACT, "b2": EXACT})] == [
        "real_time_overlap"
    ]  # b1's PARENT [9, 12] and b2's LEFT from 10.5


def test_a_handover_milliseconds_apart_on_one_clock_is_no_overlap_but_a_microsecond_is() -> None:
    # a simulated broker stops and acknowledges at once; the next holder starts 1.5 ms later
    # (the chaos soak's case: one host, one CLOCK_MONOTONIC, readings kept at full precision)
    stop, start = 66874.2265, 66874.2280
    handover = [_iv("b3", PARENT, 66870.228, stop), _iv("b0", LEFT, start, 66879.222)]
    assert check_serving(handover, {"b3": EXACT, "b0": EXACT}) == []
    # 1 ms of allowance on each side turns that same handover into a (false) overlap
    loose = ClockBound.skewed(0.0, 1.0, uncertainty=0.001)
    assert [v.kind for v in check_serving(handover, {"b3": loose, "b0": loose})] == [
        "real_time_overlap"
    ]
    late = [_iv("b3", PARENT, 66870.228, start + 1e-6), handover[1]]
    assert [v.kind for v in check_serving(late, {"b3": EXACT, "b0": EXACT})] == [
        "real_time_overlap"
    ]


def test_skewed_clocks_are_mapped_back_and_widened_by_their_bounds() -> None:
    # b1 reads 1000 s ahead and runs 1% fast; b2 reads 50 s behind at the right rate
    b1 = ClockBound.skewed(1000.0, 1.01)
    b2 = ClockBound.skewed(-50.0, 1.0)
    # b1 serves real [0, 10]: local [1000, 1010.1]; b2 from real 10.05 -> local -39.95
    one = _iv("b1", PARENT, 1000.0, 1010.1)
    two = _iv("b2", PARENT, -39.95, -30.0)
    assert check_serving([one, two], {"b1": b1, "b2": b2}) == []
    # the same, with b1's rate known only to 1%: its end may map past real 10.05
    loose = ClockBound.skewed(1000.0, 1.01, rate_error=0.01)
    assert [v.kind for v in check_serving([one, two], {"b1": loose, "b2": b2})] == [
        "real_time_overlap"
    ]
    # an anchor known to 0.1 s widens both ends by 0.1 s
    assert check_serving([one, two], {"b1": b1, "b2": ClockBound.skewed(-50, 1.0, uncertainty=0.1)})


def test_malformed_input_is_reported() -> None:
    kinds = [v.kind for v in check_serving([_iv("b1", PARENT, 5, 4), _iv("b9", LEFT, 0, 1)],
                                          {"b1": EXACT})]  # fmt: skip
    assert kinds == ["bad_interval", "unknown_clock"]


def test_a_broker_that_shuts_down_ends_every_interval_then() -> None:
    t = ServingTable("b1", RULE)
    t.renewed(PARENT, 7, 1.0, 1.1)
    t.renewed(OTHER, 8, 1.0, 1.1)
    t.stop_all(2.0)
    assert [(i.bundle, i.end) for i in t.intervals()] == [(PARENT, 2.0), (OTHER, 2.0)]
    assert t.bundles() == []
