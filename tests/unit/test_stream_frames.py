"""Frames the streaming job's state step yields must convert to Arrow the way PySpark does."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from streaming.schema import OUTPUT_FIELDS, frame


def test_concatenated_output_frames_convert_to_single_arrow_arrays() -> None:
    """pandas 3's Arrow-backed strings concatenate into chunked columns that Spark rejects."""
    first = frame(OUTPUT_FIELDS, 2, name=np.array(["a/b/0x0_0x1", "c"], dtype=object))
    second = frame(OUTPUT_FIELDS, 1, kind=np.array(["expired"], dtype=object))
    joined = pd.concat([first, second], ignore_index=True)
    for name, kind in OUTPUT_FIELDS:
        if kind in ("string", "binary"):
            converted = pa.Array.from_pandas(joined[name])
            assert isinstance(converted, pa.Array), name
            assert joined[name].dtype == object, name
    assert joined["name"].tolist()[:2] == ["a/b/0x0_0x1", "c"]
