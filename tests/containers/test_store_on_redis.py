"""The ownership store's contract against a Redis container.

A subset of ``tests/integration/test_store_contract.py`` (the same test functions and fixtures,
imported): namespaces and splits under compare-and-set, leases and fencing tokens, the expiry
sweep, and the seeded comparison with the in-memory store. ``redis_url`` is a Redis container
(conftest.py); the in-memory parametrisation runs too, as the comparison's reference.
"""

from __future__ import annotations

from tests.containers.engine import require_docker
from tests.integration.test_store_contract import (
    make_store,
    store,
    test_acquire_needs_a_live_broker_and_a_free_current_bundle,
    test_expired_leases_are_swept_and_the_old_owner_is_fenced_out,
    test_fencing_tokens_only_grow_across_bundles_and_owners,
    test_redis_and_memory_give_identical_answers_to_the_same_operations,
    test_split_bumps_the_version_ends_the_parent_lease_and_is_compare_and_set,
    test_transfer_moves_a_live_lease_atomically_with_a_new_token,
)

require_docker()  # one skip per module, with the one reason, when there is no engine

__all__ = [
    "make_store",
    "store",
    "test_acquire_needs_a_live_broker_and_a_free_current_bundle",
    "test_expired_leases_are_swept_and_the_old_owner_is_fenced_out",
    "test_fencing_tokens_only_grow_across_bundles_and_owners",
    "test_redis_and_memory_give_identical_answers_to_the_same_operations",
    "test_split_bumps_the_version_ends_the_parent_lease_and_is_compare_and_set",
    "test_transfer_moves_a_live_lease_atomically_with_a_new_token",
]
