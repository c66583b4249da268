"""Moves decided but not yet visible in the reports: recorded, retired, counted by the cycle.

Why the cycle keeps them: a transfer is applied by the controller within a second or two, but
the cycle sees it only through load reports, and a broker publishes a report when one of its
figures moved by more than ``loadBalancerReportUpdateThresholdPercentage`` or when its last one
is ``loadBalancerReportUpdateMaxIntervalMinutes`` old (Pulsar's ``needBrokerDataUpdate``). One
bundle more on a broker with fifty rarely moves a figure by 10 %, so the destination's report
that shows the bundle may come minutes later. A cycle that read the reports alone would see the
source still hot and the destination still idle and move the same load again. So every move a
cycle decides enters the cycle state's **in-flight** set, the cycle hands it to the strategies
with the view (``ClusterView.in_flight``), and a strategy that projects usage counts each move
where the reports do not show it yet (``UsageModel``): taken off the source while the source's
report still lists the bundle, added to the destination while the destination's does not.

A move is **retired** when the reports show both sides (the source no longer lists the bundle,
the destination lists it; a side whose broker has left counts as shown), or when it is older than
``loadBalancerInFlightMoveTimeoutSeconds``: every live broker reports at least every
``loadBalancerReportUpdateMaxIntervalMinutes``, so a move still not shown after that never
happened (the controller refused it as stale) or was overtaken (the bundle was split, or a lookup
placed it elsewhere after an unload). An unload has no destination: only its source side counts.

A **split** whose children are left free (``loadBalancerAutoUnloadSplitBundlesEnabled``, the
default) takes the parent's load off its owner as an unload does: the children are placed by
their next lookups (and counted there as preallocations). So it is recorded as an unload of the
parent, until the owner's report no longer lists it. Without this, a cycle a report interval
after the split saw the parent still hot on its owner and shed the owner's other bundles for
load that had already left (paced runs of ``hot_bundle``: 20 moves against the model's 6).
With the children kept by the owner the load stays, and nothing is recorded.

The live job persists the cycle state between batches (``metadata_store.cycle_state``), so it
carries the set from one batch to the next; the fast model applies moves before the next
reports, so there every move retires at the next cycle.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from loadbalance.decisions import SPLIT, TRANSFER, UNLOAD, Decision
from loadbalance.view import ClusterView, InFlightMove

__all__ = ["destination_shows", "record_moves", "retire_moves", "source_shows"]


def source_shows(view: ClusterView, bundle: str, move: InFlightMove) -> bool:
    """Whether the source's report still lists the bundle (the move is not visible there)."""
    src = view.brokers.get(move.source)
    return src is not None and bundle in src.report.bundles


def destination_shows(view: ClusterView, bundle: str, move: InFlightMove) -> bool | None:
    """Whether the destination's report lists the bundle; ``None`` when there is no
    destination to judge (an unload, or a destination that left)."""
    if move.destination is None:
        return None
    dst = view.brokers.get(move.destination)
    return None if dst is None else bundle in dst.report.bundles


def retire_moves(
    in_flight: Mapping[str, InFlightMove], view: ClusterView, *, now_ms: int, max_age_ms: int
) -> Mapping[str, InFlightMove]:
    """The moves the reports in ``view`` do not show in full yet and younger than
    ``max_age_ms``."""
    kept: dict[str, InFlightMove] = {}
    for bundle, m in in_flight.items():
        if now_ms - m.at_ms > max_age_ms:
            continue
        if source_shows(view, bundle, m) or destination_shows(view, bundle, m) is False:
            kept[bundle] = m
    return MappingProxyType(kept)


def record_moves(
    in_flight: Mapping[str, InFlightMove],
    decisions: Iterable[Decision],
    view: ClusterView,
    now_ms: int,
    *,
    splits_leave: bool = False,
) -> Mapping[str, InFlightMove]:
    """``in_flight`` with every unload and transfer of ``decisions`` added, each with the
    bundle's rates in its source's report (a bundle the source does not report is skipped:
    there is nothing to project); with ``splits_leave`` (split children left free), every
    split too, as an unload of its parent."""
    out = dict(in_flight)
    kinds = (TRANSFER, UNLOAD, SPLIT) if splits_leave else (TRANSFER, UNLOAD)
    for d in decisions:
        if d.kind not in kinds or not d.source_broker:
            continue
        src = view.brokers.get(d.source_broker)
        stats = None if src is None else src.report.last_stats.get(d.bundle)
        if stats is None:
            continue
        dest = d.destination_broker if d.kind == TRANSFER else None
        out[d.bundle] = InFlightMove(
            d.source_broker,
            dest,
            now_ms,
            stats.msg_rate,
            stats.msg_throughput_in,
            stats.msg_throughput_out,
        )
    return MappingProxyType(out)
