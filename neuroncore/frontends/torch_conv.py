"""Convolutions, pooling, batch norm (eval), group norm and nearest upsampling for the PyTorch
frontend, as ops the core already runs.

**Convolution is im2col + one Tensor-engine matmul**, the way a compiler for a systolic array tiles
it: the input is zero-padded (concatenations with zero constants), each of the ``kh x kw`` kernel
offsets is a strided slice of the padded input (an HBM access pattern the next DMA reads, no copy),
the slices are stacked into patches ``[N*OH*OW, C*kh*kw]`` and contracted with the weight read as
``[O, C*kh*kw]``. So the contraction (``C*kh*kw``) lands on the PE array's 128 partitions and the
output pixels stream as the moving side, like any linear layer; the output is ``[N, O, OH, OW]``
again. Grouped and depthwise convolutions are one *batched* matmul with the group as the batch dim
(contraction ``C/groups * kh*kw`` per group). A convolution whose kernel equals its stride without
padding (ViT's and CLIP's patch embedding) needs no slices: a reshape and a transpose make the
patches. 1-D and 3-D convolutions use the same code (one or three spatial dims).

Pooling takes the same strided slices and combines them on the Vector engine (max / sum * 1/k);
batch norm (eval) is a per-channel scale and shift; group norm reduces over each group's channels
and positions; nearest upsampling by integer factors is a broadcast.
"""

from __future__ import annotations

import itertools
import math
import operator
from typing import TYPE_CHECKING, Any

import torch

from neuroncore.dtypes import DType
from neuroncore.frontends.torch_ops import handles
from neuroncore.ir.graph import Op

if TYPE_CHECKING:
    from neuroncore.frontends.torch_frontend import _Converter


def _ints(value: Any, n: int) -> list[int]:
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    return [int(v) for v in values] * n if len(values) == 1 else [int(v) for v in values]


def pad_spatial(c: _Converter, x: Op, pads: list[tuple[int, int]], fill: float = 0.0) -> Op:
    """``x`` [N, C, *spatial] with ``(before, after)`` entries of ``fill`` around each spatial dim."""
    for k, (before, after) in enumerate(pads):
        dim = 2 + k
        parts = []
        for width in (before, after):
            shape = list(x.shape)
            shape[dim] = width
            parts.append(c.b.constant(fill, x.dtype, shape=shape) if width else None)
        pieces = [p for p in (parts[0], x, parts[1]) if p is not None]
        if len(pieces) > 1:
            x = c.b.concatenate(pieces, dim)
    return x


def window_slices(c: _Converter, x: Op, kernel: list[int], stride: list[int], dilation: list[int],
                  out: list[int]) -> list[Op]:
    """One strided slice of ``x`` [N, C, *spatial] per kernel offset, each [N, C, *out]."""
    rank = len(x.shape)
    slices = []
    for offset in itertools.product(*(range(k) for k in kernel)):
        starts, limits, strides = [0] * rank, list(x.shape), [1] * rank
        for k, o in enumerate(offset):
            starts[2 + k] = o * dilation[k]
            limits[2 + k] = starts[2 + k] + (out[k] - 1) * stride[k] + 1
            strides[2 + k] = stride[k]
        whole = starts == [0] * rank and limits == list(x.shape) and strides == [1] * rank
        slices.append(x if whole else c.b.slice(x, starts, limits, strides))
    return slices


def _out_size(size: int, kernel: int, stride: int, pad: int, dilation: int) -> int:
    return (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1


def _patches(c: _Converter, x: Op, kernel: list[int], stride: list[int], padding: list[int],
             dilation: list[int], out: list[int]) -> Op:
    """[N, *out, C, prod(kernel)]: the input under each output position's window."""
    n, channels = x.shape[0], x.shape[1]
    spatial = len(kernel)
    k_total = math.prod(kernel)
    if kernel == stride and not any(padding) and all(d == 1 for d in dilation):
        # non-overlapping windows: cut the spatial dims into (out, kernel) pairs
        used = [o * k for o, k in zip(out, kernel)]
        if used != list(x.shape[2:]):
            x = c.b.slice(x, [0] * len(x.shape), [n, channels, *used])
        split = c.b.reshape(x, [n, channels, *[v for o, k in zip(out, kernel) for v in (o, k)]])
        outs = [2 + 2 * k for k in range(spatial)]
        kerns = [3 + 2 * k for k in range(spatial)]
        moved = c.b.transpose(split, [0, *outs, 1, *kerns])
        return c.b.reshape(moved, [n, *out, channels, k_total])
    padded = pad_spatial(c, x, [(p, p) for p in padding])
    slices = window_slices(c, padded, kernel, stride, dilation, out)
    stacked = slices[0] if k_total == 1 else c.b.concatenate(
        [c.b.reshape(s, (*s.shape, 1)) for s in slices], len(x.shape))
    stacked = c.b.reshape(stacked, [n, channels, *out, k_total])
    return c.b.transpose(stacked, [0, *range(2, 2 + spatial), 1, 2 + spatial])


@handles("convolution", "conv1d", "conv2d", "conv3d")
def convolution(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    _shape, dtype = c._out(node)
    if kw.get("transposed") or not dtype.is_float:
        return NotImplemented
    x = c._op(kw["input"], dtype)
    w = c._op(kw["weight"], dtype)
    spatial = len(x.shape) - 2
    if spatial < 1 or len(w.shape) != spatial + 2:
        return NotImplemented
    padding_arg = kw.get("padding", 0)
    if isinstance(padding_arg, str):
        return NotImplemented  # "same"/"valid" appear only before decomposition
    stride, padding = _ints(kw.get("stride", 1), spatial), _ints(padding_arg, spatial)
    dilation, groups = _ints(kw.get("dilation", 1), spatial), int(kw.get("groups", 1) or 1)
    kernel = list(w.shape[2:])
    out = [_out_size(x.shape[2 + k], kernel[k], stride[k], padding[k], dilation[k])
           for k in range(spatial)]
    n, channels, out_channels = x.shape[0], x.shape[1], w.shape[0]
    k_total = math.prod(kernel)
    per_group = channels // groups
    patches = _patches(c, x, kernel, stride, padding, dilation, out)  # [N, *out, C, K]
    rows = n * math.prod(out)
    if groups == 1:
        flat = c.b.reshape(patches, (rows, channels * k_total))
        result = c.b.dot(flat, c.b.reshape(w, (out_channels, channels * k_total)), rhs_contract=-1)
    else:
        grouped = c.b.reshape(patches, (rows, groups, per_group * k_total))
        lhs = c.b.transpose(grouped, [1, 0, 2])  # [G, rows, C/G*K]
        weights = c.b.reshape(w, (groups, out_channels // groups, per_group * k_total))
        per = c.b.dot(lhs, weights, rhs_contract=-1)  # [G, rows, O/G]
        result = c.b.reshape(c.b.transpose(per, [1, 0, 2]), (rows, out_channels))
    if kw.get("bias") is not None:
        result = c.b.add(result, c.b.broadcast_to(c._op(kw["bias"], dtype), result.shape))
    result = c.b.reshape(result, (n, *out, out_channels))
    return c.b.transpose(result, [0, spatial + 1, *range(1, spatial + 1)])


def _pool_geometry(x: Op, kw: dict[str, Any], spatial: int, stride_default: Any
                   ) -> tuple[list[int], list[int], list[int], list[int], list[int]] | None:
    kernel = _ints(kw["kernel_size"], spatial)
    stride = _ints(kw.get("stride") or stride_default or kernel, spatial)
    padding = _ints(kw.get("padding", 0), spatial)
    dilation = _ints(kw.get("dilation", 1), spatial)
    if kw.get("ceil_mode"):
        return None
    out = [_out_size(x.shape[2 + k], kernel[k], stride[k], padding[k], dilation[k])
           for k in range(spatial)]
    return kernel, stride, padding, dilation, out


def _lowest(dtype: DType) -> float:
    return {DType.BF16: -3.3895e38, DType.FP16: -65504.0}.get(dtype, -3.4028234e38)


@handles("max_pool2d_with_indices", "max_pool1d_with_indices", "max_pool2d", "max_pool1d")
def max_pool(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    meta: Any = node.meta["val"]
    values_meta = meta[0] if isinstance(meta, (list, tuple)) else meta
    dtype = c._out_dtype(values_meta)
    x = c._op(kw["self"], dtype)
    spatial = len(x.shape) - 2
    geometry = _pool_geometry(x, kw, spatial, kw.get("stride"))
    if geometry is None or not dtype.is_float:
        return NotImplemented
    kernel, stride, padding, dilation, out = geometry
    padded = pad_spatial(c, x, [(p, p) for p in padding], _lowest(dtype))
    slices = window_slices(c, padded, kernel, stride, dilation, out)
    result = slices[0]
    for s in slices[1:]:
        result = c.b.maximum(result, s)
    if not isinstance(meta, (list, tuple)):
        return result
    indices_used = any(u.target is operator.getitem and u.args[1] == 1 for u in node.users)
    if indices_used:
        return result, c._unsupported(node, str(getattr(node.target, "_opname", "max_pool")),
                                      only={1})[1]
    return result, None


@handles("avg_pool2d", "avg_pool1d")
def avg_pool(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    _shape, dtype = c._out(node)
    x = c._op(kw["self"], dtype)
    spatial = len(x.shape) - 2
    geometry = _pool_geometry(x, {**kw, "dilation": 1}, spatial, kw.get("stride"))
    if geometry is None or kw.get("divisor_override") is not None:
        return NotImplemented
    kernel, stride, padding, dilation, out = geometry
    if any(padding) and not kw.get("count_include_pad", True):
        return NotImplemented
    padded = pad_spatial(c, x, [(p, p) for p in padding])
    slices = window_slices(c, padded, kernel, stride, dilation, out)
    total = slices[0]
    for s in slices[1:]:
        total = c.b.add(total, s)
    return c.b.multiply(total, 1.0 / math.prod(kernel))


@handles("_adaptive_avg_pool2d", "adaptive_avg_pool2d", "_adaptive_avg_pool1d",
         "adaptive_avg_pool1d")
def adaptive_avg_pool(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    shape, dtype = c._out(node)
    x = c._op(kw["self"], dtype)
    spatial = len(x.shape) - 2
    out = list(shape[2:])
    sizes = list(x.shape[2:])
    if len(out) != spatial or any(s % o for s, o in zip(sizes, out)):
        return NotImplemented  # uneven windows
    split = c.b.reshape(x, [*x.shape[:2], *[v for o, s in zip(out, sizes) for v in (o, s // o)]])
    dims = [3 + 2 * k for k in range(spatial)]
    total = c.b.reduce(split, dims, "sum")
    return c.b.reshape(c.b.multiply(total, 1.0 / math.prod(s // o for s, o in zip(sizes, out))),
                       shape)


def _per_channel(c: _Converter, v: Op, x: Op) -> Op:
    """A [C] vector broadcast along dim 1 of ``x`` [N, C, ...]."""
    return c.b.broadcast(v, x.shape, (1,))


def _batch_norm(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    meta: Any = node.meta["val"]
    dtype = c._out_dtype(meta[0])
    x = c._op(kw["input"], dtype)
    channels = x.shape[1]
    eps = float(kw["eps"])
    mean = c._op(kw["running_mean"], dtype)
    var = c._op(kw["running_var"], dtype)
    scale = c.b.rsqrt(c.b.add(var, eps))
    if kw.get("weight") is not None:
        scale = c.b.multiply(scale, c._op(kw["weight"], dtype))
    shift = c.b.negate(c.b.multiply(mean, scale))
    if kw.get("bias") is not None:
        shift = c.b.add(shift, c._op(kw["bias"], dtype))
    assert scale.shape == (channels,)
    out = c.b.add(c.b.multiply(x, _per_channel(c, scale, x)), _per_channel(c, shift, x))
    used = {u.args[1] for u in node.users if u.target is operator.getitem}
    if used & {1, 2}:
        return NotImplemented  # saved statistics are training outputs
    return out, None, None


@handles("_native_batch_norm_legit_no_training")
def batch_norm_eval(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    return _batch_norm(c, node, kw)


@handles("native_batch_norm", "_native_batch_norm_legit_functional")
def batch_norm(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    if kw.get("training"):
        return NotImplemented
    return _batch_norm(c, node, kw)


@handles("native_group_norm")
def group_norm(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    meta: Any = node.meta["val"]
    dtype = c._out_dtype(meta[0])
    x = c._op(kw["input"], dtype)
    n, channels = x.shape[0], x.shape[1]
    groups = int(kw["group"])
    positions = math.prod(x.shape[2:])
    grouped = c.b.reshape(x, (n, groups, channels // groups * positions))
    mean, var = c._variance(grouped, [2], 0.0)
    rstd = c.b.rsqrt(c.b.add(var, float(kw["eps"])))
    normed = c.b.multiply(c.b.subtract(grouped, c.b.broadcast_to(mean, grouped.shape)),
                          c.b.broadcast_to(rstd, grouped.shape))
    out = c.b.reshape(normed, x.shape)
    if kw.get("weight") is not None:
        out = c.b.multiply(out, _per_channel(c, c._op(kw["weight"], dtype), out))
    if kw.get("bias") is not None:
        out = c.b.add(out, _per_channel(c, c._op(kw["bias"], dtype), out))
    used = {u.args[1] for u in node.users if u.target is operator.getitem}
    stats: list[Op | None] = [None, None]
    if used & {1, 2}:
        stats = [c.b.reshape(mean, tuple(meta[1].shape)), c.b.reshape(rstd, tuple(meta[2].shape))]
    return out, stats[0], stats[1]


@handles("upsample_nearest2d", "upsample_nearest1d", "_upsample_nearest_exact2d")
def upsample_nearest(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    shape, dtype = c._out(node)
    x = c._op(kw.get("self", kw.get("input")), dtype)
    sizes, out = list(x.shape[2:]), list(shape[2:])
    if any(o % s for s, o in zip(sizes, out)):
        return NotImplemented  # only integer factors are a broadcast
    factors = [o // s for s, o in zip(sizes, out)]
    split = c.b.reshape(x, [*x.shape[:2], *[v for s in sizes for v in (s, 1)]])
    spread = c.b.broadcast_to(split, [*x.shape[:2], *[v for s, f in zip(sizes, factors)
                                                        for v in (s, f)]])
    return c.b.reshape(spread, shape)


__all__ = ["convolution", "pad_spatial", "window_slices"]
