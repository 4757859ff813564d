"""Index updates (``slice_scatter``, ``select_scatter``, ``index_copy``, ``index_put``,
``scatter``): the KV-cache writes of static caches and the functional form of in-place writes.

Updates at constant positions are concatenations of the kept parts and the new values (a strided
slice, every k-th position, through a `[n, k]` view of the region it spans). Updates at
runtime positions are selects, one per written slot: ``out = where(iota_dim == index[j],
source[j], out)``, each a Vector-engine pass over the destination (so later slots win, as torch's
sequential ``index_copy`` does). The number of written slots is capped at ``MAX_SLOTS`` (a decode
step writes one position per sequence); larger runtime scatters stay unsupported and are listed
by ``check``.

Accumulating updates have no slot cap. ``index_add`` (``index_put`` with ``accumulate=True`` and
one 1-D index) is a one-hot matmul on the Tensor engine: ``out = x + onehot(index)^T @ values``,
the one-hot matrix ``[slots, size]`` made by one compare of an iota with the indices (kept in the
values' dtype, never auto-cast, so fp32 sums stay fp32). The embedding backward's form
(``index_put`` of rows of a 2-D table at ids of any shape) is the same one-hot matmul
(``_accumulate_rows``). ``scatter_add`` and ``scatter_reduce`` (sum, mean, amax, amin), whose
index has one entry per source element, compare every source element's index with every
destination position along ``dim`` and reduce the matching values on the Vector engine
(``[*index.shape, size]`` elements, one pass). ``scatter_reduce(reduce="prod")`` is not supported.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from neuroncore.dtypes import DType
from neuroncore.frontends.torch_ops import handles
from neuroncore.ir.graph import Op

if TYPE_CHECKING:
    from neuroncore.frontends.torch_frontend import _Converter

MAX_SLOTS = 64


def _take(c: _Converter, x: Op, dim: int, start: int, end: int) -> Op | None:
    if end <= start:
        return None
    if start == 0 and end == x.shape[dim]:
        return x
    starts, limits = [0] * len(x.shape), list(x.shape)
    starts[dim], limits[dim] = start, end
    return c.b.slice(x, starts, limits)


def _splice(c: _Converter, x: Op, src: Op, dim: int, start: int, end: int) -> Op:
    """``x`` with positions ``start:end`` of ``dim`` replaced by ``src``."""
    parts = [p for p in (_take(c, x, dim, 0, start), src, _take(c, x, dim, end, x.shape[dim]))
             if p is not None]
    return parts[0] if len(parts) == 1 else c.b.concatenate(parts, dim)


@handles("slice_scatter")
def slice_scatter(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    _shape, dtype = c._out(node)
    x, src = c._op(kw["self"], dtype), c._op(kw["src"], dtype)
    dim = int(kw.get("dim", 0)) % len(x.shape)
    start = slice(kw.get("start"), kw.get("end"), 1).indices(x.shape[dim])[0]
    step = int(kw.get("step") or 1)
    if step != 1:
        return _strided_splice(c, x, src, dim, start, step)
    return _splice(c, x, src, dim, start, start + src.shape[dim])


def _strided_splice(c: _Converter, x: Op, src: Op, dim: int, start: int, step: int) -> Any:
    """``x`` with positions ``start, start + step, ...`` of ``dim`` replaced by ``src``: the
    backward of a strided slice (GPT-J's rotary ``x[..., ::2]`` and ``x[..., 1::2]``). The region
    they span, viewed as ``[n, step]`` along ``dim``, gets ``src`` as its first column; views and
    concatenations only."""
    n, size = src.shape[dim], x.shape[dim]
    if step < 1 or n == 0 or start + (n - 1) * step >= size:
        return NotImplemented
    span = min(n * step, size - start)
    region = _take(c, x, dim, start, start + span)
    assert region is not None
    if span < n * step:  # the last row of the view runs past the end: pad it, cut it off after
        pad_shape = list(x.shape)
        pad_shape[dim] = n * step - span
        region = c.b.concatenate([region, c.b.constant(0.0, x.dtype, shape=pad_shape)], dim)
    grid = (*x.shape[:dim], n, step, *x.shape[dim + 1:])
    rows = c.b.reshape(region, grid)
    first = c.b.reshape(src, (*x.shape[:dim], n, 1, *x.shape[dim + 1:]))
    rest_starts, rest_limits = [0] * len(grid), list(grid)
    rest_starts[dim + 1] = 1
    rows = c.b.concatenate([first, c.b.slice(rows, rest_starts, rest_limits)], dim + 1)
    flat = c.b.reshape(rows, (*x.shape[:dim], n * step, *x.shape[dim + 1:]))
    if span < n * step:  # span >= 1: the first written position is inside x
        starts, limits = [0] * len(flat.shape), list(flat.shape)
        limits[dim] = span
        flat = c.b.slice(flat, starts, limits)
    return _splice(c, x, flat, dim, start, start + span)


@handles("select_scatter")
def select_scatter(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    _shape, dtype = c._out(node)
    x, src = c._op(kw["self"], dtype), c._op(kw["src"], dtype)
    dim = int(kw["dim"]) % len(x.shape)
    index = int(kw["index"]) % x.shape[dim]
    expanded = c.b.reshape(src, (*x.shape[:dim], 1, *x.shape[dim + 1:]))
    return _splice(c, x, expanded, dim, index, index + 1)


def write_slots(c: _Converter, x: Op, dim: int, index: Op, source: Op) -> Op | None:
    """``x`` with ``x[..., index[j], ...] = source[..., j, ...]`` along ``dim`` (index 1-D)."""
    slots = index.shape[0] if index.shape else 1
    if slots > MAX_SLOTS or len(source.shape) != len(x.shape):
        return None
    flat_index = c.b.reshape(c._cast(index, DType.INT32), (slots,))
    # negative positions count from the end
    flat_index = c.b.add(flat_index, c.b.multiply(
        c.b.convert(c.b.compare(flat_index, 0.0, "LT"), DType.INT32), float(x.shape[dim])))
    position = c.b.iota(x.shape, dim, DType.INT32)
    out = x
    for j in range(slots):
        target = c.b.broadcast(c.b.reshape(c.b.slice(flat_index, [j], [j + 1]), ()), x.shape, ())
        value = _take(c, source, dim, j, j + 1) if source.shape[dim] != 1 else source
        assert value is not None
        out = c.b.select(c.b.compare(position, target, "EQ"), c.b.broadcast_to(value, x.shape), out)
    return out


@handles("index_copy")
def index_copy(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    _shape, dtype = c._out(node)
    x = c._op(kw["self"], dtype)
    dim = int(kw["dim"]) % len(x.shape)
    out = write_slots(c, x, dim, c._op(kw["index"]), c._op(kw["source"], dtype))
    return NotImplemented if out is None else out


@handles("index_put")
def index_put(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    _shape, dtype = c._out(node)
    x = c._op(kw["self"], dtype)
    indices = list(kw["indices"])
    given = [i for i, ix in enumerate(indices) if ix is not None]
    if any(_is_bool(indices[i]) for i in given):
        return _masked_put(c, x, indices, given, kw, dtype)
    if len(given) > 1:
        return _put_at_positions(c, x, indices, given, kw, dtype)
    if len(given) != 1:
        return NotImplemented
    dim = given[0]
    index = c._op(indices[dim])
    if len(index.shape) != 1:  # rows of a table at ids of any shape: the embedding backward
        return _accumulate_rows(c, kw, dtype) if kw.get("accumulate") else NotImplemented
    slot_shape = (*x.shape[:dim], index.shape[0], *x.shape[dim + 1:])
    values = c._op(kw["values"], dtype)
    # values broadcast against x[..., index, ...]: [*before, slots, *after]
    values = c.b.broadcast_to(values, slot_shape) if values.shape != slot_shape else values
    if kw.get("accumulate"):  # index_add's decomposition
        out = accumulate_slots(c, x, dim, index, values)
    else:
        out = write_slots(c, x, dim, index, values)
    return NotImplemented if out is None else out


def _is_bool(index: Any) -> bool:
    meta = index.meta.get("val") if isinstance(index, torch.fx.Node) else None
    return meta is not None and meta.dtype == torch.bool


def _masked_put(c: _Converter, x: Op, indices: list[Any], given: list[int], kw: dict[str, Any],
                dtype: DType) -> Any:
    """``x[mask] = v`` with a boolean mask over ``x``'s leading dims and one value (wav2vec2's
    ``hidden_states[~mask] = 0``): ``where(mask, v, x)``, no data-dependent shape. Values that
    are one per selected element (their count depends on the mask) stay unsupported."""
    if given != [0] or len(indices) != 1:
        return NotImplemented
    mask = c._op(indices[0])
    values = c._op(kw["values"], dtype)
    if values.size != 1 or mask.shape != x.shape[:len(mask.shape)]:
        return NotImplemented
    hit = c.b.broadcast(c._cast(mask, DType.PRED), x.shape, tuple(range(len(mask.shape))))
    value = c.b.broadcast_to(c.b.reshape(values, ()), x.shape)
    if kw.get("accumulate"):
        if not dtype.is_float:
            return NotImplemented
        return c.b.add(x, c.b.select(hit, value, c.b.constant(0.0, dtype, shape=x.shape)))
    return c.b.select(hit, value, x)


def _put_at_positions(c: _Converter, x: Op, indices: list[Any], given: list[int],
                      kw: dict[str, Any], dtype: DType) -> Any:
    """``x[i0, i1, ...] = values`` with index tensors on adjacent dims (wav2vec2's
    ``mask[(arange(batch), lengths - 1)] = 1``): the indexed dims are flattened into one and the
    indices combined into positions in it (each counted from its dim's end when negative), then
    written as one index tensor is (``write_slots``; ``accumulate_slots`` when accumulating)."""
    first, last = given[0], given[-1]
    if given != list(range(first, last + 1)) or last >= len(x.shape):
        return NotImplemented
    ops = [c._cast(c._op(indices[d]), DType.INT32) for d in given]
    slot_shape = tuple(torch.broadcast_shapes(*(op.shape for op in ops)))
    slots = math.prod(slot_shape)
    sizes = x.shape[first:last + 1]
    position: Op | None = None
    for d, op, size in zip(given, ops, sizes):
        index = c.b.reshape(c.b.broadcast_to(op, slot_shape) if op.shape != slot_shape else op,
                            (slots,))
        index = _normalized(c, index, size)
        scale = math.prod(x.shape[d + 1:last + 1])
        term = c.b.multiply(index, float(scale)) if scale != 1 else index
        position = term if position is None else c.b.add(position, term)
    assert position is not None
    before, after = x.shape[:first], x.shape[last + 1:]
    flat = c.b.reshape(x, (*before, math.prod(sizes), *after))
    values = c._op(kw["values"], dtype)
    target = (*before, *slot_shape, *after)
    if values.shape != target:
        values = c.b.broadcast_to(values, target)
    values = c.b.reshape(values, (*before, slots, *after))
    if kw.get("accumulate"):
        out = accumulate_slots(c, flat, first, position, values)
    else:
        out = write_slots(c, flat, first, position, values)
    return NotImplemented if out is None else c.b.reshape(out, x.shape)


def _accumulate_rows(c: _Converter, kw: dict[str, Any], dtype: DType) -> Any:
    """``x.index_put_([ids], values, accumulate=True)`` on a 2-D ``x`` (the gradient of an
    embedding table): ``x + one_hot(ids)^T @ values`` with the one-hot built from an iota."""
    x = c._op(kw["self"], dtype)
    indices = list(kw["indices"])
    if len(x.shape) != 2 or len(indices) != 1 or indices[0] is None or not dtype.is_float:
        return NotImplemented
    ids = c._cast(c._op(indices[0]), DType.INT32)
    n = ids.size
    rows, width = x.shape
    values = c._op(kw["values"], dtype)
    if values.size != n * width:
        values = c.b.broadcast_to(values, (*ids.shape, width))
    flat_ids = c.b.reshape(ids, (n,)) if ids.shape != (n,) else ids
    flat_values = c.b.reshape(values, (n, width)) if values.shape != (n, width) else values
    hits = c.b.compare(c.b.iota((rows, n), 0, DType.INT32), c.b.broadcast(flat_ids, (rows, n), (1,)), "EQ")
    one_hot = c.b.convert(hits, dtype)
    return c.b.add(x, c.b.dot(one_hot, flat_values))


@handles("constant_pad_nd")
def constant_pad_nd(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    """``F.pad(x, (left, right, ...), value=v)``: the kept part of ``x`` concatenated with constant
    blocks, last dim first (torch's order); negative pads crop."""
    _shape, dtype = c._out(node)
    x = c._op(kw["self"], dtype)
    pads = [int(p) for p in kw["pad"]]
    value = float(kw.get("value", 0.0) or 0.0)
    for k in range(len(pads) // 2):
        dim = len(x.shape) - 1 - k
        left, right = pads[2 * k], pads[2 * k + 1]
        cropped = _take(c, x, dim, max(-left, 0), x.shape[dim] - max(-right, 0))
        if cropped is None:
            return NotImplemented
        parts = []
        for width in (left, None, right):
            if width is None:
                parts.append(cropped)
            elif width > 0:
                block = list(cropped.shape)
                block[dim] = width
                parts.append(c.b.constant(value, dtype, shape=block))
        x = parts[0] if len(parts) == 1 else c.b.concatenate(parts, dim)
    return x


@handles("scatter")
def scatter(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    """``out[..., index[..j..], ...] = src[..j..]`` along ``dim`` (``scatter.src`` and
    ``scatter.value``), one select per position of ``index`` along ``dim``."""
    _shape, dtype = c._out(node)
    x = c._op(kw["self"], dtype)
    dim = int(kw["dim"]) % len(x.shape)
    if kw.get("reduce") is not None:  # scatter(..., reduce="add") is scatter_add
        if kw["reduce"] != "add" or not isinstance(kw.get("src"), torch.fx.Node):
            return NotImplemented
        out = reduce_into(c, x, dim, c._op(kw["index"]), c._op(kw["src"], dtype), "sum", True)
        return NotImplemented if out is None else out
    index = c._cast(c._op(kw["index"]), DType.INT32)
    others = [d for i, d in enumerate(index.shape) if i != dim]
    if others != [d for i, d in enumerate(x.shape) if i != dim] or index.shape[dim] > MAX_SLOTS:
        return NotImplemented
    src: Any = kw.get("src", kw.get("value"))
    position = c.b.iota(x.shape, dim, DType.INT32)
    out = x
    for j in range(index.shape[dim]):
        target = c.b.broadcast_to(_take(c, index, dim, j, j + 1) or index, x.shape)
        if isinstance(src, torch.fx.Node):
            value: Op | float = c.b.broadcast_to(_take(c, c._op(src, dtype), dim, j, j + 1)
                                                 or c._op(src, dtype), x.shape)
        else:
            value = float(src)
        out = c.b.select(c.b.compare(position, target, "EQ"), value, out)
    return out


def _normalized(c: _Converter, index: Op, size: int) -> Op:
    """int32 indices with negative ones counted from the end of a dim of ``size``."""
    index = c._cast(index, DType.INT32)
    return c.b.add(index, c.b.multiply(c.b.convert(c.b.compare(index, 0.0, "LT"), DType.INT32),
                                       float(size)))


def accumulate_slots(c: _Converter, x: Op, dim: int, index: Op, values: Op) -> Op | None:
    """``x[..., index[j], ...] += values[..., j, ...]`` along ``dim`` (``index`` 1-D, repeated
    indices add up): ``x + onehot^T @ values`` with the written dim moved first."""
    if not x.dtype.is_float or len(index.shape) != 1 or len(values.shape) != len(x.shape):
        return None
    slots, size = index.shape[0], x.shape[dim]
    rank = len(x.shape)
    order = [dim, *(d for d in range(rank) if d != dim)]
    rest = math.prod(x.shape) // size
    flat_values = c.b.reshape(c.b.transpose(values, order) if dim else values, (slots, rest))
    positions = c.b.iota((slots, size), 1, DType.INT32)
    targets = c.b.broadcast(_normalized(c, index, size), (slots, size), (0,))
    onehot = c.b.convert(c.b.compare(positions, targets, "EQ"), x.dtype)
    added = c.b.dot(onehot, flat_values, lhs_contract=-2, rhs_contract=-2, out_dtype=x.dtype)
    moved_shape = [x.shape[d] for d in order]
    added = c.b.reshape(added, moved_shape)
    if dim:
        added = c.b.transpose(added, list(np.argsort(order)))
    return c.b.add(x, added)


@handles("index_add")
def index_add(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    _shape, dtype = c._out(node)
    x = c._op(kw["self"], dtype)
    dim = int(kw["dim"]) % len(x.shape)
    source = c._op(kw["source"], dtype)
    alpha = kw.get("alpha", 1)
    if alpha != 1:
        source = c.b.multiply(source, float(alpha))
    out = accumulate_slots(c, x, dim, c._op(kw["index"]), source)
    return NotImplemented if out is None else out


_REDUCTIONS = ("sum", "mean", "amax", "amin")


def reduce_into(c: _Converter, x: Op, dim: int, index: Op, src: Op, reduce: str,
                include_self: bool) -> Op | None:
    """``scatter_reduce``: ``out[.., index[i], ..] <reduce>= src[i]`` along ``dim``; ``index`` has
    ``x``'s shape outside ``dim`` (``src`` is read in ``index``'s shape). A mask ``[*index.shape,
    size]`` (source element i goes to position p) selects each position's values, reduced over the
    index's ``dim``; positions nothing is written to keep ``x``."""
    rank = len(x.shape)
    size = x.shape[dim]
    if reduce not in _REDUCTIONS or len(index.shape) != rank or len(src.shape) != rank:
        return None
    if any(index.shape[d] != x.shape[d] for d in range(rank) if d != dim):
        return None
    if any(src.shape[d] < index.shape[d] for d in range(rank)):
        return None
    if reduce == "mean" and not x.dtype.is_float:
        return None
    if src.shape != index.shape:
        src = c.b.slice(src, [0] * rank, list(index.shape))
    wide = (*index.shape[:dim + 1], size, *index.shape[dim + 1:])  # the new axis after ``dim``
    kept = [d for d in range(rank + 1) if d != dim + 1]
    hit = c.b.compare(c.b.iota(wide, dim + 1, DType.INT32),
                      c.b.broadcast(_normalized(c, index, size), wide, kept), "EQ")
    values = c.b.broadcast(src, wide, kept)
    if reduce in ("sum", "mean"):
        total = c.b.reduce(c.b.select(hit, values, 0.0), [dim], "sum")
        if reduce == "sum":
            return c.b.add(x, total) if include_self else c.b.select(
                c.b.compare(_hits(c, hit, dim), 0.0, "GT"), total, x)
        count = _hits(c, hit, dim, x.dtype)
        if include_self:
            return c.b.divide(c.b.add(x, total), c.b.add(count, 1.0))
        written = c.b.compare(count, 0.0, "GT")
        return c.b.select(written, c.b.divide(total, c.b.maximum(count, 1.0)), x)
    lowest = -3.0e38 if x.dtype.is_float else -2.0**31
    signed = values if reduce == "amax" else _negated(c, values)
    best = c.b.reduce(c.b.select(hit, signed, lowest), [dim], "max")
    best = best if reduce == "amax" else _negated(c, best)
    if include_self:
        return c.b.maximum(x, best) if reduce == "amax" else c.b.minimum(x, best)
    return c.b.select(c.b.compare(_hits(c, hit, dim), 0.0, "GT"), best, x)


def _hits(c: _Converter, hit: Op, dim: int, dtype: DType = DType.INT32) -> Op:
    """How many source elements land on each destination position."""
    return c.b.reduce(c.b.convert(hit, dtype), [dim], "sum")


def _negated(c: _Converter, x: Op) -> Op:
    return c.b.negate(x) if x.dtype.is_float else c.b.multiply(x, -1.0)


@handles("scatter_add")
def scatter_add(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    _shape, dtype = c._out(node)
    x = c._op(kw["self"], dtype)
    dim = int(kw["dim"]) % len(x.shape)
    out = reduce_into(c, x, dim, c._op(kw["index"]), c._op(kw["src"], dtype), "sum", True)
    return NotImplemented if out is None else out


@handles("scatter_reduce")
def scatter_reduce(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    _shape, dtype = c._out(node)
    x = c._op(kw["self"], dtype)
    dim = int(kw["dim"]) % len(x.shape)
    out = reduce_into(c, x, dim, c._op(kw["index"]), c._op(kw["src"], dtype), str(kw["reduce"]),
                      bool(kw.get("include_self", True)))
    return NotImplemented if out is None else out


__all__ = ["MAX_SLOTS", "accumulate_slots", "constant_pad_nd", "index_add", "index_copy", "index_put",
           "reduce_into", "scatter", "scatter_add", "scatter_reduce", "select_scatter", "slice_scatter",
           "write_slots"]
