"""A small Python API that writes programs directly in the HLO-level IR.

Used by the built-in workloads and the tests (the frontends produce the same graphs from PyTorch and
JAX). Shapes and dtypes are checked as each op is added, so a mistake is reported at the user's line,
and implicit broadcasting inserts explicit ``broadcast`` ops the way XLA requires.

    b = GraphBuilder("mlp")
    x = b.parameter("x", (4, 64), "fp32")
    with b.scope("fc1"):
        h = b.gelu(b.matmul(x, b.weight("w", (64, 256))))
    g = b.build([h])
"""

from __future__ import annotations

import contextlib
import math
import operator
import os
import sys
import zlib
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any

import numpy as np

from neuroncore.dtypes import DType, as_dtype
from neuroncore.ir.graph import (
    BINARY_OPS,
    COMPARE_DIRECTIONS,
    UNARY_OPS,
    Graph,
    IndexedInitializer,
    Initializer,
    Op,
    SourceFrame,
    is_weight_view,
)

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_FRAMES = 8


class GraphError(ValueError):
    """A program that cannot be built: wrong shapes, dtypes or arguments."""


def _capture_frames() -> tuple[SourceFrame, ...]:
    """User stack frames (outermost first), skipping the core's own files."""
    frames: list[SourceFrame] = []
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and len(frames) < MAX_FRAMES:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(_PACKAGE_DIR + os.sep) or "/workloads/" in path:
            frames.append(SourceFrame(path, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return tuple(reversed(frames))


def _dims(opcode: str, shape: Sequence[int]) -> tuple[int, ...]:
    """Dimensions as ints; 2.5 or "3" is a mistake, not something to truncate silently."""
    try:
        return tuple(operator.index(d) for d in shape)
    except TypeError:
        raise GraphError(f"{opcode}: shape {list(shape)} has a non-integer dimension") from None


class GraphBuilder:
    """Builds a :class:`Graph` op by op; names ops ``<opcode>.<n>`` with one counter per graph."""

    def __init__(self, name: str = "model", root_layer: str = "model",
                 autocast: str | DType | None = None, weights_of: str | None = None) -> None:
        """``autocast="bf16"`` casts FP32 matmul operands to bf16 and keeps an FP32 result, as the
        Neuron compiler's ``--auto-cast matmult`` does (PSUM accumulates in FP32 either way).
        ``weights_of`` names the model whose seeded weights this graph uses (default: its own name),
        so two programs of one model (prefill and decode) share their weights."""
        self.name = name
        self.weights_of = weights_of or name
        self.autocast = as_dtype(autocast) if autocast is not None else None
        self._ops: list[Op] = []
        self._parameters: list[Op] = []
        self._scope: list[str] = [root_layer] if root_layer else []
        self._next_id = 0
        self._frames_override: tuple[SourceFrame, ...] | None = None
        self._seed = 0
        self._indices: dict[int, tuple[Sequence[int], tuple[int, ...]]] = {}  # relayout, by id

    # -- context ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[None]:
        """Ops added inside get ``name`` appended to their layer path."""
        self._scope.append(name)
        try:
            yield
        finally:
            self._scope.pop()

    @contextlib.contextmanager
    def source(self, frames: Sequence[SourceFrame]) -> Iterator[None]:
        """Attribute ops to given frames instead of the caller's (frontends use this)."""
        previous = self._frames_override
        self._frames_override = tuple(frames)
        try:
            yield
        finally:
            self._frames_override = previous

    @contextlib.contextmanager
    def located(self, layer: str, frames: Sequence[SourceFrame] = ()) -> Iterator[None]:
        """Ops added inside get exactly this layer path and these frames (frontends use this to
        carry a framework node's module path and stack trace onto every op it lowers to)."""
        saved_scope, saved_frames = self._scope, self._frames_override
        self._scope = [layer] if layer else []
        self._frames_override = tuple(frames)
        try:
            yield
        finally:
            self._scope, self._frames_override = saved_scope, saved_frames

    @property
    def n_ops(self) -> int:
        return len(self._ops)

    def ops_since(self, start: int) -> list[Op]:
        """The ops added since ``n_ops`` was ``start`` (a frontend names the helpers of a lowering
        it ran through the builder after the framework's instruction)."""
        return self._ops[start:]

    @property
    def layer(self) -> str:
        return "/".join(self._scope)

    def _add(
        self,
        opcode: str,
        operands: Sequence[Op],
        shape: Sequence[int],
        dtype: DType,
        name: str | None = None,
        **attrs: Any,
    ) -> Op:
        self._next_id += 1
        frames = self._frames_override if self._frames_override is not None else _capture_frames()
        op = Op(
            index=len(self._ops),
            opcode=opcode,
            name=name or f"{opcode}.{self._next_id}",
            operands=tuple(operands),
            shape=_dims(opcode, shape),
            dtype=dtype,
            attrs=attrs,
            layer=self.layer,
            frames=frames,
        )
        self._ops.append(op)
        return op

    def add_op(self, opcode: str, operands: Sequence[Op], shape: Sequence[int], dtype: DType | str,
               *, name: str | None = None, **attrs: Any) -> Op:
        """Add an op without the helper's checks (frontends; tests of unsupported ops).

        ``name`` keeps a framework's own instruction name (JAX's ``dot.3``)."""
        return self._add(opcode, operands, shape, as_dtype(dtype), name=name, **attrs)

    # -- leaves ----------------------------------------------------------------------------
    def parameter(self, name: str, shape: Sequence[int], dtype: str | DType = "fp32", *,
                  low: int | None = None, high: int | None = None) -> Op:
        """A runtime input. ``low``/``high`` state the valid range of integer ids (for test inputs)."""
        extra = {k: v for k, v in (("low", low), ("high", high)) if v is not None}
        op = self._add("parameter", [], shape, as_dtype(dtype), name=name,
                       number=len(self._parameters), **extra)
        self._parameters.append(op)
        return op

    def constant(self, value: float, dtype: str | DType = "fp32", shape: Sequence[int] = ()) -> Op:
        """A scalar (or splat) constant: compiled as an immediate, never stored."""
        return self._add("constant", [], shape, as_dtype(dtype), value=float(value))

    def weight(
        self,
        name: str,
        shape: Sequence[int],
        dtype: str | DType = "fp32",
        *,
        init: str = "normal",
        scale: float | None = None,
        array: np.ndarray | None = None,
        relayout: tuple[int, Sequence[int]] | None = None,
    ) -> Op:
        """A trained-weight constant made from a seeded initializer (nothing is downloaded).

        ``relayout=(axis, index)`` stores the weight of ``shape`` with entries ``index`` taken along
        ``axis`` (-1: zeros): the same trained values in another layout (padded heads)."""
        self._seed += 1
        initializer: Initializer | IndexedInitializer
        if array is not None:
            initializer = Initializer("array", array=np.asarray(array, np.float32))
        else:
            fan_in = shape[0] if len(shape) >= 2 else 1
            std = scale if scale is not None else (1.0 / math.sqrt(fan_in) if init == "normal" else 1.0)
            seed = zlib.crc32(f"{self.weights_of}/{self.layer}/{name}/{self._seed}".encode())
            initializer = Initializer(init, seed=seed, scale=std)
        label = f"{self.layer}/{name}" if self.layer else name
        if relayout is not None:
            axis, index = relayout
            stored = list(shape)
            stored[axis] = len(index)
            initializer = IndexedInitializer(initializer, tuple(shape), axis, self._index(index))
            shape = stored
        return self._add("constant", [], shape, as_dtype(dtype), init=initializer, label=label)

    def _index(self, index: Sequence[int]) -> tuple[int, ...]:
        """``index`` as a tuple of ints. A tuple (immutable) is converted once per object: a model
        passes the same padded-heads or padded-features index to every layer's weights (a 7B tp24
        decode's add up to 1.9M entries, most of its graph-building time when converted each time)."""
        if not isinstance(index, tuple):
            return tuple(map(int, index))
        seen = self._indices.get(id(index))
        if seen is not None and seen[0] is index:
            return seen[1]
        converted = tuple(map(int, index))
        self._indices[id(index)] = (index, converted)
        return converted

    def iota(self, shape: Sequence[int], dimension: int, dtype: str | DType = "int32") -> Op:
        return self._add("iota", [], shape, as_dtype(dtype), dimension=dimension)

    def rng_uniform(self, state: Op, shape: Sequence[int], stream: int,
                    block: tuple[tuple[int, ...], int, int, int] | None = None) -> Op:
        """FP32 uniforms in [0, 1) of ``shape`` keyed by ``state`` (the program's [2] RNG state:
        seed, offset); ops of one program need distinct ``stream`` numbers (``ir.philox``).
        ``block``: ``shape`` is a rank's block of a tensor of ``block[0]`` (split as
        ``philox.block_indices`` says), ``state`` a [3] (seed, offset, rank): the block draws the
        whole tensor's numbers at its places."""
        if block is None:
            return self._add("rng", [state], shape, DType.FP32, stream=int(stream), distribution="uniform")
        whole, dim, outer, tp = block
        block = (tuple(int(d) for d in whole), int(dim), int(outer), int(tp))
        return self._add("rng", [state], shape, DType.FP32, stream=int(stream), distribution="uniform",
                         block=block)

    # -- elementwise -----------------------------------------------------------------------
    def _unary(self, opcode: str, x: Op) -> Op:
        self._require_float(opcode, x)
        return self._add(opcode, [x], x.shape, x.dtype)

    def exp(self, x: Op) -> Op:
        return self._unary("exponential", x)

    def tanh(self, x: Op) -> Op:
        return self._unary("tanh", x)

    def logistic(self, x: Op) -> Op:
        return self._unary("logistic", x)

    def rsqrt(self, x: Op) -> Op:
        return self._unary("rsqrt", x)

    def sqrt(self, x: Op) -> Op:
        return self._unary("sqrt", x)

    def log(self, x: Op) -> Op:
        return self._unary("log", x)

    def negate(self, x: Op) -> Op:
        return self._unary("negate", x)

    def abs(self, x: Op) -> Op:
        return self._unary("abs", x)

    def cosine(self, x: Op) -> Op:
        return self._unary("cosine", x)

    def sine(self, x: Op) -> Op:
        return self._unary("sine", x)

    def erf(self, x: Op) -> Op:
        return self._unary("erf", x)

    def gelu(self, x: Op, approximate: str = "tanh") -> Op:
        self._require_float("gelu", x)
        return self._add("gelu", [x], x.shape, x.dtype, approximate=approximate)

    def silu(self, x: Op) -> Op:
        return self._unary("silu", x)

    def gelu_dx(self, x: Op) -> Op:
        """The exact GELU's derivative, one Scalar-engine function (a backward's GELU gradient)."""
        return self._unary("gelu_dx", x)

    def silu_dx(self, x: Op) -> Op:
        """SiLU's derivative, one Scalar-engine function (SwiGLU's backward)."""
        return self._unary("silu_dx", x)

    def convert(self, x: Op, dtype: str | DType) -> Op:
        return self._add("convert", [x], x.shape, as_dtype(dtype))

    def _binary(self, opcode: str, a: Op | float, b: Op | float) -> Op:
        a, b = self._coerce_pair(a, b)
        a, b = self._broadcast_pair(a, b)
        if a.dtype != b.dtype:
            raise GraphError(f"{opcode}: dtypes differ ({a.dtype.value} vs {b.dtype.value})")
        return self._add(opcode, [a, b], a.shape, a.dtype)

    def add(self, a: Op | float, b: Op | float) -> Op:
        return self._binary("add", a, b)

    def subtract(self, a: Op | float, b: Op | float) -> Op:
        return self._binary("subtract", a, b)

    def multiply(self, a: Op | float, b: Op | float) -> Op:
        return self._binary("multiply", a, b)

    def divide(self, a: Op | float, b: Op | float) -> Op:
        return self._binary("divide", a, b)

    def maximum(self, a: Op | float, b: Op | float) -> Op:
        return self._binary("maximum", a, b)

    def minimum(self, a: Op | float, b: Op | float) -> Op:
        return self._binary("minimum", a, b)

    def compare(self, a: Op | float, b: Op | float, direction: str) -> Op:
        direction = direction.upper()
        if direction not in COMPARE_DIRECTIONS:
            raise GraphError(f"compare: direction {direction!r} not in {COMPARE_DIRECTIONS}")
        a, b = self._coerce_pair(a, b)
        a, b = self._broadcast_pair(a, b)
        return self._add("compare", [a, b], a.shape, DType.PRED, direction=direction)

    def select(self, pred: Op, on_true: Op | float, on_false: Op | float) -> Op:
        on_true, on_false = self._coerce_pair(on_true, on_false)
        shape = np.broadcast_shapes(pred.shape, on_true.shape, on_false.shape)
        pred = self.broadcast_to(pred, shape)
        on_true = self.broadcast_to(on_true, shape)
        on_false = self.broadcast_to(on_false, shape)
        return self._add("select", [pred, on_true, on_false], shape, on_true.dtype)

    # -- layout ----------------------------------------------------------------------------
    def broadcast(self, x: Op, shape: Sequence[int], dims: Sequence[int]) -> Op:
        """XLA broadcast_in_dim: operand dim i maps to output dim ``dims[i]``."""
        shape, dims = tuple(shape), tuple(dims)
        if len(dims) != len(x.shape) or any(
            x.shape[i] not in (1, shape[d]) for i, d in enumerate(dims)
        ):
            raise GraphError(f"broadcast: cannot map {list(x.shape)} to {list(shape)} via {dims}")
        return self._add("broadcast", [x], shape, x.dtype, dims=dims)

    def broadcast_to(self, x: Op, shape: Sequence[int]) -> Op:
        """NumPy-style broadcast (trailing alignment); returns ``x`` when the shape already matches."""
        shape = tuple(shape)
        if x.shape == shape:
            return x
        offset = len(shape) - len(x.shape)
        if offset < 0:
            raise GraphError(f"cannot broadcast {list(x.shape)} to {list(shape)}")
        return self.broadcast(x, shape, tuple(range(offset, len(shape))))

    def reshape(self, x: Op, shape: Sequence[int]) -> Op:
        shape = list(shape)
        if -1 in shape:
            known = math.prod(d for d in shape if d != -1)
            shape[shape.index(-1)] = x.size // max(known, 1)
        if math.prod(shape) != x.size:
            raise GraphError(f"reshape: {list(x.shape)} has {x.size} elements, not {math.prod(shape)}")
        return self._add("reshape", [x], shape, x.dtype)

    def transpose(self, x: Op, permutation: Sequence[int]) -> Op:
        permutation = tuple(permutation)
        if sorted(permutation) != list(range(len(x.shape))):
            raise GraphError(f"transpose: {permutation} is not a permutation of {len(x.shape)} dims")
        shape = [x.shape[p] for p in permutation]
        return self._add("transpose", [x], shape, x.dtype, permutation=permutation)

    def slice(self, x: Op, starts: Sequence[int], limits: Sequence[int],
              strides: Sequence[int] | None = None) -> Op:
        strides = tuple(strides) if strides is not None else (1,) * len(x.shape)
        shape = [len(range(s, e, st)) for s, e, st in zip(starts, limits, strides)]
        if any(d <= 0 for d in shape) or any(e > n for e, n in zip(limits, x.shape)):
            raise GraphError(f"slice: {list(starts)}:{list(limits)} is outside {list(x.shape)}")
        return self._add("slice", [x], shape, x.dtype, starts=tuple(starts), limits=tuple(limits),
                         strides=strides)

    def concatenate(self, xs: Sequence[Op], dimension: int) -> Op:
        first = xs[0]
        dimension = dimension % len(first.shape)
        for x in xs[1:]:
            same = [d for i, d in enumerate(x.shape) if i != dimension]
            if same != [d for i, d in enumerate(first.shape) if i != dimension]:
                raise GraphError("concatenate: shapes differ outside the concatenated dimension")
        shape = list(first.shape)
        shape[dimension] = sum(x.shape[dimension] for x in xs)
        return self._add("concatenate", list(xs), shape, first.dtype, dimension=dimension)

    # -- reductions, contractions, gathers -------------------------------------------------
    def reduce(self, x: Op, dimensions: Sequence[int], kind: str = "sum") -> Op:
        if kind not in ("sum", "max"):
            raise GraphError(f"reduce: kind {kind!r} is not sum or max")
        dims = tuple(sorted(d % len(x.shape) for d in dimensions))
        shape = [n for i, n in enumerate(x.shape) if i not in dims]
        return self._add("reduce", [x], shape, x.dtype, dimensions=dims, kind=kind)

    def dot(self, lhs: Op, rhs: Op, *, lhs_contract: int = -1, rhs_contract: int = -2,
            out_dtype: str | DType | None = None) -> Op:
        """Batched contraction: leading dims are batch dims (equal), one contracting dim each.

        ``lhs_contract`` is the last or second-to-last dim of ``lhs`` (likewise ``rhs``), so
        ``dot(q, k, rhs_contract=-1)`` is ``q @ k^T`` without a separate transpose op.
        ``out_dtype`` is XLA's preferred element type: the result type when it differs from the
        operands' (the accumulation is FP32 regardless).
        """
        if (self.autocast is not None and out_dtype is None and lhs.dtype is DType.FP32
                and rhs.dtype is DType.FP32):
            lhs, rhs = self._autocast_operand(lhs), self._autocast_operand(rhs)
            out_dtype = DType.FP32
        if len(lhs.shape) != len(rhs.shape) or len(lhs.shape) < 2:
            raise GraphError(f"dot: ranks differ or < 2: {list(lhs.shape)} x {list(rhs.shape)}")
        n = len(lhs.shape)
        lc, rc = lhs_contract % n, rhs_contract % n
        if lc < n - 2 or rc < n - 2:
            raise GraphError("dot: contracting dims must be one of the last two dims")
        if lhs.shape[:-2] != rhs.shape[:-2]:
            raise GraphError(f"dot: batch dims differ: {list(lhs.shape)} x {list(rhs.shape)}")
        if lhs.shape[lc] != rhs.shape[rc]:
            raise GraphError(
                f"dot: contracting sizes differ: {lhs.shape[lc]} vs {rhs.shape[rc]} "
                f"({list(lhs.shape)} x {list(rhs.shape)})"
            )
        if lhs.dtype != rhs.dtype:
            raise GraphError(f"dot: dtypes differ ({lhs.dtype.value} vs {rhs.dtype.value})")
        m = lhs.shape[n - 2] if lc == n - 1 else lhs.shape[n - 1]
        nn = rhs.shape[n - 1] if rc == n - 2 else rhs.shape[n - 2]
        shape = [*lhs.shape[:-2], m, nn]
        result = as_dtype(out_dtype) if out_dtype is not None else lhs.dtype
        return self._add("dot", [lhs, rhs], shape, result, lhs_contract=lc, rhs_contract=rc,
                         batch_dims=n - 2)

    def _autocast_operand(self, x: Op) -> Op:
        """A matmul operand in the auto-cast type: a view of a weight is the view of the cast
        weight (``graph.is_weight_view``), anything else one convert."""
        assert self.autocast is not None
        if is_weight_view(x):
            source = self._autocast_operand(x.operands[0])
            return self._add(x.opcode, [source], x.shape, self.autocast, **dict(x.attrs))
        return self.convert(x, self.autocast)

    def matmul(self, x: Op, w: Op) -> Op:
        """``x @ w`` with ``x`` of any rank and ``w`` 2-D (a linear layer's weight, [in, out])."""
        if len(w.shape) == 2 and len(x.shape) > 2:
            flat = self.reshape(x, (-1, x.shape[-1]))
            out = self.dot(flat, w)
            return self.reshape(out, (*x.shape[:-1], w.shape[-1]))
        return self.dot(x, w)

    def gather(self, table: Op, indices: Op) -> Op:
        """Embedding lookup: rows of ``table`` [V, D] picked by int32 ``indices`` -> [..., D]."""
        if indices.dtype is not DType.INT32 or len(table.shape) != 2:
            raise GraphError("gather: needs a 2-D table and int32 indices")
        return self._add("gather", [table, indices], (*indices.shape, table.shape[1]), table.dtype,
                         axis=0)

    # -- fusions ---------------------------------------------------------------------------
    def softmax(self, x: Op) -> Op:
        """Softmax over the last dim (max-subtracted, as compilers emit it)."""
        self._require_float("softmax", x)
        return self._add("softmax", [x], x.shape, x.dtype, axis=len(x.shape) - 1)

    def layer_norm(self, x: Op, gamma: Op, beta: Op, eps: float = 1e-5) -> Op:
        self._check_norm_params("layer_norm", x, gamma, beta)
        return self._add("layer_norm", [x, gamma, beta], x.shape, x.dtype, eps=float(eps))

    def rms_norm(self, x: Op, gamma: Op, eps: float = 1e-6) -> Op:
        self._check_norm_params("rms_norm", x, gamma)
        return self._add("rms_norm", [x, gamma], x.shape, x.dtype, eps=float(eps))

    # -- finish ----------------------------------------------------------------------------
    def build(self, outputs: Sequence[Op], parameters: Sequence[Op] | None = None) -> Graph:
        """The graph; ``parameters`` gives the input order when it is not the creation order
        (passes that rebuild a graph create parameters when they first need them)."""
        if not outputs:
            raise GraphError("a graph needs at least one output")
        params = list(self._parameters) if parameters is None else list(parameters)
        return Graph(self.name, list(self._ops), params, list(outputs))

    # -- helpers ---------------------------------------------------------------------------
    def _coerce_pair(self, a: Op | float, b: Op | float) -> tuple[Op, Op]:
        if isinstance(a, Op):
            return a, (b if isinstance(b, Op) else self.constant(b, a.dtype))
        if isinstance(b, Op):
            return self.constant(a, b.dtype), b
        raise GraphError("at least one operand must be a tensor")

    def _broadcast_pair(self, a: Op, b: Op) -> tuple[Op, Op]:
        try:
            shape = np.broadcast_shapes(a.shape, b.shape)
        except ValueError as exc:
            raise GraphError(f"shapes {list(a.shape)} and {list(b.shape)} do not broadcast") from exc
        return self.broadcast_to(a, shape), self.broadcast_to(b, shape)

    @staticmethod
    def _require_float(opcode: str, x: Op) -> None:
        if not x.dtype.is_float:
            raise GraphError(f"{opcode}: needs a float tensor, got {x.dtype.value}")

    @staticmethod
    def _check_norm_params(opcode: str, x: Op, *params: Op) -> None:
        for p in params:
            if p.shape != (x.shape[-1],):
                raise GraphError(f"{opcode}: parameter shape {list(p.shape)} != [{x.shape[-1]}]")


assert UNARY_OPS and BINARY_OPS  # re-exported names the builder's methods mirror
