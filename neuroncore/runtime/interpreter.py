"""Numerics: execute a compiled program's instructions on NumPy copies of SBUF, PSUM and HBM.

Every engine computes in FP32 and rounds when it writes a tensor of a narrower dtype (bf16 through
``ml_dtypes``), so bf16 programs show real bf16 error. Instructions run in the program's global
order, which respects every semaphore, so the result is the one the device would compute.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from neuroncore.compiler import node_semantics as ns
from neuroncore.compiler import view_steps as vs
from neuroncore.compiler.lowering_state import HbmTensorKind
from neuroncore.compiler.program import ApRef, HbmAccess, Program, Ref
from neuroncore.compiler.tiling import tile_grid
from neuroncore.dtypes import DType, round_to, stochastic_round
from neuroncore.ir import philox, threefry
from neuroncore.ir import semantics as ir_semantics
from neuroncore.ir.graph import Op

Exchange = Callable[[Op, np.ndarray], np.ndarray]
"""How a rank's collective meets the other ranks': given the op and this rank's operand, the result."""


class ExecutionError(RuntimeError):
    """A run that cannot complete (e.g. an embedding index outside its table)."""


ALU: dict[str, Callable[[npt.ArrayLike, npt.ArrayLike], np.ndarray]] = {
    "add": np.add,
    "subtract": np.subtract,
    "mult": np.multiply,
    "divide": np.divide,
    "max": np.maximum,
    "min": np.minimum,
    "is_equal": lambda a, b: np.equal(a, b).astype(np.float32),
    "not_equal": lambda a, b: np.not_equal(a, b).astype(np.float32),
    "is_lt": lambda a, b: np.less(a, b).astype(np.float32),
    "is_le": lambda a, b: np.less_equal(a, b).astype(np.float32),
    "is_gt": lambda a, b: np.greater(a, b).astype(np.float32),
    "is_ge": lambda a, b: np.greater_equal(a, b).astype(np.float32),
}

ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "exponential": np.exp,
    "tanh": np.tanh,
    "logistic": ir_semantics.logistic,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "sqrt": np.sqrt,
    "log": np.log,
    "negate": lambda x: x,  # the -1 is the instruction's scale
    "copy": lambda x: x,
    "abs": np.abs,
    "cosine": np.cos,
    "sine": np.sin,
    "erf": ir_semantics.UNARY["erf"],
    "silu": ir_semantics.UNARY["silu"],
    "gelu_dx": ir_semantics.gelu_dx,
    "silu_dx": ir_semantics.silu_dx,
    "gelu": lambda x: ir_semantics.gelu(x, "tanh"),
    "gelu_exact": lambda x: ir_semantics.gelu(x, "none"),
    "square": np.square,
    "relu": lambda x: np.maximum(x, 0.0),
}


class Machine:
    """Memory state of one execution."""

    def __init__(self, program: Program, hbm: dict[str, np.ndarray],
                 exchange: Exchange | None = None, rounding: np.random.Generator | None = None) -> None:
        """``rounding``: the random source of stochastic rounding of bf16 writes (None: every
        write rounds to nearest even)."""
        self.program = program
        self.rounding = rounding
        self.hbm = hbm
        self.exchange = exchange
        self.buffers: dict[int, np.ndarray] = {}
        self.dtypes = {b.id: b.dtype for b in program.buffers.values()}
        self.views: dict[str, np.ndarray] = {}
        self.weights: np.ndarray | None = None
        self._patterns: dict[tuple[int, tuple[tuple[int, int], ...]], np.ndarray] = {}

    # -- memory ------------------------------------------------------------------------------
    def buf(self, buf_id: int) -> np.ndarray:
        arr = self.buffers.get(buf_id)
        if arr is None:
            b = self.program.buffers[buf_id]
            arr = np.zeros((128, b.free), np.float32)
            self.buffers[buf_id] = arr
        return arr

    def read(self, ref: Ref | ApRef) -> np.ndarray:
        if isinstance(ref, ApRef):
            return self.buf(ref.buf)[ref.p0:ref.p1, self._indices(ref)]
        return self.buf(ref.buf)[ref.p0:ref.p1, ref.f0:ref.f1]

    def _indices(self, ref: ApRef) -> np.ndarray:
        key = (ref.offset, ref.pattern)
        index = self._patterns.get(key)
        if index is None:
            index = self._patterns[key] = ref.indices()
        return index

    def scalar(self, operand: float | Ref) -> np.float32 | np.ndarray:
        if isinstance(operand, Ref):
            return self.read(operand)[:, :1]
        return np.float32(operand)

    def write(self, ref: Ref | ApRef, values: npt.ArrayLike) -> None:
        target = self.buf(ref.buf)
        region = np.broadcast_to(values, (ref.rows, ref.cols))
        if isinstance(ref, ApRef):
            target[ref.p0:ref.p1, self._indices(ref)] = self.round(region, self.dtypes[ref.buf])
            return
        target[ref.p0:ref.p1, ref.f0:ref.f1] = self.round(region, self.dtypes[ref.buf])

    def round(self, values: npt.ArrayLike, dtype: DType) -> np.ndarray:
        """An engine's write of FP32 results into a ``dtype`` tensor."""
        if self.rounding is not None and dtype is DType.BF16:
            return stochastic_round(np.asarray(values, np.float32), dtype, self.rounding)
        return round_to(np.asarray(values), dtype)

    def tensor(self, name: str) -> np.ndarray:
        if name in self.hbm:
            return self.hbm[name]
        if name not in self.views:
            self.views[name] = self._evaluate_view(name)
        return self.views[name]

    def _evaluate_view(self, name: str) -> np.ndarray:
        view = self.program.hbm_views[name]
        sources = [self.tensor(s) for s in view.sources]
        first = view.steps[0]
        if isinstance(first, vs.ApplyOp):
            op = self.program.graph.ops[first.op_index]
            shaped = [s.reshape(o.shape) for s, o in zip(sources, op.operands)]
            return np.ascontiguousarray(ir_semantics._evaluate(op, shaped), dtype=np.float32)
        arr = sources[0]
        for step in view.steps:
            if isinstance(step, vs.Transpose):
                arr = np.transpose(arr.reshape(self._source_shape(view.sources[0], arr)), step.perm)
            elif isinstance(step, vs.Reshape):
                arr = arr.reshape(step.shape)
            elif isinstance(step, vs.BroadcastRows):
                arr = np.broadcast_to(arr.reshape(1, -1), (step.rows, arr.size))
            else:
                raise ExecutionError(f"view {name}: {step!r} is not a view step the interpreter knows")
        return np.ascontiguousarray(arr, dtype=np.float32)

    def _source_shape(self, name: str, arr: np.ndarray) -> tuple[int, ...]:
        tensor = self.program.hbm_tensors.get(name)
        if tensor is not None:
            return self.program.graph.ops[tensor.op_index].shape
        return self.program.hbm_views[name].shape

    def hbm3d(self, access: HbmAccess) -> np.ndarray:
        arr = self.tensor(access.tensor)
        shape = self._shape_of(access.tensor)
        b, r, c = tile_grid(shape, access.layout)
        return arr.reshape(b, r, c)

    def _shape_of(self, name: str) -> tuple[int, ...]:
        if name in self.program.hbm_tensors:
            return self.program.hbm_tensors[name].shape
        return self.program.hbm_views[name].shape

    # -- execution ---------------------------------------------------------------------------
    def handlers(self) -> dict[type, Callable[[Any], None]]:
        """The handler of each node-semantics record type (``node_semantics.SEMANTIC_KINDS``)."""
        return {
            ns.Nop: _nothing, ns.Load: self._load, ns.LoadKTiled: self._load_ktiled,
            ns.Store: self._store, ns.Gather: self._gather, ns.TensorTensor: self._tensor_tensor,
            ns.TensorScalar: self._tensor_scalar, ns.Activate: self._activate, ns.Copy: self._copy,
            ns.Reduce: self._reduce, ns.Reciprocal: self._reciprocal, ns.Select: self._select,
            ns.Memset: self._memset, ns.Iota: self._iota, ns.Random: self._random,
            ns.Identity: self._identity,
            ns.LoadWeights: self._load_weights, ns.MatMul: self._matmul,
            ns.Collective: self._collective, ns.KernelCall: self._kernel_call,
        }

    def run(self) -> None:
        handlers = self.handlers()
        node = -1
        try:
            for node, sem in enumerate(self.program.semantics):
                handler = handlers.get(type(sem))
                if handler is None:
                    raise ExecutionError(f"node {node} carries {sem!r}, which is not a node-semantics "
                                         f"record the interpreter knows")
                handler(sem)
        except (ValueError, IndexError) as error:  # a program inconsistent with itself: a compiler bug
            raise ExecutionError(f"{self._node_text(node)} cannot run: {error}") from error

    def _node_text(self, node: int) -> str:
        """``node 850 (TENSOR_SCALAR) of divide.5 (divide) at model/gate [m.py:9]``: where a defect
        in a compiled program shows, named as errors name an op (not a NumPy broadcasting line)."""
        program = self.program
        text = f"node {node} ({program.opcodes[int(program.opcode_id[node])]})"
        index = int(program.op_index[node])
        return f"{text} of {program.graph.ops[index].describe()}" if index >= 0 else text

    def _kernel_call(self, s: ns.KernelCall) -> None:
        from neuroncore.nki.embed import compute_call  # the NKI package builds on this runtime

        out = self.hbm[s.output]
        out[...] = compute_call(s.kernel, [self.hbm[name] for name in s.inputs]).reshape(out.shape)

    def _load(self, s: ns.Load) -> None:
        src = s.src
        block = self.hbm3d(src)[src.batch, src.r0:src.r1, src.c0:src.c1]
        self.write(s.dst, block)

    def _load_ktiled(self, s: ns.LoadKTiled) -> None:
        src, ktiles = s.src, s.ktiles
        block = self.hbm3d(src)[src.batch, src.r0:src.r1, src.c0:src.c1]
        rows, width = block.shape
        padded = np.zeros((ktiles * 128, width), np.float32)
        padded[:rows] = block
        tiled = padded.reshape(ktiles, 128, width).transpose(1, 0, 2).reshape(128, ktiles * width)
        self.write(s.dst, tiled[:s.dst.rows])

    def _store(self, s: ns.Store) -> None:
        dst = s.dst
        tensor = self.program.hbm_tensors[dst.tensor]
        self.hbm3d(dst)[dst.batch, dst.r0:dst.r1, dst.c0:dst.c1] = self.round(self.read(s.src),
                                                                              tensor.dtype)

    def _tensor_tensor(self, s: ns.TensorTensor) -> None:
        with np.errstate(all="ignore"):
            self.write(s.out, ALU[s.alu](self.read(s.a), self.read(s.b)))

    def _tensor_scalar(self, s: ns.TensorScalar) -> None:
        x = self.read(s.inp)
        with np.errstate(all="ignore"):
            for step in s.steps:
                operand = self.scalar(step.operand)
                alu = ALU[step.alu]
                x = alu(operand, x) if step.reverse else alu(x, operand)
        self.write(s.out, x)

    def _activate(self, s: ns.Activate) -> None:
        with np.errstate(all="ignore"):
            y = ACTIVATIONS[s.func](self.read(s.inp) * self.scalar(s.scale) + self.scalar(s.bias))
        y = np.asarray(y, np.float32)
        if s.accumulate is not None:
            self.write(s.accumulate, y.sum(axis=1, keepdims=True))
        self.write(s.out, y)

    def _copy(self, s: ns.Copy) -> None:
        self.write(s.out, self.read(s.inp))

    def _reduce(self, s: ns.Reduce) -> None:
        x = self.read(s.inp)
        y = x.sum(axis=1, keepdims=True) if s.alu == "add" else x.max(axis=1, keepdims=True)
        self.write(s.out, -y if s.negate else y)

    def _reciprocal(self, s: ns.Reciprocal) -> None:
        with np.errstate(all="ignore"):
            self.write(s.out, 1.0 / self.read(s.inp))

    def _select(self, s: ns.Select) -> None:
        self.write(s.out, np.where(self.read(s.pred) != 0, self.read(s.a), self.read(s.b)))

    def _memset(self, s: ns.Memset) -> None:
        self.write(s.out, np.float32(s.value))

    def _iota(self, s: ns.Iota) -> None:
        out, shape, dim = s.out, s.shape, s.dim
        if not shape:
            self.write(out, np.float32(0))
            return
        if dim == len(shape) - 1:
            row = np.arange(s.first_col, s.first_col + out.cols, dtype=np.float32)
            self.write(out, np.broadcast_to(row, (out.rows, out.cols)))
            return
        rows = np.arange(s.first_row, s.first_row + out.rows)
        coords = np.unravel_index(rows, shape[:-1])[dim].astype(np.float32)
        self.write(out, np.broadcast_to(coords[:, None], (out.rows, out.cols)))

    def _random(self, s: ns.Random) -> None:
        state = self.read(s.state)
        if s.algorithm == "threefry2x32":  # JAX's generator: the state is the key's 16-bit halves
            rows = np.arange(s.first_row, s.first_row + s.out.rows, dtype=np.int64)
            indices = rows[:, None] * s.cols + np.arange(s.out.cols, dtype=np.int64)[None, :]
            self.write(s.out, threefry.uniform(indices, state[0], s.key or threefry.DEFAULT_KEY))
            return
        seed, offset = philox.state_words(state[0, :2])
        rows = np.arange(s.first_row, s.first_row + s.out.rows, dtype=np.int64)
        indices = rows[:, None] * s.cols + np.arange(s.out.cols, dtype=np.int64)[None, :]
        if s.block is not None:  # a rank's block: its elements' places in the whole tensor
            indices = philox.block_indices(indices, s.block, int(state[0, 2]))
        self.write(s.out, philox.uniform(indices, seed, offset, s.stream))

    def _identity(self, s: ns.Identity) -> None:
        self.write(s.out, np.eye(s.out.rows, s.out.cols, dtype=np.float32))

    def _load_weights(self, s: ns.LoadWeights) -> None:
        weights = self.read(s.stationary)
        if s.stationary2 is not None:  # FP8 double-row: K rows 128..255 below the first 128
            weights = np.concatenate([weights, self.read(s.stationary2)])
        self.weights = weights.copy()

    def _matmul(self, s: ns.MatMul) -> None:
        assert self.weights is not None
        moving = self.read(s.moving)
        if s.moving2 is not None:
            moving = np.concatenate([moving, self.read(s.moving2)])
        product = self.weights.T @ moving
        if s.accumulate:
            product = self.read(s.psum) + product
        self.write(s.psum, product)

    def _gather(self, s: ns.Gather) -> None:
        table = s.table
        rows = self.hbm3d(table)[0]
        indices = self.read(s.idx)[:, 0].astype(np.int64)
        bad = (indices < 0) | (indices >= rows.shape[0])
        if bad.any():
            raise ExecutionError(
                f"gather index {int(indices[bad][0])} outside table of {rows.shape[0]} rows "
                f"({table.tensor})")
        self.write(s.out, rows[indices, table.c0:table.c1])

    def _collective(self, s: ns.Collective) -> None:
        src, dst = s.src, s.dst
        op = self.program.graph.ops[s.op_index]
        if self.exchange is None:
            raise ExecutionError(f"{op.describe()} needs the other ranks of its tensor-parallel group; "
                                 f"run the program through neuroncore.parallel")
        value = self.tensor(src.tensor).reshape(op.operands[0].shape)
        result = self.exchange(op, value)
        target = self.program.hbm_tensors[dst.tensor]
        self.hbm[dst.tensor] = round_to(np.asarray(result, np.float32), target.dtype).reshape(target.shape)


def _nothing(_: ns.Nop) -> None:
    """A node that computes nothing (a DMA trigger, an FP32 matmul's second pass)."""


def prepare_hbm(program: Program, inputs: list[np.ndarray],
                weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """HBM contents at the start of an execution: inputs, weights, zeroed outputs and scratch."""
    hbm: dict[str, np.ndarray] = dict(weights)
    for name, value in zip(program.input_tensors, inputs):
        tensor = program.hbm_tensors[name]
        hbm[name] = round_to(np.asarray(value, np.float32), tensor.dtype).reshape(tensor.shape).copy()
    for name, tensor in program.hbm_tensors.items():
        if name not in hbm:
            hbm[name] = np.zeros(tensor.shape, np.float32)
    return hbm


def materialize_weights(program: Program, rank: int = 0) -> dict[str, np.ndarray]:
    """Weights in their HBM layout (pre-transposed where the compiler chose so); ``rank`` picks a
    tensor-parallel rank's shard of sharded weights."""
    weights: dict[str, np.ndarray] = {}
    for name, tensor in program.hbm_tensors.items():
        if tensor.kind is not HbmTensorKind.WEIGHT:
            continue
        op = program.graph.ops[tensor.op_index]
        source = op.operands[0] if op.opcode == "convert" else op  # folded convert of a weight
        values = round_to(source.attrs["init"].materialize(source.shape, rank), op.dtype)
        if tensor.pretransposed:
            values = np.ascontiguousarray(np.swapaxes(values, -1, -2))
        weights[name] = values
    return weights


def weights_bytes(program: Program) -> int:
    return sum(math.prod(t.shape) * t.dtype.itemsize for t in program.hbm_tensors.values()
               if t.kind is HbmTensorKind.WEIGHT)


__all__ = ["DType", "ExecutionError", "Machine", "materialize_weights", "prepare_hbm"]
