"""The host's own figures for the live source: system vCPU use, host memory, host name.

A neuron-monitor stream brings these in ``system_data``; with live state neuron-top measures them
itself, as neuron-monitor would (``vcpu_usage`` user = user + nice, system = system + io_wait + irq +
soft_irq; memory used = total - available). Only whole-machine totals are read (one ``/proc/stat``
line, not one per vCPU) because this runs at the refresh rate. Tests replace the sampler with fixed
values so no machine's name, CPU count or memory ever reaches a snapshot.
"""

from __future__ import annotations

import socket
from typing import Protocol

import psutil

from explorer.top.snapshots import SystemSnapshot


class HostSampler(Protocol):
    """What a source needs from the host: a name for the title and one sample per frame."""

    def name(self) -> str: ...

    def sample(self) -> SystemSnapshot: ...


def _busy(times: psutil._common.scputimes) -> tuple[float, float, float]:
    user = times.user + getattr(times, "nice", 0.0)
    system = times.system + sum(getattr(times, k, 0.0) for k in ("iowait", "irq", "softirq"))
    return user, system, sum(times)


class PsutilHost:
    """This machine, measured with psutil; the first sample covers the time since boot (so the very
    first frame already has a figure), later ones the time since the previous sample."""

    def __init__(self) -> None:
        self._last: tuple[float, float, float] = (0.0, 0.0, 0.0)
        self._count = psutil.cpu_count() or 1

    def name(self) -> str:
        return socket.gethostname()

    def sample(self) -> SystemSnapshot:
        now = _busy(psutil.cpu_times())
        total = now[2] - self._last[2]
        user = 100.0 * (now[0] - self._last[0]) / total if total > 0 else 0.0
        system = 100.0 * (now[1] - self._last[1]) / total if total > 0 else 0.0
        self._last = now
        memory = psutil.virtual_memory()
        swap = psutil.swap_memory()
        return SystemSnapshot(vcpu_user=user, vcpu_system=system, vcpu_count=self._count,
                              memory_total=int(memory.total),
                              memory_used=int(memory.total - memory.available),
                              swap_total=int(swap.total), swap_used=int(swap.used))


class FixedHost:
    """A host that always reports the same figures (tests, snapshots, demos)."""

    def __init__(self, system: SystemSnapshot, name: str = "host") -> None:
        self._system = system
        self._name = name

    def name(self) -> str:
        return self._name

    def sample(self) -> SystemSnapshot:
        return self._system


__all__ = ["FixedHost", "HostSampler", "PsutilHost"]
