"""Two ways the ownership layer once let a bundle have two live owners, against a real Redis.

1. **Spelling.** A bundle's identity was the text of its name: an upper-case spelling of a range
   (which ``parse_bundle`` accepts, as Pulsar's admin tools do) built a second lease key beside
   the live one. Every accepted spelling must reach the same key and the same owner.
2. **Read, then act.** The expiry sweep read a lease, then removed it in a second round trip
   with a script that checked only broker and token; a renewal landing in between (which
   succeeded) was deleted. Here a renewal is injected after every command the sweep sends, and
   a renewal that succeeded must leave its lease in place.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lbctl.main import main
from loadbalance.errors import Conflict
from metadata_store.ownership_memory import MemoryStore
from metadata_store.ownership_redis import RedisStore

NS = "acme/ns"
LOWER, UPPER = 0xC0000000, 0xFFFFFFFF
CANONICAL = f"{NS}/0xc0000000_0xffffffff"
TTL = 60_000


def _spell(hex_digits: str, upper_mask: list[bool]) -> str:
    return "".join(c.upper() if up else c for c, up in zip(hex_digits, upper_mask))


def _spellings() -> st.SearchStrategy[str]:
    lower = f"{LOWER:08x}"
    upper = f"{UPPER:08x}"
    masks = st.lists(st.booleans(), min_size=8, max_size=8)
    return st.builds(lambda a, b: f"{NS}/0x{_spell(lower, a)}_0x{_spell(upper, b)}", masks, masks)


@pytest.fixture
def store(fresh_redis: redis.Redis) -> RedisStore:
    s = RedisStore(fresh_redis)
    s.create_namespace(NS, 4)
    for b in ("b1", "b2"):
        s.register_broker(b, 1_000, 10**9)
    return s


def test_an_upper_case_spelling_cannot_take_a_second_lease(
    store: RedisStore, fresh_redis: redis.Redis
) -> None:
    store.acquire(CANONICAL, "b1", 1_000, TTL)
    with pytest.raises(Conflict):
        store.acquire(f"{NS}/0xC0000000_0xFFFFFFFF", "b2", 1_001, TTL)
    lease = store.owner(f"{NS}/0xC0000000_0xFFFFFFFF", 1_001)
    assert lease is not None and (lease.bundle, lease.broker) == (CANONICAL, "b1")
    assert [k.decode() for k in fresh_redis.keys("lb:lease:*")] == [f"lb:lease:{CANONICAL}"]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(spelling=_spellings())
def test_every_accepted_spelling_reaches_the_same_key_and_owner(
    store: RedisStore, fresh_redis: redis.Redis, spelling: str
) -> None:
    fresh_redis.delete(f"lb:lease:{CANONICAL}")
    lease = store.acquire(spelling, "b1", 1_000, TTL)
    assert lease.bundle == CANONICAL
    assert store.owner(CANONICAL, 1_001) == lease
    assert store.owner(spelling, 1_001) == lease
    assert store.renew_all("b1", {spelling: lease.token}, 1_002, TTL) == {spelling: True}
    with pytest.raises(Conflict):
        rng = spelling.rsplit("/", 1)[1]
        store.acquire(f"{NS}/{rng.swapcase().replace('X', 'x')}", "b2", 1_003, TTL)
    assert [k.decode() for k in fresh_redis.keys("lb:lease:*")] == [f"lb:lease:{CANONICAL}"]
    memory = MemoryStore()
    memory.create_namespace(NS, 4)
    memory.register_broker("b1", 1_000, 10**9)
    assert memory.acquire(spelling, "b1", 1_000, TTL).bundle == CANONICAL
    assert memory.owner(CANONICAL, 1_001) is not None


def test_admin_unload_with_upper_case_hex_moves_the_live_lease(
    redis_url: str, store: RedisStore, fresh_redis: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    """``lbctl unload NS -b 0xC0000000_0xFFFFFFFF -d b2``: a transfer of b1's lease, not a second
    lease beside it; without ``-d`` it releases b1's lease instead of saying "not owned"."""
    import time

    now = int(time.time() * 1000)
    for b in ("b1", "b2"):
        store.register_broker(b, now, 600_000)
    first = store.acquire(CANONICAL, "b1", now, 600_000)
    u = ("--redis-url", redis_url, "--json")
    code = main(["unload", NS, "--bundle", "0xC0000000_0xFFFFFFFF", "-d", "b2", *u])
    rows = json.loads(capsys.readouterr().out)
    assert code == 0 and rows[0]["outcome"] == "applied" and rows[0]["bundle"] == CANONICAL
    moved = store.owner(CANONICAL, int(time.time() * 1000))
    assert moved is not None and moved.broker == "b2" and moved.token > first.token
    assert [k.decode() for k in fresh_redis.keys("lb:lease:*")] == [f"lb:lease:{CANONICAL}"]
    code = main(["unload", NS, "--bundle", "0xC0000000_0xFFFFFFFF", *u])
    rows = json.loads(capsys.readouterr().out)
    assert code == 0 and rows[0]["outcome"] == "applied"
    assert store.owner(CANONICAL, int(time.time() * 1000)) is None


class _HookedRedis(redis.Redis):
    """A client that runs ``hook`` right after its ``at``-th command (1-based) returns."""

    at = 0
    hook: Callable[[], None] | None = None
    sent = 0

    def execute_command(self, *args: Any, **options: Any) -> Any:
        result = super().execute_command(*args, **options)
        self.sent += 1
        if self.hook is not None and self.sent == self.at:
            hook, self.hook = self.hook, None
            hook()
        return result


@pytest.mark.parametrize("at", range(1, 6))
def test_a_renewal_during_the_sweep_keeps_its_lease(redis_url: str, at: int) -> None:
    """The broker's clock says its lease is still live (it renews just in time); the controller's
    clock says it expired. Whatever command of the sweep the renewal follows, a renewal that
    answered True leaves the broker owning the bundle with the same token."""
    base = redis.Redis.from_url(redis_url)
    base.flushall()
    broker_side = RedisStore(base)
    broker_side.create_namespace(NS, 4)
    broker_side.register_broker("b1", 0, 10**9)
    lease = broker_side.acquire(CANONICAL, "b1", 0, 1_000)  # expires at 1_000
    renewed: list[bool] = []

    def renew() -> None:
        renewed.append(broker_side.renew_all("b1", {CANONICAL: lease.token}, 999, 1_000)[CANONICAL])

    hooked = _HookedRedis.from_url(redis_url)
    hooked.at, hooked.hook = at, renew
    sweeper = RedisStore(hooked)
    swept = sweeper.sweep_expired(1_500)  # the controller's clock: expired
    after = broker_side.owner(CANONICAL, 1_600)
    if renewed == [True]:
        assert after is not None and (after.broker, after.token) == ("b1", lease.token)
        assert swept == []
    else:
        assert after is None and [x.bundle for x in swept] == [CANONICAL]
    base.close()
    hooked.close()
