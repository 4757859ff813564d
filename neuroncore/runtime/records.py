"""Turn one execution's timeline into event-sink batches (only when someone listens)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from fractions import Fraction

import numpy as np

from neuroncore.collectives.record import CollectiveRecord
from neuroncore.compiler.program import RES_DMA, Program
from neuroncore.enums import ENGINE_NAMES, TRACK_LABELS
from neuroncore.events import BATCH_ROWS, EventSink
from neuroncore.record_kinds import (
    RECORD_KINDS,
    CcOpMeta,
    DmaPacketMeta,
    HbmUsageMeta,
    InstructionMeta,
    NeuronLinkUsageMeta,
    ProgramLoadedMeta,
    QueueInfo,
    RecordKind,
    SemaphoreUpdateMeta,
    ThrottleMeta,
)
from neuroncore.runtime.scheduler import RecordLayout, Timeline

# runtime opcode -> what the compiler emitted (profile-schema §2.8: pseudo-instructions are expanded)
COMPILER_OPCODES = {"WRITE": "PSEUDO_DMA_TRIGGER"}


def _chunks(n: int) -> Iterator[slice]:
    for s in range(0, n, BATCH_ROWS):
        yield slice(s, min(n, s + BATCH_ROWS))


def _queues(program: Program) -> list[QueueInfo]:
    return [QueueInfo(q.index, q.name, q.queue_type) for q in program.queues]


def emit_program(sink: EventSink, program: Program, model_id: int, core: int, *, device: int,
                 instance_type: str | None, rank: int) -> None:
    """A loaded program's ops and static facts, and the core's place (device, instance type,
    tensor-parallel rank)."""
    graph = program.graph
    ops = graph.ops
    sink.emit(
        RecordKind.PROGRAM_LOADED,
        {
            "op_index": np.arange(len(ops), dtype=np.int32),
            "hlo_name": [op.name for op in ops],
            "opcode": [op.opcode for op in ops],
            "layer": [op.layer for op in ops],
            "shape": [list(op.shape) for op in ops],
            "dtype": [op.dtype.value for op in ops],
            "frames": [[(f.file, f.line, f.function) for f in op.frames] for op in ops],
        },
        ProgramLoadedMeta(
            model_id=model_id, core=core, model_name=graph.name, spec=program.spec, device=device,
            instance_type=instance_type, rank=rank,
            n_instructions=program.n_instructions, n_dma_transfers=program.n_dma_transfers,
            queues=_queues(program), semaphore_names=dict(program.semaphore_names),
            operands=program.operands, opcodes=program.opcodes,
            compiler_opcodes={name: COMPILER_OPCODES.get(name, name) for name in program.opcodes},
            hbm_bytes_by_kind=program.hbm_bytes_by_kind(),
            # per node: what the engine ran it as, and the dependency graph (CSR over node ids;
            # resource codes are neuroncore.enums.Resource) for the profile's Flow edges
            activation_fn=program.activation_fn, tensor_instruction_type=program.tensor_instruction_type,
            performance_mode=program.performance_mode,
            nki_source_location=program.nki_source_location, dep_ptr=program.dep_ptr,
            dep_idx=program.dep_idx.astype(np.int64),  # stored int32: the record's schema is int64
            resource=program.resource),
    )


def _static_columns(program: Program, layout: RecordLayout) -> dict[str, dict[str, np.ndarray]]:
    """Columns that are the same for every execution of a program, built once and cached."""
    cached = program.derived.static_columns
    if cached is not None:
        return cached
    idx = layout.instr_nodes
    track = program.resource[idx].astype(np.int8)
    instruction = {
        "id": idx,
        "engine": program.engine[idx],
        "track": track,
        "opcode": program.opcode_id[idx],
        "pc": program.pc[idx],
        "op_index": program.op_index[idx],
        **{name: getattr(program, name)[idx].astype(np.int64) for name in (  # int32 when they fit
            "raw_flops", "adjusted_flops", "transpose_flops", "hbm_read_bytes", "hbm_write_bytes",
            "sbuf_read_bytes", "sbuf_write_bytes", "psum_read_bytes", "psum_write_bytes",
            "spill_save_bytes", "spill_reload_bytes")},
    }
    nodes = layout.packet_node
    packet = {
        "transfer_id": nodes,
        "trigger_id": program.trigger[nodes],
        "queue_idx": program.queue[nodes],
        "transfer_bytes": _packet_bytes(program, nodes),
        "hbm_read": program.hbm_read_bytes[nodes] > 0,
        "hbm_write": program.hbm_write_bytes[nodes] > 0,
        "op_index": program.op_index[nodes],
    }
    producers = layout.producers
    semaphore = {
        "semaphore": program.sem_increment[producers],
        "value": program.sem_value[producers],
        "node": producers,
        "is_dma": program.resource[producers] == RES_DMA,
        "source_engine": program.engine[producers],
    }
    cached = {"instruction": instruction, "packet": packet, "semaphore": semaphore}
    program.derived.static_columns = cached
    return cached


def _packet_bytes(program: Program, nodes: np.ndarray) -> np.ndarray:
    """Each packet's share of its transfer's bytes; the first packets carry the remainder."""
    if nodes.size == 0:
        return np.zeros(0, np.int64)
    starts = np.flatnonzero(np.r_[True, nodes[1:] != nodes[:-1]])  # a transfer's packets are adjacent
    rank = np.arange(nodes.size) - np.repeat(starts, np.diff(np.r_[starts, nodes.size]))
    total = program.dma_bytes[nodes]
    engines = np.maximum(program.dma_engines[nodes].astype(np.int64), 1)
    shares: np.ndarray = total // engines + (rank < total % engines)
    return shares


def _sliced(columns: dict[str, np.ndarray], part: slice) -> dict[str, np.ndarray]:
    return {name: column[part] for name, column in columns.items()}


def emit_execution(sink: EventSink, program: Program, timeline: Timeline, *, execution_id: int,
                   model_id: int, core: int) -> None:
    """Hand one execution's records to the sink: array views, no per-record Python work."""
    ids = {"execution_id": execution_id, "model_id": model_id, "core": core}
    layout = timeline.layout
    static = _static_columns(program, layout)
    for part in _chunks(layout.instr_nodes.size):
        start, end = timeline.i_start[part], timeline.i_end[part]
        sink.emit(
            RecordKind.INSTRUCTION,
            {
                **_sliced(static["instruction"], part),
                "start_ts": start,
                "end_ts": end,
                "duration_ns": end - start,
                "evt_wait_time_ns": timeline.i_wait[part],
                "dma_trigger_start_ts": timeline.i_dma_start[part],
                "dma_trigger_end_ts": timeline.i_dma_end[part],
            },
            InstructionMeta(engine_labels=ENGINE_NAMES, track_labels=TRACK_LABELS, opcodes=program.opcodes,
                            **ids),
        )
    queues = _queues(program)
    for part in _chunks(layout.packet_node.size):
        start, end = timeline.packet_start_ns[part], timeline.packet_end_ns[part]
        sink.emit(
            RecordKind.DMA_PACKET,
            {
                **_sliced(static["packet"], part),
                "start_ts": start,
                "end_ts": end,
                "duration_ns": end - start,
                "engine_idx": timeline.packet_engine[part],
            },
            DmaPacketMeta(queues=queues, **ids),
        )
    for part in _chunks(layout.producers.size):
        sink.emit(
            RecordKind.SEMAPHORE_UPDATE,
            {**_sliced(static["semaphore"], part), "timestamp": timeline.sem_ts[part]},
            SemaphoreUpdateMeta(semaphore_names=program.semaphore_names, **ids),
        )
    times, throughput, cumulative = hbm_samples(program, timeline)
    sink.emit(RecordKind.HBM_USAGE, {"timestamp": times, "current_throughput": throughput,
                                     "total_transfer_bytes": cumulative}, HbmUsageMeta(**ids))
    if timeline.throttle_start_ns.size:
        emit_throttle(sink, program, timeline, ids)


def emit_throttle(sink: EventSink, program: Program, timeline: Timeline, ids: dict[str, int]) -> None:
    """One ``throttle`` row per power-throttling period of the execution (NC-v3)."""
    k, n = throttle_level(program.spec.throttle_rate)
    rows = timeline.throttle_start_ns.size
    sink.emit(RecordKind.THROTTLE, {
        "timestamp": timeline.throttle_start_ns,
        "duration_ns": timeline.throttle_end_ns - timeline.throttle_start_ns,
        "k": np.full(rows, k, np.int32), "n": np.full(rows, n, np.int32),
    }, ThrottleMeta(extra_ns=round(timeline.throttle_extra_ns), **ids))


def throttle_level(rate: float) -> tuple[int, int]:
    """The throttled rate as the profile's level ``k`` of ``n`` (0.5 -> 1 of 2)."""
    level = Fraction(rate).limit_denominator(100)
    return level.numerator, level.denominator


def hbm_samples(program: Program, timeline: Timeline) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """HBM throughput per sampling period (timestamps, bytes/s, cumulative bytes) over the execution.

    The timing pass spreads each transfer's HBM bytes evenly over its duration into fixed periods
    (at least 1 us; longer for long programs so there are at most ~4096 samples).
    """
    width = timeline.hbm_width_ns
    t0 = timeline.begin_ns
    used = max(1, min(timeline.hbm_bins.size, int(np.ceil((timeline.finish_ns - t0) / width))))
    per_bin = timeline.hbm_bins[:used]
    times = np.rint(t0 + width * np.arange(used)).astype(np.int64)
    throughput = (per_bin * (1e9 / width)).astype(np.float32)
    return times, throughput, np.rint(np.cumsum(per_bin)).astype(np.int64)


def emit_collectives(sink: EventSink, program: Program, collectives: Sequence[tuple[int, CollectiveRecord]],
                     *, rank: int, execution_id: int, model_id: int, core: int) -> None:
    """One ``cc_op`` row per collective as rank ``rank`` saw it, columns named as the profile's CcOp
    table (``CollectiveRecord.ccop_row``); the node, IR op and HLO name of each travel in ``meta``."""
    if not collectives:
        return
    rows = [record.ccop_row(record.ranks[rank] if rank < len(record.ranks) else None)
            for _, record in collectives]
    declared = {column.name: column for column in RECORD_KINDS[RecordKind.CC_OP].columns}
    columns: dict[str, object] = {}
    for name in rows[0]:  # as declared: numbers as NumPy arrays, text as lists
        values = [row[name] for row in rows]
        dtype = declared[name].dtype
        columns[name] = np.array(values, dtype.value) if dtype.is_array else values
    columns["stream_id"] = np.zeros(len(rows), np.int64)  # one CC-core stream per program
    columns["stream_index"] = np.arange(len(rows), dtype=np.int64)
    nodes = [node for node, _ in collectives]
    op_indices = [int(program.op_index[node]) for node in nodes]
    sink.emit(RecordKind.CC_OP, columns,
              CcOpMeta(execution_id=execution_id, model_id=model_id, core=core, rank=rank, nodes=nodes,
                       op_indices=op_indices, hlo_names=[program.graph.ops[i].name for i in op_indices]))


CHANNEL_KINDS = {"NeuronLink": "neuronlink", "EFA": "efa", "on-chip": "on_chip"}


def emit_link_usage(sink: EventSink, records: Sequence[CollectiveRecord], t0: float, t1: float, *,
                    execution_ids: Sequence[int], samples: int = 256) -> None:
    """Per-channel traffic of a group's collectives in fixed windows over [t0, t1): one
    ``neuronlink_usage`` row per (window, channel that carried bytes), the columns of the profile's
    NeuronLinkUsage extension table."""
    if not records or t1 <= t0:
        return
    topology = records[0].topology
    width = max(1000.0, (t1 - t0) / samples)
    edges = t0 + width * np.arange(int(np.ceil((t1 - t0) / width)) + 1)
    n_windows, n_channels = edges.size - 1, len(topology.channels)
    traffic = np.zeros((n_windows, n_channels))
    flows = np.zeros((n_windows, n_channels), np.int32)
    for record in records:
        usage = record.link_usage
        if not usage.channels.size:
            continue
        first = max(0, int((record.start_ns - t0) // width))
        last = min(n_windows, int(np.ceil((record.end_ns - t0) / width)) + 1)
        for w in range(first, last):
            traffic[w, usage.channels] += usage.bytes_in_window(edges[w], edges[w + 1])
            flows[w, usage.channels] = np.maximum(flows[w, usage.channels],
                                                  usage.flows_in_window(edges[w], edges[w + 1]))
    window, channel = np.nonzero(traffic > 0)
    moved = traffic[window, channel]
    channels = [topology.channels[int(c)] for c in channel]
    capacity = topology.channel_bytes_per_s
    sink.emit(
        RecordKind.NEURONLINK_USAGE,
        {
            "timestamp": np.rint(edges[window]).astype(np.int64),
            "duration_ns": np.full(window.size, round(width), np.int64),
            "channel_id": channel.astype(np.int64),
            "channel_kind": [CHANNEL_KINDS.get(c.kind, c.kind) for c in channels],
            "link_id": [c.link if c.link >= 0 and c.kind == "NeuronLink" else None for c in channels],
            "src_device": np.asarray([c.src for c in channels], np.int64),
            "dst_device": np.asarray([c.dst for c in channels], np.int64),
            "direction": np.asarray([c.direction for c in channels], np.int32),
            "transfer_bytes": np.rint(moved).astype(np.int64),
            "current_throughput": (moved * 1e9 / width).astype(np.float32),
            "active_flows": flows[window, channel],
            "capacity": capacity[channel].astype(np.float32),
        },
        NeuronLinkUsageMeta(
            topology=topology.name, execution_ids=list(execution_ids),
            channel_labels={int(c): topology.channels[int(c)].label for c in np.unique(channel)}),
    )
