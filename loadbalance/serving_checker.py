"""A real-time check of what brokers served: no two brokers served overlapping ranges at once.

Why: ``loadbalance.lease_checker`` judges leases by the store's clock, which is what the store
promises. A broker's promise is different: it must stop serving before its lease can lapse in
*real* time, by its own clock (``loadbalance.serving``). That can only be checked on what the
brokers did, mapped onto one reference clock.

Each broker records its serving intervals in its own local clock (``ServingInterval``). A
``ClockBound`` says what is known of that clock against the reference: at one moment (the
anchor) the local clock read ``anchor_local`` while the reference read ``anchor_ref`` (to within
``uncertainty`` seconds), and since then the local clock advanced at a rate within
``[rate_low, rate_high]`` of the reference's. The real-time image of a local instant is then an
interval, and an interval's image is widened to cover every clock the bounds allow: it starts
at the earliest real time its start can map to and ends at the latest time its end can map to.
A violation is therefore never an artefact of an unknown clock within the bounds (it may be a
false alarm only if the bounds are too loose).

The rules (``Violation.kind`` in brackets):

1. [real_time_overlap] No two intervals of different brokers on overlapping hash ranges of one
   namespace (bundles split and merge, so ranges are compared, never names) have overlapping
   real-time images.
2. [bad_interval] An interval ends no earlier than it starts.
3. [unknown_clock] Every broker with intervals has a ``ClockBound``.

Ranges follow ``lease_history``: ``[lower, upper)``, a range ending at ``0xffffffff`` also
covers it. Pure: intervals and bounds are passed in.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from loadbalance.lease_checker import Violation
from loadbalance.serving import ServingInterval

_RING_TOP = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class ClockBound:
    """How a broker's local clock relates to the reference clock (see the module docstring)."""

    anchor_local: float
    anchor_ref: float
    rate_low: float
    rate_high: float
    uncertainty: float = 0.0

    def __post_init__(self) -> None:
        if not 0 < self.rate_low <= self.rate_high:
            raise ValueError("rate bounds must satisfy 0 < rate_low <= rate_high")

    @classmethod
    def skewed(
        cls,
        offset: float,
        rate: float,
        *,
        rate_error: float = 0.0,
        uncertainty: float = 0.0,
        at: float = 0.0,
    ) -> ClockBound:
        """A clock reading ``offset + rate * reference``, known to ``rate_error`` (relative),
        anchored at reference time ``at``. Why the anchor: the rate allowance widens an interval
        by ``rate_error`` times its distance from the anchor, so a bound anchored at 0 of a
        clock such as CLOCK_MONOTONIC (the time since boot) widens every interval by hours of
        allowance; anchor it where the observation starts."""
        return cls(
            offset + rate * at, at, rate * (1 - rate_error), rate * (1 + rate_error), uncertainty
        )

    def earliest(self, local: float) -> float:
        """The earliest reference time at which the local clock can have read ``local``."""
        d = local - self.anchor_local
        return (
            self.anchor_ref + d / (self.rate_high if d >= 0 else self.rate_low) - self.uncertainty
        )

    def latest(self, local: float) -> float:
        """The latest reference time at which the local clock can have read ``local``."""
        d = local - self.anchor_local
        return (
            self.anchor_ref + d / (self.rate_low if d >= 0 else self.rate_high) + self.uncertainty
        )


@dataclass(frozen=True, slots=True)
class RealInterval:
    """A serving interval with its conservative real-time image ``[lo, hi]``."""

    interval: ServingInterval
    lo: float
    hi: float


def real_image(interval: ServingInterval, bound: ClockBound) -> RealInterval:
    return RealInterval(interval, bound.earliest(interval.start), bound.latest(interval.end))


def _end(upper: int) -> int:
    return upper + 1 if upper == _RING_TOP else upper


def _text(r: RealInterval) -> str:
    i = r.interval
    return (
        f"{i.broker} token {i.token} on {i.bundle} real [{r.lo:.3f}, {r.hi:.3f}] "
        f"(local [{i.start:.3f}, {i.end:.3f}])"
    )


def check_serving(
    intervals: Iterable[ServingInterval], clocks: Mapping[str, ClockBound]
) -> list[Violation]:
    """Every violation of rules 1-3 (empty when the brokers served one at a time)."""
    problems: list[Violation] = []
    by_ns: dict[str, list[RealInterval]] = defaultdict(list)
    for i in intervals:
        bound = clocks.get(i.broker)
        if bound is None:
            problems.append(Violation("unknown_clock", f"no clock bound for broker {i.broker}"))
            continue
        if i.end < i.start:
            problems.append(Violation("bad_interval", f"{i.broker} on {i.bundle} ends first"))
            continue
        by_ns[i.namespace].append(real_image(i, bound))
    for ns in sorted(by_ns):
        problems.extend(_overlaps(by_ns[ns]))
    return problems


def _overlaps(images: list[RealInterval]) -> list[Violation]:
    """Sweep in real-time order: each interval is compared with those still open when it
    starts."""
    out: list[Violation] = []
    active: list[RealInterval] = []
    for cur in sorted(images, key=lambda r: (r.lo, r.hi)):
        active = [a for a in active if a.hi > cur.lo]
        for a in active:
            x, y = a.interval, cur.interval
            if x.broker == y.broker:
                continue
            if x.lower < _end(y.upper) and y.lower < _end(x.upper):
                out.append(
                    Violation(
                        "real_time_overlap",
                        f"{_text(a)} overlaps {_text(cur)} by {min(a.hi, cur.hi) - cur.lo:.3f} s",
                    )
                )
        active.append(cur)
    return out
