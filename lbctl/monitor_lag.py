"""The streaming job's lag on the load-reports topic, for ``lbctl monitor`` and ``lbctl run``.

The lag is the topic's end offsets (``infra.offsets.latest_offsets``) minus
the offsets of the job's last committed batch, read from its Spark checkpoint: the job commits
nothing to Kafka (its readers only ``assign()``), so the checkpoint is the one record of how far
it got. Without a readable checkpoint (the job runs on another machine) the end offsets are
still shown, and the lag is unknown rather than guessed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.offsets import latest_offsets
from lbctl.monitor import Lag


def checkpoint_offsets(checkpoint: Path, topic: str) -> dict[int, int] | None:
    """partition -> next offset to read, after the last batch the job committed; None if the
    checkpoint has no committed batch or does not name ``topic``.

    Spark's checkpoint layout: ``commits/<id>`` exists once batch ``id`` completed, and
    ``offsets/<id>`` holds ``v1``, the batch metadata, then one line per source with its end
    offsets (``{"topic": {"0": 42}}`` for both Kafka sources of the job).
    """
    try:
        done = [int(f.name) for f in (checkpoint / "commits").iterdir() if f.name.isdigit()]
        if not done:
            return None
        lines = (checkpoint / "offsets" / str(max(done))).read_text().splitlines()
    except OSError:
        return None
    for line in lines[2:]:
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get(topic), dict):
            return {int(p): int(o) for p, o in doc[topic].items()}
    return None


@dataclass
class LagProbe:
    """The job's lag on the load-reports topic, probed at most every ``interval_s``.

    The probe is also how the monitor knows Kafka answers, so by default it asks at every
    refresh (``interval_s`` 0; ``latest_offsets`` costs tens of ms against a refresh of
    seconds): a cached answer would show a dead Kafka as up until the cache expired. A failed
    probe is never cached.
    """

    bootstrap_servers: str
    topic: str
    client_config: Mapping[str, Any] | None = None
    checkpoint: Path | None = None
    interval_s: float = 0.0
    timeout_s: float = 3.0  # a Kafka that has not answered in this long counts as down
    _last: Lag | None = None
    _at: float = 0.0

    def __call__(self) -> Lag:
        if self._last is not None and time.monotonic() - self._at < self.interval_s:
            return self._last

        now_ms = int(time.time() * 1000)
        try:
            end = latest_offsets(
                self.bootstrap_servers, self.topic, self.client_config, timeout_s=self.timeout_s
            )
            processed = None
            if self.checkpoint is not None:
                processed = checkpoint_offsets(self.checkpoint, self.topic)
            lag = Lag(self.topic, end, processed, now_ms)
        except Exception as e:  # Kafka away: the table still shows what Redis knows
            # not cached: the next refresh asks again, so a Kafka back shows at once
            self._last = None
            return Lag(self.topic, {}, None, now_ms, error=f"{type(e).__name__}: {e}")
        self._last, self._at = lag, time.monotonic()
        return lag
