"""Host groups of a neuron-monitor report: ``vcpu_usage`` and ``memory_info`` (sys-tools.md §1.7).

``vcpu_usage`` is a rate over the period, so a sampler keeps the previous CPU times and reports the
share of each state between two calls, per vCPU and averaged (two decimals, as real captures show;
steal and guest time count in the total, so the seven keys add up to about 100).
``memory_info.memory_used_bytes`` is MemTotal - MemAvailable: the memory that cannot be handed to a
new program without swapping, which is what "used" means to an operator.
"""

from __future__ import annotations

from typing import Any

import psutil

FIELDS = (("user", "user"), ("nice", "nice"), ("system", "system"), ("idle", "idle"),
          ("io_wait", "iowait"), ("irq", "irq"), ("soft_irq", "softirq"))


def _shares(now: Any, before: Any) -> dict[str, float]:
    total = sum(now) - sum(before)
    out = {}
    for key, attr in FIELDS:
        delta = getattr(now, attr, 0.0) - getattr(before, attr, 0.0)
        out[key] = round(100.0 * delta / total, 2) if total > 0 else 0.0
    return out


class CpuSampler:
    """Consecutive ``vcpu_usage`` groups; the first call covers the time since construction."""

    def __init__(self) -> None:
        self._per_cpu = psutil.cpu_times(percpu=True)
        self._total = psutil.cpu_times()
        self._switches = psutil.cpu_stats().ctx_switches

    def sample(self) -> dict[str, Any]:
        per_cpu = psutil.cpu_times(percpu=True)
        total = psutil.cpu_times()
        switches = psutil.cpu_stats().ctx_switches
        usage = {str(i): _shares(now, before) for i, (now, before) in enumerate(zip(per_cpu, self._per_cpu))}
        group = {
            "average_usage": _shares(total, self._total),
            "usage_data": usage,
            "context_switch_count": max(switches - self._switches, 0),
        }
        self._per_cpu, self._total, self._switches = per_cpu, total, switches
        return group


def memory_info() -> dict[str, int]:
    memory = psutil.virtual_memory()
    swap = psutil.swap_memory()
    return {
        "memory_total_bytes": int(memory.total),
        "memory_used_bytes": int(memory.total - memory.available),
        "swap_total_bytes": int(swap.total),
        "swap_used_bytes": int(swap.used),
    }


__all__ = ["CpuSampler", "memory_info"]
