"""Per-instruction costs: the engine-cycle formulas of neuroncore.md §3.3 and §4, and DMA timing (§5).

Costs are initiation intervals: the time an instruction occupies its engine before the next one can
start. They depend only on shapes, dtypes and memories, so they are computed once at compile time.
Every formula names its source; values the public sources do not give are marked as assumptions.
"""

from __future__ import annotations

import math

from neuroncore.dtypes import DType
from neuroncore.hardware import CoreSpec, Engine

# ---- Tensor engine (§3.3) --------------------------------------------------------------------


def matmul_cycles(spec: CoreSpec, moving_free: int, dtype: DType) -> int:
    """MultiplyMoving II = max(N_moving, MM_INIT_LATENCY) PE cycles; FP32 costs x4 (two passes).

    BF16, FP16, TF32 and FP8 all run at this rate per instruction (§3.3); FP8's 2x on NC-v3 comes
    from the instruction covering K = 256 (``double_row``), not from a shorter instruction.
    """
    cycles = max(moving_free, spec.mm_init_latency_cycles)
    if dtype is DType.FP32:
        cycles *= spec.fp32_matmul_factor
    return cycles


def double_row(spec: CoreSpec, dtype: DType) -> bool:
    """Whether matmuls of ``dtype`` use NC-v3's FP8 double-row mode: K up to 256 per instruction
    in the time of a K = 128 BF16 one (§3.1), i.e. twice the BF16 FLOP rate (158 TFLOPS)."""
    return spec.fp8_double_row and dtype.is_fp8


def contraction_per_matmul(spec: CoreSpec, dtype: DType) -> int:
    """Rows of K one MultiplyMoving contracts: 128 (the PE rows), 256 for double-row FP8."""
    return spec.max_contraction * (2 if double_row(spec, dtype) else 1)


def adjusted_flops_factor(spec: CoreSpec, dtype: DType) -> float:
    """BF16-equivalent FLOPs per raw FLOP (§3.6): x4 FP32, x1 BF16/FP16/TF32, FP8 x1 on NC-v2 and
    x0.5 on NC-v3 (where it runs at twice the BF16 rate)."""
    if dtype.is_fp8:
        return 0.5 if spec.fp8_double_row else 1.0
    return dtype.flops_multiplier


def ldweights_cycles(spec: CoreSpec, stationary_free: int, dtype: DType) -> int:
    """Fast LoadStationary: about (stationary free elements) / 4 cycles, at least 16 [assumption]."""
    cycles = max(math.ceil(stationary_free / spec.ls_speedup), 16)
    if dtype is DType.FP32:
        cycles *= 2  # FP32 weights take two passes through the 2x128 input path [assumption]
    return cycles


def pe_transpose_cycles(spec: CoreSpec, partitions: int, free: int) -> int:
    """nc_transpose on the PE: max(P, min(64, F)) cycles (§3.4)."""
    return max(partitions, min(spec.mm_init_latency_cycles, free))


# ---- Vector / Scalar / GpSimd (§4.2) ---------------------------------------------------------


def vector_cycles(spec: CoreSpec, kind: str, n: int, *, inputs_in_psum: int = 0,
                  all_bf16: bool = False) -> int:
    """DVE II for ``tensor_tensor``, ``tensor_scalar``, ``tensor_copy``, ``tensor_reduce``...

    ``n`` is elements per partition of the (first) input.
    """
    floor = spec.min_ii_cycles
    if kind == "tensor_tensor":
        # max(MIN_II, N) when one input is in PSUM, or all-BF16 add/sub/mul in SBUF; else 2N
        if inputs_in_psum or all_bf16:
            return max(floor, n)
        return max(floor, 2 * n)
    if kind == "tensor_reduce":
        return max(floor, n // 2 if all_bf16 else n)
    if kind == "reciprocal":
        return max(floor, 8 * n)
    if kind in ("tensor_scalar", "tensor_copy", "select", "memset"):
        return max(floor, n)
    raise ValueError(f"no Vector cost formula for {kind}")


def vector_perf_mode(spec: CoreSpec, kind: str, all_16bit: bool, all_sbuf: bool) -> str | None:
    """NC-v3 DVE performance modes (§2.6): 4x copy/scalar SBUF 16-bit, 2x tensor_tensor 16-bit."""
    if not spec.vector_perf_modes or not all_16bit:
        return None
    if kind in ("tensor_copy", "tensor_scalar"):
        return "4x" if all_sbuf else "2x"
    if kind == "tensor_tensor" and all_sbuf:
        return "2x"
    return None


def perf_mode_divisor(mode: str | None) -> int:
    return {None: 1, "2x": 2, "4x": 4}[mode]


def activation_cycles(spec: CoreSpec, n: int, *, accumulate: bool = False) -> int:
    """ACT II = max(MIN_II, N), + MIN_II for the accumulator read of activation_reduce."""
    cycles = max(spec.min_ii_cycles, n)
    if accumulate:
        cycles += spec.min_ii_cycles
    return cycles


def gpsimd_cycles(spec: CoreSpec, n: int) -> int:
    """POOL instructions such as iota: GPSIMD_START + N cycles."""
    return spec.gpsimd_start_cycles + n


def cycles_to_ns(spec: CoreSpec, engine: Engine, cycles: float) -> float:
    return cycles * 1e9 / spec.clock_hz(engine)


# ---- DMA (§5) --------------------------------------------------------------------------------


def dma_engines_used(spec: CoreSpec, descriptors: int) -> int:
    """A transfer is spread over up to 16 engines, about 8 partition rows each (§5.2)."""
    return max(1, min(spec.dma_engines, descriptors))


def dma_engine_ns(spec: CoreSpec, descriptors: int, bytes_per_descriptor: int) -> float:
    """Time one engine spends on its share: rows x (bytes / engine rate + per-row overhead).

    The per-row overhead (``dma_descriptor_overhead_ns``) is the model's assumption that makes rows
    under 2 KiB inefficient and rows over 4 KiB near the engine rate, as §5.3 describes.
    """
    engines = dma_engines_used(spec, descriptors)
    rows_per_engine = math.ceil(descriptors / engines)
    rate = min(spec.dma_engine_bytes_per_s, spec.hbm_bytes_per_s / spec.dma_engines)
    return rows_per_engine * (bytes_per_descriptor * 1e9 / rate + spec.dma_descriptor_overhead_ns)
