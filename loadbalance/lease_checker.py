"""An independent check of an ownership history: no hash ever had two live owners.

Why a separate checker: the stores guard each operation inside one atomic script, but a guard
that is wrong still writes keys that look fine one at a time. This module knows nothing about
keys, scripts or clocks; it replays what the store *said* (``loadbalance.lease_history``) and
checks it by hash interval, so a parent bundle and its child after a split are compared like any
two overlapping ranges.

The rules (``Violation.kind`` in brackets):

1. [double_owner] No two claims of different brokers on overlapping ranges of one namespace
   have overlapping effective validity. A lease (namespace, range, token, broker) is valid over
   the union of its claims' ``[valid_from, valid_until)`` (renewals extend it), cut at the
   earliest revocation of that namespace, range and token (revocations end it).
2. [claim_after_revocation] No claim of a token starts at or after that token's revocation (a
   lost lease was renewed). [renew_after_expiry] No renewal starts at or after the end of every
   earlier claim of its lease (an expired lease was revived; the store renews only live ones).
3. [sweep_of_live_lease] A ``sweep`` revocation happens at or after the latest ``valid_until``
   granted to that token by the claims made before the sweep (a sweep removes expired leases
   only).
4. [token_not_increasing] For every point of the ring, the grants (``acquire``/``transfer``,
   not ``renew``) covering it, in ``valid_from`` order, carry strictly increasing tokens; two
   grants never share a token. [renew_without_grant] A renew carries the token of an earlier
   grant to the same broker on the same range.
5. [namespace_version] Each version of a namespace has exactly one boundary tuple, versions in
   time order never go backwards, and every boundary tuple covers the ring exactly.

A renewal never shortens a lease here: validity is the union of the claims, which is what a
store that sets ``valid_until = now + ttl`` with one TTL per holder grants. Events in the same
millisecond cannot be ordered by their times. By default they are taken as unordered: a claim
and a release, transfer, split or merge of its token in the same millisecond break no rule (a
store whose clients record after the script returns, from many threads, records such pairs in
either order), while a claim and a sweep of its token in the same millisecond always do (before
the sweep it made the lease live, after it it revived a removed lease). With ``ordered=True``
the caller promises the events come in the order the store executed them (one thread, or a
recorder inside the store's critical section), and the position decides: a renewal recorded
after its revocation in the same millisecond is a violation.

Ranges follow ``lease_history``: ``[lower, upper)``, and a range ending at ``0xffffffff`` also
covers ``0xffffffff``. Internally every range is the half-open ``[lower, end)`` with
``end = upper + 1`` for the last bundle.

Cost: one sort and a sweep line per namespace for rule 1 (work grows with the number of leases
valid at the same time, not with all pairs), a max segment tree over the ring for rule 4, and
dictionaries for the rest.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from loadbalance.lease_history import Claim, Event, NamespaceVersion, Revocation

_RING_TOP = 0xFFFFFFFF
_GRANT_KINDS = frozenset({"acquire", "transfer"})


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule: ``kind`` names the rule, ``message`` the brokers, range, tokens, times."""

    kind: str
    message: str


def _end(upper: int) -> int:
    return upper + 1 if upper == _RING_TOP else upper


def _rng(lower: int, end: int) -> str:
    """A half-open internal range printed as a bundle range (the closed last bundle as ffffffff)."""
    return f"0x{lower:08x}_0x{min(end, _RING_TOP):08x}"


def _claim_text(c: Claim) -> str:
    return (
        f"{c.broker} token {c.token} {c.kind} [{c.valid_from_ms}, {c.valid_until_ms}) on "
        f"{c.namespace}/{_rng(c.lower, _end(c.upper))}"
    )


def check_history(events: Iterable[Event], *, ordered: bool = False) -> list[Violation]:
    """Every violation of rules 1-5 in ``events`` (empty for a correct history), rule by rule.

    ``ordered``: the events come in the store's execution order, so same-millisecond ties are
    resolved by position (see the module docstring).
    """
    claims: list[tuple[int, Claim]] = []
    revocations: list[tuple[int, Revocation]] = []
    versions: list[tuple[int, NamespaceVersion]] = []
    for i, e in enumerate(events):
        # Unordered: a claim sorts before every revocation of its millisecond (rule 2 holds), so
        # a sweep sorts after it (rule 3 judges it, see the module docstring).
        pos = i if ordered else (-1 if isinstance(e, Claim) else 1)
        if isinstance(e, Claim):
            claims.append((pos, e))
        elif isinstance(e, Revocation):
            revocations.append((pos, e))
        elif isinstance(e, NamespaceVersion):
            versions.append((pos, e))
        else:
            raise TypeError(f"not a history event: {e!r}")

    # Earliest revocation of each (namespace, lower, upper, token), by (time, position).
    first_rev: dict[tuple[str, int, int, int], tuple[int, int, Revocation]] = {}
    for pos, r in revocations:
        key = (r.namespace, r.lower, r.upper, r.token)
        cur = first_rev.get(key)
        if cur is None or (r.at_ms, pos) < cur[:2]:
            first_rev[key] = (r.at_ms, pos, r)

    out: list[Violation] = []
    out += _double_owners(claims, first_rev)
    out += _claims_after_revocation(claims, first_rev)
    out += _renewals_after_expiry(claims)
    out += _sweeps_of_live_leases(claims, revocations)
    out += _token_order(claims)
    out += _namespace_versions(versions)
    return out


# -- rule 1 -----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Span:
    """One maximal interval of one lease's effective validity."""

    namespace: str
    lower: int
    end: int
    token: int
    broker: str
    start_ms: int
    until_ms: int


def _effective_spans(
    claims: list[tuple[int, Claim]],
    first_rev: dict[tuple[str, int, int, int], tuple[int, int, Revocation]],
) -> list[_Span]:
    by_lease: dict[tuple[str, int, int, int, str], list[tuple[int, int]]] = defaultdict(list)
    for _, c in claims:
        rev = first_rev.get((c.namespace, c.lower, c.upper, c.token))
        until = c.valid_until_ms if rev is None else min(c.valid_until_ms, rev[0])
        if c.valid_from_ms < until:
            by_lease[(c.namespace, c.lower, c.upper, c.token, c.broker)].append(
                (c.valid_from_ms, until)
            )
    spans: list[_Span] = []
    for (ns, lower, upper, token, broker), intervals in by_lease.items():
        intervals.sort()
        cur_from, cur_until = intervals[0]
        for f, u in intervals[1:]:
            if f <= cur_until:
                cur_until = max(cur_until, u)
            else:
                spans.append(_Span(ns, lower, _end(upper), token, broker, cur_from, cur_until))
                cur_from, cur_until = f, u
        spans.append(_Span(ns, lower, _end(upper), token, broker, cur_from, cur_until))
    return spans


def _double_owners(
    claims: list[tuple[int, Claim]],
    first_rev: dict[tuple[str, int, int, int], tuple[int, int, Revocation]],
) -> list[Violation]:
    """Sweep each namespace's spans in start order, keeping only those still valid."""
    out: list[Violation] = []
    reported: set[tuple[tuple[int, str], tuple[int, str]]] = set()
    by_ns: dict[str, list[_Span]] = defaultdict(list)
    for s in _effective_spans(claims, first_rev):
        by_ns[s.namespace].append(s)
    for ns in sorted(by_ns):
        spans = sorted(by_ns[ns], key=lambda s: (s.start_ms, s.until_ms, s.token, s.broker))
        active: dict[int, _Span] = {}
        ends: list[tuple[int, int]] = []
        for i, s in enumerate(spans):
            while ends and ends[0][0] <= s.start_ms:
                active.pop(heapq.heappop(ends)[1], None)
            for o in active.values():
                if o.broker == s.broker or o.end <= s.lower or s.end <= o.lower:
                    continue
                pair = tuple(sorted(((o.token, o.broker), (s.token, s.broker))))
                if pair in reported:
                    continue
                reported.add(pair)  # type: ignore[arg-type]
                lo, hi = max(o.lower, s.lower), min(o.end, s.end)
                out.append(
                    Violation(
                        "double_owner",
                        f"{ns}/{_rng(lo, hi)} had two live owners during "
                        f"[{s.start_ms}, {min(o.until_ms, s.until_ms)}) ms: {o.broker} (token "
                        f"{o.token}, {_rng(o.lower, o.end)} valid [{o.start_ms}, {o.until_ms}))"
                        f" and {s.broker} (token {s.token}, {_rng(s.lower, s.end)} valid "
                        f"[{s.start_ms}, {s.until_ms}))",
                    )
                )
            active[i] = s
            heapq.heappush(ends, (s.until_ms, i))
    return out


# -- rules 2 and 3 ----------------------------------------------------------------------------


def _claims_after_revocation(
    claims: list[tuple[int, Claim]],
    first_rev: dict[tuple[str, int, int, int], tuple[int, int, Revocation]],
) -> list[Violation]:
    out: list[Violation] = []
    for pos, c in claims:
        rev = first_rev.get((c.namespace, c.lower, c.upper, c.token))
        if rev is None or (c.valid_from_ms, pos) < rev[:2]:
            continue
        r = rev[2]
        out.append(
            Violation(
                "claim_after_revocation",
                f"{_claim_text(c)} came at or after the {r.kind} revocation of token {r.token} "
                f"(held by {r.broker}) at {r.at_ms} ms",
            )
        )
    return out


def _renewals_after_expiry(claims: list[tuple[int, Claim]]) -> list[Violation]:
    by_lease: dict[tuple[str, int, int, int, str], list[tuple[int, int, Claim]]] = defaultdict(list)
    for pos, c in claims:
        key = (c.namespace, c.lower, c.upper, c.token, c.broker)
        by_lease[key].append((c.valid_from_ms, pos, c))
    out: list[Violation] = []
    for entries in by_lease.values():
        entries.sort(key=lambda t: (t[0], t[1]))
        best: Claim | None = None  # the earlier claim of this lease that lasts longest
        for _, _, c in entries:
            expired = best is not None and best.valid_until_ms <= c.valid_from_ms
            if expired and best is not None and c.kind not in _GRANT_KINDS:
                out.append(
                    Violation(
                        "renew_after_expiry",
                        f"{_claim_text(c)} renewed a lease that had expired at "
                        f"{best.valid_until_ms} ms ({best.kind} from {best.valid_from_ms} ms)",
                    )
                )
            if best is None or c.valid_until_ms > best.valid_until_ms:
                best = c
    return out


def _sweeps_of_live_leases(
    claims: list[tuple[int, Claim]], revocations: list[tuple[int, Revocation]]
) -> list[Violation]:
    by_token: dict[tuple[str, int, int, int], list[tuple[int, int, Claim]]] = defaultdict(list)
    for pos, c in claims:
        by_token[(c.namespace, c.lower, c.upper, c.token)].append((c.valid_from_ms, pos, c))
    out: list[Violation] = []
    for pos, r in revocations:
        if r.kind != "sweep":
            continue
        earlier = [
            c
            for f, p, c in by_token.get((r.namespace, r.lower, r.upper, r.token), ())
            if (f, p) < (r.at_ms, pos)
        ]
        if not earlier:
            continue
        latest = max(earlier, key=lambda c: c.valid_until_ms)
        if r.at_ms < latest.valid_until_ms:
            out.append(
                Violation(
                    "sweep_of_live_lease",
                    f"sweep at {r.at_ms} ms removed {r.broker}'s token {r.token} on "
                    f"{r.namespace}/{_rng(r.lower, _end(r.upper))}, still valid until "
                    f"{latest.valid_until_ms} ms ({latest.kind} from {latest.valid_from_ms} ms)",
                )
            )
    return out


# -- rule 4 -----------------------------------------------------------------------------------


class _MaxTree:
    """Range "raise to at least v" and range max over compressed ring points (no push-down:
    a node's ``tag`` applies to its whole range, ``best`` is the max anywhere below it)."""

    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        n = 4 * self.size
        self.tag: list[tuple[int, int] | None] = [None] * n
        self.best: list[tuple[int, int] | None] = [None] * n

    def raise_to(self, lo: int, hi: int, v: tuple[int, int]) -> None:
        self._raise(1, 0, self.size, lo, hi, v)

    def _raise(self, node: int, nlo: int, nhi: int, lo: int, hi: int, v: tuple[int, int]) -> None:
        if hi <= nlo or nhi <= lo:
            return
        b = self.best[node]
        if b is None or v > b:
            self.best[node] = v
        if lo <= nlo and nhi <= hi:
            t = self.tag[node]
            if t is None or v > t:
                self.tag[node] = v
            return
        mid = (nlo + nhi) // 2
        self._raise(2 * node, nlo, mid, lo, hi, v)
        self._raise(2 * node + 1, mid, nhi, lo, hi, v)

    def max_in(self, lo: int, hi: int) -> tuple[int, int] | None:
        return self._max(1, 0, self.size, lo, hi)

    def _max(self, node: int, nlo: int, nhi: int, lo: int, hi: int) -> tuple[int, int] | None:
        if hi <= nlo or nhi <= lo:
            return None
        if lo <= nlo and nhi <= hi:
            return self.best[node]
        mid = (nlo + nhi) // 2
        cands = (
            self.tag[node],
            self._max(2 * node, nlo, mid, lo, hi),
            self._max(2 * node + 1, mid, nhi, lo, hi),
        )
        present = [c for c in cands if c is not None]
        return max(present) if present else None


def _token_order(claims: list[tuple[int, Claim]]) -> list[Violation]:
    out: list[Violation] = []
    # A grant recorded twice is one grant; a token on two different grants is not.
    grants = list(dict.fromkeys(c for _, c in claims if c.kind in _GRANT_KINDS))
    first_owner: dict[int, Claim] = {}
    for c in grants:
        prev = first_owner.setdefault(c.token, c)
        if prev != c:
            out.append(
                Violation(
                    "token_not_increasing",
                    f"token {c.token} granted twice: {_claim_text(prev)} and {_claim_text(c)}",
                )
            )
    by_ns: dict[str, list[Claim]] = defaultdict(list)
    for c in grants:
        by_ns[c.namespace].append(c)
    for ns in sorted(by_ns):
        ns_grants = sorted(by_ns[ns], key=lambda c: (c.valid_from_ms, c.token))
        points = sorted({p for c in ns_grants for p in (c.lower, _end(c.upper))})
        tree = _MaxTree(len(points) - 1)
        for i, c in enumerate(ns_grants):
            lo = bisect.bisect_left(points, c.lower)
            hi = bisect.bisect_left(points, _end(c.upper))
            top = tree.max_in(lo, hi)
            # Equal tokens are reported above as a token granted twice.
            if top is not None and top[0] > c.token:
                e = ns_grants[top[1]]
                out.append(
                    Violation(
                        "token_not_increasing",
                        f"{_claim_text(c)} does not exceed token {e.token} granted earlier "
                        f"on an overlapping range ({_claim_text(e)})",
                    )
                )
            tree.raise_to(lo, hi, (c.token, i))
    first_grant: dict[tuple[str, int, int, int, str], int] = {}
    for c in grants:
        key = (c.namespace, c.lower, c.upper, c.token, c.broker)
        first_grant[key] = min(first_grant.get(key, c.valid_from_ms), c.valid_from_ms)
    for _, c in claims:
        if c.kind in _GRANT_KINDS:
            continue
        granted = first_grant.get((c.namespace, c.lower, c.upper, c.token, c.broker))
        if granted is None or granted > c.valid_from_ms:
            out.append(
                Violation(
                    "renew_without_grant",
                    f"{_claim_text(c)} has no earlier acquire or transfer of that token to "
                    f"{c.broker} on that range",
                )
            )
    return out


# -- rule 5 -----------------------------------------------------------------------------------


def _namespace_versions(versions: list[tuple[int, NamespaceVersion]]) -> list[Violation]:
    out: list[Violation] = []
    by_ns: dict[str, list[tuple[int, int, NamespaceVersion]]] = defaultdict(list)
    for pos, v in versions:
        by_ns[v.namespace].append((v.at_ms, pos, v))
    for ns in sorted(by_ns):
        seen: dict[int, tuple[int, ...]] = {}
        # Same-millisecond reports are ordered by version: a store's clock cannot order them.
        ordered = sorted(by_ns[ns], key=lambda t: (t[0], t[2].version, t[1]))
        for _, _, v in ordered:
            b = tuple(v.boundaries)
            bad = _boundary_problem(b)
            if bad:
                out.append(
                    Violation(
                        "namespace_version", f"{ns} version {v.version} at {v.at_ms} ms: {bad}"
                    )
                )
            known = seen.setdefault(v.version, b)
            if known != b:
                out.append(
                    Violation(
                        "namespace_version",
                        f"{ns} version {v.version} has two boundary tuples: "
                        f"{_bounds(known)} and {_bounds(b)} (at {v.at_ms} ms)",
                    )
                )
        for (ta, _, a), (tb, _, b2) in itertools.pairwise(ordered):
            if b2.version < a.version:
                out.append(
                    Violation(
                        "namespace_version",
                        f"{ns} went back from version {a.version} at {ta} ms to version "
                        f"{b2.version} at {tb} ms",
                    )
                )
    return out


def _bounds(b: tuple[int, ...]) -> str:
    return "(" + ", ".join(f"0x{x:08x}" for x in b) + ")"


def _boundary_problem(b: tuple[int, ...]) -> str:
    if len(b) < 2:
        return f"boundaries {_bounds(b)} have fewer than two points"
    if b[0] != 0 or b[-1] != _RING_TOP:
        return f"boundaries {_bounds(b)} do not start at 0x00000000 and end at 0xffffffff"
    for x, y in itertools.pairwise(b):
        if not x < y:
            return f"boundaries {_bounds(b)} are not strictly increasing at 0x{x:08x}, 0x{y:08x}"
    return ""
