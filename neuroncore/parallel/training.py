"""Timing a whole parallel training step: tensor, pipeline and data parallel, ZeRO-1, on the topology.

    plan = ParallelPlan(tp=8, pp=1, dp=64, zero1=True, micro_batch=1, global_batch=1024, seq=4096,
                        instance="trn1.32xlarge", nodes=16)
    step = time_training_step(LLAMA["llama2-7b"], plan)
    step.step_ns, step.parts, step.collectives          # where the step's time went

**What is simulated.** Every rank of a Megatron layout runs the same programs on the same shapes
(symmetric ranks), so one rank's programs are compiled and run once on the execution core: one
layer's forward and backward (all layers have the same shapes; tensor-parallel all-reduces inside
them timed on the instance topology over the rank's TP group), the embedding/head/loss program and
the AdamW update. The step is then composed from those timings, the way the frameworks schedule it:

* **Micro-batches and pipeline (1F1B).** ``M = global_batch / (dp x micro_batch)`` micro-batches
  per step. A stage holds ``layers / pp`` layers; 1F1B runs ``M + pp - 1`` forward+backward slots
  of the slowest stage (Megatron-LM's schedule: the bubble is ``(pp - 1) / M`` of the step), each
  slot also paying the activation send/recv to the next stage (a Permute between the stages' ranks,
  over NeuronLink or EFA).
* **Gradient synchronisation (DP).** Gradients are all-reduced over the DP group in buckets
  (PyTorch DDP's default ``bucket_cap_mb = 25``) on the CC-core's stream while the last
  micro-batch's backward still runs: a bucket starts when its layers' gradients are final and the
  previous bucket is done; only what runs past the end of the backward is exposed.
* **ZeRO-1** (NxD ``NeuronZero1Optimizer``): reduce-scatter instead of all-reduce (same buckets,
  same overlap), the optimizer on ``1 / dp`` of the parameters, then an all-gather of the updated
  parameters before the next forward (exposed: nothing else is left to run).
* **Optimizer.** AdamW over fp32 master weights, simulated on a chunk and scaled (a linear stream).
* **Sequence parallelism** (Megatron-LM; NxD's ``--sequence_parallel_enabled``, on for Llama): the
  layer programs hold ``1 / tp`` of the tokens outside the tensor-parallel blocks, all-gather into
  and reduce-scatter out of each block (:func:`neuroncore.workloads.train_graphs._enter_tp`).

DP collectives over several nodes are hierarchical (``neuroncore.collectives.hierarchical``: in
the node, across nodes over EFA on 1 / local of the data, in the node again).

Not modelled (stated in docs/training.md): interleaved pipeline schedules,
HBM contention between overlapped collectives and compute,
gradient-norm clipping (one scalar all-reduce), the host and data loader.
"""

from __future__ import annotations

import functools
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from neuroncore import collectives as cc
from neuroncore.collectives.record import CollectiveRecord
from neuroncore.compiler import compile as compile_graph
from neuroncore.compiler.program import Program
from neuroncore.hardware import INSTANCE_TYPES, CoreSpec
from neuroncore.ir.graph import Graph
from neuroncore.runtime.scheduler import schedule
from neuroncore.topology import Topology, instance_topology
from neuroncore.workloads.train_graphs import (
    OPTIMIZER_CHUNK,
    RankShapes,
    Transformer,
    head_graph,
    layer_backward,
    layer_forward,
    optimizer_graph,
)

DDP_BUCKET_BYTES = 25 * 2**20  # torch.nn.parallel.DistributedDataParallel bucket_cap_mb default
CC_OPERATIONS = {"all-reduce": cc.ALL_REDUCE, "all-gather": cc.ALL_GATHER,
                 "reduce-scatter": cc.REDUCE_SCATTER}


class PlanError(ValueError):
    """A parallel layout that cannot run: one line, the CLI's exit 2."""


@dataclass(frozen=True)
class ParallelPlan:
    """How a training job is laid out over ``nodes`` instances (Megatron rank order: TP innermost,
    then DP, then PP)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    zero1: bool = False
    micro_batch: int = 1
    global_batch: int = 1
    seq: int = 128
    instance: str = "trn1.32xlarge"
    nodes: int = 1
    precision: str = "bf16-autocast"  # "bf16-autocast" (fp32 master + optimizer) or "bf16-sr"
    activation_checkpointing: bool = False  # full recompute of each layer's forward in the backward
    # Megatron-LM sequence parallelism: norms, residual adds and dropout on 1/tp of the tokens,
    # all-gather into and reduce-scatter out of each tensor-parallel block (NxD --sequence_parallel_enabled)
    sequence_parallel: bool = False

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def micro_batches(self) -> int:
        return self.global_batch // (self.dp * self.micro_batch)

    def key(self, model: str) -> str:
        """The benchmark key ``<model>/<nodes>x<instance>/tp<T>pp<P>dp<D>/seq<S>/gbs<G>``."""
        return (f"{model}/{self.nodes}x{self.instance}/tp{self.tp}pp{self.pp}dp{self.dp}/"
                f"seq{self.seq}/gbs{self.global_batch}")

    def check(self, model: Transformer, topology: Topology) -> None:
        for name in ("tp", "pp", "dp", "micro_batch", "global_batch", "seq", "nodes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise PlanError(f"{name} must be a positive integer, not {value!r}")
        try:
            model.check(self.tp)
        except ValueError as exc:
            raise PlanError(str(exc)) from None
        if self.world != topology.cores:
            raise PlanError(f"tp {self.tp} x pp {self.pp} x dp {self.dp} = {self.world} ranks, but "
                            f"{topology.name} has {topology.cores} NeuronCores")
        if self.global_batch % (self.dp * self.micro_batch):
            raise PlanError(f"global batch {self.global_batch} is not a multiple of dp {self.dp} x "
                            f"micro-batch {self.micro_batch}")
        if model.layers % self.pp:
            raise PlanError(f"{model.name}: pp {self.pp} does not divide {model.layers} layers")
        if self.sequence_parallel and self.tp > 1 and (self.micro_batch * self.seq) % self.tp:
            raise PlanError(f"sequence parallelism needs tp {self.tp} to divide the "
                            f"{self.micro_batch * self.seq} tokens of a micro-batch")
        if self.precision not in ("bf16-autocast", "bf16-sr", "fp32"):
            raise PlanError(f"precision must be bf16-autocast, bf16-sr or fp32, not {self.precision!r}")

    @property
    def compute_dtype(self) -> str:
        return "fp32" if self.precision == "fp32" else "bf16"

    @property
    def master_dtype(self) -> str:
        """Parameters the optimizer updates (and so the gradients and the ZeRO-1 all-gather)."""
        return "bf16" if self.precision == "bf16-sr" else "fp32"


@dataclass
class ProgramTiming:
    """One rank program run once on the core: its device time and the collectives inside it."""

    name: str
    device_ns: float
    flops: int
    instructions: int
    collectives: list[CollectiveRecord]
    compile_s: float
    sim_s: float
    program: Program | None = None

    @property
    def collective_ns(self) -> float:
        return float(sum(r.duration_ns for r in self.collectives))


@dataclass(frozen=True)
class SyncCollective:
    """A gradient-synchronisation (or ZeRO-1 all-gather) collective placed on the step's timeline."""

    operation: str
    bytes: int
    start_ns: float
    end_ns: float
    overlapped_ns: float  # of its duration, how much ran while the backward still computed

    @property
    def duration_ns(self) -> float:
        return self.end_ns - self.start_ns


@dataclass
class StepTiming:
    """A composed training step of one (symmetric) rank."""

    model: Transformer
    plan: ParallelPlan
    forward_layer: ProgramTiming
    backward_layer: ProgramTiming
    head: ProgramTiming
    optimizer: ProgramTiming
    parts: dict[str, float]  # level -> ns on the step's critical path
    sync: list[SyncCollective] = field(default_factory=list)
    p2p_ns: float = 0.0
    sim_wall_s: float = 0.0
    peak_flops_per_core: float = 0.0
    programs_reused: int = 0  # of the four programs, how many an earlier step had compiled

    @property
    def programs(self) -> list[ProgramTiming]:
        return [self.forward_layer, self.backward_layer, self.head, self.optimizer]

    @property
    def step_ns(self) -> float:
        return float(sum(self.parts.values()))

    @property
    def tokens_per_step(self) -> int:
        return self.plan.global_batch * self.plan.seq

    @property
    def model_flops(self) -> float:
        return model_flops(self.model, self.plan)

    @property
    def sync_overlapped_ns(self) -> float:
        return float(sum(s.overlapped_ns for s in self.sync))

    @property
    def sync_total_ns(self) -> float:
        return float(sum(s.duration_ns for s in self.sync))


def model_flops(model: Transformer, plan: ParallelPlan) -> float:
    """Model FLOPs of a step (PaLM's appendix B: 6 N per token for the weights plus 12 L h s for
    attention), the numerator of training MFU: independent of recomputation and padding."""
    per_token = 6 * model.params() + 12 * model.layers * model.hidden * plan.seq
    return float(per_token * plan.global_batch * plan.seq)


def rank_layout(plan: ParallelPlan) -> tuple[list[int], list[int], list[list[int]]]:
    """Rank 0's TP group, its DP group, and every DP group of its stage (Megatron order)."""
    tp_group = list(range(plan.tp))
    dp_groups = [[t + d * plan.tp for d in range(plan.dp)] for t in range(plan.tp)]
    return tp_group, dp_groups[0], dp_groups


@functools.lru_cache(maxsize=64)
def _topology(instance: str, nodes: int) -> Topology:
    return instance_topology(instance, nodes=nodes)


PROGRAM_CACHE_SIZE = 8  # a 70B layer's program is ~300k instructions: keep a few, not all


@dataclass(frozen=True)
class ProgramKey:
    """Everything a rank program of :mod:`neuroncore.workloads.train_graphs` is built from: two
    configurations with equal keys (BERT-large on 1 and on 16 nodes: only the DP group differs)
    compile the same program, so it is compiled once and only its collectives are re-timed."""

    kind: str  # "forward", "backward", "head", "optimizer"
    model: Transformer | None
    shapes: RankShapes | None
    tp: int
    dtypes: tuple[str, ...]
    core: str
    elements: int = 0  # the optimizer's chunk


_PROGRAMS: OrderedDict[ProgramKey, tuple[Program, float]] = OrderedDict()


def compiled(key: ProgramKey, build: Callable[[], Graph], core: CoreSpec) -> tuple[Program, float, bool]:
    """(program, seconds its compilation took, whether it came from the cache)."""
    hit = _PROGRAMS.get(key)
    if hit is not None:
        _PROGRAMS.move_to_end(key)
        return hit[0], 0.0, True
    t0 = time.perf_counter()
    program = compile_graph(build(), core)
    spent = time.perf_counter() - t0
    _PROGRAMS[key] = (program, spent)
    while len(_PROGRAMS) > PROGRAM_CACHE_SIZE:
        _PROGRAMS.popitem(last=False)
    return program, spent, False


def clear_program_cache() -> None:
    """Forget every compiled rank program (the next step compiles its own)."""
    _PROGRAMS.clear()


def time_program(graph: Graph | Program, topology: Topology, tp_group: Sequence[int], name: str,
                 *, keep_program: bool = False, compile_s: float = 0.0) -> ProgramTiming:
    """Compile ``graph`` for the instance's core (or take an already compiled ``Program``) and run
    it once (timing only), its collectives timed over ``tp_group`` on ``topology`` as the
    tensor-parallel group executes them."""
    t0 = time.perf_counter()
    program = graph if isinstance(graph, Program) else compile_graph(graph, topology.instance.chip.core)
    t1 = time.perf_counter()
    if isinstance(graph, Program):
        t0 = t1 - compile_s
    costs = program.cost_ns.copy()
    records: list[CollectiveRecord] = []
    memo: dict[tuple[str, int, str], CollectiveRecord] = {}
    for node in program.collective_nodes:
        op = program.graph.ops[int(program.op_index[node])]
        key = (op.opcode, op.operands[0].size, op.dtype.value)
        if key not in memo:
            memo[key] = cc.collective(CC_OPERATIONS[op.opcode], topology, [list(tp_group)], key[1], key[2])
        records.append(memo[key])
        costs[node] = memo[key].duration_ns
    timeline = schedule(program, 0.0, costs)
    device = float(timeline.end_ns.max()) if len(timeline.end_ns) else 0.0
    return ProgramTiming(name, device, int(program.adjusted_flops.sum()), program.n_instructions,
                         records, t1 - t0, time.perf_counter() - t1, program if keep_program else None)


def _grad_buckets(layer_bytes: int, layers: int, other_bytes: int) -> list[tuple[int, int]]:
    """(bytes, layers of backward that must finish before the bucket is ready), in backward order:
    layers fill buckets of ``DDP_BUCKET_BYTES`` from the last layer down; the head's and embedding's
    gradients close the last bucket."""
    buckets: list[tuple[int, int]] = []
    fill = 0
    for done in range(1, layers + 1):
        fill += layer_bytes
        while fill >= DDP_BUCKET_BYTES:
            buckets.append((DDP_BUCKET_BYTES, done))
            fill -= DDP_BUCKET_BYTES
    buckets.append((fill + other_bytes, layers))
    return [b for b in buckets if b[0] > 0]


def _sync_schedule(topology: Topology, dp_groups: list[list[int]], operation: str,
                   buckets: list[tuple[int, int]], dtype: str, itemsize: int, backward_layer_ns: float,
                   backward_end_ns: float, backward_start_ns: float,
                   head_ns: float = 0.0) -> list[SyncCollective]:
    """Bucketed gradient collectives on one CC stream, each starting when its layers' backward of the
    last micro-batch is done and the previous bucket finished. The backward begins with the head and
    loss (``head_ns``, before any layer's gradients exist), then runs the layers last to first."""
    placed: list[SyncCollective] = []
    free = backward_start_ns
    dp = len(dp_groups[0])
    memo: dict[int, float] = {}
    for nbytes, layers_done in buckets:
        count = max(dp, nbytes // itemsize // dp * dp)
        if count not in memo:
            memo[count] = cc.collective(operation, topology, dp_groups, count, dtype).duration_ns
        ready = backward_start_ns + head_ns + layers_done * backward_layer_ns
        start = max(ready, free)
        end = start + memo[count]
        overlapped = max(0.0, min(end, backward_end_ns) - start)
        placed.append(SyncCollective(operation, count * itemsize, start, end, overlapped))
        free = end
    return placed


def time_training_step(model: Transformer, plan: ParallelPlan) -> StepTiming:
    """Simulate one rank's programs and compose the step (see the module docstring)."""
    if plan.instance not in INSTANCE_TYPES:
        raise PlanError(f"unknown instance {plan.instance!r}; known: {', '.join(sorted(INSTANCE_TYPES))}")
    wall0 = time.perf_counter()
    topology = _topology(plan.instance, plan.nodes)
    plan.check(model, topology)
    tp_group, _, dp_groups = rank_layout(plan)
    shapes = RankShapes.of(model, plan.micro_batch, plan.seq, plan.tp, plan.sequence_parallel)
    dtype = plan.compute_dtype
    grad_dtype = plan.master_dtype
    core = topology.instance.chip.core
    reused = 0

    def timed(key: ProgramKey, build: Callable[[], Graph]) -> ProgramTiming:
        nonlocal reused
        program, compile_s, hit = compiled(key, build, core)
        reused += hit
        return time_program(program, topology, tp_group, key.kind, compile_s=compile_s)

    def layer_key(kind: str, *dtypes: str) -> ProgramKey:
        return ProgramKey(kind, model, shapes, plan.tp, dtypes, core.name)

    fwd = timed(layer_key("forward", dtype), lambda: layer_forward(model, shapes, plan.tp, dtype))
    bwd = timed(layer_key("backward", dtype, grad_dtype),
                lambda: layer_backward(model, shapes, plan.tp, dtype, grad_dtype))
    head = timed(layer_key("head", dtype), lambda: head_graph(model, shapes, plan.tp, dtype))
    layers_per_stage = model.layers // plan.pp
    params_rank = math.ceil(model.params() / (plan.tp * plan.pp))
    opt_elements = math.ceil(params_rank / plan.dp) if plan.zero1 else params_rank
    chunk = min(OPTIMIZER_CHUNK, opt_elements)
    opt = timed(ProgramKey("optimizer", None, None, 1, (plan.master_dtype, grad_dtype, dtype), core.name,
                           chunk),
                lambda: optimizer_graph(chunk, plan.master_dtype, grad_dtype, dtype))
    opt.device_ns *= opt_elements / chunk
    opt.flops = int(opt.flops * opt_elements / chunk)

    recompute = fwd.device_ns if plan.activation_checkpointing else 0.0
    # the slowest stage: the last holds the head (and, with one stage, the embedding too)
    slot_f = layers_per_stage * fwd.device_ns
    slot_b = layers_per_stage * (bwd.device_ns + recompute) + head.device_ns
    p2p = 0.0
    if plan.pp > 1:
        count = shapes.sp_tokens * model.hidden  # with sequence parallelism each rank sends its shard
        pairs = [[t, t + plan.tp * plan.dp] for t in range(plan.tp)]  # stage 0 -> stage 1, all TP ranks
        p2p = cc.permute(topology, pairs, count, dtype).duration_ns
    slots = plan.micro_batches + plan.pp - 1
    bubble = (plan.pp - 1) * (slot_f + slot_b + 2 * p2p)
    forward_ns = plan.micro_batches * slot_f
    backward_ns = plan.micro_batches * slot_b
    itemsize = 4 if grad_dtype == "fp32" else 2
    layer_bytes = math.ceil(model.layer_params() / plan.tp) * itemsize
    other_bytes = math.ceil(model.other_params() / plan.tp) * itemsize if plan.pp == 1 else 0
    sync: list[SyncCollective] = []
    exposed_sync = 0.0
    if plan.dp > 1:
        step_compute = slots * (slot_f + slot_b + 2 * p2p)
        last_backward_start = step_compute - slot_b
        op = cc.REDUCE_SCATTER if plan.zero1 else cc.ALL_REDUCE
        buckets = _grad_buckets(layer_bytes, layers_per_stage, other_bytes)
        sync = _sync_schedule(topology, dp_groups, op, buckets, grad_dtype, itemsize,
                              bwd.device_ns + recompute, step_compute, last_backward_start,
                              head.device_ns)
        exposed_sync = max(0.0, sync[-1].end_ns - step_compute)
    gather = 0.0
    if plan.zero1 and plan.dp > 1:
        # the updated parameters are gathered in the model's dtype: with bf16 auto-cast each rank
        # rounds its shard of the FP32 masters to bf16 and the bf16 shards are gathered (NxD's
        # NeuronZero1Optimizer; the step program of train_step.py and ZeroOneTrainStep do the same)
        shard = max(1, math.ceil(params_rank / plan.dp))
        rec = cc.all_gather(topology, dp_groups, shard, dtype)
        gather = rec.duration_ns
        start = slots * (slot_f + slot_b + 2 * p2p) + exposed_sync + opt.device_ns
        sync.append(SyncCollective(cc.ALL_GATHER, shard * plan.dp * (4 if dtype == "fp32" else 2), start,
                                   start + gather, 0.0))
    parts = {
        "forward": forward_ns,
        "backward": backward_ns,
        "pipeline": bubble + plan.micro_batches * 2 * p2p,
        "gradient_sync": exposed_sync + gather,
        "optimizer": opt.device_ns,
    }
    core = topology.instance.chip.core
    peak = core.pe_peak_fp32_flops_per_s if plan.precision == "fp32" else core.pe_peak_bf16_flops_per_s
    return StepTiming(model, plan, fwd, bwd, head, opt, parts, sync, p2p,
                      time.perf_counter() - wall0, peak, reused)


def overlap_fraction(sync: Sequence[SyncCollective]) -> float:
    """Share of the gradient collectives' time hidden under the backward pass."""
    total = sum(s.duration_ns for s in sync)
    return float(sum(s.overlapped_ns for s in sync) / total) if total else 0.0


__all__ = ["DDP_BUCKET_BYTES", "ParallelPlan", "PlanError", "ProgramKey", "ProgramTiming", "StepTiming",
           "SyncCollective", "clear_program_cache", "compiled", "model_flops", "overlap_fraction",
           "rank_layout", "time_program", "time_training_step"]
