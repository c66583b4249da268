"""Bundle selection shared by OverloadShedder and ThresholdShedder.

Pulsar's loop (``OverloadShedder`` / ``ThresholdShedder.findBundlesForUnloading``): take the
broker's bundles with their **short-term** throughput, drop the ones unloaded within the grace
period, sort by throughput descending, and take bundles until the throughput marked for unload
reaches the target - always at least one, and never when the broker has a single bundle.

Deviation: Pulsar would take every bundle when the target exceeds the broker's whole
throughput; we always leave the broker at least one bundle (a broker's last bundle is never
shed), which Pulsar's ``>1 bundle`` rule intends.
"""

from __future__ import annotations

from collections.abc import Mapping

from loadbalance.view import BrokerView, ClusterView


def bundle_short_term_throughput(view: ClusterView, bundle: str) -> float:
    """``getShortTermData().totalMsgThroughput()`` of a bundle (defaults when unseen)."""
    return view.bundle(bundle).short_term.msg_throughput


def sheddable_bundles(
    view: ClusterView, broker: BrokerView, recently_unloaded: Mapping[str, int]
) -> list[tuple[str, float]]:
    """(bundle, short-term throughput) of bundles that may move, largest first, name second."""
    out = [
        (b, bundle_short_term_throughput(view, b))
        for b in broker.bundles
        if b not in recently_unloaded
    ]
    out.sort(key=lambda x: (-x[1], x[0]))
    return out


def select_until(
    candidates: list[tuple[str, float]], target_throughput: float, max_bundles: int
) -> list[tuple[str, float]]:
    """Take bundles in order until their throughput reaches the target (at least one)."""
    picked: list[tuple[str, float]] = []
    total = 0.0
    for bundle, thr in candidates:
        if len(picked) >= max_bundles:
            break
        if picked and total >= target_throughput:
            break
        picked.append((bundle, thr))
        total += thr
    return picked
