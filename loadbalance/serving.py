"""When a broker may serve a bundle, judged by its own clock: the serve-until rule, per bundle.

Why: the store judges leases by Redis's clock, which a broker cannot read. What a broker knows
is its own monotonic clock and when it *sent* a renewal (or acquisition) that succeeded. The
store ran that script at or after the send, so the lease is valid until at least
``t0 + ttl`` in real time. The broker stops serving at

    serve_until = t0 + ttl * (1 - rho) - margin

where ``rho`` bounds the rate error of the broker's clock against Redis's
(``leaseClockDriftBound``) and ``margin`` covers the time it takes to stop
(``leaseStopMarginMs``). Clock offsets do not enter; only rates do. docs/ownership.md ("The
clock", "Serving in real time") gives the argument and the chosen values.

A lease may come with a **wait** (``Lease.wait_ms``, store ms): the previous holder lost it by a
move and may still serve until its old lease's expiry, unless it acknowledged it stopped
(``metadata_store.handover``). The store's clock read the wait at some moment before the reply;
``wait`` store ms pass within ``wait * (1 + rho)`` real seconds and within
``wait * (1 + rho)**2 <= wait * (1 + 2 * rho) + O(rho**2)`` local seconds, so the broker starts at

    serve_from = t_reply + wait * (1 + 2 * rho) + margin

(the margin covers the rounding and the second-order term) and never before its reply.

``ServingTable`` keeps that deadline per bundle for one broker and records the intervals the
broker served, in its local clock, for ``loadbalance.serving_checker``. Pure: every time is
passed in (seconds of the broker's monotonic clock); nothing here reads a clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from loadbalance.bundles import parse_bundle
from loadbalance.config import LoadBalancerConfig

#: Closed intervals kept per table: a long-lived agent must not grow without bound.
MAX_CLOSED_INTERVALS = 10_000


@dataclass(frozen=True, slots=True)
class ServingRule:
    """``serve_until(t0) = t0 + ttl * (1 - drift_bound) - stop_margin``; seconds."""

    ttl_s: float
    drift_bound: float
    stop_margin_s: float

    def __post_init__(self) -> None:
        if not 0 <= self.drift_bound < 1:
            raise ValueError(f"drift bound must be in [0, 1), got {self.drift_bound}")
        if self.stop_margin_s < 0 or self.ttl_s <= 0:
            raise ValueError("lease TTL must be positive and the stop margin not negative")

    @classmethod
    def from_config(cls, config: LoadBalancerConfig) -> ServingRule:
        return cls(
            ttl_s=float(config.load_balancer_ownership_lease_ttl_seconds),
            drift_bound=float(config.lease_clock_drift_bound),
            stop_margin_s=config.lease_stop_margin_ms / 1000.0,
        )

    def serve_from(self, replied_at: float, wait_s: float) -> float:
        """The local time from which a lease whose reply came at ``replied_at`` with a wait of
        ``wait_s`` store seconds may be served (``replied_at`` itself when there is no wait)."""
        if wait_s <= 0:
            return replied_at
        return replied_at + wait_s * (1.0 + 2.0 * self.drift_bound) + self.stop_margin_s

    def serve_until(self, requested_at: float) -> float:
        """The local time past which a lease renewed by a request sent at ``requested_at``
        must no longer be served."""
        return requested_at + self.ttl_s * (1.0 - self.drift_bound) - self.stop_margin_s


@dataclass(frozen=True, slots=True)
class ServingInterval:
    """``broker`` served ``bundle`` (token ``token``) over ``[start, end]`` of its local clock.

    ``renewals`` are the local send times of the successful renewals that opened and extended
    the interval; ``end`` is the serve-until of the last one, or the moment the broker learned
    it had lost the lease, whichever came first."""

    broker: str
    bundle: str
    namespace: str
    lower: int
    upper: int
    token: int
    start: float
    end: float
    renewals: tuple[float, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "broker": self.broker,
            "bundle": self.bundle,
            "token": self.token,
            "start": self.start,
            "end": self.end,
            "renewals": list(self.renewals),
        }

    @classmethod
    def from_json(cls, doc: dict[str, object]) -> ServingInterval:
        bundle = str(doc["bundle"])
        r = parse_bundle(bundle)
        return cls(
            broker=str(doc["broker"]),
            bundle=bundle,
            namespace=r.namespace,
            lower=r.lower,
            upper=r.upper,
            token=int(doc["token"]),  # type: ignore[call-overload]
            start=float(doc["start"]),  # type: ignore[arg-type]
            end=float(doc["end"]),  # type: ignore[arg-type]
            renewals=tuple(float(x) for x in doc["renewals"]),  # type: ignore[attr-defined]
        )


@dataclass(frozen=True, slots=True)
class BundleServing:
    """One bundle's state at a moment: what ``lbctl agent status`` and the gauges show."""

    bundle: str
    token: int
    serving: bool
    serve_until: float
    seconds_left: float
    renew_requested_at: float
    serve_from: float | None = None  # None: no start ahead (the lease's reply came too late)


@dataclass
class _Held:
    token: int
    until: float
    requested_at: float
    # the local time serving starts (may lie ahead: a handover wait); None: not serving (the
    # renewal's reply came too late, or the wait outlasts the deadline)
    start: float | None = None
    renewals: list[float] = field(default_factory=list)


class ServingTable:
    """One broker's serve-until per bundle, and the intervals it served (local clock)."""

    def __init__(self, broker: str, rule: ServingRule) -> None:
        self.broker = broker
        self.rule = rule
        self._held: dict[str, _Held] = {}
        self._closed: deque[ServingInterval] = deque(maxlen=MAX_CLOSED_INTERVALS)

    def bundles(self) -> list[str]:
        return sorted(self._held)

    def token(self, bundle: str) -> int | None:
        """The token ``bundle`` is held by here (None: not held)."""
        cur = self._held.get(bundle)
        return cur.token if cur is not None else None

    def renewed(
        self,
        bundle: str,
        token: int,
        requested_at: float,
        replied_at: float,
        wait_s: float = 0.0,
    ) -> None:
        """A renewal (or acquisition) of ``bundle`` with ``token``, sent at ``requested_at``,
        succeeded; its reply came at ``replied_at`` with a handover wait of ``wait_s`` store
        seconds. Serving starts at the reply (never before the broker knows), or after the wait
        (``ServingRule.serve_from``), and lasts until the new serve-until. Each reply bounds the
        start on its own, so a later reply with a shorter wait brings the start forward."""
        until = self.rule.serve_until(requested_at)
        start = self.rule.serve_from(replied_at, wait_s)
        cur = self._held.get(bundle)
        serving = cur is not None and cur.start is not None and replied_at < cur.until
        if cur is not None and serving and cur.token == token:
            # still serving (or about to): the renewal extends the interval
            assert cur.start is not None
            cur.until = max(cur.until, until)
            cur.requested_at = max(cur.requested_at, requested_at)
            if start < cur.start:
                cur.start = start
            if cur.start < cur.until:
                cur.renewals.append(requested_at)
            else:
                cur.start = None
            return
        if cur is not None:
            self._close(bundle, cur, min(cur.until, replied_at))
        held = _Held(token, until, requested_at)
        if until > replied_at and until > start:
            held.start = start
            held.renewals.append(requested_at)
        self._held[bundle] = held

    def lost(self, bundle: str, at: float) -> None:
        """The store says ``bundle`` is no longer this broker's (renewal refused, another
        owner, or gone): stop at once, at ``at`` if the deadline had not passed already."""
        cur = self._held.pop(bundle, None)
        if cur is not None:
            self._close(bundle, cur, min(cur.until, at))

    def stop_all(self, at: float) -> None:
        """The broker stopped serving everything at ``at`` (it shut down)."""
        for bundle in list(self._held):
            self.lost(bundle, at)

    def serving(self, bundle: str, now: float) -> bool:
        cur = self._held.get(bundle)
        return cur is not None and cur.start is not None and cur.start <= now < cur.until

    def status(self, now: float) -> list[BundleServing]:
        out = []
        for bundle in sorted(self._held):
            cur = self._held[bundle]
            on = self.serving(bundle, now)
            left = max(0.0, cur.until - now) if on else 0.0
            out.append(
                BundleServing(bundle, cur.token, on, cur.until, left, cur.requested_at, cur.start)
            )
        return out

    def intervals(self) -> list[ServingInterval]:
        """Every interval served so far; an open one ends at its current serve-until (one whose
        start still lies ahead is what the broker will serve unless it learns otherwise)."""
        out = list(self._closed)
        for bundle in sorted(self._held):
            cur = self._held[bundle]
            if cur.start is not None:
                out.append(self._interval(bundle, cur, cur.until))
        return out

    def _close(self, bundle: str, cur: _Held, end: float) -> None:
        """End ``cur``'s interval at ``end``; one that had not started yet served nothing."""
        if cur.start is not None and end >= cur.start:
            self._closed.append(self._interval(bundle, cur, end))
        cur.start = None

    def _interval(self, bundle: str, cur: _Held, end: float) -> ServingInterval:
        r = parse_bundle(bundle)
        assert cur.start is not None
        return ServingInterval(
            self.broker,
            bundle,
            r.namespace,
            r.lower,
            r.upper,
            cur.token,
            cur.start,
            end,
            tuple(cur.renewals),
        )
