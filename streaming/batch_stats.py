"""What one micro-batch of the decision stage did: the record the stage reports per batch.

A module of its own because two readers take it: the stage's ``on_batch`` listeners (the job's
log line, the benchmarks) and the Prometheus updates (``streaming.stream_metrics``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["BatchStats"]


@dataclass(frozen=True, slots=True)
class BatchStats:
    """What one batch did; handed to ``on_batch`` (the benchmark listens there)."""

    batch_id: int
    input_rows: int
    dead_letters: int
    decisions: int
    duration_ms: float
    now_ms: int
    max_event_ms: int
    skipped: bool = False
    decision_ids: tuple[str, ...] = ()
    collect_ms: float = 0.0  # of duration_ms: running the Spark plan (source, parse, state)
    # of duration_ms: the decision stage's steps (ms), for finding where a batch's time goes
    phases: Mapping[str, float] = field(default_factory=dict)
