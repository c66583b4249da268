"""Row layouts between the stages of the streaming job, in one place.

Why one module: three stages (parse, state, decide) run in different processes (executors'
Python workers and the driver) and agree only through these column lists, so they are written
once. Both layouts are internal to the job; what leaves it is decisions and dead letters (JSON
on Kafka) and the averaged view in Redis.

**Parsed rows** (parse -> state), grouped by ``key``:

* ``s:<shard>`` / kind ``samples``: one report's bundle samples that fall into one shard, packed
  by ``streaming.shard_state.pack_samples``;
* ``b:<broker>`` / kind ``report``: the report's figures without ``lastStats`` (JSON) plus its
  weighted capped max usage and total throughput, computed where the report was decoded;
* ``dead`` / kind ``dead``: a dead letter (JSON) for the decision stage to publish.

``event_ms`` is the Kafka record timestamp; ``(event_ms, partition, offset)`` orders samples.

**State output rows** (state -> decide), kinds ``bundle``, ``bundle_expired``, ``broker``,
``broker_gone`` and ``dead``: one row per touched bundle or broker with the current averages.
``doc`` holds the JSON the decision stage writes to Redis: a bundle's snapshot document
(``streaming.snapshot_docs``) or a broker's report without ``lastStats``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

SAMPLES, REPORT, DEAD = "samples", "report", "dead"
BUNDLE, BUNDLE_EXPIRED, BROKER, BROKER_GONE = "bundle", "bundle_expired", "broker", "broker_gone"
DEAD_KEY = "dead"
SHARD_PREFIX, BROKER_PREFIX = "s:", "b:"

PARSED_FIELDS: tuple[tuple[str, str], ...] = (
    ("key", "string"),
    ("kind", "string"),
    ("broker", "string"),
    ("event_ms", "bigint"),
    ("partition", "int"),
    ("offset", "bigint"),
    ("usage", "double"),
    ("msg_throughput", "double"),
    ("payload", "binary"),
)

OUTPUT_FIELDS: tuple[tuple[str, str], ...] = (
    ("kind", "string"),
    ("name", "string"),
    ("broker", "string"),
    ("event_ms", "bigint"),
    ("short_msg_throughput_in", "double"),
    ("short_msg_throughput_out", "double"),
    ("short_msg_rate_in", "double"),
    ("short_msg_rate_out", "double"),
    ("short_num_samples", "bigint"),
    ("long_msg_throughput_in", "double"),
    ("long_msg_throughput_out", "double"),
    ("long_msg_rate_in", "double"),
    ("long_msg_rate_out", "double"),
    ("long_num_samples", "bigint"),
    ("last_msg_throughput_in", "double"),
    ("last_msg_throughput_out", "double"),
    ("last_msg_rate_in", "double"),
    ("last_msg_rate_out", "double"),
    ("topics", "bigint"),
    ("consumer_count", "bigint"),
    ("producer_count", "bigint"),
    ("history_usage", "double"),
    ("msg_throughput_ema", "double"),
    ("doc", "string"),
    ("payload", "binary"),
)

SHORT_COLUMNS = [f"short_{c}" for c in ("msg_throughput_in", "msg_throughput_out")] + [
    f"short_{c}" for c in ("msg_rate_in", "msg_rate_out")
]
LONG_COLUMNS = [c.replace("short_", "long_") for c in SHORT_COLUMNS]
LAST_COLUMNS = [c.replace("short_", "last_") for c in SHORT_COLUMNS]
COUNT_COLUMNS = ["topics", "consumer_count", "producer_count"]

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
