"""The TRAIN_STEP record of a single-core training step (PyTorch or JAX): what a profile's
TrainingStep table and the step figures (``formats.figures.training_step_figures``) read.

A step is one execution, or ``K`` with gradient accumulation (K-1 accumulate programs, then the
update program): its time runs from the first execution's start to the last one's end on the core's
clock, and each phase's busy time (forward, backward, optimizer: ``model/<phase>/...`` layers) is
the union of its nodes' intervals in each execution, summed over the executions.

Model FLOPs, for models that are not the transformer presets (whose 6N + 12Lhs formula the
parallel workloads use): 3 x the FLOPs of the forward's matmuls (the backward computes two matmuls
per forward matmul: the input's and the weight's gradients), per micro-batch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np

from neuroncore.compiler.program import Program
from neuroncore.ir.graph import Graph
from neuroncore.record_kinds import RecordKind, TrainStepMeta
from neuroncore.runtime.device import ExecutionResult, LoadedModel

PHASES = ("forward", "backward", "gradient_sync", "optimizer")  # the levels of a step's hierarchy


def _union_ns(starts: np.ndarray, ends: np.ndarray) -> float:
    """Length of the union of intervals."""
    if not len(starts):
        return 0.0
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    total, cur_s, cur_e = 0.0, float(s[0]), float(e[0])
    for a, z in zip(s[1:].tolist(), e[1:].tolist()):
        if a <= cur_e:
            cur_e = max(cur_e, z)
        else:
            total += cur_e - cur_s
            cur_s, cur_e = a, z
    return total + cur_e - cur_s


def phase_busy_ns(result: ExecutionResult) -> dict[str, float]:
    """Busy time of each phase in one execution (union of its nodes' intervals, ns)."""
    program, timeline = result.program, result.timeline
    ops = program.graph.ops
    phase_of = np.array([_phase_index(ops[int(i)].layer) if i >= 0 else -1 for i in program.op_index])
    busy = {}
    for k, name in enumerate(PHASES):
        mask = phase_of == k
        busy[name] = _union_ns(timeline.start_ns[mask], timeline.end_ns[mask]) if mask.any() else 0.0
    return busy


def _phase_index(layer: str) -> int:
    parts = layer.split("/")
    return PHASES.index(parts[1]) if len(parts) > 1 and parts[1] in PHASES else -1


def low_precision_matmuls(program: Program | Graph) -> bool:
    """Whether most of the forward's matmul FLOPs read bf16/fp16/fp8 operands: an FP32 step whose
    model ran under ``torch.autocast(dtype=torch.bfloat16)`` (the export keeps its casts). Its
    training MFU divides by the bf16 PE peak, as a
    ``precision="bf16"`` step's does, not by the FP32 peak (4x lower: MFU read 4x too high)."""
    graph = program if isinstance(program, Graph) else program.graph
    low = total = 0.0
    for op in graph.ops:
        if op.opcode == "dot" and _phase_index(op.layer) == 0:
            flops = float(math.prod(op.shape))
            total += flops
            if any(x.dtype.itemsize < 4 for x in op.operands):
                low += flops
    return total > 0 and low * 2 > total


def forward_matmul_flops(program: Program | Graph) -> float:
    """2 x M x N x K of every forward matmul (``dot`` under ``model/forward``) of one execution."""
    total = 0.0
    graph = program if isinstance(program, Graph) else program.graph
    for op in graph.ops:
        if op.opcode == "dot" and _phase_index(op.layer) == 0:
            lhs = op.operands[0]
            contract = lhs.shape[int(op.attrs.get("lhs_contract", len(lhs.shape) - 1))]
            total += 2.0 * math.prod(op.shape) * contract
    return total


def emit_step(loaded: LoadedModel, results: Sequence[ExecutionResult], *, step: int, global_batch: int,
              seq: int, name: str, bf16: bool, host_start_ns: int, tp: int = 1,
              whole: Program | Graph | None = None, pp: int = 1,
              model_flops: float | None = None, dp: int = 1) -> None:
    """Report one step (its executions ``results``, the one the record belongs to last) to the
    core's sink. The step runs from the earliest execution's start to the latest one's end.

    A tensor-parallel step (``tp`` ranks, :mod:`neuroncore.parallel.tp_train`) reports ``tp`` ranks
    and the model FLOPs of ``whole``, the unsplit step program: a rank's own program holds its share
    of the matmuls plus whatever every rank computes whole. A pipeline-parallel step
    (:mod:`neuroncore.parallel.pp_train`) reports ``tp x pp`` ranks, its stages' executions (each
    phase's busy time summed over them) and ``model_flops`` computed from its stages' graphs. A
    data-parallel step (``dp`` replicas, :mod:`neuroncore.parallel.dp_train`) reports ``dp`` ranks and
    ``dp`` times one replica's model FLOPs (``global_batch`` counts every replica's sequences)."""
    sink = loaded.sink
    if not sink.active or not results:
        return
    last = results[-1]
    start_ns = min(r.start_ns for r in results)
    end_ns = max(r.end_ns for r in results)
    levels = dict.fromkeys(PHASES, 0.0)
    flops = 0.0
    for result in results:
        for phase, ns in phase_busy_ns(result).items():
            levels[phase] += ns
        if model_flops is None:
            flops += 3.0 * forward_matmul_flops(result.program if whole is None else whole)
    if model_flops is not None:
        flops = model_flops
    else:
        flops *= dp
    core = loaded.core
    low = bf16 or low_precision_matmuls(results[-1].program if whole is None else whole)
    peak = core.spec.pe_peak_bf16_flops_per_s if low else core.spec.pe_peak_fp32_flops_per_s
    empty_i64 = np.zeros(0, np.int64)
    columns = {"name": [], "operation": [], "replica_group_kind": [], "start_ts": empty_i64,
               "end_ts": empty_i64, "duration_ns": empty_i64, "size_bytes": empty_i64,
               "overlap_ns": empty_i64}
    sink.emit(RecordKind.TRAIN_STEP, columns, TrainStepMeta(
        execution_id=last.execution_id, model_id=last.model_id, core=last.core, step=step,
        step_time_ns=end_ns - start_ns, start_ns=start_ns, global_batch=global_batch,
        seq=seq, model_flops=flops, ranks=tp * pp * dp, peak_flops_per_rank=peak, levels=levels,
        layout=f"{name}/1x{core.instance_type}/tp{tp}pp{pp}dp{dp}/seq{seq}/gbs{global_batch}",
        host_start_ns=host_start_ns, host_end_ns=time.time_ns()))


__all__ = ["PHASES", "emit_step", "forward_matmul_flops", "phase_busy_ns"]
