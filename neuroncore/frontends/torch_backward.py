"""Backward ATen ops that torch's core-ATen decomposition table keeps whole, lowered to ops the core
runs (the training step's joint graph has them; inference graphs never do).

* ``convolution_backward`` (not transposed; grouped ones group by group, up to ``MAX_GROUPS``):
  the weight gradient is the forward's
  im2col patches contracted with the output gradient (one Tensor-engine matmul, as the forward);
  the input gradient is the output gradient times the weight (another matmul) folded back onto the
  input (col2im): each kernel offset's slab is dilated by the stride, placed at its offset in the
  padded input and added; the bias gradient is a sum.
* ``max_pool2d_with_indices_backward`` (1-D pooling runs as 2-D in ATen): the window maximum is
  recomputed from the input, and each window position's gradient goes to the first offset holding
  the maximum (torch's choice on ties), folded back like col2im. The saved indices are not read.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from neuroncore.frontends.conv_lowering import out_size, pad_spatial, patches, window_slices
from neuroncore.frontends.flip import place_constant
from neuroncore.frontends.torch_conv import (
    _interpolate_dims,
    _ints,
    _lowest,
    adaptive_average_matrix,
    adaptive_offsets,
    adaptive_window_reads,
)
from neuroncore.frontends.torch_ops import handles
from neuroncore.ir.graph import Op

if TYPE_CHECKING:
    from neuroncore.frontends.torch_frontend import _Converter


def _place(c: _Converter, slab: Op, offset: tuple[int, ...], stride: list[int], dilation: list[int],
           padded: list[int]) -> Op:
    """``slab`` [N, C, *out] written at ``offset * dilation + i * stride`` of a zero tensor whose
    spatial dims are ``padded`` (the col2im placement of one kernel offset)."""
    x = slab
    for k, s in enumerate(stride):
        dim = 2 + k
        if s > 1:  # interleave s-1 zeros after each element: [.., o, 1, ..] ++ zeros -> [.., o*s, ..]
            shape = list(x.shape)
            expanded = c.b.reshape(x, [*shape[:dim + 1], 1, *shape[dim + 1:]])
            zeros = list(expanded.shape)
            zeros[dim + 1] = s - 1
            joined = c.b.concatenate([expanded, c.b.constant(0.0, x.dtype, shape=zeros)], dim + 1)
            shape[dim] *= s
            x = c.b.reshape(joined, shape)
        before = offset[k] * dilation[k]
        used = min(x.shape[dim], padded[k] - before)
        if used < x.shape[dim]:
            starts, limits = [0] * len(x.shape), list(x.shape)
            limits[dim] = used
            x = c.b.slice(x, starts, limits)
        x = pad_spatial(c.b, x, [(before, padded[k] - before - used) if j == k else (0, 0)
                               for j in range(len(stride))])
    return x


def _fold(c: _Converter, slabs: list[Op], kernel: list[int], stride: list[int], dilation: list[int],
          padding: list[int], size: list[int], extra: list[int] | None = None) -> Op:
    """col2im: the slabs (one per kernel offset) added at their places, padding cropped off
    (``extra``: more padding after each spatial dim, a ``ceil_mode`` pool's last windows)."""
    extra = extra or [0] * len(size)
    padded = [s + 2 * p + e for s, p, e in zip(size, padding, extra)]
    total: Op | None = None
    for slab, offset in zip(slabs, itertools.product(*(range(k) for k in kernel))):
        placed = _place(c, slab, offset, stride, dilation, padded)
        total = placed if total is None else c.b.add(total, placed)
    assert total is not None
    if any(padding) or any(extra):
        rank = len(total.shape)
        starts = [0, 0, *padding]
        limits = [total.shape[0], total.shape[1], *(p + s for p, s in zip(padding, size))]
        total = c.b.slice(total, starts, limits, [1] * rank)
    return total


MAX_GROUPS = 64
"""Grouped convolutions are differentiated group by group (each group's gradients are two matmuls
and a fold); more groups than this (a wide depthwise convolution) stay unsupported, listed by
``check``, rather than a program of thousands of small matmuls."""


@handles("convolution_backward")
def convolution_backward(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    meta: Any = node.meta["val"]
    dtype = c._out_dtype(next(m for m in meta if m is not None))
    groups = int(kw.get("groups", 1) or 1)
    if kw.get("transposed") or not 1 <= groups <= MAX_GROUPS or not dtype.is_float:
        return NotImplemented
    grad = c._op(kw["grad_output"], dtype)
    x = c._op(kw["input"], dtype)
    w = c._op(kw["weight"], dtype)
    spatial = len(x.shape) - 2
    stride, padding = _ints(kw["stride"], spatial), _ints(kw["padding"], spatial)
    dilation = _ints(kw["dilation"], spatial)
    if any(int(p) for p in _ints(kw.get("output_padding", 0), spatial)):
        return NotImplemented
    mask = list(kw.get("output_mask") or (True, True, True))
    results: list[Op | None] = [None, None, None]
    if groups == 1:
        results[0], results[1] = _conv_grads(c, grad, x, w, stride, padding, dilation, mask)
    else:  # group g: input channels g*C/G.., output channels g*O/G.. (torch's layout)
        per_in, per_out = x.shape[1] // groups, w.shape[0] // groups
        parts: list[tuple[Op | None, Op | None]] = []
        for g in range(groups):
            parts.append(_conv_grads(c, _channels(c, grad, 1, g * per_out, per_out),
                                     _channels(c, x, 1, g * per_in, per_in),
                                     _channels(c, w, 0, g * per_out, per_out),
                                     stride, padding, dilation, mask))
        if mask[0]:
            results[0] = c.b.concatenate([gx for gx, _ in parts if gx is not None], 1)
        if mask[1]:
            results[1] = c.b.concatenate([gw for _, gw in parts if gw is not None], 0)
    if mask[2]:
        results[2] = c.b.reduce(grad, [0, *range(2, 2 + spatial)], "sum")
    return tuple(results)


def _channels(c: _Converter, x: Op, dim: int, start: int, count: int) -> Op:
    """``count`` channels of ``x`` along ``dim`` from ``start`` (one group's)."""
    if start == 0 and count == x.shape[dim]:
        return x
    starts, limits = [0] * len(x.shape), list(x.shape)
    starts[dim], limits[dim] = start, start + count
    return c.b.slice(x, starts, limits)


def _conv_grads(c: _Converter, grad: Op, x: Op, w: Op, stride: list[int], padding: list[int],
                dilation: list[int], mask: list[bool]) -> tuple[Op | None, Op | None]:
    """(input gradient, weight gradient) of an ungrouped convolution, each when ``mask`` asks."""
    spatial = len(x.shape) - 2
    kernel = list(w.shape[2:])
    out = [out_size(x.shape[2 + k], kernel[k], stride[k], padding[k], dilation[k]) for k in range(spatial)]
    n, channels, out_channels = x.shape[0], x.shape[1], w.shape[0]
    k_total, rows = math.prod(kernel), n * math.prod(out)
    # grad_output as [rows, O] (the forward's result layout before its final transpose)
    g_rows = c.b.reshape(c.b.transpose(grad, [0, *range(2, 2 + spatial), 1]), (rows, out_channels))
    gx: Op | None = None
    gw: Op | None = None
    if mask[1]:
        windows = c.b.reshape(patches(c.b, x, kernel, stride, [(p, p) for p in padding], dilation, out),
                              (rows, channels * k_total))
        gw = c.b.reshape(c.b.dot(c.b.transpose(g_rows, [1, 0]), windows), tuple(w.shape))  # [O, C*K]
    if mask[0]:
        gp = c.b.dot(g_rows, c.b.reshape(w, (out_channels, channels * k_total)))  # [rows, C*K]
        gp = c.b.reshape(gp, (n, *out, channels, k_total))
        gp = c.b.transpose(gp, [0, 1 + spatial, *range(1, 1 + spatial), 2 + spatial])  # [N,C,*out,K]
        slabs = [c.b.reshape(c.b.slice(gp, [0] * (2 + spatial) + [j], [*gp.shape[:-1], j + 1],
                                       [1] * (3 + spatial)), gp.shape[:-1]) for j in range(k_total)]
        gx = _fold(c, slabs, kernel, stride, dilation, padding, list(x.shape[2:]))
    return gx, gw


def _first_maxima(c: _Converter, reads: Sequence[Op], best: Op) -> Iterator[Op]:
    """Per window offset, in torch's scan order, where that offset's read holds its window's
    maximum and no earlier offset's did: a max pool routes each window's gradient to the first
    input holding its maximum. A generator, so a caller's ops for one offset are made before the
    next offset's (the graph's op order, hence its programs, as when this loop was written out)."""
    taken: Op | None = None  # windows whose maximum has been routed already (first offset wins)
    for read in reads:
        hit = c.b.compare(read, best, "EQ")
        if taken is not None:
            hit = c.b.minimum(hit, c.b.compare(taken, 0.0, "EQ"))
            taken = c.b.maximum(taken, hit)
        else:
            taken = hit
        yield hit


@handles("max_pool2d_with_indices_backward", "max_pool3d_with_indices_backward")
def max_pool_backward(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    _shape, dtype = c._out(node)
    if not dtype.is_float:
        return NotImplemented
    grad = c._op(kw["grad_output"], dtype)
    x = c._op(kw["self"], dtype)
    spatial = len(x.shape) - 2
    kernel = _ints(kw["kernel_size"], spatial)
    stride = _ints(kw.get("stride") or kernel, spatial)
    padding, dilation = _ints(kw.get("padding", 0), spatial), _ints(kw.get("dilation", 1), spatial)
    out = list(grad.shape[2:])
    # ceil_mode: the last windows reach past the padded input (their out size is grad's)
    extra = [max(0, (o - 1) * s + d * (k - 1) + 1 - (n + 2 * p))
             for o, s, d, k, n, p in zip(out, stride, dilation, kernel, x.shape[2:], padding)]
    padded = pad_spatial(c.b, x, [(p, p + e) for p, e in zip(padding, extra)], _lowest(dtype))
    slices = window_slices(c.b, padded, kernel, stride, dilation, out)
    best = slices[0]
    for s in slices[1:]:
        best = c.b.maximum(best, s)
    slabs = [c.b.select(hit, grad, 0.0) for hit in _first_maxima(c, slices, best)]
    return _fold(c, slabs, kernel, stride, dilation, padding, list(x.shape[2:]), extra)


@handles("_adaptive_avg_pool2d_backward")
def adaptive_avg_pool_backward(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    """The gradient of adaptive average pooling: the output gradient contracted with each dim's
    averaging matrix the other way (``torch_conv.adaptive_average_matrix``), as a linear resize's
    backward contracts with its interpolation matrix."""
    shape, dtype = c._out(node)  # the input's
    if not dtype.is_float:
        return NotImplemented
    grad = c._op(kw["grad_output"], dtype)
    spatial = len(shape) - 2
    return _interpolate_dims(c, node, grad, shape, dtype, adaptive_average_matrix, [None] * spatial,
                             False, backward=True)


@handles("adaptive_max_pool2d_backward")
def adaptive_max_pool_backward(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    """The gradient of ``torch_conv.adaptive_max_pool``, as ``max_pool_backward``'s: the window
    maxima recomputed from the input; each window's gradient goes to the first input (torch's scan
    order) holding its maximum, and each offset's share is placed back at the positions it was read
    from (``frontends.flip.place_constant``, the read's transpose). The saved indices are not read."""
    shape, dtype = c._out(node)
    if not dtype.is_float:
        return NotImplemented
    grad = c._op(kw["grad_output"], dtype)
    x = c._op(kw["self"], dtype)
    out = list(grad.shape[2:])
    reads = adaptive_window_reads(c, x, out, node.name)
    best = reads[0]
    for r in reads[1:]:
        best = c.b.maximum(best, r)
    offsets = [adaptive_offsets(x.shape[2 + k], o) for k, o in enumerate(out)]
    total: Op | None = None
    for hit, offset in zip(_first_maxima(c, reads, best),
                           itertools.product(*(range(len(o)) for o in offsets))):
        placed = c.b.select(hit, grad, 0.0)
        for k in reversed(range(len(out))):
            placed = place_constant(c.b, placed, 2 + k, offsets[k][offset[k]], shape[2 + k],
                                    f"{node.name}_place_{k}_{offset[k]}")
        total = placed if total is None else c.b.add(total, placed)
    return total


__all__ = ["adaptive_avg_pool_backward", "adaptive_max_pool_backward", "convolution_backward",
           "max_pool_backward"]
