"""Instance topologies: devices, their cores, the chip-to-chip links and the routes between them.

    topo = instance_topology("trn1.32xlarge")            # 16 chips, 4x4 2D torus, 32 NeuronLinks
    topo = instance_topology("trn2.48xlarge", lnc=1)     # 128 logical cores instead of 64
    topo = instance_topology("trn1.32xlarge", nodes=4)   # 4 instances joined by EFA
    topo.path(0, 9)                                      # channels a transfer from core 0 to 9 crosses

Facts come from ``neuroncore.hardware`` (neuroncore.md §1.2-§1.4); this module only builds the graph.

Vocabulary:

* **rank** = a *logical* core, numbered globally (node by node, device by device) as
  ``NEURON_RT_VISIBLE_CORES`` and neuron-ls' ``NEURON CORE IDS`` number them. Under LNC=2 on trn2 a
  rank is a pair of physical cores (§1.3); elsewhere a rank is one physical core.
* **link** = one chip-to-chip wire ``(device a, device b, port)``; ``port`` numbers parallel links
  joining the same pair. EFA network interfaces are links too, from a device to ``NETWORK``.
* **channel** = one direction of a link (``2 * link + 0`` for a->b, ``+ 1`` for b->a), plus one
  on-chip channel per rank. Channels are what transfers share: a channel's bandwidth is split among
  the flows crossing it (``neuroncore.collectives``).

Assumptions, each a parameter of ``instance_topology``:

* Per-link bandwidth = the published per-chip NeuronLink figure / the chip's link count (§1.4,
  "assumes an even split"). Whether the figure is per direction or the sum of both is not published
  (§1.4, §12 item 4): ``link_bandwidth_per_direction=True`` (default) reads it as the bandwidth of
  each direction (full-duplex links, both directions at once); ``False`` reads it as the sum, so
  each direction gets half.
* Inf2's figure is headed "GiB/sec/chip" and is used as GiB (192 x 2^30 B/s); trn1/trn2 figures are
  GB (§1.6). Pass ``neuronlink_bytes_per_s_per_chip`` to read it otherwise (e.g. ``192e9``).
* Two cores of one chip exchange data through the chip's HBM, moved by the sending core's DMA
  engines: the on-chip channel of a rank runs at its DMA ceiling (``CoreSpec.dma_bytes_per_s``, 272
  GB/s on NC-v2, §5.1/§11), times the physical cores per rank under LNC. NeuronLink transfers are
  not charged against that ceiling (a core drives at most 2-4 links of 96-256 GB/s).
* EFA: the instance's EFA bandwidth split evenly over its chips (§1.4, 50 Gbps per chip on
  trn1.32xlarge), full duplex; each chip reaches the network through its own share, so a transfer
  between nodes crosses the sender's EFA transmit channel and the receiver's receive channel.
* Routes are shortest paths: the shorter way round a ring (ties go forward), dimension-ordered on the
  torus (along the row first, then the column). Routes within one node never leave it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import numpy as np

from neuroncore import chipgraph, hostlayout
from neuroncore.config import default_instance
from neuroncore.hardware import INSTANCE_TYPES, InstanceSpec

NEURONLINK = "NeuronLink"
EFA = "EFA"
ON_CHIP = "on-chip"
NETWORK = -1  # the far end of an EFA link
KIND_CODES = {ON_CHIP: 0, NEURONLINK: 1, EFA: 2}  # ordered by step latency, cheapest first


@dataclass(frozen=True)
class Link:
    """One chip-to-chip link (or an EFA interface, ``b == NETWORK``), with its per-direction rate."""

    index: int
    a: int  # global device index
    b: int  # global device index, or NETWORK
    port: int  # 0, 1, ... among links joining the same pair of devices
    kind: str
    bytes_per_s_per_direction: float

    def channel(self, direction: int) -> int:
        """Channel id of one direction: 0 = a -> b (EFA: transmit), 1 = b -> a (EFA: receive)."""
        return 2 * self.index + direction


@dataclass(frozen=True)
class Channel:
    """One direction of a link, or the on-chip path out of one rank: the unit of bandwidth sharing."""

    index: int
    kind: str
    src: int  # sending device (NETWORK for EFA receive)
    dst: int  # receiving device (NETWORK for EFA transmit)
    link: int  # -1 for on-chip channels
    direction: int
    rank: int  # on-chip channels: the sending rank; -1 otherwise
    bytes_per_s: float

    @property
    def label(self) -> str:
        if self.kind == ON_CHIP:
            return f"on-chip core {self.rank} (device {self.src})"
        if self.kind == EFA:
            if self.direction == 0:
                return f"EFA tx device {self.src}"
            return f"EFA rx device {self.dst}"
        return f"NeuronLink {self.src}->{self.dst} link {self.link}"


@dataclass(frozen=True)
class Device:
    """One Neuron device (chip) as neuron-ls lists it, plus its global place in a multi-node topology."""

    index: int  # global: node * devices_per_node + local_index
    node: int
    local_index: int  # neuron-ls NEURON DEVICE
    logical_cores: range  # global rank ids (neuron-ls NEURON CORE IDS on node 0)
    physical_cores: range  # global physical core ids
    hbm_bytes: int
    connected_devices: tuple[int, ...]  # local indices, driver order (neuron-ls CONNECTED DEVICES)
    pci_bdf: str  # full form, 0000:bb:00.0
    numa_node: int
    cpu_affinity: str  # Linux cpulist, e.g. 0-47,96-143

    @property
    def short_bdf(self) -> str:
        """The BDF without its domain, as neuron-ls' process layout and JSON show it (``cc:00.0``)."""
        return self.pci_bdf.split(":", 1)[1]


@dataclass(frozen=True, eq=False)
class Topology:
    """Devices, links and routes of one instance, or of ``nodes`` instances joined by EFA."""

    instance: InstanceSpec
    nodes: int
    lnc: int
    devices: tuple[Device, ...]
    links: tuple[Link, ...]
    on_chip_bytes_per_s: float
    link_bandwidth_per_direction: bool
    _node_routes: tuple[tuple[tuple[int, ...], ...], ...] = field(repr=False)  # local channel ids
    _node_cycles: tuple[tuple[int, ...], ...] = field(repr=False)  # Hamiltonian device cycles

    # -- inventory ------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.instance.name if self.nodes == 1 else f"{self.nodes}x {self.instance.name}"

    @property
    def devices_per_node(self) -> int:
        return self.instance.chips

    @property
    def physical_cores_per_device(self) -> int:
        return self.instance.chip.cores_per_chip

    @property
    def cores_per_device(self) -> int:
        """Logical cores (ranks) per device: physical cores / LNC (§1.3)."""
        return self.physical_cores_per_device // self.lnc

    @property
    def cores(self) -> int:
        """Logical cores (ranks) in the whole topology."""
        return len(self.devices) * self.cores_per_device

    @property
    def physical_cores(self) -> int:
        return len(self.devices) * self.physical_cores_per_device

    @property
    def vcpus(self) -> int:
        """Host vCPUs of one node (§1.2)."""
        return self.instance.vcpus

    @property
    def host_memory_bytes(self) -> int:
        """Host memory of one node (§1.2)."""
        return self.instance.host_memory_bytes

    @property
    def links_per_node(self) -> int:
        """NeuronLinks of one node (node k's are ``links[k * links_per_node:]``; EFA links last)."""
        return len(self.neuronlinks) // self.nodes

    @property
    def neuronlinks(self) -> tuple[Link, ...]:
        return tuple(link for link in self.links if link.kind == NEURONLINK)

    @property
    def efa_links(self) -> tuple[Link, ...]:
        return tuple(link for link in self.links if link.kind == EFA)

    def device_of(self, rank: int) -> int:
        """Global device index of a rank (logical core)."""
        self.check_ranks([rank])
        return rank // self.cores_per_device

    def device(self, rank: int) -> Device:
        return self.devices[self.device_of(rank)]

    def physical_cores_of(self, rank: int) -> range:
        """The physical cores a logical core is made of (two under LNC=2, §1.3)."""
        self.check_ranks([rank])
        return range(rank * self.lnc, (rank + 1) * self.lnc)

    def neighbours(self, device: int) -> tuple[int, ...]:
        """Global indices of the devices wired to ``device`` by NeuronLink, in driver order."""
        base = self.devices[device].node * self.devices_per_node
        return tuple(base + d for d in self.devices[device].connected_devices)

    def neuronlink_egress_bytes_per_s(self, device: int = 0) -> float:
        """Bandwidth out of one device over all its NeuronLinks: the ceiling of its ring traffic."""
        return sum(c.bytes_per_s for c in self.channels if c.kind == NEURONLINK and c.src == device)

    def check_ranks(self, ranks: Iterable[int]) -> None:
        """Raise ValueError naming the first rank that is not a logical core of this topology."""
        for rank in ranks:
            if not isinstance(rank, (int, np.integer)) or not 0 <= rank < self.cores:
                lnc = f" at LNC={self.lnc}" if self.instance.lnc_choices else ""
                raise ValueError(
                    f"core {rank!r} does not exist on {self.name}{lnc}: its logical cores are "
                    f"0..{self.cores - 1}")

    # -- channels -------------------------------------------------------------------------------

    @cached_property
    def channels(self) -> tuple[Channel, ...]:
        """Both directions of every link (``2 * link + direction``), then one on-chip channel per rank."""
        out: list[Channel] = []
        for link in self.links:
            rate = link.bytes_per_s_per_direction
            out.append(Channel(2 * link.index, link.kind, link.a, link.b, link.index, 0, -1, rate))
            out.append(Channel(2 * link.index + 1, link.kind, link.b, link.a, link.index, 1, -1, rate))
        base = 2 * len(self.links)
        for rank in range(self.cores):
            device = rank // self.cores_per_device
            out.append(Channel(base + rank, ON_CHIP, device, device, -1, 0, rank,
                               self.on_chip_bytes_per_s))
        return tuple(out)

    @cached_property
    def channel_bytes_per_s(self) -> np.ndarray:
        return np.array([c.bytes_per_s for c in self.channels], dtype=np.float64)

    @cached_property
    def channel_kind_code(self) -> np.ndarray:
        """``KIND_CODES`` of each channel (0 on-chip, 1 NeuronLink, 2 EFA)."""
        return np.array([KIND_CODES[c.kind] for c in self.channels], dtype=np.int8)

    def on_chip_channel(self, rank: int) -> int:
        return 2 * len(self.links) + rank

    # -- routes ---------------------------------------------------------------------------------

    def route(self, device_a: int, device_b: int) -> tuple[int, ...]:
        """Channel ids of the shortest path from one device to another (empty for the same device)."""
        return _route(self, device_a, device_b)

    def path(self, rank_a: int, rank_b: int) -> tuple[Channel, ...]:
        """Channels a transfer from rank a to rank b crosses: none to itself, the sender's on-chip
        channel between cores of one device, else the NeuronLink (or EFA) route of their devices."""
        self.check_ranks([rank_a, rank_b])
        if rank_a == rank_b:
            return ()
        da, db = rank_a // self.cores_per_device, rank_b // self.cores_per_device
        if da == db:
            return (self.channels[self.on_chip_channel(rank_a)],)
        return tuple(self.channels[c] for c in self.route(da, db))

    def ring_cycles(self) -> tuple[tuple[int, ...], ...]:
        """Device orders (Hamiltonian cycles of one node, repeated node after node) for ring algorithms.

        A ring topology has one cycle (used in both directions); the 4x4 torus has two cycles that
        share no link, so together (and each in both directions) they use every wire (§6)."""
        d = self.devices_per_node
        return tuple(tuple(node * d + dev for node in range(self.nodes) for dev in cycle)
                     for cycle in self._node_cycles)


@lru_cache(maxsize=65536)
def _route(topo: Topology, device_a: int, device_b: int) -> tuple[int, ...]:
    n = len(topo.devices)
    if not (0 <= device_a < n and 0 <= device_b < n):
        raise ValueError(f"{topo.name} has devices 0..{n - 1}, not {device_a}/{device_b}")
    if device_a == device_b:
        return ()
    per = topo.devices_per_node
    node_a, node_b = device_a // per, device_b // per
    if node_a != node_b:
        efa_base = len(topo.links) - len(topo.devices)  # EFA links come last, one per device
        return (2 * (efa_base + device_a), 2 * (efa_base + device_b) + 1)
    offset = 2 * node_a * topo.links_per_node
    return tuple(offset + c for c in topo._node_routes[device_a % per][device_b % per])


# -- builders ------------------------------------------------------------------------------------


def resolve_instance(name: str | None) -> InstanceSpec:
    """The spec of an instance type (the configured default when ``name`` is None)."""
    name = name or default_instance()
    if name not in INSTANCE_TYPES:
        raise ValueError(f"unknown instance type {name!r}; known: {', '.join(sorted(INSTANCE_TYPES))}")
    return INSTANCE_TYPES[name]


def resolve_lnc(spec: InstanceSpec, lnc: int | None) -> int:
    """Check an LNC setting against the instance (§1.3: trn2 only, 1 or 2; default 2)."""
    if lnc is None:
        return spec.default_lnc
    if not spec.lnc_choices:
        if lnc == 1:
            return 1
        raise ValueError(
            f"{spec.name} has no Logical NeuronCore (LNC) setting (only trn2 has one, neuroncore.md "
            f"§1.3); got lnc={lnc!r}")
    if lnc not in spec.lnc_choices:
        choices = " or ".join(str(c) for c in spec.lnc_choices)
        raise ValueError(f"LNC on {spec.name} must be {choices}, not {lnc!r}")
    return lnc


def instance_topology(
    instance: str | None = None,
    *,
    nodes: int = 1,
    lnc: int | None = None,
    link_bandwidth_per_direction: bool = True,
    neuronlink_bytes_per_s_per_chip: float | None = None,
    on_chip_bytes_per_s: float | None = None,
    efa_bytes_per_s_per_chip: float | None = None,
) -> Topology:
    """The topology of an instance type (default: the configured instance), or of ``nodes`` of them.

    ``lnc`` applies to trn2 only (1 or 2, default 2). The bandwidth overrides replace the figures
    described in the module docstring; results are cached, so equal arguments give the same object."""
    return _build(instance or default_instance(), nodes, lnc, link_bandwidth_per_direction,
                  neuronlink_bytes_per_s_per_chip, on_chip_bytes_per_s, efa_bytes_per_s_per_chip)


@lru_cache(maxsize=64)
def _build(instance: str, nodes: int, lnc: int | None, per_direction: bool,
           link_per_chip: float | None, on_chip: float | None, efa_per_chip: float | None) -> Topology:
    spec = resolve_instance(instance)
    lnc = resolve_lnc(spec, lnc)
    if not isinstance(nodes, int) or nodes < 1:
        raise ValueError(f"nodes must be a positive integer, not {nodes!r}")
    if nodes > 1 and not (efa_per_chip or spec.efa_bits_per_s):
        raise ValueError(f"{spec.name} has no EFA network (neuroncore.md §1.2), so {nodes} of them "
                         "cannot be joined into one topology")
    n = spec.chips
    pairs: list[tuple[int, int]]
    cycles: tuple[tuple[int, ...], ...]
    routes: list[list[list[int]]]
    connected: list[tuple[int, ...]]
    if spec.topology == "ring":
        pairs, cycles = chipgraph.ring_links(n), (tuple(range(n)),)
        routes = [[chipgraph.ring_route(n, a, b) for b in range(n)] for a in range(n)]
        connected = [((d + 1) % n, (d - 1) % n) for d in range(n)]
    elif spec.topology == "torus-4x4":
        rows = cols = 4
        pairs, cycles = chipgraph.torus_links(rows, cols), chipgraph.torus_cycles(rows, cols)
        routes = [[chipgraph.torus_route(rows, cols, a, b) for b in range(n)] for a in range(n)]
        connected = [chipgraph.torus_connected(rows, cols, d) for d in range(n)]
    elif spec.topology == "none":
        pairs, cycles, routes, connected = [], ((0,),), [[[]]], [()]
    else:
        raise ValueError(f"{spec.name}: unknown chip topology {spec.topology!r}")

    per_link = (link_per_chip or spec.neuronlink_bytes_per_s_per_chip) / spec.chip.neuronlink_links
    if not per_direction:
        per_link /= 2
    links: list[Link] = []
    for node in range(nodes):
        base = node * n
        seen: dict[frozenset[int], int] = {}
        for a, b in pairs:
            key = frozenset((a, b))
            port = seen.get(key, 0)
            seen[key] = port + 1
            links.append(Link(len(links), base + a, base + b, port, NEURONLINK, per_link))
    if nodes > 1:
        efa = efa_per_chip or spec.efa_bytes_per_s_per_chip
        for d in range(nodes * n):
            links.append(Link(len(links), d, NETWORK, 0, EFA, efa))

    numa = hostlayout.numa_nodes(spec.vcpus)
    logical_per_device = spec.chip.cores_per_chip // lnc
    devices = []
    for node in range(nodes):
        for d in range(n):
            g = node * n + d
            numa_node = hostlayout.device_numa_node(d, n, numa)
            devices.append(Device(
                index=g, node=node, local_index=d,
                logical_cores=range(g * logical_per_device, (g + 1) * logical_per_device),
                physical_cores=range(g * spec.chip.cores_per_chip, (g + 1) * spec.chip.cores_per_chip),
                hbm_bytes=spec.chip.hbm_bytes,
                connected_devices=tuple(connected[d]),
                pci_bdf=hostlayout.pci_bdf(d, n, numa),
                numa_node=numa_node,
                cpu_affinity=hostlayout.format_cpu_list(hostlayout.cpu_list(numa_node, numa, spec.vcpus)),
            ))
    return Topology(
        instance=spec, nodes=nodes, lnc=lnc, devices=tuple(devices), links=tuple(links),
        on_chip_bytes_per_s=on_chip or lnc * spec.chip.core.dma_bytes_per_s,
        link_bandwidth_per_direction=per_direction,
        _node_routes=tuple(tuple(tuple(r) for r in row) for row in routes),
        _node_cycles=cycles,
    )
