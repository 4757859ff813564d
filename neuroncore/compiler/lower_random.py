"""Random numbers on the core: the ``rng`` op as GpSimd RNG instructions, one per output tile.

Each instruction reads the program's RNG state tile (seed, offset: two FP32 integers loaded once
from the state input) and writes a tile of uniforms in [0, 1); the counter of every element is its
linear position in the tensor, so the tiles are independent and the values equal the reference
semantics (``neuroncore.ir.philox``) whatever the tiling. Cost: like IOTA, the GpSimd start-up plus
one element per partition per cycle [assumption: the hardware RNG keeps pace with the engine's
lanes; neuroncore.md gives no RNG rate].
"""

from __future__ import annotations

from neuroncore.compiler import costs
from neuroncore.compiler.context import Context
from neuroncore.compiler.counters import NodeCounters
from neuroncore.compiler.emitter import sbuf_key
from neuroncore.compiler.node_semantics import Random
from neuroncore.hardware import Engine
from neuroncore.ir.graph import Op


def lower_rng(ctx: Context, op: Op) -> None:
    """One RNG instruction per output tile (see the module docstring)."""
    state = op.operands[0]
    value = ctx.define(op)
    stream = int(op.attrs.get("stream", 0))
    algorithm = str(op.attrs.get("algorithm", "philox"))
    spec = ctx.spec
    for t, tile in enumerate(value.tiles):
        key = ctx.tile(state, 0)
        out = ctx.produce(op, t)
        first_row = tile.batch * value.rows_per_batch + tile.r0
        ctx.em.instruction(
            Engine.GPSIMD, "RNG",
            costs.cycles_to_ns(spec, Engine.GPSIMD, costs.gpsimd_cycles(spec, out.cols)),
            reads=[sbuf_key(key)], writes=[sbuf_key(out)],
            text=f"{algorithm} stream={stream} first_row={first_row} state={ctx.ref_text(key)} "
                 f"dst={ctx.ref_text(out)}",
            semantics=Random(out, key, first_row, value.cols, stream, op.attrs.get("block"), algorithm,
                             op.attrs.get("key")),
            counters=NodeCounters(sbuf_read_bytes=8, sbuf_write_bytes=out.rows * out.cols * 4),
        )
        ctx.produced(op, t, out)
        ctx.unpin_all()


__all__ = ["lower_rng"]
