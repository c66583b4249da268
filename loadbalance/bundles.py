"""Namespace bundles: contiguous ranges of the 32-bit hash ring, and topic -> bundle lookup.

Mirrors Pulsar's ``NamespaceBundleFactory`` / ``NamespaceBundles`` / ``NamespaceBundle``:

* A namespace's boundaries are a sorted list ``[b0=0x00000000, b1, ..., bn=0xFFFFFFFF]``. Bundle
  ``i`` covers ``[b_i, b_{i+1})``; the last bundle also includes ``0xFFFFFFFF`` (Pulsar's
  ``BoundType.CLOSED`` upper bound on the last range).
* A topic's hash is the CRC32 of its full name, UTF-8 encoded (Guava ``Hashing.crc32()`` equals
  ``zlib.crc32``); the bundle is found by binary search over the boundaries.
* Bundle names are ``tenant/ns/0xLLLLLLLL_0xUUUUUUUU``; a bundle can be split while
  ``upper - lower > 1``.
* ``NamespaceBundles.initial(n)`` reproduces ``NamespaceBundleFactory.getPartitions``.
* Namespaces are ``tenant/ns``, plus the two three-part (v1, ``tenant/cluster/ns``) namespaces
  every Pulsar broker owns itself, so that a real broker's report parses: the heartbeat namespace
  ``pulsar/<cluster>/<host:port>`` and the SLA-monitor namespace
  ``sla-monitor/<cluster>/<host:port>`` (``NamespaceService.HEARTBEAT_NAMESPACE_PATTERN`` and
  ``SLA_NAMESPACE_PATTERN``). The v2 heartbeat ``pulsar/<host:port>`` is an ordinary two-part
  name. Other v1 namespaces stay refused: nothing else here knows a cluster level.
  ``is_system_service_namespace`` names these and ``pulsar/system``
  (``NamespaceService.isSystemServiceNamespace``): policies never move, split or merge them.

Deviation: Pulsar never merges bundles; ``merge`` exists here for cold adjacent bundles and is
used only when ``loadBalancerMergeEnabled`` is on.
"""

from __future__ import annotations

import bisect
import itertools
import re
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from loadbalance.errors import InvalidBundle

FULL_LOWER = 0x00000000
FULL_UPPER = 0xFFFFFFFF
RING_SIZE = 1 << 32

# \Z, not $: "$" also matches before a trailing newline, which would let "ns/0x.._0x..\n" in.
_RANGE_RE = re.compile(r"^0x([0-9a-fA-F]{8})_0x([0-9a-fA-F]{8})\Z")
_NAMESPACE_PART_RE = re.compile(r"^[A-Za-z0-9_.=:\-]+\Z")
# Pulsar's patterns, matched on the whole name as Java's ``Matcher.matches`` does.
SYSTEM_NAMESPACE = "pulsar/system"
HEARTBEAT_NAMESPACE_RE = re.compile(r"pulsar/[^/]+/([^:]+:\d+)\Z")
HEARTBEAT_NAMESPACE_V2_RE = re.compile(r"pulsar/([^:]+:\d+)\Z")
SLA_NAMESPACE_RE = re.compile(r"sla-monitor/[^/]+/([^:]+:\d+)\Z")


def is_system_service_namespace(namespace: str) -> bool:
    """``NamespaceService.isSystemServiceNamespace``: heartbeat (v1, v2), SLA monitor,
    ``pulsar/system``. Their bundles belong to one broker by design; no policy moves them."""
    return (
        namespace == SYSTEM_NAMESPACE
        or HEARTBEAT_NAMESPACE_RE.match(namespace) is not None
        or HEARTBEAT_NAMESPACE_V2_RE.match(namespace) is not None
        or SLA_NAMESPACE_RE.match(namespace) is not None
    )


def is_system_service_bundle(name: str) -> bool:
    """Whether a bundle name lies in a system service namespace (cheap prefix test first)."""
    if not name.startswith(("pulsar/", "sla-monitor/")):
        return False
    return is_system_service_namespace(name.rpartition("/")[0])


def _is_v1_system_namespace(parts: Sequence[str]) -> bool:
    """A three-part name Pulsar creates itself: heartbeat v1 or SLA monitor."""
    if len(parts) != 3 or not all(_NAMESPACE_PART_RE.match(p) for p in parts):
        return False
    name = "/".join(parts)
    return HEARTBEAT_NAMESPACE_RE.match(name) is not None or (
        SLA_NAMESPACE_RE.match(name) is not None
    )


def topic_hash(topic: str) -> int:
    """CRC32 of the normalised full topic name, as Pulsar's bundle factory hashes it."""
    return topic_namespace_and_hash(topic)[1]


def topic_namespace_and_hash(topic: str) -> tuple[str, int]:
    """A topic's ``tenant/ns`` and its bundle hash (Pulsar's ``Hashing.crc32()`` of the full
    name, UTF-8), from one normalisation.

    Why one function: the store's lookup, the controller's lookup cache and the simulator all
    place topics on the ring, and a second copy of the hash that drifted (another encoding, a
    short name left unnormalised) would send a topic to another bundle than Pulsar does. The
    namespace of the usual ``domain://tenant/ns/topic`` is cut out directly: lookups call this
    for every topic."""
    full = normalize_topic(topic)
    if full.count("/") == 4:
        ns = full.split("://", 1)[1].rsplit("/", 1)[0]
    else:
        ns = topic_namespace(full)
    return ns, zlib.crc32(full.encode("utf-8")) & 0xFFFFFFFF


def bundle_index(boundaries: Sequence[int], h: int) -> int:
    """Index of the bundle of a namespace's sorted ``boundaries`` that holds hash ``h`` (binary
    search; the last bundle also holds ``0xFFFFFFFF``). ``h`` must be on the ring."""
    i = bisect.bisect_right(boundaries, h) - 1
    last = len(boundaries) - 2
    return i if i < last else last


def normalize_topic(topic: str) -> str:
    """Return Pulsar's full topic name.

    ``my-topic`` -> ``persistent://public/default/my-topic`` and ``t/ns/my-topic`` ->
    ``persistent://t/ns/my-topic``, as ``TopicName.get`` does for short names.
    """
    if "://" in topic:
        domain, rest = topic.split("://", 1)
        if domain not in ("persistent", "non-persistent") or rest.count("/") < 2:
            raise InvalidBundle("topic", f"not a valid topic name: {topic!r}")
        return topic
    parts = topic.split("/")
    if len(parts) == 1 and parts[0]:
        return f"persistent://public/default/{topic}"
    if len(parts) >= 3 and all(parts[:3]):
        return f"persistent://{topic}"
    raise InvalidBundle("topic", f"not a valid topic name: {topic!r}")


def topic_namespace(topic: str) -> str:
    """The ``tenant/ns`` part of a topic name."""
    rest = normalize_topic(topic).split("://", 1)[1]
    tenant, ns = rest.split("/")[:2]
    return f"{tenant}/{ns}"


def validate_namespace(namespace: str) -> str:
    """Check a ``tenant/ns`` name (or a v1 heartbeat / SLA-monitor name) and return it."""
    parts = namespace.split("/")
    if _is_v1_system_namespace(parts):
        return namespace
    if len(parts) != 2 or not all(_NAMESPACE_PART_RE.match(p) for p in parts):
        raise InvalidBundle("namespace", f"expected 'tenant/namespace', got {namespace!r}")
    return namespace


def format_range(lower: int, upper: int) -> str:
    """``0xLLLLLLLL_0xUUUUUUUU`` as Pulsar prints a bundle range."""
    return f"0x{lower:08x}_0x{upper:08x}"


@dataclass(frozen=True, slots=True, order=True)
class BundleRange:
    """One bundle: ``[lower, upper)``, or ``[lower, 0xFFFFFFFF]`` for the last one."""

    namespace: str
    lower: int
    upper: int

    def __post_init__(self) -> None:
        if not (FULL_LOWER <= self.lower < self.upper <= FULL_UPPER):
            raise InvalidBundle(
                "bundle", f"range 0x{self.lower:x}_0x{self.upper:x} is not inside the hash ring"
            )

    @property
    def name(self) -> str:
        return f"{self.namespace}/{format_range(self.lower, self.upper)}"

    @property
    def range_name(self) -> str:
        return format_range(self.lower, self.upper)

    @property
    def is_system_service(self) -> bool:
        """In a system service namespace (heartbeat, SLA monitor, ``pulsar/system``): reported
        and counted like any bundle, but never shed, split or merged (as in Pulsar)."""
        return is_system_service_namespace(self.namespace)

    @property
    def is_last(self) -> bool:
        return self.upper == FULL_UPPER

    def contains_hash(self, h: int) -> bool:
        return self.lower <= h < self.upper or (self.is_last and h == FULL_UPPER)

    def can_split(self) -> bool:
        """Pulsar's ``canSplitBundle``: the range must be wider than 1."""
        return self.upper - self.lower > 1

    def __str__(self) -> str:
        return self.name


def parse_bundle(name: str) -> BundleRange:
    """Parse ``tenant/ns/0xLLLLLLLL_0xUUUUUUUU``; raise ``InvalidBundle`` naming the problem."""
    if not isinstance(name, str):
        raise InvalidBundle("bundle", f"expected a string, got {type(name).__name__}")
    parts = name.split("/")
    if len(parts) == 4 and _is_v1_system_namespace(parts[:3]):
        namespace = "/".join(parts[:3])
    elif len(parts) != 3:
        raise InvalidBundle("bundle", f"expected 'tenant/ns/0xLLLLLLLL_0xUUUUUUUU', got {name!r}")
    else:
        namespace = validate_namespace(f"{parts[0]}/{parts[1]}")
    match = _RANGE_RE.match(parts[-1])
    if not match:
        raise InvalidBundle("bundle", f"range must be 0xLLLLLLLL_0xUUUUUUUU, got {parts[-1]!r}")
    lower, upper = int(match.group(1), 16), int(match.group(2), 16)
    if lower >= upper:
        raise InvalidBundle("bundle", f"lower bound is not below upper bound in {name!r}")
    return BundleRange(namespace, lower, upper)


# A two-part bundle name already in its canonical spelling (lowercase hex): ``parse_bundle``
# accepts it and gives it back unchanged when its lower bound is below its upper bound.
_CANONICAL_RE = re.compile(
    r"[A-Za-z0-9_.=:\-]+/[A-Za-z0-9_.=:\-]+/0x([0-9a-f]{8})_0x([0-9a-f]{8})\Z"
)


def canonical_bundle_name(name: str) -> str:
    """``parse_bundle(name).name``, raising the same errors, without parsing a name that is
    already canonical (one regex match and a comparison of the two hex strings, which for
    eight lowercase digits orders as the numbers do).

    Why: every decision canonicalises its bundle name, and a policy cycle at a million bundles
    makes tens of thousands of decisions about names the view already holds canonically."""
    if isinstance(name, str):
        match = _CANONICAL_RE.match(name)
        if match is not None and match.group(1) < match.group(2):
            return name
    return parse_bundle(name).name


def bundle_namespace(name: str) -> str:
    """The namespace of a bundle name, without full validation (hot path)."""
    return name.rsplit("/", 1)[0]


def check_boundaries(boundaries: Sequence[int]) -> None:
    """Raise ``InvalidBundle`` unless ``boundaries`` cover the ring exactly, strictly increasing."""
    if len(boundaries) < 2:
        raise InvalidBundle("boundaries", "need at least two boundaries")
    if boundaries[0] != FULL_LOWER or boundaries[-1] != FULL_UPPER:
        raise InvalidBundle("boundaries", "must start at 0x00000000 and end at 0xffffffff")
    for a, b in itertools.pairwise(boundaries):
        if not a < b:
            raise InvalidBundle("boundaries", f"not strictly increasing at 0x{a:08x}, 0x{b:08x}")


@dataclass(frozen=True, slots=True)
class NamespaceBundles:
    """All bundles of one namespace: boundaries that cover the ring exactly, and a version.

    The version grows with every split or merge, so a store can compare-and-set on it.
    """

    namespace: str
    boundaries: tuple[int, ...]
    version: int = 0

    def __post_init__(self) -> None:
        validate_namespace(self.namespace)
        check_boundaries(self.boundaries)

    @classmethod
    def initial(cls, namespace: str, num_bundles: int) -> NamespaceBundles:
        """``NamespaceBundleFactory.getPartitions``: equal segments, last one up to 0xFFFFFFFF."""
        if num_bundles < 1 or num_bundles > RING_SIZE // 2:
            raise InvalidBundle("numBundles", f"must be between 1 and 2^31, got {num_bundles}")
        seg = RING_SIZE // num_bundles
        bounds = [i * seg for i in range(num_bundles)] + [FULL_UPPER]
        return cls(namespace, tuple(bounds), 0)

    def __len__(self) -> int:
        return len(self.boundaries) - 1

    @property
    def bundles(self) -> list[BundleRange]:
        b = self.boundaries
        return [BundleRange(self.namespace, b[i], b[i + 1]) for i in range(len(b) - 1)]

    @property
    def bundle_names(self) -> list[str]:
        return [r.name for r in self.bundles]

    def find_index(self, h: int) -> int:
        """Index of the bundle holding hash ``h`` (binary search, as ``NamespaceBundles``)."""
        if not FULL_LOWER <= h <= FULL_UPPER:
            raise InvalidBundle("hash", f"0x{h:x} is outside the 32-bit ring")
        return bundle_index(self.boundaries, h)

    def find_bundle_by_hash(self, h: int) -> BundleRange:
        i = self.find_index(h)
        return BundleRange(self.namespace, self.boundaries[i], self.boundaries[i + 1])

    def find_bundle(self, topic: str) -> BundleRange:
        """The bundle serving ``topic``; the topic must belong to this namespace."""
        if topic_namespace(topic) != self.namespace:
            raise InvalidBundle("topic", f"{topic!r} is not in namespace {self.namespace}")
        return self.find_bundle_by_hash(topic_hash(topic))

    def index_of(self, bundle: BundleRange | str) -> int:
        """Index of an exact bundle of this namespace, or raise ``InvalidBundle``."""
        r = parse_bundle(bundle) if isinstance(bundle, str) else bundle
        if r.namespace != self.namespace:
            raise InvalidBundle("bundle", f"{r.name} is not in namespace {self.namespace}")
        i = bisect.bisect_left(self.boundaries, r.lower)
        if i >= len(self.boundaries) - 1 or self.boundaries[i] != r.lower:
            raise InvalidBundle("bundle", f"{r.name} is not a current bundle of {self.namespace}")
        if self.boundaries[i + 1] != r.upper:
            raise InvalidBundle("bundle", f"{r.name} is not a current bundle of {self.namespace}")
        return i

    def contains(self, bundle: BundleRange | str) -> bool:
        try:
            self.index_of(bundle)
        except InvalidBundle:
            return False
        return True

    def split(self, bundle: BundleRange | str, split_points: Iterable[int]) -> NamespaceBundles:
        """Insert ``split_points`` (strictly inside the bundle) and bump the version."""
        i = self.index_of(bundle)
        lower, upper = self.boundaries[i], self.boundaries[i + 1]
        points = sorted(set(split_points))
        if not points:
            raise InvalidBundle("boundaries", "a split needs at least one boundary")
        for p in points:
            if not lower < p < upper:
                raise InvalidBundle(
                    "boundaries",
                    f"0x{p:08x} is not strictly inside {format_range(lower, upper)}",
                )
        new = (*self.boundaries[: i + 1], *points, *self.boundaries[i + 1 :])
        return NamespaceBundles(self.namespace, new, self.version + 1)

    def merge(self, first: BundleRange | str, second: BundleRange | str) -> NamespaceBundles:
        """Merge two adjacent bundles into one and bump the version (not a Pulsar operation)."""
        i, j = sorted((self.index_of(first), self.index_of(second)))
        if j != i + 1:
            raise InvalidBundle("bundle", "only adjacent bundles can be merged")
        new = (*self.boundaries[: i + 1], *self.boundaries[j + 1 :])
        return NamespaceBundles(self.namespace, new, self.version + 1)

    def children_of_split(
        self, bundle: BundleRange | str, split_points: Iterable[int]
    ) -> list[str]:
        """Names of the bundles a split would produce, in ring order."""
        r = parse_bundle(bundle) if isinstance(bundle, str) else bundle
        pts = [r.lower, *sorted(set(split_points)), r.upper]
        return [BundleRange(r.namespace, a, b).name for a, b in itertools.pairwise(pts)]
