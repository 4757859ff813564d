"""The precision pass: a graph rewritten for ``CompilerOptions`` (auto-cast, int8 weight-only).

It runs first in ``compile`` (after tensor-parallel sharding, which sees the model's own weights),
so every frontend and the builder API get the same options, and ``program.graph`` is the rewritten
graph: ``run_reference(program.graph, ...)`` is the ground truth of what the core computes.

* ``AutoCast.MATMULT``: an FP32 x FP32 ``dot`` (or implicit-GEMM ``convolution``) reads its
  operands cast to the auto-cast type and keeps an FP32 result (PSUM accumulates in FP32); a cast
  weight is folded at compile time into a weight stored in the new type (fewer HBM bytes), a cast
  activation is one copy on an engine. A
  view of a weight (torch exports a ``Linear`` on a non-contiguous ``[B, S, H]`` input as a ``bmm``
  with the weight broadcast over the batch) is cast at its weight and viewed after, as XLA's
  simplifier moves a convert through a broadcast: casting the broadcast was a Vector pass over
  ``B`` copies of the weight on every execution (BERT-base b8: 2 ms of 12.7).
* ``fp8_matmuls``: every BF16/FP16/FP32 ``dot`` reads FP8 E4M3 operands and keeps its result type:
  the model a user quantises to FP8 to run its matmuls in FP8 (the what-if "bf16 -> fp8 matmuls",
  issue 18). Not an auto-cast mode: ``neuronx-cc --auto-cast`` rewrites FP32 operations only, so
  ``--auto-cast-type fp8_e4m3`` leaves a bf16 model's matmuls as they are, here as there.
* ``AutoCast.ALL``: every FP32 value is computed in the auto-cast type; FP32 program inputs are cast
  on the way in and FP32 outputs cast back, so the program's interface does not change. TF32 is a
  Tensor-engine input format only (the other engines compute in FP32 anyway), so with TF32 ``ALL``
  casts the matmuls alone.
* ``Quantization.INT8_WEIGHT_ONLY`` (transformers-neuronx / NxD ``quantized=True``): the weight of a
  linear layer (a 2-D weight on a dot's right-hand side) is stored as int8 with one scale per
  output channel, symmetric (``scale = max|w| / 127`` over the input dim, ``q = round(w / scale)``).
  The int8 weight is cast to the matmul's 16-bit type in the DMA that loads it (casts inside a DMA:
  neuroncore.md §5.3), so HBM and DMA bytes are halved against bf16; the per-channel scale then
  multiplies the matmul's output columns (``x @ (q * s) == (x @ q) * s``): the compiler folds it
  into the PSUM evacuation (a Vector multiply of the FP32 partial sums by an FP32 scale row instead
  of the copy, rounded once to the output type), so it costs one Vector op per output tile, where
  scaling every weight tile would cost a Vector op per weight element. (Unscaled evacuations
  alternate between Scalar and Vector; a scale row along the free dim is Vector's alone, since
  ACTIVATE scales per partition: docs/frontends.md gives what that costs a decode step.) Weights
  sharded over tensor-parallel ranks are quantised per rank, so a row-parallel rank's scales come
  from its own slice of the input dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from neuroncore.compiler.options import (
    AutoCast,
    AutoCastType,
    CompilerOptions,
    OptionsError,
    Quantization,
)
from neuroncore.dtypes import DType, round_to
from neuroncore.ir.graph import Graph, Op, is_weight_view

QUANT_LEVELS = 127.0  # symmetric int8: [-127, 127]
FP8_MATMUL_INPUTS = (DType.FP32, DType.BF16, DType.FP16)  # what fp8_matmuls narrows to FP8 E4M3


@dataclass(frozen=True)
class QuantizedInitializer:
    """One half of an int8 weight-only quantised weight, made from the original weight's values.

    ``part="q"`` gives the int8 values (as FP32 working values), ``part="scale"`` the per-channel
    scales (one per index of ``channel_axis``), both from ``base`` materialised at ``base_shape``
    and rounded to ``base_dtype`` first, like the checkpoint the quantiser would read.
    """

    base: Any  # an Initializer-like object: materialize(shape, rank) -> FP32 array
    base_shape: tuple[int, ...]
    base_dtype: DType
    channel_axis: int
    part: str  # "q" or "scale"

    def materialize(self, shape: tuple[int, ...], rank: int = 0) -> np.ndarray:
        weight = round_to(self.base.materialize(self.base_shape, rank), self.base_dtype)
        q, scale = quantize_int8(weight, self.channel_axis)
        return (q if self.part == "q" else scale).reshape(shape)


def quantize_int8(weight: np.ndarray, channel_axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-channel int8: ``(q, scale)`` with ``weight ~= q * scale`` along ``channel_axis``.

    An all-zero channel gets scale 1 (its q is 0 either way)."""
    reduce_axes = tuple(a for a in range(weight.ndim) if a != channel_axis % weight.ndim)
    amax = np.abs(weight).max(axis=reduce_axes)
    scale = np.where(amax > 0, amax / QUANT_LEVELS, 1.0).astype(np.float32)
    shape = [1] * weight.ndim
    shape[channel_axis % weight.ndim] = -1
    q = np.clip(np.rint(weight / scale.reshape(shape)), -QUANT_LEVELS, QUANT_LEVELS)
    return q.astype(np.float32), scale


def check_options(options: CompilerOptions) -> None:
    """Refuse the combinations no Neuron configuration runs (one line each)."""
    if (options.quantize is Quantization.INT8_WEIGHT_ONLY
            and options.auto_cast is not AutoCast.NONE
            and options.auto_cast_type is AutoCastType.FP8_E4M3):
        raise OptionsError("int8 weight-only quantisation dequantises to a 16-bit matmul; it cannot "
                           "be combined with FP8 auto-cast")


def apply_options(graph: Graph, options: CompilerOptions | None) -> Graph:
    """``graph`` rewritten for ``options`` (the same graph when they change nothing)."""
    if options is None or options.precision_is_default:
        return graph
    check_options(options)
    return _Rewriter(graph, options).run()


class _Rewriter:
    def __init__(self, graph: Graph, options: CompilerOptions) -> None:
        self.graph = graph
        self.options = options
        self.target = options.auto_cast_type.dtype
        self.cast_all = options.auto_cast is AutoCast.ALL and self.target is not DType.TF32
        self.cast_matmuls = options.auto_cast is not AutoCast.NONE
        self.ops: list[Op] = []
        self.new: dict[int, Op] = {}  # old op index -> its value in the new graph
        self.casts: dict[tuple[int, DType], Op] = {}  # (new op id, dtype) -> its cast

    # -- building ------------------------------------------------------------------------------
    def emit(self, like: Op, opcode: str, operands: tuple[Op, ...], shape: tuple[int, ...],
             dtype: DType, attrs: dict[str, Any], name: str) -> Op:
        op = Op(index=len(self.ops), opcode=opcode, name=name, operands=operands, shape=shape,
                dtype=dtype, attrs=attrs, layer=like.layer, frames=like.frames)
        self.ops.append(op)
        return op

    def cast(self, value: Op, dtype: DType) -> Op:
        """``value`` as ``dtype``: one convert per value and type, shared by every reader."""
        if value.dtype is dtype:
            return value
        key = (id(value), dtype)
        if key not in self.casts:
            if is_weight_view(value):
                # a view of a weight (torch's bmm reads a Linear's weight expanded over the batch):
                # cast the weight, which the compiler folds at compile time, and view the cast;
                # rounding each element commutes with a view, so the values are the same
                source = self.cast(value.operands[0], dtype)
                self.casts[key] = self.emit(value, value.opcode, (source,), value.shape, dtype,
                                            dict(value.attrs), f"{value.name}.{dtype.value}")
            else:
                self.casts[key] = self.emit(value, "convert", (value,), value.shape, dtype, {},
                                            f"{value.name}.{dtype.value}")
        return self.casts[key]

    # -- the pass --------------------------------------------------------------------------------
    def run(self) -> Graph:
        for op in self.graph.ops:
            operands = tuple(self.new[o.index] for o in op.operands)
            if op.opcode == "dot":
                result = self.dot(op, operands)
            elif op.opcode == "convolution" and not (self.cast_all and op.dtype is DType.FP32):
                result = self.convolution(op, operands)
            elif op.opcode == "parameter":
                result = self.copy(op, operands, op.dtype)
            elif self.cast_all and op.dtype is DType.FP32:
                operands = tuple(self.cast(o, self.target) if o.dtype is DType.FP32 else o
                                 for o in operands)
                result = self.copy(op, operands, self.target)
            else:
                if self.cast_all:  # e.g. a compare of cast values: its operands agree again
                    operands = tuple(self.cast(o, self.target) if o.dtype is DType.FP32 else o
                                     for o in operands)
                result = self.copy(op, operands, op.dtype)
            self.new[op.index] = result
        outputs = []
        for out in self.graph.outputs:
            value = self.new[out.index]
            outputs.append(self.cast(value, out.dtype) if value.dtype is not out.dtype else value)
        parameters = [self.new[p.index] for p in self.graph.parameters]
        # a quantised weight's original constant (and its cast) are read by nothing now
        return Graph(self.graph.name, self.ops, parameters, outputs).pruned()

    def copy(self, op: Op, operands: tuple[Op, ...], dtype: DType) -> Op:
        return self.emit(op, op.opcode, operands, op.shape, dtype, dict(op.attrs), op.name)

    def dot(self, op: Op, operands: tuple[Op, ...]) -> Op:
        lhs, rhs = operands
        dtype = op.dtype
        if self.cast_all and dtype is DType.FP32:
            lhs, rhs, dtype = self.cast(lhs, self.target), self.cast(rhs, self.target), self.target
        elif (self.cast_matmuls and lhs.dtype is DType.FP32 and rhs.dtype is DType.FP32
              and dtype is DType.FP32):
            lhs, rhs = self.cast(lhs, self.target), self.cast(rhs, self.target)
        if self.options.fp8_matmuls and lhs.dtype in FP8_MATMUL_INPUTS and rhs.dtype in FP8_MATMUL_INPUTS:
            lhs, rhs = self.cast(lhs, DType.FP8_E4M3), self.cast(rhs, DType.FP8_E4M3)
        weight = _weight_source(rhs)
        if (self.options.quantize is Quantization.INT8_WEIGHT_ONLY and weight is not None
                and len(op.shape) == 2 and rhs.dtype.is_float and not rhs.dtype.is_fp8):
            return self.quantized_dot(op, lhs, rhs, weight, dtype)
        return self.emit(op, "dot", (lhs, rhs), op.shape, dtype, dict(op.attrs), op.name)

    def convolution(self, op: Op, operands: tuple[Op, ...]) -> Op:
        """An implicit-GEMM convolution is Tensor-engine matmuls (``lower_conv``): its image and
        kernel are cast as a dot's operands are (``MATMULT``, ``fp8_matmuls``), the result kept
        (PSUM accumulates in FP32), as ``trace(dtype="bf16")`` casts them in the frontend and
        ``neuronx-cc --auto-cast matmult`` casts convolutions."""
        image, kernel, *rest = operands
        if (self.cast_matmuls and image.dtype is DType.FP32 and kernel.dtype is DType.FP32
                and op.dtype is DType.FP32):
            image, kernel = self.cast(image, self.target), self.cast(kernel, self.target)
        if (self.options.fp8_matmuls and image.dtype in FP8_MATMUL_INPUTS
                and kernel.dtype in FP8_MATMUL_INPUTS):
            image, kernel = self.cast(image, DType.FP8_E4M3), self.cast(kernel, DType.FP8_E4M3)
        return self.emit(op, "convolution", (image, kernel, *rest), op.shape, op.dtype,
                         dict(op.attrs), op.name)

    def quantized_dot(self, op: Op, lhs: Op, rhs: Op, weight: Op, dtype: DType) -> Op:
        """``(lhs @ convert(q_int8)) * broadcast(scale)``: the weight stored as int8 + scales."""
        channel_axis = 1 - op.attrs["rhs_contract"]  # the output-channel dim of the 2-D weight
        label = weight.attrs.get("label", weight.name)

        def part(name: str, shape: tuple[int, ...], part_dtype: DType) -> Op:
            init = QuantizedInitializer(weight.attrs["init"], weight.shape, weight.dtype,
                                        channel_axis, name)
            return self.emit(weight, "constant", (), shape, part_dtype,
                             {"init": init, "label": f"{label}.{name}"}, f"{weight.name}.{name}")

        q = part("q", weight.shape, DType.INT8)
        dequantized = self.emit(weight, "convert", (q,), weight.shape, rhs.dtype, {},
                                f"{weight.name}.q.{rhs.dtype.value}")
        # the scales first: the compiler applies them in the matmul's PSUM evacuation
        # (lower_matmul.fused_scale), so they must be placed before the dot is lowered
        # the product and its scaling stay FP32 (PSUM) and are rounded once, to the dot's type
        wide = DType.FP32
        scale = part("scale", (weight.shape[channel_axis],), wide)
        spread = self.emit(op, "broadcast", (scale,), op.shape, wide,
                           {"dims": (len(op.shape) - 1,)}, f"{op.name}.scale")
        product = self.emit(op, "dot", (lhs, dequantized), op.shape, wide, dict(op.attrs),
                            f"{op.name}.int8")
        if dtype is wide:
            return self.emit(op, "multiply", (product, spread), op.shape, wide, {}, op.name)
        scaled = self.emit(op, "multiply", (product, spread), op.shape, wide, {}, f"{op.name}.scaled")
        return self.emit(op, "convert", (scaled,), op.shape, dtype, {}, op.name)


def _weight_source(value: Op) -> Op | None:
    """The trained-weight constant ``value`` is (or is a cast of), else None."""
    if value.opcode == "convert":
        value = value.operands[0]
    if value.opcode == "constant" and "init" in value.attrs and value.dtype.is_float:
        return value
    return None


__all__ = ["QuantizedInitializer", "apply_options", "check_options", "quantize_int8"]
