"""A transfer's bundle counted on its destination by lookups, until the destination reports it.

Why: a transfer moves a bundle's lease at once, but the destination's load report lists the
bundle only at its next report. Lookups in between (the children of a split left free, the
bundles of a broker that left) read the reports and the preallocations, so they see the
destination as it was before the transfer: the broker our shedder has just filled to the band
looks idle, and the lookups fill it again. Paced live runs of ``hot_bundle`` showed it: the
children of the hot bundle were placed on the broker five transfers had just filled, which
then sat above the band for 25 cycles while those bundles were in their grace period.

A lookup already counts its own placements as preallocations (Pulsar's
``preallocatedBundleData``) until the new owner reports them. A transfer decided by our shedder
carries the bundle's averages in its inputs (``preallocation_inputs``), and the controller that
applies it records them as a preallocation of the destination (``preallocation_of``), which
ends as every preallocation does: once the destination reports the bundle or no longer holds
its lease. The fast model records the same entry when it applies the transfer.

Pulsar's shedders put no averages in their decisions, so their transfers are applied as Pulsar
applies them: nothing is preallocated (a deviation of our pair only). Our shedder's own
projection is unchanged: it counts the transfer as a move in flight, and skips a preallocated
bundle that is in flight (``UsageModel.project_preallocated``), so nothing counts twice.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from loadbalance.decisions import TRANSFER, Decision, Scalar
from loadbalance.time_average import NUM_LONG_SAMPLES, NUM_SHORT_SAMPLES, BundleData
from loadbalance.time_average import TimeAverageMessageData as Avg

__all__ = ["PREALLOCATION_KEYS", "preallocation_inputs", "preallocation_of"]

_FIELDS = ("msg_rate_in", "msg_rate_out", "msg_throughput_in", "msg_throughput_out")
_TERMS = (("shortTerm", "short_term"), ("longTerm", "long_term"))


def _key(term: str, name: str) -> str:
    head, *rest = name.split("_")
    return "prealloc" + term[0].upper() + term[1:] + head.title() + "".join(p.title() for p in rest)


PREALLOCATION_KEYS: tuple[str, ...] = (
    *(_key(term, f) for term, _ in _TERMS for f in (*_FIELDS, "num_samples")),
    "preallocTopics",
)
"""The input keys a transfer carries its bundle's averages under (``preallocShortTermMsgRateIn``
and so on, then ``preallocTopics``)."""


def preallocation_inputs(data: BundleData) -> dict[str, Scalar]:
    """The bundle's averages as decision inputs, exactly (no rounding: the fast model and the
    controller must record the same figures)."""
    out: dict[str, Scalar] = {}
    for term, attr in _TERMS:
        avg = getattr(data, attr)
        for f in _FIELDS:
            out[_key(term, f)] = float(getattr(avg, f))
        out[_key(term, "num_samples")] = int(avg.num_samples)
    out["preallocTopics"] = int(data.topics)
    return out


def preallocation_of(d: Decision) -> BundleData | None:
    """The averages a transfer carries for its destination's preallocation; None for another
    kind, a transfer without them (Pulsar's shedders), or figures that are not finite
    non-negative numbers (a hostile or damaged decision records nothing)."""
    if d.kind != TRANSFER or not d.destination_broker:
        return None
    inputs = d.inputs
    if "preallocTopics" not in inputs:
        return None
    terms = []
    for term, _ in _TERMS:
        figures = [_number(inputs, _key(term, f)) for f in _FIELDS]
        samples = _number(inputs, _key(term, "num_samples"))
        if samples is None or any(v is None for v in figures):
            return None
        max_samples = NUM_SHORT_SAMPLES if term == "shortTerm" else NUM_LONG_SAMPLES
        rate_in, rate_out, thr_in, thr_out = (float(v) for v in figures)  # type: ignore[arg-type]
        terms.append(
            Avg(max_samples, int(min(samples, max_samples)), thr_in, thr_out, rate_in, rate_out)
        )
    topics = _number(inputs, "preallocTopics")
    if topics is None:
        return None
    return BundleData(terms[0], terms[1], int(topics))


_LARGEST = 1e15
"""Above any real bundle's rate (msg/s), throughput (bytes/s) or topic count: a larger figure is
damage, and summed into a broker's pending load it could reach infinity."""


def _number(inputs: Mapping[str, Scalar], key: str) -> float | None:
    v = inputs.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) and 0 <= v <= _LARGEST else None
