"""Leaves and data movement: parameters, weights, reshapes, transposes, slices, concatenations,
broadcasts and gathers.

Layout ops cost nothing until someone reads them: their value is an *HBM view* (an access pattern
over the source tensors), and a consumer's DMA applies it while loading tiles, paying for the strided
access it implies. Reshapes that keep the same tiles are free aliases; a transpose of the last two
dims of an on-chip value runs on the PE (matmul against an identity) instead.
"""

from __future__ import annotations

import math
from functools import partial

from neuroncore.compiler import costs
from neuroncore.compiler.context import Context, Value
from neuroncore.compiler.counters import NodeCounters
from neuroncore.compiler.emitter import sbuf_key
from neuroncore.compiler.lowering_state import HbmTensorKind, Layout, QueueName
from neuroncore.compiler.node_semantics import Gather
from neuroncore.compiler.onchip_views import concatenate_on_chip, on_chip_view
from neuroncore.compiler.program import HbmAccess, HbmView, Ref
from neuroncore.compiler.tiling import tile_grid, tiles_of
from neuroncore.compiler.view_steps import ApplyOp
from neuroncore.dtypes import DType
from neuroncore.enums import Memory
from neuroncore.hardware import Engine
from neuroncore.ir.graph import Op


def lower_parameter(ctx: Context, op: Op) -> None:
    name = ctx.hbm_tensor(f"input{op.attrs['number']}.{op.name}", op, HbmTensorKind.INPUT)
    ctx.define(op, home=Memory.HBM, hbm=name)


def lower_weight(ctx: Context, op: Op) -> None:
    """A weight lives in HBM; a weight only ever read transposed is stored pre-transposed."""
    uses = [ctx.graph.ops[i] for i in ctx.uses[op.index]]
    pretransposed = bool(uses) and len(op.shape) >= 2 and all(
        u.opcode == "dot" and _needs_transpose(u, u.operands.index(op)) for u in uses
    ) and all(u.operands.count(op) == 1 for u in uses)
    shape = (*op.shape[:-2], op.shape[-1], op.shape[-2]) if pretransposed else op.shape
    stored = op.dtype
    if op.opcode == "convert":  # a cast weight, folded: named after its source and type
        label = f"{op.operands[0].attrs.get('label', op.name)}.{op.dtype.value}"
        if op.operands[0].dtype is DType.INT8:  # int8 weight-only: stays int8 in HBM, cast in the
            stored = DType.INT8                  # DMA that loads it (neuroncore.md §5.3)
            label = op.operands[0].attrs.get("label", op.name)
    else:
        label = op.attrs.get("label", op.name)
    name = ctx.hbm_tensor(f"weight.{label}", op, HbmTensorKind.WEIGHT, shape=shape,
                          pretransposed=pretransposed, dtype=stored)
    value = ctx.define(op, home=Memory.HBM, hbm=name)
    value.pretransposed = pretransposed


def _needs_transpose(dot: Op, operand_position: int) -> bool:
    n = len(dot.shape)
    if operand_position == 0:
        return dot.attrs["lhs_contract"] == n - 1
    return dot.attrs["rhs_contract"] == n - 1


def run_elements(op: Op) -> int:
    """Contiguous source elements per descriptor when a DMA reads this view."""
    src = op.operands[0]
    last = src.shape[-1] if src.shape else 1
    code = op.opcode
    if code == "transpose":
        perm = op.attrs["permutation"]
        return last if perm and perm[-1] == len(perm) - 1 else 1
    if code == "slice":
        return (op.shape[-1] if op.attrs["strides"][-1] == 1 else 1) if op.shape else 1
    if code == "broadcast":
        dims = op.attrs["dims"]
        keeps_last = bool(dims) and dims[-1] == len(op.shape) - 1 and src.shape[-1] == op.shape[-1]
        return last if keeps_last else 1
    if code == "concatenate":
        dim = op.attrs["dimension"]
        return min(o.shape[-1] for o in op.operands) if dim == len(op.shape) - 1 else last
    if code == "reshape":
        out_last = op.shape[-1] if op.shape else 1
        return math.gcd(max(last, 1), max(out_last, 1))
    return 1


def lower_view(ctx: Context, op: Op) -> None:
    """Reshape (when not a free alias), transpose, slice, concatenate and broadcast."""
    if op.opcode == "reshape" and op.index in ctx.orientation.members:
        _alias_feature_major(ctx, op)
        return
    if op.opcode == "reshape" and _try_alias(ctx, op):
        return
    if op.opcode == "transpose" and _pe_transposable(ctx, op):
        from neuroncore.compiler.lower_matmul import lower_pe_transpose

        lower_pe_transpose(ctx, op)
        return
    view_name = f"{op.name}.view"
    materialize_sources = partial(_materialize_sources, op, view_name)
    if on_chip_view(ctx, op, view_name, materialize_sources) or concatenate_on_chip(ctx, op):
        return
    value = ctx.define(op, home=Memory.HBM, hbm=view_name)
    value.lazy = materialize_sources
    for operand in op.operands:  # sources stay readable until the view's last reader
        ctx.extend_uses(operand, op)


def _materialize_sources(op: Op, view_name: str, ctx: Context) -> None:
    """Declare the HBM view ``view_name`` of ``op``'s sources (each given an HBM copy)."""
    sources = tuple(ctx.ensure_hbm(o) for o in op.operands)
    ctx.declare_view(HbmView(view_name, (ApplyOp(op.index),), sources, op.shape, op.dtype,
                             run_elements(op)), op)


def _alias_feature_major(ctx: Context, op: Op) -> None:
    """A reshape that keeps the last dim of a feature-major value (compiler.orientation) holds the
    same ``[last dim, tokens]`` tiles: an alias."""
    src = op.operands[0]
    src_value = ctx.values[src.index]
    while src_value.alias is not None:
        src_value = ctx.values[src_value.alias.index]
    value = ctx.define(op, home=Memory.SBUF)
    value.alias = src_value.op
    ctx.extend_uses(src_value.op, op)


def _try_alias(ctx: Context, op: Op) -> bool:
    src = op.operands[0]
    src_value = ctx.values[src.index]
    while src_value.alias is not None:
        src_value = ctx.values[src_value.alias.index]
    if src_value.home is not Memory.SBUF or src_value.immediate is not None or src_value.lazy is not None:
        return False
    src_flat = [(t.batch * src_value.rows_per_batch + t.r0, t.rows) for t in src_value.tiles]
    for layout in (Layout.ROW, Layout.COL):
        if layout == Layout.COL and (not op.shape or src_value.cols != 1):
            continue
        _, rows, cols = tile_grid(op.shape, layout)
        if cols != src_value.cols:
            continue
        flat = [(t.batch * rows + t.r0, t.rows) for t in tiles_of(op.shape, layout)]
        if flat == src_flat:
            value = ctx.define(op, layout=layout, home=Memory.SBUF)
            value.alias = src_value.op
            ctx.extend_uses(src_value.op, op)
            return True
    return False


def _pe_transposable(ctx: Context, op: Op) -> bool:
    perm = op.attrs["permutation"]
    n = len(perm)
    if n < 2 or tuple(perm) != (*range(n - 2), n - 1, n - 2):
        return False
    src = op.operands[0]
    src_value = ctx.values[src.index]
    if not op.dtype.is_float or src_value.immediate is not None or src_value.layout != Layout.ROW:
        return False
    if src_value.home is Memory.SBUF:
        return src_value.alias is None
    # an activation (or a view of one) in HBM: NC-v2 DMA has no transpose, so reading it transposed
    # moves one element per descriptor; loading its rows and transposing on the PE is what the
    # compiler does instead (weights are pre-transposed at compile time, so they never get here)
    return src_value.home is Memory.HBM and not _reads_a_constant(src)


VIEW_OPCODES = ("reshape", "transpose", "slice", "broadcast", "concatenate", "convert")


def _reads_a_constant(op: Op) -> bool:
    """Whether ``op`` is a weight or constant, or a chain of views reading one."""
    stack, seen = [op], set()
    while stack:
        x = stack.pop()
        if x.index in seen:
            continue
        seen.add(x.index)
        if x.opcode == "constant":
            return True
        if x.opcode in VIEW_OPCODES:
            stack.extend(x.operands)
    return False


def lower_gather(ctx: Context, op: Op) -> None:
    """Embedding lookup: GpSimd builds descriptors from the indices (software DGE), DMA moves rows.

    A table read through an HBM view (a transposed or strided slice of a stored tensor) is gathered
    through the view's access pattern: each picked row is ``d / run`` descriptors of the view's
    contiguous run, not one descriptor of ``d`` elements, and GpSimd writes each of them."""
    table, indices = op.operands
    table_name = ctx.ensure_hbm(table)
    value = ctx.define(op)
    spec = ctx.spec
    d = table.shape[1]
    row_bytes = d * op.dtype.itemsize
    view = ctx.hbm_views.get(table_name)
    run = min(view.run_elements * op.dtype.itemsize, row_bytes) if view is not None else row_bytes
    per_row = max(1, row_bytes // max(run, 1))
    queue = ctx.queue[QueueName.DYNAMIC_SW]
    for t, tile in enumerate(value.tiles):
        idx = ctx.tile(indices, t, Layout.COL)
        out = ctx.produce(op, t)
        nbytes = tile.rows * row_bytes
        descriptors = tile.rows * per_row
        table_access = HbmAccess(table_name, 0, 0, table.shape[0], 0, d)
        reads = [sbuf_key(idx), *ctx.hbm_rects(table_access, table.shape[0])]
        ctx.em.dma(
            queue,
            reads=reads,
            writes=[sbuf_key(out)],
            engines=costs.dma_engines_used(spec, descriptors),
            engine_ns=costs.dma_engine_ns(spec, descriptors, nbytes // descriptors),
            trigger_cost_ns=costs.cycles_to_ns(spec, Engine.GPSIMD,
                                               costs.gpsimd_cycles(spec, descriptors)),
            text=f"gather hbm:{table_name}[{ctx.ref_text(idx)}] -> {ctx.ref_text(out)} {nbytes}B",
            semantics=Gather(out, table_access, idx),
            trigger_opcode="DMA_DESCRIPTOR_GEN",
            trigger_text=f"{queue.name} indirect idx={ctx.ref_text(idx)} rows={tile.rows}",
            counters=NodeCounters(hbm_read_bytes=nbytes, sbuf_write_bytes=nbytes, dma_bytes=nbytes),
        )
        ctx.release(indices, idx)
        ctx.produced(op, t, out)
        ctx.unpin_all()


def lower_output_copy(ctx: Context, op: Op) -> None:
    """Store a graph output that is not already in its output tensor (e.g. a view or a parameter).

    An output that is a reshape is stored from its source's tiles: a reshape keeps the row-major
    order, so the output tensor holds the same bytes in the source's shape (the runtime reads it
    back in the output's). A convolution network's ``[N, C, H, W]`` output is thus stored from its
    channel-major ``[N, C, H*W]`` tiles, one transfer per 128 channels, not one per channel."""
    value = ctx.values[op.index]
    if op.opcode == "reshape" and not (_own_tiles(value) and _source_is_view(ctx, op)) \
            and _store_source(ctx, op):
        return
    _store_tiles(ctx, op, ctx.hbm_tensor(ctx.tensor_name(op), op, HbmTensorKind.OUTPUT), value.layout)


def _own_tiles(value: Value) -> bool:
    """Whether a value holds its own SBUF tiles (not an alias, a slice, a lazy HBM view or an
    immediate)."""
    return (value.home is Memory.SBUF and value.alias is None and value.slices is None
            and value.lazy is None and value.immediate is None)


def _source_is_view(ctx: Context, op: Op) -> bool:
    """Whether the source of the reshape ``op`` is only an HBM view (no tiles of its own). An output
    reshape assembled on chip from such a chain (attention's head merge: copied block by block
    from the heads' tiles, through a transpose that is a view) is stored from its own tiles:
    storing the source made the view go through HBM first -- the heads stored, read back through
    the strided view, stored again (BERT-large training's layer forward: about 200 µs with the
    engines idle)."""
    source = ctx.values.get(op.operands[0].index)
    return source is not None and (source.lazy is not None or (
        source.home is Memory.HBM and (source.hbm or "") in ctx.hbm_views))


def _store_source(ctx: Context, op: Op) -> bool:
    src = op.operands[0]
    source = ctx.values.get(src.index)
    if (source is None or source.layout != Layout.ROW or source.immediate is not None
            or len(src.shape) < 2):
        return False
    _store_tiles(ctx, src, ctx.hbm_tensor(ctx.tensor_name(op), op, HbmTensorKind.OUTPUT, shape=src.shape),
                 Layout.ROW)
    return True


def _store_tiles(ctx: Context, op: Op, name: str, layout: Layout) -> None:
    """Each tile of ``op``'s value stored to the output tensor ``name`` on the output queue.

    A value that lives in HBM because its rows are wider than SBUF allows (a language model's
    logits over a 50k-128k vocabulary: 16 tokens of 128,256 FP32 logits are 501 KiB per
    partition, SBUF 192 KiB) is copied through SBUF in equal column chunks of at most
    ``hbm_home_bytes`` per partition: loading its whole tile could not be placed. Rows up to half
    of SBUF are copied whole, as before."""
    value = ctx.values[op.index]
    chunks = [(0, value.cols)]
    if value.home is Memory.HBM:
        chunks = _store_chunks(ctx, value.cols, op.dtype.itemsize)
    for t, tile in enumerate(value.tiles):
        for c0, c1 in chunks:
            ref = ctx.tile(op, t, cols=(c0, c1))
            access = HbmAccess(name, tile.batch, tile.r0, tile.r1, c0, c1, layout)
            ctx.dma_store(QueueName.OUT, ref, access, op.dtype, rows_per_batch=value.rows_per_batch)
            ctx.release(op, ref)
            ctx.unpin_all()


def _store_chunks(ctx: Context, cols: int, itemsize: int) -> list[tuple[int, int]]:
    """Column ranges for copying an HBM-home value's rows through SBUF (see ``_store_tiles``)."""
    if cols * itemsize <= ctx.spec.sbuf_bytes_per_partition // 2:
        return [(0, cols)]
    n = math.ceil(cols * itemsize / max(itemsize, ctx.hbm_home_bytes))
    width = math.ceil(cols / n)
    return [(c, min(cols, c + width)) for c in range(0, cols, width)]


__all__ = ["Ref", "lower_gather", "lower_output_copy", "lower_parameter", "lower_view",
           "lower_weight"]
