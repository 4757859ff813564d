"""The canonical state a repeated layer starts from: nothing of earlier layers resident on chip.

Before each layer of a run of identical layers (``layer_runs``) every tile still in SBUF is written
back to HBM if it is used again and freed, as a modular compiler's layer module takes its inputs
from HBM. Each layer then lowers from the same allocator and placement state (up to relocation),
so its instruction stream is the same, and ``layer_replay`` can relocate one layer's stream instead
of lowering the others. The cost is one store and one reload of each value carried across the
boundary (the residual stream, the rotary tables): a few small DMA transfers per layer.
"""

from __future__ import annotations

from neuroncore.compiler.context import NEVER_USED_AGAIN, Context
from neuroncore.compiler.layer_runs import LayerRun
from neuroncore.compiler.lowering_state import HbmTensorKind, QueueName
from neuroncore.compiler.program import Ref
from neuroncore.ir.graph import Graph


def evict_resident(ctx: Context) -> None:
    """Store (if still needed and not yet in HBM) and free every resident tile, in value order."""
    for value in list(ctx.values.values()):
        live = ctx._next_use(value.op.index) != NEVER_USED_AGAIN
        for t, buf in enumerate(value.bufs):
            if buf is None:
                continue
            if live and not value.in_hbm[t]:
                if value.hbm is None:
                    value.hbm = ctx.hbm_tensor(f"spill.{value.op.name}", value.op, HbmTensorKind.SCRATCH)
                ref = Ref(buf.id, 0, value.tiles[t].rows, 0, value.cols)
                ctx.dma_store(QueueName.SPILL_RELOAD, ref, value.access(t), value.op.dtype,
                              rows_per_batch=value.rows_per_batch)
                value.in_hbm[t] = True
            value.bufs[t] = None
            ctx.free(buf)




def age_hazards(ctx: Context, previous_start: int, current_start: int) -> None:
    """Hazards older than the previous layer become its first node on the same in-order lane.

    A freed SBUF range or PSUM bank remembers who touched it last, however long ago; a range the
    last layer did not touch still names nodes of some earlier layer, so two layers never start
    from the same state. Waiting for a later node of the same lane implies waiting for the earlier
    one (lanes run in order), so the replacement is safe; it is the earliest such node, so the wait
    is barely stricter: the ranges it applies to were last used at least a layer ago.
    """
    lanes = ctx.em._lane
    first: dict[int, int] = {}
    for node in range(previous_start, current_start):
        first.setdefault(lanes[node], node)

    def aged(nodes: list[int]) -> list[int]:
        if not nodes or min(nodes) >= previous_start:
            return nodes
        out = {first.get(lanes[n], n) if n < previous_start else n for n in nodes}
        return ctx.em.compact(out)

    for tomb in ctx.sbuf.tombstones:
        tomb.nodes = aged(tomb.nodes)
    ctx.psum.hazards = [aged(h) for h in ctx.psum.hazards]
    table = ctx.em._accesses
    for key, accesses in table.items():
        if any(a[4] < previous_start for a in accesses) and any(a[4] >= previous_start for a in accesses):
            table[key] = [a if a[4] >= previous_start else (*a[:4], first.get(a[5], a[4]), *a[5:])
                          for a in accesses]


BOUNDARY_TRAFFIC_LIMIT = 0.01  # write-back + reload at a boundary, as a fraction of a layer's weights


def worth_canonical_boundaries(graph: Graph, run: LayerRun) -> bool:
    """Whether writing back what crosses a boundary costs little next to the layer itself.

    A decode step carries a few KiB of residual stream into a layer that streams megabytes of
    weights: storing and reloading it is noise (~0.5 % of device time on Llama-2-7B at tp 24). A
    short prefill carries the whole prompt's activations (1 MiB for 128 tokens of Llama-2-7B) into
    the same weights, and the round trip would cost several per cent: such runs are lowered layer
    by layer as before. The rule, a stated assumption: the bytes read from earlier layers (not
    inputs or weights, which live in HBM anyway), stored and reloaded, must stay under
    ``BOUNDARY_TRAFFIC_LIMIT`` of the layer's weight bytes.
    """
    layer = run.layers[1] if len(run.layers) > 1 else run.layers[0]
    ops = graph.ops[layer.start:layer.stop]
    crossing = {o.index: o for op in ops for o in op.operands if o.index < layer.start
                and o.opcode != "parameter" and "init" not in o.attrs}
    carried = sum(o.nbytes for o in crossing.values())
    weights = sum(op.nbytes for op in ops if "init" in op.attrs)
    return 2 * carried <= BOUNDARY_TRAFFIC_LIMIT * weights


__all__ = ["BOUNDARY_TRAFFIC_LIMIT", "age_hazards", "evict_resident", "worth_canonical_boundaries"]
