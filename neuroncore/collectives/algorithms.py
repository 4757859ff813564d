"""Step schedules of the collective algorithms (neuroncore.md §6), independent of message size.

A plan is a list of phases, each one step pattern repeated ``steps`` times; flow bytes are
``weight x unit`` with ``unit = input bytes per rank x unit_fraction``. Plans depend only on the
topology, the replica groups and the algorithm, so they are built once and cached by the caller.

* **Ring**: ranks in a cycle, each step every rank sends one chunk to the next. AllReduce is a
  ReduceScatter (r - 1 steps of S / r) followed by an AllGather (r - 1 steps of S / r) (§6). Several
  rings run at once with the data split among them (§6: "several disjoint cycles in parallel to use
  all wires"): a ring topology's cycle in both directions, the 4x4 torus' two link-disjoint
  Hamiltonian cycles in both directions. Ranks of one device are adjacent in the cycle, so half the
  hops of a 2-core-per-chip instance stay on chip. Among the candidate ring sets the one with the
  shortest step is used, which for a subset of devices may be fewer rings (a line of devices cannot
  use more than both directions of its links).
* **Mesh**: every rank writes straight to every other rank (over routed, shared links): AllReduce in
  2 steps (scatter the chunks, then gather the reduced ones), AllGather, ReduceScatter and AllToAll
  in 1. O(1) steps, but links carry many flows at once (§6: "over-subscribed").
* **Direct** (Permute): one step of the given source -> target transfers.

Reductions are not charged: §6 says reducing one slice overlaps sending the next.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from neuroncore.collectives.flows import Pattern, build_pattern, step_ns
from neuroncore.collectives.record import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, REDUCE_SCATTER
from neuroncore.topology import Topology

RING, MESH, DIRECT, LOCAL = "Ring", "Mesh", "Direct", "Local"
Groups = tuple[tuple[int, ...], ...]


@dataclass(frozen=True, eq=False)
class Phase:
    name: str  # "ReduceScatter", "AllGather", "AllToAll", "Permute"
    pattern: Pattern
    steps: int


@dataclass(frozen=True, eq=False)
class Plan:
    algorithm: str
    phases: tuple[Phase, ...]
    unit_fraction: float  # unit bytes = input bytes per rank x this
    rings: int = 0


def _ring_pattern(topo: Topology, rings: list[Groups]) -> Pattern:
    """All rings' next-hop flows, each carrying 1 / len(rings) of a chunk."""
    src = np.concatenate([np.asarray(g) for ring in rings for g in ring])
    dst = np.concatenate([np.roll(np.asarray(g), -1) for ring in rings for g in ring])
    return build_pattern(topo, src, dst, np.full(len(src), 1.0 / len(rings)))


def ring_orders(topo: Topology, groups: Groups) -> list[Groups]:
    """Distinct rank cycles of every group, one per device cycle of the topology."""
    orders: list[Groups] = []
    per = topo.cores_per_device
    for cycle in topo.ring_cycles():
        position = {device: i for i, device in enumerate(cycle)}
        order = tuple(tuple(sorted(g, key=lambda r: (position[r // per], r))) for g in groups)
        if order not in orders:
            orders.append(order)
    return orders


def ring_plan(topo: Topology, groups: Groups, operation: str, max_rings: int | None) -> Plan:
    """The fastest ring set (per byte, in isolation) among the topology's cycles and directions."""
    orders = ring_orders(topo, groups)
    reverse = [tuple(tuple(reversed(g)) for g in order) for order in orders]
    candidates: list[list[Groups]] = []
    for fwd, rev in zip(orders, reverse):
        candidates += [[fwd], [fwd, rev]]
    if len(orders) > 1:
        candidates.append(orders + reverse)
    candidates = [c for c in candidates if max_rings is None or len(c) <= max_rings]
    no_latency = np.zeros(3)
    best, best_ns = None, np.inf
    for rings in candidates:  # fewer rings first: ties keep the simpler set
        pattern = _ring_pattern(topo, rings)
        ns = step_ns(pattern, 1.0, no_latency)
        if ns < best_ns * (1 - 1e-9):
            best, best_ns = (pattern, len(rings)), ns
    assert best is not None
    pattern, k = best
    r = len(groups[0])
    scatter, gather = Phase(REDUCE_SCATTER, pattern, r - 1), Phase(ALL_GATHER, pattern, r - 1)
    if operation == ALL_REDUCE:
        return Plan(RING, (scatter, gather), 1.0 / r, k)
    if operation == ALL_GATHER:
        return Plan(RING, (gather,), 1.0, k)
    if operation == REDUCE_SCATTER:
        return Plan(RING, (scatter,), 1.0 / r, k)
    raise ValueError(f"{operation} has no Ring algorithm; use Mesh")


def mesh_plan(topo: Topology, groups: Groups, operation: str) -> Plan:
    """Every rank to every other rank of its group in one step."""
    src = np.concatenate([np.repeat(g, len(g)) for g in groups])
    dst = np.concatenate([np.tile(g, len(g)) for g in groups])
    pattern = build_pattern(topo, src, dst, np.ones(len(src)))
    r = len(groups[0])
    if operation == ALL_REDUCE:
        return Plan(MESH, (Phase(REDUCE_SCATTER, pattern, 1), Phase(ALL_GATHER, pattern, 1)), 1.0 / r)
    if operation == ALL_GATHER:
        return Plan(MESH, (Phase(ALL_GATHER, pattern, 1),), 1.0)
    if operation in (REDUCE_SCATTER, ALL_TO_ALL):
        return Plan(MESH, (Phase(operation, pattern, 1),), 1.0 / r)
    raise ValueError(f"{operation} has no Mesh algorithm")


def direct_plan(topo: Topology, pairs: Groups, operation: str) -> Plan:
    """One step: each (source, target) pair moves the whole buffer."""
    src = np.array([p[0] for p in pairs], dtype=np.int64)
    dst = np.array([p[1] for p in pairs], dtype=np.int64)
    return Plan(DIRECT, (Phase(operation, build_pattern(topo, src, dst, np.ones(len(src))), 1),), 1.0)
