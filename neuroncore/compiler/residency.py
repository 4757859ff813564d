"""Which values larger than a quarter of SBUF stay on chip: decided by the live set, from the graph.

``Context.define`` sends a value over a quarter of SBUF per partition (``Context.hbm_home_bytes``)
to HBM. That rule looks at one value alone; neuronx-cc's allocator looks at all of them: Walrus
allocates SBUF statically with a coloring allocator (neuroncore.md §7.1), so a value stays on chip
when it fits beside everything live with it, whatever its own size. The same question is asked of
the graph before lowering: walking the ops in program order, a value over the quarter stays in
SBUF when, at every op of its life (from its op to its last reader, through views), the bytes per
partition of the SBUF-home activations live then (those within the quarter and the larger ones kept
before it, counted as ``weight_ring.activation_peak_bytes`` counts them) plus its own stay within
``RESIDENT_SBUF_FRACTION`` of SBUF. Layers relocated from one lowered layer (``layer_replay``) must
place alike: a value is kept only when the same op is kept in every layer of its run.

[assumption] Half of SBUF for whole values, the other half for what the ops work in (weight blocks,
partial sums, staging): the share the weight ring (``context.WEIGHT_STREAM_FRACTION``) and fusion
groups' internal tiles (``streaming.INTERNAL_SBUF_FRACTION``) already assume. Three quarters was
measured and is worse where the live set is large (BERT-large inf2 b8: 30.1 -> 35.4 ms; its
64 KB attention scores kept beside the rest spill more than they save). The live set of whole values
is the graph's view: ops fused into a producer's evacuation (a convolution's batch norm and ReLU)
count as values of their own, tiles freed early make the real need smaller, spills larger; where
the estimate is wrong the spiller still moves tiles to HBM, furthest next use first.
"""

from __future__ import annotations

from collections.abc import Sequence

from neuroncore.compiler.layer_runs import LayerRun
from neuroncore.compiler.weight_ring import (
    NOT_ACTIVATIONS,
    is_weight,
    last_uses,
    live_bytes,
    value_bytes_per_partition,
)
from neuroncore.ir.graph import Graph

RESIDENT_SBUF_FRACTION = 0.5


def kept_on_chip(graph: Graph, hbm_home_bytes: int, budget_bytes: int,
                 runs: Sequence[LayerRun] = ()) -> frozenset[int]:
    """Indices of the values over ``hbm_home_bytes`` per partition that stay in SBUF: in program
    order, each whose life fits ``budget_bytes`` beside the SBUF-home values live with it; of a
    run of repeated layers (``runs``), only ops kept in every layer of the run. A run's last layer
    that is the model's last (``LayerRun.loose``: ``layer_runs.with_final_layer``) is planned as
    the layer before it: a value of it is a candidate only where the same op of that layer is kept
    (so that room it would take there is not taken by what the run keeps no longer)."""
    follows: dict[int, int] = {}
    for run in runs:
        if run.loose and len(run.layers) >= 2:
            final, before = run.layers[-1], run.layers[-2]
            follows.update((final.start + offset, before.start + offset) for offset in range(final.size))
    last_use = last_uses(graph)
    outputs = {o.index for o in graph.outputs}
    # a parameter is an input: HBM-home whatever its size
    candidates = [(op.index, last_use[op.index], size) for op in graph.ops
                  if op.opcode not in NOT_ACTIVATIONS and op.opcode != "parameter" and not is_weight(op)
                  and hbm_home_bytes < (size := value_bytes_per_partition(op)) <= budget_bytes
                  and op.index not in outputs and last_use[op.index] > op.index]
    if not candidates:
        return frozenset()
    live = live_bytes(graph, hbm_home_bytes)
    kept: set[int] = set()
    for start, end, size in candidates:
        if start in follows and follows[start] not in kept:
            continue
        if int(live[start:end + 1].max()) + size <= budget_bytes:
            live[start:end + 1] += size
            kept.add(start)
    for run in runs:
        first = run.layers[0]
        for offset in range(first.size):
            indices = [layer.start + offset for layer in run.layers]
            if any(i in kept for i in indices) and not all(i in kept for i in indices):
                kept.difference_update(indices)
    return frozenset(kept)
