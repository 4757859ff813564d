"""What Neuron hardware this host has: real devices from sysfs, else the configured simulated instance.

neuron-ls and neuron-monitor both start from this one answer, so they never disagree about device
counts, core numbering, memory sizes or wiring. On a real host (the driver's sysfs tree exists) the
devices, core counts, wiring and PCI placement come from sysfs; facts sysfs does not carry (memory
size per device, chip generation names) come from ``neuroncore.hardware`` by chip. Otherwise the
inventory is ``neuroncore.topology.instance_topology`` of the configured instance type.

Logical cores: on trn2 the runtime groups physical cores by ``NEURON_LOGICAL_NC_CONFIG`` (LNC, 1 or
2, default 2); elsewhere a logical core is a physical core (sys-tools.md §1.9, neuroncore.md §1.3).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from collectors import sysfs
from neuroncore.config import default_instance
from neuroncore.hardware import INFERENTIA2, INSTANCE_TYPES, TRAINIUM1, TRAINIUM2, ChipSpec
from neuroncore.topology import instance_topology, resolve_lnc
from neuronscope import settings

DMI_PRODUCT = Path("/sys/devices/virtual/dmi/id/product_name")

# neuron_hardware_info values by chip (sys-tools.md §1.9)
_DEVICE_TYPE = {INFERENTIA2.name: "inferentia2", TRAINIUM1.name: "trainium", TRAINIUM2.name: "trainium2"}
_DEVICE_VERSION = {INFERENTIA2.name: "v3", TRAINIUM1.name: "v2", TRAINIUM2.name: "v4"}


class InventoryError(ValueError):
    """The inventory cannot be built (unknown instance type, bad LNC setting)."""


@dataclass(frozen=True)
class DeviceInfo:
    """One device as neuron-ls lists it."""

    index: int
    cores: int  # logical cores
    core_ids: tuple[int, ...]  # global logical core ids
    memory_bytes: int
    connected: tuple[int, ...] | None  # None: not wired to other devices
    pci_bdf: str | None  # full form 0000:bb:dd.f
    cpu_affinity: str | None
    numa_node: int | None

    @property
    def short_bdf(self) -> str | None:
        if self.pci_bdf and self.pci_bdf.count(":") == 2:
            return self.pci_bdf.split(":", 1)[1]
        return self.pci_bdf


@dataclass(frozen=True)
class Inventory:
    source: str  # "simulated" or "sysfs"
    instance_type: str
    lnc: int
    topology: str  # "ring", "torus-4x4", "none"
    chip: ChipSpec
    devices: tuple[DeviceInfo, ...]
    sysfs_devices: tuple[sysfs.SysfsDevice, ...] = ()
    driver_version: str | None = None
    error: str = ""

    @property
    def physical_cores_per_device(self) -> int:
        return self.chip.cores_per_chip

    @property
    def cores_per_device(self) -> int:
        return self.chip.cores_per_chip // self.lnc

    @property
    def device_memory_bytes(self) -> int:
        return self.chip.hbm_bytes

    @property
    def device_type(self) -> str:
        return _DEVICE_TYPE.get(self.chip.name, self.chip.name.lower())

    @property
    def device_version(self) -> str:
        return _DEVICE_VERSION.get(self.chip.name, "")

    @property
    def core_version(self) -> str:
        if self.chip.core.generation == 3:
            return "v3d" if self.lnc == 2 else "v3"
        return f"v{self.chip.core.generation}"

    def logical_core(self, physical: int, generation: int) -> int:
        """Logical index of a process's physical core; other generations keep their numbering."""
        if generation == self.chip.core.generation and self.lnc > 1:
            return physical // self.lnc
        return physical

    def hardware_info(self) -> dict:
        """neuron-monitor's ``neuron_hardware_info`` (sys-tools.md §1.9)."""
        return {
            "neuron_device_type": self.device_type,
            "neuron_device_version": self.device_version,
            "neuroncore_version": self.core_version,
            "neuron_device_count": len(self.devices),
            "neuron_device_memory_size": self.device_memory_bytes,
            "neuroncore_per_device_count": self.cores_per_device,
            "logical_neuroncore_config": self.lnc,
            "error": self.error,
        }


def _lnc_setting() -> int | None:
    try:
        return settings.LOGICAL_NC_CONFIG.get()
    except settings.SettingError:
        lnc = settings.LOGICAL_NC_CONFIG
        raise InventoryError(f"{lnc.name}={lnc.raw()!r} is not 1 or 2") from None


def simulated(instance: str | None = None) -> Inventory:
    """The configured (or given) simulated instance."""
    try:
        name = instance or default_instance()
        if name not in INSTANCE_TYPES:
            raise ValueError(f"unknown instance type {name!r}; known: {', '.join(sorted(INSTANCE_TYPES))}")
        spec = INSTANCE_TYPES[name]
        lnc = resolve_lnc(spec, _lnc_setting() if spec.lnc_choices else None)
        topo = instance_topology(name, lnc=lnc)
    except ValueError as exc:
        raise InventoryError(str(exc)) from None
    devices = tuple(DeviceInfo(
        index=d.local_index, cores=len(d.logical_cores), core_ids=tuple(d.logical_cores),
        memory_bytes=d.hbm_bytes, connected=d.connected_devices or None, pci_bdf=d.pci_bdf,
        cpu_affinity=d.cpu_affinity, numa_node=d.numa_node) for d in topo.devices)
    return Inventory("simulated", name, lnc, spec.topology, spec.chip, devices)


def _chip_of(device: sysfs.SysfsDevice) -> ChipSpec | None:
    text = f"{device.device_name} {device.instance_type} {device.arch_type}".lower()
    if "inferentia2" in text or "inf2" in text:
        return INFERENTIA2
    if "trainium2" in text or "trn2" in text or "v3" in device.arch_type.lower():
        return TRAINIUM2
    if "trainium" in text or "trn1" in text:
        return TRAINIUM1
    return None


def _instance_type(chip: ChipSpec, count: int, dmi: Path) -> str:
    try:
        product = dmi.read_text().strip()
    except OSError:
        product = ""
    if product in INSTANCE_TYPES:
        return product
    for name, spec in INSTANCE_TYPES.items():  # first type with this chip and device count
        if spec.chip is chip and spec.chips == count:
            return name
    return product or f"unknown ({count} x {chip.name})"


def from_sysfs(root: Path | None = None, dmi: Path = DMI_PRODUCT) -> Inventory:
    """The real devices under the sysfs root."""
    devices = sysfs.read_devices(root)
    if not devices:
        raise InventoryError(f"no Neuron devices under {root or sysfs.sysfs_root()}")
    chip = next((c for c in map(_chip_of, devices) if c is not None), None)
    errors = sorted({e for d in devices for e in d.errors})
    if chip is None:
        chip = TRAINIUM1 if devices[0].core_count == 2 else TRAINIUM2
        errors.append("device generation not found in sysfs (info/architecture); assumed " + chip.name)
    instance = _instance_type(chip, len(devices), dmi)
    spec = INSTANCE_TYPES.get(instance)
    lnc = 1
    if chip.core.generation == 3:
        setting = _lnc_setting()
        lnc = setting if setting in (1, 2) else 2
    physical = devices[0].core_count or chip.cores_per_chip
    logical = max(physical // lnc, 1)
    infos = tuple(DeviceInfo(
        index=d.index, cores=logical, core_ids=tuple(range(d.index * logical, (d.index + 1) * logical)),
        memory_bytes=chip.hbm_bytes, connected=d.connected, pci_bdf=d.pci_bdf, cpu_affinity=d.cpu_affinity,
        numa_node=d.numa_node) for d in devices)
    topology = spec.topology if spec else ("none" if len(devices) == 1 else "ring")
    return Inventory("sysfs", instance, lnc, topology, chip, infos, tuple(devices), sysfs.driver_version(),
                     "; ".join(errors))


def discover(instance: str | None = None) -> Inventory:
    """Real devices when the sysfs tree exists and no instance was asked for, else the simulated one."""
    if instance is None and sysfs.present():
        return from_sysfs()
    return simulated(instance)


__all__ = ["DeviceInfo", "Inventory", "InventoryError", "discover", "from_sysfs", "simulated"]
