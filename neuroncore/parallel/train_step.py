"""A whole training step of one rank as ONE program, run on the core and recorded like any execution.

    run = TrainingStepRun.load(model, plan, instance)      # compile the rank's step program once
    result = run.execute()                                  # one step: records + TRAIN_STEP batch

Where :func:`neuroncore.parallel.training.time_training_step` composes a step from separately timed
programs (fast enough for full-size models), this builds the step the way a profile should show it:
every micro-batch's forward and backward, the gradient synchronisation and the optimizer in one
program of rank 0, with layer paths ``model/<level>/...`` so the profile's hierarchy is

    model / forward | backward | gradient_sync | optimizer / microbatch.k / layers.i / <module> / HLO op

The tensor-parallel all-reduces inside the layers run over the rank's TP group; the gradient
buckets (DDP's 25 MB rule, whole layers, last layer first) are all-reduced -- or, with ZeRO-1,
reduce-scattered, then the updated parameters all-gathered -- over its DP group. Every collective is
a CC-core node timed on the topology for its group, so the scheduler overlaps a bucket with the
backward of the layers below it exactly as far as the dependencies allow, and the TRAIN_STEP batch
reports, per collective, how much of it ran while compute engines were busy.

Pipeline parallelism is not laid into the program (one stage's view of 1F1B would need the other
stages' timing); ``time_training_step`` composes it. The step runs timing only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from neuroncore import collectives as cc
from neuroncore.collectives.record import CollectiveRecord
from neuroncore.compiler import compile as compile_graph
from neuroncore.compiler.program import Program
from neuroncore.enums import Resource
from neuroncore.ir.builder import GraphBuilder
from neuroncore.ir.graph import Graph, Op
from neuroncore.parallel.training import DDP_BUCKET_BYTES, ParallelPlan, PlanError, model_flops, rank_layout
from neuroncore.record_kinds import RecordKind, TrainStepMeta
from neuroncore.runtime.device import ExecutionResult, Instance, LoadedModel
from neuroncore.runtime.scheduler import Timeline, schedule
from neuroncore.topology import Topology, instance_topology
from neuroncore.workloads.train_graphs import (
    RankShapes,
    Transformer,
    backward_ops,
    embedding_ops,
    forward_ops,
    head_ops,
    optimizer_frames,
)

LEVELS = ("forward", "backward", "gradient_sync", "optimizer")
CC_OPERATIONS = {"all-reduce": cc.ALL_REDUCE, "all-gather": cc.ALL_GATHER,
                 "reduce-scatter": cc.REDUCE_SCATTER}
MAX_STEP_INSTRUCTIONS = 3_000_000  # a step program beyond this is a profile no view should load


FLAT_COLUMNS = 2048  # a flat gradient/parameter buffer is [rows, 2048]: 128-partition tiles of long rows


def _flat(b: GraphBuilder, ops: list[Op], dtype: str) -> Op:
    """Gradients packed into one [rows, FLAT_COLUMNS] buffer (a DDP bucket's flat view); a piece
    whose size is not a multiple of the row is padded with zeros (small: biases and norm weights)."""
    parts = []
    for g in ops:
        g = b.convert(g, dtype) if g.dtype.value != dtype else g
        pad = -g.size % FLAT_COLUMNS
        if pad:
            g = b.concatenate([b.reshape(g, (g.size,)), b.constant(0.0, dtype, (pad,))], 0)
        parts.append(b.reshape(g, (g.size // FLAT_COLUMNS, FLAT_COLUMNS)))
    return parts[0] if len(parts) == 1 else b.concatenate(parts, 0)


def _adamw(b: GraphBuilder, grad: Op, master: str, model_dtype: str) -> list[Op]:
    """torch.optim.AdamW's update of a flat parameter block (see train_graphs.optimizer_graph)."""
    shape = grad.shape
    p = b.parameter("param", shape, master)
    m1 = b.parameter("exp_avg", shape, master)
    m2 = b.parameter("exp_avg_sq", shape, master)
    g = b.convert(grad, master) if grad.dtype.value != master else grad
    lr, b1, b2, eps, wd = 1e-4, 0.9, 0.999, 1e-8, 0.01
    m1n = b.add(b.multiply(m1, b1), b.multiply(g, 1 - b1))
    m2n = b.add(b.multiply(m2, b2), b.multiply(b.multiply(g, g), 1 - b2))
    denom = b.add(b.sqrt(b.multiply(m2n, 1 / (1 - b2))), eps)
    pn = b.subtract(b.multiply(p, 1 - lr * wd), b.divide(b.multiply(m1n, lr / (1 - b1)), denom))
    out = [pn, m1n, m2n]
    if model_dtype != master:
        out.append(b.convert(pn, model_dtype))
    return out


def step_graph(model: Transformer, plan: ParallelPlan) -> Graph:
    """Rank 0's whole step (pp must be 1): forward and backward of every micro-batch, gradient
    buckets synchronised over the DP group, AdamW (on the 1/dp shard with ZeRO-1, then all-gather)."""
    if plan.pp != 1:
        raise PlanError("a step program holds one pipeline stage's view only; profile with pp 1 "
                        "(neuroncore run composes pipeline-parallel steps)")
    r = RankShapes.of(model, plan.micro_batch, plan.seq, plan.tp)
    dtype, master = plan.compute_dtype, plan.master_dtype
    b = GraphBuilder(f"{model.name}_train_step", root_layer="model")
    layers = model.layers
    acc: list[list[Op] | None] = [None] * (layers + 1)  # per layer (+ head) accumulated gradients
    for k in range(plan.micro_batches):
        with b.scope("forward"), b.scope(f"microbatch.{k}"):
            x = embedding_ops(b, model, r, plan.tp, dtype)
            saved = []
            for i in range(layers):
                with b.scope(f"layers.{i}"):
                    x, s = forward_ops(b, model, r, plan.tp, dtype, x)
                saved.append(s)
        with b.scope("backward"), b.scope(f"microbatch.{k}"):
            _, dy, head_grads = head_ops(b, model, r, plan.tp, dtype, x)
            grads_by_layer: list[list[Op]] = [[] for _ in range(layers)]
            for i in reversed(range(layers)):
                with b.scope(f"layers.{i}"):
                    dy, grads_by_layer[i] = backward_ops(b, model, r, plan.tp, dtype, saved[i], dy)
            for i, grads in enumerate([*grads_by_layer, head_grads]):
                flat = _flat(b, grads, master)
                previous = acc[i]
                acc[i] = [flat if previous is None else b.add(previous[0], flat)]
    outputs: list[Op] = []
    itemsize = 4 if master == "fp32" else 2
    bucket: list[Op] = []
    buckets: list[list[Op]] = []
    size = 0
    for i in [layers, *reversed(range(layers))]:  # head first: its gradients are final first
        grad = acc[i]
        assert grad is not None
        bucket.append(grad[0])
        size += grad[0].size * itemsize
        if size >= DDP_BUCKET_BYTES or i == 0:
            buckets.append(bucket)
            bucket, size = [], 0
    for n, parts in enumerate(buckets):
        with b.scope("gradient_sync"), b.scope(f"bucket.{n}"):
            flat = parts[0] if len(parts) == 1 else b.concatenate(parts, 0)
            if plan.dp > 1 and plan.zero1:
                pad = -flat.shape[0] % plan.dp
                if pad:
                    flat = b.concatenate([flat, b.constant(0.0, master, (pad, FLAT_COLUMNS))], 0)
                synced = b.add_op("reduce-scatter", [flat], (flat.shape[0] // plan.dp, FLAT_COLUMNS),
                                  flat.dtype, reduction="sum", dimension=0, group="dp",
                                  name=f"reduce-scatter.{b.n_ops}")
            elif plan.dp > 1:
                synced = b.add_op("all-reduce", [flat], flat.shape, flat.dtype, reduction="sum", group="dp",
                                  name=f"all-reduce.{b.n_ops}")
            else:
                synced = flat
        with b.scope("optimizer"), b.scope(f"bucket.{n}"), b.source(optimizer_frames()):
            updated = _adamw(b, synced, master, dtype)
        if plan.dp > 1 and plan.zero1:
            with b.scope("gradient_sync"), b.scope(f"bucket.{n}"):
                shard = updated[-1]
                gathered = b.add_op("all-gather", [shard], (shard.shape[0] * plan.dp, FLAT_COLUMNS),
                                    shard.dtype, dimension=0, group="dp", name=f"all-gather.{b.n_ops}")
            updated = [*updated[:-1], gathered]
        outputs += updated
    return b.build(outputs)


@dataclass(frozen=True)
class CollectiveOverlap:
    """One collective of a step: its group, timing and how much of it ran beside compute."""

    node: int
    name: str
    operation: str
    group: str
    start_ns: float
    end_ns: float
    size_bytes: int
    overlap_ns: float


def _busy_union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    merged_s: list[float] = []
    merged_e: list[float] = []
    for a, z in zip(s.tolist(), e.tolist()):
        if merged_e and a <= merged_e[-1]:
            merged_e[-1] = max(merged_e[-1], z)
        else:
            merged_s.append(a)
            merged_e.append(z)
    return np.asarray(merged_s), np.asarray(merged_e)


def compute_overlap(program: Program, timeline: Timeline, nodes: np.ndarray) -> np.ndarray:
    """For each collective node, the time during it that some compute engine was busy (the union
    of instruction intervals clipped to the collective)."""
    compute = program.resource < Resource.DMA
    us, ue = _busy_union(timeline.start_ns[compute], timeline.end_ns[compute])
    out = np.zeros(len(nodes))
    for k, node in enumerate(nodes.tolist()):
        a, z = float(timeline.start_ns[node]), float(timeline.end_ns[node])
        out[k] = float(np.clip(np.minimum(ue, z) - np.maximum(us, a), 0, None).sum())
    return out


class TrainingStepRun:
    """Rank 0's step program loaded on its core, its collectives timed for their groups."""

    def __init__(self, model: Transformer, plan: ParallelPlan, program: Program, loaded: LoadedModel,
                 topology: Topology) -> None:
        self.model, self.plan, self.program = model, plan, program
        self.loaded, self.topology = loaded, topology
        _, _, dp_groups = rank_layout(plan)
        tp_groups = [[d * plan.tp + t for t in range(plan.tp)] for d in range(plan.dp)]
        self.steps = 0
        self._templates: list[CollectiveRecord] = []
        self._groups: list[str] = []
        memo: dict[tuple[str, str, int, str], CollectiveRecord] = {}
        costs = program.cost_ns.copy()
        for node in program.collective_nodes:
            op = program.graph.ops[int(program.op_index[node])]
            group = str(op.attrs.get("group", "tp"))
            key = (op.opcode, group, op.operands[0].size, op.dtype.value)
            if key not in memo:
                groups = tp_groups if group == "tp" else dp_groups
                memo[key] = cc.collective(CC_OPERATIONS[op.opcode], topology, groups, key[2], key[3])
            self._templates.append(memo[key])
            self._groups.append(group)
            costs[node] = memo[key].duration_ns
        self._costs = costs
        core_spec = loaded.core.spec
        self.peak_flops_per_rank = (core_spec.pe_peak_fp32_flops_per_s if plan.precision == "fp32"
                                    else core_spec.pe_peak_bf16_flops_per_s)
        self.step_flops = model_flops(model, plan)

    @classmethod
    def load(cls, model: Transformer, plan: ParallelPlan,
             instance: Instance | None = None) -> TrainingStepRun:
        topology = instance_topology(plan.instance, nodes=plan.nodes)
        plan.check(model, topology)
        inst = instance or Instance(plan.instance, nodes=plan.nodes)
        if inst.name != plan.instance:
            raise PlanError(f"the plan is for {plan.instance}, the instance is {inst.name}")
        graph = step_graph(model, plan)
        program = compile_graph(graph, inst.spec.chip.core)
        if program.n_instructions > MAX_STEP_INSTRUCTIONS:
            raise PlanError(f"the step program has {program.n_instructions:,} instructions (over "
                            f"{MAX_STEP_INSTRUCTIONS:,}); profile fewer layers, micro-batches or a "
                            f"shorter sequence")
        loaded = inst.core(topology.physical_cores_of(0)[0]).load(program)
        return cls(model, plan, program, loaded, topology)

    def execute(self) -> tuple[ExecutionResult, list[CollectiveOverlap], dict[str, float]]:
        """One step (timing only): the execution's records, then a TRAIN_STEP batch."""
        host_start = time.time_ns()
        core = self.loaded.core
        with core.lock:
            t0 = core.clock_ns
            timeline = schedule(self.program, float(t0), self._costs)
            nodes = self.program.collective_nodes
            placed = [(int(n), tpl.shifted(timeline.start_ns[n] - tpl.start_ns))
                      for n, tpl in zip(nodes, self._templates)]
            result = self.loaded.record(t0, timeline, None, True, placed, host_start_ns=host_start)
        overlap = compute_overlap(self.program, timeline, nodes)
        rows = []
        for k, (node, rec) in enumerate(placed):
            op = self.program.graph.ops[int(self.program.op_index[node])]
            rows.append(CollectiveOverlap(node, op.name, rec.operation, self._groups[k],
                                          float(timeline.start_ns[node]), float(timeline.end_ns[node]),
                                          rec.size_bytes, float(overlap[k])))
        levels = self._levels(timeline)
        self.steps += 1
        sink = self.loaded.sink
        if sink.active:
            self._emit(result, rows, levels, host_start)
        return result, rows, levels

    def _levels(self, timeline: Timeline) -> dict[str, float]:
        """Busy time per level (union of its nodes' intervals; collectives count in gradient_sync)."""
        ops = self.program.graph.ops
        level_of = np.array([_level(ops[int(i)].layer) if i >= 0 else -1 for i in self.program.op_index])
        out = {}
        for k, name in enumerate(LEVELS):
            mask = level_of == k
            if not mask.any():
                out[name] = 0.0
                continue
            s, e = _busy_union(timeline.start_ns[mask], timeline.end_ns[mask])
            out[name] = float((e - s).sum())
        return out

    def _emit(self, result: ExecutionResult, rows: list[CollectiveOverlap], levels: dict[str, float],
              host_start: int) -> None:
        plan, model = self.plan, self.model
        columns = {
            "name": [r.name for r in rows],
            "operation": [r.operation for r in rows],
            "replica_group_kind": [r.group for r in rows],
            "start_ts": np.array([int(r.start_ns) for r in rows], np.int64),
            "end_ts": np.array([int(r.end_ns) for r in rows], np.int64),
            "duration_ns": np.array([int(r.end_ns) - int(r.start_ns) for r in rows], np.int64),
            "size_bytes": np.array([r.size_bytes for r in rows], np.int64),
            "overlap_ns": np.array([int(r.overlap_ns) for r in rows], np.int64),
        }
        self.loaded.sink.emit(RecordKind.TRAIN_STEP, columns, TrainStepMeta(
            execution_id=result.execution_id, model_id=result.model_id, core=result.core,
            step=self.steps, step_time_ns=result.end_ns - result.start_ns, start_ns=result.start_ns,
            global_batch=plan.global_batch, seq=plan.seq, model_flops=self.step_flops, ranks=plan.world,
            peak_flops_per_rank=self.peak_flops_per_rank, levels=dict(levels), layout=plan.key(model.name),
            host_start_ns=host_start, host_end_ns=time.time_ns()))


def _level(layer: str) -> int:
    parts = layer.split("/")
    if len(parts) > 1 and parts[1] in LEVELS:
        return LEVELS.index(parts[1])
    return -1


__all__ = ["LEVELS", "CollectiveOverlap", "TrainingStepRun", "compute_overlap", "step_graph"]
