"""Casts folded into the elementwise instructions that produce or read them.

An engine instruction reads and writes any of the engines' types and computes in FP32 (neuroncore.md
§2.6: engines convert on read and write at no cost), so a ``convert`` between two elementwise ops is
not a pass of its own on the device: neuronx-cc writes the producer's result in the cast's type, or
lets the reader read the narrower type [assumption: as XLA fuses a convert into the elementwise
loop that produces or consumes it]. Lowered op by op, each cast was one more Vector pass over its
tensor (the cross-entropy of a training step: four of the eight Vector passes per vocabulary block
only changed a type).

The pass rewrites the graph before lowering (``program.graph`` is the rewritten graph, so
``run_reference(program.graph)`` is what the core computes), in two rules:

* **a widening cast read by elementwise ops**: ``convert(x)`` from BF16/FP16 to FP32 whose every
  reader is an elementwise op (or a last-dim reduction) is removed; the readers read ``x`` and keep
  their FP32 result. Widening is exact, and the engines compute in FP32 either way: bit-identical.
* **a narrowing cast of an elementwise result**: ``convert(p)`` where ``p`` is an elementwise op (a
  compare included) read only by the cast, is ``p`` writing the cast's type (an FP32 result rounded
  once to BF16/FP16; a compare writing 1.0 / 0.0 as a float): the one rounding is the cast's own,
  so bit-identical. Not done when ``p`` reads a matmul's product (through reshapes or a bias add):
  the matmul's evacuation already writes such casts itself (``orientation.epilogue_chain``).

A graph with nothing to fold is returned as it is.
"""

from __future__ import annotations

from neuroncore.dtypes import DType
from neuroncore.ir.graph import BINARY_OPS, UNARY_OPS, Graph, Op

ELEMENTWISE = frozenset({*UNARY_OPS, *BINARY_OPS, "compare", "gelu", "silu", "gelu_dx", "silu_dx"})
NARROW_FLOATS = frozenset({DType.BF16, DType.FP16})


def _reads_product(op: Op) -> bool:
    """Whether ``op`` reads a matmul/convolution product, through reshapes or a bias add."""
    for operand in op.operands:
        src = operand
        while src.opcode == "reshape":
            src = src.operands[0]
        if src.opcode in ("dot", "convolution"):
            return True
        if src.opcode == "add" and any(o.opcode in ("dot", "convolution") for o in src.operands):
            return True
    return False


def _widening(op: Op, users: list[Op], outputs: set[int]) -> bool:
    """``op`` is a cast from a 16-bit float to FP32 whose readers take the narrow type directly."""
    if op.opcode != "convert" or op.dtype is not DType.FP32 or op.index in outputs:
        return False
    if op.operands[0].dtype not in NARROW_FLOATS or op.operands[0].opcode == "constant":
        return False  # a cast weight is folded at compile time anyway
    return bool(users) and all(
        u.opcode in ELEMENTWISE or (u.opcode == "reduce" and len(u.shape) >= 1
                                    and tuple(u.attrs["dimensions"]) == (len(op.shape) - 1,))
        for u in users)


def _narrowing(op: Op, users: dict[int, list[Op]], outputs: set[int]) -> bool:
    """``op`` is a cast whose operand, an elementwise op read only by it, can write its type."""
    if op.opcode != "convert" or not op.dtype.is_float or op.index in outputs:
        return False
    src = op.operands[0]
    if src.opcode not in ELEMENTWISE or src.index in outputs or len(users[src.index]) != 1:
        return False
    if src.shape != op.shape or _reads_product(src):
        return False
    if src.opcode == "compare":
        return True  # a predicate written as 1.0 / 0.0 in a float type: exact
    return src.dtype is DType.FP32 and op.dtype in NARROW_FLOATS


def fold_casts(graph: Graph) -> Graph:
    """``graph`` with its foldable casts folded (the same graph when there are none)."""
    users = graph.users()
    outputs = {o.index for o in graph.outputs}
    widen = {op.index for op in graph.ops if _widening(op, users[op.index], outputs)}
    narrow = {op.index for op in graph.ops if op.index not in widen and _narrowing(op, users, outputs)}
    if not widen and not narrow:
        return graph
    written_as = {op.operands[0].index: op for op in graph.ops if op.index in narrow}
    ops: list[Op] = []
    new: dict[int, Op] = {}
    for op in graph.ops:
        if op.index in widen:
            new[op.index] = new[op.operands[0].index]  # readers read the narrow value
            continue
        if op.index in narrow:
            new[op.index] = new[op.operands[0].index]  # the producer wrote this type
            continue
        dtype = written_as[op.index].dtype if op.index in written_as else op.dtype
        copy = Op(index=len(ops), opcode=op.opcode, name=op.name,
                  operands=tuple(new[o.index] for o in op.operands), shape=op.shape, dtype=dtype,
                  attrs=dict(op.attrs), layer=op.layer, frames=op.frames)
        ops.append(copy)
        new[op.index] = copy
    return Graph(graph.name, ops, [new[p.index] for p in graph.parameters],
                 [new[o.index] for o in graph.outputs])


__all__ = ["fold_casts"]
