"""Opt-in timing of the job's executor-side stages (source read, parse, state step).

Why: a micro-batch's wall time is split by Spark's progress report (offsets, planning,
``addBatch``, commits) and by the decision stage (``BatchStats.phases``), but the executor work
inside ``addBatch`` (reading Kafka, decoding reports, folding samples into the shard state) runs
in Python workers that neither can see. When ``LB_STREAM_STAGE_TIMINGS`` names a file, each
worker appends one line per piece of work, ``<stage> <wall ms> <cpu ms> <items>``, to it (one
``O_APPEND`` write per line, so workers do not interleave); ``benchmarks/bench_stream.py`` sets
it and sums the lines per phase. Unset (production), ``record`` is one dictionary lookup.

The times are the stage's own code, not the waits between its calls (a generator's ``yield``
waits for Spark to take the batch), summed over parallel tasks; the CPU time is the calling
thread's (``time.thread_time``), which on shared cores is the honest one of the two.
"""

from __future__ import annotations

import os
import time

ENV = "LB_STREAM_STAGE_TIMINGS"


def enabled() -> bool:
    return bool(os.environ.get(ENV))


class Clock:
    """Wall and thread CPU time of one piece of work, paused across its yields."""

    def __init__(self) -> None:
        self.wall_s = self.cpu_s = 0.0
        self.resume()

    def resume(self) -> None:
        self._wall, self._cpu = time.perf_counter(), time.thread_time()

    def pause(self) -> None:
        self.wall_s += time.perf_counter() - self._wall
        self.cpu_s += time.thread_time() - self._cpu

    def record(self, stage: str, items: int = 0) -> None:
        """Pause and record (when timings are on)."""
        self.pause()
        record(stage, self.wall_s, self.cpu_s, items)


def record(stage: str, wall_s: float, cpu_s: float, items: int = 0) -> None:
    """Append one timing line when timings are on; never raises."""
    path = os.environ.get(ENV)
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            line = f"{stage} {wall_s * 1000:.3f} {cpu_s * 1000:.3f} {int(items)}\n"
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError:
        pass


Sums = dict[str, tuple[float, float, int, int]]


def read(path: str, offset: int = 0) -> tuple[Sums, int]:
    """Sums per stage from ``offset`` on: stage -> (wall ms, cpu ms, items, lines); and the
    new offset."""
    sums: Sums = {}
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return sums, offset
    end = data.rfind(b"\n") + 1
    for line in data[:end].decode().splitlines():
        stage, wall, cpu, items = line.split()
        w, c, n, lines = sums.get(stage, (0.0, 0.0, 0, 0))
        sums[stage] = (w + float(wall), c + float(cpu), n + int(items), lines + 1)
    return sums, offset + end
