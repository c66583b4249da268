"""What the controller tells its operator about its Kafka: the group it joined and its peers,
and a Kafka that stopped answering.

Why: the loop's consumer hides both. A second ``lbctl control`` in the same group gets no
partition (the decisions topic's partitions all belong to the first) and used to sweep on in
silence, so nobody could tell it was a standby; and a Kafka that went away showed only as
librdkafka's own retry lines, never as the controller's. ``KafkaWatch`` is the consumer's
rebalance listener and a periodic probe: after each assignment it logs the partitions this
controller got and the group's members (``AdminClient.describe_consumer_groups``: each
controller's client id, host and partitions); every ``every_s`` it asks Kafka for the decisions
topic's metadata with a short timeout, and logs once when Kafka stops answering (decisions
wait, lease sweeps go on), again every ``repeat_s`` while it lasts, and once when it is back.
Nothing here changes what the loop does; it makes the trouble visible.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka.admin import AdminClient

__all__ = ["KafkaWatch", "controller_client_id"]

log = logging.getLogger("lbctl.control")

PROBE_TIMEOUT_S = 2.0
REPEAT_S = 30.0


def controller_client_id() -> str:
    """``lb-controller-HOST-PID``: how the group's description names this controller."""
    return f"lb-controller-{socket.gethostname()}-{os.getpid()}"


class KafkaWatch:
    """Rebalance listener and Kafka probe of one controller's consumer (module docstring)."""

    def __init__(
        self,
        client_config: dict[str, Any],
        group_id: str,
        topic: str,
        *,
        every_s: float = 5.0,
        repeat_s: float = REPEAT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client_config = client_config
        self.bootstrap = str(client_config.get("bootstrap.servers", ""))
        self.group_id = group_id
        self.topic = topic
        self.every_s = every_s
        self.repeat_s = repeat_s
        self.clock = clock
        self.partitions: list[int] | None = None
        self._group_changed = False
        self._last_probe = clock()
        self.lost_since: float | None = None
        self._last_said = 0.0

    def lost_for(self) -> float | None:
        """Seconds since the probe last found Kafka unreachable without an answer since, or
        None while Kafka answers."""
        return None if self.lost_since is None else self.clock() - self.lost_since

    def on_assign(self, _consumer: Any, partitions: list[Any]) -> None:
        """The consumer's ``on_assign``: note the partitions; the group is described from
        ``tick`` (outside the rebalance callback, which must return quickly)."""
        self.partitions = sorted(p.partition for p in partitions)
        self._group_changed = True

    def on_revoke(self, _consumer: Any, partitions: list[Any]) -> None:
        """The consumer's ``on_revoke``: a rebalance is under way."""
        log.info(
            "consumer group %s rebalancing: partitions %s revoked",
            self.group_id,
            sorted(p.partition for p in partitions) or "none",
        )

    def tick(self, consumer: Any) -> None:
        """From the loop, between polls: report a new assignment, probe Kafka when due."""
        if self._group_changed:
            self._group_changed = False
            self._report_group()
        if self.clock() - self._last_probe >= self.every_s:
            self._last_probe = self.clock()
            self._probe(consumer)

    def _report_group(self) -> None:
        got = ", ".join(map(str, self.partitions or [])) or "none"
        idle = "" if self.partitions else " (a standby: another controller holds them)"
        log.info(
            "joined consumer group %s: partitions of %s: %s%s; active controllers: %s",
            self.group_id, self.topic, got, idle, self._members(),
        )  # fmt: skip

    def _members(self) -> str:
        """The group's members as ``client-id@host [partitions]``, or why they are unknown."""
        try:
            admin = AdminClient(self.client_config)
            future = admin.describe_consumer_groups([self.group_id])[self.group_id]
            group = future.result(timeout=PROBE_TIMEOUT_S * 2)
        except Exception as e:  # KafkaException, a timeout: the description is a nicety
            return f"unknown ({e})"
        out = []
        for m in group.members:
            tps = m.assignment.topic_partitions if m.assignment else []
            parts = ",".join(str(tp.partition) for tp in tps) or "none"
            out.append(f"{m.client_id}@{m.host.lstrip('/')} [{parts}]")
        return f"{len(out)}: " + "; ".join(sorted(out))

    def _probe(self, consumer: Any) -> None:
        now = self.clock()
        try:
            consumer.list_topics(self.topic, timeout=PROBE_TIMEOUT_S)
        except Exception as e:  # KafkaException: no broker answered
            if self.lost_since is None:
                self.lost_since = self._last_said = now
                log.error(
                    "Kafka at %s unreachable (%s): decisions wait, nothing is consumed or "
                    "committed; lease sweeps go on",
                    self.bootstrap, _short(e),
                )  # fmt: skip
            elif now - self._last_said >= self.repeat_s:
                self._last_said = now
                log.error(
                    "Kafka at %s still unreachable after %.0f s: decisions wait",
                    self.bootstrap, now - self.lost_since,
                )  # fmt: skip
            return
        if self.lost_since is not None:
            log.warning(
                "Kafka at %s reachable again after %.0f s", self.bootstrap, now - self.lost_since
            )
            self.lost_since = None


def _short(error: BaseException) -> str:
    args = getattr(error, "args", ())
    inner = args[0] if args else error
    text = inner.str() if hasattr(inner, "str") else str(inner)
    return text[:160]
