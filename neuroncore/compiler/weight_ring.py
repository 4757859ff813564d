"""Whether a program gets a weight ring: the SBUF its activations leave, estimated from the graph.

neuronx-cc allocates SBUF statically, ahead of time (Walrus's coloring allocator,
neuroncore.md §7.1), so it knows how much of SBUF a program's activations need before it gives
weights buffers of their own. The estimate here is the same question asked of the graph: walking
the ops in program order, the bytes per partition of the activations live at once (a value lives
from its op to its last reader; values that would live in HBM -- over a quarter of SBUF per
partition, ``Context.define``'s rule -- and weights, their casts to BF16 included, count nothing).
A program whose peak leaves the ring's share of SBUF free starts with the ring
(``RangeAllocator.allocate(stream=True)``); any other program is placed without one.
[assumption: the live set of whole values stands for the allocator's view; tiles freed early
and fusion groups' internal tiles make the real need smaller, spills and scratch larger.]
"""

from __future__ import annotations

import math

import numpy as np

from neuroncore.compiler.tiling import P
from neuroncore.ir.graph import Graph, Op

# ops whose value the compiler never holds as an activation of its own: weights and views (a view
# aliases its source's tiles or is read through by its reader)
VIEWS = frozenset({"reshape", "broadcast", "transpose", "slice", "bitcast"})
NOT_ACTIVATIONS = VIEWS | {"constant", "get-tuple-element", "tuple"}


def value_bytes_per_partition(op: Op) -> int:
    """SBUF bytes per partition of ``op``'s value in row tiles: ceil(rows / 128) x last dim."""
    if not op.shape:
        return op.dtype.itemsize
    rows = math.prod(op.shape[:-1])
    return math.ceil(rows / P) * op.shape[-1] * op.dtype.itemsize


def is_weight(op: Op) -> bool:
    """A constant, or a cast of one through views (``convert(constant)``: a weight the auto-cast
    path casts to BF16, folded at compile time and streamed from HBM like the constant itself)."""
    while op.opcode in VIEWS or op.opcode == "convert":
        if not op.operands:
            return False
        op = op.operands[0]
    return op.opcode == "constant"


def last_uses(graph: Graph) -> dict[int, int]:
    """Per op, the index of the last op that reads its value (a reader of a view reads the view's
    source: the source lives as long); a graph output lives to the end (``len(graph.ops)``)."""
    last_use = {op.index: op.index for op in graph.ops}

    def read(value: Op, at: int) -> None:  # a view's reader reads its source: it lives as long
        while True:
            last_use[value.index] = max(last_use[value.index], at)
            if value.opcode not in VIEWS or not value.operands:
                return
            value = value.operands[0]

    for op in graph.ops:
        for operand in op.operands:
            read(operand, op.index)
    for out in graph.outputs:
        read(out, len(graph.ops))
    return last_use


def live_bytes(graph: Graph, hbm_home_bytes: int, kept: frozenset[int] = frozenset()) -> np.ndarray:
    """Per op position (and one past the last), the bytes per partition of SBUF-home activations
    live there: a value from its op to its last reader (``last_uses``), weights and values over
    ``hbm_home_bytes`` counting nothing unless ``kept`` (``residency``) keeps them on chip. The one
    definition of the live set that the ring's estimate and the residency rule both read."""
    last_use = last_uses(graph)
    live = np.zeros(len(graph.ops) + 2, np.int64)
    for op in graph.ops:
        if op.opcode in NOT_ACTIVATIONS or is_weight(op):
            continue
        size = value_bytes_per_partition(op)
        if size <= hbm_home_bytes or op.index in kept:
            live[op.index] += size
            live[last_use[op.index] + 1] -= size
    return np.cumsum(live)


def activation_peak_bytes(graph: Graph, hbm_home_bytes: int, kept: frozenset[int] = frozenset()) -> int:
    """The most bytes per partition of SBUF-home activations live at once, in program order;
    ``kept``: values over ``hbm_home_bytes`` that stay in SBUF all the same (``residency``)."""
    return int(live_bytes(graph, hbm_home_bytes, kept)[:len(graph.ops)].max(initial=0))


def ring_fits(graph: Graph, sbuf_bytes: int, fraction: float, hbm_home_bytes: int) -> bool:
    """Whether the activations' peak leaves the ring's share of SBUF free."""
    return fraction > 0 and activation_peak_bytes(graph, hbm_home_bytes) <= sbuf_bytes * (1 - fraction)
