"""Lower one layer of a run of identical layers and relocate it for the others (modular compile).

A transformer's layers are the same graph up to names (``layer_runs``). Lowering them one by one
costs the same work each time, and neuronx-cc's modular flow compiles such a repeated module once.
Here every layer of a run starts from a canonical boundary (``layer_boundary``: earlier layers'
tiles written back and freed, hazards older than the previous layer aged to it, the allocator
cursor where the run's first layer found it). At each boundary the state is snapshotted in relative
form (``layer_state``); when two successive boundaries are equal, the layer just lowered is the
template: each remaining layer of the run is that layer's instructions, buffers, HBM tensors and
value placements with ids shifted and names rewritten (``layer_names``), and the state moves on to
the end of the run as if they had been lowered. The program is the one full lowering gives (a test
compares every column, string and record of the two), at a fraction of the cost.

``replay=False`` keeps the canonical boundaries and lowers every layer (the reference the tests
compare against): ``neuroncore.compile(..., replay_layers=False)``. ``CompilerOptions`` does not
expose it, since it changes how fast a program is made, not which program.
"""

from __future__ import annotations

import dataclasses
from collections.abc import MutableSequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from neuroncore.compiler.context import Context, Value
from neuroncore.compiler.layer_boundary import (
    age_hazards,
    boundary_traffic,
    evict_resident,
    merge_tombstones,
    worth_canonical_boundaries,
)
from neuroncore.compiler.layer_names import Renamer
from neuroncore.compiler.layer_runs import LayerRun, layer_spans
from neuroncore.compiler.layer_state import Frame, Shift, accounted_for, relocate, snapshot
from neuroncore.compiler.program import HbmAccess, HbmTensor, HbmView, MovedBuffers, Ref, raw_buffer
from neuroncore.compiler.view_steps import ApplyOp
from neuroncore.enums import Memory
from neuroncore.ir.graph import Op

PERIODS = (1, 2, 3, 4)  # a run settles into repeating every layer, or cycling through two to four states

@dataclass
class _Mark:
    """What the lowering had made when it reached a layer boundary (after normalising it)."""

    frame: Frame
    tensors: int
    views: int
    placed: int  # values placed so far (Context._value_order)
    uses: dict[int, list[int]]
    kept_alive: dict[int, frozenset[int]]
    lowered_with: frozenset[int]
    nki: frozenset[int]
    stats: dict[str, Any]
    snapshot: dict[str, Any] | None = None


class LayerDedup:
    """Called before each op is lowered; normalises run boundaries and replays runs it can."""

    def __init__(self, ctx: Context, runs: list[LayerRun], *, replay: bool = True) -> None:
        self.ctx = ctx
        self.replay = replay
        self.events: dict[int, tuple[LayerRun, int]] = {}
        for run in runs:
            self.events[run.layers[-1].stop] = (run, len(run.layers))
        for run in runs:
            for k, layer in enumerate(run.layers):
                self.events[layer.start] = (run, k)
        self.decided: set[int] = set()  # runs whose boundaries were decided (by id)
        self.keep: set[int] = set()  # runs whose boundaries keep resident values in place (by id)
        self.marks: dict[int, _Mark] = {}
        self.cursor = 0
        self.stream_cursor = 0
        self.psum_cursor = 0
        self.replayed = 0
        self._resumed = -1
        # runs whose first boundary moves nothing (a long prompt's: every value in HBM); the
        # layer before each run: where it begins (op) and the nodes emitted when it was reached
        self.quiet: set[int] = set()
        starts = {span.stop: span.start for span in layer_spans(ctx.graph)}
        self.before_run = {id(run): starts[run.layers[0].start] for run in runs
                           if run.layers[0].start in starts}
        self._watch = set(self.before_run.values())
        self._reached: dict[int, int] = {}
        # the model's last layer in a run (``LayerRun.loose``): the values every layer of the run
        # reads from outside it (the rotary tables, the mask and its source) are read again after
        # each layer but that one, so their next use (which tile a spill takes, what a dot's plan
        # counts a spill to cost) and their freeing would differ there. Lowered, the layer sees
        # them read again as by one more layer (``_read_again``), as a module compiled once does;
        # the uses added are taken back at the run's end
        self._final = {run.layers[-1].start: run for run in runs if run.loose}
        self._added: dict[int, dict[int, list[int]]] = {}  # run end -> op index -> uses added

    def boundary(self, index: int) -> bool:
        """Whether op ``index`` begins or ends a layer of a run (every run is lowered from canonical
        boundaries). A run is decided at its first layer: where writing back what is resident is
        cheap (``layer_boundary.worth_canonical_boundaries``) its boundaries evict; where it is not
        (a short prefill's activations on chip) resident values stay where they are, and only the
        cursors and hazards are made canonical."""
        event = self.events.get(index)
        if event is None:
            return False
        run, k = event
        if k == 0 and id(run) not in self.decided:
            self.decided.add(id(run))
            if not worth_canonical_boundaries(self.ctx, run):
                self.keep.add(id(run))
            elif boundary_traffic(self.ctx, run) == 0:
                self.quiet.add(id(run))
            if run.joined and id(run) not in self.quiet:
                # a joined first layer (the model's layer 1) starts a run only behind a boundary
                # that moves nothing: elsewhere the run starts at the next layer, as it did
                self._register(run, run.without_first())
                self.keep.discard(id(run))
                return False
        return True

    def _register(self, run: LayerRun, rest: LayerRun) -> None:
        """Put ``rest`` (``run`` without its joined first layer) in place of ``run``."""
        self.events = {i: e for i, e in self.events.items() if e[0] is not run}
        self.events[rest.layers[-1].stop] = (rest, len(rest.layers))
        for k, layer in enumerate(rest.layers):
            self.events[layer.start] = (rest, k)
        before = rest.layers[0].start - rest.stride  # the joined layer, now the one before the run
        self.before_run[id(rest)] = before
        self._watch.add(before)

    def before(self, index: int) -> int:
        """Handle a boundary at op ``index``; returns the op to lower next (past a replayed run)."""
        added = self._added.pop(index, None)
        if added is not None:  # the end of a run whose last layer was lowered: the true uses
            for i, extra in added.items():
                used = self.ctx.uses[i]
                for u in extra:
                    used.remove(u)
        resume = self._before(index)
        run = self._final.get(resume)
        if resume == index and run is not None and run.layers[-1].stop not in self._added:
            self._added[run.layers[-1].stop] = _read_again(self.ctx, run)  # the last layer is lowered
        return resume

    def _before(self, index: int) -> int:
        if index in self._watch:
            self._reached.setdefault(index, self.ctx.em.n_nodes)
        event = self.events.get(index)
        if event is None or index == self._resumed:
            return index
        run, k = event
        ctx = self.ctx
        ctx.position = index
        if id(run) not in self.keep:
            evict_resident(ctx)
        if k == 0:
            # a boundary that moves nothing: the run's first layer starts as every later one,
            # hazards older than the layer before it aged to that layer (``age_hazards``)
            before = self._reached.get(self.before_run.get(id(run), -1))
            if id(run) in self.quiet and before is not None:
                age_hazards(ctx, before, ctx.em.n_nodes)
            self.marks = {}
            self.cursor = ctx.sbuf.cursor
            self.stream_cursor = ctx.sbuf.stream_cursor
            self.psum_cursor = ctx.psum.cursor
        else:
            previous = self.marks.get(k - 1)
            if previous is not None:
                age_hazards(ctx, previous.frame.node_base, ctx.em.n_nodes)
        if id(run) in self.quiet:
            merge_tombstones(ctx)  # the freed ranges' history made canonical
        ctx.sbuf.cursor = self.cursor
        ctx.sbuf.stream_cursor = max(self.stream_cursor, ctx.sbuf.stream_lo)  # the ring may shrink
        ctx.psum.cursor = self.psum_cursor
        if k == len(run.layers):
            self.marks = {}
            return index
        mark = self._mark(k)
        self.marks[k] = mark
        if k >= 1:
            mark.snapshot = self._snapshot(run, k, mark.frame)
        for period in PERIODS:
            earlier = self.marks.get(k - period)  # none before a relocation's leftover layers
            if (self.replay and k >= period + 1 and earlier is not None and earlier.snapshot == mark.snapshot
                    and self._replayable(run, k, period)):
                return self._replay(run, k, period)
        return index

    # -- records ----------------------------------------------------------------------------
    def _mark(self, k: int) -> _Mark:
        ctx = self.ctx
        previous = self.marks.get(k - 1)
        n, b = ctx.em.n_nodes, ctx._next_buffer
        frame = Frame(previous.frame.node_base if previous else n, n,
                      previous.frame.buf_base if previous else b, b)
        stats = {key: (dict(v) if isinstance(v, dict) else v) for key, v in ctx.stats.items()}
        return _Mark(frame, len(ctx.hbm_tensors), len(ctx.hbm_views), len(ctx._value_order), dict(ctx.uses),
                     {key: frozenset(v) for key, v in ctx.kept_alive.items()},
                     frozenset(ctx.lowered_with), frozenset(ctx.nki_locations), stats)

    def _window(self, run: LayerRun, k: int) -> tuple[dict[int, Any], list[int]]:
        """Tokens of the ops of layers k-1 and k (and their per-layer inputs) at boundary k."""
        tokens: dict[int, Any] = {}
        for tag, layer, ext in (("p", run.layers[k - 1], run.externals[k - 1]),
                                ("c", run.layers[k], run.externals[k])):
            for i in range(layer.start, layer.stop):
                tokens[i] = (tag, i - layer.start)
            for slot, i in enumerate(ext):
                tokens[i] = ("x" + tag, slot)
        return tokens, list(tokens)

    def _snapshot(self, run: LayerRun, k: int, frame: Frame) -> dict[str, Any]:
        tokens, ops = self._window(run, k)

        def token(i: int) -> Any:
            return tokens.get(i, ("g", i))

        return snapshot(self.ctx, frame, token, Renamer(self.ctx.graph, ops))

    def _replayable(self, run: LayerRun, k: int, period: int) -> bool:
        """The template (layers k-period .. k-1) holds nothing relocation cannot move."""
        ctx = self.ctx
        if not accounted_for(ctx) or ctx.pinned:
            return False
        if self.marks[k].frame.node_base == self.marks[k - period].frame.node_base:
            # layers that emitted no instruction (views only, e.g. MobileNetV2's blocks seen as
            # reshapes): nothing to save, and a relocation counts its steps in template lengths
            return False
        for j in range(k - period, k):
            for i in [*range(run.layers[j].start, run.layers[j].stop), *run.externals[j]]:
                value = ctx.values.get(i)
                if value is None:
                    continue
                used_again = bool(ctx.uses[i]) and ctx.uses[i][-1] >= ctx.position
                closures = any(callable(getattr(value, f.name)) for f in dataclasses.fields(value))
                if closures and used_again:
                    return False  # a view not yet prepared that a later op reads: a closure
                if any(b is not None for b in value.bufs) and not (
                        j == k - 1 and i < run.layers[j].stop and self._carried(run, k, period, i)):
                    return False
        before, after = self.marks[k - period].stats, ctx.stats
        for key, v in after.items():
            if key != "dot_plans" and before.get(key) != v and not isinstance(v, (int, float)):
                return False
        identity = ctx._identity
        return identity is None or identity.id < self.marks[k - period].frame.buf_lo

    def _carried(self, run: LayerRun, k: int, period: int, i: int) -> bool:
        """Whether op ``i`` of layer k-1, resident at boundary k (a boundary that keeps values in
        place), is carried the way relocation moves it: the same op a period earlier is held by
        nothing now and its record is this one's (up to relocation) with no tiles, so each
        relocated layer but the last gets that consumed record and the last holds the tiles."""
        ctx = self.ctx
        value = ctx.values[i]
        if (value.alias is not None or value.slices is not None
                or ctx._holding.get(i) != ctx._value_order.get(i)
                or any(b is not None and b.id < self.marks[k].frame.buf_lo for b in value.bufs)):
            return False
        offset = run.layers[k - 1].start - run.layers[k - 1 - period].start
        before = ctx.values.get(i - offset)
        if before is None or i - offset in ctx._holding or any(b is not None for b in before.bufs):
            return False
        ops = [x for j in range(k - 1 - period, k)
               for x in [*range(run.layers[j].start, run.layers[j].stop), *run.externals[j]]]
        mapping: dict[int, int] = {}
        for j in range(k - 1 - period, k - 1):
            mapping.update(run.op_map(j, j + period))
        moved = _move_value(before, Shift(0, 0, 0, 0, mapping, Renamer(ctx.graph, ops)), ctx.graph.ops)
        return all(f.name == "bufs" or (not callable(getattr(value, f.name))
                                        and getattr(moved, f.name) == getattr(value, f.name))
                   for f in dataclasses.fields(value))

    def _loose_in_hbm(self, run: LayerRun, k: int, period: int) -> bool:
        """Whether the template's values at the offsets where the run's last layer is read
        elsewhere (``LayerRun.loose``) live in HBM, as ``layer_runs.with_final_layer`` requires."""
        for j in range(k - period, k):
            for offset in run.loose:
                value = self.ctx.values.get(run.layers[j].start + offset)
                if value is None or value.home is not Memory.HBM or value.alias is not None:
                    return False
        return True

    # -- replay -----------------------------------------------------------------------------
    def _replay(self, run: LayerRun, k: int, period: int) -> int:
        """Relocate layers k-period .. k-1 over the rest of the run, as many whole periods as fit;
        returns the op to go on from (the run's end, or the one layer left over)."""
        ctx = self.ctx
        start, end = self.marks[k - period], self.marks[k]
        dn = end.frame.node_base - start.frame.node_base
        db = end.frame.buf_base - start.frame.buf_base
        ops = [i for j in range(k - period - 1, k)
               for i in [*range(run.layers[j].start, run.layers[j].stop), *run.externals[j]]]
        renamer = Renamer(ctx.graph, ops)
        template = _Template(ctx, start, end, run, range(k - period, k), renamer)

        def op_map(first: int, shift: int) -> dict[int, int]:
            mapping: dict[int, int] = {}
            for j in range(first, k):
                mapping.update(run.op_map(j, j + shift))
            return mapping

        blocks = (len(run.layers) - k) // period
        if run.loose and not self._loose_in_hbm(run, k, period):
            blocks = (len(run.layers) - 1 - k) // period  # the last layer is lowered
        for b in range(1, blocks + 1):
            template.emit(Shift(start.frame.node_lo, b * dn, start.frame.buf_lo, b * db,
                                op_map(k - period - 1, b * period), renamer), last=b == blocks)
        if blocks:
            for value in template.values:  # the next layer consumed what the template left resident
                if any(b is not None for b in value.bufs):
                    value.bufs[:] = [None] * len(value.bufs)
                    ctx._holding.pop(value.op.index, None)
        relocate(ctx, Shift(end.frame.node_lo, blocks * dn, end.frame.buf_lo, blocks * db,
                            op_map(k - 1, blocks * period), renamer))
        self.replayed += blocks * period
        resume = k + blocks * period
        # the boundary there was relocated with the template; the next one ages hazards against
        # it, and nothing more of this run is relocated
        here = ctx.em.n_nodes
        self.marks = {resume: _Mark(Frame(here, here, 0, 0), 0, 0, 0, {}, {}, frozenset(), frozenset(), {})}
        self._resumed = run.layers[resume].start if resume < len(run.layers) else run.layers[-1].stop
        return self._resumed


class _Template:
    """Layers k-period .. k-1 as lowered: nodes, buffers, tensors, views, values and bookkeeping."""

    def __init__(self, ctx: Context, start: _Mark, end: _Mark, run: LayerRun, layers: range,
                 renamer: Renamer) -> None:
        self.ctx = ctx
        em = ctx.em
        self.renamer = renamer
        nb0, nb1 = start.frame.node_base, end.frame.node_base
        self.nodes = slice(nb0, nb1)
        self.nodes_step = nb1 - nb0  # a shift of k template lengths moves nodes by k * this
        self.buffers = [ctx.buffers[b] for b in range(start.frame.buf_base, end.frame.buf_base)]
        self.tensors = list(ctx.hbm_tensors.values())[start.tensors:end.tensors]
        self.views = list(ctx.hbm_views.values())[start.views:end.views]
        value_ops = [i for j in layers
                     for i in [*range(run.layers[j].start, run.layers[j].stop), *run.externals[j]]]
        self.values = [ctx.values[i] for i in value_ops if i in ctx.values]
        self.placed = list(ctx._value_order.items())[start.placed:end.placed]
        self.placed_step = end.placed - start.placed
        self.uses = {i: sorted(set(lst) - set(start.uses.get(i, ())))
                     for i, lst in ctx.uses.items() if start.uses.get(i) is not lst}
        self.kept_alive = {i: v - start.kept_alive.get(i, frozenset()) for i, v in ctx.kept_alive.items()
                           if frozenset(v) != start.kept_alive.get(i)}
        self.lowered_with = {i: v for i, v in ctx.lowered_with.items() if i not in start.lowered_with}
        self.nki = {i: v for i, v in ctx.nki_locations.items() if i not in start.nki}
        self.stats = {key: v - start.stats.get(key, 0) for key, v in ctx.stats.items()
                      if isinstance(v, (int, float)) and not isinstance(v, bool)}
        plans = ctx.stats.get("dot_plans", {})
        self.plans = {name: plans[name] for name in plans if name not in start.stats.get("dot_plans", {})}
        self.op_index = np.asarray(em.op_index[nb0:nb1], np.int64)  # -1: no op (kept as is)
        self.op_limit = len(ctx.graph.ops) + 1
        after_ls = em._mm_after_ls
        self.after_ls = [(n, after_ls[n]) for n in range(start.frame.node_lo, nb1)
                         if n in after_ls and after_ls[n] >= nb0]
        self.ls_nodes = np.asarray([n for n, _ in self.after_ls], np.int64)
        self.ls_targets = np.asarray([m for _, m in self.after_ls], np.int64)
        # each buffer's fields (copied and given a new id and name), the distinct names, PSUM ids
        self.buffer_fields = [(buf.id, buf.memory, buf.partitions, buf.free, buf.dtype, buf.address, buf.name)
                              for buf in self.buffers]
        self.buffer_names = list(dict.fromkeys(buf.name for buf in self.buffers))
        self.psum_buffers = [buf.id for buf in self.buffers if buf.memory is Memory.PSUM]

    def emit(self, shift: Shift, *, last: bool = False) -> None:
        """Append the template relocated by ``shift`` to the program being built; the ``last``
        relocation keeps resident what the template left resident (at a boundary that keeps values
        in place), the others hold nothing (the next layer consumed it: ``_carried``)."""
        ctx, em = self.ctx, self.ctx.em
        nodes = self.nodes
        lo, dn = shift.node_lo, shift.dn
        op_map = shift.op_map
        columns: tuple[MutableSequence[Any], ...] = (
            em.resource, em.engine, em.cost_ns, em.queue, em.dma_engines, em.opcode, em.activation_fn,
            em.tensor_instruction_type, em.performance_mode, em.ports, em._lane, em.counters)
        for column in columns:
            column.extend(column[nodes])
        # dependencies and triggers: the template's, moved in bulk when the program is assembled
        first = len(em.deps)
        em.deps.extend(em.deps[nodes])
        em.trigger.extend(em.trigger[nodes])
        em.dep_moves.append((first, len(em.deps), lo, dn, nodes.start))
        table = np.arange(self.op_limit)
        table[list(op_map)] = list(op_map.values())
        table[-1] = -1  # a node of no op
        em.op_index.frombytes(table[self.op_index].astype(np.intc).tobytes())  # array("i")
        base = len(em.text)
        em.text.extend(em.text[nodes])  # the template's: renamed when first read (operand_texts)
        # renamed when first read (a text that names nothing of the layer renders as itself):
        # timing-only runs never read them, so not even the search for names is done up front
        em.text_moves.append((base, len(em.text), _TextRelocator(self.renamer, shift).move))
        start = len(em.semantics)
        em.semantics.extend(em.semantics[nodes])
        em.semantic_moves.append((start, len(em.semantics), _SemanticsRelocator(shift, nodes.start)))
        if last:  # only the last relocation's nodes can be waited for again (see below)
            moved_ls = np.where(self.ls_nodes >= lo, self.ls_nodes + dn, self.ls_nodes)
            em._mm_after_ls.update(zip(moved_ls.tolist(), (self.ls_targets + dn).tolist()))
        buffers = ctx.buffers
        db = shift.db
        if last:
            # what lowers after the run may read these records (the values it leaves resident):
            # made now; a layer's buffers share a few names (every block of a dot's), each renamed
            # once
            names = {name: shift.name(name) for name in self.buffer_names}
            for buf_id, memory, partitions, free, dtype, address, name in self.buffer_fields:
                # the template's record with its id and name moved: a copy of its fields (it was
                # checked when made; Buffer's constructor and __post_init__ are most of the cost)
                moved_id = buf_id + db  # one int object for the key and the record
                buffers[moved_id] = raw_buffer(moved_id, memory, partitions, free, dtype, address,
                                               names[name])
        elif self.buffer_fields:
            # freed before the run ends, never read by the lowering: the program's buffer table
            # makes these records when read (``RelocatedBuffers``), timing-only runs never do
            ctx.relocated_buffers.append(MovedBuffers(self.buffer_fields, db, shift.name))
        if last:
            # what lowers after the run sees only the last relocation's nodes and buffers: the
            # state moves to its end (``relocate``), and every earlier one's buffers are freed and
            # its nodes aged out of the hazards; their alias and PSUM entries are never read
            em.psum_keys.update(("buf", buf_id + db) for buf_id in self.psum_buffers)
        for tensor in self.tensors:
            name = shift.name(tensor.name)
            ctx.hbm_tensors.setdefault(name, HbmTensor(name, tensor.shape, tensor.dtype, tensor.kind,
                                                       shift.op(tensor.op_index), tensor.pretransposed))
        for view in self.views:
            name = shift.name(view.name)
            steps = tuple(ApplyOp(shift.op(s.op_index)) if isinstance(s, ApplyOp) else s for s in view.steps)
            ctx.hbm_views.setdefault(name, HbmView(name, steps, tuple(shift.name(s) for s in view.sources),
                                                   view.shape, view.dtype, view.run_elements))
        moved_by = shift.dn // self.nodes_step
        for i, order in self.placed:
            ctx._value_order.setdefault(shift.op(i), order + moved_by * self.placed_step)
        for value in self.values:
            placed = _move_value(value, shift, ctx.graph.ops)
            ctx.values[placed.op.index] = placed
            if last and any(b is not None for b in value.bufs):
                placed.bufs = [None if b is None else buffers[b.id + db] for b in value.bufs]
                ctx._holding[placed.op.index] = ctx._value_order[placed.op.index]
        for i, added in self.uses.items():
            target = shift.op(i)
            ctx.uses[target] = sorted(set(ctx.uses[target]) | {shift.op(u) for u in added})
        for i, sources in self.kept_alive.items():
            ctx.kept_alive.setdefault(shift.op(i), set()).update(shift.op(x) for x in sources)
        for i, v in self.lowered_with.items():
            ctx.lowered_with[shift.op(i)] = shift.op(v)
        for n, location in self.nki.items():
            ctx.nki_locations[shift.node(n)] = location
        for key, delta in self.stats.items():
            ctx.stats[key] += delta
        if self.plans:
            plans = ctx.stats.setdefault("dot_plans", {})
            for name, plan in self.plans.items():
                plans[shift.name(name)] = plan


def _read_again(ctx: Context, run: LayerRun) -> dict[int, list[int]]:
    """Before the run's last layer is lowered: each value from outside the run (not a per-layer
    input) whose last use is in that layer gets its readers there again, one layer further on, as
    every earlier layer of the run sees the next one read it. Returns the uses added."""
    final, first = run.layers[-1], run.layers[0]
    own = set(run.externals[-1])
    added: dict[int, list[int]] = {}
    for i, used in ctx.uses.items():
        if (used and final.start <= used[-1] < final.stop and not first.start <= i < final.stop
                and i not in own):
            extra = [u + final.size for u in used if u >= final.start]
            used.extend(extra)  # after every use: the list stays sorted
            added[i] = extra
    return added


def _move_value(value: Value, shift: Shift, ops: list[Op]) -> Value:
    """A template value's placement for the same op of another layer: ops mapped, names renamed,
    no tile resident (the caller places the last layer's carried tiles), closures dropped (only
    dead values keep one)."""
    moved: dict[str, Any] = {}
    for f in dataclasses.fields(value):
        v = getattr(value, f.name)
        if isinstance(v, Op):
            v = ops[shift.op(v.index)]
        elif f.name == "bufs":
            v = [None] * len(v)
        elif isinstance(v, str):
            v = shift.name(v)
        elif callable(v):
            v = None
        elif isinstance(v, list):
            v = list(v)
        moved[f.name] = v
    return Value(**moved)


class _TextRelocator:
    """A template node's operand text as the relocated node's (names and block ids moved)."""

    def __init__(self, renamer: Renamer, shift: Shift) -> None:
        self.renamer = renamer
        self.shift = shift

    def move(self, text: str) -> str:
        return self.renamer.render(text, self.shift.op, self.shift.node)


class _SemanticsRelocator:
    """Node records with their buffer ids, HBM tensor names and op indices relocated."""

    def __init__(self, shift: Shift, source: int) -> None:
        self.shift = shift
        self.source = source  # the template's first node (relocations of one template share it)
        self.names: dict[str, str] = {}
        self.fields: dict[type, tuple[str, ...]] = {}

    def name(self, text: str) -> str:
        moved = self.names.get(text)
        if moved is None:
            moved = self.names[text] = self.shift.name(text)
        return moved

    def __call__(self, value: Any) -> Any:
        return self.move(value)

    def move(self, value: Any) -> Any:
        cls = type(value)
        if cls is Ref:
            return Ref(self.shift.buf(value.buf), value.p0, value.p1, value.f0, value.f1)
        if cls is HbmAccess:
            return HbmAccess(self.name(value.tensor), value.batch, value.r0, value.r1, value.c0, value.c1,
                             value.layout, None if value.view is None else self.name(value.view))
        if cls is tuple:
            return tuple(self.move(v) for v in value)
        if cls is str and self.shift.renamer.split(value) is not None:
            return self.name(value)
        if not dataclasses.is_dataclass(value) or isinstance(value, type):
            return value
        names = self.fields.get(cls)
        if names is None:
            names = self.fields[cls] = tuple(f.name for f in dataclasses.fields(value))
        if not names:
            return value
        moved = {f: (self.shift.op(getattr(value, f)) if f == "op_index" else self.move(getattr(value, f)))
                 for f in names}
        return cls(**moved)


__all__ = ["LayerDedup"]
