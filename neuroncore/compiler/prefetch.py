"""Weight prefetch one layer ahead (``CompilerOptions(prefetch_weights=True)``): a scheduling pass.

Why: every DMA on the ``qSync*`` queues is triggered by the Sync engine, which runs its triggers in
program order. A layer's weight loads are emitted where its matmuls are lowered, after the previous
layer's activation loads, stores and spills, whose triggers wait for that layer's compute; so the
next layer's weights queue behind them on the Sync engine even when their SBUF range is already
free (the allocator gives large weight blocks the range freed longest ago, ``memory.py``, so their
own hazards are old). Moving the weight-load triggers earlier in the Sync stream lets the loads
stream while the current layer computes -- what neuronx-cc's schedule does for weights.

What the pass does, after lowering and before semaphores are assigned: each weight-queue transfer's
trigger moves up the Sync stream, to the first Sync instruction the Sync engine is expected to reach
after the trigger's hazards clear (a schedule of the program as emitted is the estimate, as a
compiler's cost model is), but never above the first node of the layer before its own (one layer
ahead), never above a node it depends on (the previous users of its SBUF range), and never above an
earlier weight-queue trigger. The transfers keep their place in program order: their order on the
weight queue (it completes in order, and a wait for its latest transfer stands for the earlier ones)
and their priority on the DMA engines, which the timing model shares in program order within each
time slice (moving the transfers up too let the next layer's weights starve this layer's activation
loads and made a decode step slower). Dependencies only point backwards, so the result is still a
dependency-respecting order; memory safety is in those dependencies (every earlier access to the
range is one), so the numerics are unchanged. Semaphore values, program counters and operand texts
are computed afterwards from the new order, as for any program.

A *layer* is the op's layer path up to its first indexed component (``model/layers.3``,
``encoder/layer.0``, ``h.2``), else its first two components (``model/fc1``); layers are ordered by
where their first node is.
"""

from __future__ import annotations

import re
from array import array

import numpy as np

from neuroncore.compiler.emitter import Emitter
from neuroncore.compiler.program import RES_DMA
from neuroncore.enums import Engine
from neuroncore.ir.graph import Graph

__all__ = ["layer_block", "prefetch_order", "reorder"]

_INDEXED = re.compile(r"[._]\d+$")


def layer_block(path: str) -> str:
    """The layer an op's layer path belongs to (module docstring)."""
    parts = [p for p in path.split("/") if p] if path else []
    for i, part in enumerate(parts):
        if _INDEXED.search(part):
            return "/".join(parts[:i + 1])
    return "/".join(parts[:2])


def prefetch_order(em: Emitter, graph: Graph, weight_queue: int, start_ns: np.ndarray,
                   end_ns: np.ndarray) -> list[int] | None:
    """The new program order (old node ids in their new sequence), or None when nothing moves.

    ``start_ns``/``end_ns``: a schedule of the program as emitted (``runtime.scheduler``), the
    compiler's estimate of when each trigger's hazards clear (module docstring)."""
    n = em.n_nodes
    if not n:
        return None
    # the layer of each node, and where each layer starts
    block_of: list[int] = []
    first_of: list[int] = []
    index: dict[str, int] = {}
    current = 0
    for op in em.op_index:
        if op >= 0:
            key = layer_block(graph.ops[op].layer)
            b = index.get(key)
            if b is None:
                b = index[key] = len(first_of)
                first_of.append(len(block_of))
            current = b
        block_of.append(current)
    waited_on = {d for deps in em.deps for d in deps}
    sync = np.flatnonzero(np.asarray(em.resource) == int(Engine.SYNC))  # the Sync stream, in order
    sync_start = start_ns[sync]
    target_of: dict[int, int] = {}  # trigger -> the old node it is placed before
    floor = 0
    for node in range(n):
        if em.resource[node] != RES_DMA or em.queue[node] != weight_queue:
            continue
        trig = em.trigger[node]
        b = block_of[node]
        if trig != node - 1 or trig in waited_on or b == 0:  # stays: a barrier for later ones
            # (placed before a node after it: before the trigger itself would pass it)
            floor = (trig if trig >= 0 else node) + 1
            continue
        deps = em.deps[trig]
        lo = max(first_of[b - 1], floor, max(deps) + 1 if deps else 0)
        ready = float(end_ns[deps].max()) if deps else 0.0
        # the first Sync node from ``lo`` on that the Sync engine reaches after the hazards clear
        k = int(np.searchsorted(sync, lo))
        k = max(k, int(np.searchsorted(sync_start, ready, side="left")))
        target = int(sync[k]) if k < sync.size else trig
        if target < trig:
            target_of[trig] = target
            floor = target
        else:
            floor = trig + 1
    if not target_of:
        return None
    moved = set(target_of)
    before: dict[int, list[int]] = {}
    for trig, target in target_of.items():  # in program order, so each list keeps it
        before.setdefault(target, []).append(trig)
    order: list[int] = []
    for i in range(n):
        order.extend(before.get(i, ()))
        if i not in moved:
            order.append(i)
    return order


def reorder(em: Emitter, order: list[int]) -> dict[int, int]:
    """Put ``em``'s nodes in ``order`` (old ids in their new sequence), remapping every node reference
    (dependencies, triggers); returns old id -> new id. Only for an emitter whose lowering is done."""
    new_of = {old: new for new, old in enumerate(order)}
    columns = ("resource", "engine", "cost_ns", "queue", "dma_engines", "deps", "op_index", "opcode",
               "text", "semantics", "activation_fn", "tensor_instruction_type", "performance_mode",
               "trigger", "ports", "counters", "_lane")
    for name in columns:
        values = getattr(em, name)
        reordered = [values[i] for i in order]
        setattr(em, name, array(values.typecode, reordered) if isinstance(values, array) else reordered)
    em.deps = [sorted(new_of[d] for d in deps) for deps in em.deps]
    em.trigger = array(em.trigger.typecode, [new_of[t] if t >= 0 else t for t in em.trigger])
    return new_of
