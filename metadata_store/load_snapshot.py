"""The load snapshot: the published, versioned format in which the streaming job leaves the
averaged cluster in Redis, and the one reader that turns it into the core's ``ClusterView``.

Written by the streaming job (with its progress, ``metadata_store.progress``); read by
placement, recovery, the command line (``broker load-report``, ``broker-stats load-report``,
``monitor``) and anyone's script. The format is documented in ``docs/snapshot-format.md``
("Load snapshot in Redis"); in short, under the key prefix ``P``:

* ``P:load:version``: the format version (``2``); absent on a snapshot that predates it, which
  reads as 1. Version 1 is version 2 without delta records, so this reader reads both; it
  refuses any other version instead of guessing.
* ``P:load:brokers``: broker -> JSON, exactly the ``brokers`` entry of the snapshot that
  ``lbctl decide`` reads (``{"report", "historyUsage", "msgThroughputEma", "updatedAtMs"}``;
  the report without ``lastStats``, which the bundle records hold).
* ``P:load:shards``: bundle shard (``s:<n>``) -> one **bundle-shard record**, the columns of
  every bundle of that shard in little-endian binary (layout below and in the doc); and
  ``s:<n>+<k>`` (k = 1, 2, ...) -> the shard's **delta records**: records of the bundles the
  k-th batch after the base record changed. A delta's rows replace the rows of the same names,
  and its new names are appended, in k order (``BundleShard.merge_all``, ``merged_shards``).

Why deltas: with a million bundles a batch's reports change about a sixth of every shard, and
rewriting every whole record in every batch was the largest cost the job paid per batch. The
job appends the changed rows instead and writes a whole record again (dropping the shard's
deltas) once the deltas hold about as many rows as the record, or when bundles expired.

Why binary columns and not one JSON document per bundle: the job writes a record for every
shard in every micro-batch (a batch's reports touch all of them). Formatting 100,000 bundles as the
``bundleData`` documents of ``lbctl decide`` costs about 150 times what packing the columns
does, and columnar JSON still about 30 times (``docs/benchmarks.md``, streaming job), which
would more than double a batch. So the bundle half is published as columns, and this module,
not the job, owns their layout: the streaming job's shard state is encoded and decoded here
(``encode_bundle_shard``, ``decode_bundle_shard``), and readers get documents
(``LoadSnapshotData.bundle_docs``) or a ``ClusterView`` (``LoadSnapshotData.snapshot``),
never bytes.

Bundle-shard record, version 1 (all integers little-endian)::

    magic  b"LBS1"                     4 bytes
    n      u32   bundles in the record
    nl     u32   bytes of the names block
    ol     u32   bytes of the owners block
    names  nl bytes  UTF-8 bundle names joined by "\\n"
    owners ol bytes  UTF-8 last reporting broker per bundle, joined by "\\n"
    short_n     i64[n]      short-term numSamples
    short_avg   f64[n, 4]   short-term msgThroughputIn, msgThroughputOut, msgRateIn, msgRateOut
    long_n      i64[n]      long-term numSamples
    long_avg    f64[n, 4]   long-term, same columns
    last_values f64[n, 4]   the last sample, same columns
    last_counts i64[n, 3]   the last sample's topics, consumerCount, producerCount
    last_seen   i64[n]      event time (epoch ms) of the last sample
"""

from __future__ import annotations

import copy
import json
import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import chain
from typing import Any

import numpy as np

from loadbalance.errors import InvalidInput
from loadbalance.report_columns import COUNT_FIELDS, VALUE_FIELDS
from loadbalance.snapshot import Snapshot, snapshot_from_document
from loadbalance.time_average import DEFAULT_MESSAGE_RATE, DEFAULT_MESSAGE_THROUGHPUT
from loadbalance.view import UsageWeights
from metadata_store.keys import Keys

__all__ = [
    "LOAD_SNAPSHOT_VERSION",
    "BrokerEntry",
    "BundleShard",
    "LoadSnapshot",
    "LoadSnapshotData",
    "decode_broker_doc",
    "decode_broker_docs",
    "decode_broker_entry",
    "decode_bundle_shard",
    "delta_key",
    "encode_broker_entry",
    "encode_bundle_shard",
    "merged_shards",
    "record_names",
    "shard_bundle_count",
    "shard_key",
    "shards_from_docs",
    "split_field",
]

LOAD_SNAPSHOT_VERSION = 2
_KNOWN_VERSIONS = ("1", "2")  # 1: the same layout without delta records
_DELTA_SEP = "+"
"""The version of the stored format this module writes and the only one it reads."""

_SHARD_MAGIC = b"LBS1"
_HEAD = struct.Struct("<4sIII")
_SEP = "\n"  # bundle names and broker ids are printable: a newline never occurs in them
DEFAULT_DOC_SHARDS = 32
_FRESH = np.array([DEFAULT_MESSAGE_THROUGHPUT] * 2 + [DEFAULT_MESSAGE_RATE] * 2)
"""A bundle without samples: Pulsar's defaults, in the record's column order."""


def shard_key(shard: int) -> str:
    """The ``P:load:shards`` field of bundle shard ``shard``."""
    return f"s:{shard}"


def delta_key(base: str, k: int) -> str:
    """The ``P:load:shards`` field of the ``k``-th (from 1) delta record of shard field ``base``."""
    return f"{base}{_DELTA_SEP}{k}"


def split_field(name: str) -> tuple[str, int]:
    """A ``P:load:shards`` field as (its shard's base field, k); k is 0 for the base record."""
    base, sep, k = name.rpartition(_DELTA_SEP)
    if not sep or not k.isdigit() or int(k) < 1:
        return name, 0
    return base, int(k)


def encode_broker_entry(
    report_json: str,
    history_usage: float,
    weighted_max_ema: float,
    msg_throughput_ema: float,
    updated_at_ms: int,
) -> str:
    """A ``P:load:brokers`` document: the report's JSON text as the state step passed it (no
    parse and re-serialise of thousands of bundle names), floats with ``repr`` so that
    ``decode_broker_entry`` reads them back bit for bit."""
    return (
        f'{{"report":{report_json},"historyUsage":{history_usage!r},'
        f'"weightedMaxEma":{weighted_max_ema!r},"msgThroughputEma":{msg_throughput_ema!r},'
        f'"updatedAtMs":{updated_at_ms}}}'
    )


@dataclass(frozen=True, slots=True)
class BrokerEntry:
    """One ``P:load:brokers`` document, decoded (``decode_broker_entry``)."""

    report: dict[str, Any]  # the report document without lastStats
    history_usage: float
    msg_throughput_ema: float
    updated_at_ms: int
    weighted_max_ema: float | None  # None in a document written before the job kept it


def decode_broker_doc(raw: bytes | str) -> Any:
    """A ``P:load:brokers`` document parsed, for readers that show or pick fields (a JSON
    object when the job wrote it; ``ValueError`` when it is not JSON)."""
    return json.loads(raw)


def decode_broker_docs(
    raw: Mapping[str, bytes | str], *, skip_unreadable: bool = False
) -> dict[str, Any]:
    """broker -> its document (``decode_broker_doc``); with ``skip_unreadable`` a document
    that is not a JSON object is left out instead of raising or returned (display commands)."""
    if not skip_unreadable:
        return {name: decode_broker_doc(value) for name, value in raw.items()}
    out: dict[str, Any] = {}
    for name, value in raw.items():
        try:
            doc = decode_broker_doc(value)
        except ValueError:
            continue
        if isinstance(doc, dict):
            out[name] = doc
    return out


def decode_broker_entry(raw: bytes | str) -> BrokerEntry:
    """The document ``encode_broker_entry`` wrote, its numbers as it wrote them."""
    doc = decode_broker_doc(raw)
    wmax = doc.get("weightedMaxEma")
    return BrokerEntry(
        doc["report"],
        float(doc["historyUsage"]),
        float(doc["msgThroughputEma"]),
        int(doc["updatedAtMs"]),
        None if wmax is None else float(wmax),
    )


@dataclass
class BundleShard:
    """The columns of one bundle-shard record (see the module docstring for their meaning)."""

    names: list[str] = field(default_factory=list)
    owners: list[str] = field(default_factory=list)
    short_n: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    short_avg: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)))
    long_n: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    long_avg: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)))
    last_values: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)))
    last_counts: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), dtype=np.int64))
    last_seen_ms: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def __post_init__(self) -> None:
        # name -> row, built when first needed: most records decoded (a reader's, a delta
        # being applied) are never looked up by name
        self._index: dict[str, int] | None = None

    def _rows_by_name(self) -> dict[str, int]:
        if self._index is None:
            self._index = dict(zip(self.names, range(len(self.names))))  # C loop: 2x a dictcomp
        return self._index

    def __len__(self) -> int:
        return len(self.names)

    def index_of(self, names: list[str]) -> np.ndarray:
        """Rows of ``names``, appending the bundles not held with a fresh bundle's values
        (Pulsar's default averages, no samples), in the order first named."""
        index = self._rows_by_name()
        fresh = [n for n in dict.fromkeys(names) if n not in index]
        if fresh:
            self._grow(fresh)
        return np.fromiter((index[n] for n in names), dtype=np.int64, count=len(names))

    def _grow(self, fresh: list[str]) -> None:
        k = len(fresh)
        for n in fresh:
            self._rows_by_name()[n] = len(self.names)
            self.names.append(n)
        self.owners.extend([""] * k)
        self.short_n = np.concatenate([self.short_n, np.zeros(k, dtype=np.int64)])
        self.long_n = np.concatenate([self.long_n, np.zeros(k, dtype=np.int64)])
        defaults = np.tile(_FRESH, (k, 1))
        self.short_avg = np.concatenate([self.short_avg, defaults])
        self.long_avg = np.concatenate([self.long_avg, defaults.copy()])
        self.last_values = np.concatenate([self.last_values, np.zeros((k, 4))])
        self.last_counts = np.concatenate([self.last_counts, np.zeros((k, 3), dtype=np.int64)])
        self.last_seen_ms = np.concatenate([self.last_seen_ms, np.zeros(k, dtype=np.int64)])

    def merge(self, delta: BundleShard) -> np.ndarray:
        """Apply a delta record in place: the rows of names in ``delta`` take its values, names
        not held are appended in ``delta``'s order; return the rows written.

        That is the order the streaming job's state step grows a shard in (a bundle is appended
        when first seen, and a delta lists the changed rows in row order), so a base record with
        its deltas applied is the state step's shard row for row."""
        return self.merge_all([delta])[0]

    def merge_all(self, deltas: Sequence[BundleShard]) -> list[np.ndarray]:
        """``merge`` each of ``deltas`` in order, in one pass; the rows each one wrote.

        Why one pass: a reader catching up applies dozens of deltas to a shard (a million
        bundles' shards take a delta every batch), and looking names up and writing owners one
        row at a time in Python was most of that work. Here the names of all the deltas are
        looked up in one C loop, and each row written once, with the values of the last delta
        that names it (as applying them one after another leaves it; within one record, the
        last entry of a name wins too)."""
        if not deltas:
            return []
        index = self._rows_by_name()
        names = list(chain.from_iterable(d.names for d in deltas))
        got = list(map(index.get, names))
        if None in got:  # bundles not held: appended in the order first named
            self._grow([n for n in dict.fromkeys(names) if n not in index])
            got = list(map(index.get, names))
        rows = np.array(got, dtype=np.int64)
        if len(rows):
            # each row's last position in ``rows`` (maximum.at is defined for repeated rows)
            last = np.full(len(self.names), -1, dtype=np.int64)
            np.maximum.at(last, rows, np.arange(len(rows), dtype=np.int64))
            written = np.flatnonzero(last >= 0)
            source = last[written]
            for col in _COLUMNS:
                column = getattr(self, col)
                column[written] = np.concatenate([getattr(d, col) for d in deltas])[source]
            new_owners = list(chain.from_iterable(d.owners for d in deltas))
            if 4 * len(written) < len(self.owners):  # a few rows: not worth two whole copies
                owners = self.owners
                for row, at in zip(written.tolist(), source.tolist(), strict=True):
                    owners[row] = new_owners[at]
            else:
                every = np.array(self.owners, dtype=object)
                every[written] = np.array(new_owners, dtype=object)[source]
                self.owners[:] = every.tolist()
        ends = np.cumsum([len(d.names) for d in deltas])[:-1]
        return np.split(rows, ends)

    def rows(self, rows: np.ndarray) -> BundleShard:
        """A record of ``rows`` alone (in the order given): a delta record."""
        keep = rows.tolist()
        out = BundleShard(
            names=[self.names[i] for i in keep], owners=[self.owners[i] for i in keep]
        )
        for col in _COLUMNS:
            setattr(out, col, getattr(self, col)[rows])
        return out

    def copy(self) -> BundleShard:
        """An independent copy (arrays and lists copied)."""
        out = copy.copy(self)
        out.names, out.owners = list(self.names), list(self.owners)
        out._index = None if self._index is None else dict(self._index)
        for col in _COLUMNS:
            setattr(out, col, getattr(self, col).copy())
        return out


_COLUMNS = ("short_n", "short_avg", "long_n", "long_avg", "last_values", "last_counts",
            "last_seen_ms")  # fmt: skip


def _join(names: list[str]) -> bytes:
    return _SEP.join(names).encode()


def _split(raw: bytes) -> list[str]:
    return raw.decode().split(_SEP) if raw else []


def encode_bundle_shard(s: BundleShard) -> bytes:
    """One bundle-shard record."""
    names, owners = _join(s.names), _join(s.owners)
    arrays = (
        s.short_n.astype("<i8"),
        s.short_avg.astype("<f8"),
        s.long_n.astype("<i8"),
        s.long_avg.astype("<f8"),
        s.last_values.astype("<f8"),
        s.last_counts.astype("<i8"),
        s.last_seen_ms.astype("<i8"),
    )
    head = _HEAD.pack(_SHARD_MAGIC, len(s.names), len(names), len(owners))
    return b"".join([head, names, owners, *(np.ascontiguousarray(a).tobytes() for a in arrays)])


def record_names(raw: bytes) -> list[str]:
    """The bundle names of a record, without decoding its columns."""
    _magic, n, names_len, _owners_len = _HEAD.unpack_from(raw)
    return _split(raw[_HEAD.size : _HEAD.size + names_len]) if n else []


def shard_bundle_count(raw: bytes) -> int:
    """Bundles in a record, from its header, without decoding it."""
    return struct.unpack_from("<I", raw, 4)[0] if raw else 0


def decode_bundle_shard(raw: bytes) -> BundleShard:
    """The columns of a record; ``InvalidInput`` if it is not a version-1 record or is cut."""
    if len(raw) < _HEAD.size:
        raise InvalidInput("load snapshot", "a bundle-shard record shorter than its header")
    magic, n, names_len, owners_len = _HEAD.unpack_from(raw)
    if magic != _SHARD_MAGIC:
        raise InvalidInput(
            "load snapshot", f"not a version-1 bundle-shard record (magic {magic!r})"
        )
    pos = _HEAD.size
    need = pos + names_len + owners_len + n * 8 * 18  # 18 eight-byte columns
    if len(raw) != need:
        raise InvalidInput(
            "load snapshot", f"a bundle-shard record of {len(raw)} bytes, expected {need}"
        )
    names = _split(raw[pos : pos + names_len])
    pos += names_len
    owners = _split(raw[pos : pos + owners_len]) if n else []
    pos += owners_len
    if len(owners) < n:  # every owner empty and joined to nothing
        owners = [""] * n
    if len(names) != n or len(owners) != n:
        raise InvalidInput("load snapshot", f"a bundle-shard record of {n} bundles names others")

    def take(dtype: str, width: int) -> np.ndarray:
        nonlocal pos
        count = n * width
        arr = np.frombuffer(raw, dtype=dtype, count=count, offset=pos).copy()
        pos += count * 8
        return arr.reshape(n, width) if width > 1 else arr

    return BundleShard(
        names=names,
        owners=owners,
        short_n=take("<i8", 1),
        short_avg=take("<f8", 4),
        long_n=take("<i8", 1),
        long_avg=take("<f8", 4),
        last_values=take("<f8", 4),
        last_counts=take("<i8", 3),
        last_seen_ms=take("<i8", 1),
    )


def merged_shards(fields: Mapping[str, bytes]) -> dict[str, BundleShard]:
    """``P:load:shards`` as one record per shard: each base record with its deltas applied in
    k order (a delta without a base applies to an empty record)."""
    groups: dict[str, list[tuple[int, bytes]]] = {}
    for name, raw in fields.items():
        base, k = split_field(name)
        groups.setdefault(base, []).append((k, bytes(raw)))
    out: dict[str, BundleShard] = {}
    for base, parts in sorted(groups.items()):
        parts.sort(key=lambda p: p[0])
        shard = decode_bundle_shard(parts[0][1]) if parts[0][0] == 0 else BundleShard()
        shard.merge_all([decode_bundle_shard(raw) for k, raw in parts if k])
        out[base] = shard
    return out


# The record's float columns are ``TimeAverageMessageData.update_values`` order, which is the
# order of the report's field names in ``VALUE_FIELDS``.
_COLUMN_KEYS = VALUE_FIELDS


def _averages_doc(values: list[float], n: int) -> dict[str, Any]:
    return {**dict(zip(_COLUMN_KEYS, values, strict=True)), "numSamples": n}


def shard_docs(s: BundleShard, *, full: bool = True) -> dict[str, dict[str, Any]]:
    """Every bundle of a record as a document: the ``bundleData`` entry of ``lbctl decide``
    (``shortTerm``, ``longTerm``, ``topics``), and with ``full`` also ``broker`` (the last
    reporter), ``lastStats`` (its last sample, the report's field names) and ``updatedAtMs``."""
    out: dict[str, dict[str, Any]] = {}
    rows = zip(
        s.names,
        s.owners,
        s.short_avg.tolist(),
        s.short_n.tolist(),
        s.long_avg.tolist(),
        s.long_n.tolist(),
        s.last_values.tolist(),
        s.last_counts.tolist(),
        s.last_seen_ms.tolist(),
        strict=True,
    )
    for name, owner, sa, sn, la, ln, lv, c, t in rows:
        doc: dict[str, Any] = {
            "shortTerm": _averages_doc(sa, sn),
            "longTerm": _averages_doc(la, ln),
            "topics": c[0],
        }
        if full:
            doc["broker"] = owner
            doc["lastStats"] = {
                **dict(zip(_COLUMN_KEYS, lv, strict=True)),
                **dict(zip(COUNT_FIELDS, c, strict=True)),
            }
            doc["updatedAtMs"] = t
        out[name] = doc
    return out


def shards_from_docs(
    docs: Mapping[str, Mapping[str, Any]], n_shards: int = DEFAULT_DOC_SHARDS
) -> dict[str, bytes]:
    """Records holding ``docs`` (documents as ``shard_docs`` gives them), for tools and tests
    that write a snapshot themselves. Missing fields take the values a fresh bundle has."""
    by_shard: dict[int, list[str]] = {}
    for name in docs:
        by_shard.setdefault(zlib.crc32(name.encode()) % n_shards, []).append(name)
    out: dict[str, bytes] = {}
    for shard, names in sorted(by_shard.items()):
        n = len(names)
        s = BundleShard(
            names=list(names),
            owners=[""] * n,
            short_n=np.zeros(n, dtype=np.int64),
            short_avg=np.tile(_FRESH, (n, 1)),
            long_n=np.zeros(n, dtype=np.int64),
            long_avg=np.tile(_FRESH, (n, 1)),
            last_values=np.zeros((n, 4)),
            last_counts=np.zeros((n, 3), dtype=np.int64),
            last_seen_ms=np.zeros(n, dtype=np.int64),
        )
        for i, name in enumerate(names):
            doc = docs[name]
            for arr, num, d in ((s.short_avg, s.short_n, doc.get("shortTerm") or {}),
                                (s.long_avg, s.long_n, doc.get("longTerm") or {})):  # fmt: skip
                arr[i] = [float(d.get(k, arr[i, j])) for j, k in enumerate(_COLUMN_KEYS)]
                num[i] = int(d.get("numSamples", 0))
            last = doc.get("lastStats") or {}
            s.last_values[i] = [float(last.get(k, 0.0)) for k in _COLUMN_KEYS]
            s.last_counts[i] = [
                int(last.get("topics", doc.get("topics", 0))),
                int(last.get("consumerCount", 0)),
                int(last.get("producerCount", 0)),
            ]
            s.owners[i] = str(doc.get("broker") or "")
            s.last_seen_ms[i] = int(doc.get("updatedAtMs", 0))
        out[shard_key(shard)] = encode_bundle_shard(s)
    return out


@dataclass(frozen=True)
class LoadSnapshotData:
    """One consistent read of the snapshot: broker documents and bundle-shard records."""

    brokers_raw: Mapping[str, bytes]
    shards: Mapping[str, bytes]  # the ``P:load:shards`` fields: base and delta records

    @cached_property
    def records(self) -> dict[str, BundleShard]:
        """shard -> its record with its deltas applied (``merged_shards``)."""
        return merged_shards(self.shards)

    @cached_property
    def brokers(self) -> dict[str, dict[str, Any]]:
        """broker -> its document, parsed."""
        return decode_broker_docs(self.brokers_raw)

    def bundle_docs(self, *, full: bool = True) -> dict[str, dict[str, Any]]:
        """bundle -> document (``shard_docs``). A bundle found in two records (the job ran
        with another shard count before) keeps the one with the newest ``updatedAtMs``."""
        out: dict[str, dict[str, Any]] = {}
        seen: dict[str, int] = {}
        for s in self.records.values():
            docs = shard_docs(s, full=full)
            for name, t in zip(s.names, s.last_seen_ms.tolist(), strict=True):
                if name not in seen or t >= seen[name]:
                    seen[name] = t
                    out[name] = docs[name]
        return out

    def owners(self) -> dict[str, str]:
        """bundle -> the broker that last reported it (same rule as ``bundle_docs``)."""
        out: dict[str, str] = {}
        seen: dict[str, int] = {}
        for s in self.records.values():
            for name, owner, t in zip(s.names, s.owners, s.last_seen_ms.tolist(), strict=True):
                if name not in seen or t >= seen[name]:
                    seen[name], out[name] = t, owner
        return out

    def snapshot(
        self,
        now_ms: int | None = None,
        weights: UsageWeights | None = None,
        *,
        brokers: Iterable[str] | None = None,
    ) -> Snapshot | None:
        """The snapshot as the core's ``Snapshot`` (its ``view`` a ``ClusterView``), through
        the parser of ``lbctl decide`` (``loadbalance.snapshot.snapshot_from_document``) with
        its every rule; ``brokers`` keeps only those (placement keeps the live ones). None when
        no broker is left."""
        keep = set(self.brokers) if brokers is None else set(brokers) & set(self.brokers)
        if not keep:
            return None
        doc: dict[str, Any] = {
            "brokers": {b: self.brokers[b] for b in sorted(keep)},
            "bundleData": self.bundle_docs(full=False),
        }
        if now_ms is not None:
            doc["nowMs"] = now_ms
        return snapshot_from_document(doc, {}, weights)


class LoadSnapshot:
    """Reads and replaces the load snapshot under one key prefix."""

    def __init__(self, client: Any, prefix: str = "lb") -> None:
        self._r = client
        self._keys = Keys(prefix)

    def read(self) -> LoadSnapshotData:
        """The whole snapshot in one transaction (never half of one batch's commit); an
        unknown version is refused."""
        pipe = self._r.pipeline(transaction=True)
        pipe.get(self._keys.load_version())
        pipe.hgetall(self._keys.load_brokers())
        pipe.hgetall(self._keys.load_shards())
        version, brokers, shards = pipe.execute()
        _check_version(version)
        return LoadSnapshotData(
            {k.decode(): v for k, v in brokers.items()}, {k.decode(): v for k, v in shards.items()}
        )

    def version(self) -> int:
        """The stored format version (1 when absent)."""
        raw = self._r.get(self._keys.load_version())
        return _check_version(raw)

    def broker_docs_raw(self) -> dict[str, bytes]:
        """broker -> its stored JSON document, unparsed."""
        _check_version(self._r.get(self._keys.load_version()))
        return {k.decode(): v for k, v in self._r.hgetall(self._keys.load_brokers()).items()}

    def replace(self, brokers: Mapping[str, str], shards: Mapping[str, bytes]) -> None:
        """Replace the whole snapshot, atomically: broker -> JSON text, shard -> record."""
        pipe = self._r.pipeline(transaction=True)
        pipe.delete(self._keys.load_brokers(), self._keys.load_shards())
        if brokers:
            pipe.hset(self._keys.load_brokers(), mapping=dict(brokers))
        if shards:
            pipe.hset(self._keys.load_shards(), mapping=dict(shards))
        pipe.set(self._keys.load_version(), LOAD_SNAPSHOT_VERSION)
        pipe.execute()

    def stage_changes(
        self,
        pipe: Any,
        brokers: Mapping[str, str],
        removed_brokers: Iterable[str],
        shards: Mapping[str, bytes],
        removed_shards: Iterable[str],
    ) -> None:
        """Queue a batch's changes on ``pipe`` (a transaction the caller executes, so they land
        with the job's progress; ``metadata_store.progress``). ``shards`` and
        ``removed_shards`` are ``P:load:shards`` fields: base and delta records."""
        bkey, skey = self._keys.load_brokers(), self._keys.load_shards()
        gone = list(removed_brokers)
        if gone:
            pipe.hdel(bkey, *gone)
        if brokers:
            pipe.hset(bkey, mapping=dict(brokers))
        gone = list(removed_shards)
        if gone:
            pipe.hdel(skey, *gone)
        if shards:
            pipe.hset(skey, mapping=dict(shards))
        pipe.set(self._keys.load_version(), LOAD_SNAPSHOT_VERSION)


def _check_version(raw: bytes | str | None) -> int:
    if raw is None:
        return 1
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    if text not in _KNOWN_VERSIONS:
        raise InvalidInput(
            "load snapshot",
            f"stored format version {text!r}; this reader knows only "
            f"{' and '.join(_KNOWN_VERSIONS)}",
        )
    return int(text)
