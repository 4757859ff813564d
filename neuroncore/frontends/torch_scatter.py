"""Index updates (``slice_scatter``, ``select_scatter``, ``index_copy``, ``index_put``,
``scatter``): the KV-cache writes of static caches and the functional form of in-place writes.

Updates at constant positions are concatenations of the kept parts and the new values. Updates at
runtime positions are selects, one per written slot: ``out = where(iota_dim == index[j],
source[j], out)``, each a Vector-engine pass over the destination (so later slots win, as torch's
sequential ``index_copy`` does). The number of written slots is capped at ``MAX_SLOTS`` (a decode
step writes one position per sequence); larger runtime scatters stay unsupported and are listed
by ``check``. ``accumulate=True`` is supported for the embedding backward's form (rows of a 2-D
table, any number of ids): ``table + one_hot(ids)^T @ values``, one matmul on the Tensor engine, so
repeated ids add up as torch's accumulate does. Other ``scatter_add`` / ``index_add`` forms are not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
    if (kw.get("step") or 1) != 1:
        return NotImplemented
    return _splice(c, x, src, dim, start, start + src.shape[dim])


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
    if kw.get("accumulate"):
        return _accumulate_rows(c, kw, dtype)
    x = c._op(kw["self"], dtype)
    indices = list(kw["indices"])
    given = [i for i, ix in enumerate(indices) if ix is not None]
    if len(given) != 1:
        return NotImplemented
    dim = given[0]
    index = c._op(indices[dim])
    if len(index.shape) != 1:
        return NotImplemented
    slot_shape = (*x.shape[:dim], index.shape[0], *x.shape[dim + 1:])
    values = c._op(kw["values"], dtype)
    # values broadcast against x[..., index, ...]: [*before, slots, *after]
    values = c.b.broadcast_to(values, slot_shape) if values.shape != slot_shape else values
    out = write_slots(c, x, dim, index, values)
    return NotImplemented if out is None else out


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
    if kw.get("reduce") is not None:
        return NotImplemented
    x = c._op(kw["self"], dtype)
    dim = int(kw["dim"]) % len(x.shape)
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


__all__ = ["MAX_SLOTS", "constant_pad_nd", "index_copy", "index_put", "scatter", "select_scatter",
           "slice_scatter", "write_slots"]
