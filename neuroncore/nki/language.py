"""``nki.language``: tensors, loads and stores, index ranges, loops and the tile-level math.

Each function is one (or a few) engine instructions of ``neuroncore.nki.isa``: ``nl.load`` a DMA
into a new SBUF tile, ``nl.exp`` a Scalar-engine ACTIVATE, ``nl.add`` a Vector TENSOR_TENSOR (or
TENSOR_SCALAR when one side is a number or one value per partition), ``nl.sum`` a TENSOR_REDUCE,
``nl.matmul`` a LoadStationary + MultiplyMoving into PSUM.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from neuroncore.hardware import Engine
from neuroncore.nki import dtypes as _dt
from neuroncore.nki import isa as _isa
from neuroncore.nki.indexing import IndexExpr, Mask, arange, mgrid
from neuroncore.nki.tracer import (
    HBM,
    PRIVATE_HBM,
    PSUM,
    SBUF,
    SHARED_HBM,
    Tensor,
    View,
    as_view,
    current,
    require_trace,
)

# -- buffers and dtypes ---------------------------------------------------------------------------
sbuf = SBUF
psum = PSUM
hbm = HBM
shared_hbm = SHARED_HBM
private_hbm = PRIVATE_HBM

float32 = _dt.float32
bfloat16 = _dt.bfloat16
float16 = _dt.float16
tfloat32 = _dt.tfloat32
float8_e4m3 = _dt.float8_e4m3
float8_e5m2 = _dt.float8_e5m2
int32 = _dt.int32
int16 = _dt.int16
int8 = _dt.int8
uint32 = _dt.uint32
uint16 = _dt.uint16
uint8 = _dt.uint8
bool_ = _dt.bool_


class tile_size:
    """Hardware tile limits (neuroncore.md §2.4)."""

    pmax = 128
    psum_fmax = 512
    psum_bank_fmax = 512
    psum_num_banks = 8
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512
    total_available_sbuf_size = 192 * 1024


class par_dim:
    """Marks the partition dimension of an SBUF/PSUM tensor declared with block dims before it."""

    def __init__(self, size: int) -> None:
        self.size = int(size)

    def __index__(self) -> int:
        return self.size

    def __int__(self) -> int:
        return self.size


# -- loops ----------------------------------------------------------------------------------------


def affine_range(*args: int, **kwargs: Any) -> range:
    """Iterations with no loop-carried dependency: unrolled, free to overlap."""
    return range(*args)


def static_range(*args: int, **kwargs: Any) -> range:
    """Fully unrolled at trace time."""
    return range(*args)


def sequential_range(*args: int, **kwargs: Any) -> Iterator[int]:
    """Iterations that run one after another: each waits for everything of the previous one."""
    trace = current()
    if trace is None:
        return iter(range(*args))
    return trace.sequential(range(*args))


def dynamic_range(*args: int, **kwargs: Any) -> Iterator[int]:
    """A loop with a run-time trip count: unrolled here, iterations one after another."""
    return sequential_range(*args)


# -- SPMD ---------------------------------------------------------------------------------------


def program_id(axis: int = 0) -> int:
    trace = require_trace("program_id")
    grid = trace.grid_position
    if not 0 <= axis < len(grid):
        raise trace.error(f"program_id({axis}): the launch grid has {len(grid)} dimensions")
    return grid[axis]


def num_programs(axes: int | None = None) -> Any:
    trace = require_trace("num_programs")
    shape = trace.grid_shape
    if axes is None:
        return math.prod(shape)
    if isinstance(axes, (tuple, list)):
        return tuple(shape[a] for a in axes)
    return shape[axes]


def program_ndim() -> int:
    return len(require_trace("program_ndim").grid_shape)


# -- tensors --------------------------------------------------------------------------------------


def _shape_and_pdim(shape: Any) -> tuple[tuple[int, ...], int]:
    dims = list(shape) if isinstance(shape, (tuple, list)) else [shape]
    pdim = 0
    for i, d in enumerate(dims):
        if isinstance(d, par_dim):
            pdim = i
    return tuple(int(d) for d in dims), pdim


def ndarray(shape: Any, dtype: Any = float32, buffer: Any = SBUF, name: str = "", **kwargs: Any) -> Tensor:
    trace = require_trace("ndarray")
    trace.enter("ndarray")
    dims, pdim = _shape_and_pdim(shape)
    return trace.tensor(dims, dtype, _buffer(buffer), name=name or None, pdim=pdim)


def _buffer(buffer: Any) -> str:
    name = str(getattr(buffer, "name", buffer)).lower()
    if name in (SBUF, PSUM, HBM, SHARED_HBM, PRIVATE_HBM):
        return name
    raise ValueError(f"unknown buffer {buffer!r}")


def zeros(shape: Any, dtype: Any = float32, buffer: Any = SBUF, name: str = "", **kwargs: Any) -> Tensor:
    return full(shape, 0.0, dtype, buffer, name)


def ones(shape: Any, dtype: Any = float32, buffer: Any = SBUF, name: str = "", **kwargs: Any) -> Tensor:
    return full(shape, 1.0, dtype, buffer, name)


def full(
    shape: Any, fill_value: float, dtype: Any = float32, buffer: Any = SBUF, name: str = "", **kwargs: Any
) -> Tensor:
    trace = require_trace("full")
    trace.enter("zeros" if fill_value == 0 else "full")
    dims, pdim = _shape_and_pdim(shape)
    buf = _buffer(buffer)
    t = trace.tensor(dims, dtype, buf, name=name or None, pdim=pdim, zero=True)
    if trace.numerics and t.data is not None:
        t.data[...] = t.dtype.cast(fill_value)
    if buf == SBUF:
        # one MEMSET per tile; a zeroed PSUM tile costs nothing: the first matmul overwrites
        _isa.fill(trace, t, None, float(fill_value), t.dtype)
    elif buf == PSUM and fill_value != 0:
        _isa.fill(trace, t, None, float(fill_value), t.dtype)
    return t


def zeros_like(a: Any, dtype: Any = None, buffer: Any = None, **kwargs: Any) -> Tensor:
    v = as_view(a)
    return zeros(v.shape, dtype or v.dtype, buffer or (v.buffer if v.buffer in (SBUF, PSUM) else SBUF))


def empty_like(a: Any, dtype: Any = None, buffer: Any = None, **kwargs: Any) -> Tensor:
    v = as_view(a)
    return ndarray(v.shape, dtype or v.dtype, buffer or (v.buffer if v.buffer in (SBUF, PSUM) else SBUF))


# -- DMA --------------------------------------------------------------------------------------------


def load(src: Any, mask: Mask | None = None, dtype: Any = None, **kwargs: Any) -> Tensor:
    """HBM -> a new SBUF tile (one DMA)."""
    trace = require_trace("load")
    trace.enter("load")
    v = as_view(src)
    if v.buffer not in (HBM, SHARED_HBM, PRIVATE_HBM):
        raise trace.error(f"load: the source must be in HBM, not {v.buffer.upper()} ({v.tensor.name})")
    shape = v.shape if len(v.shape) >= 2 else ((v.shape[0], 1) if v.shape else (1, 1))
    if shape[0] > trace.spec.partitions:
        raise trace.error(
            f"load: a tile of {shape[0]} partitions exceeds {trace.spec.partitions} "
            f"(nl.tile_size.pmax); tile the partition dimension"
        )
    t = trace.tensor(shape, dtype or v.dtype, SBUF)
    dst = t.whole()
    if trace.numerics:
        dst.write(np.asarray(v.read()).reshape(shape), mask)
    node = trace.dma(dst, v, mask=mask)
    t.fresh_node = node
    return t


def store(dst: Any, value: Any, mask: Mask | None = None, **kwargs: Any) -> None:
    """An SBUF tile -> HBM (one DMA)."""
    trace = require_trace("store")
    trace.enter("store")
    d = as_view(dst)
    if d.buffer not in (HBM, SHARED_HBM, PRIVATE_HBM):
        raise trace.error(f"store: the destination must be in HBM, not {d.buffer.upper()} ({d.tensor.name})")
    if not isinstance(value, (Tensor, View)):
        raise trace.error("store: the value must be a tile")
    src = as_view(value)
    if src.buffer == PSUM:
        src = as_view(_isa.copy_tile(trace, None, src, Engine.VECTOR, dtype=d.dtype))
    _isa.transfer(trace, d, src, mask)


def load_transpose2d(src: Any, mask: Mask | None = None, dtype: Any = None, **kwargs: Any) -> Tensor:
    """HBM [F, P] -> SBUF [P, F] through a transposing DMA access pattern (element-wise runs)."""
    trace = require_trace("load_transpose2d")
    trace.enter("load_transpose2d")
    v = as_view(src)
    a, b = v.shape[0], int(np.prod(v.shape[1:]))
    t = trace.tensor((b, a), dtype or v.dtype, SBUF)
    if trace.numerics:
        t.whole().write(np.asarray(v.read()).reshape(a, b).T)
    dst = t.whole()
    node = trace.dma(dst, _element_runs(v), mask=mask)
    t.fresh_node = node
    return t


def _element_runs(v: View) -> View:
    """The same access read one element per descriptor (a transposing pattern)."""
    from neuroncore.nki.indexing import AccessPlan, DimSpan

    spans = tuple(DimSpan(s.lo, s.hi, s.count, 0 if s.count > 1 else 1, s.axis) for s in v.plan.spans)
    return View(v.tensor, AccessPlan(v.plan.shape, spans, v.plan.key, v.plan.basic), v.mask)


# -- compute -----------------------------------------------------------------------------------------


def _is_column(x: Any) -> bool:
    return isinstance(x, (Tensor, View)) and as_view(x).free == 1


def binary(
    op: str,
    a: Any,
    b: Any,
    *,
    dtype: Any = None,
    mask: Mask | None = None,
    reverse_name: bool = False,
    dst: Any = None,
) -> Any:
    """``a op b``: TENSOR_TENSOR for two tiles, TENSOR_SCALAR when one side is a number or a
    column of one value per partition (the Vector engine broadcasts it along the free axis)."""
    trace = require_trace(op)
    trace.enter(op)
    fn = _isa.ALU[op]
    if reverse_name:
        # ``number - tile``: called as binary(op, number, tile)
        pass
    tiles = [x for x in (a, b) if isinstance(x, (Tensor, View))]
    for x in tiles:
        _isa._not_hbm(trace, x)
    if len(tiles) == 2 and not (_is_column(a) ^ _is_column(b)):
        return _isa.elementwise(
            trace,
            dst,
            opcode="TENSOR_TENSOR",
            kind="tensor_tensor",
            eng=Engine.VECTOR,
            inputs=[a, b],
            compute=fn,
            shape=None,
            dtype=dtype,
            mask=mask,
        )
    if len(tiles) == 2:
        data, operand = (a, b) if _is_column(b) else (b, a)
        reverse = data is b
    else:
        data = tiles[0]
        operand = b if data is a else a
        reverse = data is b
    return _isa.elementwise(
        trace,
        dst,
        opcode="TENSOR_SCALAR",
        kind="tensor_scalar",
        eng=Engine.VECTOR,
        inputs=[data, operand],
        compute=(lambda x, s: fn(s, x)) if reverse else fn,
        shape=as_view(data).shape,
        dtype=dtype,
        mask=mask,
    )


def binary_into(dst: View, op: str, a: Any, b: Any) -> None:
    binary(op, a, b, dst=dst)


def copy_into(dst: View, value: Any) -> None:
    """``dst[...] = value``: a tile is copied by the Vector engine; a number is a MEMSET."""
    trace = require_trace("copy")
    trace.enter("copy")
    if isinstance(value, (Tensor, View)):
        v = as_view(value)
        if v.buffer in (HBM, SHARED_HBM, PRIVATE_HBM) or dst.buffer in (HBM, SHARED_HBM, PRIVATE_HBM):
            _isa.transfer(trace, dst, v, None)
            return
        _isa.copy_tile(trace, dst, v, Engine.VECTOR)
        return
    if isinstance(value, (int, float, np.number)):
        _isa.fill(trace, dst, None, float(value), dst.dtype)
        return
    raise trace.error(f"cannot assign {type(value).__name__} to a tile")


def _unary_act(name: str) -> Any:
    def fn(x: Any, dtype: Any = None, mask: Mask | None = None, **kwargs: Any) -> Any:
        trace = require_trace(name)
        trace.enter(name)
        _isa._not_hbm(trace, x)
        return _isa._activate(
            trace, None, name, x, None, 1.0, reduce_res=None, reduce_op=None, dtype=dtype, mask=mask
        )

    fn.__name__ = name
    fn.__qualname__ = name
    return fn


exp = _unary_act("exp")
log = _unary_act("log")
sqrt = _unary_act("sqrt")
rsqrt = _unary_act("rsqrt")
tanh = _unary_act("tanh")
sigmoid = _unary_act("sigmoid")
relu = _unary_act("relu")
gelu = _unary_act("gelu")
gelu_apprx_tanh = _unary_act("gelu_apprx_tanh")
silu = _unary_act("silu")
sin = _unary_act("sin")
cos = _unary_act("cos")
erf = _unary_act("erf")
softplus = _unary_act("softplus")
square = _unary_act("square")
abs = _unary_act("abs")  # noqa: A001 - the real name
sign = _unary_act("sign")
mish = _unary_act("mish")
arctan = _unary_act("arctan")
tan = _unary_act("tan")


def negative(x: Any, dtype: Any = None, mask: Mask | None = None, **kwargs: Any) -> Any:
    return binary("multiply", x, -1.0, dtype=dtype, mask=mask)


def reciprocal(x: Any, dtype: Any = None, mask: Mask | None = None, **kwargs: Any) -> Any:
    trace = require_trace("reciprocal")
    trace.enter("reciprocal")
    return _isa.elementwise(
        trace,
        None,
        opcode="RECIPROCAL",
        kind="reciprocal",
        eng=Engine.VECTOR,
        inputs=[x],
        compute=lambda v: 1.0 / v,
        shape=None,
        dtype=dtype,
        mask=mask,
    )


def _binary_fn(name: str) -> Any:
    def fn(x: Any, y: Any, dtype: Any = None, mask: Mask | None = None, **kwargs: Any) -> Any:
        return binary(name, x, y, dtype=dtype, mask=mask)

    fn.__name__ = name
    fn.__qualname__ = name
    return fn


add = _binary_fn("add")
subtract = _binary_fn("subtract")
multiply = _binary_fn("multiply")
divide = _binary_fn("divide")
maximum = _binary_fn("maximum")
minimum = _binary_fn("minimum")
power = _binary_fn("power")
equal = _binary_fn("equal")
not_equal = _binary_fn("not_equal")
greater = _binary_fn("greater")
greater_equal = _binary_fn("greater_equal")
less = _binary_fn("less")
less_equal = _binary_fn("less_equal")
logical_and = _binary_fn("logical_and")
logical_or = _binary_fn("logical_or")
logical_xor = _binary_fn("logical_xor")
bitwise_and = _binary_fn("bitwise_and")
bitwise_or = _binary_fn("bitwise_or")
bitwise_xor = _binary_fn("bitwise_xor")
left_shift = _binary_fn("left_shift")
right_shift = _binary_fn("right_shift")


def _reduction(name: str, alu: str, mean: bool = False) -> Any:
    def fn(
        x: Any, axis: Any, dtype: Any = None, mask: Mask | None = None, keepdims: bool = False, **kwargs: Any
    ) -> Any:
        trace = require_trace(name)
        trace.enter(name)
        _isa._not_hbm(trace, x)
        v = as_view(x)
        axes = tuple(axis) if isinstance(axis, (tuple, list)) else (int(axis),)
        count = math.prod(v.shape[a] for a in axes)
        return _isa.reduce_tile(
            trace, None, alu, x, axes, dtype=dtype, mask=mask, scale=(1.0 / count) if mean else None
        )

    fn.__name__ = name
    fn.__qualname__ = name
    return fn


sum = _reduction("sum", "add")  # noqa: A001
mean = _reduction("mean", "add", mean=True)
max = _reduction("max", "max")  # noqa: A001
min = _reduction("min", "min")  # noqa: A001
prod = _reduction("prod", "multiply")
all = _reduction("all", "logical_and")  # noqa: A001
any = _reduction("any", "logical_or")  # noqa: A001


def copy(x: Any, dtype: Any = None, mask: Mask | None = None, **kwargs: Any) -> Any:
    """A new SBUF tile with ``x``'s values (the usual PSUM evacuation)."""
    trace = require_trace("copy")
    trace.enter("copy")
    _isa._not_hbm(trace, x)
    return _isa.copy_tile(trace, None, x, Engine.VECTOR, dtype=dtype, mask=mask)


def where(condition: Any, x: Any, y: Any, dtype: Any = None, mask: Mask | None = None, **kwargs: Any) -> Any:
    trace = require_trace("where")
    trace.enter("where")
    return _isa.elementwise(
        trace,
        None,
        opcode="TENSOR_COPY_PREDICATED",
        kind="tensor_tensor",
        eng=Engine.VECTOR,
        inputs=[condition, x, y],
        compute=lambda c, a, b: np.where(np.asarray(c) != 0, a, b),
        shape=None,
        dtype=dtype,
        mask=mask,
    )


def matmul(x: Any, y: Any, transpose_x: bool = False, mask: Mask | None = None, **kwargs: Any) -> Any:
    """``x @ y`` into a new PSUM tile; ``x`` is [M, K] (or [K, M] with ``transpose_x``), ``y`` [K, N].
    Without ``transpose_x`` the PE first transposes ``x`` (a matmul against an identity)."""
    trace = require_trace("matmul")
    trace.enter("matmul")
    stationary = x
    if not transpose_x:
        transposed = _isa.nc_transpose(x)
        trace.enter("matmul")
        stationary = _isa.copy_tile(trace, None, transposed, Engine.VECTOR, dtype=as_view(x).dtype)
        trace.enter("matmul")
    return _isa.matmul_tiles(trace, None, stationary, y, accumulate=False, mask=mask)


def transpose(x: Any, dtype: Any = None, mask: Mask | None = None, **kwargs: Any) -> Any:
    """A 2-D transpose on the PE into PSUM."""
    trace = require_trace("transpose")
    trace.enter("transpose")
    return _isa.nc_transpose(x)


def broadcast_to(x: Any, shape: tuple[int, ...]) -> View:
    return as_view(x).broadcast_to(shape)


def expand_dims(x: Any, axis: int) -> Tensor:
    v = as_view(x)
    if not isinstance(x, Tensor):
        raise require_trace("expand_dims").error("expand_dims works on whole tensors")
    shape = list(v.shape)
    shape.insert(axis, 1)
    return x.reshape(tuple(shape))


def softmax(x: Any, axis: int = 1, dtype: Any = None, mask: Mask | None = None, **kwargs: Any) -> Any:
    m = max(x, axis=axis, mask=mask)
    e = exp(subtract(x, m, mask=mask), mask=mask)
    s = sum(e, axis=axis, mask=mask)
    return divide(e, s, dtype=dtype, mask=mask)


def dropout(x: Any, rate: float, dtype: Any = None, mask: Mask | None = None, **kwargs: Any) -> Any:
    trace = require_trace("dropout")
    trace.enter("dropout")
    rng = np.random.default_rng(0)

    def compute(v: Any) -> Any:
        keep = rng.random(np.shape(v)) >= rate
        return np.where(keep, v / (1.0 - rate), 0.0)

    return _isa.elementwise(
        trace,
        None,
        opcode="DROPOUT",
        kind="tensor_scalar",
        eng=Engine.VECTOR,
        inputs=[x],
        compute=compute,
        shape=None,
        dtype=dtype,
        mask=mask,
    )


def invert(x: Any, dtype: Any = None, mask: Mask | None = None, **kwargs: Any) -> Any:
    return binary("bitwise_xor", x, -1, dtype=dtype, mask=mask)


def device_print(*args: Any, **kwargs: Any) -> None:
    """Prints a tile's values when numerics run (nothing is emitted)."""
    trace = current()
    if trace is None or not trace.numerics:
        return
    parts = [str(as_view(a).read()) if isinstance(a, (Tensor, View)) else str(a) for a in args]
    print(*parts)


__all__ = [
    "IndexExpr",
    "Mask",
    "abs",
    "add",
    "affine_range",
    "all",
    "any",
    "arange",
    "bfloat16",
    "bool_",
    "broadcast_to",
    "copy",
    "cos",
    "device_print",
    "divide",
    "dropout",
    "dynamic_range",
    "empty_like",
    "equal",
    "erf",
    "exp",
    "expand_dims",
    "float8_e4m3",
    "float8_e5m2",
    "float16",
    "float32",
    "full",
    "gelu",
    "greater",
    "greater_equal",
    "hbm",
    "int8",
    "int16",
    "int32",
    "less",
    "less_equal",
    "load",
    "load_transpose2d",
    "log",
    "logical_and",
    "logical_or",
    "matmul",
    "max",
    "maximum",
    "mean",
    "mgrid",
    "min",
    "minimum",
    "multiply",
    "ndarray",
    "negative",
    "not_equal",
    "num_programs",
    "ones",
    "par_dim",
    "power",
    "private_hbm",
    "prod",
    "program_id",
    "program_ndim",
    "psum",
    "reciprocal",
    "relu",
    "rsqrt",
    "sbuf",
    "sequential_range",
    "shared_hbm",
    "sigmoid",
    "silu",
    "sin",
    "softmax",
    "sqrt",
    "square",
    "static_range",
    "store",
    "subtract",
    "sum",
    "tanh",
    "tfloat32",
    "tile_size",
    "transpose",
    "uint8",
    "uint16",
    "uint32",
    "where",
    "zeros",
    "zeros_like",
]
