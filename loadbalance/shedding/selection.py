"""Bundle selection shared by the modular shedders (Overload, Threshold, UniformLoad).

OverloadShedder and ThresholdShedder pick bundles the same way once they know how much
throughput a broker must give up: rank the broker's bundles by their **short-term**
throughput (``BundleData``'s ``getShortTermData``, so a momentary spike does not decide
alone), drop those unloaded within the grace period, and walk from the largest down until the
marked throughput reaches the target, always marking at least one (UniformLoadShedder ranks
the same way, then applies its own rule). The helpers below do that over plain tuples, so that
a broker with thousands of bundles costs one loop and one sort - and only brokers that
actually shed pay even that.

Deviation (applies to every shedder that uses these helpers): Pulsar can mark *every* bundle of
a broker when the target exceeds its whole throughput; here a broker always keeps at least one
bundle, which is what Pulsar's "more than one bundle" precondition is after. A bundle reported
by two brokers at once (an ownership hand-over caught mid-way) is shed at most once per cycle.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from operator import itemgetter

from loadbalance.decisions import Decision, Scalar, unload_of
from loadbalance.shedding.system_namespaces import is_system_bundle
from loadbalance.time_average import BundleData
from loadbalance.view import BrokerView, ClusterView

MB = 1024 * 1024
"""Pulsar's ``MB`` constant: thresholds given in MB are multiplied by this to get bytes."""

_UNSEEN = BundleData.new()
UNSEEN_SHORT_TERM_THROUGHPUT_BYTES_PER_S = _UNSEEN.short_term.msg_throughput
UNSEEN_SHORT_TERM_MSG_RATE_PER_S = _UNSEEN.short_term.msg_rate


def sheddable_bundles(
    view: ClusterView,
    broker: BrokerView,
    taken: Collection[str] = (),
    *,
    by_msg_rate: bool = False,
) -> list[tuple[str, float]]:
    """(bundle, short-term metric) of the broker's bundles that may move now, largest first.

    The metric is the short-term throughput in bytes/s, or the short-term msg rate per second
    with ``by_msg_rate`` (UniformLoadShedder's msg-rate rule). Excludes bundles in
    ``view.recently_unloaded``, in ``taken`` (already chosen this cycle) and in system
    namespaces (heartbeat, SLA monitor: Pulsar never moves them). Ties go to the
    first bundle name so that a replay picks the same bundles. It runs over every bundle of a
    shedding broker (tens of thousands at a million bundles, the most of an OverloadShedder
    cycle there), so the averages are fetched in one C-level call (``itemgetter``; a bundle
    without averages sends it back to ``get`` one by one) and the loop makes no other call.
    A ``bundle_data`` that offers ``short_term_totals(names, by_msg_rate)`` (the short-term
    in + out sum of each name, ``None`` for a bundle without data, the same float additions)
    is asked for the sums instead, so a lazy view need not make a value per bundle; one that
    offers ``short_term_ranking`` (the streaming driver's view, which has each broker's bundles
    numbered already) is asked for the whole answer first, and may decline with ``None``.
    """
    recent = view.recently_unloaded
    data = view.bundle_data
    unseen = (
        UNSEEN_SHORT_TERM_MSG_RATE_PER_S
        if by_msg_rate
        else UNSEEN_SHORT_TERM_THROUGHPUT_BYTES_PER_S
    )
    ranking = getattr(data, "short_term_ranking", None)
    if ranking is not None:
        ranked = ranking(
            broker.broker, broker.bundles, recent, taken, is_system_bundle, by_msg_rate, unseen
        )
        if ranked is not None:
            return ranked
    names = [b for b in broker.bundles if not (b in recent or b in taken or is_system_bundle(b))]
    bulk = getattr(data, "short_term_totals", None)
    if bulk is not None:  # a view over columns (the streaming driver's): no values made
        totals = bulk(names, by_msg_rate)
        keyed = [(-unseen if t is None else -t, b) for b, t in zip(names, totals, strict=True)]
        keyed.sort()
        return [(b, -negative) for negative, b in keyed]
    try:
        found = itemgetter(*names)(data) if len(names) > 1 else tuple(data[b] for b in names)
    except KeyError:
        found = tuple(data.get(b) for b in names)
    keyed: list[tuple[float, str]] = []
    append = keyed.append
    for b, d in zip(names, found):
        if d is None:
            append((-unseen, b))
            continue
        s = d.short_term
        if by_msg_rate:
            append((-(s.msg_rate_in + s.msg_rate_out), b))
        else:
            append((-(s.msg_throughput_in + s.msg_throughput_out), b))
    keyed.sort()
    return [(b, -negative) for negative, b in keyed]


def select_until(
    candidates: list[tuple[str, float]], target: float, max_bundles: int
) -> list[tuple[str, float]]:
    """Take candidates in order until their sum reaches ``target``; at least one, at most
    ``max_bundles`` (Pulsar's ``trafficMarkedToOffload < min || !atLeastOneBundleSelected``)."""
    picked: list[tuple[str, float]] = []
    marked = 0.0
    for bundle, value in candidates:
        if len(picked) >= max_bundles or (picked and marked >= target):
            break
        picked.append((bundle, value))
        marked += value
    return picked


def max_bundles_to_shed(broker: BrokerView) -> int:
    """How many bundles a broker may give up in one cycle: all but its last one."""
    return max(len(broker.bundles) - 1, 0)


def unload_decisions(
    strategy: str,
    broker: BrokerView,
    picked: list[tuple[str, float]],
    *,
    reason: str,
    inputs: Mapping[str, Scalar],
    metric_name: str,
    cycle: str,
    now_ms: int,
) -> list[Decision]:
    """UNLOAD decisions (no destination: placement happens on lookup, as in Pulsar)."""
    return [
        unload_of(
            cycle=cycle,
            bundle=bundle,
            source_broker=broker.broker,
            reason=reason,
            strategy=strategy,
            inputs={**inputs, metric_name: value},
            decided_at_ms=now_ms,
        )
        for bundle, value in picked
    ]
