"""The pipeline's pieces against Apache Kafka (KRaft) and Redis containers.

The same tests as the integration tier (imported), with ``kafka_bootstrap`` a Kafka container
(conftest.py) instead of the embedded Kafka-protocol broker, whose ListOffsets and group-join
quirks the product works around; here they meet the real broker:

* a broker agent publishes load reports keyed by broker id;
* the Python streaming source reads every record exactly once, then only new ones after a
  restart (real per-partition offsets, the checkpoint's replay);
* load reports -> the streaming job's parse and state -> decisions on Kafka: an overloaded
  broker is shed and a hot bundle split;
* the controller consumes decisions, applies them in Redis, publishes ownership events and
  commits its offsets.
"""

from __future__ import annotations

import pytest

from tests.containers.engine import require_docker
from tests.integration.test_agent_kafka import test_agent_publishes_reports_keyed_by_broker_id
from tests.integration.test_control_loop import (
    test_loop_applies_decisions_publishes_their_events_sweeps_and_commits,
)
from tests.integration.test_kafka_source import (
    test_every_record_exactly_once_then_only_new_records_after_restart,
)
from tests.integration.test_streaming_job import (
    test_overloaded_broker_is_shed_and_hot_bundle_split,
)

require_docker()  # one skip per module, with the one reason, when there is no engine

pytestmark = pytest.mark.integration

__all__ = [
    "test_agent_publishes_reports_keyed_by_broker_id",
    "test_every_record_exactly_once_then_only_new_records_after_restart",
    "test_loop_applies_decisions_publishes_their_events_sweeps_and_commits",
    "test_overloaded_broker_is_shed_and_hot_bundle_split",
]
