"""Reversing a tensor along dims (torch's ``flip``, JAX's ``reverse``: ``x[::-1]``, ``jnp.flip``,
a descending ``jnp.sort``), shared by both frontends: each reversed dim is moved first and its rows
gathered at ``n - 1 - iota`` (one row gather, as ``index_select``), then moved back."""

from __future__ import annotations

import math
from collections.abc import Iterable

from neuroncore.dtypes import DType
from neuroncore.ir.builder import GraphBuilder
from neuroncore.ir.graph import Op


def flip(b: GraphBuilder, x: Op, dims: Iterable[int]) -> Op:
    """``x`` reversed along each of ``dims`` (non-negative); a dim of size 1 adds nothing."""
    rank = len(x.shape)
    for dim in sorted(set(dims)):
        n = x.shape[dim]
        if n == 1:
            continue
        order = [dim, *(i for i in range(rank) if i != dim)]
        moved = b.transpose(x, order) if dim else x
        rest = moved.shape[1:]
        backwards = b.add(b.multiply(b.iota((n,), 0, DType.INT32), -1.0), float(n - 1))
        rows = b.gather(b.reshape(moved, (n, math.prod(rest))), backwards)
        picked = b.reshape(rows, (n, *rest))
        x = b.transpose(picked, [order.index(i) for i in range(rank)]) if dim else picked
    return x
