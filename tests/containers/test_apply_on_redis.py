"""The controller's decision applier against a Redis container.

The same tests as ``tests/integration/test_apply.py`` (imported): a transfer applied twice
changes nothing the second time, every decision kind and its already-satisfied form, stale
decisions rejected with a reason, and a replayed decision stream giving the same state.
"""

from __future__ import annotations

from tests.containers.engine import require_docker
from tests.integration.test_apply import (
    store,
    test_replaying_a_decision_stream_twice_gives_the_same_state,
    test_stale_decisions_are_rejected_with_a_reason,
    test_transfer_then_same_decision_again_changes_nothing,
    test_unload_split_and_merge_and_their_already_satisfied_forms,
)

require_docker()  # one skip per module, with the one reason, when there is no engine

__all__ = [
    "store",
    "test_replaying_a_decision_stream_twice_gives_the_same_state",
    "test_stale_decisions_are_rejected_with_a_reason",
    "test_transfer_then_same_decision_again_changes_nothing",
    "test_unload_split_and_merge_and_their_already_satisfied_forms",
]
