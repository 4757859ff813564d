"""Instance topologies (neuroncore.topology) against neuroncore.md §1.2-§1.4 and sys-tools.md §4."""

from __future__ import annotations

import itertools
import re
from collections import deque

import pytest

from neuroncore import Instance, hostlayout
from neuroncore.hardware import INSTANCE_TYPES
from neuroncore.topology import EFA, NETWORK, NEURONLINK, ON_CHIP, instance_topology

GIB = 2**30

# name: devices, physical cores/device, logical cores/device (default LNC), HBM GiB/device,
#       vCPUs, host GiB, NeuronLinks, neighbours per device       (neuroncore.md §1.1, §1.2, §1.4)
INVENTORY = {
    "inf2.xlarge": (1, 2, 2, 32, 4, 16, 0, 0),
    "inf2.8xlarge": (1, 2, 2, 32, 32, 128, 0, 0),
    "inf2.24xlarge": (6, 2, 2, 32, 96, 384, 6, 2),
    "inf2.48xlarge": (12, 2, 2, 32, 192, 768, 12, 2),
    "trn1.2xlarge": (1, 2, 2, 32, 8, 32, 0, 0),
    "trn1.32xlarge": (16, 2, 2, 32, 128, 512, 32, 4),
    "trn1n.32xlarge": (16, 2, 2, 32, 128, 512, 32, 4),
    "trn2.48xlarge": (16, 8, 4, 96, 192, 2048, 32, 4),
}


def test_every_instance_type_has_an_inventory_row():
    assert set(INVENTORY) == set(INSTANCE_TYPES)


@pytest.mark.parametrize("name", sorted(INVENTORY))
def test_inventory(name):
    devices, physical, logical, hbm_gib, vcpus, host_gib, links, neighbours = INVENTORY[name]
    topo = instance_topology(name)
    assert topo.name == name and topo.nodes == 1
    assert len(topo.devices) == devices
    assert topo.physical_cores_per_device == physical
    assert topo.cores_per_device == logical
    assert topo.cores == devices * logical
    assert topo.physical_cores == devices * physical
    assert topo.vcpus == vcpus
    assert topo.host_memory_bytes == host_gib * GIB
    assert len(topo.neuronlinks) == links
    assert not topo.efa_links  # one instance: no network links
    for device in topo.devices:
        assert device.hbm_bytes == hbm_gib * GIB
        assert len(device.logical_cores) == logical and len(device.physical_cores) == physical
        assert len(set(topo.neighbours(device.index))) == neighbours
        assert len(device.connected_devices) == neighbours


@pytest.mark.parametrize(("lnc", "logical_per_device"), [(1, 8), (2, 4)])
def test_trn2_logical_cores_under_lnc(lnc, logical_per_device):
    topo = instance_topology("trn2.48xlarge", lnc=lnc)
    assert topo.lnc == lnc
    assert topo.cores_per_device == logical_per_device
    assert topo.cores == 16 * logical_per_device  # 128 at LNC=1, 64 at LNC=2 (§1.3)
    assert topo.physical_cores == 128
    # a logical core is lnc consecutive physical cores of one device
    for rank in (0, 5, topo.cores - 1):
        physical = topo.physical_cores_of(rank)
        assert len(physical) == lnc
        owner = topo.devices[topo.device_of(rank)].physical_cores
        assert all(p in owner for p in physical)
    assert instance_topology("trn2.48xlarge").lnc == 2  # the default (§1.3)


def test_device_core_ranges_tile_the_instance():
    topo = instance_topology("trn2.48xlarge")
    assert [r for d in topo.devices for r in d.logical_cores] == list(range(64))
    assert [p for d in topo.devices for p in d.physical_cores] == list(range(128))
    assert topo.devices[3].logical_cores == range(12, 16)  # neuron-ls NEURON CORE IDS 12-15


# -- links ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "per_direction_bytes_per_s"),
    [
        ("inf2.24xlarge", 192 * GIB / 2),  # 192 GiB/s per chip over 2 links (§1.4, GiB as headed)
        ("inf2.48xlarge", 192 * GIB / 2),
        ("trn1.32xlarge", 96e9),  # 384 GB/s / 4 (§1.4)
        ("trn1n.32xlarge", 192e9),  # 768 GB/s / 4 (§1.2 unlabelled column)
        ("trn2.48xlarge", 256e9),  # 1,024 GB/s / 4 (§1.4)
    ],
)
def test_link_bandwidth_per_direction(name, per_direction_bytes_per_s):
    topo = instance_topology(name)
    assert {link.bytes_per_s_per_direction for link in topo.neuronlinks} == {per_direction_bytes_per_s}
    # reading the per-chip figure as the sum of both directions halves each direction
    both = instance_topology(name, link_bandwidth_per_direction=False)
    assert both.neuronlinks[0].bytes_per_s_per_direction == pytest.approx(per_direction_bytes_per_s / 2)


def test_inf2_link_unit_is_a_parameter():
    topo = instance_topology("inf2.48xlarge", neuronlink_bytes_per_s_per_chip=192e9)
    assert topo.neuronlinks[0].bytes_per_s_per_direction == 96e9


def test_ring_of_12():
    topo = instance_topology("inf2.48xlarge")
    pairs = {frozenset((link.a, link.b)) for link in topo.neuronlinks}
    assert pairs == {frozenset((i, (i + 1) % 12)) for i in range(12)}
    assert all(link.port == 0 and link.kind == NEURONLINK for link in topo.neuronlinks)
    for d in range(12):
        assert set(topo.neighbours(d)) == {(d + 1) % 12, (d - 1) % 12}
        assert sum(d in (link.a, link.b) for link in topo.neuronlinks) == 2


def test_torus_4x4():
    topo = instance_topology("trn1.32xlarge")
    pairs = [frozenset((link.a, link.b)) for link in topo.neuronlinks]
    assert len(pairs) == len(set(pairs)) == 32
    for d in range(16):
        r, c = divmod(d, 4)
        expected = {((r - 1) % 4) * 4 + c, ((r + 1) % 4) * 4 + c, r * 4 + (c - 1) % 4, r * 4 + (c + 1) % 4}
        assert set(topo.neighbours(d)) == expected
        assert sum(d in pair for pair in pairs) == 4


def test_connected_devices_in_driver_order():
    # neuron-ls: [up, left, down, right]; device 0 -> "12, 3, 4, 1", device 5 -> "1, 4, 9, 6"
    topo = instance_topology("trn2.48xlarge")
    assert topo.devices[0].connected_devices == (12, 3, 4, 1)
    assert topo.devices[5].connected_devices == (1, 4, 9, 6)
    assert instance_topology("trn1.2xlarge").devices[0].connected_devices == ()


def test_torus_has_two_link_disjoint_hamiltonian_cycles():
    topo = instance_topology("trn1.32xlarge")
    cycles = topo.ring_cycles()
    assert len(cycles) == 2
    link_pairs = {frozenset((link.a, link.b)) for link in topo.neuronlinks}
    used = []
    for cycle in cycles:
        assert sorted(cycle) == list(range(16))
        edges = {frozenset((cycle[i], cycle[(i + 1) % 16])) for i in range(16)}
        assert len(edges) == 16 and edges <= link_pairs
        used.append(edges)
    assert not used[0] & used[1]
    assert used[0] | used[1] == link_pairs


def test_channels_are_both_directions_plus_one_on_chip_per_rank():
    topo = instance_topology("trn1.32xlarge")
    assert len(topo.channels) == 2 * 32 + 32
    for link in topo.neuronlinks:
        forward, backward = topo.channels[link.channel(0)], topo.channels[link.channel(1)]
        assert (forward.src, forward.dst) == (link.a, link.b)
        assert (backward.src, backward.dst) == (link.b, link.a)
    assert topo.channels[topo.on_chip_channel(7)].kind == ON_CHIP
    assert topo.channels[topo.on_chip_channel(7)].rank == 7
    # on-chip: the sending core's DMA ceiling, 16 x 17 B/ns on NC-v2 (§5.1)
    assert topo.on_chip_bytes_per_s == pytest.approx(272e9)
    assert instance_topology("trn2.48xlarge", lnc=2).on_chip_bytes_per_s == pytest.approx(
        2 * instance_topology("trn2.48xlarge", lnc=1).on_chip_bytes_per_s)


def test_neuronlink_egress():
    assert instance_topology("trn1.32xlarge").neuronlink_egress_bytes_per_s(0) == pytest.approx(384e9)
    assert instance_topology("inf2.48xlarge").neuronlink_egress_bytes_per_s(3) == pytest.approx(192 * GIB)
    assert instance_topology("trn1.2xlarge").neuronlink_egress_bytes_per_s(0) == 0


# -- host layout ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(INVENTORY))
def test_bdf_numa_affinity_unique_and_plausible(name):
    topo = instance_topology(name)
    bdfs = [d.pci_bdf for d in topo.devices]
    assert len(set(bdfs)) == len(bdfs)
    assert all(re.fullmatch(r"0000:[0-9a-f]{2}:00\.0", b) for b in bdfs)
    assert all(d.short_bdf == d.pci_bdf[5:] for d in topo.devices)
    nodes = hostlayout.numa_nodes(topo.vcpus)
    per_node = [sum(d.numa_node == n for d in topo.devices) for n in range(nodes)]
    assert per_node == [len(topo.devices) // nodes] * nodes  # an even split
    assert [d.numa_node for d in topo.devices] == sorted(d.numa_node for d in topo.devices)
    # each NUMA node's CPUs are disjoint and together are all vCPUs
    cpus = {d.numa_node: _expand(d.cpu_affinity) for d in topo.devices}
    assert sum(len(c) for c in cpus.values()) == topo.vcpus
    assert set().union(*cpus.values()) == set(range(topo.vcpus))


def test_big_hosts_have_two_numa_nodes():
    assert hostlayout.numa_nodes(192) == hostlayout.numa_nodes(128) == 2
    assert hostlayout.numa_nodes(96) == hostlayout.numa_nodes(4) == 1
    trn2 = instance_topology("trn2.48xlarge")
    # the pair neuron-ls documents for a trn2 device on NUMA node 1 (sys-tools.md §4.3)
    assert trn2.devices[15].numa_node == 1
    assert trn2.devices[15].cpu_affinity == "48-95,144-191"
    assert trn2.devices[0].cpu_affinity == "0-47,96-143"
    assert instance_topology("inf2.xlarge").devices[0].cpu_affinity == "0-3"


def test_host_layout_is_stable():
    a = instance_topology("trn1.32xlarge")
    b = instance_topology("trn1.32xlarge", link_bandwidth_per_direction=False)  # a separate build
    assert a is not b
    assert [(d.pci_bdf, d.numa_node, d.cpu_affinity) for d in a.devices] == [
        (d.pci_bdf, d.numa_node, d.cpu_affinity) for d in b.devices]


def _expand(cpulist: str) -> set[int]:
    out: set[int] = set()
    for part in cpulist.split(","):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


# -- routes --------------------------------------------------------------------------------------


def _hops(topo, a: int, b: int) -> int:
    """Breadth-first distance over the NeuronLink graph."""
    seen, todo = {a: 0}, deque([a])
    while todo:
        d = todo.popleft()
        for n in topo.neighbours(d):
            if n not in seen:
                seen[n] = seen[d] + 1
                todo.append(n)
    return seen[b]


@pytest.mark.parametrize("name", ["inf2.24xlarge", "inf2.48xlarge", "trn1.32xlarge", "trn2.48xlarge"])
def test_routes_are_shortest_connected_paths(name):
    topo = instance_topology(name)
    for a in range(len(topo.devices)):
        for b in range(len(topo.devices)):
            route = [topo.channels[c] for c in topo.route(a, b)]
            assert len(route) == _hops(topo, a, b)
            if route:
                assert route[0].src == a and route[-1].dst == b
                assert all(x.dst == y.src for x, y in itertools.pairwise(route))
                assert all(c.kind == NEURONLINK for c in route)


def test_torus_route_is_dimension_ordered():
    topo = instance_topology("trn1.32xlarge")
    # device 0 -> device 10 (row 2, column 2): two steps right, then two steps down (ties go forward)
    assert [(c.src, c.dst) for c in (topo.channels[i] for i in topo.route(0, 10))] == [
        (0, 1), (1, 2), (2, 6), (6, 10)]
    # device 0 -> device 15: one step left (wrap), one step up (wrap)
    assert [(c.src, c.dst) for c in (topo.channels[i] for i in topo.route(0, 15))] == [(0, 3), (3, 15)]


def test_path_between_ranks():
    topo = instance_topology("trn1.32xlarge")
    assert topo.path(4, 4) == ()
    same_device = topo.path(4, 5)  # cores 4 and 5 are device 2's
    assert [c.kind for c in same_device] == [ON_CHIP] and same_device[0].rank == 4
    assert [(c.src, c.dst) for c in topo.path(0, 2)] == [(0, 1)]
    with pytest.raises(ValueError, match=r"core 32 does not exist on trn1\.32xlarge"):
        topo.path(0, 32)


# -- several instances joined by EFA ---------------------------------------------------------------


def test_multi_instance_trn1():
    topo = instance_topology("trn1.32xlarge", nodes=4)
    assert topo.name == "4x trn1.32xlarge"
    assert len(topo.devices) == 64 and topo.cores == 128
    assert len(topo.neuronlinks) == 4 * 32 and topo.links_per_node == 32
    assert len(topo.efa_links) == 64  # one interface per chip
    # 800 Gbps per instance over 16 chips = 50 Gbps per chip (§1.4)
    assert {link.bytes_per_s_per_direction for link in topo.efa_links} == {50e9 / 8}
    assert all(link.b == NETWORK for link in topo.efa_links)
    node2 = topo.devices[2 * 16 + 5]
    assert (node2.node, node2.local_index) == (2, 5)
    assert node2.logical_cores == range(74, 76)
    # BDFs repeat per node (each node is its own host) but are unique within one
    assert [d.pci_bdf for d in topo.devices[16:32]] == [d.pci_bdf for d in topo.devices[:16]]
    # neighbours stay within the node
    assert set(topo.neighbours(16)) == {16 + d for d in (12, 3, 4, 1)}


def test_multi_instance_routes():
    topo = instance_topology("trn1.32xlarge", nodes=2)
    cross = topo.path(0, 40)  # device 0 of node 0 -> device 20 (local 4) of node 1
    assert [c.kind for c in cross] == [EFA, EFA]
    assert cross[0].src == 0 and cross[0].dst == NETWORK
    assert cross[1].src == NETWORK and cross[1].dst == 20
    inside = topo.path(32, 52)  # both on node 1: local devices 0 -> 10
    assert [c.kind for c in inside] == [NEURONLINK] * 4
    assert all(16 <= c.src < 32 and 16 <= c.dst < 32 for c in inside)
    cycles = topo.ring_cycles()
    assert all(sorted(cycle) == list(range(32)) for cycle in cycles)


# -- bad input -----------------------------------------------------------------------------------


def test_unknown_instance_lists_known_ones():
    with pytest.raises(ValueError, match=r"unknown instance type 'p4d\.24xlarge'; known: inf2\.24xlarge"):
        instance_topology("p4d.24xlarge")


def test_lnc_must_be_1_or_2_on_trn2():
    with pytest.raises(ValueError, match=r"LNC on trn2\.48xlarge must be 1 or 2, not 4"):
        instance_topology("trn2.48xlarge", lnc=4)


def test_lnc_on_an_instance_without_it():
    with pytest.raises(ValueError, match=r"trn1\.32xlarge has no Logical NeuronCore \(LNC\) setting"):
        instance_topology("trn1.32xlarge", lnc=2)
    assert instance_topology("trn1.32xlarge", lnc=1).cores == 32  # one physical core per rank


def test_multi_instance_needs_efa():
    with pytest.raises(ValueError, match=r"inf2\.48xlarge has no EFA network"):
        instance_topology("inf2.48xlarge", nodes=2)
    with pytest.raises(ValueError, match=r"nodes must be a positive integer"):
        instance_topology("trn1.32xlarge", nodes=0)


def test_default_instance_comes_from_config(monkeypatch, tmp_path):
    monkeypatch.setenv("NEURONSCOPE_CONFIG", str(tmp_path / "missing.toml"))
    monkeypatch.setenv("NEURONSCOPE_INSTANCE", "inf2.24xlarge")
    assert instance_topology().name == "inf2.24xlarge"
    monkeypatch.delenv("NEURONSCOPE_INSTANCE")
    assert instance_topology().name == "trn1.2xlarge"


def test_instance_runtime_is_unchanged():
    # the runtime still builds one NeuronCore per physical core from INSTANCE_TYPES
    inst = Instance("trn2.48xlarge")
    assert len(inst.cores) == 128 and inst.cores[9].device == 1
    assert INSTANCE_TYPES["trn1.32xlarge"].efa_bytes_per_s_per_chip == pytest.approx(50e9 / 8)
    assert INSTANCE_TYPES["trn2.48xlarge"].efa_bytes_per_s_per_chip == pytest.approx(200e9 / 8)
