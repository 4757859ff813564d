"""The HLO-level graph: ops named as XLA names them, each with the framework context it came from.

An op keeps what a profile needs to link an engine instruction back to user code: its HLO
instruction name (``dot.3``), the framework layer path (``model/layers.0/self_attn/q_proj``) and the
Python stack frames that created it. Ops are stored in topological order; the graph is immutable
once built (the builder and the frontends are the only writers).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from neuroncore.dtypes import DType

UNARY_OPS = frozenset({"exponential", "tanh", "logistic", "rsqrt", "sqrt", "log", "negate", "abs",
                       "cosine", "sine", "erf"})
BINARY_OPS = frozenset({"add", "subtract", "multiply", "divide", "maximum", "minimum"})
# "gelu_dx" / "silu_dx": the derivatives of (exact) GELU and SiLU, functions of the Scalar engine
# (nki.language.gelu_dx / silu_dx on Trn1) that a training step's backward evaluates in one pass
FUSED_OPS = frozenset({"softmax", "layer_norm", "rms_norm", "gelu", "silu", "gelu_dx", "silu_dx"})
LAYOUT_OPS = frozenset({"broadcast", "reshape", "transpose", "slice", "concatenate"})
OTHER_OPS = frozenset(
    {"parameter", "constant", "convert", "compare", "select", "reduce", "dot", "gather", "iota", "rng"}
)
# "rng": uniform FP32 values in [0, 1) from the counter-based generator of ``neuroncore.ir.philox``,
# keyed by its one operand (the program's RNG state: seed and offset), ``stream`` attribute per op.
# Window ops on channel-major [N, C, L] activations (neuroncore/ir/conv.py): the convolution the
# compiler lowers as implicit GEMM on the Tensor engine, and pooling on the Vector engine.
WINDOW_OPS = frozenset({"convolution", "reduce-window"})
# Collectives over the tensor-parallel group a program runs in (inserted by the sharding pass):
# "all-reduce" sums across ranks; "all-gather" concatenates the ranks' values along ``dimension``;
# "collective-permute" moves a value between paired ranks (a pipeline stage's send or receive: the
# sender's result is its operand as sent, the receiver's what arrived into its buffer operand).
COLLECTIVE_OPS = frozenset({"all-reduce", "all-gather", "reduce-scatter", "collective-permute"})
ALL_OPS = UNARY_OPS | BINARY_OPS | FUSED_OPS | LAYOUT_OPS | OTHER_OPS | COLLECTIVE_OPS | WINDOW_OPS
COMPARE_DIRECTIONS = ("EQ", "NE", "LT", "LE", "GT", "GE")


@dataclass(frozen=True)
class SourceFrame:
    """One Python stack frame: where in user code an op was created."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} ({self.function})"


@dataclass(frozen=True)
class Initializer:
    """How to make a constant's values without storing them: timing-only runs never call it."""

    kind: str  # "normal", "uniform", "ones", "zeros", "array"
    seed: int = 0
    scale: float = 1.0
    array: np.ndarray | None = field(default=None, compare=False, repr=False)

    def materialize(self, shape: tuple[int, ...], rank: int = 0) -> np.ndarray:
        """The values; ``rank`` matters only to sharded initializers (a rank's slice)."""
        if self.kind == "array":
            assert self.array is not None
            return np.asarray(self.array, dtype=np.float32).reshape(shape)
        if self.kind == "zeros":
            return np.zeros(shape, np.float32)
        if self.kind == "ones":
            return np.full(shape, self.scale, np.float32)
        rng = np.random.default_rng(self.seed)
        if self.kind == "uniform":
            return rng.uniform(-self.scale, self.scale, size=shape).astype(np.float32)
        return (rng.standard_normal(size=shape) * self.scale).astype(np.float32)


@dataclass(frozen=True)
class IndexedInitializer:
    """A weight laid out differently from the model it comes from: ``base`` materialised at
    ``base_shape``, then entries ``index`` taken along ``axis`` (-1 gives zeros). Tensor-parallel
    layouts use it to pad attention heads and replicate KV heads without changing the model's values."""

    base: Initializer | IndexedInitializer  # a slice of a slice (one expert of a TP-split stack)
    base_shape: tuple[int, ...]
    axis: int
    index: tuple[int, ...]

    def materialize(self, shape: tuple[int, ...], rank: int = 0) -> np.ndarray:
        values = self.base.materialize(self.base_shape, rank)
        index = np.asarray(self.index, np.int64)
        taken = np.take(values, np.maximum(index, 0), axis=self.axis)
        mask_shape = [1] * values.ndim
        mask_shape[self.axis] = index.size
        return np.where((index >= 0).reshape(mask_shape), taken, 0.0).astype(np.float32).reshape(shape)


@dataclass(eq=False)
class Op:
    """One HLO-level instruction. Identity is object identity; ``index`` is its topological position."""

    index: int
    opcode: str
    name: str
    operands: tuple[Op, ...]
    shape: tuple[int, ...]
    dtype: DType
    attrs: dict[str, Any]
    layer: str
    frames: tuple[SourceFrame, ...]

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def source(self) -> str:
        """``file:line`` of the innermost user frame, or ``<unknown>``."""
        if not self.frames:
            return "<unknown>"
        frame = self.frames[-1]
        return f"{frame.file}:{frame.line}"

    def describe(self) -> str:
        """``dot.3 (dot) at model/layers.0/mlp [model.py:42]``: how errors name an op."""
        layer = self.layer or "<no layer>"
        return f"{self.name} ({self.opcode}) at {layer} [{self.source}]"

    def __repr__(self) -> str:
        args = ", ".join(o.name for o in self.operands)
        return f"%{self.name} = {self.dtype.value}{list(self.shape)} {self.opcode}({args})"


WEIGHT_VIEWS = frozenset({"broadcast", "reshape", "transpose"})


def is_weight_view(value: Op) -> bool:
    """Whether ``value`` is views (broadcast, reshape, transpose) of a trained weight only: torch
    exports a ``Linear`` on a non-contiguous ``[B, S, H]`` input as a ``bmm`` that reads the weight
    broadcast over the batch. A cast of such a value is the cast of the weight (folded at compile
    time) viewed the same way: rounding each element commutes with a view."""
    if value.opcode not in WEIGHT_VIEWS:
        return False
    while value.opcode in WEIGHT_VIEWS and len(value.operands) == 1:
        value = value.operands[0]
    return value.opcode == "constant" and "init" in value.attrs and value.dtype.is_float


def reachable(roots: Iterable[Op]) -> Iterator[Op]:
    """Every op ``roots`` depend on (themselves included), each once, by identity: what an output
    reads, for pruning a graph and for asking which inputs a live op still reads."""
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        op = stack.pop()
        if id(op) in seen:
            continue
        seen.add(id(op))
        yield op
        stack.extend(op.operands)


@dataclass
class Graph:
    """A whole program: ops in topological order, its parameters (inputs) and outputs."""

    name: str
    ops: list[Op]
    parameters: list[Op]
    outputs: list[Op]

    def __post_init__(self) -> None:
        seen: set[int] = set()
        for position, op in enumerate(self.ops):
            if op.index != position:
                raise ValueError(f"op {op.name} has index {op.index}, expected {position}")
            for operand in op.operands:
                if id(operand) not in seen:
                    raise ValueError(f"op {op.name} uses {operand.name} before it is defined")
            seen.add(id(op))

    @property
    def constants(self) -> list[Op]:
        return [op for op in self.ops if op.opcode == "constant" and "init" in op.attrs]

    def users(self) -> dict[int, list[Op]]:
        """For each op index, the ops that read it (in topological order)."""
        result: dict[int, list[Op]] = {op.index: [] for op in self.ops}
        for op in self.ops:
            for operand in op.operands:
                result[operand.index].append(op)
        return result

    def pruned(self, keep: Callable[[Op], bool] | None = None) -> Graph:
        """This graph without the ops no output depends on. Parameters stay (they are the program's
        inputs), and so do ops for which ``keep(op)`` is true, with what they read."""
        roots = [*self.outputs, *self.parameters]
        if keep is not None:
            roots += [op for op in self.ops if keep(op)]
        live = {id(op) for op in reachable(roots)}
        ops = [op for op in self.ops if id(op) in live]
        for index, op in enumerate(ops):
            op.index = index
        return Graph(self.name, ops, self.parameters, self.outputs)

    def text(self) -> str:
        """HLO-like listing, for debugging and error reports."""
        lines = [f"HloModule {self.name}"]
        lines += [repr(op) for op in self.ops]
        lines.append("ROOT (" + ", ".join(o.name for o in self.outputs) + ")")
        return "\n".join(lines)
