"""The canonical state a repeated layer starts from: nothing of earlier layers resident on chip.

Before each layer of a run of identical layers (``layer_runs``) every tile still in SBUF is written
back to HBM if it is used again and freed, as a modular compiler's layer module takes its inputs
from HBM. Each layer then lowers from the same allocator and placement state (up to relocation),
so its instruction stream is the same, and ``layer_replay`` can relocate one layer's stream instead
of lowering the others. The cost is one store and one reload of each value carried across the
boundary (the residual stream, the rotary tables): a few small DMA transfers per layer. Where that
write-back is not cheap (``worth_canonical_boundaries``: a short prefill's activations), resident
values stay in place and only the allocator cursors and hazards are made canonical; the state
then repeats with the residual stream at the same addresses every one, two or three layers.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from neuroncore.compiler.context import NEVER_USED_AGAIN, Context
from neuroncore.compiler.layer_runs import LayerRun
from neuroncore.compiler.lowering_state import HbmTensorKind, Layout, QueueName
from neuroncore.compiler.program import Ref
from neuroncore.compiler.tiling import tile_grid, tiles_of
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
    """Hazards older than the previous layer become nodes of the previous layer that imply them.

    A freed SBUF range or PSUM bank remembers who touched it last, however long ago; a range the
    last layer did not touch still names nodes of some earlier layer, so two layers never start
    from the same state. Each such node ``n`` (before ``previous_start``) is replaced:

    * by the previous layer's first node on ``n``'s in-order lane (lanes run in order, so waiting
      for a later node of the lane implies waiting for ``n``);
    * else (the previous layer did not use that lane: a spill store two layers back, a prologue
      load) by the previous layer's first node that waits for ``n`` or a later node of its lane
      (a node starts only when its dependencies are done); if there is none, ``n`` stays.

    And a range holding any such old hazard also waits for the previous layer's first node on every
    lane it used: which lanes touched a range in some earlier layer is history that otherwise grows
    layer by layer until it saturates, so the state would repeat only after several layers. These
    nodes ran at the start of the previous layer, so the extra waits are barely stricter.
    """
    em = ctx.em
    lanes = em._lane
    first: dict[int, int] = {}
    for node in range(previous_start, current_start):
        first.setdefault(lanes[node], node)
    every_lane = list(first.values())
    # per lane the previous layer did not use: (first waiter, the latest node of that lane it or an
    # earlier waiter waits for), in node order, the running latest increasing
    waiters: dict[int, tuple[list[int], list[int]]] = {}
    deps = em.deps
    for node in range(previous_start, current_start):
        for d in deps[node]:
            if d < previous_start and lanes[d] not in first:
                found = waiters.setdefault(lanes[d], ([], []))
                if not found[1] or d > found[1][-1]:
                    found[0].append(node)
                    found[1].append(d)

    def replacement(n: int) -> int:
        lane = lanes[n]
        in_lane = first.get(lane)
        if in_lane is not None:
            return in_lane
        found = waiters.get(lane)
        if found is not None:
            i = bisect.bisect_left(found[1], n)
            if i < len(found[1]):
                return found[0][i]
        return n

    def aged(nodes: list[int]) -> list[int]:
        if not nodes or min(nodes) >= previous_start:
            return nodes
        out = {n if n >= previous_start else replacement(n) for n in nodes}
        out.update(every_lane)
        return em.compact(out)

    for tomb in ctx.sbuf.tombstones:
        tomb.nodes = aged(tomb.nodes)
    ctx.psum.hazards = [aged(h) for h in ctx.psum.hazards]
    table = em._accesses
    for key, accesses in table.items():
        if any(a[4] < previous_start for a in accesses) and any(a[4] >= previous_start for a in accesses):
            table[key] = [a if a[4] >= previous_start else _moved(a, replacement(a[4]), lanes)
                          for a in accesses]


def merge_tombstones(ctx: Context) -> None:
    """Each free SBUF range that holds tombstones becomes one tombstone over the whole range, with
    the latest node of each lane among them (a canonical interface between layers: whatever the
    previous layer touched, anywhere in a free range, is waited for by whoever is placed there).

    Which ranges a layer freed last, and how its frees fragmented the tombstones, is history: the
    large blocks go to the range freed longest ago (``RangeAllocator._allocate_top``), so layers
    lowered one after another place their weights in a cycle (the Llama-2-70B tp32 rank's long
    prefill through three placements, 4 nodes apart in length), and the boundary state repeats
    only after that cycle has been seen twice. A module compiled once behind a canonical interface
    (neuronx-cc's modular flow) cannot know that history either: it starts with SBUF free and its
    first writes wait for what the module before it left in flight. Used at the boundaries of a
    run that moves nothing (``LayerDedup.quiet``: a long prompt's, every value in HBM), where all
    of SBUF but the program's own globals is free. A stated assumption; it changes programs.
    """
    ctx.sbuf.merge_tombstones(ctx.em.compact)


def _moved(access: tuple, node: int, lanes: Sequence[int]) -> tuple:
    """A recorded access as made by ``node`` (on its own lane: a same-lane node skips the wait)."""
    return (*access[:4], node, lanes[node], *access[6:])


BOUNDARY_TRAFFIC_LIMIT = 0.01  # write-back + reload at a boundary, as a fraction of a layer's weights


def worth_canonical_boundaries(ctx: Context, run: LayerRun) -> bool:
    """Whether a boundary writes back what is resident (``evict_resident``): only where that costs
    little next to the layer itself, measured where the run begins (before its first layer is
    lowered).

    A decode step carries a few KiB of residual stream (16 KiB on Llama-2-7B at tp 24) into a layer
    that streams megabytes of weights: storing and reloading it is noise. A short prefill keeps its
    activations on chip (2 MiB for 128 tokens of Llama-2-7B, 10 % of a rank's layer weights at
    tp 24), and writing them back would cost several per cent of device time: such runs' boundaries
    leave resident values where they are (``layer_replay``), and only the cursors and hazards are
    made canonical. A long prompt's activations do not fit on chip and already live in HBM (2048
    tokens and more at Llama-2-7B's width, or 512 tokens at batch 4): a write-back moves nothing
    there. The rule, a stated assumption: the bytes the boundary would store and reload now
    (``boundary_traffic``) must stay under ``BOUNDARY_TRAFFIC_LIMIT`` of the layer's weight bytes.
    """
    return boundary_traffic(ctx, run) <= BOUNDARY_TRAFFIC_LIMIT * layer_weight_bytes(ctx.graph, run)


def boundary_traffic(ctx: Context, run: LayerRun) -> int:
    """Bytes a canonical boundary before the run's first layer would move now (``evict_resident``):
    every tile still in SBUF whose value is used again is reloaded, and stored first if HBM holds
    no copy. A value the first layer reads that is not lowered yet (an open fusion group) counts as
    resident in full unless it is too large to be kept on chip (``Context.define``'s rule)."""
    total = 0
    for value in ctx.values.values():
        if ctx._next_use(value.op.index) == NEVER_USED_AGAIN:
            continue
        per_row = value.cols * value.op.dtype.itemsize
        for t, buf in enumerate(value.bufs):
            if buf is not None:
                total += (1 if value.in_hbm[t] else 2) * value.tiles[t].rows * per_row
    layer = run.layers[0]
    pending = {o.index: o for op in ctx.graph.ops[layer.start:layer.stop] for o in op.operands
               if o.index < layer.start and o.index not in ctx.values}
    for o in pending.values():
        if o.opcode == "parameter" or "init" in o.attrs:
            continue
        tiles = tiles_of(o.shape, Layout.ROW)
        _, _, cols = tile_grid(o.shape, Layout.ROW)
        if (o.index in ctx.force_sbuf or o.index in ctx.kept_large
                or len(tiles) * cols * o.dtype.itemsize <= ctx.hbm_home_bytes):
            total += 2 * o.nbytes
    return total


def layer_weight_bytes(graph: Graph, run: LayerRun) -> int:
    """Bytes of the weights (constants) the run's first layer reads."""
    layer = run.layers[0]
    return sum(op.nbytes for op in graph.ops[layer.start:layer.stop] if "init" in op.attrs)


__all__ = ["BOUNDARY_TRAFFIC_LIMIT", "age_hazards", "boundary_traffic", "evict_resident",
           "layer_weight_bytes", "merge_tombstones", "worth_canonical_boundaries"]
