"""Convolutions (direct and transposed), pooling, batch norm (eval), group norm and nearest and
linear (bilinear, trilinear) upsampling for the PyTorch frontend, as ops the core already runs.

Convolutions lower through ``conv_lowering`` (shared with the JAX frontend): im2col + one
Tensor-engine matmul; a transposed convolution is a convolution of the zero-spread input with the
flipped kernel (or, when its kernel equals its stride, one matmul whose columns are the kernel
offsets).

Max and average pooling are one ``reduce-window`` op each (``conv_lowering.reduce_window``: the
window offsets combined on the Vector engine over shifted access patterns of the on-chip tile;
average is the sum times 1/k); global average pooling is one reduction along the free dim;
batch norm (eval) is a per-channel scale and shift; group norm reduces over each group's channels
and positions; nearest upsampling by integer factors is a broadcast; linear upsampling (bilinear
and its 1-D and 3-D forms) contracts each spatial dim with a constant interpolation matrix on the
Tensor engine (``conv_lowering.interpolation_matrix``, torch's source-index rule).
"""

from __future__ import annotations

import math
import operator
import types
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from neuroncore.dtypes import DType
from neuroncore.frontends.conv_lowering import (
    conv,
    cubic_interpolation_matrix,
    interpolation_matrix,
    out_size,
    patches,
    reduce_window,
    transposed_conv,
    weight_source,
)
from neuroncore.frontends.flip import take_constant
from neuroncore.frontends.torch_ops import handles
from neuroncore.ir.conv import BatchNormInitializer
from neuroncore.ir.graph import Op

if TYPE_CHECKING:
    from neuroncore.frontends.torch_frontend import _Converter


def _ints(value: Any, n: int) -> list[int]:
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    return [int(v) for v in values] * n if len(values) == 1 else [int(v) for v in values]


@handles("convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
         "conv_transpose3d")
def convolution(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    _shape, dtype = c._out(node)
    if not dtype.is_float:
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
    bias = c._op(kw["bias"], dtype) if kw.get("bias") is not None else None
    transposed = bool(kw.get("transposed")) or str(getattr(node.target, "_opname", "")).startswith(
        "conv_transpose")
    if transposed:
        output_padding = _ints(kw.get("output_padding", 0), spatial)
        return transposed_conv(c.b, x, w, bias, stride, padding, output_padding, dilation, groups)
    return conv(c.b, x, w, bias, stride, [(p, p) for p in padding], dilation, groups)


def _pool_geometry(x: Op, kw: dict[str, Any], spatial: int, stride_default: Any
                   ) -> tuple[list[int], list[int], list[int], list[int], list[int], list[int]]:
    """Kernel, stride, padding, dilation, output size and the extra padding after each spatial
    dim that ``ceil_mode`` needs (torch's rule: one more window when the division leaves a
    remainder, unless that window would start in the right padding; the windows past the end
    read the border value)."""
    kernel = _ints(kw["kernel_size"], spatial)
    stride = _ints(kw.get("stride") or stride_default or kernel, spatial)
    padding = _ints(kw.get("padding", 0), spatial)
    dilation = _ints(kw.get("dilation", 1), spatial)
    out, extra = [], []
    for k in range(spatial):
        size = x.shape[2 + k]
        span = size + 2 * padding[k] - dilation[k] * (kernel[k] - 1) - 1
        n = out_size(size, kernel[k], stride[k], padding[k], dilation[k])
        if kw.get("ceil_mode") and span % stride[k] and n * stride[k] < size + padding[k]:
            n += 1
        out.append(n)
        extra.append(max(0, (n - 1) * stride[k] + dilation[k] * (kernel[k] - 1) + 1
                         - (size + 2 * padding[k])))
    return kernel, stride, padding, dilation, out, extra


def _covers_input(x: Op, kernel: list[int], padding: list[int], dilation: list[int],
                  out: list[int]) -> bool:
    """One window per spatial dim, and it spans the whole input (EfficientNet's pooler: a
    1,280-wide ``ceil_mode`` window over a 7x7 map): a plain reduction."""
    return all(o == 1 and p == 0 and d * (k - 1) + 1 >= size for o, p, d, k, size in
               zip(out, padding, dilation, kernel, x.shape[2:]))


def _lowest(dtype: DType) -> float:
    return {DType.BF16: -3.3895e38, DType.FP16: -65504.0}.get(dtype, -3.4028234e38)


@handles("max_pool2d_with_indices", "max_pool1d_with_indices", "max_pool3d_with_indices", "max_pool2d",
         "max_pool1d", "max_pool3d")
def max_pool(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    meta: Any = node.meta["val"]
    values_meta = meta[0] if isinstance(meta, (list, tuple)) else meta
    dtype = c._out_dtype(values_meta)
    x = c._op(kw["self"], dtype)
    spatial = len(x.shape) - 2
    if not dtype.is_float:
        return NotImplemented
    kernel, stride, padding, dilation, out, extra = _pool_geometry(x, kw, spatial, kw.get("stride"))
    if _covers_input(x, kernel, padding, dilation, out):
        flat = c.b.reshape(x, (*x.shape[:2], math.prod(x.shape[2:])))
        result = c.b.reshape(c.b.reduce(flat, [2], "max"), (*x.shape[:2], *out))
    else:
        result = reduce_window(c.b, x, kernel, stride,
                               [(p, p + e) for p, e in zip(padding, extra)], dilation, "max",
                               _lowest(dtype))
    if not isinstance(meta, (list, tuple)):
        return result
    indices_used = any(u.target is operator.getitem and u.args[1] == 1 for u in node.users)
    if indices_used:
        return result, c._unsupported(node, str(getattr(node.target, "_opname", "max_pool")),
                                      only={1})[1]
    return result, None


@handles("avg_pool2d", "avg_pool1d", "avg_pool3d")
def avg_pool(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    _shape, dtype = c._out(node)
    x = c._op(kw["self"], dtype)
    spatial = len(x.shape) - 2
    if kw.get("divisor_override") is not None:
        return NotImplemented
    kernel, stride, padding, dilation, out, extra = _pool_geometry(
        x, {**kw, "dilation": 1}, spatial, kw.get("stride"))
    if _covers_input(x, kernel, padding, dilation, out):
        flat = c.b.reshape(x, (*x.shape[:2], math.prod(x.shape[2:])))
        total = c.b.reshape(c.b.reduce(flat, [2], "sum"), (*x.shape[:2], *out))
    else:
        total = reduce_window(c.b, x, kernel, stride, [(p, p + e) for p, e in zip(padding, extra)],
                              dilation, "sum", 0.0)
    # each window divides by what torch's kernel counts: with count_include_pad, the window cut at
    # the end of the padded input (ceil_mode's last window is shorter); without, the inputs it covers
    counts = np.ones((), np.float32)
    include_pad = kw.get("count_include_pad", True)
    for k in range(spatial):
        size = x.shape[2 + k]
        starts = np.arange(out[k]) * stride[k] - padding[k]
        ends = np.minimum(starts + kernel[k], size + padding[k])
        if not include_pad:
            starts, ends = np.clip(starts, 0, size), np.clip(ends, 0, size)
        counts = np.multiply.outer(counts, (ends - starts).astype(np.float32))
    if np.all(counts == counts.flat[0]):
        return c.b.multiply(total, 1.0 / float(counts.flat[0]))
    # uneven divisors (PoolFormer's count_include_pad=False token mixer, a ceil_mode edge): a map
    # of the output positions known at trace time (stored like a buffer)
    scale = c.b.weight(f"avg_pool_divisors.{node.name}", tuple(out), dtype, array=1.0 / counts)
    return c.b.multiply(total, c.b.broadcast_to(scale, total.shape))


@handles("_adaptive_avg_pool2d", "adaptive_avg_pool2d", "_adaptive_avg_pool1d",
         "adaptive_avg_pool1d")
def adaptive_avg_pool(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    shape, dtype = c._out(node)
    x = c._op(kw["self"], dtype)
    spatial = len(x.shape) - 2
    out = list(shape[2:])
    sizes = list(x.shape[2:])
    if len(out) != spatial:
        return NotImplemented
    if any(s % o for s, o in zip(sizes, out)):  # uneven windows: one averaging matrix per dim
        return _interpolate_dims(c, node, x, shape, dtype, adaptive_average_matrix,
                                 [None] * spatial, False, backward=False)
    if all(o == 1 for o in out):  # global pooling: one reduction along the channel-major free dim
        flat = c.b.reshape(x, (*x.shape[:2], math.prod(sizes)))
        mean = c.b.multiply(c.b.reduce(flat, [2], "sum"), 1.0 / math.prod(sizes))
        return c.b.reshape(mean, shape)
    split = c.b.reshape(x, [*x.shape[:2], *[v for o, s in zip(out, sizes) for v in (o, s // o)]])
    dims = [3 + 2 * k for k in range(spatial)]
    total = c.b.reduce(split, dims, "sum")
    return c.b.reshape(c.b.multiply(total, 1.0 / math.prod(s // o for s, o in zip(sizes, out))),
                       shape)


def adaptive_windows(size: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``[start, end)`` of each of ``out`` adaptive pooling windows over ``size`` inputs, as
    torch's kernels place them: ``floor(i * size / out)`` to ``ceil((i + 1) * size / out)`` (uneven
    when ``out`` does not divide ``size``: windows of two lengths, some overlapping)."""
    i = np.arange(out)
    return (i * size) // out, -((-(i + 1) * size) // out)


def adaptive_average_matrix(size: int, out: int, *_: Any) -> np.ndarray:
    """The constant ``[out, size]`` matrix of one dim's adaptive average pooling: row ``i`` is
    ``1 / len`` over window ``i`` (separable: a 2-D window's mean is the mean of its rows' means),
    contracted on the Tensor engine as a linear resize's interpolation matrix is."""
    start, end = adaptive_windows(size, out)
    matrix = np.zeros((out, size), np.float32)
    for i, (a, e) in enumerate(zip(start, end)):
        matrix[i, a:e] = 1.0 / float(e - a)
    return matrix


def adaptive_offsets(size: int, out: int) -> list[list[int]]:
    """Per window offset ``k`` (up to the longest window), the input position each of the ``out``
    windows reads there: ``min(start + k, end - 1)`` (a shorter window reads its last input again,
    which changes no maximum); even windows make strided slices."""
    start, end = adaptive_windows(size, out)
    longest = int((end - start).max())
    return [np.minimum(start + k, end - 1).tolist() for k in range(longest)]


def adaptive_window_reads(c: _Converter, x: Op, out: list[int], name: str) -> list[Op]:
    """``x`` [N, C, *spatial] read at every window offset of an adaptive pool to ``out``, in torch's
    scan order (the first spatial dim outermost): one ``take_constant`` per offset and dim."""
    reads = [x]
    for k, o in enumerate(out):
        dim = 2 + k
        offsets = adaptive_offsets(x.shape[dim], o)
        reads = [take_constant(c.b, r, dim, positions, f"{name}_window_{k}_{j}")
                 for r in reads for j, positions in enumerate(offsets)]
    return reads


@handles("adaptive_max_pool2d", "adaptive_max_pool1d", "adaptive_max_pool3d")
def adaptive_max_pool(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    """``nn.AdaptiveMaxPool{1,2,3}d``: the maximum over the inputs each window reads
    (:func:`adaptive_window_reads`), combined on the Vector engine as ``reduce-window`` combines a
    pool's offsets; separable, so each dim's offsets are combined before the next dim is read. The
    indices (``return_indices=True``) stay unsupported, as a max pool's."""
    meta: Any = node.meta["val"]
    values_meta = meta[0] if isinstance(meta, (list, tuple)) else meta
    dtype = c._out_dtype(values_meta)
    x = c._op(kw["self"], dtype)
    out = list(values_meta.shape[2:])
    if not dtype.is_float or len(out) != len(x.shape) - 2:
        return NotImplemented
    best = x
    for k, o in enumerate(out):
        reads = [take_constant(c.b, best, 2 + k, positions, f"{node.name}_window_{k}_{j}")
                 for j, positions in enumerate(adaptive_offsets(x.shape[2 + k], o))]
        best = reads[0]
        for r in reads[1:]:
            best = c.b.maximum(best, r)
    if not isinstance(meta, (list, tuple)):
        return best
    if any(u.target is operator.getitem and u.args[1] == 1 for u in node.users):
        return best, c._unsupported(node, _opname_of(node), only={1})[1]
    return best, None


def _opname_of(node: torch.fx.Node) -> str:
    return str(getattr(node.target, "_opname", node.target))


def _per_channel(c: _Converter, v: Op, x: Op) -> Op:
    """A [C] vector broadcast along dim 1 of ``x`` [N, C, ...]."""
    return c.b.broadcast(v, x.shape, (1,))


def _folded_batch_norm(c: _Converter, args: list[Any], dtype: DType, eps: float
                       ) -> tuple[Op, Op] | None:
    """Batch norm's per-channel scale and shift as two constants computed at compile time
    (``ir/conv.BatchNormInitializer``), when its statistics and affine parameters are trained
    constants; None when any of them is computed at run time."""
    mean, var, weight, bias = args
    ops = [mean, var, *(c._op(v, dtype) if v is not None else None for v in (weight, bias))]
    inits: list[Any] = []
    label = ""
    for op in ops:
        if op is None:
            inits.append(None)
            continue
        source = weight_source(op)
        if source is None or source[1] != tuple(range(len(op.shape))):
            return None
        inits.append(source[0].attrs["init"])
        label = label or str(source[0].attrs.get("label", source[0].name))
    channels = mean.shape[0]
    parts = []
    for part in ("scale", "shift"):
        init = BatchNormInitializer(inits[0], inits[1], inits[2], inits[3], channels, eps, part)
        const = c.b.add_op("constant", [], (channels,), DType.FP32, init=init,
                           label=f"{label.rsplit('/', 1)[0]}/bn_{part}")
        parts.append(c.b.convert(const, dtype) if dtype is not DType.FP32 else const)
    return parts[0], parts[1]


def _batch_norm(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    meta: Any = node.meta["val"]
    dtype = c._out_dtype(meta[0])
    x = c._op(kw["input"], dtype)
    channels = x.shape[1]
    eps = float(kw["eps"])
    mean = c._op(kw["running_mean"], dtype)
    var = c._op(kw["running_var"], dtype)
    used = {u.args[1] for u in node.users if u.target is operator.getitem}
    if used & {1, 2}:
        return NotImplemented  # saved statistics are training outputs
    folded = _folded_batch_norm(c, [mean, var, kw.get("weight"), kw.get("bias")], dtype, eps)
    if folded is not None:  # trained statistics: scale and shift are constants
        scale, shift = folded
        return c.b.add(c.b.multiply(x, _per_channel(c, scale, x)), _per_channel(c, shift, x)), None, None
    scale = c.b.rsqrt(c.b.add(var, eps))
    if kw.get("weight") is not None:
        scale = c.b.multiply(scale, c._op(kw["weight"], dtype))
    shift = c.b.negate(c.b.multiply(mean, scale))
    if kw.get("bias") is not None:
        shift = c.b.add(shift, c._op(kw["bias"], dtype))
    assert scale.shape == (channels,)
    out = c.b.add(c.b.multiply(x, _per_channel(c, scale, x)), _per_channel(c, shift, x))
    return out, None, None


@handles("_native_batch_norm_legit_no_training")
def batch_norm_eval(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    return _batch_norm(c, node, kw)


@handles("native_batch_norm", "_native_batch_norm_legit_functional", "_native_batch_norm_legit")
def batch_norm(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    """Batch norm; ``_native_batch_norm_legit`` without running statistics is how
    ``nn.InstanceNorm*`` (and ``F.instance_norm``) normalise: each (image, channel) as a channel
    of a batch of one, in train mode."""
    if kw.get("training"):
        return _batch_norm_training(c, node, kw)
    return _batch_norm(c, node, kw)


def _batch_norm_training(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    """Batch norm in train mode (a training step's forward): batch statistics over every dim but
    the channel; returns ``(out, mean, 1/sqrt(var + eps))`` as torch does, for the backward. The
    running statistics' updates (``(1 - m) r + m s``, the variance unbiased) are handed to a
    converter that keeps them (``buffer_updates``, the training step's) as new buffer values."""
    meta: Any = node.meta["val"]
    dtype = c._out_dtype(meta[0])
    momentum = kw.get("momentum")
    if momentum is None or not dtype.is_float:
        return NotImplemented  # a cumulative moving average (momentum=None) counts batches on host
    x = c._op(kw["input"], dtype)
    dims = [0, *range(2, len(x.shape))]
    count = math.prod(x.shape[d] for d in dims)
    mean = c.b.multiply(c.b.reduce(x, dims, "sum"), 1.0 / count)
    centred = c.b.subtract(x, _per_channel(c, mean, x))
    var = c.b.multiply(c.b.reduce(c.b.multiply(centred, centred), dims, "sum"), 1.0 / count)
    invstd = c.b.rsqrt(c.b.add(var, float(kw["eps"])))
    scale = invstd if kw.get("weight") is None else c.b.multiply(invstd, c._op(kw["weight"], dtype))
    out = c.b.multiply(centred, _per_channel(c, scale, x))
    if kw.get("bias") is not None:
        out = c.b.add(out, _per_channel(c, c._op(kw["bias"], dtype), x))
    updates = getattr(c, "buffer_updates", None)
    m = float(momentum)
    for key, stat in (("running_mean", mean), ("running_var", c.b.multiply(var, count / max(count - 1, 1)))):
        if kw.get(key) is None:  # no running statistics (instance norm): nothing to update
            continue
        running = c._value(kw.get(key))
        if updates is not None and isinstance(running, Op) and running.opcode == "parameter":
            updates[running.name] = c.b.add(c.b.multiply(running, 1.0 - m), c.b.multiply(stat, m))
    return out, mean, invstd


@handles("native_group_norm")
def group_norm(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    meta: Any = node.meta["val"]
    dtype = c._out_dtype(meta[0])
    x = c._op(kw["input"], dtype)
    n, channels = x.shape[0], x.shape[1]
    groups = int(kw["group"])
    positions = math.prod(x.shape[2:])
    # [N, G, C/G, positions]: each sum runs over one channel's positions first, then over the
    # group's channels, so no partition row holds a whole group (SD's 320 channels / 32 groups at
    # 64x64 would be 40,960 values, more than a partition of SBUF)
    grouped = c.b.reshape(x, (n, groups, channels // groups, positions))
    count = float(channels // groups * positions)

    def group_sum(v: Op) -> Op:
        return c.b.reduce(c.b.reduce(v, [3], "sum"), [2], "sum")  # [N, G]

    def spread(v: Op) -> Op:
        return c.b.broadcast(v, grouped.shape, (0, 1))

    mean = c.b.multiply(group_sum(grouped), 1.0 / count)
    centred = c.b.subtract(grouped, spread(mean))
    var = c.b.multiply(group_sum(c.b.multiply(centred, centred)), 1.0 / count)
    rstd = c.b.rsqrt(c.b.add(var, float(kw["eps"])))
    out = c.b.reshape(c.b.multiply(centred, spread(rstd)), x.shape)
    if kw.get("weight") is not None:
        out = c.b.multiply(out, _per_channel(c, c._op(kw["weight"], dtype), out))
    if kw.get("bias") is not None:
        out = c.b.add(out, _per_channel(c, c._op(kw["bias"], dtype), out))
    used = {u.args[1] for u in node.users if u.target is operator.getitem}
    stats: list[Op | None] = [None, None]
    if used & {1, 2}:
        stats = [c.b.reshape(mean, tuple(meta[1].shape)), c.b.reshape(rstd, tuple(meta[2].shape))]
    return out, stats[0], stats[1]


def nearest_positions(input_size: Sequence[int], output_size: Sequence[int],
                      scales: Sequence[float | None], exact: bool,
                      device: torch.device | None = None) -> list[torch.Tensor]:
    """Per resized (trailing) dim, the input position each output position reads in a nearest
    resize (an int64 vector): torch's own rule (``_compute_upsample_nearest_indices``:
    ``floor(o * in / out)``, or ``floor((o + 0.5) * in / out)`` for ``nearest-exact``, in fp32), so
    the forward and the training step's backward (which traces it, ``device`` its gradient's) read
    the same positions."""
    from torch._decomp.decompositions import _compute_upsample_nearest_indices

    shaped = types.SimpleNamespace(shape=tuple(input_size), device=device or torch.device("cpu"))
    reads = _compute_upsample_nearest_indices(shaped, list(output_size),
                                              list(scales) or [None] * len(output_size), exact=exact)
    return [r.reshape(-1) for r in reads]


@handles("upsample_nearest2d", "upsample_nearest1d", "upsample_nearest3d", "_upsample_nearest_exact1d",
         "_upsample_nearest_exact2d", "_upsample_nearest_exact3d")
def upsample_nearest(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    """Nearest resizes: by integer factors (``nearest``) a broadcast; otherwise (``nearest-exact``,
    non-integer factors) each dim read at :func:`nearest_positions` (``flip.take_constant``)."""
    shape, dtype = c._out(node)
    x = c._op(kw.get("self", kw.get("input")), dtype)
    sizes, out = list(x.shape[2:]), list(shape[2:])
    exact = "exact" in str(node.target)
    if exact or any(o % s for s, o in zip(sizes, out)):
        scales = kw.get("scale_factors") or [kw.get(n) for n in ("scales_d", "scales_h", "scales_w",
                                                                 "scales") if n in kw]
        positions = nearest_positions(x.shape, out, scales if len(scales) == len(out) else [], exact)
        for k, read in enumerate(positions):
            x = take_constant(c.b, x, 2 + k, read.tolist(), f"{node.name}_positions_{k}")
        return x
    factors = [o // s for s, o in zip(sizes, out)]
    split = c.b.reshape(x, [*x.shape[:2], *[v for s in sizes for v in (s, 1)]])
    spread = c.b.broadcast_to(split, [*x.shape[:2], *[v for s, f in zip(sizes, factors)
                                                        for v in (s, f)]])
    return c.b.reshape(spread, shape)




def _interpolate_dims(c: _Converter, node: torch.fx.Node, x: Any, shape: tuple[int, ...], dtype: DType,
                      matrix_of: Callable[..., np.ndarray], factors: list[Any], align: bool, *,
                      backward: bool) -> Any:
    """Contracts each spatial dim of ``x`` (moved last) with its constant ``[out, in]``
    interpolation matrix ``M``: ``x @ M.T`` resizes (the forward), ``x @ M`` takes a resize's
    output gradient back to the input's size (the backward: the same matrix and taps). ``shape``
    is the forward input's size in the backward and the forward output's in the forward."""
    for k in range(len(shape) - 2):
        dim = 2 + k
        size, out = (shape[dim], x.shape[dim]) if backward else (x.shape[dim], shape[dim])
        if size == out and (align or factors[k] in (None, 1.0)):
            continue
        rank = len(x.shape)
        order = [d for d in range(rank) if d != dim] + [dim]
        moved = x if dim == rank - 1 else c.b.transpose(x, order)
        flat = c.b.reshape(moved, (-1, out if backward else size))
        # named after the node: weights of one label share one HBM tensor (a tied weight), so two
        # resizes in one layer with matrices of their own must not share a name
        matrix = c.b.weight(f"{node.name}_interpolation_{k}", (out, size), dtype,
                            array=matrix_of(size, out, align, factors[k]))
        result = c.b.dot(flat, matrix, rhs_contract=0 if backward else -1, out_dtype=dtype)
        result = c.b.reshape(result, (*moved.shape[:-1], size if backward else out))
        x = result if dim == rank - 1 else c.b.transpose(result, list(np.argsort(order)))
    return x


@handles("upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d", "upsample_bicubic2d")
def upsample_linear(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    """Linear and bicubic interpolation, separable: each spatial dim is moved last and contracted
    with its constant ``[out, in]`` interpolation matrix (one Tensor-engine matmul per dim, the
    result kept in the input's dtype: torch does not auto-cast resizes). Bicubic (ViT's position
    embeddings under ``interpolate_pos_encoding``) has four taps per row instead of two."""
    shape, dtype = c._out(node)
    if not dtype.is_float:
        return NotImplemented
    cubic = "bicubic" in str(node.target)
    matrix_of = cubic_interpolation_matrix if cubic else interpolation_matrix
    x = c._op(kw.get("self", kw.get("input")), dtype)
    spatial = len(x.shape) - 2
    factors = kw.get("scale_factors")
    if factors is None:
        names = {1: ["scales"], 2: ["scales_h", "scales_w"], 3: ["scales_d", "scales_h", "scales_w"]}
        factors = [kw.get(n) for n in names[spatial]]
    return _interpolate_dims(c, node, x, shape, dtype, matrix_of, factors,
                             bool(kw.get("align_corners")), backward=False)


__all__ = ["convolution", "upsample_linear"]


@handles("im2col")
def im2col(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    """``F.unfold`` (im2col: ConvBERT's span-based dynamic convolution, users' patch extraction):
    ``[N, C, H, W]`` -> ``[N, C*kh*kw, L]``, the input under each window, as the convolution's
    own im2col builds its patches (one strided slice per kernel offset, ``conv_lowering.patches``),
    then ordered channel-major as torch orders the rows. Kept out of the core-ATen decomposition,
    whose gathers at computed 2-D indices were listed as unsupported ``aten.index``
    (``modeling_convbert.py:209``)."""
    shape, dtype = c._out(node)
    x = c._op(kw["self"], dtype)
    batched = len(x.shape) == 4
    if not batched:
        x = c.b.reshape(x, (1, *x.shape))
    kernel, dilation = list(kw["kernel_size"]), list(kw["dilation"])
    padding, stride = list(kw["padding"]), list(kw["stride"])
    out = [out_size(n, k, s, p, d) for n, k, s, p, d in zip(x.shape[2:], kernel, stride, padding, dilation)]
    windows = patches(c.b, x, kernel, stride, [(p, p) for p in padding], dilation, out)  # [N, oh, ow, C, k]
    n, channels = x.shape[0], x.shape[1]
    rows = c.b.reshape(windows, (n, math.prod(out), channels * math.prod(kernel)))
    result = c.b.transpose(rows, [0, 2, 1])
    return result if batched else c.b.reshape(result, shape)


@handles("upsample_linear1d_backward", "upsample_bilinear2d_backward", "upsample_trilinear3d_backward",
         "upsample_bicubic2d_backward")
def upsample_linear_backward(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    """The gradient of :func:`upsample_linear`: the forward contracts each spatial dim with its
    ``[out, in]`` interpolation matrix ``M``, so the backward contracts the output gradient's dim
    with ``M`` the other way (``grad_in = grad_out @ M``, the same matrix and taps), one matmul per
    dim. A training step through ``F.interpolate(mode="linear" / "bilinear" / ...)`` (a UNet's or a
    segmentation head's upsampling) was refused with ``aten.upsample_linear1d_backward``."""
    shape, dtype = c._out(node)  # the input's size
    if not dtype.is_float:
        return NotImplemented
    cubic = "bicubic" in str(node.target)
    matrix_of = cubic_interpolation_matrix if cubic else interpolation_matrix
    x = c._op(kw["grad_output"], dtype)
    spatial = len(shape) - 2
    names = {1: ["scales"], 2: ["scales_h", "scales_w"], 3: ["scales_d", "scales_h", "scales_w"]}
    factors = [kw.get(n) for n in names[spatial]]
    return _interpolate_dims(c, node, x, shape, dtype, matrix_of, factors,
                             bool(kw.get("align_corners")), backward=True)
