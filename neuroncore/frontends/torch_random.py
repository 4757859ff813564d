"""Random ops of PyTorch graphs: dropout's Bernoulli masks and uniform draws, on the core's RNG.

A training step with dropout (``nn.Dropout``, a transformers model's default ``hidden_dropout_prob``)
traces to ``empty_permuted -> bernoulli_(1 - p) -> div_(1 - p) -> mul``, and its backward multiplies
the gradient by the same scaled mask: the mask is one value of the joint graph, read by both passes.
Each draw lowers to the IR's ``rng`` op (uniforms from the counter-based Philox generator of
``neuroncore.ir.philox``) and a comparison. Every random op of a program gets its own stream number,
and all of them read one program input, ``rng/state`` (seed, offset): the caller feeds a new offset
per execution, so masks differ between steps and micro-batches while a program stays one program.
The values cannot equal torch's own generator bit for bit; their law does (``tests/training``).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from neuroncore.dtypes import DType
from neuroncore.frontends.torch_ops import handles
from neuroncore.ir.graph import Op

if TYPE_CHECKING:
    from neuroncore.frontends.torch_frontend import _Converter

RNG_STATE_INPUT = "rng/state"
"""Name of the program input every random op reads: [seed, offset] as FP32 integers."""


@dataclass
class _RngState:
    state: Op
    streams: int = 0
    drawn: dict[str, int] = field(default_factory=dict)  # FX node name -> its stream


_STATES: weakref.WeakKeyDictionary[Any, _RngState] = weakref.WeakKeyDictionary()


def uses_rng(graph_inputs: list[str]) -> bool:
    """Whether a program with these input names draws random numbers."""
    return RNG_STATE_INPUT in graph_inputs


def _uniform(conv: _Converter, shape: tuple[int, ...]) -> Op:
    """A fresh stream of FP32 uniforms in [0, 1) of ``shape``; for a draw that an activation
    checkpoint recomputes in the backward (``meta["recompute_of"]``, training/torch_joint.py), the
    stream of the draw it recomputes: the same numbers, as the checkpoint's saved RNG state gives."""
    held = _STATES.get(conv)
    if held is None:
        with conv.b.located("model", ()):
            held = _RngState(conv.b.parameter(RNG_STATE_INPUT, (2,), DType.FP32))
        _STATES[conv] = held
    node = conv.node
    again = held.drawn.get(node.meta.get("recompute_of", "")) if node is not None else None
    if again is not None:
        return conv.b.rng_uniform(held.state, shape, again)
    held.streams += 1
    if node is not None:
        held.drawn[node.name] = held.streams
    return conv.b.rng_uniform(held.state, shape, held.streams)


def _probability(conv: _Converter, p: Any, dtype: DType) -> Op | float:
    value = conv._value(p) if isinstance(p, torch.fx.Node) else p
    if isinstance(value, (bool, int, float)):
        return float(value)
    return conv._operand(p, DType.FP32)


def _bernoulli(conv: _Converter, node: torch.fx.Node, p: Any) -> Any:
    """``1`` with probability ``p`` (a number or a tensor of probabilities), else ``0``."""
    shape, dtype = conv._out(node)
    prob = _probability(conv, p, dtype)
    u = _uniform(conv, shape)
    if isinstance(prob, Op) and prob.shape != shape:
        prob = conv.b.broadcast_to(prob, shape)
    keep = conv.b.compare(u, prob, "LT")
    return keep if dtype is DType.PRED else conv.b.convert(keep, dtype)


@handles("bernoulli", "bernoulli_")
def _aten_bernoulli(conv: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    """``bernoulli_(t, p)`` / ``bernoulli(t, p)``: a mask of ``t``'s shape (its values are unread);
    ``bernoulli(probs)``: each element 1 with its own probability."""
    if node.kwargs.get("generator") is not None:
        return NotImplemented
    if len(node.args) > 1:
        return _bernoulli(conv, node, node.args[1])
    if "p" in node.kwargs:
        return _bernoulli(conv, node, node.kwargs["p"])
    if _name(node) == "bernoulli":  # probabilities are the input's values
        return _bernoulli(conv, node, node.args[0])
    return _bernoulli(conv, node, 0.5)


@handles("rand", "rand_like")
def _aten_rand(conv: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    if node.kwargs.get("generator") is not None:
        return NotImplemented
    shape, dtype = conv._out(node)
    if not dtype.is_float:
        return NotImplemented
    u = _uniform(conv, shape)
    return u if dtype is DType.FP32 else conv.b.convert(u, dtype)


@handles("native_dropout")
def _aten_native_dropout(conv: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    """(input * mask / (1 - p), mask) in train mode; (input, all true) otherwise."""
    from neuroncore.frontends.torch_frontend import ir_dtype

    x_node, p_arg, train = node.args[0], node.args[1], node.args[2]
    if not isinstance(p_arg, (int, float)):
        return NotImplemented
    p = float(p_arg)
    out = node.meta["val"][0]
    shape, dtype = tuple(out.shape), ir_dtype(out.dtype)
    x = conv._op(x_node, dtype)
    if not train or p == 0.0:
        return x, conv.b.constant(1.0, DType.PRED, shape=shape)
    if p >= 1.0:
        return conv.b.constant(0.0, dtype, shape=shape), conv.b.constant(0.0, DType.PRED, shape=shape)
    keep = conv.b.compare(_uniform(conv, shape), 1.0 - p, "LT")
    scaled = conv.b.multiply(conv.b.convert(keep, dtype), 1.0 / (1.0 - p))
    return conv.b.multiply(x, scaled), keep


@handles("empty_permuted")
def _aten_empty_permuted(conv: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    """Uninitialised memory (dropout's noise buffer, filled by ``bernoulli_``): zeros."""
    shape, dtype = conv._out(node)
    return conv.b.constant(0.0, dtype, shape=shape)


@handles("div_", "mul_")
def _aten_inplace_arith(conv: _Converter, node: torch.fx.Node, kw: dict[str, Any]) -> Any:
    """In-place ``div_``/``mul_`` (dropout's ``noise.div_(1 - p)``) as a new value: safe only when
    nothing else reads the tensor it overwrites, which is what a traced graph gives for dropout."""
    target = node.args[0]
    if not isinstance(target, torch.fx.Node) or any(u is not node for u in target.users):
        return NotImplemented
    return conv._binary(node, "divide" if _name(node) == "div_" else "multiply")


def _name(node: torch.fx.Node) -> str:
    target = node.target
    return str(getattr(target, "_opname", None) or getattr(target, "__name__", target))


__all__ = ["RNG_STATE_INPUT", "uses_rng"]
