"""Special functions the engines have no instruction for, as the polynomials and identities a
compiler expands them into on the Vector / Scalar engines (computed in FP32, as torch's opmath;
a 16-bit input is widened and the result rounded back):

* ``hypot(x, y) = sqrt(x^2 + y^2)`` (no rescaling: it overflows where ``x^2`` does, ~1.8e19 in
  FP32, where torch's ``std::hypot`` does not);
* ``atan2(y, x)``: the quotient ``a = min(|x|, |y|) / max(|x|, |y|)`` in ``[0, 1]``, reduced to
  ``|t| <= tan(pi / 8)`` by ``atan(a) = pi / 4 + atan((a - 1) / (a + 1))``, Cephes' ``atanf``
  polynomial (max error ~1 ulp of FP32), then the octant and quadrant restored by selects;
  ``atan2(0, 0) = 0`` and ``atan2(+-inf, +-inf)`` the diagonals, as C's;
* ``erfinv``: XLA's single-precision expansion (``ErfInv32`` in ``xla/hlo/builder/lib/math.cc``,
  M. Giles, "Approximating the erfinv function"): ``w = -log((1 - x)(1 + x))`` and one of two
  degree-8 polynomials in ``w - 2.5`` or ``sqrt(w) - 3``, times ``x``; ``+-1`` give ``+-inf`` as
  torch (XLA: the largest float);
* ``RReLU`` in eval mode: a leaky ReLU of slope ``(lower + upper) / 2``, as torch's kernel (the
  random slopes of training mode stay unsupported).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from neuroncore.dtypes import DType
from neuroncore.frontends.torch_ops import handles
from neuroncore.ir.graph import Op

if TYPE_CHECKING:
    from neuroncore.frontends.torch_frontend import _Converter

_ATAN = (8.05374449538e-2, -1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1)  # Cephes atanf
_ERFINV_SMALL_W = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                   -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_ERFINV_LARGE_W = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                   -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)


def _fp32_operands(c: _Converter, node: torch.fx.Node, names: tuple[str, ...], kw: dict[str, Any]
                   ) -> tuple[list[Op], tuple[int, ...], DType] | None:
    shape, dtype = c._out(node)
    if not dtype.is_float:
        return None
    ops = []
    for name in names:
        v = c._operand(kw[name], DType.FP32)
        op = v if isinstance(v, Op) else c.b.constant(v, DType.FP32, shape=shape)
        ops.append(c.b.broadcast_to(op, shape) if op.shape != shape else op)
    return ops, shape, dtype


def _back(c: _Converter, x: Op, dtype: DType) -> Op:
    return x if dtype is DType.FP32 else c.b.convert(x, dtype)


@handles("hypot")
def hypot(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    got = _fp32_operands(c, node, ("self", "other"), kw)
    if got is None:
        return NotImplemented
    (x, y), _shape, dtype = got
    return _back(c, c.b.sqrt(c.b.add(c.b.multiply(x, x), c.b.multiply(y, y))), dtype)


def atan2(c: _Converter, y: Op, x: Op) -> Op:
    """``atan2(y, x)`` of two FP32 ops of one shape (module docstring)."""
    b = c.b
    ax, ay = b.abs(x), b.abs(y)
    low, high = b.minimum(ax, ay), b.maximum(ax, ay)
    a = b.divide(low, b.select(b.compare(high, 0.0, "EQ"), 1.0, high))
    a = b.select(b.compare(low, math.inf, "EQ"), 1.0, a)  # both infinite: the diagonal
    folded = b.compare(a, math.tan(math.pi / 8), "GT")
    t = b.select(folded, b.divide(b.subtract(a, 1.0), b.add(a, 1.0)), a)
    z = b.multiply(t, t)
    p: Op | float = _ATAN[0]
    for coefficient in _ATAN[1:]:
        p = b.add(b.multiply(z, p), coefficient)
    angle = b.add(b.multiply(b.multiply(z, t), p), t)
    angle = b.select(folded, b.add(angle, math.pi / 4), angle)
    angle = b.select(b.compare(ay, ax, "GT"), b.subtract(math.pi / 2, angle), angle)
    angle = b.select(b.compare(x, 0.0, "LT"), b.subtract(math.pi, angle), angle)
    angle = b.select(b.compare(y, 0.0, "LT"), b.negate(angle), angle)
    nan = b.maximum(b.compare(x, x, "NE"), b.compare(y, y, "NE"))
    return b.select(nan, math.nan, angle)


@handles("atan2")
def atan2_op(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    got = _fp32_operands(c, node, ("self", "other"), kw)
    if got is None:
        return NotImplemented
    (y, x), _shape, dtype = got
    return _back(c, atan2(c, y, x), dtype)


@handles("erfinv")
def erfinv(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    got = _fp32_operands(c, node, ("self",), kw)
    if got is None:
        return NotImplemented
    (x,), _shape, dtype = got
    b = c.b
    w = b.negate(b.log(b.multiply(b.subtract(1.0, x), b.add(x, 1.0))))
    small = b.compare(w, 5.0, "LT")
    w = b.select(small, b.subtract(w, 2.5), b.subtract(b.sqrt(w), 3.0))
    p = b.select(small, b.constant(_ERFINV_SMALL_W[0], DType.FP32, shape=x.shape), _ERFINV_LARGE_W[0])
    for lo, hi in zip(_ERFINV_SMALL_W[1:], _ERFINV_LARGE_W[1:]):
        coefficient = b.select(small, b.constant(lo, DType.FP32, shape=x.shape), hi)
        p = b.add(b.multiply(p, w), coefficient)
    result = b.multiply(p, x)
    edge = b.compare(b.abs(x), 1.0, "EQ")
    return _back(c, b.select(edge, b.multiply(x, math.inf), result), dtype)


@handles("rrelu_with_noise_functional", "rrelu_with_noise", "rrelu")
def rrelu(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    if kw.get("training", False):
        return NotImplemented  # random slopes per element
    meta: Any = node.meta["val"]
    out_meta = meta[0] if isinstance(meta, (list, tuple)) else meta
    dtype = c._out_dtype(out_meta)
    x = c._op(kw["self"], dtype)
    slope = (float(kw.get("lower", 1.0 / 8)) + float(kw.get("upper", 1.0 / 3))) / 2
    out = c.b.select(c.b.compare(x, 0.0, "GT"), x, c.b.multiply(x, slope))
    if isinstance(meta, (list, tuple)):
        return out, c._op(kw["noise"]) if "noise" in kw else None
    return out


__all__ = ["atan2", "atan2_op", "erfinv", "hypot", "rrelu"]
