"""The driver's pauses of Python's cyclic garbage collector, and its nicer warm-up thread.

Why an object and not module state: the pause counts the threads inside it and how many pauses
ended in a freeze; that state belongs to the driver view that pauses (``DriverView.gc``), so a
test can make one, use it and throw it away without touching another's counts.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

BACKGROUND_NICE = 10
"""Niceness added to the thread that decodes the view ahead of a cycle (the warm-up)."""

FREEZES_PER_SWEEP = 10
"""How many pauses end in ``gc.freeze()`` before one ends in ``gc.unfreeze()`` instead."""


def lower_thread_priority(nice: int = BACKGROUND_NICE) -> None:
    """Make the calling thread ``nice`` steps nicer (Linux schedules threads separately).

    Why: a warm-up needs up to a second of CPU; at equal priority it takes one of two cores
    from the Spark batch it overlaps and slows every report of that batch, while a nicer thread
    uses what the batches leave. No-op off Linux, where the id of a thread is not a process id."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + nice)
    except OSError:  # not allowed here: run at the normal priority
        pass


class GcPause:
    """No cyclic garbage collection while a view is materialised or a cycle runs.

    Why: a view holds about four objects per bundle (half a million at 100,000 bundles), and
    building tens of thousands of new ones triggers full collections that walk all of them
    (a large share of a cycle's time). The objects are plain values without reference cycles,
    freed by reference counting; collection resumes when the last thread leaves (threads may
    nest).

    When it resumes, the objects then alive are frozen (``gc.freeze``: moved where collections
    do not walk them; reference counting still frees them): otherwise the first collections
    after a cycle at a million bundles walk everything the cycle made, young and old, and took
    0.3-0.5 s of the batch that publishes its decisions. Every ``sweep_every``-th time they are
    handed back instead (``gc.unfreeze``) and one full collection runs, so that cyclic garbage
    frozen with them is collected and memory stays bounded."""

    def __init__(self, sweep_every: int = FREEZES_PER_SWEEP) -> None:
        self.sweep_every = sweep_every
        self._lock = threading.Lock()
        self._holds = 0  # threads inside ``paused``
        self._was_enabled = False  # whether the collector was on when the first one entered
        self.frozen = 0  # freezes since the frozen objects were last handed back

    @contextmanager
    def paused(self) -> Iterator[None]:
        """The pause itself (a context manager; threads may nest)."""
        self._enter()
        try:
            yield
        finally:
            if self._leave():  # outside the lock: a collection runs finalizers (locks)
                gc.collect()

    def _enter(self) -> None:
        with self._lock:
            if self._holds == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._holds += 1

    def _leave(self) -> bool:
        """Resume collection when the last thread leaves; whether a full sweep is due."""
        with self._lock:
            self._holds -= 1
            if self._holds or not self._was_enabled:
                return False
            self.frozen += 1
            sweep = self.frozen >= self.sweep_every
            if sweep:
                gc.unfreeze()
                self.frozen = 0
            else:
                gc.freeze()
            gc.enable()
            return sweep
