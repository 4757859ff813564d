"""Elementwise ops: ACTIVATE on the Scalar engine, TENSOR_TENSOR / TENSOR_SCALAR / TENSOR_COPY on Vector.

Broadcast operands are not materialised when the hardware can take them for free: a scalar constant
becomes an immediate and a per-row value (``[..., R]`` broadcast along the last dim) becomes a
per-partition scalar operand of TENSOR_SCALAR. A one-element value computed at run time (an
optimizer's per-step scalars, broadcast to each parameter) read by a binary op is loaded once per op
onto every partition (one DMA of ``rows`` one-element descriptors) and is TENSOR_SCALAR's
per-partition operand too. Anything else is a full tile.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from neuroncore.compiler import costs
from neuroncore.compiler.context import Context, Value
from neuroncore.compiler.counters import NodeCounters, shared_counters
from neuroncore.compiler.emitter import sbuf_key
from neuroncore.compiler.lowering_state import Layout, OperandForm, QueueName
from neuroncore.compiler.node_semantics import (
    Activate,
    Copy,
    Iota,
    Memset,
    Reciprocal,
    Reduce,
    ScalarStep,
    Select,
    TensorScalar,
    TensorTensor,
)
from neuroncore.compiler.program import HbmAccess, HbmView, Ref
from neuroncore.compiler.view_steps import BroadcastRows
from neuroncore.dtypes import DType, round_to
from neuroncore.enums import Memory
from neuroncore.hardware import Engine
from neuroncore.ir.graph import Op

ELEMENTWISE_CHUNK_BYTES = 16 * 1024  # per partition; wider rows are processed in slices

# IR op -> (ACT function name as the profiler shows it in scalar_activation_fn)
ACTIVATION_FUNCTIONS = {
    "exponential": "Exp",
    "tanh": "Tanh",
    "logistic": "Sigmoid",
    "rsqrt": "Rsqrt",
    "sqrt": "Sqrt",
    "log": "Ln",
    "negate": "Copy",  # Copy(x * -1): scale is free on ACT
    "abs": "Abs",
    "cosine": "Cos",
    "sine": "Sin",
    "erf": "Erf",
    "silu": "Silu",
    "gelu_dx": "Gelu_dx",  # nki.language.gelu_dx / silu_dx: Scalar-engine functions on Trn1
    "silu_dx": "Silu_dx",
    "gelu": "Gelu_apprx_tanh",
    "gelu_exact": "Gelu",
    "square": "Square",
    "copy": "Copy",
    "relu": "Relu",  # a convolution's fused epilogue (lower_conv)
}

# IR binary op -> hardware ALU op name (KLR / ISA spelling)
ALU_OPS = {
    "add": "add",
    "subtract": "subtract",
    "multiply": "mult",
    "divide": "divide",
    "maximum": "max",
    "minimum": "min",
    "EQ": "is_equal",
    "NE": "not_equal",
    "LT": "is_lt",
    "LE": "is_le",
    "GT": "is_gt",
    "GE": "is_ge",
}
COMMUTATIVE = {"add", "mult", "max", "min", "is_equal", "not_equal"}
SWAPPED = {"is_lt": "is_gt", "is_gt": "is_lt", "is_le": "is_ge", "is_ge": "is_le"}


@dataclass(frozen=True)
class Operand:
    """How an elementwise operand reaches the instruction: immediate, per-partition or tile."""

    kind: OperandForm
    op: Op | None = None
    value: float = 0.0
    column: Ref | None = None  # REPLICATED: the loaded [rows, 1] column
    first_column: bool = False  # PER_PARTITION read as the first column of ``op``'s own tiles


def classify(ctx: Context, x: Op, out_shape: tuple[int, ...], *, replicated: bool = False,
             row_constant: bool = False) -> Operand:
    """Recognise operands that need no materialised tile; ``replicated``: the caller takes a
    REPLICATED operand (a one-element value broadcast to ``out_shape``); ``row_constant``: the
    caller takes a broadcast that is constant along each row as a PER_PARTITION column (see
    :func:`_row_constant`)."""
    value = ctx.values.get(x.index)
    if value is not None and value.immediate is not None:
        return Operand(OperandForm.IMMEDIATE, value=value.immediate)
    if x.opcode == "broadcast":
        src = x.operands[0]
        src_value = ctx.values[src.index]
        if src_value.immediate is not None or (src.size == 1 and src.opcode == "constant"
                                               and "value" in src.attrs):
            immediate = float(src_value.immediate if src_value.immediate is not None
                              else round_to(np.asarray(src.attrs["value"], np.float32), src.dtype))
            return Operand(OperandForm.IMMEDIATE, value=immediate)
        rows_shape = out_shape[:-1]
        dims = x.attrs["dims"]
        if len(out_shape) >= 1 and src.shape == rows_shape and tuple(dims) == tuple(range(len(rows_shape))):
            return Operand(OperandForm.PER_PARTITION, src)
        if src.shape == (*rows_shape, 1) and tuple(dims) == tuple(range(len(out_shape))):
            return Operand(OperandForm.PER_PARTITION, src)
        if replicated and src.size == 1:
            return Operand(OperandForm.REPLICATED, src)
        if row_constant and _row_constant(x, out_shape):
            return Operand(OperandForm.PER_PARTITION, x, first_column=True)
    return Operand(OperandForm.TILE, x)


def _row_constant(x: Op, out_shape: tuple[int, ...]) -> bool:
    """Whether broadcast ``x`` holds one value per row of ``out_shape``: its last dim is broadcast
    (a per-expert or per-head value ``[E, 1, 1] -> [E, R, C]``: select_backward's ``iota == e``
    mask, ALiBi's slopes). Such an operand is read as the first column of each of its tiles
    (``rows`` one-element descriptors, 8 per DMA engine for a 128-row tile) and is TENSOR_SCALAR's
    per-partition operand, or widened on chip by a TENSOR_COPY with a zero free stride (a select's
    predicate). Read whole, its broadcast view has no contiguous run longer than one element:
    every element of the tile was a descriptor of its own (a 128 x 128 tile 1,024 per DMA engine,
    30.8 us of DMA at ~30 ns each, neuroncore.md §5.3), 500 us for a [4, 512, 128] select."""
    if len(out_shape) < 2 or out_shape[-1] == 1 or tuple(x.shape) != tuple(out_shape):
        return False
    src, dims = x.operands[0], list(x.attrs["dims"])
    last = len(out_shape) - 1
    return last not in dims or src.shape[dims.index(last)] == 1


def replicate(ctx: Context, op: Op, operand: Operand, rows: int) -> Operand:
    """Load a REPLICATED operand's one element onto ``rows`` partitions: one DMA reading it with a
    zero partition stride (``rows`` descriptors of one element), as the op's lowering starts. A
    read of the broadcast view per tile instead moves every element of the tile as its own
    descriptor (a 128 x 64 FP32 tile: 512 descriptors per DMA engine, 15 us at 30 ns each), and
    an optimizer reads its scalars once per parameter tile."""
    assert operand.op is not None
    src = operand.op
    source = ctx.ensure_hbm(src)
    name = ctx.declare_view(HbmView(f"{source}.rep{rows}", (BroadcastRows(rows),), (source,), (rows, 1),
                                    src.dtype, 1), src)
    buf = ctx.alloc(rows, 1, src.dtype, f"{op.name}.{src.name}.rep")
    column = Ref(buf.id, 0, rows, 0, 1)
    ctx.dma_load(QueueName.DATA, HbmAccess(name, 0, 0, rows, 0, 1), column, src.dtype, rows_per_batch=rows)
    return Operand(OperandForm.REPLICATED, src, column=column)


def operand_ref(ctx: Context, operand: Operand, t: int, layout: Layout,
                cols: tuple[int, int] | None = None) -> Ref | float:
    if operand.kind is OperandForm.IMMEDIATE:
        return operand.value
    if operand.kind is OperandForm.REPLICATED:  # the caller takes the rows its tile has
        assert operand.column is not None
        return operand.column
    assert operand.op is not None
    if operand.first_column:
        return ctx.tile(operand.op, t, Layout.ROW, (0, 1))
    if operand.kind is OperandForm.PER_PARTITION:
        src_value = ctx.values[operand.op.index]
        if src_value.layout == Layout.ROW and src_value.cols == 1:
            return ctx.tile(operand.op, t)
        return ctx.tile(operand.op, t, Layout.COL)
    return ctx.tile(operand.op, t, layout, cols)


def release(ctx: Context, operand: Operand, ref: Ref | float) -> None:
    if isinstance(ref, Ref) and operand.op is not None and operand.kind is not OperandForm.REPLICATED:
        ctx.release(operand.op, ref)


def output_layout(ctx: Context, op: Op, operands: list[Operand]) -> Layout:
    for operand in operands:
        if operand.kind is OperandForm.TILE and operand.op is not None:
            return ctx.values[operand.op.index].layout
    return Layout.ROW


# -- instruction helpers (shared with the fused lowerings) ---------------------------------------


def _half(dtype: DType) -> bool:
    """BF16 or FP16 (an identity test: a set of enum members hashes each in Python)."""
    return dtype is DType.BF16 or dtype is DType.FP16


def dtype_of(ctx: Context, ref: Ref) -> DType:
    return ctx.buffers[ref.buf].dtype


def in_psum(ctx: Context, ref: Ref) -> bool:
    return ctx.buffers[ref.buf].memory is Memory.PSUM


def _bytes(ctx: Context, ref: Ref) -> tuple[bool, int]:
    """Whether ``ref`` is in PSUM (else SBUF), and the bytes it covers."""
    buf = ctx.buffers[ref.buf]
    return buf.memory is Memory.PSUM, ref.rows * ref.cols * buf.dtype.itemsize


def _counters(ctx: Context, reads: list[Ref], writes: list[Ref]) -> NodeCounters:
    """SBUF/PSUM bytes an instruction reads and writes, summed per memory."""
    sbuf_read = psum_read = sbuf_write = psum_write = 0
    for ref in reads:
        psum, n = _bytes(ctx, ref)
        if psum:
            psum_read += n
        else:
            sbuf_read += n
    for ref in writes:
        psum, n = _bytes(ctx, ref)
        if psum:
            psum_write += n
        else:
            sbuf_write += n
    return shared_counters(0, 0, 0, 0, 0, sbuf_read, sbuf_write, psum_read, psum_write)


def activate(ctx: Context, func: str, out: Ref, inp: Ref, *, scale: float | Ref = 1.0,
             bias: float | Ref = 0.0, accumulate: Ref | None = None) -> int:
    """ACTIVATE: out = func(in * scale + bias), optionally summing out along the free dim."""
    spec = ctx.spec
    cycles = costs.activation_cycles(spec, inp.cols, accumulate=accumulate is not None)
    reads = [inp] + [r for r in (scale, bias) if isinstance(r, Ref)]
    writes = [out] + ([accumulate] if accumulate is not None else [])
    fn_name = ACTIVATION_FUNCTIONS[func]
    # the text in pieces, joined when read (operand_texts.Text)
    text = (f"func={fn_name} src=", inp, " dst=", out, *_operand_pieces("scale", scale),
            *_operand_pieces("bias", bias), *((" acc=", accumulate) if accumulate is not None else ()))
    return ctx.em.instruction(
        Engine.SCALAR, "ACTIVATE", costs.cycles_to_ns(spec, Engine.SCALAR, cycles),
        reads=[sbuf_key(r) for r in reads], writes=[sbuf_key(r) for r in writes], text=text,
        semantics=Activate(func, out, inp, scale, bias, accumulate), activation_fn=fn_name,
        counters=_counters(ctx, reads, writes),
    )


def tensor_tensor(ctx: Context, alu: str, out: Ref, a: Ref, b: Ref) -> int:
    spec = ctx.spec
    psum_inputs = int(in_psum(ctx, a)) + int(in_psum(ctx, b))
    dts = {dtype_of(ctx, a), dtype_of(ctx, b), dtype_of(ctx, out)}
    all_bf16 = dts == {DType.BF16} and alu in ("add", "subtract", "mult")
    cycles: float = costs.vector_cycles(spec, "tensor_tensor", a.cols, inputs_in_psum=psum_inputs,
                                 all_bf16=all_bf16)
    mode = costs.vector_perf_mode(spec, "tensor_tensor", dts <= {DType.BF16, DType.FP16},
                                  psum_inputs == 0 and not in_psum(ctx, out))
    cycles /= costs.perf_mode_divisor(mode)
    return ctx.em.instruction(
        Engine.VECTOR, "TENSOR_TENSOR", costs.cycles_to_ns(spec, Engine.VECTOR, cycles),
        reads=[sbuf_key(a), sbuf_key(b)], writes=[sbuf_key(out)],
        text=(f"op={alu} src0=", a, " src1=", b, " dst=", out),  # joined when read (operand_texts.Text)
        semantics=TensorTensor(alu, out, a, b), performance_mode=mode,
        counters=_counters(ctx, [a, b], [out]),
    )


def tensor_scalar(ctx: Context, out: Ref, inp: Ref,
                  ops: list[tuple[str, float | Ref, bool]], engine: Engine = Engine.VECTOR) -> int:
    """out = (inp op0 s0) op1 s1 ...; each op may take the scalar first (``reverse``)."""
    spec = ctx.spec
    cycles: float = costs.vector_cycles(spec, "tensor_scalar", inp.cols)
    dts = {dtype_of(ctx, inp), dtype_of(ctx, out)}
    mode = costs.vector_perf_mode(spec, "tensor_scalar", dts <= {DType.BF16, DType.FP16},
                                  not in_psum(ctx, inp) and not in_psum(ctx, out))
    cycles /= costs.perf_mode_divisor(mode)
    scalar_refs = [s for _, s, _ in ops if isinstance(s, Ref)]
    text = " ".join(
        f"op{i}={alu}{'(rev)' if rev else ''}{_operand_text(ctx, f'operand{i}', s)}"
        for i, (alu, s, rev) in enumerate(ops)
    )
    return ctx.em.instruction(
        engine, "TENSOR_SCALAR", costs.cycles_to_ns(spec, engine, cycles),
        reads=[sbuf_key(r) for r in [inp, *scalar_refs]], writes=[sbuf_key(out)],
        text=f"{text} src={ctx.ref_text(inp)} dst={ctx.ref_text(out)}",
        semantics=TensorScalar(out, inp, tuple(ScalarStep(*step) for step in ops)), performance_mode=mode,
        counters=_counters(ctx, [inp, *scalar_refs], [out]),
    )


def tensor_copy(ctx: Context, out: Ref, inp: Ref, engine: Engine = Engine.VECTOR) -> int:
    """Copy with cast (PSUM evacuation, dtype conversion, broadcast of a [rows, 1] column)."""
    spec = ctx.spec
    if engine is Engine.SCALAR:
        return activate(ctx, "copy", out, inp)
    cycles: float = costs.vector_cycles(spec, "tensor_copy", out.cols)
    source, target = ctx.buffers[inp.buf], ctx.buffers[out.buf]
    mode = costs.vector_perf_mode(spec, "tensor_copy", _half(source.dtype) and _half(target.dtype),
                                  source.memory is not Memory.PSUM and target.memory is not Memory.PSUM)
    cycles /= costs.perf_mode_divisor(mode)
    return ctx.em.instruction(
        Engine.VECTOR, "TENSOR_COPY", costs.cycles_to_ns(spec, Engine.VECTOR, cycles),
        reads=[sbuf_key(inp)], writes=[sbuf_key(out)],
        text=("src=", inp, " dst=", out),  # joined when read (operand_texts.Text)
        semantics=Copy(out, inp), performance_mode=mode,
        counters=_counters(ctx, [inp], [out]),
    )


def partition_broadcast(ctx: Context, out: Ref, inp: Ref) -> int:
    """Scalar-engine PARTITION_BROADCAST: the one-partition row ``inp`` copied to every partition
    of ``out`` (``inp`` may be partition 0 of ``out``).

    How a 1-D weight (a bias, a LayerNorm scale or shift) reaches every row: DMA the row once (d
    elements) and replicate it on chip, as neuronx-cc does, instead of a DMA that moves it 128 times.
    Cost: the ACT formula max(MIN_II, N), N the row's elements [assumption: a copy's cost; the
    docs/execution-core.md calibration table]. On ACT because BERT's token-major layers leave it the
    spare time (DVE runs the norms and evacuations; GpSimd shares DVE's SBUF port on NC-v2)."""
    if inp.rows != 1 or inp.cols != out.cols:
        raise ValueError(f"partition broadcast reads one row of {out.cols}, not {inp.rows}x{inp.cols}")
    spec = ctx.spec
    cycles = costs.activation_cycles(spec, out.cols)
    return ctx.em.instruction(
        Engine.SCALAR, "PARTITION_BROADCAST", costs.cycles_to_ns(spec, Engine.SCALAR, cycles),
        reads=[sbuf_key(inp)], writes=[sbuf_key(out)],
        text=f"src={ctx.ref_text(inp)} dst={ctx.ref_text(out)}",
        semantics=Copy(out, inp), counters=_counters(ctx, [inp], [out]),
    )


def tensor_reduce(ctx: Context, alu: str, out: Ref, inp: Ref, *, negate: bool = False) -> int:
    """TENSOR_REDUCE along the free dim; ``negate`` writes ``-result`` in the same instruction
    (``nki.isa.tensor_reduce(op, data, axis, negate=True)``, what a softmax's ``-max`` bias needs)."""
    spec = ctx.spec
    all_bf16 = dtype_of(ctx, inp) is DType.BF16 and dtype_of(ctx, out) is DType.BF16
    cycles = costs.vector_cycles(spec, "tensor_reduce", inp.cols, all_bf16=all_bf16)
    return ctx.em.instruction(
        Engine.VECTOR, "TENSOR_REDUCE", costs.cycles_to_ns(spec, Engine.VECTOR, cycles),
        reads=[sbuf_key(inp)], writes=[sbuf_key(out)],
        text=f"op={alu} axis=X{' negate' if negate else ''} src={ctx.ref_text(inp)} dst={ctx.ref_text(out)}",
        semantics=Reduce(alu, out, inp, negate), counters=_counters(ctx, [inp], [out]),
    )


def reciprocal(ctx: Context, out: Ref, inp: Ref) -> int:
    spec = ctx.spec
    cycles = costs.vector_cycles(spec, "reciprocal", inp.cols)
    return ctx.em.instruction(
        Engine.VECTOR, "RECIPROCAL", costs.cycles_to_ns(spec, Engine.VECTOR, cycles),
        reads=[sbuf_key(inp)], writes=[sbuf_key(out)],
        text=f"src={ctx.ref_text(inp)} dst={ctx.ref_text(out)}",
        semantics=Reciprocal(out, inp), counters=_counters(ctx, [inp], [out]),
    )


def memset(ctx: Context, out: Ref, value: float) -> int:
    spec = ctx.spec
    cycles = costs.vector_cycles(spec, "memset", out.cols)
    return ctx.em.instruction(
        Engine.VECTOR, "MEMSET", costs.cycles_to_ns(spec, Engine.VECTOR, cycles),
        reads=[], writes=[sbuf_key(out)], text=f"value={value:g} dst={ctx.ref_text(out)}",
        semantics=Memset(out, float(value)), counters=_counters(ctx, [], [out]),
    )


def select(ctx: Context, out: Ref, pred: Ref, a: Ref, b: Ref) -> int:
    spec = ctx.spec
    cycles: float = costs.vector_cycles(spec, "tensor_tensor", out.cols)  # copy_predicated, both in SBUF
    return ctx.em.instruction(
        Engine.VECTOR, "TENSOR_COPY_PREDICATED", costs.cycles_to_ns(spec, Engine.VECTOR, cycles),
        reads=[sbuf_key(pred), sbuf_key(a), sbuf_key(b)], writes=[sbuf_key(out)],
        text=(f"pred={ctx.ref_text(pred)} src={ctx.ref_text(a)} else={ctx.ref_text(b)} "
              f"dst={ctx.ref_text(out)}"),
        semantics=Select(out, pred, a, b),
        counters=_counters(ctx, [pred, a, b], [out]),
    )


def _operand_pieces(label: str, operand: float | Ref) -> tuple[str] | tuple[str, Ref]:
    """``_operand_text`` in pieces (the ref's text joined when read: ``operand_texts.Text``)."""
    if isinstance(operand, Ref):
        return f" {label}=", operand
    return (f" {label}={operand:g}",)


def _operand_text(ctx: Context, label: str, operand: float | Ref | None) -> str:
    if operand is None:
        return ""
    if isinstance(operand, Ref):
        return f" {label.strip()}={ctx.ref_text(operand)}"
    return f" {label.strip()}={operand:g}"


# -- op lowerings ---------------------------------------------------------------------------------


def column_chunks(ctx: Context, value: Value) -> list[tuple[int, int]]:
    """Free-dim chunks for elementwise work: wide rows are processed a slice at a time, so that a
    value that lives in HBM never needs its whole row on chip."""
    chunk_bytes = min(ELEMENTWISE_CHUNK_BYTES, ctx.spec.sbuf_bytes_per_partition // 8)
    width = max(1, chunk_bytes // value.op.dtype.itemsize)
    if value.cols * value.op.dtype.itemsize <= chunk_bytes:
        return [(0, value.cols)]
    return [(c, min(value.cols, c + width)) for c in range(0, value.cols, width)]


def batch_ends(value: Value, t: int) -> bool:
    """Whether tile ``t`` is the last of its batch. Stepped lowerings yield this after each tile (a
    fusion group advances its ops one tile or one batch at a time, ``compiler.streaming``)."""
    return t + 1 == len(value.tiles) or value.tiles[t + 1].batch != value.tiles[t].batch


def drain(steps: Iterator[bool]) -> None:
    for _ in steps:
        pass


def lower_unary(ctx: Context, op: Op) -> None:
    drain(unary_steps(ctx, op))


def unary_steps(ctx: Context, op: Op) -> Iterator[bool]:
    src = classify(ctx, op.operands[0], op.shape)
    layout = output_layout(ctx, op, [src])
    value = ctx.define(op, layout=layout)
    func = op.opcode
    if func == "gelu" and op.attrs.get("approximate", "tanh") != "tanh":
        func = "gelu_exact"
    for t in range(len(value.tiles)):
        for c0, c1 in column_chunks(ctx, value):
            inp = operand_ref(ctx, src, t, layout, (c0, c1))
            out = ctx.produce(op, t, c0, c1)
            if isinstance(inp, float):
                inp = ctx.tile(op.operands[0], t, layout, (c0, c1))
            if op.opcode == "negate":
                activate(ctx, "negate", out, inp, scale=-1.0)
            elif op.opcode == "convert":
                tensor_copy(ctx, out, inp)
            else:
                activate(ctx, func, out, inp)
            release(ctx, src, inp)
            ctx.produced(op, t, out, c0, c1)
            ctx.unpin_all()
        yield batch_ends(value, t)


def lower_binary(ctx: Context, op: Op) -> None:
    drain(binary_steps(ctx, op))


def binary_steps(ctx: Context, op: Op) -> Iterator[bool]:
    a, b = (classify(ctx, x, op.shape, replicated=True, row_constant=True) for x in op.operands)
    alu = ALU_OPS[op.attrs["direction"] if op.opcode == "compare" else op.opcode]
    layout = output_layout(ctx, op, [a, b])
    if layout != Layout.ROW and op.shape and op.shape[-1] != 1:
        # COL tiles hold the flattened elements as partitions: a per-row operand is not per-partition
        a, b = (Operand(OperandForm.TILE, x) if o.kind is OperandForm.PER_PARTITION else o
                for o, x in zip((a, b), op.operands))
    value = ctx.define(op, layout=layout)
    kinds = {a.kind, b.kind}
    if OperandForm.IMMEDIATE in kinds and kinds & {OperandForm.PER_PARTITION, OperandForm.REPLICATED}:
        yield from _column_with_immediate(ctx, op, value, alu, a, b)
        return
    if a.kind is not OperandForm.TILE and b.kind is not OperandForm.TILE:
        a = Operand(OperandForm.TILE, op.operands[0])
    rows = max(tile.rows for tile in value.tiles)
    a, b = (replicate(ctx, op, o, rows) if o.kind is OperandForm.REPLICATED else o for o in (a, b))
    columns = {o.column.buf for o in (a, b) if o.column is not None}
    for t in range(len(value.tiles)):
        for c0, c1 in column_chunks(ctx, value):
            ctx.pinned.update(columns)
            ra = operand_ref(ctx, a, t, layout, (c0, c1))
            rb = operand_ref(ctx, b, t, layout, (c0, c1))
            out = ctx.produce(op, t, c0, c1)
            if a.kind is OperandForm.REPLICATED and isinstance(ra, Ref):
                ra = Ref(ra.buf, 0, out.rows, 0, 1)
            if b.kind is OperandForm.REPLICATED and isinstance(rb, Ref):
                rb = Ref(rb.buf, 0, out.rows, 0, 1)
            if a.kind is OperandForm.TILE and b.kind is OperandForm.TILE:
                assert isinstance(ra, Ref) and isinstance(rb, Ref)
                tensor_tensor(ctx, alu, out, ra, rb)
            elif a.kind is OperandForm.TILE:
                assert isinstance(ra, Ref)
                tensor_scalar(ctx, out, ra, [(alu, rb, False)])
            else:
                assert isinstance(rb, Ref)
                if alu in COMMUTATIVE:
                    tensor_scalar(ctx, out, rb, [(alu, ra, False)])
                elif alu in SWAPPED:
                    tensor_scalar(ctx, out, rb, [(SWAPPED[alu], ra, False)])
                else:
                    tensor_scalar(ctx, out, rb, [(alu, ra, True)])
            release(ctx, a, ra)
            release(ctx, b, rb)
            ctx.produced(op, t, out, c0, c1)
            ctx.unpin_all()
        yield batch_ends(value, t)
    for buf in columns:
        ctx.free(ctx.buffers[buf])


def _column_with_immediate(ctx: Context, op: Op, value: Value, alu: str, a: Operand,
                           b: Operand) -> Iterator[bool]:
    """A per-row (or one-element) value and a constant, both broadcast to the op's shape (RMSNorm's
    backward divides a per-token statistic by the width): the op is computed once per row on the
    [rows, 1] column (TENSOR_SCALAR) and widened on chip by a TENSOR_COPY reading the result with
    a zero free stride, as the engines' access patterns allow; reading the broadcast view instead
    moved every element as its own descriptor. Each element is the same FP32 result rounded once
    to the op's type, as the full-tile op computes it."""
    column_first = a.kind is not OperandForm.IMMEDIATE
    col_operand, imm = (a, b.value) if column_first else (b, a.value)
    rows = max(tile.rows for tile in value.tiles)
    if col_operand.kind is OperandForm.REPLICATED:
        col_operand = replicate(ctx, op, col_operand, rows)
    if column_first or alu in COMMUTATIVE:
        step = (alu, imm, False)
    elif alu in SWAPPED:
        step = (SWAPPED[alu], imm, False)
    else:
        step = (alu, imm, True)
    for t in range(len(value.tiles)):
        for c0, c1 in column_chunks(ctx, value):
            if col_operand.column is not None:
                ctx.pinned.add(col_operand.column.buf)
            column = operand_ref(ctx, col_operand, t, Layout.ROW)
            assert isinstance(column, Ref)
            out = ctx.produce(op, t, c0, c1)
            if col_operand.kind is OperandForm.REPLICATED:
                column = Ref(column.buf, 0, out.rows, 0, 1)
            buf = ctx.alloc(out.p1, 1, op.dtype, f"{op.name}.col{t}")
            result = Ref(buf.id, out.p0, out.p1, 0, 1)
            tensor_scalar(ctx, result, column, [step])
            tensor_copy(ctx, out, result)
            ctx.free(buf)
            release(ctx, col_operand, column)
            ctx.produced(op, t, out, c0, c1)
            ctx.unpin_all()
        yield batch_ends(value, t)
    if col_operand.column is not None:
        ctx.free(ctx.buffers[col_operand.column.buf])


def lower_select(ctx: Context, op: Op) -> None:
    drain(select_steps(ctx, op))


def select_steps(ctx: Context, op: Op) -> Iterator[bool]:
    """TENSOR_COPY_PREDICATED, one tile at a time (a fusion group steps it with the softmax it
    guards: torch's ``_safe_softmax``). An operand that is a per-row value broadcast along the last dim (an
    attention mask ``[.., R, 1] -> [.., R, C]``) is loaded as its column and widened on chip by a
    TENSOR_COPY reading it with a zero free stride, as the engines' access patterns allow; a DMA of
    the broadcast view would move it one element per descriptor."""
    forms = [classify(ctx, x, op.shape, row_constant=True) for x in op.operands]
    operands = [f if f.kind is not OperandForm.TILE else Operand(OperandForm.TILE, x)
                for f, x in zip(forms, op.operands)]
    if forms[0].kind is OperandForm.IMMEDIATE:  # a constant predicate: read it as a tile
        operands[0] = Operand(OperandForm.TILE, op.operands[0])
    layout = output_layout(ctx, op, operands)
    if layout != Layout.ROW:  # a per-row operand is per-partition only when rows are partitions
        operands = [Operand(OperandForm.TILE, x) if o.kind is OperandForm.PER_PARTITION else o
                    for o, x in zip(operands, op.operands)]
    value = ctx.define(op, layout=layout)
    for t, tile in enumerate(value.tiles):
        for c0, c1 in column_chunks(ctx, value):
            refs: list[Ref] = []
            widened: list[Ref] = []
            for operand, x in zip(operands, op.operands):
                if operand.kind is OperandForm.IMMEDIATE:  # a splat: MEMSET, never a DMA
                    buf = ctx.alloc(tile.rows, c1 - c0, x.dtype, f"{x.name}.splat{t}")
                    wide = Ref(buf.id, 0, tile.rows, 0, c1 - c0)
                    memset(ctx, wide, operand.value)
                    widened.append(wide)
                    refs.append(wide)
                elif operand.kind is OperandForm.PER_PARTITION:
                    column = operand_ref(ctx, operand, t, layout)
                    assert isinstance(column, Ref)
                    buf = ctx.alloc(column.p1, c1 - c0, x.dtype, f"{x.name}.wide{t}")
                    wide = Ref(buf.id, column.p0, column.p1, 0, c1 - c0)
                    tensor_copy(ctx, wide, column)
                    release(ctx, operand, column)
                    widened.append(wide)
                    refs.append(wide)
                else:
                    refs.append(ctx.tile(x, t, layout, (c0, c1)))
            out = ctx.produce(op, t, c0, c1)
            select(ctx, out, refs[0], refs[1], refs[2])
            for operand, x, r in zip(operands, op.operands, refs):
                if operand.kind is OperandForm.TILE:
                    ctx.release(x, r)
            for wide in widened:
                ctx.free(ctx.buffers[wide.buf])
            ctx.produced(op, t, out, c0, c1)
            ctx.unpin_all()
        yield batch_ends(value, t)


def lower_constant_splat(ctx: Context, op: Op) -> Value:
    """Scalar/splat constants are immediates; tiles are made (MEMSET) only if someone needs them."""
    value = ctx.define(op, home=Memory.SBUF)
    # the constant holds its value in its own dtype (a bf16 0.1 is 0.10009765625), as the reference does
    value.immediate = float(round_to(np.asarray(op.attrs["value"], np.float32), op.dtype))
    return value


def lower_iota(ctx: Context, op: Op) -> None:
    """IOTA on GpSimd: each element gets its coordinate along ``dimension``.

    The instruction is told the tile's first logical row; the coordinate of a row (which may belong
    to another batch when small batches share a tile) follows from the shape.
    """
    value = ctx.define(op)
    dim = op.attrs["dimension"] % max(len(op.shape), 1)
    spec = ctx.spec
    chunks: list[tuple[int, int | None]] = [(0, None)]
    if value.home is Memory.HBM and value.cols * op.dtype.itemsize > spec.sbuf_bytes_per_partition // 2:
        chunks = list(column_chunks(ctx, value))  # a row wider than SBUF: made a column chunk at a time
    for t, tile in enumerate(value.tiles):
        first_row = tile.batch * value.rows_per_batch + tile.r0
        for c0, c1 in chunks:
            out = ctx.produce(op, t, c0, c1)
            where = f" first_col={c0}" if c0 else ""
            ctx.em.instruction(
                Engine.GPSIMD, "IOTA",
                costs.cycles_to_ns(spec, Engine.GPSIMD, costs.gpsimd_cycles(spec, out.cols)),
                reads=[], writes=[sbuf_key(out)],
                text=f"dim={dim} first_row={first_row}{where} dst={ctx.ref_text(out)}",
                semantics=Iota(out, tuple(op.shape), dim, first_row, c0),
                counters=NodeCounters(sbuf_write_bytes=out.rows * out.cols * op.dtype.itemsize),
            )
            ctx.produced(op, t, out, c0, c1)
            ctx.unpin_all()
