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
from neuroncore.parallel.held_cores import cores_held
from neuroncore.parallel.pipeline import Pass, execution_order, one_f_one_b, stage_layers
from neuroncore.parallel.training import DDP_BUCKET_BYTES, ParallelPlan, PlanError, model_flops, rank_layout
from neuroncore.record_kinds import RecordKind, TrainStepMeta
from neuroncore.runtime.device import ExecutionResult, Instance, LoadedModel
from neuroncore.runtime.scheduler import Timeline, schedule
from neuroncore.topology import Topology, instance_topology
from neuroncore.workloads.train_graphs import (
    RankShapes,
    Saved,
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


def _permute(b: GraphBuilder, value: Op, k: int, kind: str, role: str, peer: int) -> Op:
    """A pipeline send or receive: a collective-permute over the stage pair (group ``pp``), tagged
    with its micro-batch, what it carries and which way, so the runtime can pair the two sides."""
    return b.add_op("collective-permute", [value], value.shape, value.dtype, group="pp",
                    pp_micro_batch=k, pp_kind=kind, pp_role=role, pp_peer=peer,
                    name=f"collective-permute.{b.n_ops}")


def step_graph(model: Transformer, plan: ParallelPlan, stage: int = 0) -> Graph:
    """Rank 0 of pipeline stage ``stage``: the forward and backward of every micro-batch of its
    layers in 1F1B order (:mod:`neuroncore.parallel.pipeline`; with pp 1, forward then backward of
    each micro-batch), its gradient buckets synchronised over its DP group, AdamW (on the 1/dp
    shard with ZeRO-1, then all-gather). With pp > 1 the first stage holds the embedding, the last
    the head and loss, and each stage receives its input activation (and sends its output) and
    receives its output's gradient (and sends its input's) as collective-permutes under
    ``model/pipeline/microbatch.k/``: the receive of a stage waiting for its peer is the bubble."""
    if not 0 <= stage < plan.pp:
        raise PlanError(f"stage {stage} is not a stage of a {plan.pp}-stage pipeline")
    r = RankShapes.of(model, plan.micro_batch, plan.seq, plan.tp, plan.sequence_parallel)
    dtype, master = plan.compute_dtype, plan.master_dtype
    suffix = f"_stage{stage}" if plan.pp > 1 else ""
    b = GraphBuilder(f"{model.name}_train_step{suffix}", root_layer="model")
    layers = model.layers
    mine = stage_layers(layers, plan.pp, stage)
    first, last = stage == 0, stage == plan.pp - 1
    acc: list[list[Op] | None] = [None] * (layers + 1)  # per layer (+ head) accumulated gradients
    outs: dict[int, Op] = {}
    saved: dict[int, list[Saved]] = {}
    for kind, k in one_f_one_b(stage, plan.pp, plan.micro_batches):
        if kind is Pass.FORWARD:
            if first:
                with b.scope("forward"), b.scope(f"microbatch.{k}"):
                    x = embedding_ops(b, model, r, plan.tp, dtype)
            else:
                with b.scope("pipeline"), b.scope(f"microbatch.{k}"), b.scope("recv_activation"):
                    x = _permute(b, b.parameter(f"recv_activation.{k}", (r.sp_tokens, r.hidden), dtype),
                                 k, "activation", "recv", stage - 1)
            saved[k] = []
            with b.scope("forward"), b.scope(f"microbatch.{k}"):
                for i in mine:
                    with b.scope(f"layers.{i}"):
                        x, kept = forward_ops(b, model, r, plan.tp, dtype, x)
                    saved[k].append(kept)
            outs[k] = x
            if not last:
                with b.scope("pipeline"), b.scope(f"microbatch.{k}"), b.scope("send_activation"):
                    _permute(b, x, k, "activation", "send", stage + 1)
            continue
        head_grads: list[Op] = []
        if last:
            with b.scope("backward"), b.scope(f"microbatch.{k}"):
                _, dy, head_grads = head_ops(b, model, r, plan.tp, dtype, outs[k])
        else:
            with b.scope("pipeline"), b.scope(f"microbatch.{k}"), b.scope("recv_gradient"):
                dy = _permute(b, b.parameter(f"recv_gradient.{k}", outs[k].shape, outs[k].dtype),
                              k, "gradient", "recv", stage + 1)
        grads_by_layer: dict[int, list[Op]] = {}
        with b.scope("backward"), b.scope(f"microbatch.{k}"):
            for j, i in reversed(list(enumerate(mine))):
                with b.scope(f"layers.{i}"):
                    dy, grads_by_layer[i] = backward_ops(b, model, r, plan.tp, dtype, saved[k][j], dy)
        if not first:
            with b.scope("pipeline"), b.scope(f"microbatch.{k}"), b.scope("send_gradient"):
                _permute(b, dy, k, "gradient", "send", stage - 1)
        with b.scope("backward"), b.scope(f"microbatch.{k}"):
            produced = [(i, grads_by_layer[i]) for i in mine] + ([(layers, head_grads)] if last else [])
            for i, grads in produced:
                flat = _flat(b, grads, master)
                previous = acc[i]
                acc[i] = [flat if previous is None else b.add(previous[0], flat)]
        del saved[k]
    held = ([layers] if last else []) + list(reversed(mine))  # head first: its gradients are final first
    outputs: list[Op] = []
    itemsize = 4 if master == "fp32" else 2
    bucket: list[Op] = []
    buckets: list[list[Op]] = []
    size = 0
    for n_held, i in enumerate(held):
        grad = acc[i]
        assert grad is not None
        bucket.append(grad[0])
        size += grad[0].size * itemsize
        if size >= DDP_BUCKET_BYTES or n_held == len(held) - 1:
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


@dataclass
class _StageRun:
    """One pipeline stage's step program on its first rank's core, its collectives timed."""

    program: Program
    loaded: LoadedModel
    costs: np.ndarray
    templates: list[CollectiveRecord]
    groups: list[str]


class TrainingStepRun:
    """Rank 0's step program (rank 0 of every pipeline stage's, with pp > 1) loaded on its core, its
    collectives timed for their groups."""

    def __init__(self, model: Transformer, plan: ParallelPlan, programs: list[tuple[Program, LoadedModel]],
                 topology: Topology) -> None:
        self.model, self.plan, self.topology = model, plan, topology
        self.stages = [self._stage(s, program, loaded) for s, (program, loaded) in enumerate(programs)]
        self.program, self.loaded = programs[0]
        self.steps = 0
        self.last_results: list[ExecutionResult] = []
        core_spec = self.loaded.core.spec
        self.peak_flops_per_rank = (core_spec.pe_peak_fp32_flops_per_s if plan.precision == "fp32"
                                    else core_spec.pe_peak_bf16_flops_per_s)
        self.step_flops = model_flops(model, plan)

    def _stage(self, stage: int, program: Program, loaded: LoadedModel) -> _StageRun:
        plan, topology = self.plan, self.topology
        width = plan.tp * plan.dp  # ranks per stage: TP innermost, then DP, then PP (Megatron)
        base = stage * width
        _, _, dp_groups = rank_layout(plan)
        dp_groups = [[base + r for r in g] for g in dp_groups]
        tp_groups = [[base + d * plan.tp + t for t in range(plan.tp)] for d in range(plan.dp)]
        templates: list[CollectiveRecord] = []
        groups: list[str] = []
        memo: dict[tuple[str, str, int, str, int], CollectiveRecord] = {}
        costs = program.cost_ns.copy()
        for node in program.collective_nodes:
            op = program.graph.ops[int(program.op_index[node])]
            group = str(op.attrs.get("group", "tp"))
            peer = int(op.attrs.get("pp_peer", -1))
            key = (op.opcode, group, op.operands[0].size, op.dtype.value, peer)
            if key not in memo:
                if group == "pp":  # every rank of the stage with its peer in the other stage
                    sender, receiver = (stage, peer) if op.attrs["pp_role"] == "send" else (peer, stage)
                    pairs = [[sender * width + j, receiver * width + j] for j in range(width)]
                    memo[key] = cc.permute(topology, pairs, key[2], key[3])
                else:
                    groups_of = tp_groups if group == "tp" else dp_groups
                    memo[key] = cc.collective(CC_OPERATIONS[op.opcode], topology, groups_of, key[2], key[3])
            templates.append(memo[key])
            groups.append(group)
            costs[node] = memo[key].duration_ns
        return _StageRun(program, loaded, costs, templates, groups)

    @classmethod
    def load(cls, model: Transformer, plan: ParallelPlan,
             instance: Instance | None = None) -> TrainingStepRun:
        topology = instance_topology(plan.instance, nodes=plan.nodes)
        plan.check(model, topology)
        inst = instance or Instance(plan.instance, nodes=plan.nodes)
        if inst.name != plan.instance:
            raise PlanError(f"the plan is for {plan.instance}, the instance is {inst.name}")
        programs = []
        for stage in range(plan.pp):
            program = compile_graph(step_graph(model, plan, stage), inst.spec.chip.core)
            if program.n_instructions > MAX_STEP_INSTRUCTIONS:
                raise PlanError(f"the step program has {program.n_instructions:,} instructions (over "
                                f"{MAX_STEP_INSTRUCTIONS:,}); profile fewer layers, micro-batches or a "
                                f"shorter sequence")
            rank = stage * plan.tp * plan.dp
            programs.append((program, inst.core(topology.physical_cores_of(rank)[0]).load(program)))
        return cls(model, plan, programs, topology)

    def _settle(self, t0: float) -> tuple[list[Timeline], list[dict[int, float]]]:
        """Each stage's schedule with its pipeline receives waiting for their sends: in the order the
        sends happen (:func:`~neuroncore.parallel.pipeline.execution_order`), a receive lasts from
        its own start to the end of the transfer, which starts when both the send and the receive
        have started. Returns the timelines and, per stage, each permute node's transfer start."""
        stages = self.stages
        costs = [st.costs.copy() for st in stages]
        timelines: list[Timeline | None] = [None] * len(stages)
        transfer_start: list[dict[int, float]] = [{} for _ in stages]
        nodes: dict[tuple[int, int, str, str], int] = {}  # (stage, k, kind, role) -> node
        for s, st in enumerate(stages):
            for node, group in zip(st.program.collective_nodes, st.groups):
                if group == "pp":
                    op = st.program.graph.ops[int(st.program.op_index[node])]
                    nodes[(s, int(op.attrs["pp_micro_batch"]), str(op.attrs["pp_kind"]),
                           str(op.attrs["pp_role"]))] = int(node)

        def timeline(s: int) -> Timeline:
            current = timelines[s]
            if current is None:
                current = timelines[s] = schedule(stages[s].program, t0, costs[s])
            return current

        for s, kind, k in execution_order(len(stages), self.plan.micro_batches):
            last = s == len(stages) - 1
            if kind is Pass.FORWARD and not last:
                what, peer = "activation", s + 1
            elif kind is Pass.BACKWARD and s > 0:
                what, peer = "gradient", s - 1
            else:
                continue
            send, recv = nodes[(s, k, what, "send")], nodes[(peer, k, what, "recv")]
            sent = float(timeline(s).start_ns[send])
            posted = float(timeline(peer).start_ns[recv])
            start = max(sent, posted)
            transfer_start[s][send], transfer_start[peer][recv] = sent, start
            wait = start + float(stages[s].costs[send]) - posted
            if wait != costs[peer][recv]:
                costs[peer][recv] = wait
                timelines[peer] = None
        return [timeline(s) for s in range(len(stages))], transfer_start

    def execute(self) -> tuple[ExecutionResult, list[CollectiveOverlap], dict[str, float]]:
        """One step (timing only): every stage's execution recorded on its core, then a TRAIN_STEP
        batch per stage; returns stage 0's (with pp 1, the one program's)."""
        host_start = time.time_ns()
        with cores_held([st.loaded.core for st in self.stages]) as t0:
            timelines, transfer_start = self._settle(float(t0))
            outcomes = []
            for s, (st, timeline) in enumerate(zip(self.stages, timelines)):
                nodes = st.program.collective_nodes
                placed = []
                for n, tpl in zip(nodes, st.templates):
                    start = transfer_start[s].get(int(n), float(timeline.start_ns[n]))
                    placed.append((int(n), tpl.shifted(start - tpl.start_ns)))
                result = st.loaded.record(t0, timeline, None, True, placed, host_start_ns=host_start)
                outcomes.append((result, timeline, placed))
        self.steps += 1
        self.last_results = [result for result, _, _ in outcomes]
        step_ns = max(r.end_ns for r in self.last_results) - t0
        first: tuple[ExecutionResult, list[CollectiveOverlap], dict[str, float]] | None = None
        for st, (result, timeline, placed) in zip(self.stages, outcomes):
            nodes = st.program.collective_nodes
            overlap = compute_overlap(st.program, timeline, nodes)
            rows = []
            for k, (node, rec) in enumerate(placed):
                op = st.program.graph.ops[int(st.program.op_index[node])]
                rows.append(CollectiveOverlap(node, op.name, rec.operation, st.groups[k],
                                              float(timeline.start_ns[node]), float(timeline.end_ns[node]),
                                              rec.size_bytes, float(overlap[k])))
            levels = _levels(st.program, timeline)
            if st.loaded.sink.active:
                self._emit(st.loaded, result, rows, levels, host_start, step_ns)
            if first is None:
                first = (result, rows, levels)
        assert first is not None
        return first

    @property
    def step_time_ns(self) -> int:
        """The last step's device time: from its start to the last stage's end."""
        if not self.last_results:
            return 0
        return max(r.end_ns for r in self.last_results) - min(r.start_ns for r in self.last_results)

    def _emit(self, loaded: LoadedModel, result: ExecutionResult, rows: list[CollectiveOverlap],
              levels: dict[str, float], host_start: int, step_ns: int) -> None:
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
        loaded.sink.emit(RecordKind.TRAIN_STEP, columns, TrainStepMeta(
            execution_id=result.execution_id, model_id=result.model_id, core=result.core,
            step=self.steps, step_time_ns=step_ns, start_ns=result.start_ns,
            global_batch=plan.global_batch, seq=plan.seq, model_flops=self.step_flops, ranks=plan.world,
            peak_flops_per_rank=self.peak_flops_per_rank, levels=dict(levels), layout=plan.key(model.name),
            host_start_ns=host_start, host_end_ns=time.time_ns()))


def _levels(program: Program, timeline: Timeline) -> dict[str, float]:
    """Busy time per level (union of its nodes' intervals; collectives count in their level:
    gradient buckets in gradient_sync, tensor-parallel ones in forward/backward; pipeline sends and
    receives are under ``model/pipeline``, no level: a receive's wait is the bubble, not work)."""
    ops = program.graph.ops
    level_of = np.array([_level(ops[int(i)].layer) if i >= 0 else -1 for i in program.op_index])
    out = {}
    for k, name in enumerate(LEVELS):
        mask = level_of == k
        if not mask.any():
            out[name] = 0.0
            continue
        s, e = _busy_union(timeline.start_ns[mask], timeline.end_ns[mask])
        out[name] = float((e - s).sum())
    return out


def _level(layer: str) -> int:
    parts = layer.split("/")
    if len(parts) > 1 and parts[1] in LEVELS:
        return LEVELS.index(parts[1])
    return -1


__all__ = ["LEVELS", "CollectiveOverlap", "TrainingStepRun", "compute_overlap", "step_graph"]
