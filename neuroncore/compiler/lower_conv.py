"""Convolutions as implicit GEMM on the Tensor engine, and pools on the Vector engine, the way
neuronx-cc tiles them: over channel-major activations (``neuroncore/ir/conv.py``).

A ``convolution(x [N, C, L], w2) -> [N, O, L_out]`` is lowered per image and *group block*:

1. **Input tiles are read once.** Each 128-channel tile of ``x`` (channels on partitions, the whole
   image on the free dim) is the resident SBUF tile or one contiguous DMA. When the window needs a
   zero border (padding) or zeros between pixels (input dilation: a transposed convolution), the
   tile is placed once inside a zeroed buffer of the padded size (a GpSimd ``MEMSET`` and one
   Scalar/Vector copy through a strided access pattern).
2. **Weights are loaded once per output-channel block**: the compiler stores them as
   ``[in channels, K * 128]`` runs per block (``ir/conv.to_blocks``), so one DMA moves a whole
   kernel of a 128-channel output block with one contiguous run per partition; they stay in SBUF
   for every image when the convolution's weights fit in a quarter of SBUF.
3. **Kernel offsets are access patterns.** Output positions are cut into PSUM banks of up to 512
   (whole output rows where they fit), four banks at a time. For each (input-channel tile, kernel
   offset) the stationary ``[c, o]`` slice is loaded (``LDWEIGHTS``) and one ``MATMUL`` per bank
   multiplies it by the *shifted, strided view* of the input tile under that offset (stride,
   dilation and the offset become the moving operand's access pattern: no im2col copy, no DMA), all
   ``C/128 * K`` products accumulating in PSUM. The banks are evacuated (Scalar and Vector
   alternately) into the output tile's columns.

Grouped convolutions: the group blocks (``ir/conv.choose_group_block``) pack as many groups as fit
128 input and 128 output channels into one block-diagonal stationary, so a **depthwise**
convolution runs as per-channel matmuls on the PE (one ``[128 x 128]`` diagonal stationary per
kernel offset covering 128 channels) rather than on the Vector engine: the PE streams a 512-pixel
bank in 512 cycles at 2.8 GHz where a Vector multiply-add of the same bank costs 2 x 512 cycles
at 1.12 GHz per offset, and the Vector engine is left free for the evacuations and the elementwise
chain around the convolution (its zeros cost PE time only, which depthwise layers have spare).

``reduce-window`` (max and average pooling) places the input tile the same way (border filled
with the lowest value for max) and combines the window offsets on the Vector engine: one copy and
``K - 1`` ``TENSOR_TENSOR`` instructions per tile, each reading the offset's access pattern.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from neuroncore.compiler import costs
from neuroncore.compiler.context import Context
from neuroncore.compiler.counters import NodeCounters
from neuroncore.compiler.emitter import sbuf_key
from neuroncore.compiler.lower_elementwise import activate, tensor_copy, tensor_scalar, tensor_tensor
from neuroncore.compiler.lower_matmul import ldweights
from neuroncore.compiler.lowering_state import Accumulation, Layout
from neuroncore.compiler.node_semantics import NOP, Copy, MatMul, Memset, TensorTensor
from neuroncore.compiler.program import RES_TENSOR_MM, ApRef, Buffer, HbmAccess, Ref
from neuroncore.compiler.tiling import (
    P,
    Tile,
    batch_rows_access,
    locate,
    tile_grid,
    tiles_of,
)
from neuroncore.dtypes import DType
from neuroncore.hardware import Engine
from neuroncore.ir.conv import ConvChannels, WindowGeometry
from neuroncore.ir.graph import Op

BANK_COLS = 512  # FP32 accumulators per partition in one PSUM bank
GROUP_BANKS = 4  # banks filled per stationary load
WEIGHT_CACHE_FRACTION = 0.25  # of SBUF: a convolution's weights kept across images up to this


# -- geometry -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OutputBlock:
    """Output positions of one PSUM bank: ``count`` consecutive positions from ``start``, i.e. a
    range of ``rows`` indices along ``chunk_dim`` from ``origin`` with every later dim whole."""

    start: int
    count: int
    origin: tuple[int, ...]
    chunk_dim: int
    rows: int


def output_blocks(out: tuple[int, ...], limit: int = BANK_COLS) -> list[OutputBlock]:
    """The output cut into banks of at most ``limit`` positions, whole rows where they fit."""
    dims = len(out)
    j = dims  # first dim of the suffix that fits one bank whole
    while j > 0 and math.prod(out[j - 1:]) <= limit:
        j -= 1
    if j == 0:
        return [OutputBlock(0, math.prod(out), (0,) * dims, 0, out[0])]
    chunk = j - 1
    per = math.prod(out[j:])
    rows = max(1, limit // per)
    strides = [math.prod(out[d + 1:]) for d in range(dims)]
    blocks = []
    outer = [range(n) for n in out[:chunk]]
    for index in (tuple(i) for i in _product(outer)):
        for a in range(0, out[chunk], rows):
            r = min(rows, out[chunk] - a)
            origin = (*index, a, *(0,) * (dims - chunk - 1))
            start = sum(o * s for o, s in zip(origin, strides))
            blocks.append(OutputBlock(start, r * per, origin, chunk, r))
    return blocks


def _product(ranges: list[range]) -> Iterator[list[int]]:
    if not ranges:
        yield []
        return
    for i in ranges[0]:
        for rest in _product(ranges[1:]):
            yield [i, *rest]


def _strides(dims: tuple[int, ...]) -> list[int]:
    return [math.prod(dims[d + 1:]) for d in range(len(dims))]


def window_pattern(geo: WindowGeometry, dims: tuple[int, ...], base: int, block: OutputBlock,
                   offset: tuple[int, ...]) -> tuple[int, tuple[tuple[int, int], ...]]:
    """(first element, pattern) of the input under kernel ``offset`` for the positions of
    ``block``, over a buffer holding the (padded) input of spatial ``dims`` from element ``base``."""
    st = _strides(dims)
    first = base + sum((block.origin[d] * geo.stride[d] + offset[d] * geo.dilation[d]) * st[d]
                       for d in range(len(dims)))
    out = geo.out
    cd = block.chunk_dim
    pattern = [(geo.stride[cd] * st[cd], block.rows)]
    pattern += [(geo.stride[d] * st[d], out[d]) for d in range(cd + 1, len(dims))]
    return first, tuple(pattern)


@dataclass(frozen=True)
class Piece:
    """Channels [local, local + rows) of a channel range, at partitions [p, p + rows) of tile t."""

    t: int
    p: int
    rows: int
    local: int


def channel_pieces(shape: tuple[int, ...], tiles: list[Tile], n: int, c0: int, c1: int) -> list[Piece]:
    """Where channels [c0, c1) of image ``n`` of a [N, C, L] value live: runs within one tile."""
    pieces = []
    c = c0
    while c < c1:
        t, p = locate(shape, Layout.ROW, n, c)
        rows = min(c1 - c, tiles[t].rows - p)
        pieces.append(Piece(t, p, rows, c - c0))
        c += rows
    return pieces


# -- instructions ---------------------------------------------------------------------------------


def _copy(ctx: Context, out: Ref | ApRef, inp: Ref | ApRef, engine: Engine) -> int:
    """A copy through access patterns, on the Scalar (ACTIVATE Copy) or Vector engine."""
    spec = ctx.spec
    n = out.cols
    out_dtype, in_dtype = ctx.buffers[out.buf].dtype, ctx.buffers[inp.buf].dtype
    mode: str | None = None
    if engine is Engine.SCALAR:
        cycles: float = costs.activation_cycles(spec, n)
        opcode = "ACTIVATE"
    else:
        mode = costs.vector_perf_mode(spec, "tensor_copy", {in_dtype, out_dtype} <= {DType.BF16, DType.FP16},
                                      True)
        cycles = costs.vector_cycles(spec, "tensor_copy", n) / costs.perf_mode_divisor(mode)
        opcode = "TENSOR_COPY"
    nbytes_in = inp.rows * n * in_dtype.itemsize
    return ctx.em.instruction(
        engine, opcode, costs.cycles_to_ns(spec, engine, cycles),
        reads=[sbuf_key(inp)], writes=[sbuf_key(out)],
        text=f"src={ctx.ref_text(inp)} dst={ctx.ref_text(out)}",
        semantics=Copy(out, inp), performance_mode=mode,
        activation_fn="Copy" if engine is Engine.SCALAR else None,
        counters=NodeCounters(sbuf_read_bytes=nbytes_in, sbuf_write_bytes=out.rows * n * out_dtype.itemsize),
    )


def _memset(ctx: Context, out: Ref, value: float) -> int:
    """Fill a buffer on GpSimd (otherwise idle in a convolution network)."""
    spec = ctx.spec
    return ctx.em.instruction(
        Engine.GPSIMD, "MEMSET", costs.cycles_to_ns(spec, Engine.GPSIMD, costs.gpsimd_cycles(spec, out.cols)),
        reads=[], writes=[sbuf_key(out)], text=f"value={value:g} dst={ctx.ref_text(out)}",
        semantics=Memset(out, float(value)),
        counters=NodeCounters(sbuf_write_bytes=out.rows * out.cols * ctx.buffers[out.buf].dtype.itemsize),
    )


def _combine(ctx: Context, alu: str, out: Ref, window: ApRef) -> int:
    """``out = alu(out, window)`` on the Vector engine: one window offset of a pool."""
    spec = ctx.spec
    dtype = ctx.buffers[out.buf].dtype
    all_bf16 = dtype is DType.BF16 and ctx.buffers[window.buf].dtype is DType.BF16 and alu == "add"
    mode = costs.vector_perf_mode(spec, "tensor_tensor", {dtype, ctx.buffers[window.buf].dtype}
                                  <= {DType.BF16, DType.FP16}, True)
    cycles = costs.vector_cycles(spec, "tensor_tensor", out.cols, all_bf16=all_bf16) \
        / costs.perf_mode_divisor(mode)
    nbytes = out.rows * out.cols * dtype.itemsize
    return ctx.em.instruction(
        Engine.VECTOR, "TENSOR_TENSOR", costs.cycles_to_ns(spec, Engine.VECTOR, cycles),
        reads=[sbuf_key(out), sbuf_key(window)], writes=[sbuf_key(out)],
        text=f"op={alu} src0={ctx.ref_text(out)} src1={ctx.ref_text(window)} dst={ctx.ref_text(out)}",
        semantics=TensorTensor(alu, out, out, window), performance_mode=mode,
        counters=NodeCounters(sbuf_read_bytes=2 * nbytes, sbuf_write_bytes=nbytes),
    )


def _matmul(ctx: Context, psum: Ref, moving: ApRef, source: Ref, dtype: DType,
            position: Accumulation) -> None:
    """One MultiplyMoving whose moving operand is an access pattern over ``source`` (the input
    tile: recorded as read whole, so successive offsets do not pile up hazard records). FP32
    inputs take two passes, each recording half the FLOPs, as in ``lower_matmul.matmul``."""
    spec = ctx.spec
    k, m, n = moving.rows, psum.rows, moving.cols
    flops = 2 * k * m * n
    passes = 2 if dtype is DType.FP32 else 1
    cycles = costs.matmul_cycles(spec, n, dtype) / passes
    factor = costs.adjusted_flops_factor(spec, dtype)
    for p in range(passes):
        accumulate = position.accumulates or p > 0
        label = f" fp32_pass={('lo', 'hi')[p]}" if passes == 2 else ""
        ctx.em.instruction(
            Engine.TENSOR, "MATMUL", costs.cycles_to_ns(spec, Engine.TENSOR, cycles),
            reads=[sbuf_key(source), *([sbuf_key(psum)] if accumulate else [])],
            writes=[sbuf_key(psum)], track=RES_TENSOR_MM,
            text=(f"src={ctx.ref_text(moving)} dst={ctx.ref_text(psum)} acc={position}{label}"
                  f" {dtype.profile_name} {k}x{m}x{n}"),
            semantics=MatMul(psum, moving, position.accumulates, False) if p == 0 else NOP,
            tensor_instruction_type="REGULAR",
            counters=NodeCounters(sbuf_read_bytes=k * n * dtype.itemsize, psum_write_bytes=m * n * 4,
                                  raw_flops=flops // passes,
                                  adjusted_flops=int(flops // passes * factor)),
        )


def _alternating() -> Iterator[Engine]:
    while True:
        yield Engine.SCALAR
        yield Engine.VECTOR


# -- the input tile -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Band:
    """Output rows [out0, out1) along the first spatial dim, and the rows [in0, in1) of the
    padded (input-dilated) input they read."""

    out0: int
    out1: int
    in0: int
    in1: int


def bands(geo: WindowGeometry, budget_elements: int) -> list[Band]:
    """The output cut along its first spatial dim so that each band's input (with its halo) holds
    at most ``budget_elements`` per partition: a 224x224 image is a few bands, a 56x56 one whole."""
    padded, out = geo.padded, geo.out
    if math.prod(padded) <= budget_elements:
        return [Band(0, out[0], 0, padded[0])]
    inner = math.prod(padded[1:])
    halo = (geo.kernel[0] - 1) * geo.dilation[0] + 1
    rows = max(1, (budget_elements // inner - halo) // geo.stride[0] + 1)
    result = []
    for a in range(0, out[0], rows):
        b = min(out[0], a + rows)
        result.append(Band(a, b, a * geo.stride[0], (b - 1) * geo.stride[0] + halo))
    return result


@dataclass
class _Input:
    """A band of an input tile ready for window reads: the tile itself, or a copy inside its border."""

    ref: Ref  # the whole buffer region (partitions of the tile)
    dims: tuple[int, ...]  # spatial dims the buffer holds (padded or as stored)
    row0: int  # first (padded) row along the first spatial dim it holds
    owned: Buffer | None  # a buffer this lowering made (freed by it), else the value's tile


def band_budget(ctx: Context, dtype: DType) -> int:
    return int(WEIGHT_CACHE_FRACTION * ctx.spec.sbuf_bytes_per_partition) // dtype.itemsize


def _prepare(ctx: Context, x: Op, t: int, geo: WindowGeometry, band: Band, fill: float,
             engines: Iterator[Engine]) -> _Input:
    """Input rows of ``band`` of tile ``t``: read once (the resident tile, or only those rows of a
    value in HBM), then, if the window needs a border or input dilation, placed inside a buffer of
    the padded band size filled with ``fill``."""
    spatial = geo.spatial
    inner = math.prod(spatial[1:])
    whole = band.in0 == 0 and band.in1 == geo.padded[0]
    if not geo.needs_copy:
        cols = None if whole else (band.in0 * inner, band.in1 * inner)
        src = ctx.tile(x, t, Layout.ROW, cols)
        return _Input(src, (band.in1 - band.in0, *spatial[1:]), band.in0, None)
    (lo, _), ld = geo.padding[0], geo.lhs_dilation[0]
    first_row = max(0, -(-(band.in0 - lo) // ld))
    last_row = min(spatial[0] - 1, (band.in1 - 1 - lo) // ld)
    dims = (band.in1 - band.in0, *geo.padded[1:])
    size = math.prod(dims)
    rows = tiles_of(x.shape, Layout.ROW)[t].rows
    buf = ctx.alloc(rows, size, x.dtype, f"{x.name}.pad{t}")
    region = Ref(buf.id, 0, rows, 0, size)
    _memset(ctx, region, fill)
    if first_row <= last_row:
        src = ctx.tile(x, t, Layout.ROW, (first_row * inner, (last_row + 1) * inner))
        st = _strides(dims)
        first = (lo + first_row * ld - band.in0) * st[0] + sum(
            p * s for (p, _), s in zip(geo.padding[1:], st[1:]))
        pattern = ((ld * st[0], last_row - first_row + 1),
                   *((d * s, n) for d, s, n in zip(geo.lhs_dilation[1:], st[1:], spatial[1:])))
        _copy(ctx, ApRef(buf.id, src.p0, src.p1, first, pattern), src, next(engines))
        ctx.release(x, src)
    return _Input(region, dims, band.in0, buf)


def _pattern(geo: WindowGeometry, prepared: _Input, block: OutputBlock,
             offset: tuple[int, ...]) -> tuple[int, tuple[tuple[int, int], ...]]:
    first, pattern = window_pattern(geo, prepared.dims, prepared.ref.f0, block, offset)
    return first - prepared.row0 * math.prod(prepared.dims[1:]), pattern


def _band_blocks(geo: WindowGeometry, band: Band, limit: int) -> list[OutputBlock]:
    """The output blocks of a band (positions numbered in the whole output)."""
    inner = math.prod(geo.out[1:])
    return [OutputBlock(b.start + band.out0 * inner, b.count, (b.origin[0] + band.out0, *b.origin[1:]),
                        b.chunk_dim, b.rows)
            for b in output_blocks((band.out1 - band.out0, *geo.out[1:]), limit)]


def _done(ctx: Context, x: Op, prepared: _Input) -> None:
    if prepared.owned is not None:
        ctx.free(prepared.owned)
    else:
        ctx.release(x, prepared.ref)


def _repin(ctx: Context, refs: list[Ref]) -> None:
    ctx.unpin_all()
    for ref in refs:
        ctx.pinned.add(ref.buf)


# -- the fused epilogue ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Epilogue:
    """What follows a convolution and is applied while evacuating PSUM: ``func(acc * scale +
    bias)`` with a per-output-channel ``scale`` and ``bias`` (a batch norm the frontend folded into
    constants, or a convolution bias) and ReLU, written as ``result``'s value. neuronx-cc fuses a
    convolution's batch norm and activation the same way: one Scalar ``ACTIVATE`` (or one Vector
    ``TENSOR_SCALAR``) per PSUM bank instead of three passes over the activation."""

    result: Op
    fused: tuple[Op, ...]
    scale: Op | None  # [O] values, already placed
    bias: Op | None
    relu: bool
    # a residual added after the scale and bias (ResNet's shortcut, before its ReLU): a value of
    # the convolution's shape, already placed, read tile by tile by the evacuation
    residual: Op | None = None


def _only_user(ctx: Context, op: Op) -> Op | None:
    uses = ctx.uses[op.index]
    if len(uses) != 1 or op.index in ctx.outputs:
        return None
    return ctx.graph.ops[uses[0]]


def _per_channel(ctx: Context, x: Op, conv: Op) -> Op | None:
    """The [O] source of a per-output-channel broadcast that is already placed, or None."""
    if x.opcode != "broadcast":
        return None
    src = x.operands[0]
    if tuple(x.attrs["dims"]) == (0, 1) and src.opcode == "broadcast":  # [C] -> [N, C] -> [N, C, L]
        x, src = src, src.operands[0]
    if tuple(x.attrs["dims"]) != (1,):
        return None
    if src.shape != (conv.shape[1],) or src.index > conv.index or src.index not in ctx.values:
        return None
    return src


def _is_zero(x: Op) -> bool:
    if x.opcode == "broadcast":
        x = x.operands[0]
    return x.opcode == "constant" and "init" not in x.attrs and float(x.attrs.get("value", 1.0)) == 0.0


def epilogue(ctx: Context, op: Op) -> Epilogue | None:
    """The scale / shift / ReLU chain after convolution ``op`` that its evacuation can apply."""
    chain: list[Op] = []
    found: dict[str, Op] = {}
    cur = op
    user = _only_user(ctx, cur)
    for opcode in ("multiply", "add"):
        if user is not None and user.opcode == opcode and user.operands[0] is cur:
            vec = _per_channel(ctx, user.operands[1], op)
            if vec is not None:
                found[opcode] = vec
                chain.append(user)
                cur = user
                user = _only_user(ctx, cur)
    residual = _residual(ctx, op, cur, user)
    if residual is not None:
        assert user is not None
        chain.append(user)
        cur = user
        user = _only_user(ctx, cur)
    relu = (user is not None and user.opcode == "maximum" and user.operands[0] is cur
            and _is_zero(user.operands[1]))
    if relu:
        assert user is not None
        chain.append(user)
        cur = user
    if not chain:
        return None
    return Epilogue(cur, tuple(chain), found.get("multiply"), found.get("add"), relu, residual)


def _residual(ctx: Context, conv: Op, cur: Op, user: Op | None) -> Op | None:
    """The other operand of ``user`` when it adds a placed, same-shaped FP32 value (a residual
    shortcut) to ``cur``: the evacuation adds it, as it adds the bias. FP32 only, so every rounding
    is the unfused ops' own."""
    if user is None or user.opcode != "add" or cur not in user.operands:
        return None
    a, b = user.operands
    other = b if a is cur else a
    value = ctx.values.get(other.index)
    if (other is cur or other.shape != conv.shape or value is None or value.layout != Layout.ROW
            or value.transposed or value.immediate is not None
            or {user.dtype, cur.dtype, other.dtype} != {DType.FP32}):
        return None
    return other


def _channel_scalar(ctx: Context, vec: Op | None, channel: int, piece: Piece
                    ) -> tuple[Ref | None, Ref | None]:
    """(the buffer, the ref) of channels [channel, channel + rows) of ``vec``, one per partition
    of ``piece`` (a DMA can write any partitions: images packed into one tile get their copy at
    their own partitions)."""
    if vec is None:
        return None, None
    name = ctx.ensure_hbm(vec)
    buf = ctx.alloc(piece.p + piece.rows, 1, vec.dtype, f"{vec.name}.col")
    ref = Ref(buf.id, piece.p, piece.p + piece.rows, 0, 1)
    access = HbmAccess(name, 0, channel, channel + piece.rows, 0, 1, Layout.COL)
    ctx.dma_load(ctx.load_queue(ctx.values[vec.index]), access, ref, vec.dtype,
                 rows_per_batch=vec.shape[0], run_bytes=vec.dtype.itemsize)
    return ref, ref


def _evacuate(ctx: Context, out: Ref, psum: Ref, engine: Engine, ep: Epilogue | None,
              scale: Ref | None, bias: Ref | None, residual: Ref | None = None) -> None:
    if ep is None:
        tensor_copy(ctx, out, psum, engine)
        return
    if residual is not None:  # scale and bias, the shortcut (Vector reads PSUM too), then ReLU
        if engine is Engine.SCALAR:
            activate(ctx, "copy", out, psum, scale=scale if scale is not None else 1.0,
                     bias=bias if bias is not None else 0.0)
        else:
            first: list[tuple[str, float | Ref, bool]] = []
            if scale is not None:
                first.append(("mult", scale, False))
            if bias is not None:
                first.append(("add", bias, False))
            if first:
                tensor_scalar(ctx, out, psum, first)
            else:
                tensor_copy(ctx, out, psum, engine)
        tensor_tensor(ctx, "add", out, out, residual)
        if ep.relu:
            tensor_scalar(ctx, out, out, [("max", 0.0, False)])
        return
    if engine is Engine.SCALAR:
        activate(ctx, "relu" if ep.relu else "copy", out, psum,
                 scale=scale if scale is not None else 1.0, bias=bias if bias is not None else 0.0)
        return
    steps: list[tuple[str, float | Ref, bool]] = []
    if scale is not None:
        steps.append(("mult", scale, False))
    if bias is not None:
        steps.append(("add", bias, False))
    if ep.relu:
        steps.append(("max", 0.0, False))
    tensor_scalar(ctx, out, psum, steps)


# -- convolution ----------------------------------------------------------------------------------


def lower_convolution(ctx: Context, op: Op) -> None:
    x, w = op.operands
    geo, ch = WindowGeometry.of(op.attrs), ConvChannels.of(op.attrs)
    ep = epilogue(ctx, op)
    target = op
    if ep is not None:  # the evacuation writes the value of the chain's last op
        target = ep.result
        for fused in ep.fused:
            ctx.lowered_with[fused.index] = op.index
    ctx.define(target)
    dtype = x.dtype
    x_tiles = tiles_of(x.shape, Layout.ROW)
    out_tiles = tiles_of(op.shape, Layout.ROW)
    w_name = ctx.ensure_hbm(w)
    w_tensor = ctx.hbm_tensors.get(w_name)
    w_shape = w_tensor.shape if w_tensor is not None else ctx.hbm_views[w_name].shape
    w_rows = tile_grid(w_shape, Layout.ROW)[1]
    w_queue = ctx.load_queue(ctx.values[w.index])
    w_dtype = w_tensor.dtype if w_tensor is not None else w.dtype
    run = (None if w_tensor is not None
           else ctx.hbm_views[w_name].run_elements * w.dtype.itemsize)
    k_total = geo.k_total
    offsets = geo.offsets()
    cuts = bands(geo, band_budget(ctx, dtype))
    weight_bytes = (ch.n_group_blocks * ch.n_oblocks * math.ceil(ch.cb / P) * k_total * P
                    * w.dtype.itemsize)
    keep_weights = ((x.shape[0] > 1 or len(cuts) > 1)
                    and weight_bytes <= WEIGHT_CACHE_FRACTION * ctx.spec.sbuf_bytes_per_partition)
    cached: dict[tuple[int, int, int, int], Ref] = {}
    evac = _alternating()
    copies = _alternating()
    for n in range(x.shape[0]):
        for band in cuts:
            blocks = _band_blocks(geo, band, BANK_COLS)
            groups = [blocks[i:i + GROUP_BANKS] for i in range(0, len(blocks), GROUP_BANKS)]
            inputs: dict[int, _Input] = {}
            for gb in range(ch.n_group_blocks):
                pieces = channel_pieces(x.shape, x_tiles, n, gb * ch.cb, (gb + 1) * ch.cb)
                for piece in pieces:
                    if piece.t not in inputs:
                        inputs[piece.t] = _prepare(ctx, x, piece.t, geo, band, 0.0, copies)
                        _repin(ctx, [i.ref for i in inputs.values()] + list(cached.values()))
                for ob in range(ch.n_oblocks):
                    weights = []
                    for piece in pieces:
                        key = (gb, ob, piece.local, piece.p)
                        ref = cached.get(key)
                        if ref is None:
                            buf = ctx.alloc(piece.p + piece.rows, k_total * P, w.dtype,
                                            f"{w.name}.blk")
                            ref = Ref(buf.id, piece.p, piece.p + piece.rows, 0, k_total * P)
                            access = batch_rows_access(w_name, w_shape, gb, piece.local,
                                                       piece.local + piece.rows, ob * k_total * P,
                                                       (ob + 1) * k_total * P)
                            ctx.dma_load(w_queue, access, ref, w_dtype, rows_per_batch=w_rows,
                                         run_bytes=run)
                            if keep_weights:
                                cached[key] = ref
                        weights.append(ref)
                    held = [i.ref for i in inputs.values()] + weights + list(cached.values())
                    o0 = gb * ch.ob + ob * P
                    o1 = gb * ch.ob + min(ch.ob, (ob + 1) * P)
                    for out_piece in channel_pieces(op.shape, out_tiles, n, o0, o1):
                        channel = o0 + out_piece.local
                        epi = [_channel_scalar(ctx, vec, channel, out_piece)
                               for vec in ((ep.scale, ep.bias) if ep is not None else (None, None))]
                        scalars = [ref for ref, _ in epi if ref is not None]
                        for group in groups:
                            _accumulate(ctx, target, geo, group, pieces, weights, inputs, offsets,
                                        out_piece, dtype, evac, ep, epi[0][1], epi[1][1])
                            _repin(ctx, held + scalars)
                        for scalar in scalars:
                            ctx.free(ctx.buffers[scalar.buf])
                        _repin(ctx, held)
                    if not keep_weights:
                        for ref in weights:
                            ctx.free(ctx.buffers[ref.buf])
                        _repin(ctx, [i.ref for i in inputs.values()] + list(cached.values()))
            for prepared in inputs.values():
                _done(ctx, x, prepared)
            _repin(ctx, list(cached.values()))
    for ref in cached.values():
        ctx.free(ctx.buffers[ref.buf])
    ctx.unpin_all()


def _accumulate(ctx: Context, op: Op, geo: WindowGeometry, group: list[OutputBlock],
                pieces: list[Piece], weights: list[Ref], inputs: dict[int, _Input],
                offsets: list[tuple[int, ...]], out_piece: Piece, dtype: DType,
                evac: Iterator[Engine], ep: Epilogue | None = None, scale: Ref | None = None,
                bias: Ref | None = None) -> None:
    """Up to four PSUM banks of output positions for the output channels of ``out_piece``: every
    (input piece, kernel offset) product accumulated, then the banks evacuated into ``op``'s
    value (the convolution's, or its fused epilogue's last op's)."""
    banks = [ctx.alloc_psum(P, BANK_COLS, f"{op.name}.psum") for _ in group]
    rows_out = out_piece.rows
    p_out = out_piece.p
    col0 = out_piece.local  # the piece's first column within its weight block
    total = len(pieces) * len(offsets)
    step = 0
    for piece, wref in zip(pieces, weights):
        prepared = inputs[piece.t]
        source = Ref(prepared.ref.buf, piece.p, piece.p + piece.rows, prepared.ref.f0, prepared.ref.f1)
        for k, offset in enumerate(offsets):
            stationary = Ref(wref.buf, piece.p, piece.p + piece.rows, k * P + col0,
                             k * P + col0 + rows_out)
            ldweights(ctx, stationary, dtype, pad=p_out)
            position = Accumulation.of(step, total)
            for bank, block in zip(banks, group):
                first, pattern = _pattern(geo, prepared, block, offset)
                moving = ApRef(prepared.ref.buf, piece.p, piece.p + piece.rows, first, pattern)
                _matmul(ctx, Ref(bank.id, p_out, p_out + rows_out, 0, block.count), moving, source,
                        dtype, position)
            step += 1
    for bank, block in zip(banks, group):
        psum = Ref(bank.id, p_out, p_out + rows_out, 0, block.count)
        c0, c1 = block.start, block.start + block.count
        out = ctx.produce(op, out_piece.t, c0, c1, (p_out, p_out + rows_out))
        shortcut = None
        if ep is not None and ep.residual is not None:
            tile = ctx.tile(ep.residual, out_piece.t, cols=(c0, c1))
            shortcut = Ref(tile.buf, tile.p0 + p_out, tile.p0 + p_out + rows_out, tile.f0, tile.f1)
        _evacuate(ctx, out, psum, next(evac), ep, scale, bias, shortcut)
        if ep is not None and ep.residual is not None and shortcut is not None:
            ctx.release(ep.residual, tile)
        ctx.produced(op, out_piece.t, out, c0, c1)
        ctx.free(bank)


# -- pooling --------------------------------------------------------------------------------------


def lower_reduce_window(ctx: Context, op: Op) -> None:
    """Max / sum pooling: per tile and band, the input placed once (border ``fill``), then one copy
    and one Vector combine per further window offset, each reading the offset's access pattern."""
    x = op.operands[0]
    geo = WindowGeometry.of(op.attrs)
    alu = "max" if op.attrs["kind"] == "max" else "add"
    fill = float(op.attrs["fill"])
    value = ctx.define(op)
    copies = _alternating()
    inner = math.prod(geo.out[1:])
    for t in range(len(value.tiles)):
        for band in bands(geo, band_budget(ctx, x.dtype)):
            prepared = _prepare(ctx, x, t, geo, band, fill, copies)
            c0, c1 = band.out0 * inner, band.out1 * inner
            out = ctx.produce(op, t, c0, c1)
            block = OutputBlock(c0, c1 - c0, (band.out0, *(0,) * (len(geo.out) - 1)), 0,
                                band.out1 - band.out0)
            for k, offset in enumerate(geo.offsets()):
                first, pattern = _pattern(geo, prepared, block, offset)
                window = ApRef(prepared.ref.buf, out.p0, out.p1, first, pattern)
                if k == 0:
                    _copy(ctx, out, window, Engine.VECTOR)
                else:
                    _combine(ctx, alu, out, window)
            ctx.produced(op, t, out, c0, c1)
            _done(ctx, x, prepared)
            ctx.unpin_all()


__all__ = ["Band", "Epilogue", "OutputBlock", "bands", "channel_pieces", "epilogue",
           "lower_convolution", "lower_reduce_window", "output_blocks", "window_pattern"]
