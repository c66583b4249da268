"""The decision stage's copy of the averaged cluster view, kept on the driver between batches.

Why a separate copy: the policies need the whole cluster at once, while the state step only
emits what a batch touched. So the driver keeps every state shard as the state step stored it
(its latest whole record and the delta records after it) and the latest row of every broker,
and builds a ``ClusterView`` from them for ``cycle.step``. It is also what the job writes to
Redis as the load snapshot (only the records and brokers a batch changed), and what a restarted
job reads back from there, so the view after a restart is the view before it.

The snapshot is the published load-snapshot format (``metadata_store.load_snapshot``,
``docs/snapshot-format.md``): ``P:load:shards`` bundle shard ``s:<n>`` -> its whole record and
``s:<n>+<k>`` -> its k-th delta record, as the state step emitted them; ``P:load:brokers`` broker ->
``{"report": <LocalBrokerData JSON without lastStats>, "historyUsage", "weightedMaxEma",
"msgThroughputEma", "updatedAtMs"}``, the ``brokers`` entry of ``lbctl decide``'s snapshot,
floats written with ``repr`` and so read back bit for bit.

Why the driver keeps this copy rather than reading the snapshot back from Redis for each cycle:
the copy is what lets a cycle decode only the shards that changed since the last one (or since
the background warm-up) and keep the values it made for unchanged bundles, and it costs no more
than the bytes the batch already brought to the driver; a full read and decode per cycle would
cost more than a batch (``docs/benchmarks.md``, streaming job).

How it is split (each part owns its caches, so a test makes a ``DriverView`` and throws it away):

* ``ViewLedger`` (``streaming.view_ledger``): the records and broker rows as emitted, and the
  snapshot fields changed since the job last wrote them (``take_changes``), encoded and decoded
  by ``metadata_store.load_snapshot`` (``encode_broker_entry``, ``decode_broker_entry``);
* ``DecodedShards`` (``streaming.decoded_shards``): the records decoded into arrays, only what
  changed since the last decode, the warm-up thread that decodes ahead of a cycle and the lock
  both decode under; its ``generation`` numbers the bundle index and only increases;
* ``ViewAssembler`` (``streaming.view_assembler``): each cycle's ``ClusterView`` through lazy
  mappings (``streaming.view_mappings``) over the arrays laid end to end
  (``streaming.view_columns``); what it keeps between cycles is dropped by generation;
* ``GcPause`` (``streaming.gc_pause``): the collector's pause and freeze counts of this view.

The policy cycle's place and order (``streaming.decide.DecisionStage``): one cycle runs per due
batch, on the batch's own thread, through one method (``_complete_cycle``), exactly once
per commit that says ``cycle_pending``:

1. the batch's rows are collected (Spark runs the plan; the view is not touched); a job that
   does not hold the decider lease (``streaming.decider``) goes no further, and a cycle
   publishes only once it has confirmed the lease is still its own;
2. a stage without a view seeds it from Redis; if the progress it reads says ``cycle_pending``
   (the process stopped, or the cycle failed, after that batch's commit) the cycle runs now,
   over the view just read, which is the view committed with that batch;
3. a batch whose id is at most the last committed one is skipped;
4. the batch is applied to the view (``apply``, ``warm`` waited for first), and the view's
   changes (``take_changes``), the progress and ``cycle_pending`` commit in one transaction;
5. when that commit says ``cycle_pending``, the cycle runs: ``wait_warm``, ``cluster_view``,
   ``cycle.step``, publish, ``commit_cycle`` (``cycle_pending`` off); else a warm-up starts
   when a cycle is due within a few batches.

So no cycle ever overlaps a batch's apply or commit, a completed cycle is never run again (its
commit cleared ``cycle_pending``), and an interrupted one is run again by step 2 over the same
view and namespaces, with the same ids.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from contextlib import AbstractContextManager

import pandas as pd

from loadbalance.bundles import NamespaceBundles
from loadbalance.view import ClusterView, UsageWeights
from streaming.decoded_shards import DecodedShards
from streaming.gc_pause import GcPause
from streaming.view_assembler import ViewAssembler
from streaming.view_ledger import Changes, ViewLedger
from streaming.view_mappings import report_from_doc

__all__ = ["DriverView", "report_from_doc"]


class DriverView:
    """Latest shard records and broker rows, decoded and assembled per cycle; see the module
    docstring."""

    def __init__(self, ledger: ViewLedger | None = None) -> None:
        self.gc = GcPause()
        self.ledger = ledger if ledger is not None else ViewLedger()
        self.shards = DecodedShards(self.gc)
        self.assembler = ViewAssembler(self.shards)

    @property
    def broker_names(self) -> list[str]:
        return sorted(self.ledger.brokers)

    def __len__(self) -> int:
        """Bundles held (including any a split or merge removed that the state still keeps)."""
        return len(self.ledger)

    def gc_paused(self) -> AbstractContextManager[None]:
        """No cyclic garbage collection inside (``GcPause``); for the cycle around its view."""
        return self.gc.paused()

    def apply(self, pdf: pd.DataFrame) -> None:
        """Apply one batch of state output rows (each key appears once per kind in a batch)."""
        self.ledger.apply(pdf)

    def take_changes(self) -> Changes:
        """Broker documents and shard records written, and fields removed, since the last call;
        resets them."""
        return self.ledger.take_changes()

    def cluster_view(
        self,
        namespaces: Mapping[str, NamespaceBundles],
        live: Collection[str] | None = None,
    ) -> ClusterView:
        """The view for one policy cycle; with ``live``, only those brokers (the registry's).

        Why ``live``: the job learns that a broker stopped reporting only when its report
        timeout passes, a cycle or more after a graceful leave ended its registration. Pulsar's
        leader considers only the brokers its registry lists, and so does the fast model; a
        cycle that still counted a departed broker planned transfers to it that the controller
        then refused, while the grace period held the bundles it had meant to move.

        Bundles a namespace's current boundaries no longer contain (split or merged away, kept
        by the state step until they expire) are left out. Every broker's ``lastStats`` is
        rebuilt from the bundles it reports and was the last to report, so the view is a
        function of the records and broker rows alone, and a view rebuilt from Redis after a
        restart is the same."""
        self.wait_warm()
        self.shards.decode(self.ledger.records())
        return self.assembler.cluster_view(self.ledger.brokers, namespaces, live)

    def warm(self) -> None:
        """Decode the current records in a background thread, so that the next policy cycle
        decodes only the shards that change in between (the decision stage calls this when a
        cycle is due within the next batches). The view a cycle sees does not depend on it."""
        self.shards.warm(self.ledger.records(), after=self._sum_ahead)

    def _sum_ahead(self) -> None:
        with self.gc.paused():
            self.assembler.sum_ahead()

    def wait_warm(self) -> None:
        """Wait for a warm-up still running."""
        self.shards.wait_warm()

    @classmethod
    def from_snapshot(
        cls,
        brokers: Mapping[str, str | bytes],
        shards: Mapping[str, bytes],
        weights: UsageWeights | None = None,
    ) -> DriverView:
        """Rebuild the view from the snapshot the job wrote (broker documents, shard records);
        ``weights`` as ``ViewLedger.from_snapshot`` reads them."""
        return cls(ViewLedger.from_snapshot(brokers, shards, weights))
