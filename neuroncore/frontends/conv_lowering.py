"""Convolution lowerings shared by the PyTorch and JAX frontends, on the builder alone (no framework
imported): implicit-GEMM convolutions and pools, im2col convolutions, transposed convolutions,
padding and window slices, and linear interpolation matrices.

**A convolution with a trained (constant) weight is one ``convolution`` op** on channel-major
activations (``neuroncore/ir/conv.py``): the input is reshaped to ``[N, C, H*W]``, the weight is
stored in the block layout the compiler loads (rearranged at compile time, like neuronx-cc's weight
layout pass), and the compiler lowers it as implicit GEMM (``compiler/lower_conv.py``): each input
tile is read into SBUF once and the Tensor engine accumulates the kernel offsets into PSUM with
moving operands that are shifted access patterns over it. Stride, padding, dilation, groups
(depthwise included), input dilation (transposed convolutions) and 1-D/2-D/3-D all map onto it.
Max and average pooling are likewise one ``reduce-window`` op. What follows is the fallback for a
weight computed at run time (a training step's parameters, a JAX argument) and for negative padding.

**Otherwise a convolution is im2col + one Tensor-engine matmul**, the way a compiler for a systolic
array tiles it: the input is zero-padded (concatenations with zero constants), each of the ``kh x kw`` kernel
offsets is a strided slice of the padded input (an HBM access pattern the next DMA reads, no copy),
the slices are stacked into patches ``[N*OH*OW, C*kh*kw]`` and contracted with the weight read as
``[O, C*kh*kw]``. So the contraction (``C*kh*kw``) lands on the PE array's 128 partitions and the
output pixels stream as the moving side, like any linear layer; the output is ``[N, O, OH, OW]``
again. Grouped and depthwise convolutions are one *batched* matmul with the group as the batch dim
(contraction ``C/groups * kh*kw`` per group). A convolution whose kernel equals its stride without
padding (ViT's and CLIP's patch embedding) needs no slices: a reshape and a transpose make the
patches. 1-D and 3-D convolutions use the same code (one or three spatial dims).

A transposed convolution (``transposed_conv``) is a convolution of the input spread with
``stride - 1`` zeros, with the kernel flipped; when its kernel equals its stride it is one matmul
whose output columns are the kernel offsets. Input dilation (XLA's ``lhs_dilate``) is the same
zero spreading (``zero_insert``).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from neuroncore.dtypes import DType
from neuroncore.ir.builder import GraphBuilder
from neuroncore.ir.conv import (
    ConvChannels,
    ConvWeightInitializer,
    WindowGeometry,
    choose_group_block,
    weight_blocks_shape,
)
from neuroncore.ir.graph import Op


def weight_source(w: Op) -> tuple[Op, tuple[int, ...]] | None:
    """The trained constant a weight operand reads (through casts and transposes), with the
    permutation that makes it the operand: None when the weight is computed at run time."""
    perm = list(range(len(w.shape)))
    while w.opcode in ("convert", "transpose"):
        if w.opcode == "transpose":
            inner = w.attrs["permutation"]
            perm = [inner[i] for i in perm]
        w = w.operands[0]
    if w.opcode != "constant" or "init" not in w.attrs or len(w.shape) != len(perm):
        return None
    return w, tuple(perm)


def window_geometry(x: Op, kernel: list[int], stride: list[int], pads: list[tuple[int, int]],
                    dilation: list[int], lhs_dilation: list[int] | None = None) -> WindowGeometry:
    spatial = len(kernel)
    return WindowGeometry(tuple(x.shape[2:]), tuple(kernel), tuple(stride),
                          tuple((int(a), int(b)) for a, b in pads), tuple(dilation),
                          tuple(lhs_dilation or [1] * spatial))


def implicit_gemm_conv(b: GraphBuilder, x: Op, w: Op, bias: Op | None, stride: list[int],
                       pads: list[tuple[int, int]], dilation: list[int], groups: int, *,
                       lhs_dilation: list[int] | None = None, transposed: bool = False) -> Op | None:
    """One ``convolution`` op (``neuroncore/ir/conv.py``), or None when the weight is not a trained
    constant or the padding crops: ``x`` [N, C, *in], ``w`` [O, C/groups, *kernel] (transposed:
    [C, O/groups, *kernel], read flipped with its channels swapped) -> [N, O, *out]."""
    source = weight_source(w)
    if source is None or any(lo < 0 or hi < 0 for lo, hi in pads) or not x.dtype.is_float:
        return None
    const, perm = source
    out_dtype = x.dtype
    if b.autocast is not None and x.dtype is DType.FP32 and w.dtype is DType.FP32:
        # auto-cast matmuls (neuronx-cc's --auto-cast matmult): the PE reads bf16, PSUM keeps FP32
        x = b.convert(x, b.autocast)
    n, channels = x.shape[0], x.shape[1]
    kernel = list(w.shape[2:])
    out_channels = w.shape[1] * groups if transposed else w.shape[0]
    geo = window_geometry(x, kernel, stride, pads, dilation, lhs_dilation)
    if any(o < 1 for o in geo.out):
        return None
    ch = ConvChannels(channels, out_channels, groups,
                      choose_group_block(groups, channels // groups, out_channels // groups))
    init = ConvWeightInitializer(const.attrs["init"], tuple(const.shape), ch, tuple(kernel),
                                 transposed, None if perm == tuple(range(len(perm))) else perm)
    label = const.attrs.get("label", const.name)
    blocks = b.add_op("constant", [], weight_blocks_shape(ch, geo.k_total), const.dtype, init=init,
                      label=f"{label}.blocks")
    if blocks.dtype is not x.dtype:
        blocks = b.convert(blocks, x.dtype)
    flat = b.reshape(x, (n, channels, math.prod(geo.spatial)))
    y = b.add_op("convolution", [flat, blocks], (n, out_channels, math.prod(geo.out)), out_dtype,
                 **geo.attrs(), **ch.attrs())
    if bias is not None:
        y = b.add(y, b.broadcast(b.convert(bias, y.dtype) if bias.dtype is not y.dtype else bias,
                                 y.shape, (1,)))
    return b.reshape(y, (n, out_channels, *geo.out))


def reduce_window(b: GraphBuilder, x: Op, kernel: list[int], stride: list[int],
                  pads: list[tuple[int, int]], dilation: list[int], kind: str, fill: float) -> Op:
    """Pooling as one ``reduce-window`` op (``kind`` max or sum, borders ``fill``) on the
    channel-major input: [N, C, *in] -> [N, C, *out]."""
    n, channels = x.shape[0], x.shape[1]
    geo = window_geometry(x, kernel, stride, pads, dilation)
    flat = b.reshape(x, (n, channels, math.prod(geo.spatial)))
    y = b.add_op("reduce-window", [flat], (n, channels, math.prod(geo.out)), x.dtype,
                 **geo.attrs(), kind=kind, fill=float(fill))
    return b.reshape(y, (n, channels, *geo.out))


def pad_axis(b: GraphBuilder, x: Op, dim: int, before: int, after: int, fill: float = 0.0) -> Op:
    """``x`` with ``before``/``after`` entries of ``fill`` around ``dim``; a negative count crops."""
    if before < 0 or after < 0:
        starts, limits = [0] * len(x.shape), list(x.shape)
        starts[dim], limits[dim] = max(-before, 0), x.shape[dim] - max(-after, 0)
        x = b.slice(x, starts, limits)
        before, after = max(before, 0), max(after, 0)
    parts = []
    for width in (before, after):
        shape = list(x.shape)
        shape[dim] = width
        parts.append(b.constant(fill, x.dtype, shape=shape) if width else None)
    pieces = [p for p in (parts[0], x, parts[1]) if p is not None]
    return b.concatenate(pieces, dim) if len(pieces) > 1 else x


def pad_spatial(b: GraphBuilder, x: Op, pads: list[tuple[int, int]], fill: float = 0.0) -> Op:
    """``x`` [N, C, *spatial] with ``(before, after)`` entries of ``fill`` around each spatial dim; a
    negative entry crops that many positions instead (a transposed convolution's large padding)."""
    for k, (before, after) in enumerate(pads):
        x = pad_axis(b, x, 2 + k, before, after, fill)
    return x


def window_slices(b: GraphBuilder, x: Op, kernel: list[int], stride: list[int], dilation: list[int],
                  out: list[int], flipped: bool = False) -> list[Op]:
    """One strided slice of ``x`` [N, C, *spatial] per kernel offset, each [N, C, *out], in the
    order of the weight's flattened kernel dims; ``flipped`` reads the kernel back to front (a
    transposed convolution is a convolution with the kernel flipped)."""
    rank = len(x.shape)
    slices = []
    for index in itertools.product(*(range(k) for k in kernel)):
        offset = [k - 1 - i for k, i in zip(kernel, index)] if flipped else list(index)
        starts, limits, strides = [0] * rank, list(x.shape), [1] * rank
        for k, o in enumerate(offset):
            starts[2 + k] = o * dilation[k]
            limits[2 + k] = starts[2 + k] + (out[k] - 1) * stride[k] + 1
            strides[2 + k] = stride[k]
        whole = starts == [0] * rank and limits == list(x.shape) and strides == [1] * rank
        slices.append(x if whole else b.slice(x, starts, limits, strides))
    return slices


def out_size(size: int, kernel: int, stride: int, pad: int, dilation: int) -> int:
    return (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1


def patches(b: GraphBuilder, x: Op, kernel: list[int], stride: list[int],
             pads: list[tuple[int, int]], dilation: list[int], out: list[int],
             flipped: bool = False) -> Op:
    """[N, *out, C, prod(kernel)]: the input under each output position's window."""
    n, channels = x.shape[0], x.shape[1]
    spatial = len(kernel)
    k_total = math.prod(kernel)
    if (kernel == stride and not any(a or b for a, b in pads) and all(d == 1 for d in dilation)
            and not flipped):
        # non-overlapping windows: cut the spatial dims into (out, kernel) pairs
        used = [o * k for o, k in zip(out, kernel)]
        if used != list(x.shape[2:]):
            x = b.slice(x, [0] * len(x.shape), [n, channels, *used])
        split = b.reshape(x, [n, channels, *[v for o, k in zip(out, kernel) for v in (o, k)]])
        outs = [2 + 2 * k for k in range(spatial)]
        kerns = [3 + 2 * k for k in range(spatial)]
        moved = b.transpose(split, [0, *outs, 1, *kerns])
        return b.reshape(moved, [n, *out, channels, k_total])
    padded = pad_spatial(b, x, pads)
    slices = window_slices(b, padded, kernel, stride, dilation, out, flipped)
    stacked = slices[0] if k_total == 1 else b.concatenate(
        [b.reshape(s, (*s.shape, 1)) for s in slices], len(x.shape))
    stacked = b.reshape(stacked, [n, channels, *out, k_total])
    return b.transpose(stacked, [0, *range(2, 2 + spatial), 1, 2 + spatial])


def conv(b: GraphBuilder, x: Op, w: Op, bias: Op | None, stride: list[int],
          pads: list[tuple[int, int]], dilation: list[int], groups: int,
          flipped: bool = False, lhs_dilation: list[int] | None = None) -> Op:
    """``x`` [N, C, *in] with ``w`` [O, C/groups, *kernel] -> [N, O, *out]: one implicit-GEMM
    ``convolution`` op when the weight is a trained constant, else im2col + one matmul.
    ``lhs_dilation`` spreads the input with zeros first (XLA's input dilation)."""
    spatial = len(x.shape) - 2
    kernel = list(w.shape[2:])
    fast_patches = (kernel == stride and math.prod(kernel) > 1 and not any(a or c for a, c in pads)
                    and all(d == 1 for d in dilation) and not any(d != 1 for d in lhs_dilation or []))
    if not flipped and not fast_patches:
        direct = implicit_gemm_conv(b, x, w, bias, stride, pads, dilation, groups,
                                    lhs_dilation=lhs_dilation)
        if direct is not None:
            return direct
    if lhs_dilation is not None and any(d != 1 for d in lhs_dilation):
        x = zero_insert(b, x, lhs_dilation)
    out = [(x.shape[2 + k] + a + b - dilation[k] * (kernel[k] - 1) - 1) // stride[k] + 1
           for k, (a, b) in enumerate(pads)]
    n, channels, out_channels = x.shape[0], x.shape[1], w.shape[0]
    k_total = math.prod(kernel)
    per_group = channels // groups
    windows = patches(b, x, kernel, stride, pads, dilation, out, flipped)  # [N, *out, C, K]
    rows = n * math.prod(out)
    if groups == 1:
        flat = b.reshape(windows, (rows, channels * k_total))
        result = b.dot(flat, b.reshape(w, (out_channels, channels * k_total)), rhs_contract=-1)
    else:
        grouped = b.reshape(windows, (rows, groups, per_group * k_total))
        lhs = b.transpose(grouped, [1, 0, 2])  # [G, rows, C/G*K]
        weights = b.reshape(w, (groups, out_channels // groups, per_group * k_total))
        per = b.dot(lhs, weights, rhs_contract=-1)  # [G, rows, O/G]
        result = b.reshape(b.transpose(per, [1, 0, 2]), (rows, out_channels))
    if bias is not None:
        result = b.add(result, b.broadcast_to(bias, result.shape))
    result = b.reshape(result, (n, *out, out_channels))
    return b.transpose(result, [0, spatial + 1, *range(1, spatial + 1)])


def zero_insert(b: GraphBuilder, x: Op, stride: list[int]) -> Op:
    """``x`` [N, C, *in] with ``stride - 1`` zeros between neighbours along each spatial dim
    ([N, C, *((in - 1) * stride + 1)]): a reshape, a concatenation with zeros, a reshape, a slice."""
    for k, s in enumerate(stride):
        if s == 1:
            continue
        dim = 2 + k
        size = x.shape[dim]
        lifted = b.reshape(x, (*x.shape[:dim + 1], 1, *x.shape[dim + 1:]))
        zeros = b.constant(0.0, x.dtype, shape=(*x.shape[:dim + 1], s - 1, *x.shape[dim + 1:]))
        spread = b.reshape(b.concatenate([lifted, zeros], dim + 1),
                             (*x.shape[:dim], size * s, *x.shape[dim + 1:]))
        limits = list(spread.shape)
        limits[dim] = (size - 1) * s + 1
        x = b.slice(spread, [0] * len(limits), limits)
    return x


def transposed_conv(b: GraphBuilder, x: Op, w: Op, bias: Op | None, stride: list[int],
                     padding: list[int], output_padding: list[int], dilation: list[int],
                     groups: int) -> Op:
    """``conv_transpose``: ``w`` is [C, O/groups, *kernel]. A kernel equal to its stride without
    padding (a learned 2x upsampling) is one matmul whose output columns are the kernel offsets,
    moved into place by a reshape and a transpose; anything else is the textbook equivalence: the
    input with ``stride - 1`` zeros inserted, padded by ``dilation * (kernel - 1) - padding``
    (``+ output_padding`` after), convolved at stride 1 with the kernel flipped and its in/out
    channels swapped. The zeros cost Tensor-engine work (``stride^d`` times the useful MACs), as
    they do in a compiler that lowers it this way."""
    spatial = len(x.shape) - 2
    n, channels = x.shape[0], x.shape[1]
    kernel = list(w.shape[2:])
    per_out = w.shape[1]
    out_channels = per_out * groups
    k_total = math.prod(kernel)
    if (groups == 1 and kernel == stride and not any(padding) and not any(output_padding)
            and all(d == 1 for d in dilation)):
        rows = n * math.prod(x.shape[2:])
        flat = b.reshape(b.transpose(x, [0, *range(2, 2 + spatial), 1]), (rows, channels))
        cols = b.dot(flat, b.reshape(w, (channels, out_channels * k_total)))  # [rows, O*K]
        if bias is not None:
            cols = b.add(cols, b.reshape(b.broadcast(bias, (out_channels, k_total), (0,)),
                                             (1, out_channels * k_total)))
        split = b.reshape(cols, (n, *x.shape[2:], out_channels, *kernel))
        # [N, in_0, .., O, k_0, ..] -> [N, O, in_0, k_0, in_1, k_1, ..]
        order = [0, 1 + spatial, *[v for k in range(spatial) for v in (1 + k, 2 + spatial + k)]]
        return b.reshape(b.transpose(split, order),
                           (n, out_channels, *[i * k for i, k in zip(x.shape[2:], kernel)]))
    pads = [(dilation[k] * (kernel[k] - 1) - padding[k],
             dilation[k] * (kernel[k] - 1) - padding[k] + output_padding[k]) for k in range(spatial)]
    direct_op = implicit_gemm_conv(b, x, w, bias, [1] * spatial, pads, dilation, groups,
                                   lhs_dilation=stride, transposed=True)
    if direct_op is not None:
        return direct_op
    spread = zero_insert(b, x, stride)
    # [C, O/G, *k] -> [G, C/G, O/G, K] -> [G, O/G, C/G, K] -> [O, C/G, *k]
    swapped = b.transpose(b.reshape(w, (groups, channels // groups, per_out, k_total)),
                            [0, 2, 1, 3])
    direct = b.reshape(swapped, (out_channels, channels // groups, *kernel))
    return conv(b, spread, direct, bias, [1] * spatial, pads, dilation, groups, flipped=True)


def _source_ratio(size: int, out: int, align_corners: bool, scale: float | None) -> float:
    """Input positions per output position, as torch's ``area_pixel_compute_scale`` gives it (both
    the linear and the cubic kernels): corner to corner, or a given scale factor used as given,
    else input over output size."""
    if align_corners:
        return (size - 1) / (out - 1) if out > 1 else 0.0
    return 1.0 / scale if scale is not None and scale > 0 else size / out


def interpolation_matrix(size: int, out: int, align_corners: bool, scale: float | None
                          ) -> np.ndarray:
    """[out, size]: row ``o`` holds the two linear-interpolation weights of output ``o``, placed
    by torch's ``area_pixel_compute_source_index`` (half-pixel centres clamped at 0, or the corners
    aligned; a given scale factor is used as given, as torch does)."""
    ratio = _source_ratio(size, out, align_corners, scale)
    matrix = np.zeros((out, size), np.float32)
    for o in range(out):
        source = ratio * o if align_corners else max(ratio * (o + 0.5) - 0.5, 0.0)
        low = min(int(source), size - 1)
        high = low + 1 if low < size - 1 else low
        frac = np.float32(source - low)
        matrix[o, low] += np.float32(1.0) - frac
        matrix[o, high] += frac
    return matrix


def _cubic_weights(t: float, a: float = -0.75) -> tuple[float, float, float, float]:
    """torch's ``get_cubic_upsample_coefficients``: Keys' cubic convolution with ``A = -0.75`` at
    the distances ``1 + t``, ``t``, ``1 - t``, ``2 - t`` of the four taps."""
    def near(x: float) -> float:  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x: float) -> float:  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)


def cubic_interpolation_matrix(size: int, out: int, align_corners: bool, scale: float | None
                               ) -> np.ndarray:
    """[out, size]: row ``o`` holds the four bicubic weights of output ``o``, as torch's
    ``upsample_bicubic2d`` places them (``area_pixel_compute_source_index`` with ``cubic=True``: a
    half-pixel source left unclamped, its floor and the taps at -1..+2 around it, each tap's index
    clamped into the input, so border taps add to the edge's weight)."""
    ratio = _source_ratio(size, out, align_corners, scale)
    matrix = np.zeros((out, size), np.float64)
    for o in range(out):
        source = ratio * o if align_corners else ratio * (o + 0.5) - 0.5
        base = math.floor(source)
        for tap, weight in enumerate(_cubic_weights(source - base)):
            matrix[o, min(max(base - 1 + tap, 0), size - 1)] += weight
    return matrix.astype(np.float32)


__all__ = ["conv", "cubic_interpolation_matrix", "implicit_gemm_conv", "interpolation_matrix", "out_size",
           "pad_axis", "pad_spatial", "patches", "reduce_window", "transposed_conv", "weight_source",
           "window_geometry", "window_slices", "zero_insert"]
