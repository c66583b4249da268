"""What an operator reads: free bundles as free, times in ISO 8601, piped output not cut."""

from __future__ import annotations

import re
import subprocess

import pytest
import redis

from lbctl.main import main
from lbctl.supervisor import lbctl_argv
from metadata_store.ownership_redis import RedisStore

pytestmark = pytest.mark.integration
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def test_owners_shows_free_bundles_as_free_and_expiry_in_iso_8601(
    redis_url: str, fresh_redis: redis.Redis, capsys
) -> None:
    store = RedisStore(fresh_redis, "lb", clock="server")
    store.create_namespace("acme/web", 2)
    now = store.server_time_ms()
    store.register_broker("b1:8080", now, 60_000)
    first = store.get_namespace("acme/web").bundle_names[0]
    store.acquire(first, "b1:8080", now, 30_000)
    assert main(["owners", "acme/web", "--redis-url", redis_url]) == 0
    out = capsys.readouterr().out
    assert "None" not in out and "free" in out
    assert ISO.search(out), out
    assert not re.search(r"\b1\d{12}\b", out)  # no epoch milliseconds


def test_piped_monitor_output_is_not_cut_at_80_columns(redis_url: str, fresh_redis) -> None:
    store = RedisStore(fresh_redis, "lb", clock="server")
    store.create_namespace("acme/a-namespace-with-a-long-name-for-the-width-check", 4)
    out = subprocess.run(
        lbctl_argv("monitor", "--once", "--redis-url", redis_url),
        capture_output=True, text=True, timeout=60, check=False,
    ).stdout  # fmt: skip
    assert "KB/s in" in out  # every pulsar-perf column: rich would have assumed 80 columns
    assert "…" not in out
