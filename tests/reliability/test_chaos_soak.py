"""Three minutes of the chaos soak (``tests.reliability.chaos_soak``) on every CI run.

What it proves: under random SIGKILLs of the job, a controller, the brokers and Redis, a paused
broker fleet and a killed Kafka broker, the product keeps the ring exact, never shows two owners
of a hash range, gives every decision exactly one outcome and announces every lease it grants.
The fault schedule comes from ``LB_SOAK_SEED`` (default 0), so a failure replays its schedule.
"""

from __future__ import annotations

import os

import pytest

from tests.reliability.chaos_soak import run_soak

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SOAK_S = float(os.environ.get("LB_SOAK_SECONDS", "180"))


def test_the_product_survives_three_minutes_of_random_faults_exactly(tmp_path):
    seed = int(os.environ.get("LB_SOAK_SEED", "0"))
    figures = run_soak(tmp_path, SOAK_S, seed)
    print(f"figure: chaos soak {figures}")
    assert figures["faults_total"] >= 10, f"too few faults injected: {figures['faults']}"
    assert figures["decisions"] > 0, "the job decided nothing: the soak exercised no decision"
    assert figures["lease_tokens_seen"] > 0
    assert not figures["violations"], (
        f"seed {seed}: {len(figures['violations'])} violations, first: "
        f"{figures['violations'][:5]}; logs in {figures['logs']}"
    )
