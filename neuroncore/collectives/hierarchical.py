"""Hierarchical multi-node collectives: intra-node stage over NeuronLink, inter-node stage over EFA
on ``1 / local`` of the data, intra-node stage again (neuroncore.md §6: inter-node collectives run
Ring, Mesh, RDH "and hierarchical intra-then-inter schemes").

A group whose ranks sit on ``N >= 2`` nodes with the same ``L >= 2`` ranks on each is split into
``L``-rank *local* groups (one per node) and ``N``-rank *cross* groups (the ranks with the same
position in their node's local group, one per node). The stages, each timed as an ordinary
collective over its groups (all groups of all replica groups at once, so they share links):

* AllReduce of S bytes: local ReduceScatter (S -> S / L), cross AllReduce of S / L, local AllGather.
* ReduceScatter: local ReduceScatter (S -> S / L), cross ReduceScatter (S / L -> S / r).
* AllGather: cross AllGather (S -> N S), local AllGather (N S -> r S).

Only ``1 / L`` of the data crosses EFA, and the 15 us EFA step latency is paid ``N - 1`` (twice for
AllReduce) times instead of ``r - 1``. Which stage decomposition the Neuron runtime uses is not
published beyond §6's sentence; this is the standard reduce-scatter / all-reduce / all-gather
decomposition (NCCL's tree/ring hierarchy does the same) [assumption].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from neuroncore.collectives.algorithms import Groups
from neuroncore.collectives.record import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, LinkUsage
from neuroncore.topology import Topology

HIERARCHICAL = "Hierarchical"
HIERARCHICAL_OPERATIONS = (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER)


@dataclass(frozen=True)
class Stage:
    """One stage: the operation, over which groups, on how many elements per rank."""

    operation: str
    groups: Groups
    count: int


def split_groups(topo: Topology, groups: Groups) -> tuple[Groups, Groups] | None:
    """(local groups, cross groups) of ``groups``, or None when the hierarchy does not apply (one
    node, one rank per node, or unequal ranks per node)."""
    if topo.nodes < 2:
        return None
    per_node = topo.devices_per_node
    local: list[tuple[int, ...]] = []
    cross: list[tuple[int, ...]] = []
    for group in groups:
        by_node: dict[int, list[int]] = {}
        for rank in group:
            by_node.setdefault(topo.device_of(rank) // per_node, []).append(rank)
        sizes = {len(v) for v in by_node.values()}
        if len(by_node) < 2 or len(sizes) != 1 or sizes == {1}:
            return None
        parts = [tuple(by_node[n]) for n in sorted(by_node)]
        local += parts
        cross += [tuple(part[j] for part in parts) for j in range(len(parts[0]))]
    return tuple(local), tuple(cross)


def stages(operation: str, local: Groups, cross: Groups, count: int) -> list[Stage]:
    """The stages of ``operation`` on ``count`` elements per rank (see the module docstring)."""
    n_local, n_cross = len(local[0]), len(cross[0])
    if operation == ALL_REDUCE:
        padded = -(-count // n_local) * n_local  # the local reduce-scatter needs a multiple of L
        shard = padded // n_local
        return [Stage(REDUCE_SCATTER, local, padded), Stage(ALL_REDUCE, cross, shard),
                Stage(ALL_GATHER, local, shard)]
    if operation == REDUCE_SCATTER:
        return [Stage(REDUCE_SCATTER, local, count), Stage(REDUCE_SCATTER, cross, count // n_local)]
    if operation == ALL_GATHER:
        return [Stage(ALL_GATHER, cross, count), Stage(ALL_GATHER, local, count * n_cross)]
    raise ValueError(f"{operation} has no hierarchical algorithm")


def merge_usage(usages: list[LinkUsage]) -> LinkUsage:
    """The stages' link usage as one record's: channels united, steps one after another."""
    used = [u for u in usages if u.steps]
    if not used:
        return usages[0]
    channels = np.unique(np.concatenate([u.channels for u in used]))
    byte_rows, flow_rows = [], []
    for u in used:
        cols = np.searchsorted(channels, u.channels)
        b = np.zeros((u.steps, len(channels)))
        f = np.zeros((u.steps, len(channels)), np.int32)
        b[:, cols], f[:, cols] = u.step_bytes, u.step_flows
        byte_rows.append(b)
        flow_rows.append(f)
    return LinkUsage(channels, np.concatenate([u.step_start_ns for u in used]),
                     np.concatenate([u.step_end_ns for u in used]), np.concatenate(byte_rows),
                     np.concatenate(flow_rows))
