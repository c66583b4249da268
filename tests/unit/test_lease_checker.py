"""The ownership-history checker: each rule catches a hand-made violating history, correct
histories (including the tricky legal ones) pass, and a history produced by a trivially correct
store model never violates anything (hypothesis)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from loadbalance.lease_checker import Violation, check_history
from loadbalance.lease_history import Claim, Event, NamespaceVersion, Revocation

NS = "acme/ns"
TOP = 0xFFFFFFFF
HALF = 0x80000000
ALL = (0, TOP)
LEFT = (0, HALF)
RIGHT = (HALF, TOP)


def claim(broker, rng, token, frm, until, kind="acquire", ns=NS) -> Claim:
    return Claim(broker, ns, rng[0], rng[1], token, frm, until, kind)


def revoke(broker, rng, token, at, kind="release", ns=NS) -> Revocation:
    return Revocation(broker, ns, rng[0], rng[1], token, at, kind)


def kinds(violations: list[Violation]) -> list[str]:
    return [v.kind for v in violations]


# -- correct histories ------------------------------------------------------------------------


def test_empty_history_has_no_violation() -> None:
    assert check_history([]) == []


def test_renewal_extends_a_claim_and_release_ends_it() -> None:
    h = [
        NamespaceVersion(NS, 0, (0, TOP), 0),
        claim("a", ALL, 1, 0, 100),
        claim("a", ALL, 1, 90, 190, "renew"),
        claim("a", ALL, 1, 180, 280, "renew"),
        revoke("a", ALL, 1, 200),
        claim("b", ALL, 2, 200, 300),  # touches a's end at 200: not an overlap
    ]
    assert check_history(h) == []


def test_touching_but_not_overlapping_validity_is_fine() -> None:
    h = [claim("a", ALL, 1, 0, 100), claim("b", ALL, 2, 100, 200)]
    assert check_history(h) == []


def test_a_transfer_that_ends_the_source_claim_is_fine() -> None:
    h = [
        claim("a", LEFT, 1, 0, 100),
        revoke("a", LEFT, 1, 50, "transfer"),
        claim("b", LEFT, 2, 50, 150, "transfer"),
        claim("b", LEFT, 2, 140, 240, "renew"),
    ]
    assert check_history(h) == []


def test_children_owned_after_the_parent_was_split_away_are_fine() -> None:
    h = [
        NamespaceVersion(NS, 0, (0, TOP), 0),
        claim("a", ALL, 1, 0, 100),
        revoke("a", ALL, 1, 40, "split"),
        NamespaceVersion(NS, 1, (0, HALF, TOP), 40),
        claim("b", LEFT, 2, 41, 141),
        claim("c", RIGHT, 3, 41, 141),
        revoke("b", LEFT, 2, 60, "merge"),
        revoke("c", RIGHT, 3, 60, "merge"),
        NamespaceVersion(NS, 2, (0, TOP), 60),
        claim("a", ALL, 4, 60, 160),
    ]
    assert check_history(h) == []


def test_adjacent_bundles_including_the_closed_last_one_do_not_overlap() -> None:
    h = [
        claim("a", (0, TOP - 1), 1, 0, 100),
        claim("b", (TOP - 1, TOP), 2, 0, 100),
    ]
    assert check_history(h) == []


def test_an_expired_lease_taken_over_without_a_sweep_is_fine() -> None:
    h = [
        claim("a", ALL, 1, 0, 100),
        claim("b", ALL, 2, 150, 250),
        revoke("a", ALL, 1, 160, "sweep"),  # a sweep of the already-expired token 1
    ]
    assert check_history(h) == []


def test_a_renewal_and_a_release_in_the_same_millisecond_in_that_order_are_fine() -> None:
    h = [claim("a", ALL, 1, 0, 100), claim("a", ALL, 1, 50, 150, "renew"), revoke("a", ALL, 1, 50)]
    assert check_history(h) == []


def test_the_same_broker_on_overlapping_ranges_is_not_a_double_owner() -> None:
    h = [claim("a", ALL, 1, 0, 100), claim("a", LEFT, 2, 10, 100)]
    assert check_history(h) == []


# -- rule 1: double ownership ------------------------------------------------------------------


def test_two_brokers_on_one_bundle_at_once_is_a_double_owner() -> None:
    h = [claim("a", LEFT, 1, 0, 100), claim("b", LEFT, 2, 99, 199)]
    v = check_history(h)
    assert kinds(v) == ["double_owner"]
    msg = v[0].message
    for text in ("a", "b", "token 1", "token 2", "0x00000000_0x80000000", "[99, 100)"):
        assert text in msg


def test_a_child_owned_while_its_unrevoked_parent_is_live_is_a_double_owner() -> None:
    h = [
        claim("a", ALL, 1, 0, 100),
        NamespaceVersion(NS, 0, (0, TOP), 0),
        NamespaceVersion(NS, 1, (0, HALF, TOP), 40),  # the split forgot the parent's lease
        claim("b", RIGHT, 2, 41, 141),
    ]
    v = check_history(h)
    assert kinds(v) == ["double_owner"]
    assert "0x80000000_0xffffffff" in v[0].message and "[41, 100)" in v[0].message


def test_a_renewal_that_extends_past_a_new_owner_is_a_double_owner() -> None:
    h = [
        claim("a", ALL, 1, 0, 100),
        claim("b", ALL, 2, 100, 200),
        claim("a", ALL, 1, 90, 190, "renew"),  # renewed in time, but b already holds it
    ]
    assert "double_owner" in kinds(check_history(h))


def test_overlap_at_the_closed_last_bundle_names_0xffffffff() -> None:
    h = [claim("a", (TOP - 1, TOP), 1, 0, 100), claim("b", RIGHT, 2, 50, 150)]
    v = check_history(h)
    assert kinds(v) == ["double_owner"]
    assert "0xfffffffe_0xffffffff" in v[0].message


def test_a_double_owner_in_another_namespace_is_not_mixed_up() -> None:
    h = [claim("a", ALL, 1, 0, 100), claim("b", ALL, 2, 0, 100, ns="acme/other")]
    assert check_history(h) == []


# -- rule 2: claim after revocation ------------------------------------------------------------


def test_a_renewal_after_release_is_reported() -> None:
    h = [claim("a", ALL, 1, 0, 100), revoke("a", ALL, 1, 50), claim("a", ALL, 1, 60, 160, "renew")]
    v = check_history(h)
    assert kinds(v) == ["claim_after_revocation"]
    assert "token 1" in v[0].message and "release" in v[0].message and "50 ms" in v[0].message


def test_a_renewal_recorded_after_its_revocation_in_the_same_millisecond() -> None:
    h = [claim("a", ALL, 1, 0, 100), revoke("a", ALL, 1, 50), claim("a", ALL, 1, 50, 150, "renew")]
    # in the store's order this renewed a released lease; recorded by racing clients, it may
    # have come first, so only an ordered history can say
    assert kinds(check_history(h, ordered=True)) == ["claim_after_revocation"]
    assert check_history(h) == []


def test_a_renewal_and_a_sweep_in_the_same_millisecond_are_reported_in_either_order() -> None:
    grant = claim("a", ALL, 1, 0, 90)  # expired at 90: the sweep alone would be fine
    renew = claim("a", ALL, 1, 90, 190, "renew")
    sweep = revoke("a", ALL, 1, 90, "sweep")
    assert check_history([grant, sweep]) == []
    for ordered in (False, True):
        assert kinds(check_history([grant, renew, sweep], ordered=ordered)) == [
            "renew_after_expiry",
            "sweep_of_live_lease",
        ]
    assert kinds(check_history([grant, sweep, renew], ordered=True)) == [
        "claim_after_revocation",
        "renew_after_expiry",
    ]


def test_a_renewal_of_an_expired_lease_is_reported() -> None:
    h = [claim("a", ALL, 1, 0, 100), claim("a", ALL, 1, 100, 200, "renew")]
    v = check_history(h)
    assert kinds(v) == ["renew_after_expiry"]
    assert "expired at 100 ms" in v[0].message


def test_a_renewal_one_millisecond_before_expiry_is_fine() -> None:
    h = [claim("a", ALL, 1, 0, 100), claim("a", ALL, 1, 99, 199, "renew")]
    assert check_history(h) == []


# -- rule 3: sweeps ---------------------------------------------------------------------------


def test_a_sweep_of_a_just_renewed_lease_is_reported() -> None:
    h = [
        claim("a", ALL, 1, 0, 100),
        claim("a", ALL, 1, 95, 195, "renew"),
        revoke("a", ALL, 1, 120, "sweep"),
    ]
    v = check_history(h)
    assert kinds(v) == ["sweep_of_live_lease"]
    assert "120 ms" in v[0].message and "195 ms" in v[0].message


def test_a_sweep_exactly_at_expiry_is_fine() -> None:
    h = [claim("a", ALL, 1, 0, 100), revoke("a", ALL, 1, 100, "sweep")]
    assert check_history(h) == []


# -- rule 4: fencing tokens ---------------------------------------------------------------------


def test_a_smaller_token_granted_later_on_an_overlapping_range_is_reported() -> None:
    h = [
        claim("a", ALL, 5, 0, 100),
        revoke("a", ALL, 5, 40, "split"),
        claim("b", LEFT, 3, 50, 150),  # child of the split with an older token
    ]
    v = check_history(h)
    assert kinds(v) == ["token_not_increasing"]
    assert "token 3" in v[0].message and "token 5" in v[0].message


def test_a_token_granted_twice_is_reported() -> None:
    h = [claim("a", LEFT, 4, 0, 100), claim("b", RIGHT, 4, 10, 100)]
    assert kinds(check_history(h)) == ["token_not_increasing"]


def test_tokens_on_disjoint_ranges_need_not_be_ordered() -> None:
    h = [claim("a", LEFT, 9, 0, 100), claim("b", RIGHT, 2, 10, 100)]
    assert check_history(h) == []


def test_a_renewal_of_a_token_never_granted_to_that_broker_is_reported() -> None:
    h = [claim("a", ALL, 1, 0, 100), revoke("a", ALL, 1, 10), claim("b", ALL, 1, 20, 120, "renew")]
    v = check_history(h)
    assert "renew_without_grant" in kinds(v)
    assert "claim_after_revocation" in kinds(v)


def test_a_renewal_of_an_unknown_token_is_reported() -> None:
    h = [claim("a", ALL, 7, 0, 100, "renew")]
    assert kinds(check_history(h)) == ["renew_without_grant"]


# -- rule 5: namespace versions -----------------------------------------------------------------


def test_one_version_with_two_boundary_tuples_is_reported() -> None:
    h = [NamespaceVersion(NS, 1, (0, HALF, TOP), 10), NamespaceVersion(NS, 1, (0, 7, TOP), 20)]
    assert kinds(check_history(h)) == ["namespace_version"]


def test_a_version_going_back_in_time_is_reported() -> None:
    h = [NamespaceVersion(NS, 2, (0, TOP), 10), NamespaceVersion(NS, 1, (0, HALF, TOP), 20)]
    v = check_history(h)
    assert kinds(v) == ["namespace_version"] and "went back" in v[0].message


def test_boundaries_that_miss_the_ring_end_or_do_not_increase_are_reported() -> None:
    h = [
        NamespaceVersion(NS, 0, (0, HALF, TOP - 1), 0),
        NamespaceVersion("acme/two", 0, (0, HALF, HALF, TOP), 0),
    ]
    assert kinds(check_history(h)) == ["namespace_version", "namespace_version"]


# -- a trivially correct model never violates ---------------------------------------------------


@dataclass
class _Model:
    """An obviously correct single-threaded store: the history it records must be clean.

    A lease keeps the TTL it was granted with, so renewals never shorten it (the checker
    takes a lease's validity as the union of its claims).
    """

    now: int = 0
    token: int = 0
    version: int = 0
    bounds: list[int] = field(default_factory=lambda: [0, HALF, TOP])
    leases: dict[tuple[int, int], tuple[str, int, int, int]] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)

    def live(self, rng: tuple[int, int]) -> tuple[str, int, int, int] | None:
        lease = self.leases.get(rng)
        return lease if lease and lease[2] > self.now else None

    def step(self, op: str, idx: int, broker: str, dt: int, ttl: int, cut: int) -> None:
        self.now += dt
        ranges = list(zip(self.bounds, self.bounds[1:], strict=False))
        rng = ranges[idx % len(ranges)]
        live = self.live(rng)
        if op == "acquire" and live is None:
            self.token += 1
            self.leases[rng] = (broker, self.token, self.now + ttl, ttl)
            self.events.append(claim(broker, rng, self.token, self.now, self.now + ttl))
        elif op == "renew" and live is not None:
            until = self.now + live[3]
            self.leases[rng] = (live[0], live[1], until, live[3])
            self.events.append(claim(live[0], rng, live[1], self.now, until, "renew"))
        elif op == "release" and live is not None:
            del self.leases[rng]
            self.events.append(revoke(live[0], rng, live[1], self.now))
        elif op == "transfer" and live is not None and live[0] != broker:
            self.token += 1
            self.leases[rng] = (broker, self.token, self.now + ttl, ttl)
            self.events.append(revoke(live[0], rng, live[1], self.now, "transfer"))
            self.events.append(claim(broker, rng, self.token, self.now, self.now + ttl, "transfer"))
        elif op == "sweep":
            for r, lease in sorted(self.leases.items()):
                if lease[2] <= self.now:
                    del self.leases[r]
                    self.events.append(revoke(lease[0], r, lease[1], self.now, "sweep"))
        elif op == "split" and rng[1] - rng[0] > 1:
            point = rng[0] + 1 + cut % (rng[1] - rng[0] - 1)
            self._reshape(sorted([*self.bounds, point]), [rng], "split")
        elif op == "merge" and len(ranges) > 1:
            i = idx % (len(ranges) - 1)
            gone = [ranges[i], ranges[i + 1]]
            self._reshape([b for b in self.bounds if b != ranges[i][1]], gone, "merge")

    def _reshape(self, bounds: list[int], gone: list[tuple[int, int]], kind: str) -> None:
        for r in gone:
            lease = self.leases.pop(r, None)
            if lease is not None:
                self.events.append(revoke(lease[0], r, lease[1], self.now, kind))
        self.bounds = bounds
        self.version += 1
        self.events.append(NamespaceVersion(NS, self.version, tuple(bounds), self.now))


_ops = st.lists(
    st.tuples(
        st.sampled_from(["acquire", "renew", "release", "transfer", "sweep", "split", "merge"]),
        st.integers(0, 31),
        st.sampled_from(["a", "b", "c"]),
        st.integers(0, 60),
        st.integers(1, 120),
        st.integers(0, 2**32),
    ),
    max_size=120,
)


@settings(max_examples=200, deadline=None)
@given(_ops)
def test_a_correct_model_never_violates(ops) -> None:
    m = _Model()
    m.events.append(NamespaceVersion(NS, 0, tuple(m.bounds), 0))
    for op in ops:
        m.step(*op)
    assert check_history(m.events, ordered=True) == []
    assert check_history(m.events) == []


def test_a_hundred_thousand_events_check_in_seconds() -> None:
    import random

    rnd = random.Random(7)
    m = _Model()
    names = ["acquire", "renew", "renew", "release", "transfer", "sweep", "split", "merge"]
    while len(m.events) < 100_000:
        m.step(
            rnd.choice(names),
            rnd.randrange(64),
            rnd.choice("abcde"),
            rnd.randrange(5),
            rnd.randrange(20, 200),
            rnd.randrange(2**32),
        )
    t0 = time.perf_counter()
    assert check_history(m.events) == []
    assert time.perf_counter() - t0 < 20
