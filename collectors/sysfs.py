"""Real Neuron hardware through the driver's sysfs tree (sys-tools.md §5).

``NEURON_SYSFS_ROOT`` (or ``NEURONSCOPE_SYSFS_ROOT``) replaces the default
``/sys/devices/virtual/neuron_device`` so a fixture tree can stand in for a host. Only reads: sysfs
counters are cleared by writing them, so this module never opens anything for writing.

Layout. The documented (pre-2.31 driver) paths are tried first. Driver 2.31 moved nodes to paths
that are not public yet, so each node that is missing at its documented path is searched for by name
under the device (or core) directory, a few levels deep; ``SysfsDevice.layout`` says which way the
device was read (``"pre-2.31"`` or ``"relocated"``). A node that cannot be read for lack of
permission is reported as an error for that node, never as a zero.

Counters are directories holding ``total`` (and ``present``, ``peak``); some ``other_info`` entries
are plain files. Both forms are accepted.

Bounded (issue 14): a node is read only if it is a regular file (checked before opening, and opened
non-blocking, so a FIFO or socket placed in a fixture tree is an error, not a hang), at most
``MAX_NODE_BYTES`` of it; counters are whole numbers in [0, 2**64); device and core indices, core
counts and directory listings have ceilings far above any instance (``collectors.reportvalues``), so
``core_count`` 10^12 is an error for that node, not a MemoryError.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from collectors.reportvalues import MAX_CORES_PER_DEVICE, MAX_DEVICES, text
from neuronscope import settings

DEFAULT_ROOT = "/sys/devices/virtual/neuron_device"
SEARCH_DEPTH = 4
MAX_NODE_BYTES = 64 << 10  # sysfs attributes are at most a page
MAX_DIR_ENTRIES = 4096  # entries looked at in any one directory
MAX_COUNTER = 2**64 - 1

HW_COUNTERS = ("mem_ecc_corrected", "mem_ecc_uncorrected", "sram_ecc_corrected", "sram_ecc_uncorrected",
               "mem_ecc_repairable_uncorrected")
DEVICE_MEM_CATEGORIES = ("collectives", "constants", "dma_rings", "driver_memory", "model_code",
                         "model_shared_scratchpad", "nonshared_scratchpad", "notifications",
                         "runtime_memory", "tensors", "uncategorized")
HOST_MEM_CATEGORIES = ("application_memory", "constants", "dma_buffers", "dma_rings", "driver_memory",
                       "notifications", "tensors", "uncategorized")
OTHER_INFO = ("flop_count", "inference_count", "model_load_count", "reset_fail_count", "reset_req_count",
              "nc_time_in_use")
# sysfs device-memory categories folded into neuron-monitor's five (sys-tools.md §5.4, inferred there)
MONITOR_CATEGORY = {
    "constants": "constants", "model_code": "model_code", "tensors": "tensors",
    "runtime_memory": "runtime_memory", "model_shared_scratchpad": "model_shared_scratchpad",
    "nonshared_scratchpad": "model_shared_scratchpad", "collectives": "runtime_memory",
    "dma_rings": "runtime_memory", "driver_memory": "runtime_memory", "notifications": "runtime_memory",
    "uncategorized": "runtime_memory",
}
# the driver renamed infer_* to execute_* (driver 2.8); the sysfs guide still shows the old names
STATUS_ALIASES = {"infer_failed_to_queue": "execute_failed_to_queue",
                  "infer_completed_with_error": "execute_completed_with_error",
                  "infer_completed_with_num_error": "execute_completed_with_num_error"}


class SysfsError(OSError):
    """A node exists but cannot be read (permissions, I/O); the message names the path."""


def sysfs_root() -> Path:
    return settings.NEURON_SYSFS_ROOT.get() or settings.SYSFS_ROOT.get() or Path(DEFAULT_ROOT)


def present(root: Path | None = None) -> bool:
    """True when the driver's tree exists (a Neuron host, or a fixture standing in for one)."""
    root = root or sysfs_root()
    return root.is_dir() and any(_device_dirs(root))


def _device_dirs(root: Path) -> Iterator[tuple[int, Path]]:
    try:
        names = os.listdir(root)
    except OSError:
        return
    found = []
    for name in sorted(names)[:MAX_DIR_ENTRIES]:
        match = re.fullmatch(r"neuron(\d{1,4})", name)
        if match and int(match.group(1)) < MAX_DEVICES and (root / name).is_dir():
            found.append((int(match.group(1)), root / name))
    yield from sorted(found)


def _read(path: Path) -> str:
    """A node's text; SysfsError if it is not a regular file or cannot be read (never blocks)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise SysfsError(f"read {path}: not a regular file")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced between the stat and the open
                raise SysfsError(f"read {path}: not a regular file")
            data = os.read(fd, MAX_NODE_BYTES + 1)
        finally:
            os.close(fd)
    except PermissionError:
        raise SysfsError(f"open {path}: permission denied") from None
    except OSError as exc:
        if isinstance(exc, SysfsError):
            raise
        raise SysfsError(f"read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_NODE_BYTES:
        raise SysfsError(f"read {path}: over {MAX_NODE_BYTES:,} bytes, not a sysfs attribute")
    return data.decode("utf-8", "replace").strip()


def _find(base: Path, documented: str, name: str) -> tuple[Path | None, bool]:
    """A node at its documented path, else searched by ``name`` under ``base``; (path, relocated)."""
    path = base / documented
    if path.exists():
        return path, False
    for found in _walk(base, name, SEARCH_DEPTH):
        return found, True
    return None, False


def _walk(base: Path, name: str, depth: int) -> Iterator[Path]:
    if depth < 0:
        return
    try:
        with os.scandir(base) as listing:
            entries = sorted((e for _, e in zip(range(MAX_DIR_ENTRIES), listing)), key=lambda e: e.name)
    except OSError:
        return
    for entry in entries:
        if entry.name == name:
            yield Path(entry.path)
    for entry in entries:
        if entry.is_dir(follow_symlinks=False) and not entry.name.startswith("neuron_core"):
            yield from _walk(Path(entry.path), name, depth - 1)


def _counter(path: Path, field_name: str = "total") -> int:
    """A counter's value: ``<path>/<field>`` for counter directories, the file itself otherwise."""
    node = path / field_name if path.is_dir() else path
    text = _read(node)
    first = text.split()[0] if text else "0"
    if not (first.isascii() and first.isdigit() and len(first) <= 20 and int(first) <= MAX_COUNTER):
        raise SysfsError(f"{node}: not a counter: {first[:40]!r}")
    return int(first)


@dataclass
class SysfsCore:
    index: int  # local to the device
    path: Path
    memory: dict[str, int] = field(default_factory=dict)  # device_mem category -> bytes now
    memory_peak: dict[str, int] = field(default_factory=dict)
    status: dict[str, int] = field(default_factory=dict)  # status counter -> total
    other: dict[str, int] = field(default_factory=dict)  # other_info counter -> total
    errors: list[str] = field(default_factory=list)

    def monitor_memory(self) -> dict[str, int]:
        """Device memory in neuron-monitor's five categories (finer sysfs ones folded in)."""
        out = dict.fromkeys(("constants", "model_code", "model_shared_scratchpad", "runtime_memory",
                             "tensors"), 0)
        for name, value in self.memory.items():
            out[MONITOR_CATEGORY.get(name, "runtime_memory")] += value
        return out


@dataclass
class SysfsDevice:
    index: int
    path: Path
    core_count: int
    connected: tuple[int, ...] | None
    arch_type: str = ""
    instance_type: str = ""
    device_name: str = ""
    serial_number: str = ""
    hw_counters: dict[str, int] = field(default_factory=dict)
    host_memory: dict[str, int] = field(default_factory=dict)
    power: dict[str, str] | None = None
    pci_bdf: str | None = None
    numa_node: int | None = None
    cpu_affinity: str | None = None
    cores: list[SysfsCore] = field(default_factory=list)
    layout: str = "pre-2.31"
    errors: list[str] = field(default_factory=list)


def _optional_text(base: Path, documented: str, name: str, device: SysfsDevice) -> str:
    path, relocated = _find(base, documented, name)
    if path is None:
        return ""
    if relocated:
        device.layout = "relocated"
    try:
        return text(_read(path))  # shown on screens: printable, bounded
    except SysfsError as exc:
        device.errors.append(str(exc))
        return ""


def _read_core(device: SysfsDevice, index: int, path: Path) -> SysfsCore:
    core = SysfsCore(index, path)
    mem_base, _ = _find(path, "stats/memory_usage/device_mem", "device_mem")
    if mem_base is not None:
        for category in DEVICE_MEM_CATEGORIES:
            mem_node = mem_base / category
            if mem_node.exists():
                try:
                    core.memory[category] = _counter(mem_node)
                    if (mem_node / "peak").exists():
                        core.memory_peak[category] = _counter(mem_node, "peak")
                except SysfsError as exc:
                    core.errors.append(str(exc))
    status_base, _ = _find(path, "stats/status", "status")
    if status_base is not None and status_base.is_dir():
        for entry in sorted(os.listdir(status_base))[:MAX_DIR_ENTRIES]:
            try:
                core.status[STATUS_ALIASES.get(entry, entry)] = _counter(status_base / entry)
            except SysfsError as exc:
                core.errors.append(str(exc))
    for name in OTHER_INFO:
        node, relocated = _find(path, f"stats/other_info/{name}", name)
        if node is None:
            continue
        if relocated:
            device.layout = "relocated"
        try:
            core.other[name] = _counter(node)
        except SysfsError as exc:
            core.errors.append(str(exc))
    return core


def _pci_facts(device: SysfsDevice) -> None:
    """BDF, NUMA node and local CPUs when the device directory links to its PCI function."""
    link = device.path / "device"
    if not link.exists():
        return
    pci = link.resolve()
    if re.fullmatch(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]", pci.name):
        device.pci_bdf = pci.name.lower()
    try:
        node = int(_read(pci / "numa_node")[:12])
        device.numa_node = node if 0 <= node < 1 << 16 else None
    except (SysfsError, ValueError):
        pass
    with contextlib.suppress(SysfsError):
        device.cpu_affinity = _read(pci / "local_cpulist") or None


def read_device(index: int, path: Path) -> SysfsDevice:
    """Everything this module knows how to read about one device directory."""
    errors: list[str] = []
    core_count = 0
    try:
        text = _read(path / "core_count")
        if not (text.isascii() and text.isdigit() and len(text) <= 6 and int(text) <= MAX_CORES_PER_DEVICE):
            raise SysfsError(f"{path / 'core_count'}: {text[:40]!r} is not a core count "
                             f"(0..{MAX_CORES_PER_DEVICE})")
        core_count = int(text)
    except SysfsError as exc:
        errors.append(str(exc))
    connected: tuple[int, ...] | None = None
    if (path / "connected_devices").exists():
        try:
            text = _read(path / "connected_devices")
            parts = [x for x in re.split(r"[,\s]+", text) if x]
            if len(parts) > MAX_DEVICES or not all(x.isascii() and x.isdigit() and len(x) <= 6
                                                   and int(x) < MAX_DEVICES for x in parts):
                raise SysfsError(f"{path / 'connected_devices'}: not a list of device indices")
            connected = tuple(int(x) for x in parts) or None
        except SysfsError as exc:
            errors.append(str(exc))
    device = SysfsDevice(index=index, path=path, core_count=core_count, connected=connected, errors=errors)
    device.arch_type = _optional_text(path, "info/architecture/arch_type", "arch_type", device)
    device.instance_type = _optional_text(path, "info/architecture/instance_type", "instance_type", device)
    device.device_name = _optional_text(path, "info/architecture/device_name", "device_name", device)
    device.serial_number = _optional_text(path, "info/serial_number", "serial_number", device)
    for name in HW_COUNTERS:
        node, relocated = _find(path, f"stats/hardware/{name}", name)
        if node is None:
            continue
        device.layout = "relocated" if relocated else device.layout
        try:
            device.hw_counters[name] = _counter(node)
        except SysfsError as exc:
            device.errors.append(str(exc))
    host_base, _ = _find(path, "stats/memory_usage/host_mem", "host_mem")
    if host_base is not None:
        for category in HOST_MEM_CATEGORIES:
            if (host_base / category).exists():
                try:
                    device.host_memory[category] = _counter(host_base / category)
                except SysfsError as exc:
                    device.errors.append(str(exc))
    power_text = _optional_text(path, "stats/power/utilization", "utilization", device)
    if power_text:
        parts = [p.strip() for p in power_text.split(",")]
        if len(parts) == 5:
            device.power = dict(zip(("status", "timestamp", "min_power", "max_power", "avg_power"), parts))
    _pci_facts(device)
    cores = []
    for name in sorted(os.listdir(path))[:MAX_DIR_ENTRIES]:
        match = re.fullmatch(r"neuron_core(\d{1,3})", name)
        if match and int(match.group(1)) < MAX_CORES_PER_DEVICE and (path / name).is_dir():
            cores.append(_read_core(device, int(match.group(1)), path / name))
    device.cores = sorted(cores, key=lambda c: c.index)
    if not device.core_count:
        device.core_count = len(device.cores)
    return device


def read_devices(root: Path | None = None) -> list[SysfsDevice]:
    """All devices under the root, by index; empty when there is no tree."""
    root = root or sysfs_root()
    return [read_device(index, path) for index, path in _device_dirs(root)]


def driver_version(module_root: Path = Path("/sys/module/neuron")) -> str | None:
    try:
        return _read(module_root / "version")[:64] or None
    except SysfsError:
        return None


__all__ = ["DEFAULT_ROOT", "HW_COUNTERS", "MONITOR_CATEGORY", "SysfsCore", "SysfsDevice",
           "SysfsError", "driver_version", "present", "read_device", "read_devices", "sysfs_root"]
