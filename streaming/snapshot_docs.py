"""The per-bundle document of the load snapshot in Redis, written fast and read back exactly.

Layout (``P:load:bundles``, bundle -> JSON): ``{"shortTerm": {...}, "longTerm": {...},
"topics", "broker", "lastStats": {...}, "updatedAtMs"}``, where the averages carry
``msgThroughputIn``, ``msgThroughputOut``, ``msgRateIn``, ``msgRateOut`` and ``numSamples`` as
``loadbalance.snapshot`` and ``controller.placement`` read them. ``broker``, ``lastStats`` and
``updatedAtMs`` are ours: the last sample and who reported it, so a restarted job rebuilds each
broker's ``lastStats`` from Redis.

Why a template: a job with 100,000 bundles writes every one of them every report interval, and
building the text with ``%`` and ``repr`` floats (exact round trip) costs a fraction of
``json.dumps`` over nested dicts. The documents are built by the state step on the executors,
in parallel, so the driver only passes the strings to Redis.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

_AVG = '{"msgThroughputIn":%r,"msgThroughputOut":%r,"msgRateIn":%r,"msgRateOut":%r,"numSamples":%d}'
BUNDLE_DOC_TEMPLATE = (
    '{"shortTerm":' + _AVG + ',"longTerm":' + _AVG + ',"topics":%d,"broker":%s,'
    '"lastStats":{"msgThroughputIn":%r,"msgThroughputOut":%r,"msgRateIn":%r,"msgRateOut":%r,'
    '"topics":%d,"consumerCount":%d,"producerCount":%d},"updatedAtMs":%d}'
)


def bundle_docs(
    short: Sequence[Sequence[float]],
    short_n: Sequence[int],
    long: Sequence[Sequence[float]],
    long_n: Sequence[int],
    last: Sequence[Sequence[float]],
    counts: Sequence[Sequence[int]],
    owners: Iterable[str],
    event_ms: Sequence[int],
) -> list[str]:
    """Documents for rows of arrays; float columns in ``STAT_COLUMNS`` order (throughput
    in/out, rate in/out), counts as (topics, consumers, producers)."""
    quoted: dict[str, str] = {}
    out = []
    template = BUNDLE_DOC_TEMPLATE
    for s, sn, lg, ln, la, c, o, t in zip(
        short, short_n, long, long_n, last, counts, owners, event_ms, strict=True
    ):
        q = quoted.get(o)
        if q is None:
            q = quoted[o] = json.dumps(o)
        out.append(template % (*s, sn, *lg, ln, c[0], q, *la, *c, t))
    return out
