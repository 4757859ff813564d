"""Timing model of collective communication (AllReduce, AllGather, ReduceScatter, AllToAll, Permute)
over an instance topology (``neuroncore.topology``), following neuroncore.md §6.

    from neuroncore import collectives as cc
    topo = instance_topology("trn1.32xlarge")
    rec = cc.all_reduce(topo, range(32), count=16 * 2**20, dtype="bf16", ready_ns=t)
    rec.end_ns, rec.algorithm, rec.busbw_bytes_per_s, rec.ccop_row()
    rec.link_usage.bytes_in_window(t0, t1)        # per channel, for link counters over time

Modules: ``params`` (latencies, size threshold), ``flows`` (one step: routed flows sharing channels;
``LinkLedger`` for sharing with other collectives), ``algorithms`` (Ring / Mesh / Direct step
schedules), ``hierarchical`` (multi-node: intra-node, inter-node over EFA, intra-node stages),
``record`` (``CollectiveRecord``, ``LinkUsage``, bus-bandwidth factors),
``operations`` (the entry points).
"""

from neuroncore.collectives.algorithms import DIRECT, LOCAL, MESH, RING
from neuroncore.collectives.flows import LinkLedger
from neuroncore.collectives.hierarchical import HIERARCHICAL
from neuroncore.collectives.operations import (
    all_gather,
    all_reduce,
    all_to_all,
    choose_algorithm,
    collective,
    permute,
    reduce_scatter,
)
from neuroncore.collectives.params import DEFAULT_PARAMS, CollectiveParams
from neuroncore.collectives.record import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    OPERATIONS,
    PERMUTE,
    REDUCE_SCATTER,
    CollectiveRecord,
    LinkUsage,
    bus_factor,
)

__all__ = [
    "ALL_GATHER", "ALL_REDUCE", "ALL_TO_ALL", "DEFAULT_PARAMS", "DIRECT", "HIERARCHICAL", "LOCAL", "MESH",
    "OPERATIONS",
    "PERMUTE", "REDUCE_SCATTER", "RING", "CollectiveParams", "CollectiveRecord", "LinkLedger",
    "LinkUsage", "all_gather", "all_reduce", "all_to_all", "bus_factor", "choose_algorithm",
    "collective", "permute", "reduce_scatter",
]
