"""The Kafka client settings the job's reader gets, before any Spark runs.

Why: the connector's Java consumer holds a fetch at the broker for ``fetch.max.wait.ms`` when no
record follows a task's range, and the next batch's read waits for it (``streaming.source``,
``CONNECTOR_CLIENT_DEFAULTS``): Kafka's 500 ms default was most of a live batch. The setting
must reach the connector, and an operator's own value must win.
"""

from __future__ import annotations

from streaming.source import _with_client_options


class _Reader:
    """Records the options a ``DataStreamReader`` would get."""

    def __init__(self) -> None:
        self.options: dict[str, str] = {}

    def option(self, key: str, value: str) -> _Reader:
        self.options[key] = value
        return self


def test_the_connector_waits_20_ms_for_a_fetch_unless_told_otherwise() -> None:
    got = _with_client_options(_Reader(), "kafka", None).options
    assert got["kafka.fetch.max.wait.ms"] == "20"
    assert got["kafka.default.api.timeout.ms"] == "15000"
    mine = {"fetch.max.wait.ms": 200, "bootstrap.servers": "x:9092"}
    got = _with_client_options(_Reader(), "kafka", mine).options
    assert got["kafka.fetch.max.wait.ms"] == "200"
    assert "kafka.bootstrap.servers" not in got  # the reader has it from its own argument


def test_the_python_source_gets_only_what_it_is_given() -> None:
    """librdkafka names the setting differently; the Python source sets its own
    (``fetch.wait.max.ms``, ``streaming.kafka_reads``)."""
    assert _with_client_options(_Reader(), "python", None).options == {}
