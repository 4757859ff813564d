"""Frames from our live state: every process running models publishes a file; we read them all.

The per-process figures are built exactly as neuron-monitor builds its report groups
(``collectors.monitor_report`` over ``collectors.livewindow`` windows) and parsed by the same code
that reads a monitor stream, so neuron-top shows the same numbers whichever way it is fed. What live
state has beyond a report is added on top: per-engine busy time and HBM traffic per core,
NeuronLink bytes, and the process's command, user, start time, RSS and staleness.

Rates are over the time between two reads (our refresh interval). The very first read has no
previous sample, so it shows each process's averages since it started publishing: a figure at once,
instead of an empty first frame.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import psutil

from collectors import livepaths, monitor_report
from collectors.instanceinfo import imds_info
from collectors.inventory import Inventory, InventoryError, simulated
from collectors.livereader import ProcessState, read_live_state
from collectors.livewindow import LiveTracker, ProcessWindow
from explorer.top.history import History
from explorer.top.host import HostSampler, PsutilHost
from explorer.top.report import parse_process
from explorer.top.snapshots import (
    ENGINES,
    EXITED,
    RUNNING,
    STALE,
    STOPPED,
    CoreUse,
    Frame,
    Hardware,
    ProcessSnapshot,
    SourceStatus,
)

GONE_GRACE_S = 10.0  # an exited process stays in the process table, flagged, this long


def process_status(pid: int) -> str | None:
    """psutil's status of ``pid`` (``running``, ``sleeping``, ``stopped``...), None if unknown."""
    try:
        return psutil.Process(pid).status()
    except (psutil.Error, OSError):
        return None


def _stopped(snap: ProcessSnapshot) -> ProcessSnapshot:
    """A stopped process runs nothing: its cores are idle (its publisher's last rates would
    otherwise be repeated as if it still ran) while it keeps its cores and memory."""
    def zeros(values: Mapping[str, float] | None) -> dict[str, float] | None:
        return None if values is None else dict.fromkeys(values, 0.0)

    idle = {core: replace(use, utilization=0.0, flops=0.0, engine_busy=zeros(use.engine_busy),
                          hbm_bytes_per_s=None if use.hbm_bytes_per_s is None else 0.0)
            for core, use in (snap.cores or {}).items()}
    return replace(snap, state=STOPPED, cores=idle, vcpu_user=0.0, vcpu_system=0.0, executions=0,
                   link_bytes_per_s=zeros(snap.link_bytes_per_s))


def hardware_of(inventory: Inventory, instance_id: str = "") -> Hardware:
    return Hardware(
        instance_id=instance_id, instance_type=inventory.instance_type, core_version=inventory.core_version,
        device_count=len(inventory.devices), cores_per_device=inventory.cores_per_device,
        device_memory_bytes=inventory.device_memory_bytes, simulated=inventory.source == "simulated",
        error=inventory.error)


def process_entry(state: ProcessState, win: ProcessWindow, inventory: Inventory,
                  now: float) -> dict[str, Any]:
    """The neuron-monitor ``neuron_runtime_data`` entry neuron-monitor would write for this window."""
    period = win.period_s
    envelope = monitor_report.envelope
    return {
        "pid": state.pid, "neuron_runtime_tag": state.tag, "error": "",
        "report": {
            "neuroncore_counters": envelope(period,
                                            monitor_report.neuroncore_counters(state, win, inventory)),
            "memory_used": envelope(period, monitor_report.memory_used(state, inventory, now)),
            "neuron_runtime_vcpu_usage": envelope(period, monitor_report.runtime_vcpu_usage(win)),
            "execution_stats": envelope(period, monitor_report.execution_stats(win)),
        },
    }


def _extras(state: ProcessState, win: ProcessWindow, inventory: Inventory,
            cores: Mapping[int, CoreUse]) -> dict[int, CoreUse]:
    """Per-engine busy fractions (mean over the physical cores of a logical core) and HBM bytes/s
    (their sum) added to the report's per-core figures."""
    groups: dict[int, list[Any]] = {}
    for index, core in win.cores.items():
        generation = state.cores[index].generation if index in state.cores else 0
        groups.setdefault(inventory.logical_core(index, generation), []).append(core)
    out = dict(cores)
    for logical, members in groups.items():
        base = out.get(logical, CoreUse(logical, 0.0, 0.0))
        busy = {e: sum(m.engine_busy.get(e, 0.0) for m in members) / len(members) for e in ENGINES}
        hbm = sum(m.hbm_bytes_per_s for m in members)
        out[logical] = replace(base, engine_busy=busy, hbm_bytes_per_s=hbm)
    return out


class LiveSource:
    """Reads the live directory once per ``poll()``; everything injectable for tests."""

    kind: Literal["live"] = "live"

    def __init__(self, inventory: Inventory, *, live_dir: Path | None = None, host: HostSampler | None = None,
                 follow_publishers: bool = True, clock: Callable[[], float] = time.time,
                 read_states: Callable[[float], list[ProcessState]] | None = None,
                 instance_id: str | None = None,
                 status_of: Callable[[int], str | None] = process_status) -> None:
        self.inventory = inventory
        self.live_dir = live_dir or livepaths.live_dir()
        self.host = host or PsutilHost()
        self.follow_publishers = follow_publishers and inventory.source == "simulated"
        self.clock = clock
        self._read = read_states or (lambda now: read_live_state(self.live_dir, now=now))
        self._instance_id = instance_id
        self._status_of = status_of
        self.tracker: LiveTracker | None = None
        self.history = History()
        self._last: dict[int, ProcessSnapshot] = {}
        self._gone: dict[int, ProcessSnapshot] = {}
        self._sequence = 0
        self._host_name: str | None = None
        self._inventories: dict[str, Inventory] = {inventory.instance_type: inventory}

    def _inventory_for(self, states: list[ProcessState]) -> Inventory:
        """The configured instance; with a simulated one, the instance the publishers all run on if
        that differs (watching a trn2 program with a trn1 grid would show nothing useful)."""
        if not self.follow_publishers:
            return self.inventory
        kinds = Counter(s.instance_type for s in states if s.instance_type)
        if len(kinds) != 1:
            return self.inventory
        name = next(iter(kinds))
        if name not in self._inventories:
            try:
                self._inventories[name] = simulated(name)
            except InventoryError:
                self._inventories[name] = self.inventory
        return self._inventories[name]

    def _hardware(self, inventory: Inventory) -> Hardware:
        if self._instance_id is None:  # real hosts: IMDS once, in the collection thread, never at start-up
            self._instance_id = (imds_info(inventory.instance_type).get("instance_id", "")
                                 if inventory.source == "sysfs" else "")
        return hardware_of(inventory, self._instance_id)

    def poll(self) -> Frame:
        """A new frame: read every publisher, take windows since the previous poll."""
        now = self.clock()
        system = self.host.sample()
        if self.tracker is None:
            self.tracker = LiveTracker(cpus=system.vcpu_count)
        states = self._read(now)
        inventory = self._inventory_for(states)
        hardware = self._hardware(inventory)
        windows = self.tracker.advance(states)
        processes: dict[int, ProcessSnapshot] = {}
        for state in states:
            win = windows[state.pid]
            snap = parse_process(process_entry(state, win, inventory, now), hardware)
            processes[state.pid] = replace(
                snap, cores=_extras(state, win, inventory, snap.cores or {}), command=state.command,
                user=state.user, started_at=state.start_time, rss_bytes=state.rss_bytes,
                link_bytes_per_s=dict(win.link_bytes_per_s), state=STALE if state.stale else RUNNING)
            if self._status_of(state.pid) == psutil.STATUS_STOPPED:
                processes[state.pid] = _stopped(processes[state.pid])
        for pid, last in self._last.items():
            if pid not in processes and last.state != EXITED:
                self._gone[pid] = replace(last, state=EXITED, gone_at=now, cores=None, vcpu_user=None,
                                          vcpu_system=None)
        self._gone = {pid: p for pid, p in self._gone.items()
                      if pid not in processes and now - (p.gone_at or now) <= GONE_GRACE_S}
        self._last = processes
        ordered = tuple(sorted(processes.values(), key=lambda p: p.pid)) + tuple(
            sorted(self._gone.values(), key=lambda p: p.pid))
        message = "" if states else f"no process is publishing live state in {self.live_dir}"
        self._sequence += 1
        if self._host_name is None:
            self._host_name = self.host.name()
        return Frame(
            sequence=self._sequence, taken_at=now, hardware=hardware, system=system, processes=ordered,
            status=SourceStatus("live", str(self.live_dir), message=message, reports=self._sequence),
            host_name=self._host_name, history=self.history.record(processes.values()))

    def close(self) -> None:
        """Nothing to release (files are read whole each time)."""


__all__ = ["GONE_GRACE_S", "LiveSource", "hardware_of", "process_entry", "process_status"]
