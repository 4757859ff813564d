"""The core -> recorder contract: every kind of event batch, its columns and its metadata, declared once.

The execution core reports what it did as :class:`~neuroncore.events.EventBatch` objects: a
:class:`RecordKind`, equal-length columns (NumPy arrays, or Python lists where values are text or
nested) and a typed, frozen metadata record. This module is the one place that says, like a Perfetto
table definition, which columns each kind carries (name, dtype, unit, meaning) and which metadata
class goes with it. The core emits through it (``neuroncore.runtime.records``,
``neuroncore.runtime.device``), ``formats.recorder`` consumes it through a dispatch table keyed by
:class:`RecordKind`, and ``check_batch`` (run by every test through a checking sink) fails loudly on
a batch that does not match its declaration.

Codes inside columns (engine, track, opcode, queue, resource) are small integers: engines and
resources are ``neuroncore.enums``; opcodes, queues and semaphores name themselves in the metadata.

Adding a kind: add a member to :class:`RecordKind`, a metadata class and a :class:`KindDecl` in
``RECORD_KINDS``; emit it with ``sink.emit(RecordKind.X, columns, XMeta(...))``; give
``formats.recorder.ProfileRecorder`` a handler (its test fails until every kind has one); run
``python -m neuroncore.record_kinds`` to regenerate the table in docs/execution-core.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from neuroncore.events import EventBatch
    from neuroncore.hardware import CoreSpec


class RecordKind(StrEnum):
    """What a batch reports. The values are the names listeners and docs have always used."""

    PROGRAM_LOADED = "program_loaded"
    EXECUTION_START = "execution_start"
    INSTRUCTION = "instruction"
    DMA_PACKET = "dma_packet"
    SEMAPHORE_UPDATE = "semaphore_update"
    HBM_USAGE = "hbm_usage"
    THROTTLE = "throttle"
    CC_OP = "cc_op"
    NEURONLINK_USAGE = "neuronlink_usage"
    TRAIN_STEP = "train_step"
    EXECUTION_END = "execution_end"


class Dtype(StrEnum):
    """How a column is stored. Fixed-width kinds are NumPy arrays of exactly that dtype; the others
    are Python lists whose items have that Python type (``OBJECT``: nested lists and tuples)."""

    BOOL = "bool"
    INT8 = "int8"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    FLOAT32 = "float32"
    FLOAT64 = "float64"
    TEXT = "list[str]"
    INT_LIST = "list[int]"
    FLOAT_LIST = "list[float]"
    OBJECT = "list[object]"

    @property
    def is_array(self) -> bool:
        return not self.value.startswith("list[")


_LIST_ITEM: dict[Dtype, tuple[type, ...]] = {
    Dtype.TEXT: (str,),
    Dtype.INT_LIST: (int,),
    Dtype.FLOAT_LIST: (float, int),
    Dtype.OBJECT: (list, tuple),
}


@dataclass(frozen=True, slots=True)
class Column:
    """One declared column. ``nullable`` lists may hold ``None`` items; arrays never do (the core
    marks a missing number with a negative sentinel, said in ``meaning``)."""

    name: str
    dtype: Dtype
    unit: str
    meaning: str
    nullable: bool = False


# -- metadata records --------------------------------------------------------------------------


class QueueInfo(NamedTuple):
    """One DMA queue of a program: its index (``dma_packet.queue_idx``), name and queue type
    (a ``neuroncore.enums.DmaQueueType`` value)."""

    queue_idx: int
    name: str
    queue_type: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelMeta:
    """Batches about one loaded model on one core."""

    model_id: int
    core: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgramLoadedMeta(ModelMeta):
    """A model was loaded (or re-announced to a new listener): its static, per-program facts.

    Per-node sequences (``operands``, ``activation_fn``, ...) and the dependency graph are indexed by
    node id (the ``id`` of ``instruction`` rows, ``transfer_id`` of ``dma_packet`` rows)."""

    model_name: str
    spec: CoreSpec
    device: int
    instance_type: str | None  # None for a core no Instance owns
    rank: int  # place in a tensor-parallel group; 0 when not sharded
    n_instructions: int
    n_dma_transfers: int
    queues: Sequence[QueueInfo]
    semaphore_names: Mapping[int, str]
    operands: Sequence[str]  # per node; the same object for every load of one compiled program
    opcodes: Sequence[str]  # runtime opcode names by ``instruction.opcode`` code
    compiler_opcodes: Mapping[str, str]  # runtime opcode -> what the compiler emitted
    hbm_bytes_by_kind: Mapping[str, int]  # "weight", "input", "output", "scratch"
    activation_fn: Sequence[str | None]  # per node
    tensor_instruction_type: Sequence[str | None]  # per node
    performance_mode: Sequence[str | None]  # per node
    dep_ptr: npt.NDArray[np.int64]  # CSR row pointers over node ids: the nodes each node waits for
    dep_idx: npt.NDArray[np.int64]
    resource: npt.NDArray[np.int8]  # per node, ``neuroncore.enums.Resource`` codes
    nki_source_location: Sequence[str | None] = ()  # per node: file:line of its NKI call (kernels)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionMeta(ModelMeta):
    """Batches of one execution of a loaded model."""

    execution_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class HostMeta(ExecutionMeta):
    """Where the execution ran on the host: what places device time on the host clock."""

    host_start_ns: int  # Unix ns when the caller asked for the execution
    pid: int
    thread_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionStartMeta(HostMeta):
    start_ns: int  # device clock
    model_name: str
    rank: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionEndMeta(HostMeta):
    start_ns: int  # device clock
    end_ns: int
    device_time_ns: int
    timing_only: bool
    host_end_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class InstructionMeta(ExecutionMeta):
    engine_labels: Sequence[str]  # by ``engine`` code (``neuroncore.enums.ENGINE_NAMES``)
    track_labels: Sequence[str]  # by ``track`` code (``neuroncore.enums.TRACK_LABELS``)
    opcodes: Sequence[str]  # by ``opcode`` code


@dataclass(frozen=True, slots=True, kw_only=True)
class DmaPacketMeta(ExecutionMeta):
    queues: Sequence[QueueInfo]


@dataclass(frozen=True, slots=True, kw_only=True)
class SemaphoreUpdateMeta(ExecutionMeta):
    semaphore_names: Mapping[int, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class HbmUsageMeta(ExecutionMeta):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class ThrottleMeta(ExecutionMeta):
    """``extra_ns``: the Tensor-engine time the execution's throttling added in all (Σ over its
    throttled MATMULs of their throttled minus their full-speed cost)."""

    extra_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CcOpMeta(ExecutionMeta):
    """Per row: the collective's program node, IR op index and HLO name."""

    rank: int
    nodes: Sequence[int]
    op_indices: Sequence[int]
    hlo_names: Sequence[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainStepMeta(ExecutionMeta):
    """One training step (an execution of a step program): what the step-level figures need.

    ``levels`` maps forward / backward / gradient_sync / optimizer to the time the level kept the
    core busy (union of its nodes' intervals, ns); the figures (seq/s, training MFU) are computed
    from these by ``formats.figures.training_step_figures``, never here."""

    step: int  # 1 for the first step of this program on this core
    step_time_ns: int
    start_ns: int  # device clock
    global_batch: int
    seq: int
    model_flops: float  # (6 N + 12 L h s) x tokens of the step
    ranks: int
    peak_flops_per_rank: float
    levels: Mapping[str, float]
    layout: str  # "<model>/<nodes>x<instance>/tp<T>pp<P>dp<D>/seq<S>/gbs<G>"
    host_start_ns: int
    host_end_ns: int


@dataclass(frozen=True, slots=True)
class NeuronLinkUsageMeta:
    """One tensor-parallel group execution (all its ranks' executions); no single core."""

    topology: str
    execution_ids: Sequence[int]
    channel_labels: Mapping[int, str]  # channel id -> display label, for the channels present


Meta = (ProgramLoadedMeta | ExecutionStartMeta | ExecutionEndMeta | InstructionMeta | DmaPacketMeta
        | SemaphoreUpdateMeta | HbmUsageMeta | ThrottleMeta | CcOpMeta | NeuronLinkUsageMeta | TrainStepMeta)
"""Every metadata record a batch can carry."""

M = TypeVar("M", bound="ModelMeta | NeuronLinkUsageMeta")  # a metadata class or a base of some


def core_of(meta: Meta) -> int | None:
    """The core a batch is about, or None for a batch about a whole group (``neuronlink_usage``)."""
    return meta.core if isinstance(meta, ModelMeta) else None


def meta_of(batch: EventBatch, cls: type[M]) -> M:
    """``batch.meta`` as ``cls``; TypeError if the batch carries another kind's metadata."""
    meta = batch.meta
    if not isinstance(meta, cls):
        raise TypeError(f"a {batch.kind} batch carries {type(meta).__name__}, not {cls.__name__}")
    return meta


# -- the declarations ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KindDecl:
    """One record kind: what a batch of it means, its metadata class and its columns."""

    kind: RecordKind
    meaning: str
    meta: type[Meta]
    columns: tuple[Column, ...]

    @property
    def names(self) -> frozenset[str]:
        return frozenset(c.name for c in self.columns)


_NS, _BYTES, _FLOP, _CODE, _ID = "ns", "bytes", "FLOP", "code", "id"
_TS = "ns (device clock)"
_SPAN = (
    Column("start_ts", Dtype.INT64, _TS, "start on the core's device clock"),
    Column("end_ts", Dtype.INT64, _TS, "end on the core's device clock"),
    Column("duration_ns", Dtype.INT64, _NS, "end_ts - start_ts"),
)
_COUNTERS = tuple(
    Column(name, Dtype.INT64, unit, meaning) for name, unit, meaning in (
        ("raw_flops", _FLOP, "arithmetic the instruction did, as issued"),
        ("adjusted_flops", _FLOP, "FLOPs counted at the engine's native precision"),
        ("transpose_flops", _FLOP, "FLOPs of a transpose done on the PE array; <= 0 when none"),
        ("hbm_read_bytes", _BYTES, "bytes read from HBM"),
        ("hbm_write_bytes", _BYTES, "bytes written to HBM"),
        ("sbuf_read_bytes", _BYTES, "bytes read from SBUF"),
        ("sbuf_write_bytes", _BYTES, "bytes written to SBUF"),
        ("psum_read_bytes", _BYTES, "bytes read from PSUM"),
        ("psum_write_bytes", _BYTES, "bytes written to PSUM"),
        ("spill_save_bytes", _BYTES, "bytes this instruction spilled to HBM"),
        ("spill_reload_bytes", _BYTES, "bytes this instruction reloaded from a spill"),
    ))

RECORD_KINDS: dict[RecordKind, KindDecl] = {d.kind: d for d in (
    KindDecl(RecordKind.PROGRAM_LOADED,
             "a model was loaded on a core (or re-announced to a new listener): one row per IR op",
             ProgramLoadedMeta, (
                 Column("op_index", Dtype.INT32, _ID, "the op's index in the graph (instruction.op_index)"),
                 Column("hlo_name", Dtype.TEXT, "-", "HLO instruction name (dot.3)"),
                 Column("opcode", Dtype.TEXT, "-", "IR opcode (dot, add, ...)"),
                 Column("layer", Dtype.TEXT, "-", "framework layer path; empty when none"),
                 Column("shape", Dtype.OBJECT, "elements", "output shape, a list of dimensions"),
                 Column("dtype", Dtype.TEXT, "-", "output element type (neuroncore.dtypes value)"),
                 Column("frames", Dtype.OBJECT, "-",
                        "Python frames that created the op, outermost first: (file, line, function)"),
             )),
    KindDecl(RecordKind.EXECUTION_START, "an execution began on a core (metadata only)",
             ExecutionStartMeta, ()),
    KindDecl(RecordKind.INSTRUCTION, "engine instructions of one execution, one row per instruction",
             InstructionMeta, (
                 Column("id", Dtype.INT64, _ID, "node id in the program (unique per execution)"),
                 Column("engine", Dtype.INT8, _CODE, "neuroncore.enums.Engine"),
                 Column("track", Dtype.INT8, _CODE, "neuroncore.enums.Resource of the row it occupies"),
                 Column("opcode", Dtype.INT16, _CODE, "index into meta.opcodes"),
                 Column("pc", Dtype.INT64, "-", "program counter on its engine"),
                 Column("op_index", Dtype.INT32, _ID, "IR op it implements; -1 for none"),
                 *_COUNTERS,
                 *_SPAN,
                 Column("evt_wait_time_ns", Dtype.INT64, _NS, "time spent waiting on semaphores"),
                 Column("dma_trigger_start_ts", Dtype.INT64, _TS,
                        "start of the DMA transfer it triggered; -1 for none"),
                 Column("dma_trigger_end_ts", Dtype.INT64, _TS, "end of that transfer; -1 for none"),
             )),
    KindDecl(RecordKind.DMA_PACKET,
             "DMA packets: one DMA engine's share of one transfer, one row per packet",
             DmaPacketMeta, (
                 Column("transfer_id", Dtype.INT64, _ID, "the transfer's node id; its packets are adjacent"),
                 Column("trigger_id", Dtype.INT64, _ID, "node id of the triggering instruction; -1 for none"),
                 Column("queue_idx", Dtype.INT16, _CODE, "index into meta.queues"),
                 Column("transfer_bytes", Dtype.INT64, _BYTES, "bytes this packet moved"),
                 Column("hbm_read", Dtype.BOOL, "-", "the transfer reads HBM"),
                 Column("hbm_write", Dtype.BOOL, "-", "the transfer writes HBM"),
                 Column("op_index", Dtype.INT32, _ID, "IR op it belongs to; -1 for none"),
                 *_SPAN,
                 Column("engine_idx", Dtype.INT16, _CODE, "DMA engine that moved the packet"),
             )),
    KindDecl(RecordKind.SEMAPHORE_UPDATE,
             "semaphore increments at instruction and transfer completion, one row per increment",
             SemaphoreUpdateMeta, (
                 Column("semaphore", Dtype.INT16, _CODE, "semaphore number (meta.semaphore_names)"),
                 Column("value", Dtype.INT32, "count", "the semaphore's value after the update"),
                 Column("node", Dtype.INT64, _ID, "node whose completion made the update"),
                 Column("is_dma", Dtype.BOOL, "-", "made by a DMA transfer (over the bus), not an engine"),
                 Column("source_engine", Dtype.INT8, _CODE, "neuroncore.enums.Engine of the node"),
                 Column("timestamp", Dtype.INT64, _TS, "when the update happened"),
             )),
    KindDecl(RecordKind.HBM_USAGE, "HBM throughput over one execution, one row per sampling period",
             HbmUsageMeta, (
                 Column("timestamp", Dtype.INT64, _TS, "start of the period"),
                 Column("current_throughput", Dtype.FLOAT32, "bytes/s", "HBM bytes per second in the period"),
                 Column("total_transfer_bytes", Dtype.INT64, _BYTES, "HBM bytes since the execution began"),
             )),
    KindDecl(RecordKind.THROTTLE,
             "power throttling of one execution (NC-v3: Tensor-engine utilisation under 50 % for "
             "3 us, then the next matmuls at half rate until the ramp), one row per throttling period; "
             "emitted only when there was some",
             ThrottleMeta, (
                 Column("timestamp", Dtype.INT64, _TS, "start of the period (its first throttled MATMUL)"),
                 Column("duration_ns", Dtype.INT64, _NS, "until the power controller ramped back up"),
                 Column("k", Dtype.INT32, "-", "allowed activity level; the limit is k / n of full speed"),
                 Column("n", Dtype.INT32, "-", "the level scale"),
             )),
    KindDecl(RecordKind.CC_OP,
             "collectives of a tensor-parallel execution, one row per collective as one rank saw it; "
             "columns named as the profile's CcOp table",
             CcOpMeta, (
                 *_SPAN,
                 Column("operation", Dtype.TEXT, "-", "AllReduce, AllGather, ..."),
                 Column("algorithm", Dtype.TEXT, "-", "Ring, Mesh, ..."),
                 Column("num_elements", Dtype.INT64, "elements", "elements of each rank's input"),
                 Column("dtype", Dtype.TEXT, "-", "element type"),
                 Column("input_size", Dtype.INT64, _BYTES, "bytes of each rank's input"),
                 Column("output_size", Dtype.INT64, _BYTES, "bytes of each rank's output"),
                 Column("algorithm_bandwidth", Dtype.FLOAT64, "bytes/s", "input bytes / duration"),
                 Column("bus_bandwidth", Dtype.FLOAT64, "bytes/s", "algorithm bandwidth x its bus factor"),
                 Column("trigger_start_ts", Dtype.INT64, _TS, "when this rank was ready to start"),
                 Column("cc_trigger_start_delay", Dtype.INT64, _NS, "start_ts - trigger_start_ts"),
                 Column("replica_group", Dtype.TEXT, "-", "the ranks taking part, as text ([[0, 1]])"),
                 Column("stream_id", Dtype.INT64, _ID, "CC-core stream (one per program)"),
                 Column("stream_index", Dtype.INT64, "-", "position in the stream"),
             )),
    KindDecl(RecordKind.NEURONLINK_USAGE,
             "NeuronLink / EFA / on-chip channel traffic of a tensor-parallel execution, one row per "
             "(sampling window, channel that carried bytes); columns of the NeuronLinkUsage table",
             NeuronLinkUsageMeta, (
                 Column("timestamp", Dtype.INT64, _TS, "start of the window"),
                 Column("duration_ns", Dtype.INT64, _NS, "window length"),
                 Column("channel_id", Dtype.INT64, _ID, "channel in the topology (meta.channel_labels)"),
                 Column("channel_kind", Dtype.TEXT, "-", "neuronlink, efa or on_chip"),
                 Column("link_id", Dtype.INT_LIST, _ID, "NeuronLink port; None otherwise", nullable=True),
                 Column("src_device", Dtype.INT64, _ID, "sending device"),
                 Column("dst_device", Dtype.INT64, _ID, "receiving device"),
                 Column("direction", Dtype.INT32, _CODE, "direction along the link"),
                 Column("transfer_bytes", Dtype.INT64, _BYTES, "bytes carried in the window"),
                 Column("current_throughput", Dtype.FLOAT32, "bytes/s", "transfer_bytes per second"),
                 Column("active_flows", Dtype.INT32, "count", "most concurrent flows in the window"),
                 Column("capacity", Dtype.FLOAT32, "bytes/s", "the channel's bandwidth"),
             )),
    KindDecl(RecordKind.TRAIN_STEP,
             "a training step's collectives, one row per collective of the step program, with how much "
             "of each overlapped compute; the step's own figures are in the metadata",
             TrainStepMeta, (
                 Column("name", Dtype.TEXT, "-", "HLO name of the collective"),
                 Column("operation", Dtype.TEXT, "-", "AllReduce, ReduceScatter, AllGather"),
                 Column("replica_group_kind", Dtype.TEXT, "-", "tp (inside a layer) or dp (gradients)"),
                 *_SPAN,
                 Column("size_bytes", Dtype.INT64, _BYTES, "bytes of the larger of input and output"),
                 Column("overlap_ns", Dtype.INT64, _NS, "of its duration, time some compute engine was busy"),
             )),
    KindDecl(RecordKind.EXECUTION_END, "an execution finished (metadata only: device time, host clock)",
             ExecutionEndMeta, ()),
)}


# -- checking ------------------------------------------------------------------------------------


class RecordContractError(ValueError):
    """A batch does not match its kind's declaration."""


def check_batch(batch: EventBatch) -> None:
    """Raise :class:`RecordContractError` (one line) unless ``batch`` matches its declaration exactly:
    a declared kind, its metadata class, the declared column set, each column's dtype (and, for
    lists, every item's type) and equal lengths. Tests run it on every batch through a checking
    sink; the emit path does not, so observing the core stays cheap."""
    try:
        decl = RECORD_KINDS[RecordKind(batch.kind)]
    except ValueError:
        raise RecordContractError(f"{batch.kind!r} is not a declared record kind") from None
    where = f"{decl.kind} batch"
    if type(batch.meta) is not decl.meta:
        raise RecordContractError(f"{where}: meta is {type(batch.meta).__name__}, not {decl.meta.__name__}")
    _check_meta(batch.meta, where)
    got = set(batch.columns)
    if got != decl.names:
        missing, extra = sorted(decl.names - got), sorted(got - decl.names)
        raise RecordContractError(f"{where}: columns differ from the declaration "
                                  f"(missing {missing}, undeclared {extra})")
    lengths = set()
    for column in decl.columns:
        lengths.add(_check_column(batch.columns[column.name], column, where))
    if len(lengths) > 1:
        raise RecordContractError(f"{where}: columns have different lengths {sorted(lengths)}")


def _check_column(values: Any, column: Column, where: str) -> int:
    name = f"{where}: column {column.name!r}"
    if column.dtype.is_array:
        if not isinstance(values, np.ndarray):
            raise RecordContractError(f"{name} is a {type(values).__name__}, not an {column.dtype} array")
        if values.dtype != np.dtype(column.dtype.value) or values.ndim != 1:
            raise RecordContractError(f"{name} is {values.dtype}[{values.ndim}d], declared {column.dtype}")
        return int(values.shape[0])
    if not isinstance(values, list):
        raise RecordContractError(f"{name} is a {type(values).__name__}, declared {column.dtype}")
    allowed = _LIST_ITEM[column.dtype]
    for item in values:
        if item is None and column.nullable:
            continue
        if not isinstance(item, allowed) or isinstance(item, bool):
            raise RecordContractError(f"{name} holds {item!r} ({type(item).__name__}), not {column.dtype}")
    return len(values)


def _check_meta(meta: Meta, where: str) -> None:
    """Scalar fields have their declared Python type; containers are checked for their kind only."""
    for f in fields(meta):
        value = getattr(meta, f.name)
        expected = _SCALAR_FIELDS.get(str(f.type))
        if expected is not None and (not isinstance(value, expected)
                                     or (isinstance(value, bool) and bool not in expected)):
            raise RecordContractError(f"{where}: meta.{f.name} is {value!r}, declared {f.type}")


_SCALAR_FIELDS: dict[str, tuple[type, ...]] = {
    "int": (int,), "str": (str,), "bool": (bool,), "str | None": (str, type(None))}


# -- documentation -------------------------------------------------------------------------------


def markdown_table() -> str:
    """The declarations as the Markdown section of docs/execution-core.md (``python -m
    neuroncore.record_kinds`` prints it)."""
    lines: list[str] = []
    for decl in RECORD_KINDS.values():
        meta = ", ".join(f"`{f.name}`" for f in fields(decl.meta))
        lines += [f"#### `{decl.kind}`", "", f"{decl.meaning[0].upper()}{decl.meaning[1:]}.", "",
                  f"Meta `{decl.meta.__name__}`: {meta}.", ""]
        if decl.columns:
            lines += ["| column | dtype | unit | meaning |", "|---|---|---|---|"]
            lines += [f"| `{c.name}` | {c.dtype}{' or None' if c.nullable else ''} | {c.unit} | {c.meaning} |"
                      for c in decl.columns]
            lines.append("")
    return "\n".join(lines)


__all__ = [
    "RECORD_KINDS",
    "CcOpMeta",
    "Column",
    "DmaPacketMeta",
    "Dtype",
    "ExecutionEndMeta",
    "ExecutionMeta",
    "ExecutionStartMeta",
    "HbmUsageMeta",
    "HostMeta",
    "InstructionMeta",
    "KindDecl",
    "Meta",
    "ModelMeta",
    "NeuronLinkUsageMeta",
    "ProgramLoadedMeta",
    "QueueInfo",
    "RecordContractError",
    "RecordKind",
    "SemaphoreUpdateMeta",
    "ThrottleMeta",
    "TrainStepMeta",
    "check_batch",
    "core_of",
    "markdown_table",
    "meta_of",
]

if __name__ == "__main__":
    print(markdown_table())
