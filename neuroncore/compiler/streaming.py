"""Fusion groups: a chain of batched ops lowered one batch at a time, its intermediates kept in SBUF.

Why: neuronx-cc fuses the ops of a layer into loops over tiles, so a producer's tile is consumed
while it is still on chip; attention on Neuron is one kernel per (batch, head) block whose scores,
probabilities and statistics never leave SBUF (the NKI flash-attention kernel NxD and
NeMo-Megatron train with). Lowering each op over its whole tensor instead makes every intermediate
larger than SBUF holds, so each one was stored to HBM and read back by the next op.

What: consecutive ops of the same batch structure (``prod(shape[:-2])`` independent batches of
unpacked row tiles) where each reads an earlier member form a *group*; each member's lowering is a
generator that yields after finishing a batch, and the group advances all members batch by batch
in program order. A value whose every reader is in the group (and which is not a graph output) is
*internal*: it lives in SBUF whatever its total size, and each batch of its tiles is freed as soon
as the group has moved past that batch. Constants, parameters and views that read nothing of the
group may be lowered while a group is open; a reshape of a member that keeps each batch's rows and
columns (``stepping_view``: BERT's scores ``[B*H, S, S]`` seen as ``[B, H, S, S]``) aliases its
tiles and steps with it; anything else that reads a member closes the group.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from neuroncore.compiler.context import Context
from neuroncore.compiler.lower_elementwise import binary_steps, unary_steps
from neuroncore.compiler.lower_layout import lower_view
from neuroncore.compiler.lower_matmul import dot_steps, fused_epilogue, fused_scale
from neuroncore.compiler.lower_reduce import reduce_steps, softmax_steps
from neuroncore.compiler.lowering_state import Layout
from neuroncore.compiler.tiling import P, is_packed
from neuroncore.ir.graph import BINARY_OPS, LAYOUT_OPS, UNARY_OPS, Op

INTERNAL_SBUF_FRACTION = 0.5  # internal tiles live at once may take this much of SBUF [assumption]

Steps = Callable[[Context, Op], Iterator[bool]]

STEPPED: dict[str, Steps] = {
    "dot": dot_steps,
    "softmax": softmax_steps,
    "reduce": reduce_steps,
    "gelu": unary_steps,
    "silu": unary_steps,
    "gelu_dx": unary_steps,
    "silu_dx": unary_steps,
    "compare": binary_steps,
    **{name: unary_steps for name in UNARY_OPS},
    **{name: binary_steps for name in BINARY_OPS},
}
HOISTABLE = frozenset({"constant", "parameter", *LAYOUT_OPS})


@dataclass(frozen=True)
class Grain:
    """How an op's lowering can be advanced: ``tiles`` steps of one row tile (None for a dot with
    several tiles per batch), or ``batches`` steps of one batch."""

    tiles: int | None
    batches: int


def grain(op: Op) -> Grain | None:
    """How ``op`` steps, or None when it cannot join a group."""
    if op.opcode not in STEPPED and op.opcode != "convert":
        return None
    if op.opcode == "convert" and op.operands[0].opcode == "constant":
        return None  # a cast weight, folded at compile time
    shape = op.shape
    if op.opcode == "reduce":
        src = op.operands[0]
        if tuple(op.attrs["dimensions"]) != (len(src.shape) - 1,) or len(src.shape) < 2:
            return None
        shape = src.shape
    if len(shape) < 2 or is_packed(shape, Layout.ROW):
        return None
    batches = math.prod(shape[:-2])
    per_batch = math.ceil(shape[-2] / P)
    if op.opcode == "dot":
        if len(shape) < 3:
            return None  # a 2-D dot's blocks span every row tile
        return Grain(batches if per_batch == 1 else None, batches)
    return Grain(batches * per_batch, batches)


def units_of(ctx: Context, op: Op) -> Grain | None:
    """:func:`grain`, and None for a dot whose evacuation writes another op's value (a fused
    dequantisation scale, a bias / activation epilogue) or an elementwise op that would not run
    in row tiles."""
    if op.index in ctx.orientation.members:
        return None  # feature-major tiles (compiler.orientation) do not step like row tiles
    step = grain(op)
    if step is not None and op.opcode == "dot" and (fused_scale(ctx, op) is not None
                                                     or fused_epilogue(ctx, op) is not None):
        return None
    if step is not None and op.opcode not in ("dot", "softmax", "reduce"):
        # an elementwise op takes the layout of its first full-size operand: only row tiles step
        # (a reduce's column layout, [rows, 1] tiles, would be read whole)
        for operand in op.operands:
            if operand.shape != op.shape:
                continue
            value = ctx.values.get(operand.index)
            if operand.opcode == "reduce" or (value is not None and value.layout != Layout.ROW):
                return None
    return step


@dataclass
class Group:
    """The open group: its members in program order and the ops lowered while it was open.
    ``by_tile``: members advance one row tile per step (else one batch); ``units`` steps."""

    by_tile: bool
    units: int
    members: list[Op] = field(default_factory=list)
    hoisted: list[Op] = field(default_factory=list)

    @classmethod
    def start(cls, op: Op, step: Grain) -> Group:
        if step.tiles is not None:
            return cls(True, step.tiles, [op])
        return cls(False, step.batches, [op])

    @property
    def indices(self) -> set[int]:
        return {m.index for m in self.members}


def steps_of(op: Op) -> Steps:
    if op.opcode == "convert":
        return unary_steps
    return STEPPED[op.opcode]


def _tile_bytes(op: Op) -> int:
    """SBUF bytes per partition one step of ``op``'s value takes (a row tile or a reduce column)."""
    if op.opcode == "reduce":
        return op.dtype.itemsize
    return op.shape[-1] * op.dtype.itemsize


def stepping_view(group: Group | None, op: Op) -> bool:
    """Whether ``op`` is a reshape of a member that keeps each batch's rows and columns (the
    attention scores ``[B*H, S, S]`` seen as ``[B, H, S, S]``): it aliases the member's tiles one
    for one, so the group's steps read it as they read the member."""
    if group is None or op.opcode != "reshape" or len(op.shape) < 2:
        return False
    src = op.operands[0]
    return (src.index in group.indices and op.shape[-2:] == src.shape[-2:]
            and math.prod(op.shape[:-2]) == math.prod(src.shape[:-2]))


def _view_steps(ctx: Context, op: Op, units: int) -> Iterator[bool]:
    lower_view(ctx, op)  # an alias of the member's tiles (lower_layout._try_alias)
    for _ in range(units):
        yield True


def _readers_through_views(uses: Mapping[int, Sequence[int]], views: set[int], i: int) -> list[int]:
    """The readers of value ``i``, a view member's own readers included. Module-level on purpose: a
    recursive closure refers to itself through its cell, a cycle that would keep the whole context
    alive after the compile (tests/neuroncore/test_compile_speed.py)."""
    out: list[int] = []
    for u in uses[i]:
        out.append(u)
        if u in views:
            out += _readers_through_views(uses, views, u)
    return out


def run_group(ctx: Context, group: Group) -> None:
    """Lower the members step by step; free each internal value's tiles once its last reader in
    the group has read them (a reader of a view member reads its source)."""
    members = group.members
    position = {m.index: i for i, m in enumerate(members)}
    views = {m.index for m in members if m.opcode == "reshape"}
    readers = {m.index: _readers_through_views(ctx.uses, views, m.index) for m in members}
    internal = [m for m in members
                if m.index not in ctx.outputs and ctx.uses[m.index]
                and all(u in position for u in readers[m.index])]
    last_reader = {m.index: max(position[u] for u in readers[m.index]) for m in internal}
    per_batch = 1 if group.by_tile else max(
        math.ceil(m.shape[-2] / P) if m.opcode != "reduce" else 1 for m in members)
    live_peak = max(sum(_tile_bytes(m) * per_batch for m in internal
                        if position[m.index] <= j < last_reader[m.index]) for j in range(len(members)))
    keep = live_peak <= INTERNAL_SBUF_FRACTION * ctx.spec.sbuf_bytes_per_partition
    if keep:
        ctx.force_sbuf.update(m.index for m in internal)
    done_after: dict[int, list[Op]] = {}
    for m in internal:
        done_after.setdefault(last_reader[m.index], []).append(m)
    gens = [_view_steps(ctx, m, group.units) if m.index in views else steps_of(m)(ctx, m) for m in members]
    for _ in range(group.units):
        for j, (op, gen) in enumerate(zip(members, gens)):
            ctx.position = op.index
            ctx.em.current_op = op.index
            for batch_end in gen:
                if group.by_tile or batch_end:
                    break
            if keep:
                for value_op in done_after.get(j, ()):
                    _free_tiles(ctx, value_op)
        ctx.unpin_all()
    for op, gen in zip(members, gens):  # anything left (a member with fewer steps than the group)
        ctx.position = op.index
        ctx.em.current_op = op.index
        for _ in gen:
            pass
    ctx.force_sbuf.difference_update(m.index for m in internal)
    ctx.stats["fusion_groups"] = ctx.stats.get("fusion_groups", 0) + 1
    ctx.stats["fused_ops"] = ctx.stats.get("fused_ops", 0) + len(members)


def _free_tiles(ctx: Context, op: Op) -> None:
    value = ctx.values.get(op.index)
    if value is None:
        return
    for t, buf in enumerate(value.bufs):
        if buf is not None and buf.id not in ctx.pinned:
            ctx.free(buf)
            value.bufs[t] = None


def joins(group: Group | None, op: Op, step: Grain | None, readers: Sequence[Op] = ()) -> bool:
    """Whether ``op`` continues the open group: the same steps, and it reads a member; or it is
    made from broadcasts alone (a one-hot or a mask: an iota compared with per-row values, no
    tile of its own size read) and a reader of it (``readers``) reads a member, so the loop that
    reads it computes it in place (a cross-entropy gradient's ``probs - one_hot``)."""
    if group is None or step is None:
        return False
    units = step.tiles if group.by_tile else step.batches
    if units != group.units:
        return False
    inside = group.indices
    if any(o.index in inside for o in op.operands):
        return True
    return (all(o.opcode == "broadcast" for o in op.operands)
            and any(o.index in inside for r in readers for o in r.operands))


def reads_group(group: Group | None, op: Op) -> bool:
    if group is None:
        return False
    inside = group.indices
    return any(o.index in inside for o in op.operands)


__all__ = ["HOISTABLE", "Grain", "Group", "grain", "joins", "reads_group", "run_group", "stepping_view",
           "units_of"]
