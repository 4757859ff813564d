"""Mask-building and index arithmetic: ``any``/``all``, ``cumsum``, ``argmax``/``argmin``,
``gather`` and ``one_hot``-style comparisons, as the default (sdpa) attention-mask path of Hugging
Face models and RoBERTa's position ids use them.

Everything is rewritten into ops the core already runs, as an XLA compiler would:

* ``any``/``all`` reduce a 0/1 tensor with max (``all`` is ``not any(not x)``).
* ``cumsum`` is a Hillis-Steele scan: log2(n) steps of ``x + shift(x, 2^k)`` on the Vector engine
  (exact for integers, the same order of additions for floats as a tree reduction).
* ``argmax``/``argmin`` take the extreme value, then the smallest index where it occurs (``torch``
  returns the first one), with the indices counted in fp32 (exact below 2^24); over a last dim of
  16,384 or more (a vocabulary's logits) per 512-wide chunk, the chunks laid across partitions,
  then the chunks' maxima and indices combined.
* ``gather`` and indexing with runtime indices become one row gather from the flattened source,
  with the flat row number computed from the indices (``sum(index_k * stride_k)``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from neuroncore.dtypes import DType
from neuroncore.frontends.rank_sort import rank_select, rank_sort
from neuroncore.frontends.torch_ops import handles
from neuroncore.ir.graph import Op

if TYPE_CHECKING:
    from neuroncore.frontends.torch_frontend import _Converter


def _dims(x: Op, dims: Any) -> list[int]:
    rank = len(x.shape)
    if dims is None or (isinstance(dims, (list, tuple)) and not dims):
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d % rank for d in dims}) if rank else []


def _truth(c: _Converter, x: Any) -> Op:
    """``x != 0`` as a pred tensor (a pred tensor as is)."""
    op = c._op(x)
    return op if op.dtype is DType.PRED else c.b.compare(op, 0.0, "NE")


def _any(c: _Converter, x: Op, dims: list[int], shape: tuple[int, ...]) -> Op:
    if not x.shape:
        return x
    as_float = c.b.convert(x, DType.FP32)
    out = c.b.compare(c.b.reduce(as_float, dims, "max"), 0.0, "GT")
    return c.b.reshape(out, shape) if out.shape != shape else out


@handles("any")
def any_(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    shape, _ = c._out(node)
    x = _truth(c, kw["self"])
    return _any(c, x, _dims(x, kw.get("dim")), shape)


@handles("all")
def all_(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    shape, _ = c._out(node)
    x = _truth(c, kw["self"])
    negated = c.b.compare(x, 0.0, "EQ")
    return c.b.compare(_any(c, negated, _dims(x, kw.get("dim")), shape), 0.0, "EQ")


def shift(c: _Converter, x: Op, dim: int, by: int, fill: float = 0.0) -> Op:
    """``x`` moved ``by`` places forward along ``dim``, the first ``by`` entries ``fill``."""
    n = x.shape[dim]
    if by >= n:
        return c.b.constant(fill, x.dtype, shape=x.shape)
    starts, limits = [0] * len(x.shape), list(x.shape)
    limits[dim] = n - by
    kept = c.b.slice(x, starts, limits)
    pad_shape = list(x.shape)
    pad_shape[dim] = by
    return c.b.concatenate([c.b.constant(fill, x.dtype, shape=pad_shape), kept], dim)


def scan(c: _Converter, x: Op, dim: int, combine: Callable[[Op, Op], Op], identity: float) -> Op:
    """Inclusive prefix ``combine`` along ``dim`` (Hillis-Steele): ceil(log2(n)) steps of
    ``combine(x, shift(x, 2^k))``, the shifted-in entries ``identity``."""
    step = 1
    while step < x.shape[dim]:
        x = combine(x, shift(c, x, dim, step, identity))
        step *= 2
    return x


def cumulative_sum(c: _Converter, x: Op, dim: int) -> Op:
    """Inclusive prefix sum along ``dim`` in ceil(log2(n)) shifted adds."""
    return scan(c, x, dim, c.b.add, 0.0)


def _log_add_exp(c: _Converter, a: Op, b: Op) -> Op:
    """``log(exp(a) + exp(b))`` as ``max + log(1 + exp(min - max))`` (-inf when both are)."""
    top = c.b.maximum(a, b)
    total = c.b.add(top, c.b.log(c.b.add(c.b.exp(c.b.subtract(c.b.minimum(a, b), top)), 1.0)))
    return c.b.select(c.b.compare(top, -math.inf, "EQ"), -math.inf, total)


@handles("cumsum", "cumprod", "logcumsumexp")
def cumsum(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    """``cumsum``, ``cumprod`` (session 13) and ``logcumsumexp`` (session 13: the scan's step is a
    stable log-add-exp, as torch's kernel combines) as :func:`scan`s."""
    _shape, dtype = c._out(node)
    x = c._op(kw["self"], dtype)
    if not x.shape:
        return c.b.add(x, 0.0) if "logcumsumexp" in str(node.target) else x
    dim = kw["dim"] % len(x.shape)
    name = str(node.target)
    if "cumprod" in name:
        return scan(c, x, dim, c.b.multiply, 1.0)
    if "logcumsumexp" in name:
        if not dtype.is_float:
            return NotImplemented
        return scan(c, x, dim, lambda a, b: _log_add_exp(c, a, b), -math.inf)
    return cumulative_sum(c, x, dim)


WIDE_ROW = 16384  # a last dim at least this wide is searched in chunks laid across partitions
CHUNK = 512  # elements per chunk (one row of a [rows * chunks, CHUNK] tile)


def _first_max(c: _Converter, work: Op, dim: int) -> Op:
    """The first index along ``dim`` (removed) of ``work``'s maximum, as fp32, by two reductions:
    the maximum, then the smallest position holding it (a max of ``n - position`` over the hits)."""
    keep = tuple(1 if i == dim else d for i, d in enumerate(work.shape))
    best = c.b.broadcast_to(c.b.reshape(c.b.reduce(work, [dim], "max"), keep), work.shape)
    hit = c.b.compare(work, best, "EQ")
    n = work.shape[dim]
    position = c.b.iota(work.shape, dim, DType.FP32)
    score = c.b.select(hit, c.b.subtract(float(n), position), 0.0)
    return c.b.subtract(float(n), c.b.reduce(score, [dim], "max"))


def _chunked_first_max(c: _Converter, work: Op) -> Op:
    """:func:`_first_max` along a wide last dim (a vocabulary's logits), as a compiler spreads a
    row reduction over the partitions: the row is cut into ``CHUNK``-wide chunks (padded with
    -inf to a whole number of them), viewed as ``[..., chunks, CHUNK]`` so every chunk is a row of
    its own (a batch of 2 over 128,256 logits uses 128 partitions, not 2), each chunk's maximum and
    first index found at once, then combined per row: the first chunk holding the row's maximum,
    and its index within that chunk (value + index). Ties go to the lowest index, as torch."""
    b = c.b
    lead, width = work.shape[:-1], work.shape[-1]
    chunks = -(-width // CHUNK)
    if chunks * CHUNK != width:
        pad = b.constant(-math.inf, DType.FP32, shape=(*lead, chunks * CHUNK - width))
        work = b.concatenate([work, pad], len(lead))
    blocks = b.reshape(work, (*lead, chunks, CHUNK))
    within = _first_max(c, blocks, len(lead) + 1)  # [..., chunks]
    maxima = b.reduce(blocks, [len(lead) + 1], "max")  # [..., chunks]
    chunk = _first_max(c, maxima, len(lead))  # the first chunk holding the row's maximum
    picked = b.compare(b.iota(maxima.shape, len(lead), DType.FP32),
                       b.broadcast_to(b.reshape(chunk, (*lead, 1)), maxima.shape), "EQ")
    offset = b.reduce(b.select(picked, within, 0.0), [len(lead)], "sum")
    return b.add(b.multiply(chunk, float(CHUNK)), offset)


def first_index_of_extreme(c: _Converter, x: Op, dim: int, kind: str) -> Op:
    """The first index along ``dim`` (removed) where ``x`` takes its max (or min), as fp32; a last
    dim of ``WIDE_ROW`` or more is searched in chunks across partitions (``_chunked_first_max``)."""
    work = c._cast(x, DType.FP32)
    if kind == "min":
        work = c.b.negate(work)
    if dim == len(work.shape) - 1 and work.shape[dim] >= WIDE_ROW:
        return _chunked_first_max(c, work)
    return _first_max(c, work, dim)


def _arg_extreme(c: _Converter, node: torch.fx.Node, kw: dict[str, Any], kind: str) -> Any:
    shape, dtype = c._out(node)
    x = c._op(kw["self"])
    dim = kw.get("dim")
    if dim is None:
        x = c.b.reshape(x, (max(x.size, 1),))
        dim = 0
    if not x.shape:
        return c.b.constant(0.0, dtype, shape=shape)
    index = first_index_of_extreme(c, x, dim % len(x.shape), kind)
    out = c._cast(index, dtype)
    return c.b.reshape(out, shape) if out.shape != shape else out


@handles("argmax")
def argmax(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    return _arg_extreme(c, node, kw, "max")


@handles("argmin")
def argmin(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    return _arg_extreme(c, node, kw, "min")


def gather_elements(c: _Converter, x: Op, coords: list[Op | None], shape: tuple[int, ...]) -> Op:
    """``x[coords[0], coords[1], ...]`` elementwise, each coordinate an int32 op of ``shape`` (or
    None: that dim's own position in ``shape``), as one gather from ``x`` flattened to rows."""
    strides = [math.prod(x.shape[k + 1:]) for k in range(len(x.shape))]
    flat: Op | None = None
    for k, coord in enumerate(coords):
        term = coord if coord is not None else c.b.iota(shape, k, DType.INT32)
        term = c.b.broadcast_to(c._cast(term, DType.INT32), shape)
        if strides[k] != 1:
            term = c.b.multiply(term, float(strides[k]))
        flat = term if flat is None else c.b.add(flat, term)
    assert flat is not None
    table = c.b.reshape(x, (x.size, 1))
    return c.b.reshape(c.b.gather(table, flat), shape)


@handles("gather")
def gather(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    shape, dtype = c._out(node)
    source = kw["self"]
    known = c.known.get(source) if isinstance(source, torch.fx.Node) else None
    if known is not None and known.numel() and bool((known == known.reshape(-1)[0]).all()):
        return c.b.constant(float(known.reshape(-1)[0]), dtype, shape=shape)  # a uniform table
    x = c._op(source)
    if not shape:
        return NotImplemented
    dim = kw["dim"] % len(x.shape)
    index = c._op(kw["index"], DType.INT32)
    coords: list[Op | None] = [None] * len(x.shape)
    coords[dim] = index
    return gather_elements(c, x, coords, shape)


def runtime_index(c: _Converter, x: Op, indices: list[Any], shape: tuple[int, ...]) -> Op | None:
    """``x[i0, i1, ...]`` with adjacent leading runtime index tensors (``hidden[arange(b), pos]``,
    CLIP's pooled output): one row gather of the trailing dims, or None when not of that form."""
    positions = [i for i, ix in enumerate(indices) if ix is not None]
    if positions != list(range(len(positions))):
        return None
    idx = [c._op(indices[i], DType.INT32) for i in positions]
    bshape = tuple(torch.broadcast_shapes(*(i.shape for i in idx)))
    k = len(positions)
    rest = x.shape[k:]
    if tuple(shape) != (*bshape, *rest):
        return None
    row_width = math.prod(rest)
    flat: Op | None = None
    for j, i in enumerate(idx):
        dim_size = x.shape[j]
        term = c.b.broadcast_to(i, bshape)
        # negative indices count from the end, as in torch
        term = c.b.add(term, c.b.multiply(c.b.convert(c.b.compare(term, 0.0, "LT"), DType.INT32),
                                          float(dim_size)))
        stride = math.prod(x.shape[j + 1:k])
        if stride != 1:
            term = c.b.multiply(term, float(stride))
        flat = term if flat is None else c.b.add(flat, term)
    assert flat is not None
    table = c.b.reshape(x, (math.prod(x.shape[:k]), row_width))
    rows = c.b.gather(table, flat if bshape else c.b.reshape(flat, (1,)))
    return c.b.reshape(rows, shape)




@handles("topk")
def topk(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    """``topk`` (MoE routing) as k rounds of "take the first extreme, then mask it out": values in
    descending order (ascending for ``largest=False``) with their indices, as torch sorts them."""
    meta: Any = node.meta["val"]
    x = c._op(kw["self"], c._out_dtype(meta[0]))
    k = int(kw["k"])
    if not x.shape or not x.dtype.is_float:
        return NotImplemented
    dim = int(kw.get("dim", -1)) % len(x.shape)
    largest = kw.get("largest", True)
    work = x if largest else c.b.negate(x)
    keep = tuple(1 if i == dim else d for i, d in enumerate(x.shape))
    position = c.b.iota(x.shape, dim, DType.FP32)
    values, indices = [], []
    for _ in range(k):
        index = first_index_of_extreme(c, work, dim, "max")
        best = c.b.reduce(work, [dim], "max")
        values.append(c.b.reshape(best if largest else c.b.negate(best), keep))
        indices.append(c.b.reshape(index, keep))
        taken = c.b.compare(position, c.b.broadcast_to(c.b.reshape(index, keep), x.shape), "EQ")
        work = c.b.select(taken, float("-inf"), work)
    cat_values = values[0] if k == 1 else c.b.concatenate(values, dim)
    cat_indices = indices[0] if k == 1 else c.b.concatenate(indices, dim)
    return cat_values, c._cast(cat_indices, c._out_dtype(meta[1]))

@handles("sort")
def sort(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    """``torch.sort`` / ``argsort`` / ``msort`` (top-p sampling in user code) as a stable rank sort
    (``rank_sort``): values with their indices, ties in index order, ascending or descending."""
    meta: Any = node.meta["val"]
    x = c._op(kw["self"], c._out_dtype(meta[0]))
    if not x.shape or x.dtype not in (DType.FP32, DType.BF16, DType.FP16, DType.INT32):
        return NotImplemented
    dim = int(kw.get("dim", -1)) % len(x.shape)
    position = c.b.iota(x.shape, dim, DType.FP32)
    values, indices = rank_sort(c.b, x, [x, position], dim, bool(kw.get("descending", False)))
    return values, c._cast(indices, c._out_dtype(meta[1]))


@handles("median")
def median(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    """``torch.median`` (the lower median, the element of rank ``(n - 1) // 2``), of the whole
    tensor or along a dim with its index (``rank_sort.rank_select``: ranks, no sort). A row holding
    a NaN gives NaN and the first NaN's index, as torch. Among equal medians the index is the first
    in stable order; torch's CPU kernel (``nth_element``) leaves which one unspecified."""
    meta: Any = node.meta["val"]
    with_dim = isinstance(meta, (list, tuple))
    dtype = c._out_dtype(meta[0] if with_dim else meta)
    x = c._op(kw["self"], dtype)
    if not x.dtype.is_float and x.dtype is not DType.INT32:
        return NotImplemented
    if not with_dim:
        x = c.b.reshape(x, (max(1, math.prod(x.shape)),))
    elif not x.shape:
        x = c.b.reshape(x, (1,))
    dim = int(kw.get("dim", 0)) % len(x.shape) if with_dim else 0
    n = x.shape[dim]
    position = c.b.iota(x.shape, dim, DType.FP32)
    value, index = rank_select(c.b, x, [x, position], dim, (n - 1) // 2)
    if x.dtype.is_float:  # NaN: rank_sort orders it last; torch's median is NaN at the first one
        nan = c.b.compare(x, x, "NE")
        first_nan = c.b.negate(c.b.reduce(c.b.select(nan, c.b.negate(position), -float(n)), [dim], "max"))
        has_nan = c.b.compare(first_nan, float(n), "LT")
        value = c.b.select(has_nan, math.nan, value)
        index = c.b.select(has_nan, first_nan, index)
    if not with_dim:
        return c.b.reshape(value, tuple(meta.shape))
    shape = tuple(meta[0].shape)
    return (c.b.reshape(value, shape),
            c._cast(c.b.reshape(index, shape), c._out_dtype(meta[1])))


__all__ = [
    "argmax",
    "argmin",
    "cumulative_sum",
    "first_index_of_extreme",
    "gather_elements",
    "median",
    "runtime_index",
    "scan",
    "shift",
    "sort",
    "topk",
]
