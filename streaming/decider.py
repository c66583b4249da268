"""The decision stage's hold on the decider lease: one streaming job decides at a time.

Pulsar elects one leader broker to run the load manager; here the streaming job that holds
the decider lease (``metadata_store.decider_lease``) is the one that decides. The decision stage
asks ``Decider.hold`` once per batch, before it reads or writes anything: a job that holds the
lease (renewed, or taken because it was free or expired) runs the batch and stamps every
decision it publishes with the lease's term and its own id; a job that does not publishes
nothing and writes nothing to Redis for that batch (the holder's load snapshot and progress
are not its to overwrite), keeps asking every batch, and takes over when the lease is free or
expired. A job that takes the lease re-seeds its view from Redis first (the other decider may
have committed batches meanwhile).

Every change of role is said once: one log line (taken, with the term; lost or held by
another, with the holder and when its lease expires) and the ``lbctl_stream_decider_term`` gauge
(the term held, 0 while following). A policy cycle renews once more right before it publishes
(``confirm``), so a job paused between its batch's renewal and the publish longer than the TTL
publishes nothing either.

Without Redis (tests, benchmarks of the stage alone) there is no lease: the stage decides, and
decisions carry no term.
"""

from __future__ import annotations

import logging
from typing import Any

from infra import metrics
from infra.redis_client import connect
from loadbalance.config import LoadBalancerConfig
from loadbalance.decisions import Decision, encode_decision
from metadata_store.decider_lease import DeciderLease, Hold, decider_id

log = logging.getLogger("streaming.decide")

__all__ = ["Decider"]


class Decider:
    """The lease as the decision stage holds it: ``hold`` per batch, ``confirm`` before a
    cycle publishes, ``encode`` to stamp a decision with the term held."""

    def __init__(
        self,
        config: LoadBalancerConfig,
        redis_url: str | None,
        holder: str | None = None,
        *,
        lease: DeciderLease | None = None,
    ) -> None:
        self.ttl_ms = int(config.load_balancer_decider_lease_ttl_ms)
        self.holder = holder or decider_id()
        self._lease = lease
        if lease is None and redis_url:
            client = connect(redis_url, config, purpose="decider")
            self._lease = DeciderLease(client, config.redis_key_prefix)
        self.term: int | None = None  # the term held; None while another job holds the lease
        self._following: bool | None = None  # the role last said (None: nothing said yet)

    @property
    def leased(self) -> bool:
        """Whether a lease is in force at all (not without Redis)."""
        return self._lease is not None

    @property
    def deciding(self) -> bool:
        """Whether this job decides now: it holds the lease, or there is none."""
        return self._lease is None or self.term is not None

    def hold(self, batch_id: int) -> tuple[bool, bool]:
        """Renew or take the lease for ``batch_id``: (decide this batch, re-seed first: the
        lease was just taken, so another decider may have written Redis since this job read
        it)."""
        if self._lease is None:
            return True, False
        got = self._lease.hold(self.holder, self.ttl_ms, term=self.term, batch=batch_id)
        if got.held:
            taken = self.term != got.term
            if taken:
                log.warning(
                    "decider lease taken: term %d, holder %s, batch %d", got.term, self.holder,
                    batch_id,
                )  # fmt: skip
            self._role(got.term)
            return True, taken
        self._lost(got, batch_id)
        return False, False

    def confirm(self, batch_id: int) -> bool:
        """Renew right before a cycle publishes: whether the term held is still this job's."""
        if self._lease is None:
            return True
        got = self._lease.hold(self.holder, self.ttl_ms, term=self.term, batch=batch_id)
        if got.held and got.term == self.term:
            return True
        if got.held:  # taken again under a new term: the cycle was computed under the old one
            self.term = None
        self._lost(got, batch_id)
        return False

    def encode(self, d: Decision) -> bytes:
        """``d`` on the wire, stamped with the term held and this job's id (plain without a
        lease)."""
        if self._lease is None or self.term is None:
            return encode_decision(d)
        return encode_decision(d, term=self.term, decider=self.holder)

    def release(self) -> bool:
        """Give the lease up (a clean stop), so another job need not wait for it to expire."""
        if self._lease is None or self.term is None:
            return False
        done = self._lease.release(self.holder, self.term)
        self._role(None)
        return done

    def _lost(self, got: Hold, batch_id: int) -> None:
        if self._following is not True:
            who = got.holder or "this job under an older term"
            log.warning(
                "decider lease held by %s (term %d, expires in %d ms): batch %d and the next "
                "ones decide and publish nothing until the lease is free",
                who, got.term, max(0, got.expires_ms - got.at_ms), batch_id,
            )  # fmt: skip
        self._role(None)

    def _role(self, term: int | None) -> None:
        self.term = term
        self._following = term is None
        _safely(metrics.STREAM_DECIDER_TERM.set, term or 0)


def _safely(fn: Any, *args: Any) -> None:
    """A metrics bug must never fail (and so replay) a batch."""
    try:
        fn(*args)
    except Exception:
        log.warning("metrics update failed", exc_info=True)
