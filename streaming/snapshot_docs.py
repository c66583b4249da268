"""The per-bundle half of the load snapshot in Redis: one binary blob per state shard.

Layout: hash ``P:load:shards``, field = the state step's shard key (``s:<n>``), value = that
shard's whole ``streaming.shard_state.ShardState`` blob as the state step holds it after the
batch (every bundle's short- and long-term averages, last sample, last reporter, last-seen event
time). The broker half stays JSON in ``P:load:brokers`` (``streaming.driver_view``).

Why blobs and not one JSON document per bundle: with 100,000 bundles reported every 5 s, one
document per bundle means 20,000 documents a second to format (12 floats each, ``repr`` for
exact round trips), carry as Spark rows to the driver and send to Redis, which would be the
largest share of a micro-batch (docs/benchmarks.md, streaming job). A shard blob is the state
step's own bytes: no formatting, 32 Redis fields instead of 100,000, written in the same
``MULTI`` as the batch id, so a restarted job still starts from exactly the view the last batch
left.

Readers that want documents (``controller.placement``, ``controller.recovery``, tests, an
operator's script) call ``read_bundle_docs``: the same fields the JSON documents had
(``shortTerm``/``longTerm`` with ``msgThroughputIn``, ``msgThroughputOut``, ``msgRateIn``,
``msgRateOut``, ``numSamples``; ``topics``; ``broker``; ``lastStats``; ``updatedAtMs``), floats
bit for bit. A bundle a split or merge removed stays in its blob until the state step expires
it (``loadBalancerBrokerLoadDataTTLInSeconds`` without samples); the decision stage filters
such bundles out against the namespaces in Redis, and recovery takes the narrowest claims first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# The report's NamespaceBundleStats field names; TimeAverageMessageData uses the same four.
from loadbalance.report_columns import COUNT_FIELDS, VALUE_FIELDS
from metadata_store.load_snapshot import LoadSnapshot
from streaming.shard_state import ShardState, shard_of

DEFAULT_DOC_SHARDS = 32


def shard_docs(state: ShardState) -> dict[str, dict[str, Any]]:
    """Every bundle of one shard as a snapshot document."""
    short, long_, last = state.short_avg.tolist(), state.long_avg.tolist(), state.last_values
    out: dict[str, dict[str, Any]] = {}
    for name, owner, s, sn, lg, ln, la, c, t in zip(
        state.names,
        state.owners,
        short,
        state.short_n.tolist(),
        long_,
        state.long_n.tolist(),
        last.tolist(),
        state.last_counts.tolist(),
        state.last_seen_ms.tolist(),
        strict=True,
    ):
        out[name] = {
            "shortTerm": {**dict(zip(VALUE_FIELDS, s, strict=True)), "numSamples": sn},
            "longTerm": {**dict(zip(VALUE_FIELDS, lg, strict=True)), "numSamples": ln},
            "topics": c[0],
            "broker": owner,
            "lastStats": {**dict(zip(VALUE_FIELDS, la, strict=True)), **dict(zip(COUNT_FIELDS, c))},
            "updatedAtMs": t,
        }
    return out


def docs_from_blobs(blobs: Iterable[bytes]) -> dict[str, dict[str, Any]]:
    """Documents of every bundle in ``blobs``. A bundle found in two blobs (the job was
    restarted with another shard count) keeps the one seen last in event time."""
    out: dict[str, dict[str, Any]] = {}
    for raw in blobs:
        for name, doc in shard_docs(ShardState.from_bytes(bytes(raw))).items():
            prev = out.get(name)
            if prev is None or doc["updatedAtMs"] >= prev["updatedAtMs"]:
                out[name] = doc
    return out


def read_bundle_docs(snapshot: LoadSnapshot) -> dict[str, dict[str, Any]]:
    """bundle -> document, from the snapshot in Redis."""
    return docs_from_blobs(snapshot.shard_blobs().values())


def blobs_from_docs(
    docs: Mapping[str, Mapping[str, Any]], n_shards: int = DEFAULT_DOC_SHARDS
) -> dict[str, bytes]:
    """Shard blobs holding ``docs`` (the inverse of ``docs_from_blobs``), for tools and tests
    that write a snapshot themselves. Missing fields take the values a fresh bundle has."""
    # pandas (through streaming.schema): the controller reads snapshots with this module and
    # must not load it
    from streaming.schema import SHARD_PREFIX

    by_shard: dict[int, list[str]] = {}
    for name in docs:
        by_shard.setdefault(shard_of(name, n_shards), []).append(name)
    out: dict[str, bytes] = {}
    for shard, names in sorted(by_shard.items()):
        state = ShardState()
        idx = state.index_of(names)
        for i, name in zip(idx.tolist(), names, strict=True):
            doc = docs[name]
            short, long_ = doc.get("shortTerm") or {}, doc.get("longTerm") or {}
            last = doc.get("lastStats") or {}
            for arr, num, d in ((state.short_avg, state.short_n, short),
                                (state.long_avg, state.long_n, long_)):  # fmt: skip
                arr[i] = [float(d.get(k, arr[i, j])) for j, k in enumerate(VALUE_FIELDS)]
                num[i] = int(d.get("numSamples", 0))
            state.last_values[i] = [float(last.get(k, 0.0)) for k in VALUE_FIELDS]
            state.last_counts[i] = [
                int(last.get("topics", doc.get("topics", 0))),
                int(last.get("consumerCount", 0)),
                int(last.get("producerCount", 0)),
            ]
            state.owners[i] = str(doc.get("broker") or "")
            state.last_seen_ms[i] = int(doc.get("updatedAtMs", 0))
        out[f"{SHARD_PREFIX}{shard}"] = state.to_bytes()
    return out
