"""Reading a tensor at given positions along one dim (``take``) and reversing it (``flip``), shared
by both frontends. ``take`` moves the dim first, flattens the rest into a row and gathers the rows
(one row gather, as ``index_select``), then moves it back: torch's ``index_select``, and ``x[..., idx,
...]`` at constant positions that are no strided slice (reflection / replication padding,
``nearest-exact`` resizes, adaptive pooling windows). ``flip`` (torch's ``flip``, JAX's ``reverse``:
``x[::-1]``, ``jnp.flip``, a descending ``jnp.sort``) takes each reversed dim at ``n - 1 - iota``."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from neuroncore.dtypes import DType
from neuroncore.ir.builder import GraphBuilder
from neuroncore.ir.graph import Op


def take(b: GraphBuilder, x: Op, dim: int, ids: Op | Callable[[], Op]) -> Op:
    """``x``'s entries at positions ``ids`` (an int32 vector, or a function building it once the
    dim is moved: ``flip``'s ops in the order they always had) along ``dim`` (non-negative)."""
    rank = len(x.shape)
    order = [dim, *(i for i in range(rank) if i != dim)]
    moved = b.transpose(x, order) if dim else x
    rest = moved.shape[1:]
    if not isinstance(ids, Op):
        ids = ids()
    rows = b.gather(b.reshape(moved, (moved.shape[0], math.prod(rest))), ids)
    picked = b.reshape(rows, (ids.shape[0], *rest))
    return b.transpose(picked, [order.index(i) for i in range(rank)]) if dim else picked


def take_constant(b: GraphBuilder, x: Op, dim: int, positions: Sequence[int], name: str) -> Op:
    """:func:`take` at positions known at trace time: a contiguous run is a slice, anything else
    one row gather at a constant index vector (stored like a buffer, named ``name``)."""
    seq = [int(p) for p in positions]
    step = seq[1] - seq[0] if len(seq) > 1 else 1
    if step > 0 and seq == list(range(seq[0], seq[0] + step * len(seq), step)):
        if seq == list(range(x.shape[dim])):
            return x
        starts, limits, strides = [0] * len(x.shape), list(x.shape), [1] * len(x.shape)
        starts[dim], limits[dim], strides[dim] = seq[0], seq[-1] + 1, step
        return b.slice(x, starts, limits, strides)
    ids = b.weight(name, (len(seq),), DType.INT32, array=np.asarray(seq, np.float32))
    return take(b, x, dim, ids)


def place_constant(b: GraphBuilder, x: Op, dim: int, positions: Sequence[int], size: int,
                   name: str) -> Op:
    """The transpose of :func:`take_constant` (a gradient going back to where it was read): ``x``'s
    entry ``i`` along ``dim`` added at ``positions[i]`` of a zero tensor ``size`` long there, one
    contraction of ``dim`` (moved last) with a constant one-hot ``[size, len(positions)]`` matrix on
    the Tensor engine (entries read twice add up)."""
    rank = len(x.shape)
    order = [d for d in range(rank) if d != dim] + [dim]
    moved = x if dim == rank - 1 else b.transpose(x, order)
    one_hot = np.zeros((size, len(positions)), np.float32)
    one_hot[np.asarray(positions, np.int64), np.arange(len(positions))] = 1.0
    matrix = b.weight(name, one_hot.shape, x.dtype, array=one_hot)
    flat = b.reshape(moved, (-1, len(positions)))
    placed = b.reshape(b.dot(flat, matrix, rhs_contract=-1, out_dtype=x.dtype),
                       (*moved.shape[:-1], size))
    return placed if dim == rank - 1 else b.transpose(placed, list(np.argsort(order)))


def _backwards(b: GraphBuilder, n: int) -> Op:
    """The positions ``n - 1 - iota`` (int32)."""
    return b.add(b.multiply(b.iota((n,), 0, DType.INT32), -1.0), float(n - 1))


def flip(b: GraphBuilder, x: Op, dims: Iterable[int]) -> Op:
    """``x`` reversed along each of ``dims`` (non-negative); a dim of size 1 adds nothing."""
    for dim in sorted(set(dims)):
        n = x.shape[dim]
        if n == 1:
            continue
        x = take(b, x, dim, functools.partial(_backwards, b, n))
    return x
