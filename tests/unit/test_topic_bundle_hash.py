"""The one topic -> bundle function (``loadbalance.bundles.topic_namespace_and_hash`` and
``bundle_index``) is Pulsar's: the CRC32 of the full topic name, searched over the boundaries."""

from __future__ import annotations

import bisect
import random

import pytest

from loadbalance.bundles import (
    FULL_UPPER,
    NamespaceBundles,
    bundle_index,
    topic_hash,
    topic_namespace,
    topic_namespace_and_hash,
)


def test_the_hash_is_ieee_crc32_as_guavas_hashing_crc32() -> None:
    # fixed values of IEEE CRC-32 (Guava's Hashing.crc32(), which Pulsar's
    # NamespaceBundleFactory uses) over the full names' UTF-8 bytes
    assert topic_namespace_and_hash("persistent://public/default/my-topic") == (
        "public/default",
        0x2BAD45F7,
    )
    assert topic_namespace_and_hash("my-topic") == ("public/default", 0x2BAD45F7)
    assert topic_namespace_and_hash("pulsar/use/ns2/topic-2")[1] == 0x96F239F6
    # UTF-8 bytes, not code points
    assert topic_namespace_and_hash("non-persistent://t/ns/été") == ("t/ns", 0x85AC1091)


def test_short_and_long_names_give_the_same_namespace_and_hash() -> None:
    rng = random.Random(7)
    for _ in range(500):
        tenant, ns = f"t{rng.randrange(50)}", f"ns-{rng.randrange(50)}"
        name = "".join(rng.choice("abcxyz-_.0123") for _ in range(rng.randint(1, 30)))
        for topic in (f"{tenant}/{ns}/{name}", f"persistent://{tenant}/{ns}/{name}"):
            got_ns, h = topic_namespace_and_hash(topic)
            assert got_ns == topic_namespace(topic) == f"{tenant}/{ns}"
            assert h == topic_hash(topic)


def test_bundle_index_finds_the_bundle_holding_the_hash() -> None:
    rng = random.Random(11)
    for n in (1, 2, 3, 16, 100):
        nb = NamespaceBundles.initial("t/ns", n)
        bounds = nb.boundaries
        for h in [
            0,
            1,
            FULL_UPPER - 1,
            FULL_UPPER,
            *bounds,
            *(rng.getrandbits(32) for _ in range(200)),
        ]:
            i = bundle_index(bounds, h)
            assert bounds[i] <= h and (h < bounds[i + 1] or i == len(bounds) - 2)
            assert i == min(bisect.bisect_right(bounds, h) - 1, len(bounds) - 2)
            assert nb.find_bundle_by_hash(h).name == nb.bundle_names[i]


@pytest.mark.parametrize("topic", ["persistent://t/ns/a", "t/ns/b/c", "non-persistent://t/ns/x"])
def test_find_bundle_uses_the_same_hash(topic: str) -> None:
    nb = NamespaceBundles.initial("t/ns", 8)
    _, h = topic_namespace_and_hash(topic)
    assert nb.find_bundle(topic).name == nb.bundle_names[bundle_index(nb.boundaries, h)]
