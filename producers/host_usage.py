"""Host CPU, memory and NIC usage for a broker's load report, measured with psutil.

Why these units: the policies compare ``usage / limit``, so each reading is paired with the
limit it is measured against, as Pulsar's ``ResourceUsage`` does. CPU is in percent of one
core, against ``cores x 100`` (a fully busy 4-core host reads 400 of 400); memory is used MB
against total MB; the NIC is the in/out rate in KB/s against the configured link speed.
Direct memory is a JVM notion with no host equivalent, so it is left at 0 of 0 (which every
policy reads as 0 %).

The NIC rate needs two counter readings, so the first sample after start reports 0 KB/s; the
agent samples every few seconds, so that only costs the very first report.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import psutil

from loadbalance.model import ResourceUsage

log = logging.getLogger(__name__)

# When the link speed is neither configured nor readable (virtual NICs often say 0).
DEFAULT_NIC_SPEED_MBPS = 1000.0
_BYTES_PER_KB = 1000.0
_KB_PER_S_PER_MBPS = 1_000_000.0 / 8.0 / _BYTES_PER_KB  # 1 Mbit/s = 125 KB/s


@dataclass(frozen=True, slots=True)
class HostUsage:
    """One reading of the host, ready to drop into a ``LocalBrokerData``."""

    cpu: ResourceUsage
    memory: ResourceUsage
    direct_memory: ResourceUsage
    bandwidth_in: ResourceUsage
    bandwidth_out: ResourceUsage


def usable_cores() -> float:
    """Cores this process may use: a cgroup v2 quota if one is set, else the CPU affinity."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max" and float(period) > 0:
            return max(float(quota) / float(period), 0.01)
    except (OSError, ValueError):
        pass
    try:
        return float(len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return float(psutil.cpu_count() or 1)


def detected_nic_speed_mbps() -> float:
    """Sum of the link speeds of the up, non-loopback interfaces; 0 if none reports one."""
    total = 0.0
    for name, stats in psutil.net_if_stats().items():
        if name == "lo" or name.startswith("lo") or not stats.isup:
            continue
        total += max(float(stats.speed), 0.0)
    return total


class PsutilHostUsage:
    """Samples the host; ``cpu_limit_percent`` and ``nic_speed_mbps`` override detection."""

    def __init__(
        self, cpu_limit_percent: float | None = None, nic_speed_mbps: float | None = None
    ) -> None:
        if cpu_limit_percent is not None and cpu_limit_percent <= 0:
            raise ValueError("cpu_limit_percent must be > 0")
        if nic_speed_mbps is not None and nic_speed_mbps <= 0:
            raise ValueError("nic_speed_mbps must be > 0")
        self.cpu_limit_percent = cpu_limit_percent or usable_cores() * 100.0
        speed = nic_speed_mbps or detected_nic_speed_mbps()
        if speed <= 0:
            log.info(
                "NIC speed unknown; assuming %g Mbit/s (set --nic-speed-mbps)",
                DEFAULT_NIC_SPEED_MBPS,
            )
            speed = DEFAULT_NIC_SPEED_MBPS
        self.nic_speed_mbps = speed
        self._host_cores = float(psutil.cpu_count() or 1)
        self._last_net: tuple[int, int, int] | None = None  # (at_ms, bytes_recv, bytes_sent)
        psutil.cpu_percent(interval=None)  # prime: the next call measures from here

    def _nic_rates_kb_per_s(self, now_ms: int) -> tuple[float, float]:
        counters = psutil.net_io_counters(pernic=True)
        recv = sum(c.bytes_recv for n, c in counters.items() if not n.startswith("lo"))
        sent = sum(c.bytes_sent for n, c in counters.items() if not n.startswith("lo"))
        last, self._last_net = self._last_net, (now_ms, recv, sent)
        if last is None or now_ms <= last[0]:
            return 0.0, 0.0
        elapsed_s = (now_ms - last[0]) / 1000.0
        # counters can wrap or reset (interface restarted): a negative delta reads as 0
        in_rate = max(recv - last[1], 0) / _BYTES_PER_KB / elapsed_s
        out_rate = max(sent - last[2], 0) / _BYTES_PER_KB / elapsed_s
        return in_rate, out_rate

    def sample(self, now_ms: int) -> HostUsage:
        """Read the host now; ``now_ms`` times the NIC counter deltas."""
        # host-wide percent averaged over cores, scaled to "percent of one core" units
        cpu_usage = psutil.cpu_percent(interval=None) * self._host_cores
        vm = psutil.virtual_memory()
        mb = 1024.0 * 1024.0
        in_kb_per_s, out_kb_per_s = self._nic_rates_kb_per_s(now_ms)
        nic_limit_kb_per_s = self.nic_speed_mbps * _KB_PER_S_PER_MBPS
        return HostUsage(
            cpu=ResourceUsage(min(cpu_usage, self._host_cores * 100.0), self.cpu_limit_percent),
            memory=ResourceUsage((vm.total - vm.available) / mb, vm.total / mb),
            direct_memory=ResourceUsage(0.0, 0.0),
            bandwidth_in=ResourceUsage(in_kb_per_s, nic_limit_kb_per_s),
            bandwidth_out=ResourceUsage(out_kb_per_s, nic_limit_kb_per_s),
        )
