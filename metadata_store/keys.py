"""Every Redis key family of the system, in one table, and the one place their names are built.

All keys live under one prefix ``P`` (``redisKeyPrefix``, default ``lb``), so one Redis can hold
several clusters side by side. Each family has one owner, a repository of this package; nothing
outside ``metadata_store`` builds a key (``tests/unit/test_keyspace_ownership.py`` checks).

=======================  ======  =======================================  ====================
key                      type    fields / format                          repository
=======================  ======  =======================================  ====================
``P:namespaces``         set     namespace names                          ``RedisStore``
``P:ns:<tenant/ns>``     hash    ``boundaries`` (comma-separated          ``RedisStore``,
                                 ``0x%08x``), ``version``                 ``RecoveryState``
``P:lease:<bundle>``     hash    ``broker``, ``token``, ``expires`` (ms), ``RedisStore``
                                 ``notbefore`` (ms; absent: 0)
``P:owned:<broker>``     set     bundles the broker holds leases on       ``RedisStore``
``P:fence``              string  fencing-token counter, only grows        ``RedisStore``,
                                                                          ``RecoveryState``
``P:handover:<ns>``      hash    handover fences of a namespace: the old  ``RedisStore``
                                 holder's token -> ``lower,upper,expires,
                                 broker`` (decimal bounds, store ms);
                                 pruned once ``expires`` has passed
``P:broker:<id>``        hash    ``heartbeat``, ``expires`` (ms),         ``RedisStore``
                                 ``info`` (JSON)
``P:brokers``            set     registered broker ids                    ``RedisStore``
``P:epoch``              string  id of this dataset (hex), set with the   ``RedisStore``,
                                 first namespace; absent: data lost       ``RecoveryState``
``P:outcomes``           hash    decision id (or ``record:<t>/<p>/<o>``)  ``OutcomeLog``
                                 -> JSON ``{outcome, reason, kind,
                                 bundle, atMs}``
``P:outcome-stream``     stream  ``id outcome reason kind bundle atMs     ``OutcomeLog``
                                 decisionReason source destination``
                                 (+ ``race``); capped near 100,000
``P:event-outbox``       hash    decision id -> JSON ``{bundle: [broker,  ``EventOutbox``
                                 token, expiresMs] | null}``
``P:sweep-outbox``       hash    ``<bundle>|<token>`` -> JSON ``[broker,   ``SweepOutbox``
                                 token, expiresMs, sweptAtMs]``: each
                                 lease the sweep removed, until its
                                 bundle is placed again or gone
``P:prealloc:<broker>``  hash    bundle -> JSON ``{shortTerm, longTerm,   ``Preallocations``
                                 topics}``
``P:placement:version``  string  placements recorded (``INCR`` by every   ``Preallocations``,
                                 lease a placement takes); absent: 0      ``RedisStore``
``P:recovery:last``      string  JSON ``RecoveryReport`` (last rebuild)   ``RecoveryState``
``P:recovery-log``       stream  ``report`` (JSON); capped near 1,000     ``RecoveryState``
``P:load:version``       string  load snapshot format version (``1``;    ``LoadSnapshot``
                                 absent reads as 1)
``P:load:brokers``       hash    broker -> JSON ``{report, historyUsage,  ``LoadSnapshot``
                                 msgThroughputEma, updatedAtMs}``
``P:load:shards``        hash    bundle shard ``s:<n>`` -> bundle-shard   ``LoadSnapshot``
                                 record (``LBS1``, binary columns)
``P:stream:progress``    hash    ``batch``, ``now_ms``, ``cycle_state``   ``RedisProgress``
                                 (versioned JSON ``CycleState``),
                                 ``cycle_pending`` (0/1), ``wall_ms``
                                 (the job's wall clock at the commit)
``P:stream:pending``     hash    ``batch``, ``namespaces`` (JSON          ``RedisProgress``
                                 ``{ns: [boundary, ...]}``)
``P:decider``            hash    ``holder`` (``host:pid:random``),        ``DeciderLease``
                                 ``host``, ``pid``, ``term``, ``expires``,
                                 ``acquiredAtMs``, ``renewedAtMs``,
                                 ``lastBatch``, ``lastBatchAtMs`` (ms)
``P:decider:term``       string  decider term counter, only grows         ``DeciderLease``
``P:decider:seen``       string  newest decider term a controller         ``DeciderLease``
                                 accepted a decision of
``P:processes``          hash    ``<role>/<host:pid>`` -> JSON            ``ProcessRegistry``
                                 ``{role, id, startedAtMs, beatAtMs,
                                 lastPollMs, lastSweepMs, ...}``
``P:policies``           hash    ``version`` (raised by every write),     ``PlacementPoliciesStore``
                                 ``cluster`` (name the first cluster-
                                 scoped write gave), ``doc`` (JSON in
                                 Pulsar's admin shapes:
                                 ``namespaceIsolationPolicies``,
                                 ``localPolicies``, ``failureDomains``)
=======================  ======  =======================================  ====================

Repositories: ``RedisStore`` (``ownership_redis``, the ``OwnershipStore`` of
``protocol``), ``OutcomeLog`` (``outcomes``), ``EventOutbox`` (``outbox``),
``SweepOutbox`` (``sweep_outbox``), ``Preallocations`` (``placement_state``),
``RecoveryState`` (``recovery_state``),
``PlacementPoliciesStore`` (``placement_policies``, isolation policies, anti-affinity groups
and failure domains), ``DeciderLease`` (``decider_lease``, the one-decider lease and its
term), ``LoadSnapshot`` (``load_snapshot``, written by the streaming job through
``RedisProgress.commit``), ``RedisProgress`` (``progress``, the cycle state's JSON in
``cycle_state``). The load snapshot is a published format (``docs/snapshot-format.md``), its
layout and its one reader in ``load_snapshot``.

The ownership Lua scripts name two families from inside Redis, where a key cannot be passed in
advance: ``P:owned:<broker>`` (the holder read from a lease) and ``P:broker:<id>`` (the live
check of every registered broker). They build them from the prefix exactly as ``owned`` and
``broker`` below do.
"""

from __future__ import annotations

__all__ = ["Keys"]


class Keys:
    """The names of every key family under one prefix; one method per family (table above)."""

    __slots__ = ("prefix",)

    def __init__(self, prefix: str = "lb") -> None:
        self.prefix = prefix

    def __repr__(self) -> str:
        return f"Keys({self.prefix!r})"

    def _k(self, name: str) -> str:
        return f"{self.prefix}:{name}"

    # -- ownership ---------------------------------------------------------------------------
    def namespaces(self) -> str:
        return self._k("namespaces")

    def ns(self, namespace: str) -> str:
        return self._k(f"ns:{namespace}")

    def ns_prefix(self) -> str:
        """What every ``ns`` key starts with (client-side-caching prefixes, scans)."""
        return self._k("ns:")

    def lease(self, bundle: str) -> str:
        """``bundle`` must be the canonical name (``metadata_store.leases.canonical_bundle``)."""
        return self._k(f"lease:{bundle}")

    def lease_prefix(self) -> str:
        """What every ``lease`` key starts with (the expiry sweep's scan, cache invalidation)."""
        return self._k("lease:")

    def owned(self, broker: str) -> str:
        return self._k(f"owned:{broker}")

    def fence(self) -> str:
        return self._k("fence")

    def handover(self, namespace: str) -> str:
        """The handover fences of ``namespace`` (``metadata_store.ownership_redis``)."""
        return self._k(f"handover:{namespace}")

    def broker(self, broker: str) -> str:
        return self._k(f"broker:{broker}")

    def brokers(self) -> str:
        return self._k("brokers")

    def epoch(self) -> str:
        return self._k("epoch")

    # -- controller --------------------------------------------------------------------------
    def outcomes(self) -> str:
        return self._k("outcomes")

    def outcome_stream(self) -> str:
        return self._k("outcome-stream")

    def event_outbox(self) -> str:
        return self._k("event-outbox")

    def sweep_outbox(self) -> str:
        """The leases the expiry sweep removed, until announced and placed again."""
        return self._k("sweep-outbox")

    def prealloc(self, broker: str) -> str:
        return self._k(f"prealloc:{broker}")

    def placement_version(self) -> str:
        return self._k("placement:version")

    def recovery_last(self) -> str:
        return self._k("recovery:last")

    def recovery_log(self) -> str:
        return self._k("recovery-log")

    # -- streaming job -----------------------------------------------------------------------
    def load_version(self) -> str:
        return self._k("load:version")

    def load_brokers(self) -> str:
        return self._k("load:brokers")

    def load_shards(self) -> str:
        return self._k("load:shards")

    def stream_progress(self) -> str:
        return self._k("stream:progress")

    def stream_pending(self) -> str:
        return self._k("stream:pending")

    # -- decider lease -----------------------------------------------------------------------
    def decider(self) -> str:
        return self._k("decider")

    def decider_term(self) -> str:
        return self._k("decider:term")

    def decider_seen(self) -> str:
        return self._k("decider:seen")

    # -- process registry -------------------------------------------------------------------
    def processes(self) -> str:
        return self._k("processes")

    # -- placement policies ------------------------------------------------------------------
    def policies(self) -> str:
        return self._k("policies")
