"""Linear-layer orientation: which matmuls write their result feature-major.

Why: a linear layer ``y = x @ W^T`` on the Tensor engine contracts over the partition dim, so its
token-major input ``x [tokens, K]`` must first be transposed to ``[K, tokens]`` (a PE transpose per
128 x 128 block, each with its PSUM evacuation). neuronx-cc instead picks each matmul's output
orientation: with the weight as the *stationary* operand and the activations as the *moving* one
the PE writes ``y^T [N, tokens]`` (features on partitions), which is exactly the ``[K, tokens]``
operand the next matmul contracts over, so that one needs no transpose; a bias along the features
then is one value per partition, which ACT adds while evacuating PSUM (ACT computes
``func(in * scale + bias)`` with a per-partition bias, neuroncore.md §4.2).

What: a *feature-major value* is stored as the row tiles of ``[N, T]`` (``N`` = its last dim,
``T`` = the product of the others: every token), not of its logical shape. A linear's product (the
dot, or its bias add and activation, fused in its evacuation) is feature-major when every reader
takes it so: elementwise ops and reshapes that keep the last dim, all of whose full-size operands
are feature-major too (SwiGLU's ``silu(gate) * up``), ending at 2-D matmuls that contract over its
last dim (which read it in place as their stationary operand). Anything else reading it (a norm
over the features, a residual add with a token-major value, a graph output, a head split) keeps
the whole chain token-major, as does a value too large to stay in SBUF or one of fewer tokens
than partitions (``MIN_TOKENS``: decode steps). The plan is structural
(the graph alone), so every layer of a run is oriented alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from neuroncore.dtypes import DType
from neuroncore.ir.graph import BINARY_OPS, UNARY_OPS, Graph, Op

# fewer tokens than partitions (decode steps): each MATMUL with the tokens as the moving operand
# costs its 64-cycle minimum and the weight as stationary needs one LoadStationary per 128 x 128
# block, while the transposes saved are of a few rows; such linears stay token-major [assumption:
# neuronx-cc's choice is cost-based; Llama-2-70B tp32 decode measured 25.7 ms token-major vs
# 29.0 ms feature-major]
MIN_TOKENS = 128
ORIENTED_UNARY = frozenset({*UNARY_OPS, "gelu", "silu", "convert"})
ORIENTED_BINARY = frozenset(BINARY_OPS)
EPILOGUE_FUNCTIONS = frozenset({"gelu", "silu", "tanh", "logistic", "exponential", "erf", "sqrt",
                                "rsqrt", "log", "abs", "sine", "cosine"})


# a cast the evacuation may make as its own write: engines convert on write at no cost
# (neuroncore.md §2.6), so ``convert(gelu(psum + b))`` to BF16 is the ACTIVATE writing BF16
EVACUATION_CASTS = frozenset({DType.BF16, DType.FP16})


def epilogue_chain(start: Op, dot: Op, only_user: Callable[[Op], Op | None]
                   ) -> list[tuple[Op, str | None, tuple[Op, ...]]]:
    """What a dot's evacuation can also compute after ``start`` (the dot, or its fused bias add):
    an activation, then a cast to a 16-bit float, each the only reader of what precedes it,
    looking through reshapes that keep the last dim (torch's ``Linear`` on ``[B, S, H]`` reshapes
    between the matmul, its bias add and the activation: elementwise ops do not care).

    Returns the candidate products, longest first: ``(product, func, ops fused after start)``; the
    caller takes the first whose value it can write (its tiles those of the dot). A cast is taken
    only after an FP32 dot (its sums are the dot's value, so one rounding on the write is the cast's
    own rounding: numerics unchanged)."""
    out: list[tuple[Op, str | None, tuple[Op, ...]]] = []
    last = dot.shape[-1] if dot.shape else None

    def through_views(op: Op) -> tuple[list[Op], Op | None]:
        views: list[Op] = []
        user = only_user(op)
        while (user is not None and user.opcode == "reshape" and user.shape
               and user.shape[-1] == last):
            views.append(user)
            user = only_user(user)
        return views, user

    cur, func, fused = start, None, []
    views, user = through_views(cur)
    if user is not None and user.opcode in EPILOGUE_FUNCTIONS and user.dtype == dot.dtype:
        func = user.opcode
        if func == "gelu" and user.attrs.get("approximate", "tanh") != "tanh":
            func = "gelu_exact"
        fused += [*views, user]
        cur = user
        out.append((cur, func, tuple(fused)))
        views, user = through_views(cur)
    if (user is not None and user.opcode == "convert" and dot.dtype is DType.FP32
            and user.dtype in EVACUATION_CASTS and cur.dtype is DType.FP32):
        out.append((user, func, (*fused, *views, user)))
    out.reverse()
    return out


def stored_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """The shape whose row tiles hold a feature-major value: ``[last dim, every other dim]``."""
    return shape[-1], math.prod(shape[:-1])


@dataclass(frozen=True)
class OrientedDot:
    """A 2-D dot lowered with the weight stationary, writing ``product`` feature-major.

    ``bias`` (a 1-D ``[N]`` value added along the last dim) and ``func`` (an activation) are
    applied in the evacuation; ``fused`` are the ops the dot's lowering makes (the broadcast, the
    add, the activation)."""

    dot: int
    product: int
    bias: int | None
    func: str | None
    fused: tuple[int, ...]


@dataclass(frozen=True)
class Orientation:
    """The feature-major plan of one graph: its oriented dots and feature-major values."""

    heads: dict[int, OrientedDot]
    members: frozenset[int]

    @classmethod
    def none(cls) -> Orientation:
        return cls({}, frozenset())


def _splat(op: Op) -> bool:
    """A scalar constant (an immediate of the instruction, whatever the layout)."""
    if op.opcode == "broadcast" and op.operands:
        return _splat(op.operands[0]) and op.operands[0].size == 1
    return op.opcode == "constant" and "value" in op.attrs and "init" not in op.attrs and op.size == 1


def _only_user(graph: Graph, uses: dict[int, list[int]], outputs: set[int], op: Op) -> Op | None:
    if len(uses[op.index]) != 1 or op.index in outputs:
        return None
    return graph.ops[uses[op.index][0]]


def _head(graph: Graph, uses: dict[int, list[int]], outputs: set[int], dot: Op) -> OrientedDot | None:
    """The dot's product as its evacuation would write it: bias add, then activation."""
    lhs, rhs = dot.operands
    if (len(dot.shape) != 2 or len(lhs.shape) != 2 or len(rhs.shape) != 2 or not dot.dtype.is_float
            or dot.attrs["lhs_contract"] != 1 or lhs is rhs):
        return None
    cur, bias, func = dot, None, None
    fused: list[int] = []
    user = _only_user(graph, uses, outputs, cur)
    if user is not None and user.opcode == "multiply" and any(
            o.opcode == "broadcast" and o.operands and o.operands[0].opcode == "constant"
            and "init" in o.operands[0].attrs for o in user.operands):
        return None  # a dequantising scale (int8 weight-only), fused into the token-major evacuation
    if user is not None and user.opcode == "add" and user.dtype == dot.dtype:
        a, b = user.operands
        other = b if a is cur else a
        src = other.operands[0] if other.opcode == "broadcast" and other.operands else None
        if (src is not None and other is not cur and uses[other.index] == [user.index]
                and tuple(other.attrs["dims"]) == (1,) and src.shape == (dot.shape[-1],)
                and src.dtype == dot.dtype and other.index not in outputs
                and (src.index < dot.index or (src.opcode == "constant" and "init" in src.attrs))):
            bias, cur = src.index, user
            fused += [other.index, user.index]
    chain = epilogue_chain(cur, dot, lambda op: _only_user(graph, uses, outputs, op))
    if chain:  # feature-major tiles are those of [last dim, tokens]: any such product will do
        cur, func, more = chain[0]
        fused += [op.index for op in more]
    return OrientedDot(dot.index, cur.index, bias, func, tuple(fused))


def _consumer(op: Op, value: int) -> bool:
    """A 2-D matmul that contracts over the value's last dim, reading it as its left operand only."""
    if op.opcode != "dot" or len(op.shape) != 2:
        return False
    lhs, rhs = op.operands
    return (lhs.index == value and rhs.index != value and len(lhs.shape) == 2
            and op.attrs["lhs_contract"] == 1)


def plan(graph: Graph, max_bytes_per_partition: int) -> Orientation:
    """Which dots write feature-major and which values are stored so (see the module docstring).
    ``max_bytes_per_partition``: a value larger than this lives in HBM (``Context.hbm_home_bytes``)
    and keeps its token-major tiles."""
    uses: dict[int, list[int]] = {op.index: [] for op in graph.ops}
    for op in graph.ops:
        for operand in op.operands:
            uses[operand.index].append(op.index)
    outputs = {op.index for op in graph.outputs}
    heads: dict[int, OrientedDot] = {}
    internal: set[int] = set()
    members: set[int] = set()
    for op in graph.ops:
        if op.index in internal:
            continue
        if op.opcode == "dot":
            head = _head(graph, uses, outputs, op)
            if head is not None:
                heads[op.index] = head
                internal.update(head.fused)
                members.add(head.product)
            continue
        if op.opcode == "reshape":
            src = op.operands[0]
            if src.index in members and op.shape and op.shape[-1] == src.shape[-1]:
                members.add(op.index)
            continue
        if op.opcode in ORIENTED_UNARY or op.opcode in ORIENTED_BINARY:
            full = [o for o in op.operands if not _splat(o)]
            if (full and op.dtype.is_float and len(op.shape) >= 1
                    and all(o.index in members and o.shape == op.shape for o in full)):
                members.add(op.index)
    by_index = {op.index: op for op in graph.ops}

    def fits(op: Op) -> bool:
        n, t = stored_shape(op.shape)
        item = op.dtype.itemsize
        if t < MIN_TOKENS:
            return False
        return max(math.ceil(n / 128) * t, math.ceil(t / 128) * n) * item <= max_bytes_per_partition

    products = {h.product: h for h in heads.values()}
    changed = True
    while changed:
        changed = False
        for index in sorted(members):
            op = by_index[index]
            keep = (index not in outputs and bool(uses[index]) and fits(op)
                    and all(u in members or _consumer(by_index[u], index) for u in uses[index]))
            if keep and index not in products:  # a chain member: every full operand oriented
                keep = all(o.index in members for o in op.operands if not _splat(o))
            if not keep:
                members.discard(index)
                changed = True
    kept = {d: h for d, h in heads.items() if h.product in members}
    return Orientation(kept, frozenset(members))


__all__ = ["Orientation", "OrientedDot", "plan", "stored_shape"]
