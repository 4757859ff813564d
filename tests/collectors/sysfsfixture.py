"""Fixture trees shaped like the Neuron driver's sysfs (sys-tools.md §5.1, pre-2.31 layout).

``make_sysfs`` builds ``neuron<N>/`` directories with the documented nodes, a PCI function each
(``device`` symlink to a directory with ``numa_node`` and ``local_cpulist``, as the kernel links a
device to its PCI function), counters as ``total``/``present`` directories and memory counters with
``peak``. ``relocated=True`` moves the nodes to other (made-up) paths, standing in for the
undocumented driver 2.31 layout that readers must find by name.
"""

from __future__ import annotations

from pathlib import Path


def torus_neighbours(d: int) -> list[int]:
    r, c = divmod(d, 4)
    return [((r - 1) % 4) * 4 + c, r * 4 + (c - 1) % 4, ((r + 1) % 4) * 4 + c, r * 4 + (c + 1) % 4]


def _counter(path: Path, total: int, peak: int | None = None) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "total").write_text(f"{total}\n")
    (path / "present").write_text("0\n")
    if peak is not None:
        (path / "peak").write_text(f"{peak}\n")


def make_sysfs(
    root: Path,
    *,
    devices: int = 16,
    cores: int = 2,
    device_name: str = "Trainium1",
    family: str = "Trn1",
    arch: str = "NCv2",
    relocated: bool = False,
    connected: bool = True,
) -> Path:
    tree = root / "neuron_device"
    pci_root = root / "pci"
    for d in range(devices):
        dev = tree / f"neuron{d}"
        (dev / "power").mkdir(parents=True)  # kernel runtime-PM directory: not Neuron power
        (dev / "power" / "control").write_text("auto\n")
        (dev / "core_count").write_text(f"{cores}\n")
        if connected and devices == 16:
            (dev / "connected_devices").write_text(", ".join(map(str, torus_neighbours(d))) + "\n")
        elif connected and devices > 1:
            (dev / "connected_devices").write_text(f"{(d + 1) % devices}, {(d - 1) % devices}\n")
        info = dev / ("info" if not relocated else "identity")
        arch_dir = info / "architecture"
        arch_dir.mkdir(parents=True)
        (arch_dir / "arch_type").write_text(f"{arch}\n")
        (arch_dir / "instance_type").write_text(f"{family}\n")
        (arch_dir / "device_name").write_text(f"{device_name}\n")
        (info / "serial_number").write_text(f"{0x1000 + d:016x}\n")
        hw = dev / ("stats/hardware" if not relocated else "health/ecc")
        hw.mkdir(parents=True)
        for name in ("mem_ecc_uncorrected", "mem_ecc_repairable_uncorrected", "sram_ecc_uncorrected"):
            (hw / name).write_text("0\n")
        for category, value in (("application_memory", 4096), ("dma_buffers", 8192)):
            _counter(dev / "stats/memory_usage/host_mem" / category, value, value)
        power = dev / "stats/power"
        power.mkdir(parents=True)
        (power / "utilization").write_text("POWER_STATUS_VALID,1795239660,31.25,47.80,39.12\n")
        bus = 0x10 + d
        pci = pci_root / f"0000:{bus:02x}:00.0"
        pci.mkdir(parents=True)
        (pci / "numa_node").write_text(f"{0 if d < devices // 2 else 1}\n")
        (pci / "local_cpulist").write_text("0-31,64-95\n" if d < devices // 2 else "32-63,96-127\n")
        (dev / "device").symlink_to(pci)
        for k in range(cores):
            core = dev / f"neuron_core{k}"
            stats = core / "stats"
            _counter(stats / "memory_usage/device_mem/constants", 1 << 30, 1 << 30)
            _counter(stats / "memory_usage/device_mem/tensors", 1 << 29, 1 << 30)
            _counter(stats / "memory_usage/device_mem/dma_rings", 1 << 20, 1 << 20)
            _counter(stats / "status/success", 100 + k)
            _counter(stats / "status/infer_failed_to_queue", 1)
            other = stats / ("other_info" if not relocated else "misc")
            _counter(other / "flop_count", 10**12)
            other.mkdir(parents=True, exist_ok=True)
            (other / "nc_time_in_use").write_text("5000\n")  # the plain-file form
            (core / "info/architecture").mkdir(parents=True)
            (core / "info/architecture/arch_type").write_text(f"{arch}\n")
    return tree


def set_counter(tree: Path, device: int, name: str, value: int) -> None:
    matches = sorted((tree / f"neuron{device}").rglob(name))
    matches[0].write_text(f"{value}\n")
