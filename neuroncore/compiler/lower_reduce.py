"""Reductions and the fusions built on them: reduce (sum/max), softmax, layer norm, RMS norm.

A reduction runs along the free dim (TENSOR_REDUCE on Vector) and leaves one value per partition,
so its result is a ``col``-layout value that the next op can use as a per-partition scalar. Reducing
other dims first moves them last through an HBM view (a strided DMA), as the device would have to.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from neuroncore.compiler.context import Context
from neuroncore.compiler.errors import CompileError
from neuroncore.compiler.lower_elementwise import (
    activate,
    batch_ends,
    drain,
    partition_broadcast,
    reciprocal,
    tensor_reduce,
    tensor_scalar,
    tensor_tensor,
)
from neuroncore.compiler.lowering_state import Layout, QueueName
from neuroncore.compiler.program import HbmAccess, HbmView, Ref
from neuroncore.compiler.tiling import tile_grid, tiles_of
from neuroncore.compiler.view_steps import BroadcastRows, Reshape, Transpose
from neuroncore.dtypes import DType
from neuroncore.enums import Memory
from neuroncore.ir.graph import Op

SUM, MAX = "add", "max"


def _free_limit_check(ctx: Context, op: Op, cols: int) -> None:
    if cols > ctx.spec.vector_sbuf_free_limit:
        raise CompileError(
            f"cannot place {op.opcode}: reduces {cols} elements per partition, the engines take at "
            f"most {ctx.spec.vector_sbuf_free_limit}", op)


def lower_reduce(ctx: Context, op: Op) -> None:
    drain(reduce_steps(ctx, op))


def reduce_steps(ctx: Context, op: Op) -> Iterator[bool]:
    src = op.operands[0]
    dims = tuple(op.attrs["dimensions"])
    alu = SUM if op.attrs["kind"] == "sum" else MAX
    n = len(src.shape)
    kept = tuple(i for i in range(n) if i not in dims)
    reduced = math.prod(src.shape[d] for d in dims) if dims else 1
    value = ctx.define(op, layout=Layout.COL)
    if not dims:
        raise CompileError("reduce over no dimensions", op)
    load: Callable[[int, tuple[int, int] | None], Ref]
    done: Callable[[Ref], None]
    if dims == (n - 1,):  # a free-dim reduction: row tiles whatever the layout
        source = ctx.values.get(src.index)
        from_hbm = source is not None and source.home is Memory.HBM and source.layout is Layout.ROW

        def load(t: int, cols: tuple[int, int] | None) -> Ref:
            return ctx.tile(src, t, Layout.ROW, cols)

        def done(inp: Ref) -> None:
            ctx.release(src, inp)
    else:
        # move the reduced dims last through an HBM view, then reduce along the free dim
        perm = (*kept, *dims)
        view_shape = (*[src.shape[i] for i in kept], reduced)
        view_tiles = tiles_of(view_shape, Layout.ROW)
        rows = tile_grid(view_shape, Layout.ROW)[1]
        from_hbm = True

        def load(t: int, cols: tuple[int, int] | None) -> Ref:
            source = ctx.ensure_hbm(src)
            run = src.shape[-1] if perm[-1] == n - 1 else 1
            name = ctx.declare_view(HbmView(f"{op.name}.reduce_view", (Transpose(perm), Reshape(view_shape)),
                                            (source,), view_shape, src.dtype, run), op)
            vt = view_tiles[t]
            c0, c1 = cols if cols is not None else (0, reduced)
            buf = ctx.alloc(vt.rows, c1 - c0, src.dtype, f"{op.name}.in{t}" + (f".{c0}" if c0 else ""))
            inp = Ref(buf.id, 0, vt.rows, 0, c1 - c0)
            ctx.dma_load(QueueName.DATA, HbmAccess(name, vt.batch, vt.r0, vt.r1, c0, c1), inp, src.dtype,
                         rows_per_batch=rows, run_bytes=ctx.hbm_views[name].run_elements * src.dtype.itemsize)
            return inp

        def done(inp: Ref) -> None:
            ctx.free(ctx.buffers[inp.buf])
    chunks = _reduce_chunks(ctx, reduced, src.dtype.itemsize, from_hbm)
    for t in range(len(value.tiles)):
        out = ctx.produce(op, t)
        if chunks is None:
            inp = load(t, None)
            tensor_reduce(ctx, alu, out, inp)
            done(inp)
        else:
            _reduce_per_chunk(ctx, op, t, alu, out, chunks, load, done)
        ctx.produced(op, t, out)
        ctx.unpin_all()
        yield batch_ends(value, t)


def _reduce_chunks(ctx: Context, cols: int, itemsize: int, from_hbm: bool) -> list[tuple[int, int]] | None:
    """Column chunks for a reduction of rows too wide to reduce whole: wider than the engines'
    free-dim limit (a row of Llama 3's 128,256 logits: a top-k's maximum), or loaded from HBM with
    more than half a partition per row (a value kept in HBM because its rows are wider than SBUF
    holds; the HBM view that moves reduced dims last: ``x.mean()`` of a [64, 1024] loss puts 65,536
    elements on one partition). Each chunk at most ``hbm_home_bytes`` per partition (the largest tile
    the compiler places in SBUF), equal widths. None: reduce each row whole."""
    limit = ctx.spec.vector_sbuf_free_limit
    if cols <= limit and not (from_hbm and cols * itemsize > ctx.spec.sbuf_bytes_per_partition // 2):
        return None
    width = min(limit, max(1, ctx.hbm_home_bytes // itemsize))
    n = math.ceil(cols / width)
    width = math.ceil(cols / n)  # equal chunks
    return [(c, min(cols, c + width)) for c in range(0, cols, width)]


def _reduce_per_chunk(ctx: Context, op: Op, t: int, alu: str, out: Ref, chunks: list[tuple[int, int]],
                      load: Callable[[int, tuple[int, int] | None], Ref],
                      done: Callable[[Ref], None]) -> None:
    """Tile ``t`` of a reduction of wide rows, as a compiler tiles one: each column chunk is loaded
    (``load``: only those columns of a value kept in HBM or of the HBM view) and reduced on Vector
    into its own column of a ``[rows, chunks]`` FP32 partials tile, then one more TENSOR_REDUCE with
    the same operation combines the partials (the maximum of the chunks' maxima, the sum of their
    sums): the row maximum of a greedy top-k over a 128k vocabulary, a sum over a wide row, a loss's
    ``mean()``. The partials stay FP32 until the one combine rounds to the output's type (a running
    combine into the output would round a bf16 sum once per chunk); ``n + 1`` Vector instructions
    for ``n`` chunks."""
    partials: Ref | None = None
    for j, cols in enumerate(chunks):
        inp = load(t, cols)
        if partials is None:
            partials = _scratch(ctx, inp.rows, len(chunks), f"{op.name}.partials{t}")
            ctx.pinned.add(partials.buf)
        tensor_reduce(ctx, alu, Ref(partials.buf, 0, inp.rows, j, j + 1), inp)
        done(inp)
    assert partials is not None
    tensor_reduce(ctx, alu, out, partials)
    _free(ctx, partials)


def _scratch(ctx: Context, rows: int, cols: int, name: str) -> Ref:
    buf = ctx.alloc(rows, cols, DType.FP32, name)
    return Ref(buf.id, 0, rows, 0, cols)


def _scratches(ctx: Context, rows: int, widths: list[tuple[int, str]]) -> list[Ref]:
    """FP32 scratch tiles of ``rows`` partitions an op takes at once, ``(columns, name)`` each
    (``Context.alloc_together``)."""
    bufs = ctx.alloc_together([(rows, cols, DType.FP32, name) for cols, name in widths])
    return [Ref(buf.id, 0, rows, 0, cols) for buf, (cols, _) in zip(bufs, widths)]


def _free(ctx: Context, *refs: Ref) -> None:
    for ref in refs:
        ctx.free(ctx.buffers[ref.buf])


@dataclass(slots=True)
class RowParams:
    """A 1-D weight [C] on ``rows`` partitions: its row is loaded into partition 0 (C elements, one
    DMA, not ``rows`` x C) when the op's lowering starts; the on-chip replication
    (``partition_broadcast``) is emitted at the first use (``ready``), so the in-order engine that
    runs it does not stall on the row's DMA ahead of the op's earlier work. No buffer of its own
    for the row: a freed one would be reused at once and tie the next load to the broadcast."""

    ref: Ref  # the replicated [rows, C]
    row: Ref | None  # the loaded [1, C] row until the broadcast is emitted

    def ready(self, ctx: Context) -> Ref:
        """The replicated rows, emitting the broadcast on the first call."""
        if self.row is not None:
            partition_broadcast(ctx, self.ref, self.row)
            self.row = None
        return self.ref

    def buffers(self) -> set[int]:
        """Buffer ids to pin while the op is lowered."""
        return {self.ref.buf}


def row_params(ctx: Context, op: Op, param: Op, rows: int) -> RowParams:
    """``param`` [C] for ``rows`` partitions: one DMA of the row now, the broadcast at first use."""
    source = ctx.ensure_hbm(param)
    cols = param.shape[-1]
    name = ctx.declare_view(HbmView(f"{param.name}.rows1", (BroadcastRows(1),), (source,), (1, cols),
                                    param.dtype, cols), param)
    buf = ctx.alloc(rows, cols, param.dtype, f"{op.name}.{param.name}")
    row = Ref(buf.id, 0, 1, 0, cols)  # partition 0 of the replicated buffer: no buffer of its own
    ctx.dma_load(QueueName.WEIGHT, HbmAccess(name, 0, 0, 1, 0, cols), row, param.dtype, rows_per_batch=1)
    return RowParams(Ref(buf.id, 0, rows, 0, cols), row)


def lower_softmax(ctx: Context, op: Op) -> None:
    """Per row tile, as the NKI softmax and flash-attention kernels write it: the row max negated
    in the reduction itself (``tensor_reduce(..., negate=True)``) -> ``exp(x - max)`` summed on ACT
    (the negated max as the activation's bias, ``activation_reduce``) -> reciprocal of the sum on
    the Vector engine -> the scale by it on ACT (``activation``'s per-partition ``scale``
    operand). Two dependent Vector steps per tile instead of four: the Vector engine, which also
    evacuates the score matmuls, was the chain's bottleneck. Bit-identical to the unfused ops'
    ``x * (1 / sum)`` (the same FP32 product, rounded once)."""
    drain(softmax_steps(ctx, op))


def softmax_steps(ctx: Context, op: Op) -> Iterator[bool]:
    src = op.operands[0]
    value = ctx.define(op)
    _free_limit_check(ctx, op, value.cols)
    chunks = math.ceil(value.cols / SOFTMAX_CHUNK)
    for t, tile in enumerate(value.tiles):
        x = ctx.tile(src, t, Layout.ROW)
        out = ctx.produce(op, t)
        if chunks > 1 or not _softmax_whole(ctx, op, x, out, tile.rows, value.cols):
            _softmax_in_chunks(ctx, op, x, out, tile.rows, value.cols, chunks)
        ctx.release(src, x)
        ctx.produced(op, t, out)
        ctx.unpin_all()
        yield batch_ends(value, t)


def _softmax_whole(ctx: Context, op: Op, x: Ref, out: Ref, rows: int, cols: int) -> bool:
    """A row tile of at most ``SOFTMAX_CHUNK`` columns in one pass per step; False (nothing
    emitted) when its FP32 ``exp`` row finds no room."""
    try:
        neg_max, total, e = _scratches(ctx, rows, [(1, f"{op.name}.max"), (1, f"{op.name}.sum"),
                                                   (cols, f"{op.name}.exp")])
    except CompileError:
        return False
    tensor_reduce(ctx, MAX, neg_max, x, negate=True)
    activate(ctx, "exponential", e, x, bias=neg_max, accumulate=total)
    reciprocal(ctx, total, total)
    activate(ctx, "copy", out, e, scale=total)
    _free(ctx, neg_max, total, e)
    return True


SOFTMAX_CHUNK = 2048  # columns: a softmax row wider than this is computed in chunks of at most it
SOFTMAX_MIN_CHUNK = 512  # columns: the narrowest exp chunk a split softmax row takes


def _softmax_in_chunks(ctx: Context, op: Op, x: Ref, out: Ref, rows: int, cols: int, first: int) -> None:
    """A softmax row tile in ``n`` equal column chunks, ``n`` at least ``first`` (the row's width
    over ``SOFTMAX_CHUNK``): the negated max over the whole row, then per chunk ``exp(x - max)``
    into its own buffer summed by the activation into its column of a ``[rows, n]`` FP32 partials
    tile, one ``TENSOR_REDUCE`` of the partials to the row sum, its reciprocal, and the scale per
    chunk, so that a reader of the probabilities (attention's PV dot) can start on the first
    chunk while the Scalar engine scales the next: the NKI flash-attention kernel's 2,048-column
    K/V tiles, whose exps it sums in partial sums (docs/execution-core.md, "Long softmax rows
    and decode attention").
    The same instructions per element plus ``n - 1`` ACTIVATEs and one reduce; the sum is added
    in ``n`` FP32 parts (the chunks' sums, then theirs), not in one pass. When the chunks'
    buffers find no room, ``n`` grows (``first + 1``, ...) until they do (``split_softmax_rows``
    counts those row tiles): Mistral-7B's decode step in bucket 16,384 (inf2 tp24, two heads'
    16,384 scores per partition) found its widest range 64,640 bytes, the 64 KiB row none,
    before rows that wide were always chunked."""
    name = op.name
    chunks: list[tuple[int, int]] = []
    refs: list[Ref] = []
    for n in range(max(2, first), max(2, first, cols // SOFTMAX_MIN_CHUNK) + 1):
        width = math.ceil(cols / n)
        chunks = [(c, min(cols, c + width)) for c in range(0, cols, width)]
        try:
            refs = _scratches(ctx, rows, [(1, f"{name}.max"), (1, f"{name}.sum"),
                                          (len(chunks), f"{name}.partials"),
                                          *[(c1 - c0, f"{name}.exp{j}")
                                            for j, (c0, c1) in enumerate(chunks)]])
            break
        except CompileError:
            continue
    if not refs:
        raise CompileError(f"cannot place {name}.exp: no split of its {cols} FP32 columns per "
                           f"partition into chunks of at least {SOFTMAX_MIN_CHUNK} fits in SBUF", op)
    neg_max, total, partials, *exps = refs
    if len(chunks) > first:
        ctx.stats["split_softmax_rows"] = ctx.stats.get("split_softmax_rows", 0) + 1
    if first > 1:
        ctx.stats["chunked_softmax_rows"] = ctx.stats.get("chunked_softmax_rows", 0) + 1
        ctx.stats["softmax_chunks"] = ctx.stats.get("softmax_chunks", 0) + len(chunks)
    tensor_reduce(ctx, MAX, neg_max, x, negate=True)
    for j, ((c0, c1), e) in enumerate(zip(chunks, exps)):
        activate(ctx, "exponential", e, Ref(x.buf, x.p0, x.p1, x.f0 + c0, x.f0 + c1), bias=neg_max,
                 accumulate=Ref(partials.buf, 0, rows, j, j + 1))
    tensor_reduce(ctx, SUM, total, partials)
    reciprocal(ctx, total, total)
    for (c0, c1), e in zip(chunks, exps):
        activate(ctx, "copy", Ref(out.buf, out.p0, out.p1, out.f0 + c0, out.f0 + c1), e, scale=total)
    _free(ctx, neg_max, total, partials, *exps)


def lower_norm(ctx: Context, op: Op) -> None:
    """Layer norm (mean, variance) or RMS norm, then the learned scale (and shift)."""
    src = op.operands[0]
    is_layer = op.opcode == "layer_norm"
    value = ctx.define(op)
    cols = value.cols
    _free_limit_check(ctx, op, cols)
    eps = float(op.attrs["eps"])
    max_rows = max(t.rows for t in value.tiles)
    gamma_rows = row_params(ctx, op, op.operands[1], max_rows)
    beta_rows = row_params(ctx, op, op.operands[2], max_rows) if is_layer else None
    pins = gamma_rows.buffers() | (beta_rows.buffers() if beta_rows else set())
    ctx.pinned.update(pins)
    for t, tile in enumerate(value.tiles):
        x = ctx.tile(src, t, Layout.ROW)
        out = ctx.produce(op, t)
        rows = tile.rows
        stat, centred, square = _scratches(ctx, rows, [(1, f"{op.name}.stat"), (cols, f"{op.name}.xc"),
                                                       (cols, f"{op.name}.sq")])
        if is_layer:
            mean = _scratch(ctx, rows, 1, f"{op.name}.mean")
            tensor_reduce(ctx, SUM, mean, x)
            tensor_scalar(ctx, mean, mean, [("mult", 1.0 / cols, False)])
            tensor_scalar(ctx, centred, x, [("subtract", mean, False)])
            _free(ctx, mean)
            normed_input = centred
        else:
            normed_input = x
        activate(ctx, "square", square, normed_input, accumulate=stat)
        tensor_scalar(ctx, stat, stat, [("mult", 1.0 / cols, False), ("add", eps, False)])
        activate(ctx, "rsqrt", stat, stat)
        tensor_scalar(ctx, centred, normed_input, [("mult", stat, False)])
        gamma = gamma_rows.ready(ctx)
        beta = beta_rows.ready(ctx) if beta_rows is not None else None
        g = Ref(gamma.buf, 0, rows, 0, cols)
        if beta is not None:
            tensor_tensor(ctx, "mult", centred, centred, g)
            tensor_tensor(ctx, "add", out, centred, Ref(beta.buf, 0, rows, 0, cols))
        else:
            tensor_tensor(ctx, "mult", out, centred, g)
        _free(ctx, stat, centred, square)
        ctx.release(src, x)
        ctx.produced(op, t, out)
        ctx.unpin_all()
        ctx.pinned.update({gamma.buf} | ({beta.buf} if beta else set()))
    _free(ctx, gamma_rows.ready(ctx), *([beta_rows.ready(ctx)] if beta_rows else []))
    ctx.unpin_all()
