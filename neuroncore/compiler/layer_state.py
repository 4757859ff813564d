"""The lowering state at a layer boundary: a canonical form to compare, and a relocation to apply.

At the boundary before layer i of a run, every id the state holds is either *global* (made before
the previous layer: the identity matrix, the prologue's nodes) or *relative* (made since the previous
layer began: its nodes, buffers, ops and the names derived from them). :func:`snapshot` writes the
state with relative ids counted from the boundary, so two boundaries whose snapshots are equal are
the same state up to relocation by one layer: lowering is deterministic and never looks at an id's
value, so the next layer lowers to the previous layer's instructions, relocated.
:func:`relocate` moves the state forward by ``d`` layers, as if they had been lowered.

What the state is: the SBUF and PSUM allocators (free ranges, tombstones, cursors), the emitter's
recorded accesses, last writes and pending LoadStationary nodes, the value placements, the op uses
the lowering extends, the queues, pinned buffers and the identity matrix. ``KNOWN_CONTEXT`` and
``KNOWN_EMITTER`` list the attributes accounted for: an attribute outside them (a lowering that keeps
new state) turns relocation off rather than risking a wrong program.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from neuroncore.compiler.context import Context
from neuroncore.compiler.layer_names import Renamer
from neuroncore.compiler.program import Buffer
from neuroncore.ir.graph import Op

KNOWN_CONTEXT = frozenset({
    "graph", "spec", "em", "sbuf", "psum", "buffers", "hbm_tensors", "hbm_views", "values", "queues",
    "queue", "pinned", "uses", "outputs", "hbm_home_bytes", "position", "stats", "_next_buffer",
    "_identity", "kept_alive", "nki_locations", "lowered_with", "_value_order", "_holding",
    "force_sbuf",  # empty at every boundary: a fusion group never spans one (compiler.streaming)
    "orientation",  # fixed for the compilation, planned from the graph alone (compiler.orientation)
    "kept_large",  # fixed for the compilation, alike in every layer of a run (compiler.residency)
    "_text_of",  # a cache of each buffer's text prefix, from ``buffers`` alone (Context.ref_text)
    "unbuffer",  # None at every boundary: set only while a dot lowers a batch (lower_matmul._blocks)
    "relocated_buffers",  # relocated layers' buffer records, never read by the lowering (layer_replay)
})
KNOWN_EMITTER = frozenset({
    "spec", "_last_writes", "psum_keys", "ports", "resource", "engine", "cost_ns", "queue", "dma_engines",
    "deps", "op_index", "opcode", "text", "activation_fn", "tensor_instruction_type", "performance_mode",
    "semantics", "semantic_moves", "text_moves", "dep_moves", "trigger", "counters", "current_op",
    "_accesses", "_lane", "_mm_after_ls", "_pending_ls",
})


def live_key(ctx: Context, key: tuple[str, Any]) -> bool:
    """Whether a recorded access list can still matter: an on-chip buffer (allocated), or an HBM
    tensor whose value is used again (the lowering keeps alias and view sources in their readers'
    uses). A tensor nobody reads or writes again never orders anything again."""
    if key[0] != "hbm":
        return True
    tensor = ctx.hbm_tensors.get(key[1])
    if tensor is None:
        return True
    uses = ctx.uses[tensor.op_index]
    return bool(uses) and uses[-1] >= ctx.position


def accounted_for(ctx: Context) -> bool:
    """Whether every attribute of the context and its emitter is one this module relocates."""
    return set(vars(ctx)) <= KNOWN_CONTEXT and set(vars(ctx.em)) <= KNOWN_EMITTER


@dataclass(frozen=True)
class Frame:
    """Where the ids of one boundary begin: ids from ``*_lo`` on are relative to ``*_base``."""

    node_lo: int  # first node of the previous layer
    node_base: int  # nodes emitted so far
    buf_lo: int
    buf_base: int


def snapshot(ctx: Context, frame: Frame, op_token: Callable[[int], Any], renamer: Renamer) -> dict[str, Any]:
    """The state at a boundary with relative ids made relative (see the module docstring)."""
    em = ctx.em
    after_ls = em._mm_after_ls

    def node(n: int) -> Any:
        alias = after_ls.get(n)
        own = (1, n - frame.node_base) if n >= frame.node_lo else (0, n)
        return own if alias is None else (own, node(alias))

    def nodes(ns: list[int]) -> tuple[Any, ...]:
        return tuple(node(n) for n in ns)

    def buf(b: int) -> Any:
        return (1, b - frame.buf_base) if b >= frame.buf_lo else (0, b)

    def key(k: tuple[str, Any]) -> Any:
        return ("buf", buf(k[1])) if k[0] == "buf" else ("hbm", renamer.canonical(k[1], op_token))

    def name(s: str | None) -> Any:
        return None if s is None else renamer.canonical(s, op_token)

    lo = frame.node_lo
    accesses = {key(k): tuple((*a[:4], node(a[4]), *a[5:]) for a in lst)
                for k, lst in em._accesses.items() if any(a[4] >= lo for a in lst) and live_key(ctx, k)}
    values = {}
    for index, value in ctx.values.items():
        token = op_token(index)
        if token[0] == "g" and all(b is None for b in value.bufs):
            continue
        values[token] = tuple(_canonical_field(getattr(value, f.name), op_token, buf, name)
                              for f in dataclasses.fields(value))
    uses = {}
    for index, used in ctx.uses.items():
        token = op_token(index)
        if token[0] != "g":
            inside = tuple(op_token(u) for u in used if op_token(u)[0] != "g")
            uses[token] = (inside, any(u > ctx.position and op_token(u)[0] == "g" for u in used))
    return {
        "sbuf": (tuple(ctx.sbuf.free), ctx.sbuf.cursor, ctx.sbuf.stream_cursor, ctx.sbuf.stream_lo,
                 ctx.sbuf.in_use,
                 tuple((t.start, t.end, nodes(t.nodes)) for t in ctx.sbuf.tombstones)),
        "psum": (tuple(ctx.psum.busy), ctx.psum.cursor, tuple(nodes(h) for h in ctx.psum.hazards)),
        "accesses": accesses,
        "last_writes": {lane: tuple((key(k), r) for k, r in w) for lane, w in em._last_writes.items()},
        "pending_ls": nodes(em._pending_ls),
        "values": values,
        "uses": uses,
        "kept_alive": {op_token(k): frozenset(op_token(s) for s in v)
                       for k, v in ctx.kept_alive.items() if op_token(k)[0] != "g"},
        "lowered_with": {op_token(k): op_token(v) for k, v in ctx.lowered_with.items()
                         if op_token(k)[0] != "g"},
        "queues": tuple(q.name for q in ctx.queues),
        "pinned": tuple(sorted(buf(b) for b in ctx.pinned)),
        "identity": None if ctx._identity is None else buf(ctx._identity.id),
        # the order values were first placed in (spill ties) and the values holding tiles now
        "value_order": tuple(op_token(i) for i in sorted(ctx._value_order, key=ctx._value_order.__getitem__)
                             if op_token(i)[0] != "g"),
        "holding": sorted(op_token(i) for i in ctx._holding
                          if any(b is not None for b in ctx.values[i].bufs)),
    }


def _canonical_field(v: Any, op_token: Callable[[int], Any], buf: Callable[[int], Any],
                     name: Callable[[str | None], Any]) -> Any:
    """One field of a Value with its ops, buffers and names made relative; a closure (a view not
    yet prepared) only as present or not."""
    if isinstance(v, Op):
        return op_token(v.index)
    if isinstance(v, Buffer):
        return buf(v.id)
    if isinstance(v, str):
        return name(v)
    if callable(v):
        return "callable"
    if isinstance(v, list):
        return tuple(_canonical_field(x, op_token, buf, name) for x in v)
    return v


@dataclass(frozen=True)
class Shift:
    """Relocation by some layers: relative nodes/buffers move by ``dn``/``db``, ops by ``op_map``."""

    node_lo: int
    dn: int
    buf_lo: int
    db: int
    op_map: dict[int, int]
    renamer: Renamer

    def node(self, n: int) -> int:
        return n + self.dn if n >= self.node_lo else n

    def buf(self, b: int) -> int:
        return b + self.db if b >= self.buf_lo else b

    def op(self, index: int) -> int:
        return self.op_map.get(index, index)

    def name(self, text: str) -> str:
        return self.renamer.render(text, self.op, self.node)

    def key(self, k: tuple[str, Any]) -> tuple[str, Any]:
        return ("buf", self.buf(k[1])) if k[0] == "buf" else ("hbm", self.name(k[1]))


def relocate(ctx: Context, shift: Shift) -> None:
    """Move the boundary state forward (values, uses and the emitted nodes are ``layer_replay``'s)."""
    em = ctx.em
    node = shift.node
    lo = shift.node_lo
    moved = {}
    for k, lst in em._accesses.items():
        if any(a[4] >= lo for a in lst) and live_key(ctx, k):
            moved[shift.key(k)] = [(*a[:4], node(a[4]), *a[5:]) for a in lst]
    em._accesses.update(moved)
    em._last_writes = {lane: [(shift.key(k), r) for k, r in w] for lane, w in em._last_writes.items()}
    em._pending_ls = [node(n) for n in em._pending_ls]
    for tomb in ctx.sbuf.tombstones:
        tomb.nodes = [node(n) for n in tomb.nodes]
    ctx.psum.hazards = [[node(n) for n in h] for h in ctx.psum.hazards]
    ctx._next_buffer += shift.db


__all__ = ["KNOWN_CONTEXT", "KNOWN_EMITTER", "Frame", "Shift", "accounted_for", "live_key", "relocate",
           "snapshot"]
