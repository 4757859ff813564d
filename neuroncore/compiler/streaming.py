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

Column tiles step as row tiles do (``column_value``): a last-dim reduce's per-row result and
elementwise ops over such results, one ``[rows, 1]`` tile per row tile, with their reshape to
``[..., R, 1]`` and its per-row broadcast read as a column by a select (torch's ``_safe_softmax``).
Members take ``UNROLL`` steps in turn where those tiles fit, so an engine's consecutive
instructions do not read each other's output (docs/execution-core.md, "Fusion").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from neuroncore.compiler.context import Context
from neuroncore.compiler.lower_elementwise import binary_steps, select_steps, unary_steps
from neuroncore.compiler.lower_layout import lower_view
from neuroncore.compiler.lower_matmul import dot_steps, fused_epilogue, fused_scale
from neuroncore.compiler.lower_reduce import reduce_steps, softmax_steps
from neuroncore.compiler.lowering_state import Layout
from neuroncore.compiler.tiling import P, is_packed
from neuroncore.ir.graph import BINARY_OPS, LAYOUT_OPS, UNARY_OPS, Op

ELEMENTWISE = frozenset({"gelu", "silu", "gelu_dx", "silu_dx", "compare", "select", "convert", *UNARY_OPS,
                         *BINARY_OPS})

INTERNAL_SBUF_FRACTION = 0.5  # internal tiles live at once may take this much of SBUF [assumption]
UNROLL = 2  # steps a group's members take in turn: consecutive instructions of one engine independent
BANK_COLUMNS = 512  # FP32 accumulators per partition in one PSUM bank (neuroncore.md §2)

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
    "select": select_steps,
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


def _last_dim_reduce(op: Op) -> bool:
    return (op.opcode == "reduce" and len(op.operands[0].shape) >= 2
            and tuple(op.attrs["dimensions"]) == (len(op.operands[0].shape) - 1,))


def column_value(op: Op) -> bool:
    """Whether ``op``'s value is column tiles (``[rows, 1]``, ``Layout.COL``) that step one per row
    tile of the rows they describe: a last-dim reduce's per-row result, or an elementwise op whose
    full-size operands are all such values (``_safe_softmax``'s check of each row's statistic).
    Iterative, not a recursive closure (tests/neuroncore/test_compile_speed.py)."""
    stack, seen = [op], set()
    while stack:
        cur = stack.pop()
        if cur.index in seen:
            continue
        seen.add(cur.index)
        if _last_dim_reduce(cur):
            continue
        if cur.opcode not in ELEMENTWISE:
            return False
        full = [o for o in cur.operands if o.shape == cur.shape and o.opcode not in ("broadcast", "constant")]
        if not full:
            return False
        stack.extend(full)
    return True


def grain(op: Op) -> Grain | None:
    """How ``op`` steps, or None when it cannot join a group."""
    if op.opcode not in STEPPED and op.opcode != "convert":
        return None
    if op.opcode == "convert" and op.operands[0].opcode == "constant":
        return None  # a cast weight, folded at compile time
    shape = op.shape
    if op.opcode != "reduce" and len(shape) >= 1 and column_value(op):
        if is_packed(shape, Layout.COL):
            return None
        batches = math.prod(shape[:-1])  # (*batch, R) in column tiles of up to 128 rows
        return Grain(batches * math.ceil(shape[-1] / P), batches)
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
    if step is not None and op.opcode not in ("dot", "softmax", "reduce") and not column_value(op):
        # an elementwise op takes the layout of its first full-size operand: row tiles step, and
        # column tiles when every full-size operand is one (``column_value``); a mix would be
        # read whole
        for operand in op.operands:
            if operand.shape != op.shape:
                continue
            value = ctx.values.get(operand.index)
            if operand.opcode == "reduce" or (value is not None and value.layout != Layout.ROW):
                return None
            if value is None and column_value(operand):
                return None  # not lowered yet (a member of the open group): it will be column tiles
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
    """SBUF bytes per partition one step of ``op``'s value takes (a row tile or a column)."""
    if op.opcode == "reduce" or column_value(op):
        return op.dtype.itemsize
    return op.shape[-1] * op.dtype.itemsize


VIEW_MEMBERS = frozenset({"reshape", "broadcast"})
PER_ROW_READERS = frozenset({"select", "compare", *BINARY_OPS})


def stepping_view(group: Group | None, op: Op, readers: Sequence[Op] = ()) -> bool:
    """Whether ``op`` is a view of a member that the group's steps read as they read the member:
    a reshape that keeps each batch's rows and columns (the attention scores ``[B*H, S, S]`` seen
    as ``[B, H, S, S]``: it aliases the member's tiles one for one); a reshape of column tiles to
    ``[..., R, 1]`` (the same ``[rows, 1]`` tiles in row layout); or a broadcast of such a per-row
    member along the last dim whose every reader (``readers``) takes it as a per-partition operand
    (``_safe_softmax``'s select of zeros for rows that are all ``-inf``)."""
    if group is None or op.opcode not in VIEW_MEMBERS or not op.shape:
        return False
    src = op.operands[0]
    if src.index not in group.indices:
        return False
    if op.opcode == "broadcast":
        return (src.shape == (*op.shape[:-1], 1) and tuple(op.attrs["dims"]) == tuple(range(len(op.shape)))
                and bool(readers) and all(r.opcode in PER_ROW_READERS for r in readers))
    if op.shape == (*src.shape, 1) and column_value(src):
        return True
    return (len(op.shape) >= 2 and op.shape[-2:] == src.shape[-2:]
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
    views = {m.index for m in members if m.opcode in VIEW_MEMBERS}
    readers = {m.index: _readers_through_views(ctx.uses, views, m.index) for m in members}
    internal = [m for m in members
                if m.index not in ctx.outputs and ctx.uses[m.index]
                and all(u in position for u in readers[m.index])]
    last_reader = {m.index: max(position[u] for u in readers[m.index]) for m in internal}
    per_batch = 1 if group.by_tile else max(
        math.ceil(m.shape[-2] / P) if m.opcode != "reduce" and not column_value(m) else 1
        for m in members if m.index not in views)
    step_bytes = {m.index: _tile_bytes(m) * per_batch for m in internal if m.index not in views}
    live_peak = max(sum(size for i, size in step_bytes.items() if position[i] <= j < last_reader[i])
                    for j in range(len(members)))
    budget = INTERNAL_SBUF_FRACTION * ctx.spec.sbuf_bytes_per_partition
    # two steps at a time (each member runs two tiles / batches, then the next member) where their
    # tiles fit and a dot's step is at most a PSUM bank wide: no Vector or Scalar instruction then
    # reads the one just before it on its engine, which costs a dependent instruction's fixed
    # pipeline penalty (Context.em._dependent_cost: ~100 Vector cycles, +78 % on a 128-column
    # instruction, +2 % on a 4,096-column one); a wider dot's step holds more operand blocks than the
    # internal tiles counted here (Llama-2-7B's causal attention backward, rows of up to 4,096
    # scores: 100 MB more spilled stepped two at a time)
    free_now = sum(end - start for start, end in ctx.sbuf.free)
    width = UNROLL if (group.units >= UNROLL and UNROLL * live_peak <= min(budget, free_now)
                       and all(m.shape[-1] <= BANK_COLUMNS for m in members if m.opcode == "dot")) else 1
    keep = width * live_peak <= budget
    if keep:
        ctx.force_sbuf.update(m.index for m in internal)
    done_after: dict[int, list[Op]] = {}
    for m in internal:
        done_after.setdefault(last_reader[m.index], []).append(m)
    gens = [_view_steps(ctx, m, group.units) if m.index in views else steps_of(m)(ctx, m) for m in members]
    for _ in range(math.ceil(group.units / width)):
        for j, (op, gen) in enumerate(zip(members, gens)):
            ctx.position = op.index
            ctx.em.current_op = op.index
            for _unit in range(width):
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


__all__ = ["HOISTABLE", "Grain", "Group", "column_value", "grain", "joins", "reads_group", "run_group",
           "stepping_view", "units_of"]
