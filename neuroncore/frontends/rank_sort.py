"""A sort along one dim with no data-dependent control flow (``jnp.sort`` / ``argsort``,
``torch.sort`` / ``argsort``, ``lax.sort`` on several keys, ``jnp.lexsort``): element ``i``'s place
is the number of elements that go before it, ``rank_i = #{j: k_j < k_i} + #{j < i: k_j == k_i}``
(``>`` for a descending sort; stable: ties keep their order), one ``[.., n, n]`` compare and sum;
with several keys "before" is lexicographic, ``k0_j < k0_i``, or equal there and ``k1_j < k1_i``,
..., or equal on every key and ``j < i`` (one ``[.., n, n]`` compare pair per key). Every sorted
operand is then placed by a select where ``rank_i`` equals the output position and a sum over ``i``.

[assumption] NeuronCores have no sort instruction, and a static-shape sort compiles to
data-independent compare-and-select passes on the engines; this is one such form, costing ``n^2``
per sorted row (fine for routing and sampling rows, slow for long ones). Keys and values pass
through FP32 (integers exact below 2^24). A NaN key is ordered as +inf (JAX and torch order it
after +inf ascending, before it descending).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from neuroncore.dtypes import DType
from neuroncore.ir.graph import Op


def _grid(shape: Sequence[int], dim: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """The ``[.., n, n, ..]`` compare grid (axis ``dim``: element i or output place r, ``dim + 1``:
    j) and where ``shape``'s axes go in it as i and as j."""
    rank, n = len(shape), shape[dim]
    grid = (*shape[:dim + 1], n, *shape[dim + 1:])
    as_i = tuple(a if a <= dim else a + 1 for a in range(rank))
    as_j = tuple(a if a < dim else a + 1 for a in range(rank))
    return grid, as_i, as_j


def stable_ranks(b: Any, key: Op | Sequence[Op], dim: int, descending: bool = False,
                 j_first: bool = False) -> Op:
    """Each element's place in a stable sort of ``key`` along ``dim`` (FP32, the keys' shape; a
    sequence of keys: lexicographically, the first key first). ``j_first``: the compared-with
    elements j on the grid's axis ``dim`` and i after it (the sum then runs over ``dim``), else the
    other way round (``rank_sort``'s layout)."""
    keys = [key] if isinstance(key, Op) else list(key)
    grid, as_i, as_j = _grid(keys[0].shape, dim)
    i_axis, j_axis = (dim + 1, dim) if j_first else (dim, dim + 1)
    if j_first:
        as_i, as_j = as_j, as_i
    pairs = []  # each key as element i's and element j's along the grid
    for each in keys:
        k = each if each.dtype is DType.FP32 else b.convert(each, DType.FP32)
        k = b.select(b.compare(k, k, "NE"), math.inf, k)  # NaN: as +inf
        pairs.append((b.broadcast(k, grid, as_i), b.broadcast(k, grid, as_j)))
    # "j goes before i", built from the tie-break outwards: equal on every key, j is earlier
    before = b.convert(b.compare(b.iota(grid, j_axis, DType.FP32), b.iota(grid, i_axis, DType.FP32), "LT"),
                       DType.FP32)
    for k_i, k_j in reversed(pairs):
        before = b.select(b.compare(k_j, k_i, "GT" if descending else "LT"), 1.0,
                          b.select(b.compare(k_j, k_i, "EQ"), before, 0.0))
    return b.reduce(before, [j_axis], "sum")


def rank_select(b: Any, key: Op, values: Sequence[Op], dim: int, place: int) -> list[Op]:
    """An order statistic (``torch.median``): per row along ``dim``, each of ``values`` at the
    element whose stable ascending rank is ``place`` (``dim`` reduced away), in its operand's type;
    one rank computation and a select and sum per operand, no sort."""
    # j first: the ranks summed over the grid's axis ``dim``, so the select and its sum read row
    # tiles (the other layout compiles too since streaming.units_of's fix, through a relayout)
    hit = b.compare(stable_ranks(b, key, dim, j_first=True), float(place), "EQ")
    results = []
    for op in values:
        value = op if op.dtype is DType.FP32 else b.convert(op, DType.FP32)
        picked = b.reduce(b.select(hit, value, 0.0), [dim], "sum")
        results.append(picked if op.dtype is DType.FP32 else b.convert(picked, op.dtype))
    return results


def rank_sort(b: Any, key: Op | Sequence[Op], values: Sequence[Op], dim: int,
              descending: bool = False) -> list[Op]:
    """``values`` (each of the keys' shape; a key itself to sort it) reordered along ``dim`` as a
    stable sort of ``key`` orders them (a sequence of keys: lexicographically, the first key
    first); each result of its operand's type. ``b`` is the ``GraphBuilder``."""
    shape = (key if isinstance(key, Op) else key[0]).shape
    grid, _as_i, as_j = _grid(shape, dim)
    place = b.broadcast(stable_ranks(b, key, dim, descending), grid, as_j)  # the rank of element i
    hit = b.compare(place, b.iota(grid, dim, DType.FP32), "EQ")  # [.., r, i]: i goes to place r
    results = []
    for op in values:
        value = op if op.dtype is DType.FP32 else b.convert(op, DType.FP32)
        placed = b.reduce(b.select(hit, b.broadcast(value, grid, as_j), 0.0), [dim + 1], "sum")
        results.append(placed if op.dtype is DType.FP32 else b.convert(placed, op.dtype))
    return results


__all__ = ["rank_select", "rank_sort", "stable_ranks"]
