"""Synthetic host-side placement of Neuron devices: PCI BDF, NUMA node and CPU affinity.

The real ``neuron-ls`` prints, per device, its PCI BDF, the CPUs its per-core proxy threads are pinned
to and its NUMA node (sys-tools.md §4.3, e.g. ``0000:cc:00.0``, ``48-95,144-191``, ``1``). No public
source gives these for every instance type, so they are generated here, deterministically, from the
instance's device and vCPU counts. None of it is a hardware fact; it only has to be stable, unique and
shaped like the real thing so that a ``neuron-ls`` built on the model prints plausible rows.

Assumptions [all synthetic]:

* Hosts with at least ``TWO_SOCKET_MIN_VCPUS`` vCPUs have two NUMA nodes (one per socket), smaller
  hosts one. Devices are split evenly over the nodes in index order (the first half on node 0).
* vCPUs are numbered as Linux numbers a two-socket host with SMT: the first half are one thread of
  each physical core, socket by socket, the second half their siblings. A NUMA node's affinity is
  therefore two ranges, ``0-47,96-143`` and ``48-95,144-191`` on a 192-vCPU host, which is exactly
  the pair the neuron-ls documentation shows for trn2.
* Each NUMA node gets its own window of PCI bus numbers (node 0 from 0x10, node 1 from 0x90); the
  devices of a node sit on evenly spaced buses of that window, device 00, function 0, domain 0000.
"""

from __future__ import annotations

TWO_SOCKET_MIN_VCPUS = 128  # inf2.48xlarge, trn1(n).32xlarge, trn2.48xlarge [assumption]
_BUS_WINDOW_START = (0x10, 0x90)  # first bus of NUMA node 0 and 1
_BUS_WINDOW_SIZE = 0x70


def numa_nodes(vcpus: int) -> int:
    """NUMA nodes of a host with ``vcpus`` vCPUs (two sockets on the big instances)."""
    return 2 if vcpus >= TWO_SOCKET_MIN_VCPUS else 1


def device_numa_node(device: int, devices: int, nodes: int) -> int:
    """Devices split evenly over the NUMA nodes in index order."""
    return device * nodes // devices


def cpu_list(numa_node: int, nodes: int, vcpus: int) -> tuple[int, ...]:
    """The vCPUs of one NUMA node: its physical cores' first threads, then their SMT siblings."""
    physical = vcpus // 2
    per_node = physical // nodes
    first = numa_node * per_node
    threads = range(first, first + per_node)
    return tuple(threads) + tuple(physical + cpu for cpu in threads)


def format_cpu_list(cpus: tuple[int, ...]) -> str:
    """Linux cpulist syntax: sorted, contiguous runs as ``a-b``, joined by commas (``0-3``)."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in runs)


def pci_bdf(device: int, devices: int, nodes: int) -> str:
    """Full PCI address (``0000:bb:00.0``) of a device; unique per host for up to 16 per node."""
    node = device_numa_node(device, devices, nodes)
    first_of_node = next(d for d in range(devices) if device_numa_node(d, devices, nodes) == node)
    per_node = sum(1 for d in range(devices) if device_numa_node(d, devices, nodes) == node)
    step = max(1, min(0x10, _BUS_WINDOW_SIZE // per_node))
    bus = _BUS_WINDOW_START[node] + (device - first_of_node) * step
    return f"0000:{bus:02x}:00.0"
