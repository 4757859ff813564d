"""XLA ``gather`` and ``scatter`` (add) beyond the embedding row lookup, as IR ops.

What JAX emits for ``jnp.take_along_axis`` (optax's ``softmax_cross_entropy_with_integer_labels``:
a gather with batching dims, ``operand_batching_dims={0}``), ``x.take(i, axis)`` and their
gradients, scatter-adds into zeros. They are lowered the way the PyTorch frontend lowers
``aten.gather`` and ``scatter_add`` (``torch_masks.gather_elements``, ``torch_scatter.reduce_into``
and ``accumulate_slots``), so both frameworks' cross-entropy compile to the same instructions:

* a gather is one row gather from the operand flattened to ``[size, 1]``, at the flat offset of
  every output element (start indices clamped into range, as XLA clamps them);
* a scatter-add along one indexed dim either multiplies a one-hot ``[updates, size]`` matrix into
  the updates (no batching dims: an embedding's gradient, on the Tensor engine), or selects each
  position's updates with a mask ``[*updates, size]`` and sums them (batching dims: the gradient of
  ``take_along_axis``). Out-of-range updates match no position and are dropped, as XLA drops them.
  Indices may address several dims (``x.at[i, j].add(v)``: the positions of the indexed dims are
  one flattened dim of the one-hot, an index outside any of them dropped).
* ``.at[idx].set/mul/max/min`` (``scatter_update``) write one update at a time, a select over the
  operand each, as ``torch_scatter.write_slots`` writes runtime slots (at most ``MAX_SLOTS``).

Each function returns None for a form it does not cover; the caller reports the op unsupported.

Not shared with the PyTorch frontend's functions, though they compute the same things: those take
the torch converter (``c._cast``, negative-index normalisation) and emit their ops in another order
(``accumulate_slots`` makes the iota before the targets, ``gather_elements`` casts and broadcasts
each coordinate), so one function for both would change the op order, hence the programs, of one
framework's models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from neuroncore.dtypes import DType
from neuroncore.ir.builder import GraphBuilder
from neuroncore.ir.graph import Op


@dataclass(frozen=True)
class GatherDims:
    """The dimension numbers of an XLA gather (HLO attribute names)."""

    offset_dims: tuple[int, ...]
    collapsed_slice_dims: tuple[int, ...]
    start_index_map: tuple[int, ...]
    operand_batching_dims: tuple[int, ...]
    start_indices_batching_dims: tuple[int, ...]
    index_vector_dim: int
    slice_sizes: tuple[int, ...]


@dataclass(frozen=True)
class ScatterDims:
    """The dimension numbers of an XLA scatter (HLO attribute names)."""

    update_window_dims: tuple[int, ...]
    inserted_window_dims: tuple[int, ...]
    scatter_dims_to_operand_dims: tuple[int, ...]
    input_batching_dims: tuple[int, ...]
    scatter_indices_batching_dims: tuple[int, ...]
    index_vector_dim: int


def _components(b: GraphBuilder, indices: Op, vector_dim: int, n: int) -> list[Op] | None:
    """The ``n`` start-index components of ``indices`` (int32, each of the batch shape: the indices'
    shape without ``vector_dim``), or None when the vector dim does not hold ``n`` of them."""
    rank = len(indices.shape)
    if indices.dtype is not DType.INT32:
        if indices.dtype.is_float:
            return None
        indices = b.convert(indices, DType.INT32)
    if vector_dim == rank:
        return [indices] if n == 1 else None
    if indices.shape[vector_dim] != n:
        return None
    batch = tuple(d for i, d in enumerate(indices.shape) if i != vector_dim)
    out = []
    for k in range(n):
        starts = [0] * rank
        limits = list(indices.shape)
        starts[vector_dim], limits[vector_dim] = k, k + 1
        piece = b.slice(indices, starts, limits) if n > 1 else indices
        out.append(b.reshape(piece, batch))
    return out


def gather(b: GraphBuilder, x: Op, indices: Op, dims: GatherDims, shape: tuple[int, ...]) -> Op | None:
    """``x`` gathered as XLA does, element by element (see the module doc)."""
    rank, out_rank = len(x.shape), len(shape)
    comps = _components(b, indices, dims.index_vector_dim, len(dims.start_index_map))
    if comps is None or len(dims.slice_sizes) != rank \
            or len(dims.operand_batching_dims) != len(dims.start_indices_batching_dims):
        return None
    batch_out = [d for d in range(out_rank) if d not in dims.offset_dims]
    index_dims = [d for d in range(len(indices.shape)) if d != dims.index_vector_dim]
    window = [d for d in range(rank) if d not in dims.collapsed_slice_dims
              and d not in dims.operand_batching_dims]
    if len(window) != len(dims.offset_dims) or len(batch_out) != len(index_dims) or not comps \
            or any(shape[o] != dims.slice_sizes[w] for o, w in zip(dims.offset_dims, window)) \
            or any(shape[o] != indices.shape[i] for o, i in zip(batch_out, index_dims)):
        return None
    flat: Op | None = None
    for d in range(rank):
        coord: Op | None = None
        if d in dims.start_index_map:
            start = b.broadcast(comps[dims.start_index_map.index(d)], shape, batch_out)
            high = x.shape[d] - dims.slice_sizes[d]  # XLA clamps the whole slice into range
            coord = b.maximum(b.minimum(start, float(high)), 0.0)
        elif d in dims.operand_batching_dims:
            source = dims.start_indices_batching_dims[dims.operand_batching_dims.index(d)]
            if x.shape[d] != indices.shape[source]:
                return None
            coord = b.iota(shape, batch_out[index_dims.index(source)], DType.INT32)
        if d in window:
            offset = b.iota(shape, dims.offset_dims[window.index(d)], DType.INT32)
            coord = offset if coord is None else b.add(coord, offset)
        if coord is None:
            continue  # a collapsed dim nothing indexes: position 0
        stride = math.prod(x.shape[d + 1:])
        term = coord if stride == 1 else b.multiply(coord, float(stride))
        flat = term if flat is None else b.add(flat, term)
    if flat is None:
        flat = b.broadcast(b.constant(0.0, DType.INT32), shape, ())
    table = b.reshape(x, (max(x.size, 1), 1))
    return b.reshape(b.gather(table, flat), shape)


MAX_SLOTS = 64  # non-accumulating runtime updates, one select per slot: torch_scatter.MAX_SLOTS's rule


@dataclass(frozen=True)
class _ScatterLayout:
    """Where a scatter's updates go: the operand dims its indices address (``axes``, in operand
    order, with each one's index component), and for every other operand dim the update dim that
    runs along it whole (``source``); ``summed``: the update dims that enumerate the updates."""

    axes: tuple[int, ...]
    comps: tuple[Op, ...]
    source: dict[int, int]
    summed: tuple[int, ...]
    scatter_u: tuple[int, ...]


def _scatter_layout(b: GraphBuilder, x: Op, indices: Op, updates: Op,
                    dims: ScatterDims) -> _ScatterLayout | None:
    """The layout of a scatter whose windows are single elements along the indexed dims and whole
    along every other dim (``.at[i].op(rows)``, ``.at[i, j].op(v)``, ``.at[:, j].op(cols)``, an
    embedding's gradient), with batching dims (``take_along_axis``'s gradient) or without; None for
    any other (a partial window)."""
    k = len(dims.scatter_dims_to_operand_dims)
    if k == 0 or len(dims.input_batching_dims) != len(dims.scatter_indices_batching_dims) \
            or len(set(dims.scatter_dims_to_operand_dims)) != k:
        return None
    rank, urank = len(x.shape), len(updates.shape)
    comps = _components(b, indices, dims.index_vector_dim, k)
    if comps is None:
        return None
    index_dims = [d for d in range(len(indices.shape)) if d != dims.index_vector_dim]
    scatter_u = [d for d in range(urank) if d not in dims.update_window_dims]
    window = [d for d in range(rank) if d not in dims.inserted_window_dims
              and d not in dims.input_batching_dims]
    if len(window) != len(dims.update_window_dims) or len(scatter_u) != len(index_dims):
        return None
    axes = dims.scatter_dims_to_operand_dims
    source: dict[int, int] = {}  # operand dim (not an indexed one) -> the update dim that runs it
    for d in range(rank):
        if d in dims.input_batching_dims:
            given = dims.scatter_indices_batching_dims[dims.input_batching_dims.index(d)]
            u = scatter_u[index_dims.index(given)]
        elif d in window:
            u = dims.update_window_dims[window.index(d)]
        else:
            continue
        if d in axes:  # a window along an indexed dim: only a window of one element
            if updates.shape[u] != 1:
                return None
            continue
        if updates.shape[u] != x.shape[d]:
            return None  # a partial window: not covered
        source[d] = u
    if len(source) != rank - k:
        return None
    order = sorted(range(k), key=lambda i: axes[i])
    summed = tuple(u for u in range(urank) if u not in source.values())
    return _ScatterLayout(tuple(axes[i] for i in order), tuple(comps[i] for i in order), source, summed,
                          tuple(scatter_u))


def _update_rows(b: GraphBuilder, x: Op, updates: Op, lay: _ScatterLayout) -> tuple[Op, Op, int, int]:
    """(the updates as ``[n, rest]`` rows, each one update's window over the operand's other dims;
    the flat position of each row among the indexed dims' ``P`` positions; n; P). An update whose
    index is outside any indexed dim gets position -1 (it matches nothing and is dropped, as XLA
    drops out-of-bounds updates)."""
    urank = len(updates.shape)
    others = [d for d in range(len(x.shape)) if d not in lay.axes]
    summed = list(lay.summed)
    kept = [lay.source[d] for d in others]
    order = [*summed, *kept]
    moved = b.transpose(updates, order) if order != list(range(urank)) else updates
    n, rest = math.prod(updates.shape[u] for u in summed), math.prod(updates.shape[u] for u in kept)
    rows = b.reshape(moved, (n, rest))
    position: Op | None = None
    if len(lay.axes) == 1:
        position = lay.comps[0]  # out of range matches no position of the one dim
    else:
        valid: Op | None = None
        for axis, comp in zip(lay.axes, lay.comps):
            size = x.shape[axis]
            stride = math.prod(x.shape[a] for a in lay.axes if a > axis)
            term = comp if stride == 1 else b.multiply(comp, float(stride))
            position = term if position is None else b.add(position, term)
            inside = b.minimum(b.compare(comp, 0.0, "GE"), b.compare(comp, float(size), "LT"))
            valid = inside if valid is None else b.minimum(valid, inside)
        assert position is not None and valid is not None
        position = b.select(valid, position, -1.0)
    assert position is not None
    where = b.reshape(b.broadcast(position, [updates.shape[u] for u in summed],
                                  [summed.index(u) for u in lay.scatter_u]), (n,))
    return rows, where, n, math.prod(x.shape[a] for a in lay.axes)


def _to_operand(b: GraphBuilder, x: Op, value: Op, lay: _ScatterLayout) -> Op:
    """A ``[P, rest]`` value (indexed positions, then the other dims) in the operand's layout."""
    rank = len(x.shape)
    others = [d for d in range(rank) if d not in lay.axes]
    value = b.reshape(value, (*(x.shape[a] for a in lay.axes), *(x.shape[d] for d in others)))
    back = list(np.argsort([*lay.axes, *others]))
    return b.transpose(value, back) if back != list(range(rank)) else value


def scatter_add(b: GraphBuilder, x: Op, indices: Op, updates: Op, dims: ScatterDims) -> Op | None:
    """``x`` with ``updates`` added at ``indices`` (see the module doc): along one or more indexed
    dims, elements or whole windows of the other dims."""
    if not x.dtype.is_float:
        return None
    lay = _scatter_layout(b, x, indices, updates, dims)
    if lay is None or (dims.input_batching_dims and len(lay.axes) != 1):
        return None
    updates = b.convert(updates, x.dtype) if updates.dtype is not x.dtype else updates
    rank, urank = len(x.shape), len(updates.shape)
    source, summed = lay.source, list(lay.summed)
    if not dims.input_batching_dims:  # one-hot rows times the updates (accumulate_slots)
        rows, where, n, size = _update_rows(b, x, updates, lay)
        positions = b.iota((n, size), 1, DType.INT32)
        onehot = b.convert(b.compare(positions, b.broadcast(where, (n, size), (0,)), "EQ"), x.dtype)
        added = b.dot(onehot, rows, lhs_contract=-2, rhs_contract=-2, out_dtype=x.dtype)  # [size, rest]
        return b.add(x, _to_operand(b, x, added, lay))
    axis = lay.axes[0]
    size = x.shape[axis]
    target = b.broadcast(lay.comps[0], updates.shape, list(lay.scatter_u))  # the indexed coordinate
    wide = (*updates.shape, size)  # a mask: update element u lands on position p of the axis
    all_u = list(range(urank))
    hit = b.compare(b.iota(wide, urank, DType.INT32), b.broadcast(target, wide, all_u), "EQ")
    values = b.select(hit, b.broadcast(updates, wide, all_u), 0.0)
    total = b.reduce(values, summed, "sum") if summed else values
    left = [u for u in range(urank) if u not in summed]  # the result's dims, then the axis
    owner = {u: d for d, u in source.items()}
    arranged = [owner[u] for u in left] + [axis]
    back = [arranged.index(d) for d in range(rank)]
    total = b.transpose(total, back) if back != list(range(rank)) else total
    return b.add(x, total)


_COMBINE = {"set": None, "prod": "multiply", "max": "maximum", "min": "minimum"}


def scatter_update(b: GraphBuilder, x: Op, indices: Op, updates: Op, dims: ScatterDims,
                   combine: str) -> Op | None:
    """``x.at[idx].set/mul/max/min(updates)`` (no batching dims): each update is one select over
    the operand, in order (``out = where(at(idx[j]), combine(out, update[j]), out)``), as
    torch_scatter writes runtime slots: later updates of a position win for ``set`` (XLA applies
    them in order on CPU; JAX leaves the order of duplicates unspecified), duplicates multiply /
    take the extreme for the others; indices outside the operand match nothing (dropped).
    At most ``MAX_SLOTS`` updates; None otherwise."""
    if combine not in _COMBINE or dims.input_batching_dims:
        return None
    lay = _scatter_layout(b, x, indices, updates, dims)
    if lay is None:
        return None
    n = math.prod(updates.shape[u] for u in lay.summed)
    if n > MAX_SLOTS:
        return None
    updates = b.convert(updates, x.dtype) if updates.dtype is not x.dtype else updates
    rank = len(x.shape)
    others = [d for d in range(rank) if d not in lay.axes]
    summed = list(lay.summed)
    kept = [lay.source[d] for d in others]
    order = [*summed, *kept]
    moved = b.transpose(updates, order) if order != list(range(len(updates.shape))) else updates
    rows = b.reshape(moved, (n, *(x.shape[d] for d in others)))
    where = [b.reshape(b.broadcast(comp, [updates.shape[u] for u in summed],
                                   [summed.index(u) for u in lay.scatter_u]), (n,)) for comp in lay.comps]
    positions = [b.iota(x.shape, axis, DType.INT32) for axis in lay.axes]
    out = x
    for j in range(n):
        hit: Op | None = None
        for axis_position, at in zip(positions, where):
            target = b.broadcast(b.reshape(b.slice(at, [j], [j + 1]), ()), x.shape, ())
            same = b.compare(axis_position, target, "EQ")
            hit = same if hit is None else b.minimum(hit, same)
        assert hit is not None
        row = b.reshape(b.slice(rows, [j] + [0] * len(others), [j + 1, *(x.shape[d] for d in others)]),
                        tuple(x.shape[d] for d in others))
        value = b.broadcast(row, x.shape, others)
        fn = _COMBINE[combine]
        out = b.select(hit, value if fn is None else getattr(b, fn)(out, value), out)
    return out


__all__ = ["MAX_SLOTS", "GatherDims", "ScatterDims", "gather", "scatter_add", "scatter_update"]
