"""Turn the execution core's event-sink batches into profile tables.

    with record_profile("out/bert", sink) as recorder:     # subscribes; closes or aborts on exit
        model.execute(inputs)

A device profile describes one NeuronCore (as the real tool's does): the recorder keeps the first
core it hears from (or the one it is given) and notes in a ``Warning`` row any batches from other
cores it left out. Record each core into its own directory for a multi-core run.

Mapping (column by column in docs/profiles.md):

===================  =====================================================================
batch kind           tables
===================  =====================================================================
program_loaded       Metadata hardware constants; StackFrame* lookup tables; per-node text
                     (operands, bir ids) and per-op attribution kept for the Instruction rows
execution_start/end  ExecutionInfo (one row per execution, written at close)
instruction          Instruction
dma_packet           DmaPacket, one Flow edge per transfer (triggering instruction -> dma_block) and
                     one per semaphore wait of the transfer
semaphore_update     SemaphoreUpdate
hbm_usage            HbmUsage
throttle             Throttle (power throttling periods, NC-v3; ``type`` activity_0, limit k/n)
cc_op                CcOp (columns named as the CcOp table; ids filled in when absent), and Flow
                     edges into and out of each collective (``cc_op`` = ``CcOp.op_id``)
neuronlink_usage     NeuronLinkUsage (our extension table)
train_step           TrainingStep (one row per step) and TrainingCollective (its collectives with their
                     compute overlap) -- our extension tables
===================  =====================================================================

Ids: the core numbers instructions and DMA transfers by their node in one program, so the recorder
adds a per-execution base to make ``Instruction.id`` unique in the profile; a DMA transfer's node
id with the same base is its ``DmaPacket.packet_aggregation_id`` and the ``dma_block`` id in ``Flow``.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from formats import hierarchy_rollup as hierarchy
from formats.writer import ProfileWriter
from neuroncore.enums import ENGINE_NAMES, SEMAPHORE_BUS_SOURCE, Resource
from neuroncore.events import EventBatch, EventSink
from neuroncore.record_kinds import (
    CcOpMeta,
    DmaPacketMeta,
    ExecutionEndMeta,
    ExecutionMeta,
    ExecutionStartMeta,
    HbmUsageMeta,
    InstructionMeta,
    NeuronLinkUsageMeta,
    ProgramLoadedMeta,
    RecordKind,
    SemaphoreUpdateMeta,
    ThrottleMeta,
    TrainStepMeta,
    core_of,
    meta_of,
)

# Semaphore updates made by a DMA transfer's completion arrive over the bus (profile-schema §2.5).
BUS_SOURCE = "AXI"
# Throttle.type of the power throttling the core models (the schema's values: activity_0,
# activity_1, unknown; which activity counter the real tool names 0 is not published)
THROTTLE_TYPE = "activity_0"
CC_TRIGGER_ENGINE = "Pool"  # the real tool's spelling for GpSimd in CcOp.trigger_engine (§2.5)


@dataclass
class _Program:
    """What ``program_loaded`` told us about one loaded model, prepared for per-row lookups."""

    model_id: int
    name: str
    n_nodes: int
    operands: pa.Array  # per node
    bir_ids: pa.Array  # per node, "sg0000:<node>"
    opcodes: list[str]
    compiler_opcodes: pa.Array  # per runtime opcode code
    hlo_names: pa.Array  # per op
    layers: pa.Array  # per op
    frame_ids: pa.Array  # per op: text list of StackFrame ids
    source_locations: pa.Array  # per op: innermost frame as file:line
    queue_names: pa.Array  # per queue index
    queue_types: pa.Array
    semaphore_ids: pa.Array  # per semaphore number, as text
    # per node: Instruction text columns (distinct values, null mask per node, index per node)
    node_text: dict[str, tuple[pa.Array, np.ndarray, np.ndarray]] = field(default_factory=dict)
    # the dependency graph (CSR over node ids) and each node's resource (``neuroncore.enums.Resource``)
    dep_ptr: np.ndarray | None = None
    dep_idx: np.ndarray | None = None
    resource: np.ndarray | None = None


@dataclass
class _Execution:
    index: int
    execution_id: int
    model_id: int
    base: int  # added to node ids
    start_ns: int | None = None
    end_ns: int | None = None
    rows: int = 0
    spans: list[Any] = field(default_factory=list)  # per-batch op spans, merged at the end


@dataclass
class _FrameInterner:
    """The StackFrame* tables: interned file names, function names, (file, function, line) triples
    and the frame tree, all with 1-based ids (stored as text where the schema says string)."""

    files: dict[str, int] = field(default_factory=dict)
    functions: dict[str, int] = field(default_factory=dict)
    locations: dict[tuple[int, int, int], int] = field(default_factory=dict)
    frames: dict[tuple[int, int], int] = field(default_factory=dict)  # (parent id, location id) -> id

    def chain(self, frames: Sequence[tuple[str, int, str]]) -> list[int]:
        """Frame ids from the outermost call to the innermost (the order ``program_loaded`` uses)."""
        parent, ids = 0, []
        for file, line, function in frames:
            f = self.files.setdefault(str(file), len(self.files) + 1)
            fn = self.functions.setdefault(str(function), len(self.functions) + 1)
            loc = self.locations.setdefault((f, fn, int(line)), len(self.locations) + 1)
            parent = self.frames.setdefault((parent, loc), len(self.frames) + 1)
            ids.append(parent)
        return ids

    def write(self, writer: ProfileWriter) -> None:
        if not self.frames:
            return
        writer.write("StackFrameFileName", {"id": [str(i) for i in self.files.values()],
                                            "name": list(self.files)})
        writer.write("StackFrameFunctionName", {"id": [str(i) for i in self.functions.values()],
                                                "name": list(self.functions)})
        locs = list(self.locations.items())
        writer.write("StackFrameFileLocation", {
            "id": [str(i) for _, i in locs], "file_name_id": [k[0] for k, _ in locs],
            "function_name_id": [k[1] for k, _ in locs], "line_number": [k[2] for k, _ in locs]})
        frames = list(self.frames.items())
        writer.write("StackFrame", {"id": [str(i) for _, i in frames],
                                    "file_location_id": [k[1] for k, _ in frames],
                                    "parent_frame_id": [str(k[0]) for k, _ in frames]})


def metadata_from_spec(spec: Any) -> dict[str, Any]:
    """Metadata hardware constants from a core spec (``neuroncore.hardware.CoreSpec`` or lookalike).

    Clocks in GHz, bandwidths in bytes/s, as profile-schema §3.7 declares them. The Vector and Scalar
    engines process one partition per lane, so their channel count is the partition count; GpSimd has
    128 lanes (8 cores x 16) on both generations.
    """
    dma = getattr(spec, "dma_bytes_per_s", None)
    if dma is None:
        dma = min(spec.dma_engines * spec.dma_engine_bytes_per_s, spec.hbm_bytes_per_s)
    return {
        "dma_ddr_bandwidth": float(dma),
        "num_dma_engines_per_neuroncore": int(spec.dma_engines),
        "hbm_ddr_bandwidth": float(spec.hbm_bytes_per_s),
        "tensor_engine_num_rows": int(spec.pe_rows),
        "tensor_engine_num_cols": int(spec.pe_cols),
        "tensor_engine_clock_freq": spec.pe_clock_hz / 1e9,
        "vector_engine_clock_freq": spec.vector_clock_hz / 1e9,
        "vector_engine_num_channels": int(spec.partitions),
        "scalar_engine_clock_freq": spec.scalar_clock_hz / 1e9,
        "scalar_engine_num_channels": int(spec.partitions),
        "gpsimd_engine_clock_freq": spec.gpsimd_clock_hz / 1e9,
        "gpsimd_engine_num_channels": 128,
        "neuroncore_clock_freq": spec.base_clock_hz / 1e9,
    }


def _dict(indices: np.ndarray, dictionary: pa.Array, mask: np.ndarray | None = None) -> pa.DictionaryArray:
    """Per-row strings as indices into a per-program dictionary: no per-row Python objects."""
    if dictionary.type != pa.string():
        dictionary = dictionary.cast(pa.string())
    index_type = np.int32 if len(dictionary) > 32_000 else np.int16
    indices = indices.astype(index_type, copy=False)
    index_array = pa.array(indices, mask=mask) if mask is not None and mask.any() else pa.array(indices)
    return pa.DictionaryArray.from_arrays(index_array, dictionary)


def _packed_op(model_id: int, op: np.ndarray) -> np.ndarray:
    """``raw_hlo_id``: the loaded model in the high 32 bits, the op index in the low 32, so ops of two
    programs recorded into one profile never share an id (like the real tool's packed ids, §2.7)."""
    return (np.int64(model_id) << np.int64(32)) | op.astype(np.int64)


def _node_text(meta: ProgramLoadedMeta, n_nodes: int) -> dict[str, tuple[pa.Array, np.ndarray, np.ndarray]]:
    """Instruction text columns from the per-node facts of ``program_loaded`` (what the engine ran
    each node as), for the columns that have any value."""
    per_node: dict[str, Sequence[str | None]] = {
        "tensor_instruction_type": meta.tensor_instruction_type, "performance_mode": meta.performance_mode,
        "scalar_activation_fn": meta.activation_fn, "nki_source_location": meta.nki_source_location}
    out: dict[str, tuple[pa.Array, np.ndarray, np.ndarray]] = {}
    for column, values in per_node.items():
        if not any(v is not None for v in values):
            continue
        texts = [None if v is None else str(v) for v in values][:n_nodes]
        texts += [None] * (n_nodes - len(texts))
        # a dictionary of the distinct values (Parquet cannot store a null inside a dictionary) and,
        # per node, its index into it plus a null mask
        distinct = sorted({t for t in texts if t is not None})
        index = {t: i for i, t in enumerate(distinct)}
        out[column] = (pa.array(distinct, pa.string()), np.array([t is None for t in texts]),
                       np.array([0 if t is None else index[t] for t in texts], np.int32))
    return out


def _null_where(values: np.ndarray, mask: np.ndarray) -> pa.Array:
    return pa.array(values, mask=mask) if mask.any() else pa.array(values)


class ProfileRecorder:
    """An event-sink listener that writes what the core emits into a ``ProfileWriter``.

    Errors while recording never reach the core: the profile is aborted (kept, flagged incomplete),
    recording stops, and ``close()`` raises the error afterwards.
    """

    def __init__(self, writer: ProfileWriter, *, core: int | None = None, rollups: bool = True,
                 summaries: bool = True) -> None:
        self.writer = writer
        self.core = core
        self.rollups = rollups  # HloInstruction per execution, FrameworkNode at close
        self.summaries = summaries  # Summary, OpcodeSummary, ActiveTime, DmaUsage, InstructionLod at close
        self._program_facts: dict[str, int] = {}
        self._op_names: dict[int, str] = {}
        self._tree = hierarchy.FrameworkTree()
        self.programs: dict[int, _Program] = {}
        self.executions: dict[int, _Execution] = {}
        self._frames = _FrameInterner()
        self._next_base = 0
        self._packet_id = 0
        self._packet_carry: tuple[int, int, int] | None = None  # (execution, transfer, next rank)
        self._cc_op_id = 0
        self._other_cores: dict[int, int] = {}
        self._spec_seen = False
        self._lock = threading.Lock()
        self.error: BaseException | None = None

    # -- listener --------------------------------------------------------------------------
    def __call__(self, batch: EventBatch) -> None:
        with self._lock:
            if self.error is not None or not self.writer.is_open:
                return
            try:
                self._dispatch(batch)
            except Exception as exc:
                self.error = exc
                self.writer.abort(f"recording failed on a {batch.kind} batch: {type(exc).__name__}: {exc}")
                warnings.warn(f"profile recording stopped: {exc}", RuntimeWarning, stacklevel=2)

    def _dispatch(self, batch: EventBatch) -> None:
        core = core_of(batch.meta)
        if core is not None:
            if self.core is None:
                self.core = core
            elif core != self.core:
                self._other_cores[core] = self._other_cores.get(core, 0) + 1
                return
        self._handlers[batch.kind](self, batch)

    # -- finishing ---------------------------------------------------------------------------
    def close(self) -> Path:
        """Write the closing tables and move the profile into place; re-raise a recording error."""
        with self._lock:
            if self.error is not None:
                raise RuntimeError(f"profile recording failed; what was recorded is at {self.writer.path}: "
                                   f"{self.error}") from self.error
            try:
                self._finish_tables(complete=True)
                return self.writer.close()
            except Exception as exc:  # keep what was recorded, marked, and say why
                self.error = exc
                self.writer.abort(f"finishing the profile failed: {type(exc).__name__}: {exc}")
                raise

    def abort(self, reason: str = "capture interrupted") -> Path | None:
        with self._lock:
            with contextlib.suppress(Exception):
                self._finish_tables(complete=False)
            return self.writer.abort(reason)

    def _finish_tables(self, *, complete: bool) -> None:
        if not self.writer.is_open:
            return
        self._frames.write(self.writer)
        self._write_execution_info()
        if complete:  # an interrupted capture's layers (and summaries) would look whole: leave them out
            from formats import derive
            from formats.summary_scan import Hardware

            staged = self._write_summaries()
            hw = Hardware.from_metadata(self.writer.metadata_preview())
            nodes = self._tree.rows(hw.peak_flops_per_s, hw.hbm_bytes_per_s)
            if nodes:
                if staged is not None:
                    derive.add_engine_ranges(nodes, derive.framework_engine_ranges(staged))
                self.writer.write("FrameworkNode", nodes)
            elif self._tree.overflow:
                self.writer.warn(f"FrameworkNode not written: the layers' busy spans passed "
                                 f"{self._tree.max_spans:,} and were dropped to keep memory bounded; "
                                 f"compute the layer rollup from the Instruction table", "Missing Data")
        self._tree = hierarchy.FrameworkTree()
        for core, n in sorted(self._other_cores.items()):
            self.writer.warn(f"{n} batches from core {core} were not recorded: this profile holds core "
                             f"{self.core}; record each core into its own profile", "Missing Data")
        self._frames = _FrameInterner()
        self._other_cores.clear()

    def _write_summaries(self) -> Any:
        """Summary tables computed over the finished event tables (``formats.derive``); a failure is a
        Warning row, never a lost profile. Returns the staged profile the rollups can read, or None."""
        if not self.summaries:
            return None
        from formats import derive  # DuckDB is loaded when a capture closes, not when a listener attaches
        from formats.summary_scan import ProgramFacts

        facts = ProgramFacts(
            weight_size_bytes=self._program_facts.get("weight"),
            input_size_bytes=self._program_facts.get("input"),
            output_size_bytes=self._program_facts.get("output"),
            dma_queue_count=self._program_facts.get("queues")) if self._program_facts else None
        nodes = len(self._tree.nodes) if self.rollups else 0
        staged = derive.staged_profile(self.writer)  # finishing the event tables must not fail quietly
        try:
            return derive.write_derived(self.writer, facts, closing_rows=nodes, staged=staged,
                                        later_tables=["FrameworkNode"] if nodes else []).profile
        except Exception as exc:  # keep the profile; readers compute summaries on demand
            self.writer.warn(f"summary tables not written ({type(exc).__name__}: {exc}); readers compute "
                             f"them from the event tables", "Processing")
            return None

    def _facts(self, meta: ProgramLoadedMeta) -> None:
        """NEFF-level sizes for the Summary (weights, inputs, outputs, queue count), over every loaded
        program of this profile."""
        usage = meta.hbm_bytes_by_kind
        for kind in ("weight", "input", "output"):
            if kind in usage:
                self._program_facts[kind] = self._program_facts.get(kind, 0) + int(usage[kind])
        self._program_facts["queues"] = self._program_facts.get("queues", 0) + len(meta.queues)

    def _write_execution_info(self) -> None:
        done = [e for e in self.executions.values() if e.start_ns is not None]
        if not done:
            return
        starts = [e.start_ns for e in done if e.start_ns is not None]  # all of them: narrowed for the checker
        origin = min(starts)
        self.writer.write("ExecutionInfo", {
            "execution_index": [e.index for e in done],
            "neff_name": [self.programs[e.model_id].name if e.model_id in self.programs else None
                          for e in done],
            "execution_start_ts": [start - origin for start in starts],
            "execution_end_ts": [None if e.end_ns is None else e.end_ns - origin for e in done],
            "num_subgraphs": [1] * len(done),
            "row_count": [e.rows for e in done],
        })
        self.executions.clear()

    # -- batch handlers ----------------------------------------------------------------------
    def _on_program_loaded(self, batch: EventBatch) -> None:
        c, m = batch.columns, meta_of(batch, ProgramLoadedMeta)
        if m.model_id in self.programs:  # the runtime re-announces models to new listeners
            return
        if not self._spec_seen:
            self._spec_seen = True
            extra = {"neuroncore_idx": self.core, "is_simulation": True}
            defaults = {**metadata_from_spec(m.spec), **extra}
            self.writer.update_metadata(**{k: v for k, v in defaults.items()
                                           if self.writer.metadata.get(k) is None})
        n_nodes = m.n_instructions + m.n_dma_transfers
        operands = list(m.operands)
        n_nodes = max(n_nodes, len(operands))
        operands += [""] * (n_nodes - len(operands))
        frames = c["frames"]
        chains = [self._frames.chain(f) for f in frames]
        opcodes = list(m.opcodes)
        compiler = m.compiler_opcodes
        queues = sorted(m.queues)
        size = (queues[-1].queue_idx + 1) if queues else 0
        names: list[str | None] = [None] * size
        types: list[str | None] = [None] * size
        for index, name, queue_type in queues:
            names[index], types[index] = name, queue_type
        base = m.model_id << 32
        for i, (name, layer) in enumerate(zip(c["hlo_name"], c["layer"])):
            self._op_names[base | i] = str(name)
            self._tree.add_op(base | i, layer or None)
        n_sem = max([*m.semaphore_names, 255]) + 1
        self.programs[m.model_id] = _Program(
            model_id=m.model_id,
            name=m.model_name,
            n_nodes=n_nodes,
            operands=pa.array(operands, pa.string()),
            bir_ids=pa.array([f"sg0000:{i}" for i in range(n_nodes)], pa.string()),
            opcodes=opcodes,
            compiler_opcodes=pa.array([compiler.get(o, o) for o in opcodes], pa.string()),
            hlo_names=pa.array(list(c["hlo_name"]), pa.string()),
            layers=pa.array([x or None for x in c["layer"]], pa.string()),
            frame_ids=pa.array(["[" + ", ".join(map(str, ids)) + "]" if ids else None for ids in chains],
                               pa.string()),
            source_locations=pa.array([f"{f[-1][0]}:{f[-1][1]}" if f else None for f in frames], pa.string()),
            queue_names=pa.array(names, pa.string()),
            queue_types=pa.array([t or "unknown" for t in types], pa.string()),
            semaphore_ids=pa.array([str(i) for i in range(n_sem)], pa.string()),
            node_text=_node_text(m, n_nodes),
            dep_ptr=np.asarray(m.dep_ptr, np.int64),
            dep_idx=np.asarray(m.dep_idx, np.int64),
            resource=np.asarray(m.resource, np.int8),
        )
        self._facts(m)

    def _on_execution_start(self, batch: EventBatch) -> None:
        m = meta_of(batch, ExecutionStartMeta)
        self._execution(m).start_ns = m.start_ns

    def _on_execution_end(self, batch: EventBatch) -> None:
        m = meta_of(batch, ExecutionEndMeta)
        execution = self._execution(m)
        execution.end_ns = m.end_ns
        if execution.start_ns is None:
            execution.start_ns = m.start_ns
        if self.rollups and execution.spans:
            spans = hierarchy.merge(hierarchy.concat(execution.spans))
            execution.spans = []
            rows = hierarchy.hlo_rows(spans, execution.index, execution.base, self._op_names)
            if rows["id"]:
                self.writer.write("HloInstruction", rows)
            self._tree.add(spans)

    def _execution(self, meta: ExecutionMeta) -> _Execution:
        execution_id = meta.execution_id
        execution = self.executions.get(execution_id)
        if execution is None:
            model_id = meta.model_id
            program = self.programs.get(model_id)
            if program is None:
                raise ValueError(f"execution {execution_id} of model {model_id} arrived before the model's "
                                 f"program_loaded batch (subscribe the recorder before loading)")
            execution = _Execution(len(self.executions), execution_id, model_id, self._next_base)
            self._next_base += program.n_nodes
            self.executions[execution_id] = execution
        return execution

    def _on_instruction(self, batch: EventBatch) -> None:
        c, m = batch.columns, meta_of(batch, InstructionMeta)
        execution = self._execution(m)
        program = self.programs[execution.model_id]
        node = np.asarray(c["id"], dtype=np.int64)
        n = node.size
        op = np.asarray(c["op_index"])
        no_op = op < 0
        op_idx = np.where(no_op, 0, op)
        packed = _packed_op(program.model_id, op)
        trig_start = np.asarray(c["dma_trigger_start_ts"])
        trig_end = np.asarray(c["dma_trigger_end_ts"])
        transpose = np.asarray(c["transpose_flops"])
        opcode = np.asarray(c["opcode"])
        columns = {
            "start_ts": c["start_ts"],
            "end_ts": c["end_ts"],
            "duration_ns": c["duration_ns"],
            "engine": _dict(np.asarray(c["engine"]), pa.array(m.engine_labels)),
            "timeline_track": _dict(np.asarray(c["track"]), pa.array(m.track_labels)),
            "pcore_idx": np.zeros(n, np.int64),
            "opcode": _dict(opcode, pa.array(m.opcodes or program.opcodes)),
            "operands": _dict(node, program.operands),
            "compiler_opcode": _dict(opcode, program.compiler_opcodes),
            "id": node + execution.base,
            "pc": c["pc"],
            "compiler_pc": c["pc"],
            "bir_id": _dict(node, program.bir_ids),
            "raw_bir_id": node,
            "evt_wait_time_ns": c["evt_wait_time_ns"],
            "hlo_name": _dict(op_idx, program.hlo_names, no_op),
            "raw_hlo_id": _null_where(packed, no_op),
            "raw_framework_id": _null_where(packed, no_op),
            "layer": _dict(op_idx, program.layers, no_op),
            "stack_frame_ids": _dict(op_idx, program.frame_ids, no_op),
            "bir_debug_info_source_location": _dict(op_idx, program.source_locations, no_op),
            "dma_trigger_start_ts": _null_where(trig_start, trig_start < 0),
            "dma_trigger_end_ts": _null_where(trig_end, trig_end < 0),
            **{name: c[name] for name in (
                "hbm_read_bytes", "hbm_write_bytes", "sbuf_read_bytes", "sbuf_write_bytes", "psum_read_bytes",
                "psum_write_bytes", "spill_save_bytes", "spill_reload_bytes", "raw_flops", "adjusted_flops")},
            "flops_transpose": _null_where(transpose, transpose <= 0),
        }
        for column, (values, missing, index) in program.node_text.items():
            columns[column] = _dict(index[node], values, missing[node])
        self.writer.write("Instruction", columns)
        execution.rows += n
        self._dependency_flows(node, execution, program)
        if self.rollups:
            opcodes = list(m.opcodes or program.opcodes)
            sbuf_read = np.asarray(c["sbuf_read_bytes"])
            loads = opcode == opcodes.index("LDWEIGHTS") if "LDWEIGHTS" in opcodes else np.zeros(n, bool)
            execution.spans.append(hierarchy.merge(hierarchy.events(
                np.where(no_op, -1, packed), np.asarray(c["start_ts"]), np.asarray(c["end_ts"]),
                rid=node + execution.base, iid=node + execution.base, engine=np.asarray(c["engine"]),
                sums=hierarchy.EventSums(
                    hbm_read=np.asarray(c["hbm_read_bytes"]), hbm_write=np.asarray(c["hbm_write_bytes"]),
                    sbuf_read=sbuf_read, sbuf_write=np.asarray(c["sbuf_write_bytes"]),
                    load_weight=np.where(loads, sbuf_read, 0), instructions=np.ones(n, np.int64),
                    raw_flops=np.asarray(c["raw_flops"]), flops_transpose=np.maximum(transpose, 0),
                    adjusted_flops=np.asarray(c["adjusted_flops"]),
                    pe_flops=np.maximum(np.asarray(c["raw_flops"]), transpose)))))

    def _on_dma_packet(self, batch: EventBatch) -> None:
        c = batch.columns
        execution = self._execution(meta_of(batch, DmaPacketMeta))
        program = self.programs[execution.model_id]
        transfer = np.asarray(c["transfer_id"], dtype=np.int64)
        n = transfer.size
        if n == 0:
            return
        rank = self._packet_ranks(execution.index, transfer)
        nbytes = np.asarray(c["transfer_bytes"], dtype=np.int64)
        duration = np.asarray(c["duration_ns"], dtype=np.int64)
        throughput = np.divide(nbytes * 1e9, duration, out=np.zeros(n), where=duration > 0)
        queue = np.asarray(c["queue_idx"])
        op = np.asarray(c["op_index"])
        hbm_read = np.where(np.asarray(c["hbm_read"]), nbytes, 0)
        hbm_write = np.where(np.asarray(c["hbm_write"]), nbytes, 0)
        self.writer.write("DmaPacket", {
            "start_ts": c["start_ts"],
            "end_ts": c["end_ts"],
            "duration_ns": duration,
            "pcore_idx": np.zeros(n, np.int64),
            "id": np.arange(self._packet_id, self._packet_id + n, dtype=np.int64),
            "packet_idx": rank.astype(np.int32),
            "packet_aggregation_id": transfer + execution.base,
            "engine_idx": c["engine_idx"],
            "read_bytes": nbytes,
            "write_bytes": nbytes,
            "transfer_bytes": nbytes,
            "throughput": throughput.astype(np.float32),
            "queue_type": _dict(queue, program.queue_types),
            "queue_name": _dict(queue, program.queue_names),
            "queue_idx": queue,
            "crc": np.zeros(n, np.int64),
            "raw_hlo_id": _null_where(_packed_op(program.model_id, op), op < 0),
            "hbm_read_bytes": hbm_read,
            "hbm_write_bytes": hbm_write,
        })
        self._packet_id += n
        execution.rows += n
        if self.rollups:
            execution.spans.append(hierarchy.merge(hierarchy.events(
                np.where(op < 0, -1, _packed_op(program.model_id, op)), np.asarray(c["start_ts"]),
                np.asarray(c["end_ts"]), rid=transfer + execution.base,
                sums=hierarchy.EventSums(hbm_read=hbm_read, hbm_write=hbm_write))))
        self._dependency_flows(transfer[rank == 0], execution, program, table="dma_block")
        first = (rank == 0) & (np.asarray(c["trigger_id"]) >= 0)
        if first.any():
            k = int(first.sum())
            self.writer.write("Flow", {
                "in_id": np.asarray(c["trigger_id"], dtype=np.int64)[first] + execution.base,
                "out_id": transfer[first] + execution.base,
                "in_table": pa.DictionaryArray.from_arrays(np.zeros(k, np.int8), ["instruction"]),
                "out_table": pa.DictionaryArray.from_arrays(np.zeros(k, np.int8), ["dma_block"]),
                "dependency_type": pa.DictionaryArray.from_arrays(np.zeros(k, np.int8), ["DMA_TRIGGER"]),
            })

    def _dependency_flows(self, node: np.ndarray, execution: _Execution, program: _Program,
                          table: str = "instruction") -> None:
        """One ``Flow`` edge per semaphore wait of these instructions (or, ``table="dma_block"``, DMA
        transfers): the instruction or DMA transfer (``dma_block``) whose completion it waited for ->
        it. Waits on collectives are written with the CcOp rows (``_collective_flows``)."""
        ptr, idx, resource = program.dep_ptr, program.dep_idx, program.resource
        if ptr is None or idx is None or resource is None or not node.size:
            return
        counts = ptr[node + 1] - ptr[node]
        total = int(counts.sum())
        if not total:
            return
        first = np.repeat(ptr[node], counts)
        within = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
        source = idx[first + within]
        target = np.repeat(node, counts)
        keep = resource[source] != Resource.CC
        source, target = source[keep], target[keep]
        k = source.size
        if not k:
            return
        self.writer.write("Flow", {
            "in_id": source + execution.base,
            "out_id": target + execution.base,
            "in_table": pa.DictionaryArray.from_arrays((resource[source] == Resource.DMA).astype(np.int8),
                                                       ["instruction", "dma_block"]),
            "out_table": pa.DictionaryArray.from_arrays(np.zeros(k, np.int8), [table]),
            "dependency_type": pa.DictionaryArray.from_arrays(np.zeros(k, np.int8), ["SEMAPHORE"]),
        })

    def _packet_ranks(self, execution: int, transfer: np.ndarray) -> np.ndarray:
        """Position of each packet within its transfer. A transfer's packets are adjacent in the
        stream but may straddle two batches, so the count carries over."""
        n = transfer.size
        starts = np.flatnonzero(np.r_[True, transfer[1:] != transfer[:-1]])
        rank = np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))
        carry = self._packet_carry
        if carry is not None and carry[0] == execution and carry[1] == transfer[0]:
            first_run = starts[1] if starts.size > 1 else n
            rank[:first_run] += carry[2]
        self._packet_carry = (execution, int(transfer[-1]), int(rank[-1]) + 1)
        return rank

    def _on_semaphore_update(self, batch: EventBatch) -> None:
        c, m = batch.columns, meta_of(batch, SemaphoreUpdateMeta)
        execution = self._execution(m)
        program = self.programs[execution.model_id]
        sem = np.asarray(c["semaphore"])
        n = sem.size
        source = np.where(np.asarray(c["is_dma"]), SEMAPHORE_BUS_SOURCE,
                          np.asarray(c["source_engine"])).astype(np.int8)
        labels = pa.array([*ENGINE_NAMES, BUS_SOURCE])  # by source code: engines, then the bus
        self.writer.write("SemaphoreUpdate", {
            "timestamp": c["timestamp"],
            "id": _dict(sem, program.semaphore_ids),
            "value": c["value"],
            "update_source": _dict(source, labels),
            "update_operation_type": pa.DictionaryArray.from_arrays(np.zeros(n, np.int8), ["sem_inc"]),
            "update_trigger_timing": pa.DictionaryArray.from_arrays(np.zeros(n, np.int8), ["complete"]),
            "pcore_idx": np.zeros(n, np.int64),
        })
        execution.rows += n

    def _on_hbm_usage(self, batch: EventBatch) -> None:
        c = batch.columns
        execution = self._execution(meta_of(batch, HbmUsageMeta))
        n = len(c["timestamp"])
        self.writer.write("HbmUsage", {
            "timestamp": c["timestamp"],
            "current_throughput": c["current_throughput"],
            "total_transfer_bytes": c["total_transfer_bytes"],
            "pcore_idx": np.zeros(n, np.int64),
        })
        execution.rows += n

    def _on_throttle(self, batch: EventBatch) -> None:
        """Power-throttling periods: the real tool's ``Throttle`` rows (``duration`` in ns, no suffix)."""
        c = batch.columns
        execution = self._execution(meta_of(batch, ThrottleMeta))
        n = len(c["timestamp"])
        self.writer.write("Throttle", {
            "duration": c["duration_ns"],
            "k": c["k"],
            "n": c["n"],
            "timestamp": c["timestamp"],
            "type": pa.DictionaryArray.from_arrays(np.zeros(n, np.int8), [THROTTLE_TYPE]),
            "pcore_idx": np.zeros(n, np.int64),
        })
        execution.rows += n

    def _on_cc_op(self, batch: EventBatch) -> None:
        """Collective ops, columns named as the CcOp table (``record_kinds`` declares them); op ids and
        the trigger engine are the recorder's to assign."""
        meta_of(batch, CcOpMeta)
        n = len(batch)
        if not n:
            return
        columns = {**batch.columns,
                   "op_id": np.arange(self._cc_op_id, self._cc_op_id + n, dtype=np.int64),
                   "trigger_engine": [CC_TRIGGER_ENGINE] * n}
        first_id = self._cc_op_id
        self._cc_op_id += n
        self.writer.write("CcOp", columns)
        meta = meta_of(batch, CcOpMeta)
        # the Flow edges need the program's dependencies: collectives reported without a loaded
        # program (another recorder's core, a replayed stream) are kept as CcOp rows, edges left out
        if len(meta.nodes) == n and meta.model_id in self.programs:
            self._collective_flows(np.asarray(meta.nodes, np.int64),
                                   np.arange(first_id, first_id + n, dtype=np.int64), meta)

    def _collective_flows(self, nodes: np.ndarray, op_ids: np.ndarray, meta: CcOpMeta) -> None:
        """``Flow`` edges of the collectives (``cc_op`` = ``CcOp.op_id``): what each waited for before
        it started, and the instructions and transfers that waited for it -- the semaphore waits
        ``_dependency_flows`` leaves out because a collective is no instruction."""
        execution = self._execution(meta)
        program = self.programs[execution.model_id]
        ptr, idx, resource = program.dep_ptr, program.dep_idx, program.resource
        if ptr is None or idx is None or resource is None or not nodes.size:
            return
        op_of = dict(zip(nodes.tolist(), op_ids.tolist()))
        counts = ptr[nodes + 1] - ptr[nodes]
        source = idx[np.repeat(ptr[nodes], counts) + np.arange(int(counts.sum()))
                     - np.repeat(np.cumsum(counts) - counts, counts)]
        into = np.repeat(op_ids, counts)
        keep = resource[source] != Resource.CC
        source, into = source[keep], into[keep]
        owner = np.repeat(np.arange(ptr.size - 1, dtype=np.int64), np.diff(ptr))
        hit = np.isin(idx, nodes)
        consumer, waited = owner[hit], idx[hit]
        out_of = np.array([op_of[int(w)] for w in waited], np.int64)
        keep = resource[consumer] != Resource.CC
        consumer, out_of = consumer[keep], out_of[keep]
        k_in, k_out = source.size, consumer.size
        if not k_in + k_out:
            return
        tables = ["instruction", "dma_block", "cc_op"]
        self.writer.write("Flow", {
            "in_id": np.concatenate([source + execution.base, out_of]),
            "out_id": np.concatenate([into, consumer + execution.base]),
            "in_table": pa.DictionaryArray.from_arrays(np.concatenate([
                (resource[source] == Resource.DMA).astype(np.int8), np.full(k_out, 2, np.int8)]), tables),
            "out_table": pa.DictionaryArray.from_arrays(np.concatenate([
                np.full(k_in, 2, np.int8), (resource[consumer] == Resource.DMA).astype(np.int8)]), tables),
            "dependency_type": pa.DictionaryArray.from_arrays(np.zeros(k_in + k_out, np.int8), ["SEMAPHORE"]),
        })

    def _on_train_step(self, batch: EventBatch) -> None:
        """A training step: its row of TrainingStep and its collectives' TrainingCollective rows."""
        m = meta_of(batch, TrainStepMeta)
        levels = m.levels
        self.writer.write("TrainingStep", {
            "execution_id": np.array([m.execution_id], np.int64), "step": np.array([m.step], np.int64),
            "start_ts": np.array([m.start_ns], np.int64),
            "step_time_ns": np.array([m.step_time_ns], np.int64),
            "global_batch": np.array([m.global_batch], np.int64), "seq": np.array([m.seq], np.int64),
            "model_flops": np.array([m.model_flops], np.float64), "ranks": np.array([m.ranks], np.int64),
            "peak_flops_per_rank": np.array([m.peak_flops_per_rank], np.float64),
            **{f"{level}_ns": np.array([int(levels.get(level, 0))], np.int64)
               for level in ("forward", "backward", "gradient_sync", "optimizer")},
            "layout": [m.layout],
        })
        n = len(batch)
        if n:
            self.writer.write("TrainingCollective", {
                "execution_id": np.full(n, m.execution_id, np.int64), **batch.columns})

    def _on_neuronlink_usage(self, batch: EventBatch) -> None:
        meta_of(batch, NeuronLinkUsageMeta)
        self.writer.write("NeuronLinkUsage", dict(batch.columns))

    _handlers: ClassVar[dict[RecordKind, Callable[[ProfileRecorder, EventBatch], None]]] = {
        RecordKind.PROGRAM_LOADED: _on_program_loaded,
        RecordKind.EXECUTION_START: _on_execution_start,
        RecordKind.INSTRUCTION: _on_instruction,
        RecordKind.DMA_PACKET: _on_dma_packet,
        RecordKind.SEMAPHORE_UPDATE: _on_semaphore_update,
        RecordKind.HBM_USAGE: _on_hbm_usage,
        RecordKind.THROTTLE: _on_throttle,
        RecordKind.CC_OP: _on_cc_op,
        RecordKind.NEURONLINK_USAGE: _on_neuronlink_usage,
        RecordKind.TRAIN_STEP: _on_train_step,
        RecordKind.EXECUTION_END: _on_execution_end,
    }
    """Which handler takes each record kind (every declared kind has one; a test checks)."""


@contextlib.contextmanager
def record_profile(out_dir: str | Path, sink: EventSink | None = None, *, core: int | None = None,
                   metadata: Mapping[str, Any] | None = None, summaries: bool = True,
                   **writer_options: Any) -> Iterator[ProfileRecorder]:
    """Record everything ``sink`` (default: the core's process-wide sink) emits into ``out_dir``.
    ``summaries=False`` leaves out the derived tables (Summary, ActiveTime, ..., InstructionLod).

    On normal exit the profile is completed and moved into place; on any exception (including
    ``KeyboardInterrupt``) what was recorded is kept at ``<out_dir>.incomplete``, flagged incomplete.
    """
    if sink is None:
        from neuroncore.events import sink as default_sink
        sink = default_sink
    writer = ProfileWriter(out_dir, {"is_simulation": True, **(metadata or {})}, **writer_options)
    recorder = ProfileRecorder(writer, core=core, summaries=summaries)
    unsubscribe = sink.subscribe(recorder)
    try:
        yield recorder
    except BaseException as exc:
        unsubscribe()
        recorder.abort(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        raise
    unsubscribe()
    recorder.close()


"""Alias: the sink-to-writer adapter under the name the design notes use."""
