"""Time a collective over replica groups of ranks on a topology: the entry points of the package."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache

import numpy as np

from neuroncore.collectives.algorithms import (
    DIRECT,
    LOCAL,
    MESH,
    RING,
    Groups,
    Plan,
    direct_plan,
    mesh_plan,
    ring_plan,
)
from neuroncore.collectives.flows import LinkLedger, step_ns
from neuroncore.collectives.hierarchical import (
    HIERARCHICAL,
    HIERARCHICAL_OPERATIONS,
    merge_usage,
    split_groups,
    stages,
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
    ranks_of,
)
from neuroncore.dtypes import as_dtype
from neuroncore.topology import Topology, instance_topology

ReadyNs = float | Sequence[float] | Mapping[int, float]
TopologyLike = Topology | str
GroupsLike = Sequence[int] | Sequence[Sequence[int]]
_ALGORITHMS = {ALL_REDUCE: (RING, MESH), ALL_GATHER: (RING, MESH), REDUCE_SCATTER: (RING, MESH),
               ALL_TO_ALL: (MESH,), PERMUTE: (DIRECT,)}


def all_reduce(topology: TopologyLike, replica_groups: GroupsLike, count: int, dtype: str = "bf16", *,
               ready_ns: ReadyNs = 0.0, algorithm: str = "auto", params: CollectiveParams | None = None,
               ledger: LinkLedger | None = None) -> CollectiveRecord:
    """Sum ``count`` elements across each group; every rank ends with the sum. Input = output size."""
    return collective(ALL_REDUCE, topology, replica_groups, count, dtype, ready_ns=ready_ns,
                      algorithm=algorithm, params=params, ledger=ledger)


def all_gather(topology: TopologyLike, replica_groups: GroupsLike, count: int, dtype: str = "bf16", *,
               ready_ns: ReadyNs = 0.0, algorithm: str = "auto", params: CollectiveParams | None = None,
               ledger: LinkLedger | None = None) -> CollectiveRecord:
    """Each rank contributes ``count`` elements; every rank ends with all r x count of its group."""
    return collective(ALL_GATHER, topology, replica_groups, count, dtype, ready_ns=ready_ns,
                      algorithm=algorithm, params=params, ledger=ledger)


def reduce_scatter(topology: TopologyLike, replica_groups: GroupsLike, count: int, dtype: str = "bf16", *,
                   ready_ns: ReadyNs = 0.0, algorithm: str = "auto",
                   params: CollectiveParams | None = None,
                   ledger: LinkLedger | None = None) -> CollectiveRecord:
    """Each rank holds ``count`` elements (a multiple of r); each ends with its count / r of the sum."""
    return collective(REDUCE_SCATTER, topology, replica_groups, count, dtype, ready_ns=ready_ns,
                      algorithm=algorithm, params=params, ledger=ledger)


def all_to_all(topology: TopologyLike, replica_groups: GroupsLike, count: int, dtype: str = "bf16", *,
               ready_ns: ReadyNs = 0.0, algorithm: str = "auto", params: CollectiveParams | None = None,
               ledger: LinkLedger | None = None) -> CollectiveRecord:
    """Each rank sends count / r of its ``count`` elements to every rank of its group."""
    return collective(ALL_TO_ALL, topology, replica_groups, count, dtype, ready_ns=ready_ns,
                      algorithm=algorithm, params=params, ledger=ledger)


def permute(topology: TopologyLike, pairs: Sequence[Sequence[int]], count: int, dtype: str = "bf16", *,
            ready_ns: ReadyNs = 0.0, params: CollectiveParams | None = None,
            ledger: LinkLedger | None = None) -> CollectiveRecord:
    """XLA collective-permute: each (source, target) pair moves ``count`` elements in one step."""
    return collective(PERMUTE, topology, pairs, count, dtype, ready_ns=ready_ns, params=params,
                      ledger=ledger)


def collective(
    operation: str,
    topology: TopologyLike,
    replica_groups: GroupsLike,
    count: int,
    dtype: str = "bf16",
    *,
    ready_ns: ReadyNs = 0.0,
    algorithm: str = "auto",
    params: CollectiveParams | None = None,
    ledger: LinkLedger | None = None,
) -> CollectiveRecord:
    """Time one collective and return its record.

    * ``topology``: a ``Topology`` or an instance type name (its default topology).
    * ``replica_groups``: ranks (global logical core ids) of one group, or a list of equal-sized
      disjoint groups running the same collective at once (XLA's ``replica_groups``); for Permute,
      the (source, target) pairs.
    * ``count``: elements of each rank's *input* buffer; ``dtype`` any spelling ``neuroncore.dtypes``
      accepts.
    * ``ready_ns``: when each rank reaches the collective: one time for all, a sequence in rank order
      (group after group), or a mapping rank -> time. The op starts when the last rank is ready.
    * ``algorithm``: "auto" (Hierarchical for AllReduce/AllGather/ReduceScatter groups spread over
      several nodes with several ranks on each, else by message size, ``params.mesh_max_bytes``),
      "hierarchical", "ring", "mesh", "direct".
    * ``ledger``: other collectives' link usage to share the links with; this one is added to it.
    """
    topo = instance_topology(topology) if isinstance(topology, str) else topology
    params = params or DEFAULT_PARAMS
    if params.max_rings is not None and params.max_rings < 1:
        raise ValueError(f"max_rings must be at least 1, not {params.max_rings}")
    operation = _operation(operation)
    groups = _groups(topo, replica_groups, operation)
    element = as_dtype(dtype)
    if not isinstance(count, (int, np.integer)) or isinstance(count, bool) or count < 0:
        raise ValueError(f"count must be a non-negative integer number of elements, not {count!r}")
    size = 2 if operation == PERMUTE else len(groups[0])
    if operation in (REDUCE_SCATTER, ALL_TO_ALL) and count % size:
        raise ValueError(f"{operation} over groups of {size} needs a count divisible by {size}, "
                         f"not {count}")
    input_bytes = int(count) * element.itemsize
    output_bytes = {ALL_GATHER: input_bytes * size,
                    REDUCE_SCATTER: input_bytes // size}.get(operation, input_bytes)
    record_ranks = ranks_of(operation, groups)
    ready = _ready(ready_ns, record_ranks)
    start = max(ready)
    wanted = str(algorithm).lower()
    if wanted in ("auto", HIERARCHICAL.lower()) and operation in HIERARCHICAL_OPERATIONS:
        split = split_groups(topo, groups)
        if split is not None:
            return _hierarchical(operation, topo, groups, split, int(count), element.value, ready,
                                 input_bytes, output_bytes, params, ledger)
    if wanted == HIERARCHICAL.lower():
        raise ValueError(f"{operation} runs hierarchically only over groups spread over several nodes "
                         f"with the same number (at least 2) of ranks on each")
    moving = [p for p in groups if p[0] != p[1]] if operation == PERMUTE else groups
    chosen = choose_algorithm(operation, max(input_bytes, output_bytes), size if moving else 1,
                              algorithm, params)
    if chosen == LOCAL:
        usage, rings = _empty_usage(), 0
    else:
        plan = _plan(topo, tuple(moving), operation, chosen, params.max_rings)
        usage = _timeline(plan, input_bytes * plan.unit_fraction, start, params, ledger)
        rings = plan.rings
        if ledger is not None:
            ledger.add(usage)
    end = float(usage.step_end_ns[-1]) if usage.steps else start
    return CollectiveRecord(
        operation=operation, algorithm=chosen, topology=topo, replica_groups=groups,
        num_elements=max(input_bytes, output_bytes) // element.itemsize, dtype=element.value,
        input_bytes=input_bytes, output_bytes=output_bytes, ready_ns=ready, start_ns=start,
        end_ns=end, steps=usage.steps, rings=rings, link_usage=usage)


def _hierarchical(operation: str, topo: Topology, groups: Groups, split: tuple[Groups, Groups], count: int,
                 dtype: str, ready: tuple[float, ...], input_bytes: int, output_bytes: int,
                 params: CollectiveParams, ledger: LinkLedger | None) -> CollectiveRecord:
    """The stages of ``neuroncore.collectives.hierarchical`` one after another, as one record."""
    t = max(ready)
    usages: list[LinkUsage] = []
    rings = 0
    for stage in stages(operation, split[0], split[1], count):
        rec = collective(stage.operation, topo, stage.groups, stage.count, dtype, ready_ns=t,
                         params=params, ledger=ledger)
        usages.append(rec.link_usage)
        rings = max(rings, rec.rings)
        t = rec.end_ns
    usage = merge_usage(usages)
    itemsize = as_dtype(dtype).itemsize
    return CollectiveRecord(
        operation=operation, algorithm=HIERARCHICAL, topology=topo, replica_groups=groups,
        num_elements=max(input_bytes, output_bytes) // itemsize, dtype=dtype, input_bytes=input_bytes,
        output_bytes=output_bytes, ready_ns=ready, start_ns=max(ready), end_ns=t, steps=usage.steps,
        rings=rings, link_usage=usage)


def choose_algorithm(operation: str, size_bytes: int, group_size: int, requested: str = "auto",
                     params: CollectiveParams = DEFAULT_PARAMS) -> str:
    """The algorithm a collective of ``size_bytes`` (max of input and output) runs with (§6)."""
    allowed = _ALGORITHMS[_operation(operation)]
    wanted = str(requested).lower()
    names = {a.lower(): a for a in allowed}
    if wanted != "auto" and wanted not in names:
        raise ValueError(f"{operation} supports algorithm auto or {', '.join(allowed)}, "
                         f"not {requested!r}")
    if group_size <= 1:
        return LOCAL
    if wanted != "auto":
        return names[wanted]
    if len(allowed) == 1:
        return allowed[0]
    return MESH if size_bytes < params.mesh_max_bytes else RING


# -- helpers -------------------------------------------------------------------------------------


def _operation(name: str) -> str:
    if name in OPERATIONS:
        return name
    lookup = {op.lower(): op for op in OPERATIONS}
    lookup.update({"all_reduce": ALL_REDUCE, "all_gather": ALL_GATHER,
                   "reduce_scatter": REDUCE_SCATTER, "all_to_all": ALL_TO_ALL})
    key = str(name).lower()
    if key not in lookup:
        raise ValueError(f"unknown collective {name!r}; known: {', '.join(OPERATIONS)}")
    return lookup[key]


def _groups(topo: Topology, replica_groups: object, operation: str) -> Groups:
    """Normalise to a tuple of int tuples and check: ranks exist, groups disjoint and equal-sized."""
    if not isinstance(replica_groups, Iterable):
        raise ValueError("replica groups must be core ids, or lists of core ids (one list per group)")
    items = list(replica_groups)
    if not items:
        raise ValueError("replica groups are empty: give at least one rank")
    if all(isinstance(r, (int, np.integer)) for r in items):
        if operation == PERMUTE:
            raise ValueError("Permute takes (source, target) pairs, e.g. [(0, 1), (1, 0)]")
        items = [items]
    if not all(isinstance(g, Sequence | range | np.ndarray) for g in items):
        raise ValueError("replica groups must be core ids, or lists of core ids (one list per group)")
    groups = tuple(tuple(int(r) if isinstance(r, (int, np.integer)) else r for r in g) for g in items)
    for g in groups:
        if not g:
            raise ValueError("a replica group is empty")
        topo.check_ranks(g)
    if operation == PERMUTE:
        if any(len(p) != 2 for p in groups):
            raise ValueError(f"Permute pairs must be (source, target), got {list(groups)}")
        for side, name in ((0, "source"), (1, "target")):
            seen = [p[side] for p in groups]
            twice = sorted({r for r in seen if seen.count(r) > 1})
            if twice:
                raise ValueError(f"core {twice[0]} is the {name} of more than one Permute pair")
        return groups
    sizes = sorted({len(g) for g in groups})
    if len(sizes) > 1:
        raise ValueError(f"replica groups must all have the same size, got sizes {sizes}")
    flat = [r for g in groups for r in g]
    if len(set(flat)) != len(flat):
        repeated = next(r for r in flat if flat.count(r) > 1)
        raise ValueError(f"core {repeated} appears more than once in the replica groups")
    return groups


def _ready(ready_ns: ReadyNs, ranks: tuple[int, ...]) -> tuple[float, ...]:
    if isinstance(ready_ns, (int, float, np.number)):
        return (float(ready_ns),) * len(ranks)
    if isinstance(ready_ns, Mapping):
        missing = [r for r in ranks if r not in ready_ns]
        if missing:
            raise ValueError(f"ready_ns has no time for core {missing[0]}")
        return tuple(float(ready_ns[r]) for r in ranks)
    times = [float(t) for t in ready_ns]
    if len(times) != len(ranks):
        raise ValueError(f"ready_ns has {len(times)} times for {len(ranks)} ranks")
    return tuple(times)


@lru_cache(maxsize=4096)
def _plan(topo: Topology, groups: Groups, operation: str, algorithm: str, max_rings: int | None) -> Plan:
    if algorithm == RING:
        return ring_plan(topo, groups, operation, max_rings)
    if algorithm == MESH:
        return mesh_plan(topo, groups, operation)
    return direct_plan(topo, groups, operation)


def _empty_usage() -> LinkUsage:
    return LinkUsage(np.zeros(0, np.int64), np.zeros(0), np.zeros(0), np.zeros((0, 0)),
                     np.zeros((0, 0), np.int32))


def _timeline(plan: Plan, unit_bytes: float, start_ns: float, params: CollectiveParams,
              ledger: LinkLedger | None) -> LinkUsage:
    """Step start/end times and per-channel bytes/flows of every step of a plan."""
    latency = np.asarray(params.latency_by_kind_ns())
    channels = np.unique(np.concatenate([ph.pattern.channels for ph in plan.phases]))
    starts, ends, byte_rows, flow_rows = [], [], [], []
    t = start_ns
    for phase in plan.phases:
        pattern = phase.pattern
        cols = np.searchsorted(channels, pattern.channels)
        row_bytes = np.zeros(len(channels))
        row_bytes[cols] = pattern.bytes_per_channel * unit_bytes
        row_flows = np.zeros(len(channels), np.int32)
        row_flows[cols] = pattern.flows_per_channel
        alone = step_ns(pattern, unit_bytes, latency)
        begin: np.ndarray
        span: np.ndarray
        if ledger is not None and ledger.flows(pattern.channels, t, t + alone * phase.steps).any():  # shared
            begin, span = np.zeros(phase.steps), np.zeros(phase.steps)
            for i in range(phase.steps):
                background = ledger.flows(pattern.channels, t, t + alone)
                ns = step_ns(pattern, unit_bytes, latency, background) if background.any() else alone
                begin[i], span[i] = t, ns
                t += ns
        else:
            begin = t + alone * np.arange(phase.steps)
            span = np.full(phase.steps, alone)
            t += alone * phase.steps
        starts.append(begin)
        ends.append(begin + span)
        byte_rows.append(np.broadcast_to(row_bytes, (phase.steps, len(channels))))
        flow_rows.append(np.broadcast_to(row_flows, (phase.steps, len(channels))))
    return LinkUsage(channels, np.concatenate(starts), np.concatenate(ends),
                     np.concatenate(byte_rows), np.concatenate(flow_rows))
