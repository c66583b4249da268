"""The closed vocabularies of the system as string enums: decision kinds, outcomes, reasons.

Why enums that are strings: every one of these values crosses a wire (the decisions topic, the
outcome records in the metadata store, metric labels, ``lbctl`` output), where it must stay the
plain word it has always been, while code that makes or compares them should not be able to
misspell one. A member of a ``StrEnum`` *is* that word: ``DecisionKind.SPLIT == "split"``, it
hashes like ``"split"`` (so either works as a dict key), and ``json.dumps``, f-strings, ``str()``
and ``format()`` all give ``split``. ``enum.StrEnum`` arrived in Python 3.11; the small base class
here behaves the same and runs on 3.10.

Reason names are Pulsar's where Pulsar has one (``UnloadDecision.Reason``, the split and unload
breakdown metrics' labels); the rest name what the policy saw in the same style.
"""

from __future__ import annotations

from enum import Enum


class StrEnum(str, Enum):
    """A ``str`` whose text is its value in every rendering (``enum.StrEnum`` of Python 3.11).

    Overriding ``__str__`` is enough: ``Enum.__format__`` formats ``str(self)`` once it is
    overridden, and ``json`` and ``str.join`` read the string data itself."""

    def __str__(self) -> str:
        return str.__str__(self)

    @classmethod
    def values(cls) -> tuple[str, ...]:
        """The members' texts in definition order, as plain strings."""
        return tuple(m.value for m in cls)


class DecisionKind(StrEnum):
    """What a decision asks the controller to do with a bundle."""

    SPLIT = "split"
    UNLOAD = "unload"
    TRANSFER = "transfer"
    MERGE = "merge"


class OutcomeKind(StrEnum):
    """How the controller's application of one decision ended (the outcome log's ``outcome``)."""

    APPLIED = "applied"
    ALREADY_SATISFIED = "already_satisfied"
    CONFLICT = "conflict"
    REJECTED = "rejected"
    DUPLICATE = "duplicate"
    DRY_RUN = "dry_run"


class DecisionReason(StrEnum):
    """Why a policy asked for a decision (a decision's ``reason``)."""

    OVERLOADED = "Overloaded"
    UNDERLOADED = "Underloaded"
    TOPICS = "Topics"
    SESSIONS = "Sessions"
    MSG_RATE = "MsgRate"
    BANDWIDTH = "Bandwidth"
    ADMIN = "Admin"
    COLD = "Cold"
    UNKNOWN = "Unknown"
    """The metrics' label for a decision that carries no reason (as Pulsar's ``Unknown``)."""


class SkipReason(StrEnum):
    """Why a policy looked and chose not to act (a ``Skip``'s ``reason``)."""

    DISABLED = "Disabled"
    NO_BROKERS = "NoBrokers"
    NO_BUNDLES = "NoBundles"
    NO_LOAD_DATA = "NoLoadData"
    BALANCED = "Balanced"
    HIT_COUNT = "HitCount"
    COOL_DOWN = "CoolDown"
    OUT_DATED_DATA = "OutDatedData"
    HIGH_USAGE_SINGLE_BUNDLE = "HighUsageSingleBundle"
    BELOW_MIN_UNLOAD = "BelowMinUnload"
    BELOW_MIN_THROUGHPUT = "BelowMinThroughput"
    INVALID_BUNDLE = "InvalidBundle"
    UNKNOWN_BUNDLE = "UnknownBundle"
    CANNOT_SPLIT = "CannotSplit"
    MAX_SPLITS_PER_CYCLE = "MaxSplitsPerCycle"
    NAMESPACE_MAXIMUM_BUNDLES = "NamespaceMaximumBundles"
    NO_BOUNDARY = "NoBoundary"
    HYSTERESIS = "Hysteresis"
    MAX_MERGES_PER_CYCLE = "MaxMergesPerCycle"
    NAMESPACE_MINIMUM_BUNDLES = "NamespaceMinimumBundles"
    NAMESPACE_POLICIES = "NamespacePolicies"
    """``shouldNamespacePoliciesUnload`` refused: no other broker its isolation policy allows."""
    ANTI_AFFINITY = "AntiAffinity"
    """``shouldAntiAffinityNamespaceUnload`` refused: moving it cannot spread its group."""
    NO_MOVE_HELPS = "NoMoveHelps"
    """Ours (ProjectedUsageShedder): a broker above the band from which every move would take
    its destination above the band."""


__all__ = ["DecisionKind", "DecisionReason", "OutcomeKind", "SkipReason", "StrEnum"]
