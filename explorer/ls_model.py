"""What neuron-ls shows: each device and the processes using it, independent of how it is printed.

Processes come from two places: live state (every process running compiled models on the
simulated instance publishes which cores it used, its command line and runtime version), and on a
real host the processes holding ``/dev/neuron*`` (``collectors.devholders``): those with the
runtime library mapped are runtimes, the rest are listed only with ``--show-all-procs``, with
``RUNTIME VERSION`` ``NA``. A process using several devices appears under each of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from collectors.devholders import device_holders
from collectors.inventory import DeviceInfo, Inventory
from collectors.livereader import ProcessState, read_live_state

COMMAND_WIDTH = 40
WIDE_COMMAND_WIDTH = 80


@dataclass(frozen=True)
class ProcessRow:
    pid: int
    command: str
    runtime_version: str | None  # None: holds the device but is not a Neuron runtime

    def short_command(self, width: int) -> str:
        """The command cut to ``width`` characters (``width - 3`` and ``...``), as neuron-ls does."""
        return self.command if len(self.command) <= width else self.command[:width - 3] + "..."


@dataclass(frozen=True)
class DeviceRow:
    device: DeviceInfo
    processes: tuple[ProcessRow, ...]


def live_processes(inventory: Inventory, states: list[ProcessState]) -> dict[int, list[ProcessRow]]:
    """Runtime processes per device index, from live state."""
    out: dict[int, list[ProcessRow]] = {}
    known = {d.index for d in inventory.devices}
    for state in states:
        for device in state.devices:
            if device in known:
                out.setdefault(device, []).append(ProcessRow(state.pid, state.command, state.runtime_version))
    return out


def gather(inventory: Inventory, *, show_all: bool = False, live_dir: Path | None = None,
           proc_root: Path = Path("/proc")) -> list[DeviceRow]:
    """One row group per device, its processes sorted by pid."""
    per_device = live_processes(inventory, read_live_state(live_dir))
    if inventory.source == "sysfs":
        for holder in device_holders(proc_root):
            if holder.runtime_version is None and not show_all:
                continue
            for device in holder.devices:
                rows = per_device.setdefault(device, [])
                if all(r.pid != holder.pid for r in rows):
                    rows.append(ProcessRow(holder.pid, holder.command, holder.runtime_version))
    return [DeviceRow(d, tuple(sorted(per_device.get(d.index, []), key=lambda r: r.pid)))
            for d in inventory.devices]


def memory_text(nbytes: int) -> str:
    """Whole GiB, as neuron-ls prints device memory (``32 GB``)."""
    return f"{nbytes // 2**30} GB"


def connected_text(connected: tuple[int, ...] | None) -> str:
    return ", ".join(str(d) for d in connected) if connected else "NA"


def core_ids_text(ids: tuple[int, ...]) -> str:
    if not ids:
        return "NA"
    return f"{ids[0]}-{ids[-1]}" if len(ids) > 1 else str(ids[0])


def device_json(row: DeviceRow, lnc: int, width: int) -> dict:
    """One element of the ``-j`` array (sys-tools.md §4.4)."""
    d = row.device
    return {
        "neuron_device": d.index,
        "bdf": d.short_bdf or "NA",
        "cpu_affinity": d.cpu_affinity or "NA",
        "numa_node": str(d.numa_node) if d.numa_node is not None else "NA",
        "connected_to": list(d.connected) if d.connected else None,
        "nc_count": d.cores,
        "logical_neuroncore_config": lnc,
        "memory_size": d.memory_bytes,
        "neuroncore_ids": list(d.core_ids),
        "neuron_processes": [{"pid": p.pid, "command": p.short_command(width),
                              "neuron_runtime_version": p.runtime_version or "NA"} for p in row.processes],
    }


__all__ = ["COMMAND_WIDTH", "WIDE_COMMAND_WIDTH", "DeviceRow", "ProcessRow", "connected_text",
           "core_ids_text", "device_json", "gather", "live_processes", "memory_text"]
