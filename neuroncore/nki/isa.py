"""``nki.isa``: one function per engine instruction, each computed on NumPy and emitted with the
compiler's cost formula for that instruction (``neuroncore.compiler.costs``, neuroncore.md §4.2).

Both calling styles of the ISA work: the older one returns a new tile
(``t = nisa.nc_matmul(stationary, moving)``), the newer one writes a given destination
(``nisa.nc_matmul(dst, stationary, moving)``, ``nisa.tensor_copy(dst=..., src=...)``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from neuroncore.compiler import costs
from neuroncore.compiler.counters import NodeCounters
from neuroncore.compiler.program import RES_TENSOR_LS, RES_TENSOR_MM
from neuroncore.hardware import Engine
from neuroncore.nki import dtypes as ndt
from neuroncore.nki.indexing import Mask
from neuroncore.nki.tracer import (
    HBM_BUFFERS,
    PSUM,
    SBUF,
    KernelTrace,
    Tensor,
    View,
    as_view,
    require_trace,
)

# -- ALU operations and activation functions --------------------------------------------------

ALU: dict[str, Callable[[Any, Any], Any]] = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": np.divide,
    "true_divide": np.divide,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "max": np.maximum,
    "min": np.minimum,
    "power": np.power,
    "pow": np.power,
    "mod": np.mod,
    "remainder": np.mod,
    "greater": np.greater,
    "greater_equal": np.greater_equal,
    "less": np.less,
    "less_equal": np.less_equal,
    "equal": np.equal,
    "not_equal": np.not_equal,
    "logical_and": np.logical_and,
    "logical_or": np.logical_or,
    "logical_xor": np.logical_xor,
    "bitwise_and": np.bitwise_and,
    "bitwise_or": np.bitwise_or,
    "bitwise_xor": np.bitwise_xor,
    "left_shift": np.left_shift,
    "right_shift": np.right_shift,
    "bypass": lambda a, b: a,
    "abs_max": lambda a, b: np.maximum(np.abs(a), np.abs(b)),
    "rsqrt": lambda a, b: 1.0 / np.sqrt(a),
}


def _erf(x: np.ndarray) -> np.ndarray:
    from math import erf

    return np.vectorize(erf, otypes=[np.float32])(x)


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


ACT: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "exp": np.exp,
    "exponential": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "tanh": np.tanh,
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "logistic": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "relu": lambda x: np.maximum(x, 0.0),
    "gelu": _gelu,
    "gelu_apprx_tanh": _gelu_tanh,
    "silu": lambda x: x / (1.0 + np.exp(-x)),
    "copy": lambda x: x,
    "identity": lambda x: x,
    "square": np.square,
    "abs": np.abs,
    "negative": np.negative,
    "sin": np.sin,
    "cos": np.cos,
    "erf": _erf,
    "softplus": lambda x: np.log1p(np.exp(x)),
    "reciprocal": lambda x: 1.0 / x,
    "sign": np.sign,
    "arctan": np.arctan,
    "tan": np.tan,
    "ceil": np.ceil,
    "floor": np.floor,
    "trunc": np.trunc,
    "mish": lambda x: x * np.tanh(np.log1p(np.exp(x))),
    "gelu_dx": _gelu,
}

REDUCE: dict[str, Callable[..., np.ndarray]] = {
    "add": np.sum,
    "sum": np.sum,
    "maximum": np.max,
    "max": np.max,
    "minimum": np.min,
    "min": np.min,
    "multiply": np.prod,
    "prod": np.prod,
    "logical_and": np.all,
    "logical_or": np.any,
    "bitwise_and": np.all,
    "bitwise_or": np.any,
}


def op_name(op: Any) -> str:
    """``np.add``, ``nl.add``, ``"add"`` -> ``"add"``."""
    if isinstance(op, str):
        return op
    name = getattr(op, "__name__", None) or getattr(op, "name", None)
    if not name:
        raise TypeError(f"not an ALU operation or activation function: {op!r}")
    return {"true_divide": "divide", "amax": "max", "amin": "min"}.get(str(name), str(name))


# -- helpers ------------------------------------------------------------------------------------


def _val(trace: KernelTrace, x: Any) -> Any:
    """Values of an operand (a tile, an indexed tile or a number) for numerics."""
    if isinstance(x, (Tensor, View)):
        v = as_view(x)
        return v.read()
    return x


def _use(x: Any) -> None:
    """An operand has been read: a fresh tile can no longer be retargeted."""
    if isinstance(x, Tensor):
        x.fresh_node = None


def on_chip(trace: KernelTrace, x: Any, what: str, allowed: tuple[str, ...] = (SBUF, PSUM)) -> View:
    if not isinstance(x, (Tensor, View)):
        raise trace.error(f"{trace.api}: {what} must be a tile, not {type(x).__name__}")
    v = as_view(x)
    if v.buffer not in allowed:
        where = " or ".join(b.upper() for b in allowed)
        raise trace.error(
            f"{trace.api}: {what} is in {v.buffer.upper()} ({v.tensor.name}); "
            f"this instruction needs it in {where}"
        )
    if v.partitions > trace.spec.partitions:
        raise trace.error(
            f"{trace.api}: {what} spans {v.partitions} partitions; at most {trace.spec.partitions}"
        )
    return v


def _tile_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    if len(shape) == 0:
        return (1, 1)
    if len(shape) == 1:
        return (shape[0], 1)
    return shape


def output(
    trace: KernelTrace, dst: Any, shape: tuple[int, ...], dtype: Any, *, buffer: str = SBUF, what: str = "dst"
) -> tuple[View, Tensor | None]:
    """The destination of an instruction: the given ``dst``, or a new tile (returned second)."""
    if dst is not None:
        v = on_chip(trace, dst, what)
        if v.size != math.prod(shape) and v.partitions != shape[0]:
            raise trace.error(f"{trace.api}: {what} {list(v.shape)} does not match the result {list(shape)}")
        return v, None
    t = trace.tensor(_tile_shape(shape), dtype, buffer)
    return t.whole(), t


def finish(trace: KernelTrace, node: int, fresh: Tensor | None) -> Any:
    if fresh is not None:
        fresh.fresh_node = node
    return fresh


def _bytes(v: View) -> int:
    return v.partitions * v.free * v.dtype.itemsize


def _mem_counters(reads: list[View], writes: list[View]) -> NodeCounters:
    c = NodeCounters()
    for v in reads:
        n = _bytes(v)
        c = c + (NodeCounters(psum_read_bytes=n) if v.buffer == PSUM else NodeCounters(sbuf_read_bytes=n))
    for v in writes:
        n = _bytes(v)
        c = c + (NodeCounters(psum_write_bytes=n) if v.buffer == PSUM else NodeCounters(sbuf_write_bytes=n))
    return c


def _check_free(trace: KernelTrace, v: View, what: str) -> None:
    limit = trace.spec.vector_psum_free_limit if v.buffer == PSUM else trace.spec.vector_sbuf_free_limit
    if v.free > limit:
        raise trace.error(
            f"{trace.api}: {what} has {v.free} elements per partition; an engine reads "
            f"at most {limit} from {v.buffer.upper()}"
        )


def _write(trace: KernelTrace, out: View, values: Any, mask: Mask | None) -> None:
    if trace.numerics:
        out.write(np.asarray(values, np.float32) if out.dtype.is_float else values, mask)


def _engine(engine: Any, default: Engine) -> Engine:
    if engine is None:
        return default
    if isinstance(engine, Engine):
        return engine
    name = str(getattr(engine, "name", engine)).lower()
    return {
        "vector": Engine.VECTOR,
        "scalar": Engine.SCALAR,
        "activation": Engine.SCALAR,
        "act": Engine.SCALAR,
        "gpsimd": Engine.GPSIMD,
        "pool": Engine.GPSIMD,
        "tensor": Engine.TENSOR,
        "pe": Engine.TENSOR,
        "sync": Engine.SYNC,
        "unknown": default,
    }.get(name, default)


class engine:
    """Engine selectors (``engine=nisa.vector_engine``)."""

    tensor = Engine.TENSOR
    vector = Engine.VECTOR
    scalar = Engine.SCALAR
    activation = Engine.SCALAR
    gpsimd = Engine.GPSIMD
    sync = Engine.SYNC
    unknown = None


tensor_engine = Engine.TENSOR
vector_engine = Engine.VECTOR
scalar_engine = Engine.SCALAR
activation_engine = Engine.SCALAR
gpsimd_engine = Engine.GPSIMD
unknown_engine = None


def _elementwise_cycles(
    trace: KernelTrace, eng: Engine, kind: str, n: int, *, psum_inputs: int = 0, all_bf16: bool = False
) -> float:
    spec = trace.spec
    if eng is Engine.GPSIMD:
        return costs.gpsimd_cycles(spec, n)
    if eng is Engine.SCALAR:
        return costs.activation_cycles(spec, n)
    return costs.vector_cycles(spec, kind, n, inputs_in_psum=psum_inputs, all_bf16=all_bf16)


def _split_dst(args: tuple[Any, ...], kwargs: dict[str, Any], n_old: int) -> tuple[Any, tuple[Any, ...]]:
    """New-style calls pass ``dst`` first (positionally or by name); old-style ones return a tile."""
    if "dst" in kwargs:
        return kwargs.pop("dst"), args
    if len(args) > n_old:
        return args[0], args[1:]
    return None, args


# -- DMA -----------------------------------------------------------------------------------------


def dma_copy(*args: Any, **kwargs: Any) -> Any:
    """DMA ``src`` -> ``dst`` (HBM <-> SBUF, or within one of them)."""
    trace = require_trace("dma_copy")
    trace.enter("dma_copy")
    dst, rest = _split_dst(args, kwargs, 1)
    src = kwargs.pop("src", rest[0] if rest else None)
    mask = kwargs.pop("mask", None)
    if dst is None or src is None:
        raise trace.error("dma_copy needs dst= and src=")
    return transfer(
        trace, as_view(dst), as_view(src), mask, engine=_engine(kwargs.get("engine"), Engine.SYNC)
    )


def transfer(
    trace: KernelTrace, dst: View, src: View, mask: Mask | None, *, engine: Engine | None = None
) -> None:
    if dst.buffer == PSUM or src.buffer == PSUM:
        raise trace.error(
            f"{trace.api}: DMA cannot reach PSUM ({(dst if dst.buffer == PSUM else src).tensor.name}); "
            f"copy it to SBUF with an engine first"
        )
    if dst.size != src.size and dst.shape != src.shape:
        raise trace.error(f"{trace.api}: shapes differ: dst {list(dst.shape)}, src {list(src.shape)}")
    for v in (dst, src):
        if v.tensor.on_chip and v.partitions > trace.spec.partitions:
            raise trace.error(
                f"{trace.api}: tile spans {v.partitions} partitions; at most {trace.spec.partitions}"
            )
    _use(src.tensor)
    if trace.numerics:
        dst.write(
            np.asarray(src.read()).reshape(dst.plan.shape) if src.size == dst.plan.size else src.read(), mask
        )
    trace.dma(dst, src, mask=mask, engine=engine if engine is not Engine.SYNC else None)


# -- Tensor engine -------------------------------------------------------------------------------


def nc_matmul(*args: Any, **kwargs: Any) -> Any:
    """``stationary[K, M].T @ moving[K, N]`` into PSUM: a LoadStationary and a MultiplyMoving."""
    trace = require_trace("nc_matmul")
    trace.enter("nc_matmul")
    dst, rest = _split_dst(args, kwargs, 2)
    stationary = kwargs.pop("stationary", rest[0] if rest else None)
    moving = kwargs.pop("moving", rest[1] if len(rest) > 1 else None)
    return matmul_tiles(trace, dst, stationary, moving, accumulate=dst is not None, mask=kwargs.get("mask"))


def matmul_tiles(
    trace: KernelTrace,
    dst: Any,
    stationary: Any,
    moving: Any,
    *,
    accumulate: bool,
    mask: Mask | None = None,
    transpose: bool = False,
) -> Any:
    spec = trace.spec
    st = on_chip(trace, stationary, "stationary", (SBUF,))
    mv = on_chip(trace, moving, "moving", (SBUF,))
    k, m = st.partitions, st.free
    k2, n = mv.partitions, mv.free
    if k != k2:
        raise trace.error(f"nc_matmul: contraction (partition) sizes differ: stationary {k}, moving {k2}")
    if k > spec.max_contraction:
        raise trace.error(f"nc_matmul: contraction dimension {k} exceeds {spec.max_contraction}")
    if m > spec.max_stationary_free:
        raise trace.error(
            f"nc_matmul: stationary free size {m} exceeds {spec.max_stationary_free} "
            f"(nl.tile_size.gemm_stationary_fmax)"
        )
    if n > spec.max_moving_free:
        raise trace.error(
            f"nc_matmul: moving free size {n} exceeds {spec.max_moving_free} (nl.tile_size.gemm_moving_fmax)"
        )
    out, fresh = output(trace, dst, (m, n), ndt.float32, buffer=PSUM)
    if out.buffer != PSUM:
        raise trace.error(
            f"nc_matmul: the result must go to PSUM, not {out.buffer.upper()} ({out.tensor.name})"
        )
    if out.free * 4 > spec.psum_bank_bytes_per_partition:
        raise trace.error(
            f"nc_matmul: result tile of {out.free} fp32 per partition exceeds a PSUM bank "
            f"({spec.psum_bank_bytes_per_partition // 4}, nl.tile_size.psum_fmax)"
        )
    _use(stationary)
    _use(moving)
    dtype = st.dtype.core_dtype if st.dtype.itemsize >= mv.dtype.itemsize else mv.dtype.core_dtype
    if trace.numerics:
        a = np.asarray(_val(trace, st), np.float32).reshape(k, m)
        b = np.asarray(_val(trace, mv), np.float32).reshape(k, n)
        prod = a.T @ b
        if accumulate:
            prod = prod + np.asarray(out.read(), np.float32).reshape(m, n)
        out.write(prod.reshape(out.plan.shape), mask)
    ls = costs.ldweights_cycles(spec, m, dtype)
    mm = costs.matmul_cycles(spec, n, dtype)
    flops = 2 * k * m * n
    trace.instruction(
        Engine.TENSOR,
        "LDWEIGHTS",
        ls,
        reads=[st],
        writes=[],
        track=RES_TENSOR_LS,
        text=f"src={st.tensor.name} [{k}x{m}]",
        counters=NodeCounters(sbuf_read_bytes=_bytes(st)),
        shape=(k, m),
        dtype=st.dtype,
    )
    counters = NodeCounters(
        sbuf_read_bytes=_bytes(mv),
        psum_write_bytes=m * n * 4,
        **(
            {"transpose_flops": flops}
            if transpose
            else {"raw_flops": flops, "adjusted_flops": int(flops * dtype.flops_multiplier)}
        ),
    )
    node = trace.instruction(
        Engine.TENSOR,
        "MATMUL",
        mm,
        reads=[mv, *([out] if accumulate else [])],
        writes=[out],
        track=RES_TENSOR_MM,
        text=f"src={mv.tensor.name} dst={out.tensor.name} {k}x{m}x{n}"
        f"{' acc' if accumulate else ''}{' transpose' if transpose else ''}",
        counters=counters,
        tensor_instruction_type="TRANSPOSE" if transpose else None,
        shape=(m, n),
        dtype=ndt.float32,
    )
    return finish(trace, node, fresh)


def nc_transpose(*args: Any, **kwargs: Any) -> Any:
    """Transpose a tile: on the PE (a matmul against an identity, into PSUM), or on the Vector
    engine for blocks of at most 32x32."""
    trace = require_trace("nc_transpose")
    trace.enter("nc_transpose")
    dst, rest = _split_dst(args, kwargs, 1)
    data = kwargs.pop("data", rest[0] if rest else None)
    eng = _engine(kwargs.get("engine"), Engine.TENSOR)
    src = on_chip(trace, data, "data")
    p, f = src.partitions, src.free
    if eng is Engine.VECTOR:
        if p > 32 or f > 32:
            raise trace.error(f"nc_transpose on the Vector engine handles at most 32x32, not {p}x{f}")
        out, fresh = output(trace, dst, (f, p), src.dtype)
        _use(data)
        if trace.numerics:
            out.write(np.asarray(_val(trace, src)).reshape(p, f).T.reshape(out.plan.shape))
        node = trace.instruction(
            Engine.VECTOR,
            "TRANSPOSE",
            costs.vector_cycles(trace.spec, "tensor_copy", f),
            reads=[src],
            writes=[out],
            text=f"{p}x{f}",
            counters=_mem_counters([src], [out]),
            shape=(f, p),
            dtype=src.dtype,
        )
        return finish(trace, node, fresh)
    if p > trace.spec.max_stationary_free or f > trace.spec.max_contraction:
        raise trace.error(f"nc_transpose on the Tensor engine handles at most 128x128, not {p}x{f}")
    out, fresh = output(trace, dst, (f, p), ndt.float32, buffer=PSUM)
    _use(data)
    if trace.numerics:
        out.write(np.asarray(_val(trace, src), np.float32).reshape(p, f).T.reshape(out.plan.shape))
    cycles = costs.pe_transpose_cycles(trace.spec, p, f)
    node = trace.instruction(
        Engine.TENSOR,
        "MATMUL",
        cycles,
        reads=[src],
        writes=[out],
        track=RES_TENSOR_MM,
        text=f"transpose {p}x{f}",
        tensor_instruction_type="TRANSPOSE",
        counters=NodeCounters(
            sbuf_read_bytes=_bytes(src), psum_write_bytes=p * f * 4, transpose_flops=2 * p * p * f
        ),
        shape=(f, p),
        dtype=ndt.float32,
    )
    return finish(trace, node, fresh)


# -- Vector / Scalar / GpSimd -----------------------------------------------------------------------


def elementwise(
    trace: KernelTrace,
    dst: Any,
    *,
    opcode: str,
    kind: str,
    eng: Engine,
    inputs: list[Any],
    compute: Callable[..., Any],
    shape: tuple[int, ...] | None,
    dtype: Any,
    mask: Mask | None,
    activation_fn: str | None = None,
    extra_cycles: float = 0.0,
    out_buffer: str = SBUF,
) -> Any:
    """One Vector/Scalar/GpSimd instruction over tiles ``inputs`` (numbers are immediates)."""
    tiles = [on_chip(trace, x, f"operand {i}") for i, x in enumerate(inputs) if isinstance(x, (Tensor, View))]
    if not tiles and dst is None:
        raise trace.error(f"{trace.api}: needs at least one tile operand")
    first = tiles[0] if tiles else None
    if shape is None:
        shapes = [t.shape for t in tiles]
        try:
            shape = tuple(int(s) for s in np.broadcast_shapes(*shapes)) if shapes else None
        except ValueError:
            raise trace.error(
                f"{trace.api}: operand shapes {[list(s) for s in shapes]} do not broadcast"
            ) from None
    if dtype is None:
        floats = [t.dtype for t in tiles if t.dtype.is_float]
        dtype = (
            ndt.float32 if any(d == ndt.float32 for d in floats) else (first.dtype if first else ndt.float32)
        )
    out, fresh = output(
        trace, dst, shape if shape is not None else as_view(dst).shape, dtype, buffer=out_buffer
    )
    if eng is Engine.GPSIMD and any(t.buffer == PSUM for t in [*tiles, out]):
        raise trace.error(f"{trace.api}: the GpSimd engine cannot access PSUM")
    for t in tiles:
        _check_free(trace, t, "an operand")
        trace.check_bounds(t, mask)
    trace.check_bounds(out, mask)
    for x in inputs:
        _use(x)
    if trace.numerics:
        vals = [_val(trace, x) for x in inputs]
        vals = [
            np.asarray(v, np.float32) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v
            for v in vals
        ]
        result = compute(*vals)
        result = (
            np.broadcast_to(np.asarray(result), out.plan.shape)
            if np.size(result) != out.plan.size
            else np.asarray(result).reshape(out.plan.shape)
        )
        _write(trace, out, result, mask)
    p, n = (first or out).active(mask) if first is not None else out.active(mask)
    n = max(n, out.active(mask)[1])
    psum_inputs = sum(1 for t in tiles if t.buffer == PSUM)
    all_bf16 = all(t.dtype == ndt.bfloat16 for t in [*tiles, out])
    cycles = (
        _elementwise_cycles(trace, eng, kind, n, psum_inputs=psum_inputs, all_bf16=all_bf16) + extra_cycles
    )
    node = trace.instruction(
        eng,
        opcode,
        cycles,
        reads=tiles,
        writes=[out],
        text=f"{activation_fn or kind} [{p}x{n}] -> {out.tensor.name}",
        counters=_mem_counters(tiles, [out]),
        activation_fn=activation_fn,
        shape=out.shape,
        dtype=out.dtype,
    )
    return finish(trace, node, fresh)


def tensor_tensor(*args: Any, **kwargs: Any) -> Any:
    trace = require_trace("tensor_tensor")
    trace.enter("tensor_tensor")
    dst, rest = _split_dst(args, kwargs, 2)
    data1 = kwargs.pop("data1", rest[0] if rest else None)
    data2 = kwargs.pop("data2", rest[1] if len(rest) > 1 else None)
    op = op_name(kwargs.pop("op"))
    fn = ALU.get(op)
    if fn is None:
        raise trace.error(f"tensor_tensor: unknown operation {op!r}")
    eng = _engine(kwargs.get("engine"), Engine.VECTOR)
    return elementwise(
        trace,
        dst,
        opcode="TENSOR_TENSOR",
        kind="tensor_tensor",
        eng=eng,
        inputs=[data1, data2],
        compute=fn,
        shape=None,
        dtype=kwargs.get("dtype"),
        mask=kwargs.get("mask"),
    )


def tensor_scalar(*args: Any, **kwargs: Any) -> Any:
    """``(data op0 operand0) op1 operand1``: operands are numbers or one value per partition."""
    trace = require_trace("tensor_scalar")
    trace.enter("tensor_scalar")
    dst, rest = _split_dst(args, kwargs, 3)
    names = ("data", "op0", "operand0")
    vals = dict(zip(names, rest, strict=False))
    vals.update({k: kwargs.pop(k) for k in names if k in kwargs})
    data, op0, operand0 = vals["data"], op_name(vals["op0"]), vals["operand0"]
    op1 = kwargs.get("op1")
    operand1 = kwargs.get("operand1")
    rev0, rev1 = bool(kwargs.get("reverse0", False)), bool(kwargs.get("reverse1", False))
    steps = [(ALU[op0], rev0)] + ([(ALU[op_name(op1)], rev1)] if op1 is not None else [])

    def compute(x: Any, a: Any, b: Any = None) -> Any:
        y = x
        for (fn, rev), operand in zip(steps, (a, b), strict=False):
            y = fn(operand, y) if rev else fn(y, operand)
        return y

    inputs = [data, operand0] + ([operand1] if op1 is not None else [])
    eng = _engine(kwargs.get("engine"), Engine.VECTOR)
    for x in inputs[1:]:
        if isinstance(x, (Tensor, View)) and as_view(x).free != 1:
            raise trace.error("tensor_scalar: a tile operand must hold one value per partition ([P, 1])")
    return elementwise(
        trace,
        dst,
        opcode="TENSOR_SCALAR",
        kind="tensor_scalar",
        eng=eng,
        inputs=inputs,
        compute=compute,
        shape=as_view(data).shape if isinstance(data, (Tensor, View)) else None,
        dtype=kwargs.get("dtype"),
        mask=kwargs.get("mask"),
    )


def scalar_tensor_tensor(*args: Any, **kwargs: Any) -> Any:
    """``(data op0 scalar) op1 data1``."""
    trace = require_trace("scalar_tensor_tensor")
    trace.enter("scalar_tensor_tensor")
    dst, rest = _split_dst(args, kwargs, 5)
    names = ("data", "op0", "operand0", "op1", "operand1")
    vals = dict(zip(names, rest, strict=False))
    vals.update({k: kwargs.pop(k) for k in names if k in kwargs})
    f0, f1 = ALU[op_name(vals["op0"])], ALU[op_name(vals["op1"])]
    return elementwise(
        trace,
        dst,
        opcode="SCALAR_TENSOR_TENSOR",
        kind="tensor_tensor",
        eng=Engine.VECTOR,
        inputs=[vals["data"], vals["operand0"], vals["operand1"]],
        compute=lambda x, a, b: f1(f0(x, a), b),
        shape=as_view(vals["data"]).shape,
        dtype=kwargs.get("dtype"),
        mask=kwargs.get("mask"),
    )


def activation(*args: Any, **kwargs: Any) -> Any:
    """Scalar engine ``op(data * scale + bias)``; scale is a number or one value per partition."""
    trace = require_trace("activation")
    trace.enter("activation")
    dst = kwargs.pop("dst", None)
    names = ("op", "data", "bias", "scale")
    vals = dict(zip(names, args, strict=False))
    vals.update({k: kwargs.pop(k) for k in names if k in kwargs})
    return _activate(
        trace,
        dst,
        vals["op"],
        vals["data"],
        vals.get("bias"),
        vals.get("scale", 1.0),
        reduce_res=kwargs.get("reduce_res"),
        reduce_op=kwargs.get("reduce_op"),
        dtype=kwargs.get("dtype"),
        mask=kwargs.get("mask"),
    )


def activation_reduce(*args: Any, **kwargs: Any) -> Any:
    trace = require_trace("activation_reduce")
    trace.enter("activation_reduce")
    dst = kwargs.pop("dst", None)
    names = ("op", "data", "reduce_op", "reduce_res", "bias", "scale")
    vals = dict(zip(names, args, strict=False))
    vals.update({k: kwargs.pop(k) for k in names if k in kwargs})
    return _activate(
        trace,
        dst,
        vals["op"],
        vals["data"],
        vals.get("bias"),
        vals.get("scale", 1.0),
        reduce_res=vals.get("reduce_res"),
        reduce_op=vals.get("reduce_op", "add"),
        dtype=kwargs.get("dtype"),
        mask=kwargs.get("mask"),
    )


def _activate(
    trace: KernelTrace,
    dst: Any,
    op: Any,
    data: Any,
    bias: Any,
    scale: Any,
    *,
    reduce_res: Any,
    reduce_op: Any,
    dtype: Any,
    mask: Mask | None,
) -> Any:
    name = op_name(op)
    fn = ACT.get(name)
    if fn is None:
        raise trace.error(f"activation: unknown function {name!r}")
    src = on_chip(trace, data, "data")
    for what, x in (("scale", scale), ("bias", bias)):
        if isinstance(x, (Tensor, View)) and as_view(x).free != 1:
            raise trace.error(f"activation: {what} must be a number or one value per partition ([P, 1])")

    def compute(x: Any, s: Any, b: Any) -> Any:
        y = x * s
        if b is not None:
            y = y + b
        return fn(y)

    result = elementwise(
        trace,
        dst,
        opcode="ACTIVATE",
        kind="activation",
        eng=Engine.SCALAR,
        inputs=[src, scale, bias],
        compute=compute,
        shape=src.shape,
        dtype=dtype or src.dtype,
        mask=mask,
        activation_fn=name.upper(),
        extra_cycles=trace.spec.min_ii_cycles if reduce_res is not None else 0,
    )
    if reduce_res is not None:
        out = as_view(dst) if dst is not None else as_view(result)
        if trace.numerics:
            red = REDUCE[op_name(reduce_op or "add")]
            vals = np.asarray(out.read(), np.float32)
            as_view(reduce_res).write(
                red(vals.reshape(vals.shape[0], -1), axis=1, keepdims=True).reshape(
                    as_view(reduce_res).plan.shape
                )
            )
        trace.key_rect(as_view(reduce_res), True)
        node = trace.em.n_nodes - 1
        trace.em.record_access(node, trace.em.lane_of(node), [], trace.key_rect(as_view(reduce_res), True))
    return result


def tensor_reduce(*args: Any, **kwargs: Any) -> Any:
    """Reduce along free axes (``axis``) with ``op``; the result keeps one value per partition."""
    trace = require_trace("tensor_reduce")
    trace.enter("tensor_reduce")
    dst, rest = _split_dst(args, kwargs, 2)
    names = ("op", "data")
    vals = dict(zip(names, rest, strict=False))
    vals.update({k: kwargs.pop(k) for k in names if k in kwargs})
    return reduce_tile(
        trace,
        dst,
        op_name(vals["op"]),
        vals["data"],
        kwargs.get("axis", 1),
        negate=bool(kwargs.get("negate", False)),
        dtype=kwargs.get("dtype"),
        mask=kwargs.get("mask"),
        keepdims=bool(kwargs.get("keepdims", True)),
    )


def reduce_tile(
    trace: KernelTrace,
    dst: Any,
    op: str,
    data: Any,
    axis: Any,
    *,
    negate: bool = False,
    dtype: Any = None,
    mask: Mask | None = None,
    keepdims: bool = True,
    scale: float | None = None,
) -> Any:
    src = on_chip(trace, data, "data")
    fn = REDUCE.get(op)
    if fn is None:
        raise trace.error(f"tensor_reduce: unknown reduction {op!r}")
    axes = tuple(axis) if isinstance(axis, (tuple, list)) else (int(axis),)
    if 0 in axes:
        raise trace.error(
            "tensor_reduce: the partition axis cannot be reduced on the Vector engine "
            "(reduce free axes; use a matmul or nc_transpose across partitions)"
        )
    shape = list(src.shape)
    for a in axes:
        shape[a] = 1
    out_shape = tuple(shape)

    def compute(x: Any) -> Any:
        y = fn(x, axis=axes, keepdims=True)
        if scale is not None:
            y = y * scale
        return -y if negate else y

    return elementwise(
        trace,
        dst,
        opcode="TENSOR_REDUCE",
        kind="tensor_reduce",
        eng=Engine.VECTOR,
        inputs=[src],
        compute=compute,
        shape=out_shape,
        dtype=dtype or src.dtype,
        mask=mask,
    )


def tensor_copy(*args: Any, **kwargs: Any) -> Any:
    trace = require_trace("tensor_copy")
    trace.enter("tensor_copy")
    dst, rest = _split_dst(args, kwargs, 1)
    src = kwargs.pop("src", rest[0] if rest else None)
    eng = _engine(kwargs.get("engine"), Engine.VECTOR)
    return copy_tile(trace, dst, src, eng, dtype=kwargs.get("dtype"), mask=kwargs.get("mask"))


def copy_tile(
    trace: KernelTrace, dst: Any, src: Any, eng: Engine, *, dtype: Any = None, mask: Mask | None = None
) -> Any:
    v = on_chip(trace, src, "src")
    out_dtype = dtype or (as_view(dst).dtype if dst is not None else v.dtype)
    return elementwise(
        trace,
        dst,
        opcode="TENSOR_COPY" if eng is not Engine.SCALAR else "ACTIVATE",
        kind="tensor_copy",
        eng=eng,
        inputs=[v],
        compute=lambda x: x,
        shape=v.shape,
        dtype=out_dtype,
        mask=mask,
        activation_fn="COPY" if eng is Engine.SCALAR else None,
    )


def tensor_tensor_scan(*args: Any, **kwargs: Any) -> Any:
    """``out[i] = (data0[i] op0 out[i-1]) op1 data1[i]`` along the free axis, from ``initial``."""
    trace = require_trace("tensor_tensor_scan")
    trace.enter("tensor_tensor_scan")
    dst, rest = _split_dst(args, kwargs, 4)
    names = ("data0", "data1", "initial", "op0", "op1")
    vals = dict(zip(names, rest, strict=False))
    vals.update({k: kwargs.pop(k) for k in names if k in kwargs})
    f0, f1 = ALU[op_name(vals["op0"])], ALU[op_name(vals["op1"])]
    initial = vals.get("initial", 0.0)

    def compute(a: Any, b: Any, init: Any) -> Any:
        a2 = np.asarray(a, np.float32).reshape(a.shape[0], -1)
        b2 = np.asarray(b, np.float32).reshape(b.shape[0], -1)
        prev = np.broadcast_to(
            np.asarray(init, np.float32).reshape(-1, 1) if np.ndim(init) else np.float32(init),
            (a2.shape[0], 1),
        ).astype(np.float32)[:, 0]
        out = np.empty_like(a2)
        for i in range(a2.shape[1]):
            prev = f1(f0(a2[:, i], prev), b2[:, i])
            out[:, i] = prev
        return out.reshape(a.shape)

    d0 = on_chip(trace, vals["data0"], "data0")
    return elementwise(
        trace,
        dst,
        opcode="TENSOR_TENSOR_SCAN",
        kind="tensor_tensor",
        eng=Engine.VECTOR,
        inputs=[d0, vals["data1"], initial],
        compute=compute,
        shape=d0.shape,
        dtype=kwargs.get("dtype") or d0.dtype,
        mask=kwargs.get("mask"),
    )


def memset(*args: Any, **kwargs: Any) -> Any:
    """Fill a tile with ``value``: ``memset(dst, value)`` (new), ``memset(shape, value, dtype)`` (old)."""
    trace = require_trace("memset")
    trace.enter("memset")
    dst = kwargs.pop("dst", None)
    shape = kwargs.pop("shape", None)
    if dst is None and args and isinstance(args[0], (Tensor, View)):
        dst, args = args[0], args[1:]
    elif shape is None and args:
        shape, args = tuple(args[0]), args[1:]
    value = kwargs.pop("value", args[0] if args else 0.0)
    dtype = kwargs.pop("dtype", args[1] if len(args) > 1 else None)
    if dst is None:
        if shape is None:
            raise trace.error("memset needs dst= or a shape")
        dtype = dtype or ndt.float32
    return fill(
        trace,
        dst,
        tuple(shape) if shape is not None else None,
        float(value),
        dtype,
        engine=_engine(kwargs.get("engine"), Engine.VECTOR),
        mask=kwargs.get("mask"),
    )


def fill(
    trace: KernelTrace,
    dst: Any,
    shape: tuple[int, ...] | None,
    value: float,
    dtype: Any,
    *,
    engine: Engine = Engine.VECTOR,
    mask: Mask | None = None,
) -> Any:
    if dst is not None:
        out, fresh = on_chip(trace, dst, "dst"), None
    else:
        assert shape is not None
        out, fresh = output(trace, None, shape, dtype)
    if trace.numerics:
        _write(trace, out, np.full(out.plan.shape, value, np.float32), mask)
    p, n = out.active(mask)
    spec = trace.spec
    if engine is Engine.GPSIMD:
        cycles = float(costs.gpsimd_cycles(spec, n))
    else:
        half = value == 0 and out.dtype.itemsize == 2
        cycles = float(max(spec.min_ii_cycles, n // 2 if half else n))
    node = trace.instruction(
        engine,
        "MEMSET",
        cycles,
        reads=[],
        writes=[out],
        text=f"{value} [{p}x{n}] -> {out.tensor.name}",
        counters=_mem_counters([], [out]),
        shape=out.shape,
        dtype=out.dtype,
    )
    return finish(trace, node, fresh)


def iota(*args: Any, **kwargs: Any) -> Any:
    """GpSimd IOTA: a tile of index values (an ``nl.arange``/``mgrid`` expression)."""
    from neuroncore.nki.indexing import IndexExpr

    trace = require_trace("iota")
    trace.enter("iota")
    dst = kwargs.pop("dst", None)
    expr = kwargs.pop("expr", args[0] if args else None)
    dtype = kwargs.pop("dtype", args[1] if len(args) > 1 else ndt.int32)
    if isinstance(expr, Tensor) and dst is None:  # new style iota(dst, expr)
        dst, expr = expr, args[1] if len(args) > 1 else kwargs.get("expr")
    values = expr.values if isinstance(expr, IndexExpr) else np.asarray(expr)
    values = values.reshape(_tile_shape(tuple(values.shape)))
    out, fresh = output(trace, dst, tuple(values.shape), dtype)
    if trace.numerics:
        out.write(np.broadcast_to(values, out.plan.shape))
    p, n = out.partitions, out.free
    node = trace.instruction(
        Engine.GPSIMD,
        "IOTA",
        costs.gpsimd_cycles(trace.spec, n),
        reads=[],
        writes=[out],
        text=f"iota [{p}x{n}]",
        counters=_mem_counters([], [out]),
        shape=out.shape,
        dtype=out.dtype,
    )
    return finish(trace, node, fresh)


def affine_select(*args: Any, **kwargs: Any) -> Any:
    """GpSimd: ``on_true`` where the predicate (an index expression mask) holds, else ``on_false_value``."""
    trace = require_trace("affine_select")
    trace.enter("affine_select")
    dst = kwargs.pop("dst", None)
    names = ("pred", "on_true_tile", "on_false_value")
    vals = dict(zip(names, args, strict=False))
    vals.update({k: kwargs.pop(k) for k in names if k in kwargs})
    pred = vals["pred"]
    pv = pred.values if isinstance(pred, Mask) else np.asarray(pred, bool)
    fill_value = float(vals["on_false_value"])
    src = on_chip(trace, vals["on_true_tile"], "on_true_tile", (SBUF,))

    def compute(x: Any) -> Any:
        return np.where(np.broadcast_to(pv, x.shape), x, fill_value)

    return elementwise(
        trace,
        dst,
        opcode="AFFINE_SELECT",
        kind="tensor_copy",
        eng=Engine.GPSIMD,
        inputs=[src],
        compute=compute,
        shape=src.shape,
        dtype=kwargs.get("dtype") or src.dtype,
        mask=kwargs.get("mask"),
    )


def select(*args: Any, **kwargs: Any) -> Any:
    """Vector TENSOR_COPY_PREDICATED: ``on_true`` where ``pred`` is non-zero, else ``on_false``."""
    trace = require_trace("select")
    trace.enter("select")
    dst = kwargs.pop("dst", None)
    names = ("pred", "on_true", "on_false")
    vals = dict(zip(names, args, strict=False))
    vals.update({k: kwargs.pop(k) for k in names if k in kwargs})
    return elementwise(
        trace,
        dst,
        opcode="TENSOR_COPY_PREDICATED",
        kind="tensor_tensor",
        eng=Engine.VECTOR,
        inputs=[vals["pred"], vals["on_true"], vals["on_false"]],
        compute=lambda p, a, b: np.where(np.asarray(p) != 0, a, b),
        shape=None,
        dtype=kwargs.get("dtype"),
        mask=kwargs.get("mask"),
    )


def reciprocal(*args: Any, **kwargs: Any) -> Any:
    trace = require_trace("reciprocal")
    trace.enter("reciprocal")
    dst, rest = _split_dst(args, kwargs, 1)
    data = kwargs.pop("data", rest[0] if rest else None)
    return elementwise(
        trace,
        dst,
        opcode="RECIPROCAL",
        kind="reciprocal",
        eng=Engine.VECTOR,
        inputs=[data],
        compute=lambda x: 1.0 / x,
        shape=None,
        dtype=kwargs.get("dtype"),
        mask=kwargs.get("mask"),
    )


def bn_stats(*args: Any, **kwargs: Any) -> Any:
    """Six statistics per partition of up to 512 elements: (count, mean, M2) for even and odd halves."""
    trace = require_trace("bn_stats")
    trace.enter("bn_stats")
    dst, rest = _split_dst(args, kwargs, 1)
    data = kwargs.pop("data", rest[0] if rest else None)
    src = on_chip(trace, data, "data")
    if src.free > 512:
        raise trace.error(
            f"bn_stats: {src.free} elements per partition; at most 512 (nl.tile_size.bn_stats_fmax)"
        )
    mask = kwargs.get("mask")

    def compute(x: Any) -> Any:
        x2 = np.asarray(x, np.float32).reshape(x.shape[0], -1)
        cols = np.arange(x2.shape[1])
        if mask is not None:
            valid = np.broadcast_to(mask.values, x.shape).reshape(x2.shape[0], -1)[0]
            cols = cols[valid]
        out = np.zeros((x2.shape[0], 6), np.float32)
        for i, part in enumerate((cols[0::2], cols[1::2])):
            seg = x2[:, part]
            n = seg.shape[1]
            mean = seg.mean(axis=1) if n else 0.0
            out[:, 3 * i] = n
            out[:, 3 * i + 1] = mean
            out[:, 3 * i + 2] = ((seg - np.reshape(mean, (-1, 1))) ** 2).sum(axis=1) if n else 0.0
        return out

    out, fresh = output(trace, dst, (src.partitions, 6), kwargs.get("dtype") or ndt.float32)
    _use(data)
    if trace.numerics:
        out.write(compute(src.read()).reshape(out.plan.shape))
    p, n = src.active(mask)
    cycles = max(trace.spec.min_ii_cycles, n)
    node = trace.instruction(
        Engine.VECTOR,
        "BN_STATS",
        cycles,
        reads=[src],
        writes=[out],
        text=f"bn_stats [{p}x{n}]",
        counters=_mem_counters([src], [out]),
        shape=out.shape,
        dtype=out.dtype,
    )
    return finish(trace, node, fresh)


def bn_aggr(*args: Any, **kwargs: Any) -> Any:
    """Mean and variance per partition from groups of six bn_stats values."""
    trace = require_trace("bn_aggr")
    trace.enter("bn_aggr")
    dst, rest = _split_dst(args, kwargs, 1)
    data = kwargs.pop("data", rest[0] if rest else None)
    src = on_chip(trace, data, "data")
    out, fresh = output(trace, dst, (src.partitions, 2), kwargs.get("dtype") or ndt.float32)
    _use(data)
    if trace.numerics:
        s = np.asarray(src.read(), np.float32).reshape(src.partitions, -1, 3)
        count, mean, m2 = s[:, :, 0], s[:, :, 1], s[:, :, 2]
        total = count.sum(axis=1, keepdims=True)
        gmean = (count * mean).sum(axis=1, keepdims=True) / np.maximum(total, 1)
        var = (m2 + count * (mean - gmean) ** 2).sum(axis=1, keepdims=True) / np.maximum(total, 1)
        out.write(np.concatenate([gmean, var], axis=1).reshape(out.plan.shape))
    n = src.free
    cycles = max(trace.spec.min_ii_cycles, math.ceil(13 * n / 3))
    node = trace.instruction(
        Engine.VECTOR,
        "BN_AGGR",
        cycles,
        reads=[src],
        writes=[out],
        text=f"bn_aggr [{src.partitions}x{n}]",
        counters=_mem_counters([src], [out]),
        shape=out.shape,
        dtype=out.dtype,
    )
    return finish(trace, node, fresh)


def _not_hbm(trace: KernelTrace, x: Any) -> None:
    if isinstance(x, (Tensor, View)) and as_view(x).buffer in HBM_BUFFERS:
        raise trace.error(
            f"{trace.api}: {as_view(x).tensor.name} is in HBM; engines read SBUF or PSUM (load it first)"
        )


__all__ = [
    "activation",
    "activation_engine",
    "activation_reduce",
    "affine_select",
    "bn_aggr",
    "bn_stats",
    "dma_copy",
    "engine",
    "gpsimd_engine",
    "iota",
    "memset",
    "nc_matmul",
    "nc_transpose",
    "reciprocal",
    "scalar_engine",
    "scalar_tensor_tensor",
    "select",
    "tensor_copy",
    "tensor_engine",
    "tensor_reduce",
    "tensor_scalar",
    "tensor_tensor",
    "tensor_tensor_scan",
    "unknown_engine",
    "vector_engine",
]
