"""On-chip views: a reshape / transpose / slice / broadcast of a value that lives in SBUF is read in
place, or assembled by engine copies, instead of being stored to HBM and read back through a view.

Why: neuronx-cc splits and merges attention heads without touching HBM. Splitting ``[S, H*D]`` into
heads ``[H, S, D]`` leaves every row on its partition: head ``h`` is the column block
``[h*D, (h+1)*D)`` of the same tile, which an engine (or the PE) reads through its access pattern at
no cost (neuroncore.md §2.4: access patterns take any start, stride and zero strides on the free
dims). Merging heads back is the same blocks written side by side: one copy per head on the Scalar
and Vector engines, each partition staying on its partition (engines never move data across
partitions; that takes the PE or a DMA). Going through HBM instead costs a store, a strided load
with one descriptor per 64-element run, and a wait in the Sync queue that holds up the next weight
prefetch behind it.

How: the view chain from the op back to a value with its own SBUF tiles (the *root*) is composed as
an index map (``np.arange`` of the root's elements pushed through each step), and each output tile
is checked against the root's tiling: one rectangular block of one root tile with the rows on
partitions ``0..rows`` is a *slice* (read in place, ``Value.slices``); several blocks that keep every
row on its partition are *copied* into the view's own tiles. Anything else (rows moving across
partitions, a root in HBM) stays an HBM view, as before.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import pairwise

import numpy as np

from neuroncore.compiler.context import Context, Value
from neuroncore.compiler.lower_elementwise import tensor_copy
from neuroncore.compiler.lowering_state import Layout
from neuroncore.compiler.program import Ref
from neuroncore.compiler.tiling import P, is_packed, tile_grid, tiles_of
from neuroncore.enums import Memory
from neuroncore.hardware import Engine
from neuroncore.ir.graph import LAYOUT_OPS, Op

CHAIN_OPS = frozenset({"reshape", "transpose", "slice", "broadcast"})
MAX_INDEX_ELEMENTS = 1 << 22  # index maps larger than this are not built (compile time) [assumption]
MAX_COPIES_PER_TILE = 64  # more blocks than this per tile: not worth engine copies [assumption]
MIN_COPY_COLUMNS = 16  # narrower blocks are left to the DMA path [assumption]

Block = tuple[int, int, int, int, int]  # (root tile, p0, p1, c0, c1)


def _is_virtual(ctx: Context, value: Value) -> bool:
    """Whether a value is only a view of others (no tiles of its own)."""
    return (value.alias is not None or value.slices is not None or value.lazy is not None
            or (value.home is Memory.HBM and (value.hbm or "") in ctx.hbm_views))


def _is_root(value: Value) -> bool:
    return (value.home is Memory.SBUF and value.immediate is None and value.lazy is None
            and value.alias is None and value.slices is None and value.layout == Layout.ROW
            and len(value.op.shape) >= 1)


def _step(x: Op, a: np.ndarray) -> np.ndarray:
    """Push an index array of ``x``'s operand through ``x``."""
    code = x.opcode
    if code == "reshape":
        return a.reshape(x.shape)
    if code == "transpose":
        return a.transpose(tuple(x.attrs["permutation"]))
    if code == "slice":
        return a[tuple(slice(s, e, st) for s, e, st in
                       zip(x.attrs["starts"], x.attrs["limits"], x.attrs["strides"]))]
    dims = tuple(x.attrs["dims"])  # broadcast: operand dim i is output dim dims[i]
    order = sorted(range(len(dims)), key=lambda i: dims[i])
    a = a.transpose(order) if dims else a.reshape(())
    expanded = [1] * len(x.shape)
    for i, d in enumerate(sorted(dims)):
        expanded[d] = a.shape[i]
    return np.broadcast_to(a.reshape(expanded), x.shape)


def index_map(ctx: Context, op: Op) -> tuple[Op, np.ndarray, bool] | None:
    """(root, flat root index of every element of ``op``, whether a broadcast is on the way), or
    None when the chain does not end at a value with its own SBUF tiles."""
    found = _index_chain(ctx, op)
    return None if found is None else found[:3]


def _index_chain(ctx: Context, op: Op) -> tuple[Op, np.ndarray, bool, np.ndarray] | None:
    """:func:`index_map` plus the ``arange`` the index was pushed from (a strided view of it is an
    affine map, which :func:`_tile_blocks` checks without visiting every element)."""
    chain = [op]
    x = op.operands[0]
    while x.opcode in CHAIN_OPS and len(x.operands) == 1:
        value = ctx.values.get(x.index)
        if value is None or not _is_virtual(ctx, value):
            break
        chain.append(x)
        x = x.operands[0]
    root_value = ctx.values.get(x.index)
    if root_value is None or not _is_root(root_value):
        return None
    if root_value.op.size > MAX_INDEX_ELEMENTS or op.size > MAX_INDEX_ELEMENTS:
        return None
    # int32: half the bytes of int64 to push through the steps (at most MAX_INDEX_ELEMENTS)
    base = np.arange(root_value.op.size, dtype=np.int32)
    index = base.reshape(root_value.op.shape)
    for step in reversed(chain):
        index = _step(step, index)
    return root_value.op, index, any(s.opcode == "broadcast" for s in chain), base


def _first_rows_of_view(index: np.ndarray, base: np.ndarray, root_cols: int
                        ) -> tuple[bool, np.ndarray | None]:
    """(whether ``index`` is a strided view of ``base``, at least 2-D; the root indices of the
    first row of every output tile ``[tiles, cols]`` if its rows step one root row at a time, else
    None: then some tile's second row is not the root row after its first, and no block applies).

    A view of ``arange`` holds, at every element, its own offset into ``base``: along the row dim
    the values step by ``strides[-2]`` elements everywhere. So "row ``r`` of a tile is the root row
    after row ``r - 1`` in every column" is one comparison of that stride with the root's row
    length, not one per element (a 70B layer's attention slices are millions of elements each).
    A copy on the way (a reshape numpy could not express as strides) is not a view: (False, None)."""
    if index.ndim < 2 or not np.may_share_memory(index, base):
        return False, None
    rows = index.shape[-2]
    if rows > 1 and index.strides[-2] != root_cols * base.itemsize:
        return True, None
    first = index[..., range(0, rows, P), :]
    return True, first.reshape(-1, index.shape[-1])


def _tile_blocks(root: Op, index: np.ndarray, shape: tuple[int, ...], base: np.ndarray | None = None
                 ) -> tuple[list[Block] | None, list[list[tuple[int, Block]]] | None]:
    """Per output tile: its single root block (slices), or else its column runs that keep every row
    on its partition (copies, as (output column, block)); None where neither applies.

    With ``base`` (the ``arange`` ``index`` was pushed from) and a strided view of it, only each
    tile's first row is examined (:func:`_first_rows_of_view`): the answer is the same as visiting
    every element (tests/neuroncore/test_onchip_view_blocks.py compares the two)."""
    _, root_rows, root_cols = tile_grid(root.shape, Layout.ROW)
    tiles_per_batch = math.ceil(root_rows / P)
    out_batches, out_rows, out_cols = tile_grid(shape, Layout.ROW)
    spans = [(b * out_rows + r0, b * out_rows + min(out_rows, r0 + P))
             for b in range(out_batches) for r0 in range(0, out_rows, P)]
    view, first = False, None
    if base is not None and not is_packed(shape, Layout.ROW):
        view, first = _first_rows_of_view(index, base, root_cols)
        if view and first is None:
            return None, None
    if first is None:
        # not a strided view (a copy on the way), or no ``base``: every element is visited, with
        # the same test the stride makes, row by row: within a tile, each row is the root row after
        # the row above it in every column (the element one root row further on); the first rows
        # are then checked below as a view's are
        grid = index.reshape(out_batches, out_rows, out_cols)
        if out_rows > 1:
            step = grid[:, 1:, :] - grid[:, :-1, :]
            step[:, P - 1::P, :] = root_cols  # a tile's first row may come from anywhere
            if not (step == root_cols).all():
                return None, None
        first = grid[:, ::P, :].reshape(-1, out_cols)
    # each tile's rows step one root row at a time: they are on their partitions and from one root
    # tile iff its first row is on partition 0 of a root tile and the tile's rows stay inside the
    # root's batch
    rowflat, first_cl = np.divmod(first, root_cols)
    rb, rr = np.divmod(rowflat, root_rows)
    lengths = np.array([hi - lo for lo, hi in spans])
    if not ((rr % P == 0).all() and (rr + lengths[:, None] <= root_rows).all()):
        return None, None
    first_st = rb * tiles_per_batch + rr // P
    contiguous = (first_st[:, 1:] == first_st[:, :-1]) & (first_cl[:, 1:] == first_cl[:, :-1] + 1)
    if contiguous.all():
        return [(int(first_st[i, 0]), 0, hi - lo, int(first_cl[i, 0]), int(first_cl[i, 0]) + out_cols)
                for i, (lo, hi) in enumerate(spans)], None
    copies: list[list[tuple[int, Block]]] = []
    for i, (lo, hi) in enumerate(spans):
        cuts = [0, *(np.flatnonzero(~contiguous[i]) + 1).tolist(), out_cols]
        if len(cuts) - 1 > MAX_COPIES_PER_TILE or min(np.diff(cuts)) < MIN_COPY_COLUMNS:
            return None, None
        copies.append([(c0, (int(first_st[i, c0]), 0, hi - lo, int(first_cl[i, c0]),
                             int(first_cl[i, c0]) + c1 - c0)) for c0, c1 in pairwise(cuts)])
    return None, copies


def _swaps_last_two(op: Op) -> bool:
    """A transpose of the last two dims reads its source's tiles (on the PE), not a view of it."""
    if op.opcode != "transpose":
        return False
    perm = tuple(op.attrs["permutation"])
    n = len(perm)
    return n >= 2 and perm == (*range(n - 2), n - 1, n - 2)


def on_chip_view(ctx: Context, op: Op, view_name: str,
                 hbm_fallback: Callable[[Context], None]) -> bool:
    """Lower ``op`` (a view) on chip if its chain ends at an SBUF value; False to use HBM.

    Views only read by other views are left to their readers (which compose the whole chain), so
    nothing is copied for an intermediate step of a head merge.
    """
    if op.opcode not in CHAIN_OPS or not op.shape:
        return False
    users = [ctx.graph.ops[u] for u in ctx.uses[op.index]]
    if not users or all(u.opcode in LAYOUT_OPS and not _swaps_last_two(u) for u in users):
        return False
    found = _index_chain(ctx, op)
    if found is None:
        return False
    root, index, broadcast, base = found
    slices, copies = _tile_blocks(root, index, op.shape, base)
    if slices is not None:
        value = ctx.define(op, home=Memory.SBUF, hbm=view_name)
        value.slices, value.slice_root, value.hbm_fallback = slices, root, hbm_fallback
        ctx.extend_uses(root, op)
        ctx.stats["on_chip_views"] = ctx.stats.get("on_chip_views", 0) + 1
        return True
    if copies is None or broadcast:
        return False
    _, _, cols = tile_grid(op.shape, Layout.ROW)
    if len(copies) * cols * op.dtype.itemsize > ctx.hbm_home_bytes:
        return False  # too large to keep on chip: its home would be HBM anyway
    ctx.define(op, home=Memory.SBUF)
    _copy_blocks(ctx, op, root, copies)
    ctx.stats["on_chip_view_copies"] = ctx.stats.get("on_chip_view_copies", 0) + 1
    return True


def concatenate_on_chip(ctx: Context, op: Op) -> bool:
    """A concatenation along the last dim of values that all live in SBUF, row-tiled alike, is
    assembled on chip: each output tile is its operands' tiles side by side, one engine copy per
    operand (Scalar and Vector in turn), every row staying on its partition. Without this it went
    through HBM: every operand stored, then read back through a view (rotary embedding's
    ``cat(first, second)`` of each head, the fused projections' gradient ``cat(dq, dk, dv)``).
    False leaves the HBM view (an operand in HBM, feature-major or of another tiling, fewer than
    128 rows per batch, or an output too large to keep on chip)."""
    if op.opcode != "concatenate" or not op.shape or op.attrs["dimension"] != len(op.shape) - 1:
        return False
    if op.index in ctx.orientation.members or op.dtype.itemsize == 0:
        return False
    out_tiles = tiles_of(op.shape, Layout.ROW)
    for operand in op.operands:
        value = ctx.values[operand.index]
        if (not _is_root(value) or value.transposed or operand.dtype != op.dtype
                or tiles_of(operand.shape, Layout.ROW) != out_tiles or value.tiles != out_tiles):
            return False
    _, rows, cols = tile_grid(op.shape, Layout.ROW)
    if rows < P or len(out_tiles) * cols * op.dtype.itemsize > ctx.hbm_home_bytes:
        return False  # decode-sized rows (tiles shared by batches: their readers' reshapes) or too big
    ctx.define(op, home=Memory.SBUF)
    engines = (Engine.SCALAR, Engine.VECTOR)
    n = 0
    for t in range(len(out_tiles)):
        out = ctx.produce(op, t)
        c0 = 0
        for operand in op.operands:
            width = operand.shape[-1]
            src = ctx.tile(operand, t)
            dst = Ref(out.buf, out.p0, out.p1, out.f0 + c0, out.f0 + c0 + width)
            tensor_copy(ctx, dst, Ref(src.buf, src.p0, src.p1, src.f0, src.f0 + width), engines[n % 2])
            ctx.release(operand, src)
            c0 += width
            n += 1
        ctx.produced(op, t, out)
        ctx.unpin_all()
    ctx.stats["on_chip_concatenations"] = ctx.stats.get("on_chip_concatenations", 0) + 1
    return True


def _copy_blocks(ctx: Context, op: Op, root: Op, copies: list[list[tuple[int, Block]]]) -> None:
    engines = (Engine.SCALAR, Engine.VECTOR)
    n = 0
    for t, runs in enumerate(copies):
        out = ctx.produce(op, t)
        for c_out, (st, p0, p1, c0, c1) in runs:
            src = ctx.tile(root, st)
            block = Ref(src.buf, src.p0 + p0, src.p0 + p1, src.f0 + c0, src.f0 + c1)
            dst = Ref(out.buf, out.p0 + p0, out.p0 + p1, out.f0 + c_out, out.f0 + c_out + c1 - c0)
            tensor_copy(ctx, dst, block, engines[n % 2])
            n += 1
            ctx.release(root, src)
        ctx.produced(op, t, out)
        ctx.unpin_all()
