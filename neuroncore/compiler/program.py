"""The compiled program: per-engine instruction streams, DMA transfers and their debug info.

A program is a sequence of *nodes* in one global order that respects every dependency: engine
instructions (Tensor, Vector, Scalar, GpSimd, Sync) and DMA transfers (on named queues). Each node
lists the earlier nodes it waits for (the compiler turns those into semaphore waits); the timing
model and the numerics both walk this order. Hot per-node fields are NumPy columns so that executing
and reporting a program costs array operations, not Python loops.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_right
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias, overload

import numpy as np

from neuroncore.compiler.counters import COUNTER_NAMES
from neuroncore.compiler.fast_init import fast_init
from neuroncore.compiler.lowering_state import HbmTensorKind, Layout
from neuroncore.compiler.view_steps import ViewStep
from neuroncore.dtypes import DType
from neuroncore.enums import DmaQueueType, Memory, Resource
from neuroncore.hardware import CoreSpec, Engine
from neuroncore.ir.graph import Graph

if TYPE_CHECKING:
    from neuroncore.compiler.node_semantics import NodeSemantics
    from neuroncore.runtime.scheduler import RecordLayout

# Resource ids used by the timing model, declared in ``neuroncore.enums.Resource`` (the five engines,
# then the Tensor engine's second track, DMA, CC), as plain ints: the timing loop is compiled with
# numba, which bakes these module constants into its code.
RES_TENSOR_LS = int(Resource.TENSOR_LS)  # LoadStationary stream ("Tensor" row)
RES_VECTOR = int(Resource.VECTOR)
RES_SCALAR = int(Resource.SCALAR)
RES_GPSIMD = int(Resource.GPSIMD)
RES_SYNC = int(Resource.SYNC)
RES_TENSOR_MM = int(Resource.TENSOR_MM)  # MultiplyMoving stream ("TensorMatrix" row), same PE
RES_DMA = int(Resource.DMA)  # every DMA transfer; its queue is in ``queue``
RES_CC = int(Resource.CC)  # collectives, run by the CC-core over NeuronLink; timed at run time
N_ENGINE_RESOURCES = int(Resource.DMA)  # instruction tracks: neuroncore.enums.N_TRACKS
N_RESOURCES = len(Resource)  # resource ids are 0 .. N_RESOURCES - 1

# Bits of ``Program.ports``: the on-chip memories an instruction touches. On NC-v2 some engines
# share an access port to a memory (neuroncore.md §2.5), so the timing model serialises them.
PORT_SBUF = 1
PORT_PSUM = 2


@dataclass(frozen=True, slots=True)
class Ref:
    """An access to an on-chip buffer: partitions [p0, p1) x free elements [f0, f1)."""

    buf: int
    p0: int
    p1: int
    f0: int
    f1: int

    @property
    def rows(self) -> int:
        return self.p1 - self.p0

    @property
    def cols(self) -> int:
        return self.f1 - self.f0


@dataclass(frozen=True, slots=True)
class ApRef:
    """A strided access to an on-chip buffer: partitions [p0, p1) x an access pattern over the free
    dim, element ``offset + sum(i_k * stride_k)`` for ``i_k < count_k`` (``pattern`` holds
    ``(stride, count)`` pairs, outermost first). Engines read and write SBUF through such patterns
    (neuroncore.md §2.4): a convolution's kernel offset is a shifted, possibly strided view of the
    input tile, read by the Tensor engine as its moving operand without any copy.

    ``f0``/``f1`` bound the elements touched (what hazard tracking sees); ``cols`` is the number of
    elements the pattern yields per partition, in row-major order of the pattern."""

    buf: int
    p0: int
    p1: int
    offset: int
    pattern: tuple[tuple[int, int], ...]

    @property
    def rows(self) -> int:
        return self.p1 - self.p0

    @property
    def cols(self) -> int:
        n = 1
        for _, count in self.pattern:
            n *= count
        return n

    @property
    def f0(self) -> int:
        return self.offset

    @property
    def f1(self) -> int:
        return self.offset + sum(stride * (count - 1) for stride, count in self.pattern) + 1

    def indices(self) -> np.ndarray:
        """The free-dim element of each position, in the pattern's row-major order."""
        index = np.full((1,), self.offset, np.int64)
        for stride, count in self.pattern:
            index = (index[:, None] + stride * np.arange(count, dtype=np.int64)[None, :]).reshape(-1)
        return index


fast_init(Ref)  # made several times per node: set the slots directly (compiler/fast_init.py)
fast_init(ApRef)

OnChip: TypeAlias = Ref | ApRef
"""An on-chip operand: a contiguous block or a strided access pattern."""


@dataclass(frozen=True, slots=True)
class HbmAccess:
    """An access to an HBM tensor, in its [batch, rows, cols] (or column-vector) form.

    ``view`` names a relayout of the tensor (transpose, slice, ...) that the DMA's access pattern
    applies; ``None`` reads the tensor as stored.
    """

    tensor: str
    batch: int
    r0: int
    r1: int
    c0: int
    c1: int
    layout: Layout = Layout.ROW  # ROW: tiles of [rows, last dim]; COL: [rows, 1] of the last dim
    view: str | None = None


fast_init(HbmAccess)


@dataclass(frozen=True, slots=True)
class Buffer:
    """An on-chip allocation. SBUF buffers span the same byte range on every partition they use.

    Slotted: a big prefill holds a million of them (relocated layers' included), and a record
    with a ``__dict__`` cost ~330 bytes against ~100 (docs/execution-core.md "Program memory")."""

    id: int
    memory: Memory  # SBUF or PSUM
    partitions: int
    free: int  # elements per partition
    dtype: DType
    address: int  # byte offset within each partition (PSUM: bank * bank size)
    name: str

    def __post_init__(self) -> None:
        memory = self.memory
        if not isinstance(memory, Memory):
            memory = Memory(str(memory).lower())  # "SBUF" from older callers is Memory.SBUF
        if memory is Memory.HBM:
            raise ValueError(f"buffer {self.name}: on-chip buffers live in SBUF or PSUM, not HBM")
        object.__setattr__(self, "memory", memory)

    @property
    def bytes_per_partition(self) -> int:
        return self.free * self.dtype.itemsize


def _raw_maker(cls: type) -> Any:
    """``make(*values)``: a ``cls`` with its slots set to ``values`` in field order, without its
    constructor (no ``__post_init__``): for records copied from ones already checked."""
    names = [f.name for f in dataclasses.fields(cls)]
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    namespace.update({f"_set_{n}": cls.__dict__[n].__set__ for n in names})
    body = "".join(f"    _set_{n}(b, {n})\n" for n in names)
    # the source is made from the field names of our own record class, never from outside input
    exec(f"def make({', '.join(names)}):\n    b = _new(_cls)\n{body}    return b\n", namespace)
    return namespace["make"]


raw_buffer = _raw_maker(Buffer)
"""``raw_buffer(id, memory, partitions, free, dtype, address, name)``: a :class:`Buffer` made
without its constructor's check of ``memory`` (a ``Memory`` member, SBUF or PSUM, already)."""


BufferFields: TypeAlias = tuple[int, Memory, int, int, DType, int, str]
"""A :class:`Buffer`'s fields in order (``raw_buffer``'s arguments)."""


class MovedBuffers:
    """One relocated layer's buffers, kept by reference: its template's fields (ids consecutive
    from ``fields[0]``'s), moved by ``db`` and renamed by ``rename`` when a record is read."""

    __slots__ = ("db", "fields", "hi", "lo", "names", "rename")

    def __init__(self, fields: list[BufferFields], db: int, rename: Callable[[str], str]) -> None:
        self.fields = fields
        self.db = db
        self.lo = fields[0][0] + db
        self.hi = self.lo + len(fields)
        self.rename = rename
        self.names: dict[str, str] = {}  # each template name renamed once, when first read

    def record(self, buf_id: int) -> Buffer:
        _, memory, partitions, free, dtype, address, name = self.fields[buf_id - self.lo]
        moved = self.names.get(name)
        if moved is None:
            moved = self.names[name] = self.rename(name)
        return raw_buffer(buf_id, memory, partitions, free, dtype, address, moved)


class RelocatedBuffers(Mapping[int, Buffer]):
    """A program's buffers when layers were relocated: the lowered ones (a dict) and the relocated
    layers' (``MovedBuffers``, made when read: timing-only runs never read them). The same keys,
    records and order (by id) as one dict holding every record."""

    __slots__ = ("_moved", "_own", "_starts")

    def __init__(self, own: dict[int, Buffer], moved: list[MovedBuffers]) -> None:
        self._own = own
        self._moved = moved  # in id order, disjoint from ``own``'s ids
        self._starts = [m.lo for m in moved]

    def __getitem__(self, buf_id: int) -> Buffer:
        found = self._own.get(buf_id)
        if found is not None:
            return found
        i = bisect_right(self._starts, buf_id) - 1
        if i >= 0 and isinstance(buf_id, int) and buf_id < self._moved[i].hi:
            return self._moved[i].record(buf_id)
        raise KeyError(buf_id)

    def __len__(self) -> int:
        return len(self._own) + sum(m.hi - m.lo for m in self._moved)

    def __iter__(self) -> Iterator[int]:
        moved = iter(self._moved)
        pending = next(moved, None)
        for buf_id in self._own:
            while pending is not None and pending.lo < buf_id:
                yield from range(pending.lo, pending.hi)
                pending = next(moved, None)
            yield buf_id
        while pending is not None:
            yield from range(pending.lo, pending.hi)
            pending = next(moved, None)

    def __reduce__(self) -> tuple[Any, ...]:
        return dict, (dict(self.items()),)  # pickled as the plain dict it stands for


@dataclass(frozen=True)
class HbmTensor:
    """A tensor in device memory: a model input, weight, output or compiler scratch (spill, relayout)."""

    name: str
    shape: tuple[int, ...]
    dtype: DType
    kind: HbmTensorKind
    op_index: int  # the IR op whose value this holds
    pretransposed: bool = False  # weight stored with its last two dims swapped by the compiler

    def __post_init__(self) -> None:
        # a closed set: an unknown kind is refused here, a plain "weight" becomes the enum member
        object.__setattr__(self, "kind", HbmTensorKind(self.kind))

    @property
    def nbytes(self) -> int:
        size = 1
        for d in self.shape:
            size *= d
        return size * self.dtype.itemsize


@dataclass(frozen=True)
class DmaQueue:
    """A named DMA queue (profile-schema §2.9): ``q<Engine><Purpose><n>`` and its queue type."""

    index: int
    name: str
    queue_type: DmaQueueType
    trigger_engine: Engine
    semaphore: int


@dataclass(frozen=True)
class HbmView:
    """A relayout of HBM tensors, read through a DMA access pattern instead of being stored.

    ``steps`` (``neuroncore.compiler.view_steps``) is either ``(ApplyOp(index),)`` (the IR op's
    semantics applied to ``sources``) or a chain of ``Transpose`` / ``Reshape`` / ``BroadcastRows``
    applied to the single source. ``run_elements`` is the contiguous run the access pattern reads,
    which sets DMA efficiency.
    """

    name: str
    steps: tuple[ViewStep, ...]
    sources: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: DType
    run_elements: int


@dataclass(frozen=True, eq=False)
class CounterColumns:
    """A program's per-node counters (``compiler.counters``: FLOPs, bytes per memory, spill and DMA
    bytes), dictionary-encoded: ``table`` has one row per distinct record (a column per
    ``COUNTER_NAMES`` entry, int32 where every value fits, else int64) and ``codes[node]`` is the
    node's row. Nodes share a few thousand records at most (relocated layers their template's), so
    a node costs its code (2 or 4 bytes) instead of twelve columns' 48 (docs/execution-core.md
    "Program memory"); a column is made when read (``Program.raw_flops`` ...)."""

    codes: np.ndarray  # int16 (int32 past 32,767 records): row of ``table`` per node
    table: np.ndarray  # (records, len(COUNTER_NAMES))

    def column(self, name: str) -> np.ndarray:
        """One counter for every node, in node order (the table's dtype)."""
        return self.table[:, COUNTER_INDEX[name]][self.codes]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CounterColumns):
            return NotImplemented
        return (self.codes.dtype == other.codes.dtype and self.table.dtype == other.table.dtype
                and np.array_equal(self.codes, other.codes) and np.array_equal(self.table, other.table))

    __hash__ = None  # type: ignore[assignment]

    def per_record(self, name: str) -> np.ndarray:
        """One counter per record (``codes`` index it): e.g. for a pass that reads it per node."""
        return self.table[:, COUNTER_INDEX[name]]


COUNTER_INDEX = {name: i for i, name in enumerate(COUNTER_NAMES)}


class CodedColumn(Sequence[str | None]):
    """A per-node text with a few distinct values (an instruction's activation function, type or
    performance mode): each node's index into ``values``, 1-2 bytes a node instead of a list's
    8-byte pointer (docs/execution-core.md "Program memory"). Reads as the list it stands for."""

    __slots__ = ("codes", "values")

    def __init__(self, codes: np.ndarray, values: list[str | None]) -> None:
        self.codes = codes
        self.values = values

    def __len__(self) -> int:
        return int(self.codes.shape[0])

    @overload
    def __getitem__(self, index: int) -> str | None: ...

    @overload
    def __getitem__(self, index: slice) -> list[str | None]: ...

    def __getitem__(self, index: int | slice) -> list[str | None] | str | None:
        if isinstance(index, slice):
            return list(map(self.values.__getitem__, self.codes[index].tolist()))
        return self.values[self.codes[index]]

    def __iter__(self) -> Iterator[str | None]:
        for start in range(0, len(self), 1 << 16):  # in chunks: no list of every node's code
            yield from self[start:start + (1 << 16)]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # compared by value, like the list

    def __repr__(self) -> str:
        return f"CodedColumn({len(self)} nodes, values={self.values!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return CodedColumn, (self.codes, self.values)


@dataclass
class DerivedTables:
    """Tables the runtime derives from a program on its first execution and keeps with it, so a
    program executed many times pays for them once. The compiler never fills them; each field has
    one owner that builds it (named below) and nothing else writes it."""

    record_layout: RecordLayout | None = None  # neuroncore.runtime.scheduler.record_layout
    static_columns: dict[str, dict[str, np.ndarray]] | None = None  # runtime.records._static_columns


@dataclass
class Program:
    """Everything the runtime needs to execute one compiled graph on one NeuronCore."""

    graph: Graph
    spec: CoreSpec
    # -- node columns (length n_nodes) -------------------------------------------------------
    resource: np.ndarray  # int8: RES_* ids
    engine: np.ndarray  # int8: Engine of the instruction (DMA: the queue's trigger engine)
    cost_ns: np.ndarray  # float64: engine-occupancy time (DMA: per-engine time of its share)
    queue: np.ndarray  # int16: DMA queue index, -1 for instructions
    dma_engines: np.ndarray  # int8: DMA engines a transfer is spread over (0 for instructions)
    dep_ptr: np.ndarray  # int64 CSR over dep_idx
    dep_idx: np.ndarray  # int32: earlier nodes this node waits for
    op_index: np.ndarray  # int32: IR op that produced the node (-1: none)
    opcode_id: np.ndarray  # int16 into ``opcodes``
    pc: np.ndarray  # int64: position in its engine's (or queue's) stream
    # the twelve counters (compiler.counters), read as the columns of the same names below
    counters: CounterColumns
    sem_increment: np.ndarray  # int16: semaphore the node increments on completion (-1: none)
    sem_value: np.ndarray  # int32: that semaphore's value after the increment
    trigger: np.ndarray  # int64: for DMA transfers, the node that triggered it (-1 otherwise)
    ports: np.ndarray  # int8 bit mask of on-chip memories an instruction touches: PORT_SBUF | PORT_PSUM
    # -- per-node Python data (not touched by the timing model) ------------------------------
    opcodes: list[str]
    operands: Sequence[str]  # made on first access (compiler.operand_texts)
    # (a CodedColumn from the compiler: per node, an index into the few distinct values)
    activation_fn: Sequence[str | None]
    tensor_instruction_type: Sequence[str | None]
    performance_mode: Sequence[str | None]
    # what the node computes, for the numerics interpreter (relocated layers' made on first access)
    semantics: Sequence[NodeSemantics]
    # -- tables ------------------------------------------------------------------------------
    buffers: Mapping[int, Buffer]  # a RelocatedBuffers when layers were relocated
    hbm_tensors: dict[str, HbmTensor]
    hbm_views: dict[str, HbmView]
    queues: list[DmaQueue]
    semaphore_names: dict[int, str]
    input_tensors: list[str]  # HBM tensor per graph parameter, in parameter order
    output_tensors: list[str]  # HBM tensor per graph output
    stats: dict[str, Any] = field(default_factory=dict)
    # per node: file:line of the NKI call that made it (NKI kernels only; empty for compiled graphs)
    nki_source_location: list[str | None] = field(default_factory=list)
    # True: each DMA queue spends the per-transfer fixed cost on one transfer at a time, so a queue
    # issues at most one transfer per ``dma_fixed_latency_ns`` (NKI kernels, whose every load and
    # store is its own transfer); False: the fixed cost is latency only (the compiler's programs)
    dma_queue_serial: bool = False
    derived: DerivedTables = field(default_factory=DerivedTables, init=False, repr=False, compare=False)

    @property
    def n_nodes(self) -> int:
        return int(self.resource.shape[0])

    # the counter columns, each made from ``counters`` when read (int32 where every value of the
    # program fits, else int64: read them widened before arithmetic that could pass 2^31; sums
    # widen by themselves)
    @property
    def raw_flops(self) -> np.ndarray:
        return self.counters.column("raw_flops")

    @property
    def adjusted_flops(self) -> np.ndarray:
        return self.counters.column("adjusted_flops")

    @property
    def transpose_flops(self) -> np.ndarray:
        return self.counters.column("transpose_flops")

    @property
    def hbm_read_bytes(self) -> np.ndarray:
        return self.counters.column("hbm_read_bytes")

    @property
    def hbm_write_bytes(self) -> np.ndarray:
        return self.counters.column("hbm_write_bytes")

    @property
    def sbuf_read_bytes(self) -> np.ndarray:
        return self.counters.column("sbuf_read_bytes")

    @property
    def sbuf_write_bytes(self) -> np.ndarray:
        return self.counters.column("sbuf_write_bytes")

    @property
    def psum_read_bytes(self) -> np.ndarray:
        return self.counters.column("psum_read_bytes")

    @property
    def psum_write_bytes(self) -> np.ndarray:
        return self.counters.column("psum_write_bytes")

    @property
    def spill_save_bytes(self) -> np.ndarray:
        return self.counters.column("spill_save_bytes")

    @property
    def spill_reload_bytes(self) -> np.ndarray:
        return self.counters.column("spill_reload_bytes")

    @property
    def dma_bytes(self) -> np.ndarray:
        """Bytes a DMA transfer moves (0 for instructions)."""
        return self.counters.column("dma_bytes")

    @property
    def n_instructions(self) -> int:
        """Engine instructions (not DMA transfers, not collectives)."""
        return int(np.count_nonzero(self.resource < RES_DMA))

    @property
    def collective_nodes(self) -> np.ndarray:
        """Nodes that are collectives, in program order."""
        return np.flatnonzero(self.resource == RES_CC)

    @property
    def n_dma_transfers(self) -> int:
        return int(np.count_nonzero(self.resource == RES_DMA))

    def deps(self, node: int) -> np.ndarray:
        return self.dep_idx[self.dep_ptr[node]:self.dep_ptr[node + 1]]

    def weight_bytes(self) -> int:
        return sum(t.nbytes for t in self.hbm_tensors.values() if t.kind is HbmTensorKind.WEIGHT)

    def hbm_bytes_by_kind(self) -> dict[str, int]:
        """Device memory the loaded program holds: weights, inputs, outputs and compiler scratch."""
        usage = {str(kind): 0 for kind in HbmTensorKind}
        for tensor in self.hbm_tensors.values():
            usage[tensor.kind] = usage.get(tensor.kind, 0) + tensor.nbytes
        if "scratch_peak_bytes" in self.stats:  # scratch is reused once its last reader ran
            usage[str(HbmTensorKind.SCRATCH)] = int(self.stats["scratch_peak_bytes"])
        return usage

    def engine_instruction_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        instr = self.resource < RES_DMA
        for engine in Engine:
            counts[engine.label] = int(np.count_nonzero(instr & (self.engine == int(engine))))
        counts["DMA"] = self.n_dma_transfers
        return counts
