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

Each function returns None for a form it does not cover; the caller reports the op unsupported.
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


def scatter_add(b: GraphBuilder, x: Op, indices: Op, updates: Op, dims: ScatterDims) -> Op | None:
    """``x`` with ``updates`` added at ``indices`` along one indexed dim (see the module doc)."""
    if len(dims.scatter_dims_to_operand_dims) != 1 or not x.dtype.is_float \
            or len(dims.input_batching_dims) != len(dims.scatter_indices_batching_dims):
        return None
    axis = dims.scatter_dims_to_operand_dims[0]
    rank, urank = len(x.shape), len(updates.shape)
    comps = _components(b, indices, dims.index_vector_dim, 1)
    if comps is None:
        return None
    index_dims = [d for d in range(len(indices.shape)) if d != dims.index_vector_dim]
    scatter_u = [d for d in range(urank) if d not in dims.update_window_dims]
    window = [d for d in range(rank) if d not in dims.inserted_window_dims
              and d not in dims.input_batching_dims]
    if len(window) != len(dims.update_window_dims) or len(scatter_u) != len(index_dims):
        return None
    source: dict[int, int] = {}  # operand dim (not the indexed one) -> the update dim that runs it
    for d in range(rank):
        if d in dims.input_batching_dims:
            given = dims.scatter_indices_batching_dims[dims.input_batching_dims.index(d)]
            u = scatter_u[index_dims.index(given)]
        elif d in window:
            u = dims.update_window_dims[window.index(d)]
        else:
            continue
        if d == axis:  # a window along the indexed dim: only a window of one element
            if updates.shape[u] != 1:
                return None
            continue
        if updates.shape[u] != x.shape[d]:
            return None  # a partial window: not covered
        source[d] = u
    if len(source) != rank - 1:
        return None
    updates = b.convert(updates, x.dtype) if updates.dtype is not x.dtype else updates
    size = x.shape[axis]
    others = [d for d in range(rank) if d != axis]
    summed = [u for u in range(urank) if u not in source.values()]
    if not dims.input_batching_dims:  # one-hot rows times the updates (accumulate_slots)
        kept = [source[d] for d in others]
        order = [*summed, *kept]
        moved = b.transpose(updates, order) if order != list(range(urank)) else updates
        n, rest = math.prod(updates.shape[u] for u in summed), math.prod(updates.shape[u] for u in kept)
        rows = b.reshape(moved, (n, rest))
        where = b.reshape(b.broadcast(comps[0], [updates.shape[u] for u in summed],
                                      [summed.index(u) for u in scatter_u]), (n,))
        positions = b.iota((n, size), 1, DType.INT32)
        onehot = b.convert(b.compare(positions, b.broadcast(where, (n, size), (0,)), "EQ"), x.dtype)
        added = b.dot(onehot, rows, lhs_contract=-2, rhs_contract=-2, out_dtype=x.dtype)  # [size, rest]
        added = b.reshape(added, (size, *(x.shape[d] for d in others)))
        back = list(np.argsort([axis, *others]))
        added = b.transpose(added, back) if back != list(range(rank)) else added
        return b.add(x, added)
    target = b.broadcast(comps[0], updates.shape, scatter_u)  # the indexed coordinate per update
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


__all__ = ["GatherDims", "ScatterDims", "gather", "scatter_add"]
