"""Running a sharded program on a group of cores: numerics across ranks, timing with collectives.

    group = TensorParallelModel.load(graph, "inf2.48xlarge", tp_degree=24)
    result = group.execute(timing_only=True)        # device time of one step on 24 cores
    result = group.execute(inputs)                  # the full graph's outputs, gathered from ranks

**Numerics.** Each rank runs its program in its own thread; a collective waits at a barrier for
every rank's operand, then each rank computes the same sum (in rank order, FP32) or concatenation.

**Timing.** Megatron ranks run the same instruction streams on the same shapes, so their schedules
are identical up to the collectives, and every rank reaches collective k at the same time. The group
is therefore timed with one schedule: each collective node lasts what ``neuroncore.collectives``
computes for its size over the group's ranks on the instance topology (ring or mesh, per-hop latency,
link sharing), and every rank's records are that schedule on its own core. The group starts when
its busiest core is free.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from neuroncore import collectives as cc
from neuroncore.collectives.record import CollectiveRecord
from neuroncore.compiler import compile as compile_graph
from neuroncore.compiler.options import CompilerOptions
from neuroncore.compiler.program import RES_DMA, Program
from neuroncore.ir.graph import Graph, Op
from neuroncore.ir.reference import bind_inputs
from neuroncore.parallel.rank_threads import run_ranks
from neuroncore.parallel.sharding import (
    ShardedGraph,
    ShardingError,
    Split,
    block_of,
    join_blocks,
    rank_block,
    shard,
)
from neuroncore.runtime import records
from neuroncore.runtime.device import ExecutionResult, Instance, LoadedModel
from neuroncore.runtime.interpreter import Exchange
from neuroncore.runtime.scheduler import Timeline, schedule
from neuroncore.runtime.state import StateBinding, without_holes
from neuroncore.topology import Topology, instance_topology

CC_OPERATIONS = {"all-reduce": cc.ALL_REDUCE, "all-gather": cc.ALL_GATHER,
                 "reduce-scatter": cc.REDUCE_SCATTER}


def timed_collectives(program: Program, topology: Topology, ranks: int
                      ) -> tuple[np.ndarray, list[tuple[int, CollectiveRecord]]]:
    """A training program's node costs with each collective's duration from ``neuroncore.collectives``
    (its size over ``ranks`` symmetric ranks on the instance topology), and the collectives' timed
    records: data-parallel and ZeRO-1 steps simulate one rank and time its collectives this way."""
    costs = program.cost_ns.copy()
    templates = []
    for node in program.collective_nodes:
        op = program.graph.ops[int(program.op_index[node])]
        record = cc.collective(CC_OPERATIONS[op.opcode], topology, [list(range(ranks))],
                               op.operands[0].size, op.dtype.value)
        costs[node] = record.duration_ns
        templates.append((int(node), record))
    return costs, templates


@dataclass
class GroupResult:
    """One execution of a tensor-parallel group: per-rank results, the collectives, full outputs."""

    ranks: list[ExecutionResult]
    collectives: list[CollectiveRecord]
    outputs: list[np.ndarray] | None
    timeline: Timeline

    @property
    def start_ns(self) -> int:
        return self.ranks[0].start_ns

    @property
    def end_ns(self) -> int:
        return self.ranks[0].end_ns

    @property
    def device_time_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def collective_ns(self) -> float:
        return float(sum(r.duration_ns for r in self.collectives))


class _Rendezvous:
    """Where the ranks' threads meet at each collective."""

    def __init__(self, tp: int) -> None:
        self.barrier = threading.Barrier(tp)
        self.slots: list[np.ndarray | None] = [None] * tp

    def for_rank(self, rank: int) -> Exchange:
        def exchange(op: Op, value: np.ndarray) -> np.ndarray:
            self.slots[rank] = np.asarray(value, np.float32)
            self.barrier.wait()
            parts = [s for s in self.slots if s is not None]
            if op.opcode == "all-reduce" and op.attrs.get("reduction") == "max":
                result = parts[0]  # a vocabulary-parallel softmax's row maxima
                for part in parts[1:]:
                    result = np.maximum(result, part)
            elif op.opcode in ("all-reduce", "reduce-scatter"):
                result = np.zeros_like(parts[0])
                for part in parts:
                    result = result + part
                if op.opcode == "reduce-scatter":  # sequence parallelism: the rank's tokens
                    split = Split(op.attrs["dimension"], op.attrs.get("outer", 1))
                    result = rank_block(result, split, len(parts), rank)
            else:
                result = join_blocks(parts, Split(op.attrs["dimension"], op.attrs.get("outer", 1)))
            self.barrier.wait()  # nobody overwrites a slot before everyone has read them all
            return result

        return exchange


class TensorParallelModel:
    """A sharded program loaded on ``tp`` consecutive ranks (logical cores) of an instance."""

    def __init__(self, sharded: ShardedGraph, program: Program, instance: Instance, *,
                 first_rank: int = 0, topology: Topology | None = None,
                 rank_slowdown: Mapping[int, float] | None = None) -> None:
        self.sharded = sharded
        self.program = program
        self.instance = instance
        self.topology = topology or instance_topology(instance.name, nodes=instance.nodes)
        tp = sharded.tp
        check_placement(self.topology, tp, first_rank)
        self.ranks = list(range(first_rank, first_rank + tp))
        self.models: list[LoadedModel] = [
            instance.core(self.topology.physical_cores_of(r)[0]).load(program, rank=i)
            for i, r in enumerate(self.ranks)
        ]
        self._templates = [self._time_collective(int(node)) for node in program.collective_nodes]
        self._costs = program.cost_ns.copy()
        for node, record in zip(program.collective_nodes, self._templates):
            self._costs[node] = record.duration_ns
        self.rank_slowdown = check_slowdown(rank_slowdown or {}, tp)

    @classmethod
    def load(cls, graph: Graph, instance: str | Instance | None = None, *, tp_degree: int,
             first_rank: int = 0, rank_slowdown: Mapping[int, float] | None = None,
             options: CompilerOptions | None = None) -> TensorParallelModel:
        """Shard ``graph`` over ``tp_degree`` ranks, compile the rank program once (with precision
        ``options``, applied to the rank's graph), load it on each."""
        inst = instance if isinstance(instance, Instance) else Instance(instance)
        topology = instance_topology(inst.name, nodes=inst.nodes)
        check_placement(topology, tp_degree, first_rank)
        sharded = shard(graph, tp_degree)
        _require_fit(sharded.local, inst, topology, range(first_rank, first_rank + tp_degree))
        program = compile_graph(sharded.local, inst.spec.chip.core, options)
        return cls(sharded, program, inst, first_rank=first_rank, topology=topology,
                   rank_slowdown=rank_slowdown)

    @property
    def tp(self) -> int:
        return self.sharded.tp

    def unload(self) -> None:
        """Take the program off every rank's core (``NeuronCore.unload``); the group cannot run
        after."""
        for model in self.models:
            model.core.unload(model)
        self.models = []

    def _time_collective(self, node: int) -> CollectiveRecord:
        op = self.program.graph.ops[int(self.program.op_index[node])]
        operand = op.operands[0]
        return cc.collective(CC_OPERATIONS[op.opcode], self.topology, [self.ranks], operand.size,
                             op.dtype.value)

    def execute(self, inputs: Sequence[np.ndarray | None] | Mapping[str, np.ndarray] | None = None, *,
                timing_only: bool = False, state: StateBinding | None = None) -> GroupResult:
        """Run one step on every rank: the full graph's ``inputs`` in, its outputs out.

        With ``state`` (``neuroncore.runtime.state``), the bound parameters read each rank's own
        resident tensors (its shard: a KV cache split by heads stays split on the ranks) and the
        bound outputs are written back there; ``outputs`` holds the others."""
        host_start_ns = time.time_ns()
        per_rank: list[list[np.ndarray]] | None = None
        if state is not None:
            if isinstance(inputs, Mapping):
                raise ValueError("inputs bound to resident state are passed as a sequence")
            if not timing_only:
                if inputs is None:
                    raise ValueError("inputs are required unless timing_only=True")
                per_rank = self._compute(self._host_inputs(list(inputs), state), state)
        elif not timing_only:
            if inputs is None:
                raise ValueError("inputs are required unless timing_only=True")
            per_rank = self._compute(bind_inputs(self.sharded.full, without_holes(inputs)))
        elif inputs is not None:
            bind_inputs(self.sharded.full, without_holes(inputs))
        cores = [m.core for m in self.models]
        for core in cores:
            core.lock.acquire()
        try:
            t0 = max(core.clock_ns for core in cores)
            if self.rank_slowdown:
                timelines, placed_of = self._schedule_ranks(float(t0))
            else:
                timeline = schedule(self.program, float(t0), self._costs)
                placed = [(int(node), template.shifted(timeline.start_ns[node] - template.start_ns))
                          for node, template in zip(self.program.collective_nodes, self._templates)]
                timelines, placed_of = [timeline] * self.tp, [placed] * self.tp
            timeline = timelines[0]
            placed = placed_of[0]
            results = [model.record(t0, timelines[i], None if per_rank is None else per_rank[i],
                                    timing_only, placed_of[i], host_start_ns=host_start_ns)
                       for i, model in enumerate(self.models)]
        finally:
            for core in cores:
                core.lock.release()
        collectives = [record for _, record in placed]
        sink = self.models[0].sink
        if sink.active and collectives:
            records.emit_link_usage(sink, collectives, float(t0), float(results[0].end_ns),
                                    execution_ids=[r.execution_id for r in results])
        outputs = None
        if per_rank is not None:
            writes = state.writes if state is not None else {}
            returned = [i for i in range(len(self.sharded.output_splits)) if i not in writes]
            outputs = [self.sharded.join_output(i, list(parts))
                       for i, parts in zip(returned, zip(*per_rank))] if returned else []
        for result, model in zip(results, self.models):
            result.host_to_device_bytes, result.device_to_host_bytes = model.host_transfer_bytes(state)
        return GroupResult(results, collectives, outputs, timeline)

    def _host_inputs(self, inputs: list[np.ndarray | None], state: StateBinding) -> list[np.ndarray | None]:
        """The host's inputs checked against the full graph (None where resident-bound)."""
        params = self.sharded.full.parameters
        if len(inputs) != len(params):
            raise ValueError(f"expected {len(params)} inputs (None where resident), got {len(inputs)}")
        for number, (param, value) in enumerate(zip(params, inputs)):
            if number not in state.reads and value is not None and tuple(np.shape(value)) != param.shape:
                raise ValueError(f"input {param.name!r}: shape {list(np.shape(value))} given, "
                                 f"compiled for {list(param.shape)}")
        return inputs

    def _rank_inputs(self, inputs: list[np.ndarray | None], rank: int,
                     state: StateBinding | None) -> list[np.ndarray]:
        """Rank ``rank``'s program inputs: its blocks of the host's, its own resident tensors."""
        if state is None:
            return self.sharded.rank_arrays([np.asarray(a) for a in inputs], rank)
        local = [p.shape for p in self.program.graph.parameters]
        host = [None if a is None else block_of(np.asarray(a), split, self.tp, rank)
                for a, split in zip(inputs, self.sharded.input_splits)]
        host += [make(rank) for make in self.sharded.rank_inputs]
        return self.models[rank].core.resident.bind_inputs(local, host, state)

    def _schedule_ranks(self, t0: float) -> tuple[list[Timeline], list[list[tuple[int, CollectiveRecord]]]]:
        """One schedule per rank when ranks run at different speeds (``rank_slowdown``): a slowed
        rank's engine instructions last ``factor`` x longer (its DMA and links are unchanged), and
        every collective starts when the last rank arrives -- a rank that arrives early waits in it.
        The collectives are settled in program order: schedule every rank, find each one's arrival at
        the next unsettled collective, stretch that collective on the early ranks by their wait."""
        program, tp = self.program, self.tp
        is_instr = program.resource < RES_DMA
        costs = []
        for rank in range(tp):
            c = self._costs.copy()
            c[is_instr] *= self.rank_slowdown.get(rank, 1.0)
            costs.append(c)
        nodes = [int(n) for n in program.collective_nodes]
        arrivals: list[list[float]] = []
        for node, template in zip(nodes, self._templates):
            timelines = [schedule(program, t0, costs[r]) for r in range(tp)]
            arrive = [float(t.start_ns[node]) for t in timelines]
            last = max(arrive)
            for r in range(tp):
                costs[r][node] = template.duration_ns + (last - arrive[r])
            arrivals.append(arrive)
        timelines = [schedule(program, t0, costs[r]) for r in range(tp)]
        placed_of: list[list[tuple[int, CollectiveRecord]]] = [[] for _ in range(tp)]
        for (node, template), arrive in zip(zip(nodes, self._templates), arrivals):
            start = max(arrive)
            record = replace(template.shifted(start - template.start_ns),
                             ready_ns=tuple(arrive[: len(template.ready_ns)]))
            for r in range(tp):
                placed_of[r].append((node, record))
        return timelines, placed_of

    def _compute(self, inputs: Sequence[np.ndarray | None],
                 state: StateBinding | None = None) -> list[list[np.ndarray]]:
        tp = self.tp
        rendezvous = _Rendezvous(tp)
        outputs: list[list[np.ndarray] | None] = [None] * tp

        def run(rank: int) -> None:
            arrays = self._rank_inputs(list(inputs), rank, state)
            result = self.models[rank].compute(arrays, rendezvous.for_rank(rank))
            core = self.models[rank].core
            outputs[rank] = result if state is None else core.resident.store_outputs(result, state)

        run_ranks(tp, run, rendezvous.barrier, "tp")
        return [o for o in outputs if o is not None]


def parse_slowdown(items: Sequence[str]) -> dict[int, float]:
    """``["1=2.0"]`` (``--rank-slowdown RANK=FACTOR``, repeatable) -> ``{1: 2.0}``; ValueError (one
    line) on anything else."""
    out: dict[int, float] = {}
    for item in items:
        rank, sep, factor = str(item).partition("=")
        try:
            if not sep:
                raise ValueError
            out[int(rank)] = float(factor)
        except ValueError:
            raise ValueError(f"--rank-slowdown takes RANK=FACTOR (e.g. 1=2.0), not {item!r}") from None
    return out


def check_slowdown(slowdown: Mapping[int, float], tp: int) -> dict[int, float]:
    """Refuse, in one line, a slowdown for a rank the group does not have or a factor that is not a
    finite number >= 1 (a rank can be made slower, not faster than the hardware)."""
    out: dict[int, float] = {}
    for rank, factor in slowdown.items():
        if not isinstance(rank, int) or not 0 <= rank < tp:
            raise ShardingError(f"rank_slowdown names rank {rank!r}, but the group has ranks 0..{tp - 1}")
        if not (isinstance(factor, (int, float)) and np.isfinite(factor) and factor >= 1.0):
            raise ShardingError(f"rank_slowdown factor for rank {rank} must be a number >= 1, not {factor!r}")
        if factor != 1.0:
            out[rank] = float(factor)
    return out


def check_placement(topology: Topology, tp_degree: int, first_rank: int = 0, replicas: int = 1) -> None:
    """Refuse, in one line, ``replicas`` groups of ``tp_degree`` ranks from ``first_rank`` that the
    instance does not have the cores for."""
    cores = topology.cores
    if not isinstance(tp_degree, int) or tp_degree < 1:
        raise ShardingError(f"tp_degree must be a positive integer, not {tp_degree!r}")
    if first_rank < 0 or first_rank + tp_degree * replicas > cores:
        what = f"tp_degree {tp_degree}" if replicas == 1 else f"{replicas} replicas of tp_degree {tp_degree}"
        start = f" from core {first_rank}" if first_rank else ""
        room = max(0, cores - max(first_rank, 0))  # the cores from first_rank on
        limit = (f"at most {room // tp_degree} groups" if replicas > 1 and room >= tp_degree
                 else f"at most tp_degree {room}{start}")
        raise ShardingError(f"{what}{start} does not fit {topology.name}, which has {cores} NeuronCores "
                            f"({limit})")


def _require_fit(local: Graph, instance: Instance, topology: Topology, ranks: range) -> None:
    """Refuse a rank program whose weights and inputs cannot fit its core's HBM before spending
    time compiling it (loading checks again with the compiler's exact figures)."""
    usage = {"weight": sum(op.nbytes for op in local.constants),
             "input": sum(p.nbytes for p in local.parameters),
             "output": sum(o.nbytes for o in local.outputs)}
    for rank in ranks:
        if rank < topology.cores:
            instance.core(topology.physical_cores_of(rank)[0]).require_hbm(usage, local.name)


class DataParallelModel:
    """Copies of one model on disjoint cores; each request goes to the copy that is free first."""

    def __init__(self, replicas: Sequence[TensorParallelModel | LoadedModel]) -> None:
        if not replicas:
            raise ValueError("a data-parallel model needs at least one replica")
        self.replicas = list(replicas)

    @classmethod
    def load(cls, graph: Graph, instance: str | Instance | None = None, *, tp_degree: int = 1,
             replicas: int | None = None, options: CompilerOptions | None = None) -> DataParallelModel:
        """``replicas`` copies (default: as many as fit) of ``graph``, each on ``tp_degree`` ranks."""
        inst = instance if isinstance(instance, Instance) else Instance(instance)
        topology = instance_topology(inst.name, nodes=inst.nodes)
        count = topology.cores // tp_degree if replicas is None else replicas
        check_placement(topology, tp_degree, 0, count)
        sharded = shard(graph, tp_degree)
        _require_fit(sharded.local, inst, topology, range(count * tp_degree))
        program = compile_graph(sharded.local, inst.spec.chip.core, options)
        return cls([TensorParallelModel(sharded, program, inst, first_rank=k * tp_degree, topology=topology)
                    for k in range(count)])

    def _free_at(self, replica: TensorParallelModel | LoadedModel) -> int:
        models = replica.models if isinstance(replica, TensorParallelModel) else [replica]
        return max(m.core.clock_ns for m in models)

    def execute(self, inputs: Sequence[np.ndarray | None] | Mapping[str, np.ndarray] | None = None, *,
                timing_only: bool = False,
                state: StateBinding | None = None) -> GroupResult | ExecutionResult:
        """Run on the replica that is free first. Resident state is per replica's cores, so a
        stateful call must go to the replica that holds it: pass ``state`` only with one replica."""
        if state is not None and len(self.replicas) > 1:
            raise ValueError("resident state belongs to one replica's cores; run it on that replica")
        replica = min(self.replicas, key=self._free_at)
        return replica.execute(inputs, timing_only=timing_only, state=state)


__all__ = ["DataParallelModel", "GroupResult", "TensorParallelModel", "check_placement", "check_slowdown",
           "parse_slowdown", "timed_collectives"]
