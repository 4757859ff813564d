"""Turn one execution's timeline into event-sink batches (only when someone listens)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from neuroncore.compiler.program import RES_DMA, RES_TENSOR_LS, RES_TENSOR_MM, Program
from neuroncore.events import BATCH_ROWS, EventSink
from neuroncore.hardware import ENGINE_LABELS, Engine
from neuroncore.runtime.scheduler import Timeline

TRACK_LABELS = ["Tensor", "Vector", "Scalar", "GpSimd", "Sync", "TensorMatrix"]
ENGINE_NAMES = [ENGINE_LABELS[e] for e in Engine]
HBM_SAMPLES = 2000


def _chunks(n: int) -> Iterator[slice]:
    for s in range(0, n, BATCH_ROWS):
        yield slice(s, min(n, s + BATCH_ROWS))


def emit_program(sink: EventSink, program: Program, model_id: int, core: int) -> None:
    graph = program.graph
    ops = graph.ops
    sink.emit(
        "program_loaded",
        {
            "op_index": np.arange(len(ops), dtype=np.int32),
            "hlo_name": [op.name for op in ops],
            "opcode": [op.opcode for op in ops],
            "layer": [op.layer for op in ops],
            "shape": [list(op.shape) for op in ops],
            "dtype": [op.dtype.value for op in ops],
            "frames": [[(f.file, f.line, f.function) for f in op.frames] for op in ops],
        },
        model_id=model_id, core=core, model_name=graph.name, spec=program.spec,
        n_instructions=program.n_instructions, n_dma_transfers=program.n_dma_transfers,
        queues=[(q.index, q.name, q.queue_type) for q in program.queues],
        semaphore_names=dict(program.semaphore_names), operands=program.operands,
        opcodes=program.opcodes,
    )


def emit_execution(sink: EventSink, program: Program, timeline: Timeline, *, execution_id: int,
                   model_id: int, core: int) -> None:
    meta = {"execution_id": execution_id, "model_id": model_id, "core": core}
    is_dma = program.resource == RES_DMA
    instr = np.flatnonzero(~is_dma)
    start = np.rint(timeline.start_ns).astype(np.int64)
    end = np.rint(timeline.end_ns).astype(np.int64)
    wait = np.rint(timeline.wait_ns).astype(np.int64)
    track = program.resource.astype(np.int8)
    # DMA triggered by each trigger instruction
    trig_of = np.full(program.n_nodes, -1, np.int64)
    dma_nodes = np.flatnonzero(is_dma)
    trig_of[program.trigger[dma_nodes]] = dma_nodes
    dma_start = np.where(trig_of >= 0, start[np.maximum(trig_of, 0)], -1)
    dma_end = np.where(trig_of >= 0, end[np.maximum(trig_of, 0)], -1)
    for part in _chunks(len(instr)):
        idx = instr[part]
        sink.emit(
            "instruction",
            {
                "id": idx,
                "start_ts": start[idx],
                "end_ts": end[idx],
                "duration_ns": end[idx] - start[idx],
                "engine": program.engine[idx],
                "track": np.where(track[idx] == RES_TENSOR_MM, RES_TENSOR_MM, track[idx]),
                "opcode": program.opcode_id[idx],
                "pc": program.pc[idx],
                "op_index": program.op_index[idx],
                "evt_wait_time_ns": wait[idx],
                "dma_trigger_start_ts": dma_start[idx],
                "dma_trigger_end_ts": dma_end[idx],
                "raw_flops": program.raw_flops[idx],
                "adjusted_flops": program.adjusted_flops[idx],
                "transpose_flops": program.transpose_flops[idx],
                "hbm_read_bytes": program.hbm_read_bytes[idx],
                "hbm_write_bytes": program.hbm_write_bytes[idx],
                "sbuf_read_bytes": program.sbuf_read_bytes[idx],
                "sbuf_write_bytes": program.sbuf_write_bytes[idx],
                "psum_read_bytes": program.psum_read_bytes[idx],
                "psum_write_bytes": program.psum_write_bytes[idx],
                "spill_save_bytes": program.spill_save_bytes[idx],
                "spill_reload_bytes": program.spill_reload_bytes[idx],
            },
            engine_labels=ENGINE_NAMES, track_labels=TRACK_LABELS, opcodes=program.opcodes, **meta,
        )
    packets = timeline.packet_node
    for part in _chunks(len(packets)):
        nodes = packets[part]
        p_start = np.rint(timeline.packet_start_ns[part]).astype(np.int64)
        p_end = np.rint(timeline.packet_end_ns[part]).astype(np.int64)
        share = program.dma_bytes[nodes] // np.maximum(program.dma_engines[nodes], 1)
        sink.emit(
            "dma_packet",
            {
                "transfer_id": nodes,
                "start_ts": p_start,
                "end_ts": p_end,
                "duration_ns": p_end - p_start,
                "engine_idx": timeline.packet_engine[part],
                "queue_idx": program.queue[nodes],
                "transfer_bytes": share,
                "hbm_read": program.hbm_read_bytes[nodes] > 0,
                "hbm_write": program.hbm_write_bytes[nodes] > 0,
                "op_index": program.op_index[nodes],
            },
            queues=[(q.index, q.name, q.queue_type) for q in program.queues], **meta,
        )
    producers = np.flatnonzero(program.sem_increment >= 0)
    for part in _chunks(len(producers)):
        nodes = producers[part]
        sink.emit(
            "semaphore_update",
            {
                "timestamp": end[nodes],
                "semaphore": program.sem_increment[nodes],
                "value": program.sem_value[nodes],
                "node": nodes,
                "is_dma": is_dma[nodes],
                "source_engine": program.engine[nodes],
            },
            semaphore_names=program.semaphore_names, **meta,
        )
    times, throughput, cumulative = hbm_samples(program, timeline)
    sink.emit("hbm_usage", {"timestamp": times, "current_throughput": throughput,
                            "total_transfer_bytes": cumulative}, **meta)


def hbm_samples(program: Program, timeline: Timeline, samples: int = HBM_SAMPLES
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """HBM bytes/s sampled on an even grid over the execution, from the DMA packets that touch HBM."""
    nodes = timeline.packet_node
    hbm_bytes = (program.hbm_read_bytes[nodes] + program.hbm_write_bytes[nodes]) // np.maximum(
        program.dma_engines[nodes], 1)
    keep = hbm_bytes > 0
    s, e, b = timeline.packet_start_ns[keep], timeline.packet_end_ns[keep], hbm_bytes[keep]
    t0, t1 = timeline.begin_ns, max(timeline.finish_ns, timeline.begin_ns + 1.0)
    edges = np.linspace(t0, t1, samples + 1)
    if s.size == 0:
        zeros = np.zeros(samples, np.int64)
        return np.rint(edges[:-1]).astype(np.int64), zeros.astype(np.float32), zeros
    rate = b / np.maximum(e - s, 1e-9)  # bytes per ns while the packet runs
    times = np.concatenate([s, e])
    slope_change = np.concatenate([rate, -rate])
    order = np.argsort(times, kind="stable")
    times, slope_change = times[order], slope_change[order]
    slope = np.cumsum(slope_change)
    cum = np.concatenate([[0.0], np.cumsum(slope[:-1] * np.diff(times))])
    at_edges = np.interp(edges, times, cum)
    per_bin = np.diff(at_edges)
    throughput = per_bin / np.diff(edges) * 1e9  # bytes per second
    return (np.rint(edges[:-1]).astype(np.int64), throughput.astype(np.float32),
            np.rint(at_edges[1:]).astype(np.int64))


assert RES_TENSOR_LS == 0
