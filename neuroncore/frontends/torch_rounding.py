"""Rounded division and remainders: ``torch.div(..., rounding_mode="floor" | "trunc")`` (``//``),
``remainder`` (``%``) and ``fmod``, on integers and floats.

Models build masks and positions with them: Llama 4's chunked attention compares
``q // chunk == k // chunk``, DETR's sine position embedding divides ``arange`` by 2 with
``rounding_mode="floor"``, sliding windows take ``position % window``.

The IR has no rounding op, but an engine's write of FP32 values into an INT32 tensor truncates
toward zero (``dtypes.round_to``), so:

* ``trunc(a / b)`` is the FP32 quotient converted to INT32;
* ``floor(a / b)`` is that, minus 1 where truncation went up (``t > q``: negative non-integers);
* ``remainder(a, b) = a - floor(a / b) * b`` (the sign of ``b``, as Python's ``%``);
  ``fmod(a, b) = a - trunc(a / b) * b`` (the sign of ``a``, as C's ``fmod``).

Integers compute in FP32, as every integer value on the core does: results are exact while the
operands and the quotient stay below 2^24 in magnitude (then the FP32 quotient of two integers is
never rounded across an integer). A float quotient is rounded once to FP32 before it is truncated,
as on any FP32 datapath.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from neuroncore.dtypes import DType
from neuroncore.frontends.torch_ops import handles
from neuroncore.ir.graph import Op

if TYPE_CHECKING:
    from neuroncore.frontends.torch_frontend import _Converter

MODES = ("trunc", "floor")


def rounded_quotient(c: _Converter, a: Any, b: Any, mode: str, shape: tuple[int, ...]) -> Op:
    """``a / b`` rounded toward zero (``trunc``) or down (``floor``), as an FP32 op of ``shape``."""
    x, y = c._operand(a, DType.FP32), c._operand(b, DType.FP32)
    quotient = c._emit_binary("divide", x, y, shape, DType.FP32)
    truncated = c.b.convert(c.b.convert(quotient, DType.INT32), DType.FP32)
    if mode == "trunc":
        return truncated
    went_up = c.b.convert(c.b.compare(truncated, quotient, "GT"), DType.FP32)
    return c.b.subtract(truncated, went_up)


def divide(c: _Converter, node: torch.fx.Node, mode: str) -> Any:
    """``aten.div.Tensor_mode`` / ``div.Scalar_mode`` with a rounding mode."""
    if mode not in MODES:
        return NotImplemented
    shape, dtype = c._out(node)
    return c._cast(rounded_quotient(c, node.args[0], node.args[1], mode, shape), dtype)


def _remainder(c: _Converter, node: torch.fx.Node, kw: dict[str, Any], mode: str) -> Any:
    shape, dtype = c._out(node)
    if dtype is DType.PRED:
        return NotImplemented
    a, b = kw["self"], kw["other"]
    whole = rounded_quotient(c, a, b, mode, shape)
    x, y = c._operand(a, DType.FP32), c._operand(b, DType.FP32)
    product = c._emit_binary("multiply", whole, y, shape, DType.FP32)
    return c._cast(c._emit_binary("subtract", x, product, shape, DType.FP32), dtype)


@handles("remainder")
def remainder(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    """``a % b``: the sign of the divisor, as Python's (and torch's) remainder."""
    return _remainder(c, node, kw, "floor")


@handles("fmod")
def fmod(c: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    """``torch.fmod``: the sign of the dividend, as C's."""
    return _remainder(c, node, kw, "trunc")


__all__ = ["MODES", "divide", "fmod", "remainder", "rounded_quotient"]
