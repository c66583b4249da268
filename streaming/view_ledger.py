"""The driver's ledger of the load snapshot: every state shard's records and every broker's row
as the state step emitted them, and what changed since the job last wrote them to Redis.

It holds bytes and documents only (decoding is ``DecodedShards``' work), so a batch's ``apply``
costs what the batch brought to the driver. The broker documents are the snapshot's
(``metadata_store.load_snapshot.encode_broker_entry`` / ``decode_broker_entry``), so a ledger
rebuilt from Redis after a restart (``from_snapshot``) holds what the ledger before it held.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import pandas as pd

from loadbalance.view import UsageWeights
from metadata_store.load_snapshot import (
    decode_broker_entry,
    delta_key,
    encode_broker_entry,
    record_names,
    shard_bundle_count,
    split_field,
)
from streaming.decoded_shards import Records
from streaming.schema import BROKER, BROKER_GONE, SHARD, SHARD_DELTA
from streaming.shard_state import ShardState
from streaming.view_mappings import report_from_doc

log = logging.getLogger("streaming.view_ledger")

EMPTY_RECORD = bytes(ShardState().to_bytes())
"""The whole record of a shard without bundles (what a delta without its record applies to)."""

BrokerRow = tuple[dict[str, Any], float, float, int, float]
"""(report document, history usage, throughput EMA, event ms, weightedMaxEMA)."""

Changes = tuple[dict[str, str], set[str], dict[str, bytes], set[str]]
"""Broker documents written, brokers removed, shard fields written, shard fields removed."""


class ViewLedger:
    """Latest shard records and broker rows, and the snapshot fields changed since
    ``take_changes``."""

    def __init__(self) -> None:
        self._shards: dict[str, bytes] = {}  # state shard key -> its latest whole record
        # and the delta records after it: (k of its field ``s:<n>+<k>``, record), in order
        self._deltas: dict[str, tuple[tuple[int, bytes], ...]] = {}
        self._counts: dict[str, int] = {}  # bundles per shard
        self.brokers: dict[str, BrokerRow] = {}
        self._changed_brokers: dict[str, str] = {}  # snapshot documents to write
        self._removed_brokers: set[str] = set()
        self._changed_shards: dict[str, bytes] = {}
        self._removed_shards: set[str] = set()

    def __len__(self) -> int:
        """Bundles held (including any a split or merge removed that the state still keeps)."""
        return sum(self._counts.values())

    def records(self) -> Records:
        """shard -> (whole record, its deltas): what a view is built from, as of now."""
        return {
            key: (blob, tuple(r for _, r in self._deltas.get(key, ())))
            for key, blob in self._shards.items()
        }

    def apply(self, pdf: pd.DataFrame) -> None:
        """Apply one batch of state output rows (each key appears once per kind in a batch)."""
        kinds = pdf["kind"]
        self._apply_shards(pdf[kinds.isin((SHARD, SHARD_DELTA))])
        reported = self._apply_brokers(pdf[kinds == BROKER])
        for name in pdf.loc[kinds == BROKER_GONE, "name"].tolist():
            if name in self.brokers and name not in reported:
                self.brokers.pop(name)
                self._changed_brokers.pop(name, None)
                self._removed_brokers.add(name)

    def _apply_shards(self, shards: pd.DataFrame) -> None:
        for kind, name, payload, n in zip(
            shards["kind"].tolist(),
            shards["name"].tolist(),
            shards["payload"].tolist(),
            shards["bundles"].tolist(),
            strict=True,
        ):
            if kind == SHARD:
                record = bytes(payload)
                self._set_shard(name, record, shard_bundle_count(record))
            else:
                self._add_delta(name, bytes(payload), int(n))

    def _apply_brokers(self, rows: pd.DataFrame) -> set[str]:
        """The brokers' rows of a batch; returns the brokers that reported."""
        reported = set()
        for row in rows.itertuples(index=False):
            usage, ema, event_ms = row.history_usage, row.msg_throughput_ema, row.event_ms
            wmax = row.weighted_max_ema
            self.brokers[row.name] = (json.loads(row.doc), usage, ema, event_ms, wmax)
            self._changed_brokers[row.name] = encode_broker_entry(row.doc, usage, wmax, ema,
                                                                  event_ms)  # fmt: skip
            self._removed_brokers.discard(row.name)
            reported.add(row.name)
        return reported

    def _set_shard(self, key: str, blob: bytes, n: int) -> None:
        """A shard's whole record (its deltas are dropped, here and in the snapshot)."""
        for k, _ in self._deltas.pop(key, ()):
            field = delta_key(key, k)
            self._changed_shards.pop(field, None)
            self._removed_shards.add(field)
        if n:
            self._shards[key], self._counts[key], self._deltas[key] = blob, n, ()
            self._changed_shards[key] = blob
            self._removed_shards.discard(key)
        else:  # every bundle of the shard expired
            self._shards.pop(key, None)
            self._counts.pop(key, None)
            self._changed_shards.pop(key, None)
            self._removed_shards.add(key)

    def _add_delta(self, field: str, record: bytes, n: int) -> None:
        """A shard's next delta record (``field`` is ``s:<n>+<k>``)."""
        key, k = split_field(field)
        deltas = self._deltas.get(key, ())
        if key not in self._shards or k != (deltas[-1][0] if deltas else 0) + 1:
            # The state step stores what it emits and this ledger is committed with each batch,
            # so they disagree only when the snapshot in Redis was lost or changed behind the
            # job's back. The delta is applied to what is held (nothing, for a lost record):
            # the bundles of every broker that reports are back at once, the whole shard at
            # its next whole record (``shard_state.compaction_due``).
            log.warning(
                "delta record %s does not follow the records held for shard %s (the load "
                "snapshot was lost or changed); the shard is whole again at its next record",
                field,
                key,
            )
            self._shards.setdefault(key, EMPTY_RECORD)
        self._deltas[key] = (*deltas, (k, record))
        self._counts[key] = n
        self._changed_shards[field] = record
        self._removed_shards.discard(field)

    def take_changes(self) -> Changes:
        """Broker documents and shard records written, and fields removed, since the last call;
        resets them."""
        out = (
            self._changed_brokers,
            self._removed_brokers,
            self._changed_shards,
            self._removed_shards,
        )
        self._changed_brokers, self._removed_brokers = {}, set()
        self._changed_shards, self._removed_shards = {}, set()
        return out

    @classmethod
    def from_snapshot(
        cls,
        brokers: Mapping[str, str | bytes],
        shards: Mapping[str, bytes],
        weights: UsageWeights | None = None,
    ) -> ViewLedger:
        """The ledger of the snapshot the job wrote (broker documents, shard records).

        ``weights``: the configured resource weights, for a broker document without
        ``weightedMaxEma`` (written before the job kept it), which starts from its report's
        weighted max usage with every signal, as ``snapshot_from_document`` reads it."""
        ledger = cls()
        ledger._load_shards(shards)
        weights = weights or UsageWeights()
        for name, raw in brokers.items():
            entry = decode_broker_entry(raw)
            wmax = entry.weighted_max_ema
            if wmax is None:
                wmax = weights.weighted_max_uncapped(report_from_doc(entry.report, name, {}))
            ledger.brokers[name] = (
                entry.report,
                entry.history_usage,
                entry.msg_throughput_ema,
                entry.updated_at_ms,
                float(wmax),
            )
        return ledger

    def _load_shards(self, shards: Mapping[str, bytes]) -> None:
        by_shard: dict[str, dict[int, bytes]] = {}
        for name, raw in shards.items():
            key, k = split_field(name)
            by_shard.setdefault(key, {})[k] = bytes(raw)
        for key, records in sorted(by_shard.items()):
            # deltas without their record apply to an empty one, as ``merged_shards`` reads them
            base = records.get(0, EMPTY_RECORD)
            names = dict.fromkeys(record_names(base))
            deltas = tuple((k, records[k]) for k in sorted(records) if k)
            for _, delta in deltas:
                names.update(dict.fromkeys(record_names(delta)))
            if names:
                self._shards[key], self._deltas[key] = base, deltas
                self._counts[key] = len(names)
