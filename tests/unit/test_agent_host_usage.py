"""psutil host usage: sane readings on this machine, overrides honoured."""

from __future__ import annotations

import time

import pytest

from producers.host_usage import PsutilHostUsage, usable_cores


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_host_usage_has_positive_limits_and_non_negative_usage() -> None:
    source = PsutilHostUsage()
    source.sample(_now_ms())
    time.sleep(0.2)
    u = source.sample(_now_ms())
    assert u.cpu.limit == pytest.approx(usable_cores() * 100.0)
    for r in (u.cpu, u.memory, u.bandwidth_in, u.bandwidth_out):
        assert r.limit > 0 and r.usage >= 0
    assert u.memory.usage <= u.memory.limit
    assert u.direct_memory.limit == 0.0  # no JVM: reads as 0 %


def test_limits_can_be_configured() -> None:
    u = PsutilHostUsage(cpu_limit_percent=150, nic_speed_mbps=8).sample(_now_ms())
    assert u.cpu.limit == 150.0
    assert u.bandwidth_in.limit == pytest.approx(1000.0)  # 8 Mbit/s = 1000 KB/s


def test_first_nic_sample_reads_zero_rate() -> None:
    u = PsutilHostUsage().sample(_now_ms())
    assert u.bandwidth_in.usage == 0.0 and u.bandwidth_out.usage == 0.0


@pytest.mark.parametrize("kw", [{"cpu_limit_percent": 0}, {"nic_speed_mbps": -1}])
def test_non_positive_limits_are_refused(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        PsutilHostUsage(**kw)
