"""The compiler for one NeuronCore: HLO-level graph -> per-engine instruction streams + DMA transfers.

    program = compile(graph, target="trn1")
    program = compile(graph, "trn2", CompilerOptions(auto_cast=AutoCast.MATMULT,
                                                     auto_cast_type=AutoCastType.FP8_E4M3))

Precision options (auto-cast, int8 weight-only quantisation) rewrite the graph first
(``precision.apply_options``); ``program.graph`` is the rewritten graph.

Before lowering anything it checks every op, so a model with several unsupported ops gets one error
listing all of them (op, HLO name, layer, source line), the check users run before migrating.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from neuroncore.compiler import node_semantics as ns
from neuroncore.compiler import orientation
from neuroncore.compiler.cast_folding import fold_casts
from neuroncore.compiler.channel_major import channel_major
from neuroncore.compiler.context import Context
from neuroncore.compiler.emitter import CC_LANE, CC_SEMAPHORE, QUEUE_LANE_BASE, Emitter
from neuroncore.compiler.errors import CompileError, UnsupportedOpsError
from neuroncore.compiler.gc_pause import collector_paused
from neuroncore.compiler.image_groups import image_groups
from neuroncore.compiler.layer_replay import LayerDedup
from neuroncore.compiler.layer_runs import find_runs, with_final_layer
from neuroncore.compiler.lazy_semantics import RelocatedSemantics
from neuroncore.compiler.lower_collective import lower_collective
from neuroncore.compiler.lower_conv import lower_convolution, lower_reduce_window
from neuroncore.compiler.lower_elementwise import (
    lower_binary,
    lower_constant_splat,
    lower_iota,
    lower_select,
    lower_unary,
)
from neuroncore.compiler.lower_layout import (
    lower_gather,
    lower_output_copy,
    lower_parameter,
    lower_view,
    lower_weight,
)
from neuroncore.compiler.lower_matmul import lower_dot
from neuroncore.compiler.lower_random import lower_rng
from neuroncore.compiler.lower_reduce import lower_norm, lower_reduce, lower_softmax
from neuroncore.compiler.lowering_state import HbmTensorKind, QueueName
from neuroncore.compiler.operand_texts import RefTexts, RenderedTexts
from neuroncore.compiler.options import (
    AutoCast,
    AutoCastType,
    CompilerOptions,
    OptionsError,
    Quantization,
)
from neuroncore.compiler.precision import apply_options
from neuroncore.compiler.prefetch import prefetch_order, reorder
from neuroncore.compiler.program import (
    RES_CC,
    RES_DMA,
    Buffer,
    DmaQueue,
    HbmTensor,
    HbmView,
    Program,
    RelocatedBuffers,
)
from neuroncore.compiler.residency import RESIDENT_SBUF_FRACTION, kept_on_chip
from neuroncore.compiler.stream_counts import stream_positions
from neuroncore.compiler.streaming import (
    HOISTABLE,
    Group,
    joins,
    reads_group,
    run_group,
    stepping_view,
    units_of,
)
from neuroncore.compiler.weight_ring import activation_peak_bytes
from neuroncore.hardware import CoreSpec, Engine, core_spec
from neuroncore.ir.graph import BINARY_OPS, LAYOUT_OPS, UNARY_OPS, Graph, Op

__all__ = ["AutoCast", "AutoCastType", "CompileError", "CompilerOptions", "OptionsError", "Program",
           "Quantization", "UnsupportedOpsError", "assemble", "compile", "unsupported_ops"]


def _lower_convert(ctx: Context, op: Op) -> None:
    """A converted weight is folded at compile time: stored in HBM in the new type."""
    src = op.operands[0]
    if src.opcode == "constant" and "init" in src.attrs:
        lower_weight(ctx, op)
    else:
        lower_unary(ctx, op)


def _lower_constant(ctx: Context, op: Op) -> None:
    if "init" in op.attrs:
        users = [ctx.graph.ops[i] for i in ctx.uses[op.index]]
        if users and all(u.opcode == "convert" for u in users) and op.index not in ctx.outputs:
            return  # only read through casts, which store their own copy (see _lower_convert)
        lower_weight(ctx, op)
    else:
        lower_constant_splat(ctx, op)


def _lower_nki_kernel(ctx: Context, op: Op) -> None:
    """An NKI kernel called inside a traced model: its instructions go straight into this program."""
    from neuroncore.nki.embed import lower_call  # the NKI package builds on the compiler

    lower_call(ctx, op)


LOWERINGS: dict[str, Callable[[Context, Op], None]] = {
    "nki_kernel": _lower_nki_kernel,
    "parameter": lower_parameter,
    "constant": _lower_constant,
    "convert": _lower_convert,
    "gelu": lower_unary,
    "silu": lower_unary,
    "gelu_dx": lower_unary,
    "silu_dx": lower_unary,
    "compare": lower_binary,
    "select": lower_select,
    "iota": lower_iota,
    "rng": lower_rng,
    "reduce": lower_reduce,
    "softmax": lower_softmax,
    "layer_norm": lower_norm,
    "rms_norm": lower_norm,
    "dot": lower_dot,
    "convolution": lower_convolution,
    "reduce-window": lower_reduce_window,
    "gather": lower_gather,
    "all-reduce": lower_collective,
    "all-gather": lower_collective,
    "reduce-scatter": lower_collective,
    "collective-permute": lower_collective,
    **{name: lower_unary for name in UNARY_OPS},
    **{name: lower_binary for name in BINARY_OPS},
    **{name: lower_view for name in LAYOUT_OPS},
}

FLOAT_ONLY = {"dot", "convolution", "reduce-window", "softmax", "layer_norm", "rms_norm", "gelu",
              "silu", "gelu_dx", "silu_dx", *UNARY_OPS}


def unsupported_ops(graph: Graph) -> list[Op]:
    """Ops the compiler cannot lower (by opcode), in program order."""
    return [op for op in graph.ops if op.opcode not in LOWERINGS]


def _check_placeable(op: Op) -> None:
    if any(d <= 0 for d in op.shape):
        raise CompileError(f"cannot place a tensor of shape {list(op.shape)}", op)
    if op.opcode in FLOAT_ONLY and not op.dtype.is_float:
        raise CompileError(f"{op.opcode} on {op.dtype.value} cannot be placed: the engines run it "
                           f"on fp32, bf16 or fp16 only", op)
    if op.opcode == "dot" and not all(o.dtype.is_float for o in op.operands):
        raise CompileError("integer matmul cannot be placed on the Tensor engine (int8 weights run "
                           "dequantised: Quantization.INT8_WEIGHT_ONLY)", op)


def compile(graph: Graph, target: str | CoreSpec = "trn1",  # noqa: A001 - domain verb
            options: CompilerOptions | None = None, *, replay_layers: bool = True) -> Program:
    """Compile ``graph`` for one core of ``target`` ("trn1", "inf2", "trn2", an instance type or a
    spec), with precision ``options`` (auto-cast, quantisation; default: the model's own types).

    Repeated layers are lowered once and relocated (``layer_replay``); ``replay_layers=False``
    lowers every layer (the same program, slower: the reference the tests compare against).
    The garbage collector is paused meanwhile (``gc_pause``: it cost a fifth of a compile)."""
    with collector_paused():
        return _compile(graph, target, options, replay_layers=replay_layers)


def _compile(graph: Graph, target: str | CoreSpec, options: CompilerOptions | None, *,
             replay_layers: bool) -> Program:
    spec = core_spec(target)
    if options is not None and not isinstance(options, CompilerOptions):
        raise OptionsError(f"options must be a CompilerOptions, not {type(options).__name__}")
    graph = image_groups(fold_casts(channel_major(apply_options(graph, options))), spec)
    missing = unsupported_ops(graph)
    if missing:
        raise UnsupportedOpsError(missing)
    for op in graph.ops:
        _check_placeable(op)
    ctx = Context(graph, spec)
    runs = find_runs(graph)
    ctx.orientation = orientation.plan(graph, ctx.hbm_home_bytes)
    # residency is planned with the model's last layer in its run where it may join (only its
    # readers after it differ), and on the runs as they are when a joined first layer leaves (a
    # run whose boundaries move values: LayerDedup.boundary), so such programs stay as they were
    planned = [with_final_layer(graph, run, ctx.hbm_home_bytes, ctx.orientation.members) for run in runs]
    ctx.kept_large = kept_on_chip(graph, ctx.hbm_home_bytes,
                                  int(spec.sbuf_bytes_per_partition * RESIDENT_SBUF_FRACTION),
                                  [run.without_first() if run.joined else run for run in planned])
    if ctx.kept_large:
        ctx.stats["kept_large_values"] = len(ctx.kept_large)
    peak = activation_peak_bytes(graph, ctx.hbm_home_bytes, ctx.kept_large)
    ctx.stats["activation_peak_bytes"] = peak
    if peak > ctx.sbuf.stream_lo:  # the activations need the ring's room: no ring (weight_ring)
        ctx.sbuf.end_ring()
    # the last layer joins where residency planned its ops as the run's (with_final_layer
    # requires the same plan: a run whose intersection above dropped nothing of it)
    runs = [with_final_layer(graph, run, ctx.hbm_home_bytes, ctx.kept_large | ctx.orientation.members)
            for run in runs]
    output_indices = {o.index for o in graph.outputs}
    dedup = LayerDedup(ctx, runs, replay=replay_layers)
    group: Group | None = None

    def close(op: Op) -> None:
        ctx.position = op.index
        ctx.em.current_op = op.index
        if op.index in output_indices:
            value = ctx.values[op.index]
            tensor = ctx.hbm_tensors.get(value.hbm or "")
            if tensor is None or tensor.kind is not HbmTensorKind.OUTPUT or value.alias is not None:
                lower_output_copy(ctx, op)
        ctx.finish(op)
        ctx.unpin_all()

    def flush() -> None:
        nonlocal group
        if group is None:
            return
        if len(group.members) > 1:
            run_group(ctx, group)
        else:
            ctx.position = ctx.em.current_op = group.members[0].index
            LOWERINGS[group.members[0].opcode](ctx, group.members[0])
        for done in sorted([*group.members, *group.hoisted], key=lambda o: o.index):
            close(done)
        group = None

    ops = graph.ops
    i = 0
    while i < len(ops):
        if dedup.boundary(i):
            flush()  # a fusion group never spans a layer boundary
        resume = dedup.before(i)
        if resume != i:  # a run of layers was relocated from one lowered layer
            i = resume
            continue
        op = ops[i]
        i += 1
        ctx.position = op.index
        ctx.em.current_op = op.index
        if op.index in ctx.lowered_with:  # e.g. a dequantising scale fused into its matmul
            flush()
            close(op)
            continue
        # fusion groups (compiler.streaming): a chain of ops lowered tile by tile / batch by batch
        units = units_of(ctx, op)
        if joins(group, op, units, [ops[u] for u in ctx.uses[op.index]]):
            assert group is not None
            group.members.append(op)
            continue
        if (stepping_view(group, op, [ops[u] for u in ctx.uses[op.index]]) and op.index not in output_indices
                and op.index not in ctx.orientation.members):
            assert group is not None
            group.members.append(op)  # read tile by tile as the member it aliases
            continue
        if group is not None and op.opcode in HOISTABLE and not reads_group(group, op):
            LOWERINGS[op.opcode](ctx, op)  # reads nothing of the group: lowered while it is open
            group.hoisted.append(op)
            continue
        flush()
        if units is not None:
            group = Group.start(op, units)
            continue
        ctx.position = ctx.em.current_op = op.index  # (flushing lowered earlier ops)
        LOWERINGS[op.opcode](ctx, op)
        close(op)
    flush()
    if dedup.replayed:
        ctx.stats["layers_relocated"] = dedup.replayed
    del dedup  # the templates of relocated runs: lowering state, as the emitter's below
    ctx.em.release_lowering_state()
    if options is not None and options.prefetch_weights:
        if ctx.em.semantic_moves:  # the reordering moves nodes: make the relocated records now
            ctx.em.semantics = list(RelocatedSemantics(ctx.em.semantics, ctx.em.semantic_moves))
            ctx.em.semantic_moves = []
        ctx.em.settle_moves()
        if ctx.em.text_moves:  # and texts
            ctx.em.text = list(RelocatedSemantics(  # the template's texts joined, then renamed
                RenderedTexts(ctx.em.text, RefTexts(ctx.buffers, ctx.spec.psum_bank_bytes_per_partition)),
                ctx.em.text_moves))
            ctx.em.text_moves = []
        _prefetch_weights(ctx)
    return _finalize(ctx)


def _prefetch_weights(ctx: Context) -> None:
    """Issue each layer's weight loads during the layer before it (``compiler.prefetch``)."""
    from neuroncore.runtime.scheduler import schedule  # the runtime builds on the compiler

    emitted = schedule(_finalize(ctx))
    order = prefetch_order(ctx.em, ctx.graph, ctx.queue[QueueName.WEIGHT].index, emitted.start_ns,
                           emitted.end_ns)
    if order is not None:
        new_of = reorder(ctx.em, order)
        ctx.nki_locations = {new_of[node]: where for node, where in ctx.nki_locations.items()}


def _stream_positions(resource: np.ndarray, engine: np.ndarray, queue: np.ndarray) -> np.ndarray:
    """Position of each node within its stream, in program order: its engine's (both Tensor
    tracks are one stream), its DMA queue's or the CC-core's."""
    # 16-bit stream keys (streams are few) sorted stably: a radix sort, the same order; a big
    # prefill's int64 keys and sorted copies were its compile's peak (docs/execution-core.md
    # "Program memory")
    keys = engine.astype(np.int16)
    dma = resource == RES_DMA
    keys[dma] = QUEUE_LANE_BASE + queue[dma]
    keys[resource == RES_CC] = CC_LANE
    del dma
    return stream_positions(keys)


def _scratch_peak(ctx: Context) -> int:
    """Bytes of compiler scratch in HBM that are live at once: a scratch tensor (a spill, a value
    kept in HBM, a relayout) holds its memory from the first node that touches it to the last,
    after which the space is reused, as a compiler's HBM allocator does (fragmentation is not
    modelled). Without reuse a full-size UNet's attention maps alone would exceed a core's HBM."""
    scratch = {name: t.nbytes for name, t in ctx.hbm_tensors.items()
               if t.kind is HbmTensorKind.SCRATCH}
    if not scratch:
        return 0
    first: dict[str, int] = {}
    last: dict[str, int] = {}

    def touch(node: int, names: list[str]) -> None:
        for name in names:
            for source in (ctx.view_sources(name) if name in ctx.hbm_views else [name]):
                if source in scratch:
                    first.setdefault(source, node)
                    last[source] = node

    records = ctx.em.semantics
    # relocated layers keep their template's records: the template's HBM-touching nodes are found
    # once, and only their tensor names are moved. Only the first and last touch of a tensor
    # count, so a template keeps each name's first and last node (in node order: a tensor's first
    # touch is then the earliest of its names', its last the latest)
    templates: dict[int, list[tuple[int, str]]] = {}
    node = 0
    for start, stop, move in sorted(ctx.em.semantic_moves, key=lambda m: m[0]):
        for n in range(node, start):
            names = _hbm_names(records[n])
            if names:
                touch(n, names)
        touching = templates.get(move.source)
        if touching is None:
            ends: dict[str, list[int]] = {}
            for n in range(start, stop):
                for name in _hbm_names(records[n]):
                    ends.setdefault(name, [n - start, n - start])[1] = n - start
            touching = templates[move.source] = sorted(
                {(offset, name) for name, pair in ends.items() for offset in pair})
        for offset, name in touching:
            touch(start + offset, [move.name(name)])
        node = stop
    for n in range(node, len(records)):
        names = _hbm_names(records[n])
        if names:
            touch(n, names)
    events = sorted([(first[n], scratch[n]) for n in first] + [(last[n] + 1, -scratch[n]) for n in first])
    live = peak = 0
    for _, delta in events:
        live += delta
        peak = max(peak, live)
    untouched = sum(size for name, size in scratch.items() if name not in first)
    return peak + untouched


_HBM_TOUCHING = (ns.Load, ns.LoadKTiled, ns.Store, ns.Gather, ns.Collective, ns.KernelCall)


def _hbm_names(sem: Any) -> list[str]:
    """The HBM tensors (or views) a node record reads or writes."""
    if not isinstance(sem, _HBM_TOUCHING):
        return []
    if isinstance(sem, (ns.Load, ns.LoadKTiled)):
        return [sem.src.tensor]
    if isinstance(sem, ns.Store):
        return [sem.dst.tensor]
    if isinstance(sem, ns.Gather):
        return [sem.table.tensor]
    if isinstance(sem, ns.Collective):
        return [sem.src.tensor, sem.dst.tensor]
    assert isinstance(sem, ns.KernelCall)
    return [*sem.inputs, sem.output]


def _finalize(ctx: Context) -> Program:
    graph = ctx.graph
    stats = dict(ctx.stats)
    stats["scratch_peak_bytes"] = _scratch_peak(ctx)
    buffers: Mapping[int, Buffer] = (RelocatedBuffers(ctx.buffers, ctx.relocated_buffers)
                                     if ctx.relocated_buffers else ctx.buffers)
    stats.update(sbuf_peak_bytes_per_partition=ctx.sbuf.peak, n_buffers=len(buffers))
    locations = ctx.nki_locations
    per_node = [locations.get(i) for i in range(ctx.em.n_nodes)] if locations else None
    return assemble(ctx.em, graph, ctx.spec, ctx.queues, buffers=buffers,
                    hbm_tensors=ctx.hbm_tensors, hbm_views=ctx.hbm_views, nki_source_location=per_node,
                    input_tensors=[ctx.values[p.index].hbm or "" for p in graph.parameters],
                    output_tensors=[ctx.tensor_name(o) for o in graph.outputs], stats=stats)


def assemble(em: Emitter, graph: Graph, spec: CoreSpec, queues: list[DmaQueue], *,
             buffers: Mapping[int, Buffer], hbm_tensors: dict[str, HbmTensor],
             input_tensors: list[str], output_tensors: list[str],
             hbm_views: dict[str, HbmView] | None = None, stats: dict[str, Any] | None = None,
             nki_source_location: list[str | None] | None = None) -> Program:
    """A :class:`Program` from an emitter's nodes: semaphores assigned, columns packed. The compiler
    calls it when every op is lowered; ``neuroncore.nki`` when a kernel has run."""
    dep_ptr, dep_idx = em.dep_columns()
    sem_increment, sem_value, texts = em.assign_semaphores(
        queues, (dep_ptr, dep_idx), RefTexts(buffers, spec.psum_bank_bytes_per_partition))
    resource = em.column(em.resource, np.int8)
    engine = em.column(em.engine, np.int8)
    queue = em.column(em.queue, np.int16)
    opcodes = sorted(set(em.opcode))
    opcode_index = {name: i for i, name in enumerate(opcodes)}
    counters = em.counter_columns()
    return Program(
        graph=graph,
        spec=spec,
        resource=resource,
        engine=engine,
        cost_ns=em.column(em.cost_ns, np.float64),
        queue=queue,
        dma_engines=em.column(em.dma_engines, np.int8),
        dep_ptr=dep_ptr,
        dep_idx=dep_idx,
        op_index=np.asarray(em.op_index, np.int32),
        opcode_id=em.column(em.opcode, np.int16, opcode_index),
        pc=_stream_positions(resource, engine, queue),
        counters=counters,
        sem_increment=sem_increment,
        sem_value=sem_value,
        trigger=em.trigger_column(),
        ports=em.column(em.ports, np.int8),
        opcodes=opcodes,
        operands=texts,
        activation_fn=em.coded_column(em.activation_fn),
        tensor_instruction_type=em.coded_column(em.tensor_instruction_type),
        performance_mode=em.coded_column(em.performance_mode),
        semantics=RelocatedSemantics(em.semantics, em.semantic_moves) if em.semantic_moves else em.semantics,
        buffers=buffers,
        hbm_tensors=hbm_tensors,
        hbm_views=hbm_views or {},
        queues=queues,
        semaphore_names={**{int(e): e.label for e in Engine}, CC_SEMAPHORE: "CC",
                         **{q.semaphore: q.name for q in queues}},
        input_tensors=input_tensors,
        output_tensors=output_tensors,
        stats=stats or {},
        nki_source_location=nki_source_location or [],
    )
