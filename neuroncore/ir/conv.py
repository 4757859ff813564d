"""Convolution and window-reduction ops in *channel-major* form, shared by the frontends, the IR's
reference semantics and the compiler's implicit-GEMM lowering (``compiler/lower_conv.py``).

``convolution(x [N, C, L], w2) -> [N, O, L_out]``: the activation is channel-major with its spatial
dims flattened (``L = prod(spatial)``), the layout the compiler keeps it in on chip (channels on the
128 partitions, the image along the free dim), so a convolution reads each input tile once and the
Tensor engine sees its kernel offsets as shifted access patterns over that tile. The weight operand
``w2`` is the framework weight ``[O, C/groups, *kernel]`` rearranged, once and at compile time, into
the blocks the lowering loads: ``[GB, CB, n_oblocks * K * 128]`` where a *group block* holds
``group_block`` groups (``CB = group_block * C/groups`` input channels; their weights block-diagonal,
zeros between groups), ``K = prod(kernel)`` and each output block of up to 128 channels is one
contiguous run ``[K, 128]`` per input channel (zero-padded to 128 columns). One DMA of one run per
partition loads the whole kernel of an output block.

``reduce-window(x [N, C, L]) -> [N, C, L_out]`` is XLA's reduce-window (max or sum) on the same
layout: pooling on the Vector engine over the same shifted access patterns.

Everything here is NumPy or plain Python: no framework is imported.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

P = 128  # partitions: the output block width


class _Materializes(Protocol):
    def materialize(self, shape: tuple[int, ...], rank: int = 0) -> np.ndarray: ...


@dataclass(frozen=True)
class WindowGeometry:
    """Where a window op reads: the input's spatial dims and the window's placement over them.

    ``padding`` is (low, high) per dim, never negative; ``lhs_dilation`` spreads the input with
    ``d - 1`` zeros between neighbours (a transposed convolution's input)."""

    spatial: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[tuple[int, int], ...]
    dilation: tuple[int, ...]
    lhs_dilation: tuple[int, ...]

    @property
    def dilated(self) -> tuple[int, ...]:
        """Spatial dims after input dilation."""
        return tuple((s - 1) * d + 1 for s, d in zip(self.spatial, self.lhs_dilation))

    @property
    def padded(self) -> tuple[int, ...]:
        return tuple(s + lo + hi for s, (lo, hi) in zip(self.dilated, self.padding))

    @property
    def out(self) -> tuple[int, ...]:
        return tuple((p - d * (k - 1) - 1) // s + 1
                     for p, k, s, d in zip(self.padded, self.kernel, self.stride, self.dilation))

    @property
    def k_total(self) -> int:
        return math.prod(self.kernel)

    @property
    def needs_copy(self) -> bool:
        """Whether the input must be laid out again on chip (zero border or zeros inserted)."""
        return any(lo or hi for lo, hi in self.padding) or any(d != 1 for d in self.lhs_dilation)

    def offsets(self) -> list[tuple[int, ...]]:
        """Kernel offsets in the weight's flattened (row-major) order."""
        return list(itertools.product(*(range(k) for k in self.kernel)))

    def attrs(self) -> dict[str, Any]:
        return {"spatial": self.spatial, "kernel": self.kernel, "stride": self.stride,
                "padding": self.padding, "dilation": self.dilation,
                "lhs_dilation": self.lhs_dilation}

    @staticmethod
    def of(attrs: dict[str, Any]) -> WindowGeometry:
        return WindowGeometry(tuple(attrs["spatial"]), tuple(attrs["kernel"]), tuple(attrs["stride"]),
                              tuple((int(a), int(b)) for a, b in attrs["padding"]),
                              tuple(attrs["dilation"]), tuple(attrs["lhs_dilation"]))


@dataclass(frozen=True)
class ConvChannels:
    """How a convolution's channels are grouped and blocked (see the module docstring)."""

    in_channels: int
    out_channels: int
    groups: int
    group_block: int  # groups per group block

    @property
    def cg(self) -> int:
        return self.in_channels // self.groups

    @property
    def og(self) -> int:
        return self.out_channels // self.groups

    @property
    def cb(self) -> int:
        """Input channels of one group block."""
        return self.group_block * self.cg

    @property
    def ob(self) -> int:
        """Output channels of one group block."""
        return self.group_block * self.og

    @property
    def n_group_blocks(self) -> int:
        return self.groups // self.group_block

    @property
    def n_oblocks(self) -> int:
        return math.ceil(self.ob / P)

    def attrs(self) -> dict[str, Any]:
        return {"in_channels": self.in_channels, "out_channels": self.out_channels,
                "groups": self.groups, "group_block": self.group_block}

    @staticmethod
    def of(attrs: dict[str, Any]) -> ConvChannels:
        return ConvChannels(int(attrs["in_channels"]), int(attrs["out_channels"]),
                            int(attrs["groups"]), int(attrs["group_block"]))


def choose_group_block(groups: int, cg: int, og: int) -> int:
    """Groups per block: as many as fit 128 input and 128 output channels (a depthwise convolution
    of 512 channels is four block-diagonal 128x128 matmuls per kernel offset, not 512 one-lane ones)."""
    best = 1
    for g in range(1, groups + 1):
        if groups % g == 0 and g * cg <= P and g * og <= P:
            best = g
    return best


def weight_blocks_shape(ch: ConvChannels, k_total: int) -> tuple[int, int, int]:
    return ch.n_group_blocks, ch.cb, ch.n_oblocks * k_total * P


def direct_weight(w: np.ndarray, groups: int, transposed: bool) -> np.ndarray:
    """The direct-convolution weight ``[O, C/groups, *kernel]``; a transposed convolution's
    ``[C, O/groups, *kernel]`` weight has its in/out channels swapped per group and its kernel
    flipped (a transposed convolution is a convolution of the spread input with that kernel)."""
    if not transposed:
        return w
    c, per_out, *kernel = w.shape
    swapped = w.reshape(groups, c // groups, per_out, *kernel).swapaxes(1, 2)
    direct = swapped.reshape(groups * per_out, c // groups, *kernel)
    return np.ascontiguousarray(np.flip(direct, axis=tuple(range(2, direct.ndim))))


def to_blocks(w: np.ndarray, ch: ConvChannels) -> np.ndarray:
    """``[O, C/groups, *kernel]`` -> the ``[GB, CB, n_oblocks * K * 128]`` layout the lowering loads."""
    k = math.prod(w.shape[2:])
    gb, gpb, cg, og = ch.n_group_blocks, ch.group_block, ch.cg, ch.og
    wk = np.asarray(w, np.float32).reshape(gb, gpb, og, cg, k)
    dense = np.zeros((gb, gpb, cg, gpb, og, k), np.float32)
    for g in range(gpb):
        dense[:, g, :, g] = wk[:, g].transpose(0, 2, 1, 3)  # [GB, Cg, Og, K]
    padded = np.zeros((gb, ch.cb, ch.n_oblocks * P, k), np.float32)
    padded[:, :, :ch.ob] = dense.reshape(gb, ch.cb, ch.ob, k)
    blocks = padded.reshape(gb, ch.cb, ch.n_oblocks, P, k).transpose(0, 1, 2, 4, 3)
    return np.ascontiguousarray(blocks.reshape(weight_blocks_shape(ch, k)))


def from_blocks(w2: np.ndarray, ch: ConvChannels, kernel: tuple[int, ...]) -> np.ndarray:
    """The inverse of :func:`to_blocks`: ``[O, C/groups, *kernel]``."""
    k = math.prod(kernel)
    gb, gpb, cg, og = ch.n_group_blocks, ch.group_block, ch.cg, ch.og
    padded = w2.reshape(gb, ch.cb, ch.n_oblocks, k, P).transpose(0, 1, 2, 4, 3)
    dense = padded.reshape(gb, ch.cb, ch.n_oblocks * P, k)[:, :, :ch.ob]
    dense = dense.reshape(gb, gpb, cg, gpb, og, k)
    per_group = np.stack([dense[:, g, :, g] for g in range(gpb)], axis=1)  # [GB, gpb, Cg, Og, K]
    return per_group.transpose(0, 1, 3, 2, 4).reshape(ch.out_channels, cg, *kernel)


@dataclass(frozen=True)
class ConvWeightInitializer:
    """A convolution weight stored in the lowering's block layout, made from the framework
    weight's initializer (``base`` materialised at ``base_shape``): the same trained values,
    rearranged at compile time as neuronx-cc lays out weights. Timing-only runs never call it."""

    base: _Materializes
    base_shape: tuple[int, ...]
    channels: ConvChannels
    kernel: tuple[int, ...]
    transposed: bool = False
    permutation: tuple[int, ...] | None = None  # the framework weight is base transposed so

    def materialize(self, shape: tuple[int, ...], rank: int = 0) -> np.ndarray:
        base = self.base.materialize(self.base_shape, rank)
        if self.permutation is not None:
            base = np.transpose(base, self.permutation)
        w = direct_weight(base, self.channels.groups, self.transposed)
        return to_blocks(w, self.channels).reshape(shape)


@dataclass(frozen=True)
class BatchNormInitializer:
    """Batch norm (eval) folded at compile time: ``part="scale"`` is ``weight / sqrt(var + eps)``,
    ``part="shift"`` is ``bias - mean * scale``, from the trained statistics' initializers (``None``
    for an absent affine weight or bias). The compiler then applies them in the convolution's
    PSUM evacuation (``compiler/lower_conv.py``) as neuronx-cc folds batch norm into the
    convolution; timing-only runs never compute them."""

    mean: _Materializes
    var: _Materializes
    weight: _Materializes | None
    bias: _Materializes | None
    channels: int
    eps: float
    part: str  # "scale" or "shift"

    def materialize(self, shape: tuple[int, ...], rank: int = 0) -> np.ndarray:
        c = (self.channels,)
        scale = 1.0 / np.sqrt(self.var.materialize(c, rank).astype(np.float32) + np.float32(self.eps))
        if self.weight is not None:
            scale = scale * self.weight.materialize(c, rank)
        if self.part == "scale":
            return scale.astype(np.float32).reshape(shape)
        shift = -self.mean.materialize(c, rank) * scale
        if self.bias is not None:
            shift = shift + self.bias.materialize(c, rank)
        return shift.astype(np.float32).reshape(shape)


def _spread_and_pad(x: np.ndarray, geo: WindowGeometry, fill: float) -> np.ndarray:
    """``x`` [N, C, *spatial] with input dilation zeros and ``fill`` borders."""
    n, c = x.shape[:2]
    if any(d != 1 for d in geo.lhs_dilation):
        spread = np.zeros((n, c, *geo.dilated), np.float32)
        spread[(slice(None), slice(None), *(slice(None, None, d) for d in geo.lhs_dilation))] = x
        x = spread
    out = np.full((n, c, *geo.padded), fill, np.float32)
    out[(slice(None), slice(None),
         *(slice(lo, lo + s) for (lo, _), s in zip(geo.padding, geo.dilated)))] = x
    return out


def _window(padded: np.ndarray, geo: WindowGeometry, offset: tuple[int, ...]) -> np.ndarray:
    index = tuple(slice(i * d, i * d + (o - 1) * s + 1, s)
                  for i, d, o, s in zip(offset, geo.dilation, geo.out, geo.stride))
    return padded[(slice(None), slice(None), *index)]


def conv_reference(x: np.ndarray, w2: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    """The value of ``convolution(x [N, C, L], w2)``: [N, O, L_out]."""
    geo, ch = WindowGeometry.of(attrs), ConvChannels.of(attrs)
    n = x.shape[0]
    padded = _spread_and_pad(np.asarray(x, np.float32).reshape(n, ch.in_channels, *geo.spatial),
                             geo, 0.0)
    w = from_blocks(np.asarray(w2, np.float32), ch, geo.kernel)  # [O, Cg, *k]
    g = ch.groups
    out = np.zeros((n, g, ch.og, math.prod(geo.out)), np.float32)
    for index, offset in enumerate(geo.offsets()):
        patch = _window(padded, geo, offset).reshape(n, g, ch.cg, -1)
        wk = w.reshape(g, ch.og, ch.cg, -1)[..., index]
        out += np.einsum("ngcl,goc->ngol", patch, wk)
    return out.reshape(n, ch.out_channels, -1)


def reduce_window_reference(x: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    """The value of ``reduce-window(x [N, C, L])`` with ``kind`` max (padding ``fill``) or sum."""
    geo = WindowGeometry.of(attrs)
    n, c = x.shape[:2]
    padded = _spread_and_pad(np.asarray(x, np.float32).reshape(n, c, *geo.spatial), geo,
                             float(attrs["fill"]))
    windows = [_window(padded, geo, offset) for offset in geo.offsets()]
    combine = np.maximum if attrs["kind"] == "max" else np.add
    result = windows[0]
    for w in windows[1:]:
        result = combine(result, w)
    return result.reshape(n, c, -1)


__all__ = ["BatchNormInitializer", "ConvChannels", "ConvWeightInitializer", "WindowGeometry",
           "choose_group_block", "conv_reference", "direct_weight", "from_blocks",
           "reduce_window_reference", "to_blocks", "weight_blocks_shape"]
