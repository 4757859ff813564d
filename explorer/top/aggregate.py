"""Tabs and what each tab shows: one process, or "all" combined by the real tool's rules.

"all" (sys-tools.md §3.4): per-core utilisation is the sum over processes capped at 100; FLOPS,
memory (totals, categories, per core) and runtime vCPU are sums; loaded models are concatenated.
Entries with an ``error``, and exited processes, are left out; a group with an error contributes
nothing. Engine busy fractions and HBM traffic (live state only) follow the utilisation rule: summed
per core and capped at 1 / added up.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from explorer.top import names
from explorer.top.snapshots import (
    DEVICE_MEMORY_KEYS,
    HOST_MEMORY_KEYS,
    LINK_KINDS,
    STOPPED,
    Frame,
    LoadedModel,
    ProcessSnapshot,
)

MAX_NUMBERED_TABS = 9


@dataclass(frozen=True)
class Tab:
    pid: int | None  # None: "all"
    label: str


@dataclass(frozen=True)
class TabData:
    """What one tab shows, already combined."""

    utilization: Mapping[int, float]  # cores listed by at least one process
    flops: Mapping[int, float]
    engine_busy: Mapping[int, Mapping[str, float]]  # cores with per-engine data
    hbm_bytes_per_s: Mapping[int, float]
    link_bytes_per_s: Mapping[str, float] | None  # None: the source has no link counters
    vcpu_user: float | None
    vcpu_system: float | None
    host_memory: Mapping[str, int] | None
    core_memory: Mapping[int, Mapping[str, int]]
    models: tuple[LoadedModel, ...]
    processes: int  # contributing processes

    @property
    def device_memory(self) -> dict[str, int]:
        out = dict.fromkeys(DEVICE_MEMORY_KEYS, 0)
        for cats in self.core_memory.values():
            for k in DEVICE_MEMORY_KEYS:
                out[k] += cats.get(k, 0)
        return out


def mean_utilization(utilization: Mapping[int, float]) -> float | None:
    """The average utilisation of the cores present in ``utilization`` (percent), None if none.

    Absent is not zero (sys-tools.md §1.5): a core no process lists has no utilisation, so it is not
    averaged in as 0 (one core at 9.30 % and one absent is 9.30 %, not 4.65 %). The header's average
    and a process's NC% are both this."""
    if not utilization:
        return None
    return sum(utilization.values()) / len(utilization)


def tabs(frame: Frame) -> tuple[Tab, ...]:
    """"all" first, then one tab per process by pid (tags repeat; pids do not), each named by its
    tag, script or model (``names.label``), never a bare pid when something better is known."""
    return (Tab(None, "all"), *(Tab(p.pid, names.label(p) + (" (stopped)" if p.state == STOPPED else ""))
                                for p in sorted(frame.active, key=lambda p: p.pid)))


def _sum_optional(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def combine(processes: Iterable[ProcessSnapshot]) -> TabData:
    """The processes' data combined by the "all" rules (one process: its own data unchanged)."""
    procs = list(processes)
    util: dict[int, float] = {}
    flops: dict[int, float] = {}
    engines: dict[int, dict[str, float]] = {}
    hbm: dict[int, float] = {}
    links: dict[str, float] | None = None
    for p in procs:
        for core, use in (p.cores or {}).items():
            util[core] = min(util.get(core, 0.0) + use.utilization, 100.0)
            flops[core] = flops.get(core, 0.0) + use.flops
            if use.engine_busy is not None:
                slot = engines.setdefault(core, {})
                for engine, busy in use.engine_busy.items():
                    slot[engine] = min(slot.get(engine, 0.0) + busy, 1.0)
            if use.hbm_bytes_per_s is not None:
                hbm[core] = hbm.get(core, 0.0) + use.hbm_bytes_per_s
        if p.link_bytes_per_s is not None:
            links = links if links is not None else dict.fromkeys(LINK_KINDS, 0.0)
            for kind, value in p.link_bytes_per_s.items():
                links[kind] = links.get(kind, 0.0) + value
    host: dict[str, int] | None = None
    core_memory: dict[int, dict[str, int]] = {}
    for p in procs:
        if p.host_memory is not None:
            host = host if host is not None else dict.fromkeys(HOST_MEMORY_KEYS, 0)
            for k in HOST_MEMORY_KEYS:
                host[k] += p.host_memory.get(k, 0)
        for core, cats in (p.core_memory or {}).items():
            memory = core_memory.setdefault(core, dict.fromkeys(DEVICE_MEMORY_KEYS, 0))
            for k in DEVICE_MEMORY_KEYS:
                memory[k] += cats.get(k, 0)
    models = tuple(m for p in procs for m in p.models)
    return TabData(
        utilization=util, flops=flops, engine_busy=engines, hbm_bytes_per_s=hbm, link_bytes_per_s=links,
        vcpu_user=_sum_optional(p.vcpu_user for p in procs),
        vcpu_system=_sum_optional(p.vcpu_system for p in procs),
        host_memory=host, core_memory=core_memory, models=models, processes=len(procs))


def tab_data(frame: Frame, pid: int | None) -> TabData:
    """What the tab of ``pid`` shows (None: "all"); an unknown pid shows nothing."""
    if pid is None:
        return combine(frame.active)
    process = next((p for p in frame.active if p.pid == pid), None)
    return combine([process] if process is not None else [])


__all__ = ["MAX_NUMBERED_TABS", "Tab", "TabData", "combine", "mean_utilization", "tab_data", "tabs"]
