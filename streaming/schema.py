"""Row layouts between the stages of the streaming job, in one place.

Why one module: three stages (parse, state, decide) run in different processes (executors'
Python workers and the driver) and agree only through these column lists, so they are written
once. Both layouts are internal to the job; what leaves it is decisions and dead letters (JSON
on Kafka) and the averaged view in Redis.

**Parsed rows** (parse -> state), grouped by ``key``:

* ``s:<shard>`` / kind ``samples``: one report's bundle samples that fall into one shard, packed
  by ``streaming.shard_state.pack_samples``;
* ``b:<broker>`` / kind ``report``: the report's figures without ``lastStats`` (JSON) plus its
  weighted max usage twice (within the limit, ``usage``, and with every signal,
  ``weighted_max``) and total throughput, computed where the report was decoded;
* ``dead`` / kind ``dead``: a dead letter (JSON) for the decision stage to publish.

``event_ms`` is the Kafka record timestamp; ``(event_ms, partition, offset)`` orders samples.

**State output rows** (state -> decide), kinds ``shard``, ``shard_delta``, ``broker``,
``broker_gone`` and ``dead``: one row per shard that received samples, whose ``payload`` is
either the shard's whole ``ShardState`` record after the batch (kind ``shard``, ``name`` the
shard key ``s:<n>``) or the record of the bundles the batch changed (kind ``shard_delta``,
``name`` the delta's field ``s:<n>+<k>``), as the state step stored it; the decision stage keeps
them and writes them to Redis as they are (bundle-shard and delta records of
``metadata_store.load_snapshot``, whose field names these are); ``bundles`` is the shard's
bundle count after the batch. And one row per broker that reported or went away, whose ``doc``
is its last report without ``lastStats`` and ``history_usage``/``msg_throughput_ema``/
``weighted_max_ema`` its averages.
Why shard records and not one row per bundle: a row per bundle cost a formatted document, an
Arrow row and a dict update for each of 20,000 bundle samples a second (100,000 bundles
reported every 5 s); a record is bytes the state step has already made.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from loadbalance.values import StrEnum


class RowKind(StrEnum):
    """The ``kind`` column of the rows between the stages (plain strings in Arrow)."""

    SAMPLES = "samples"
    REPORT = "report"
    DEAD = "dead"
    SHARD = "shard"
    SHARD_DELTA = "shard_delta"
    BROKER = "broker"
    BROKER_GONE = "broker_gone"


SAMPLES, REPORT, DEAD = RowKind.SAMPLES, RowKind.REPORT, RowKind.DEAD
SHARD, BROKER, BROKER_GONE = RowKind.SHARD, RowKind.BROKER, RowKind.BROKER_GONE
SHARD_DELTA = RowKind.SHARD_DELTA
DEAD_KEY = "dead"
SHARD_PREFIX, BROKER_PREFIX = "s:", "b:"
ISSUES_FIELD = "reportIssues"
"""The field of a report row's document with what the codec ignored in it (kind -> count):
written by the parse stage, summed per batch by the state step, counted by the decision stage.
The stages test for the quoted name in the document's text before decoding it."""
ISSUES_MARK = f'"{ISSUES_FIELD}"'

PARSED_FIELDS: tuple[tuple[str, str], ...] = (
    ("key", "string"),
    ("kind", "string"),
    ("broker", "string"),
    ("event_ms", "bigint"),
    ("partition", "int"),
    ("offset", "bigint"),
    ("usage", "double"),
    ("msg_throughput", "double"),
    ("weighted_max", "double"),
    ("payload", "binary"),  # last: the parse stage's rows carry the report's head here
)

_PYTHON_TYPES: dict[str, Any] = {
    "string": str,
    "bigint": int,
    "int": int,
    "double": float,
    "binary": Any,  # bytes or None; inside the parse stage, a report row's head first
}

ParsedRow = NamedTuple(  # type: ignore[misc]
    "ParsedRow", [(name, _PYTHON_TYPES[kind]) for name, kind in PARSED_FIELDS]
)
ParsedRow.__doc__ = """One parsed row, a tuple whose fields are ``PARSED_FIELDS`` in order.

Why generated from ``PARSED_FIELDS``: the rows are read by name (``row.kind``,
``row.payload``) and still are plain tuples where Spark, Arrow and pandas take them
(``DataFrame.from_records``, ``zip(*rows)``), so a field added or moved in the schema cannot
leave a reader on the wrong position."""

OUTPUT_FIELDS: tuple[tuple[str, str], ...] = (
    ("kind", "string"),
    ("name", "string"),
    ("event_ms", "bigint"),
    ("history_usage", "double"),
    ("msg_throughput_ema", "double"),
    ("weighted_max_ema", "double"),
    ("doc", "string"),
    ("payload", "binary"),
    ("bundles", "bigint"),
)

_NUMPY_DTYPES = {"string": object, "binary": object, "bigint": np.int64, "int": np.int32}


def ddl(fields: tuple[tuple[str, str], ...]) -> str:
    """A DDL schema string (what Spark's APIs accept for a schema)."""
    return ", ".join(f"`{name}` {kind}" for name, kind in fields)


def frame(fields: tuple[tuple[str, str], ...], n: int, **columns: Any) -> pd.DataFrame:
    """A frame with every column of ``fields``: the given ones, defaults (0, "", None) elsewhere.

    Every column is filled because Arrow cannot turn a missing integer into a ``bigint``.
    String and binary columns are kept as ``object`` dtype on purpose: pandas 3 would infer its
    Arrow-backed ``str`` dtype, and ``pd.concat`` of two such frames yields a multi-chunk column
    that PySpark's pandas-to-Arrow conversion rejects ("Cannot convert pyarrow.lib.ChunkedArray
    to pyarrow.lib.Array"), which killed the query at the first batch that expired bundles.
    """
    data: dict[str, Any] = {}
    for name, kind in fields:
        if name in columns:
            value = columns[name]
        elif kind == "string":
            value = np.full(n, "", dtype=object)
        elif kind == "binary":
            value = np.full(n, None, dtype=object)
        else:
            value = np.zeros(n, dtype=_NUMPY_DTYPES.get(kind, np.float64))
        if kind in ("string", "binary"):
            value = pd.Series(value, dtype=object)
        data[name] = value
    return pd.DataFrame(data, columns=[name for name, _ in fields])
