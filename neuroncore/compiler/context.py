"""Where every value lives while the program is lowered: SBUF tiles, HBM tensors, spills and reloads.

A value (the result of one IR op) is stored as *tiles*. In ``row`` layout a tensor of shape
``(*batch, R, C)`` is ``prod(batch) x ceil(R/128)`` tiles of at most 128 partitions by ``C`` free
elements; in ``col`` layout a tensor of shape ``(*batch, R)`` is tiles of ``[rows, 1]`` (one value per
partition, the shape reductions produce and per-partition scalars consume). A value's *home* is SBUF
(tiles stay on chip until their last use) or HBM (produced through staging buffers and stored; large
values and graph outputs). When SBUF is full the tile whose next use is furthest away is spilled to
HBM and reloaded when needed, with the DMA traffic that costs.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from neuroncore.compiler import costs
from neuroncore.compiler.counters import NodeCounters, shared_counters
from neuroncore.compiler.emitter import (
    QUEUE_SEMAPHORE_BASE,
    WHOLE_BUFFER,
    WHOLE_TENSOR,
    Emitter,
    hbm_key,
    sbuf_key,
)
from neuroncore.compiler.errors import CompileError
from neuroncore.compiler.lowering_state import HbmTensorKind, Layout, QueueName
from neuroncore.compiler.memory import BankAllocator, DoubleFree, OutOfMemory, RangeAllocator
from neuroncore.compiler.node_semantics import Identity, Load, LoadKTiled, Memset, Store
from neuroncore.compiler.operand_texts import ref_text
from neuroncore.compiler.orientation import Orientation, stored_shape
from neuroncore.compiler.program import (
    ApRef,
    Buffer,
    DmaQueue,
    HbmAccess,
    HbmTensor,
    HbmView,
    MovedBuffers,
    Ref,
    raw_buffer,
)
from neuroncore.compiler.tiling import P, Tile, tile_grid, tiles_of
from neuroncore.compiler.view_steps import ApplyOp, Reshape
from neuroncore.dtypes import DType
from neuroncore.enums import DmaQueueType, Memory
from neuroncore.hardware import CoreSpec, Engine
from neuroncore.ir.graph import Graph, Op

_BUFFER_ID = operator.attrgetter("id")
NEVER_USED_AGAIN = 1 << 30  # next-use position of a value with no later use: the first to spill


@dataclass
class Value:
    """Placement state of one IR value."""

    op: Op
    layout: Layout
    home: Memory  # SBUF: tiles stay on chip until their last use; HBM: stored, read back in tiles
    tiles: list[Tile]
    cols: int
    rows_per_batch: int
    bufs: list[Buffer | None]
    hbm: str | None = None  # HBM tensor (or view) holding a valid copy of the tiles marked in_hbm
    in_hbm: list[bool] = field(default_factory=list)
    immediate: float | None = None  # scalar constants are folded into instructions
    # prepares a view's sources on first read; given the context rather than holding it, so that
    # a view never read leaves no reference cycle (context -> value -> closure -> context)
    lazy: Callable[[Context], None] | None = None
    alias: Op | None = None  # a reshape that reuses another value's tiles as they are
    pretransposed: bool = False  # weight stored with its last two dims swapped
    # an on-chip view (head split, broadcast of a tile): tile t is the block
    # (source tile, p0, p1, c0, c1) of ``slice_root``'s tiles, read in place; ``hbm_fallback``
    # declares the HBM view a consumer needing another layout reads instead
    slices: list[tuple[int, int, int, int, int]] | None = None
    slice_root: Op | None = None
    hbm_fallback: Callable[[Context], None] | None = None
    # feature-major (compiler.orientation): the tiles are the row tiles of ``[last dim, the rest]``
    transposed: bool = False
    # tiles of an SBUF-home value that could not be placed when produced (SBUF full of what the
    # producer itself holds, nothing left to spill): written through staging buffers to HBM, as
    # an HBM-home value's tiles are, and read back from there (``Context.produce``)
    staged: list[bool] = field(default_factory=list)

    @property
    def stored_shape(self) -> tuple[int, ...]:
        """The shape the tiles (and any HBM copy) hold: the transposed one when feature-major."""
        return stored_shape(self.op.shape) if self.transposed else self.op.shape

    def access(self, t: int, c0: int = 0, c1: int | None = None, view: str | None = None) -> HbmAccess:
        tile = self.tiles[t]
        assert self.hbm is not None
        return HbmAccess(self.hbm, tile.batch, tile.r0, tile.r1, c0, self.cols if c1 is None else c1,
                         self.layout, view)


@dataclass(frozen=True)
class SpillVictim:
    """A resident tile that could be spilled to make room, with the DMA traffic that costs."""

    value: Value
    t: int
    buf: Buffer
    save_bytes: int  # stored to HBM (0: a valid copy is there already)
    reload_bytes: int  # loaded back for a later reader (0: none) [an upper bound: a reader may
    # only read it through an HBM view, which reloads nothing]


# the compiler's queues in index order: (name, DMA queue type, trigger engine)
QUEUE_SPECS: list[tuple[QueueName, DmaQueueType, Engine]] = [
    (QueueName.IO, DmaQueueType.INPUT, Engine.SYNC),
    (QueueName.WEIGHT, DmaQueueType.DATA, Engine.SYNC),
    (QueueName.OUT, DmaQueueType.OUTPUT, Engine.SYNC),
    (QueueName.SPILL_RELOAD, DmaQueueType.DATA, Engine.SYNC),
    (QueueName.DATA, DmaQueueType.DATA, Engine.SYNC),
    (QueueName.DYNAMIC_SW, DmaQueueType.SOFTWARE_DYNAMIC, Engine.GPSIMD),
    (QueueName.RELOAD, DmaQueueType.DATA, Engine.GPSIMD),
    (QueueName.DATA_LOAD, DmaQueueType.DATA, Engine.GPSIMD),
]

# Loads of activations (spill reloads, relayouts, HBM-home values) are triggered from GpSimd, weight
# and input loads from Sync: two in-order trigger streams, so a weight load waiting for its SBUF
# range never holds up the activation a compute engine waits for, nor an activation load waiting
# for its producer the next weights (real profiles show reload queues triggered by compute engines,
# ``qScalarSpillReload0``, ``qGpSimdPIO0``: neuroncore.md §5.6; GpSimd is the engine these programs
# use least [assumption: which engine neuronx-cc picks is not public]).
ACTIVATION_LOAD_QUEUE = {QueueName.SPILL_RELOAD: QueueName.RELOAD, QueueName.DATA: QueueName.DATA_LOAD}

# The weight ring (``RangeAllocator.allocate``): the share of SBUF at its top that whole weights go
# round in load order [assumption: neuronx-cc allocates SBUF statically and streams weights through
# buffers of their own; the size it gives them is not public]. The ring is what the activations
# leave: a program whose activations' peak (``weight_ring.activation_peak_bytes``, from the graph)
# is over the rest of SBUF gets none, and the first buffer that still finds no room below it ends it
# (``RangeAllocator.end_ring``). A fixed half (the first version) took BERT-base b1 inference
# 1,289 -> 1,098 us but training's Llama-2-7B layer backward 14.5 -> 21.8 ms, and BERT/ResNet at
# batch 4-8 3-12 % slower: their activations overflowed into the half and the weights waited for
# them again at every lap. Set 0 for no ring.
WEIGHT_STREAM_FRACTION = 0.5


class Context:
    """Lowering state shared by the op lowerings: emitter, allocators, value placements."""

    def __init__(self, graph: Graph, spec: CoreSpec, *, hbm_home_fraction: float = 0.25) -> None:
        self.graph = graph
        self.spec = spec
        self.em = Emitter(spec)
        self.sbuf = RangeAllocator(spec.sbuf_bytes_per_partition, stream_fraction=WEIGHT_STREAM_FRACTION)
        self.psum = BankAllocator(spec.psum_banks)
        self.buffers: dict[int, Buffer] = {}
        # relocated layers' buffers but each run's last relocation's, made when read (layer_replay)
        self.relocated_buffers: list[MovedBuffers] = []
        # per buffer id, what its operand texts begin with (``ref_text``: the text prefix, the byte
        # address, the element size; -1 for a PSUM bank); a buffer never changes once made
        self._text_of: dict[int, tuple[str, int, int]] = {}
        self.hbm_tensors: dict[str, HbmTensor] = {}
        self.hbm_views: dict[str, HbmView] = {}
        self.values: dict[int, Value] = {}
        # values that may hold SBUF tiles, keyed by op index with their position in ``values``:
        # the spill victim search scans these, not every value ever placed (lazily pruned)
        self._holding: dict[int, int] = {}
        self._value_order: dict[int, int] = {}
        self.queues = [DmaQueue(i, str(name), qtype, eng, QUEUE_SEMAPHORE_BASE + i)
                       for i, (name, qtype, eng) in enumerate(QUEUE_SPECS)]
        self.queue: dict[str, DmaQueue] = {q.name: q for q in self.queues}  # + derived queues
        self.pinned: set[int] = set()  # buffer ids that must not be spilled right now
        # while a dot is lowered (``lower_matmul._blocks``): releases the operand blocks it holds
        # for double buffering, True if it held any; the last resort of :meth:`alloc`
        self.unbuffer: Callable[[], bool] | None = None
        self.uses: dict[int, list[int]] = {op.index: [] for op in graph.ops}
        for op in graph.ops:
            for operand in op.operands:
                self.uses[operand.index].append(op.index)
        self.outputs = {op.index for op in graph.outputs}
        self.hbm_home_bytes = int(spec.sbuf_bytes_per_partition * hbm_home_fraction)
        self.position = 0  # index of the op being lowered
        self.stats: dict[str, Any] = {"spill_save_bytes": 0, "spill_reload_bytes": 0, "spilled_tiles": 0}
        self._next_buffer = 0
        self._identity: Buffer | None = None
        self.kept_alive: dict[int, set[int]] = {}  # op index -> values whose tiles it reads lazily
        self.nki_locations: dict[int, str] = {}  # node -> file:line of the NKI call (kernels in models)
        self.lowered_with: dict[int, int] = {}  # op index -> the earlier op whose lowering made it
        # values over the quarter that stay in SBUF: their live set fits (compiler.residency)
        self.kept_large: frozenset[int] = frozenset()
        self.force_sbuf: set[int] = set()  # values internal to a fusion group (compiler.streaming)
        # which dots write feature-major and which values are stored so (compiler.orientation);
        # structural and fixed for the compilation
        self.orientation = Orientation.none()

    # -- buffers ---------------------------------------------------------------------------
    def alloc(self, partitions: int, free: int, dtype: DType, name: str, *, pin: bool = True,
              stream: bool = False) -> Buffer:
        """An SBUF buffer, spilling resident tiles until it fits; ``stream``: a block of the weight
        stream, placed in the weight ring (``RangeAllocator.allocate``).

        When nothing more can be spilled and a dot is being lowered, the operand blocks it holds
        from its previous k-block for double buffering are released (:attr:`unbuffer`: the dot
        goes on single-buffered) and the buffer is placed where they were; then, if the PE
        transposes' identity is what splits the room the buffer needs, it is given up and made
        again where there is room at its next use (:meth:`_remake_identity_elsewhere`)."""
        nbytes = free * dtype.itemsize
        if nbytes > self.spec.sbuf_bytes_per_partition:
            raise CompileError(
                f"cannot place {name}: {free} x {dtype.value} needs {nbytes} bytes per partition, "
                f"SBUF has {self.spec.sbuf_bytes_per_partition}",
                self.current_op,
            )
        while True:
            try:
                address, hazards = self.sbuf.allocate(nbytes, stream=stream)
                break
            except OutOfMemory:
                if (not self._spill_one(nbytes) and not (self.unbuffer is not None and self.unbuffer())
                        and not self._remake_identity_elsewhere(nbytes)):
                    raise CompileError(
                        f"cannot place {name}: needs {nbytes} bytes per partition but only "
                        f"{self.sbuf.largest_free()} are free and nothing more can be spilled "
                        f"(SBUF {self.spec.sbuf_bytes_per_partition} bytes per partition)",
                        self.current_op,
                    ) from None
        buf = _on_chip(self._next_buffer, Memory.SBUF, partitions, free, dtype, address, name)
        self._next_buffer += 1
        self.buffers[buf.id] = buf
        self.em.inherit(("buf", buf.id), WHOLE_BUFFER, hazards)
        if pin:
            self.pinned.add(buf.id)
        return buf

    def alloc_together(self, requests: list[tuple[int, int, DType, str]]) -> list[Buffer]:
        """SBUF buffers ``(partitions, free, dtype, name)`` an op takes at once before writing any
        (a softmax's or a norm's scratch), each pinned, in the order asked.

        They are placed in that order; if one finds no free range as wide once every tile that can
        be spilled was, those placed so far (nothing written in them yet) are given back and all
        are placed again largest first, the order a static allocator sizing them together uses
        (neuronx-cc's coloring allocator places a tile's buffers knowing their sizes, neuroncore.md
        §7.1; the dot planner's ``RangeAllocator.fits`` checks its buffers so too). Placed in the
        order asked, a small one lands where the rotating cursor is and may split the one free
        range the large one needed: Mistral-7B's decode step in bucket 16,384 (inf2 tp24) had its
        softmax's two 64-byte statistics at the bottom of the 64 KiB range its ``exp`` row (16,384
        FP32 per partition) needed, 65,408 bytes left, and the compile stopped. Buffers that fit in
        the order asked are placed as before. If they do not fit either way, none is left placed."""
        placed: list[Buffer] = []
        try:
            for partitions, free, dtype, name in requests:
                placed.append(self.alloc(partitions, free, dtype, name))
            return placed
        except CompileError:
            order = sorted(range(len(requests)), key=lambda i: -requests[i][1] * requests[i][2].itemsize)
            if not placed or order == list(range(len(requests))):
                for buf in placed:  # none of them is left placed: the caller may try others
                    self.free(buf)
                raise  # the order asked is already largest first, or the first found no room
        for buf in placed:
            self.free(buf)
        again: dict[int, Buffer] = {}
        try:
            for i in order:
                partitions, free, dtype, name = requests[i]
                again[i] = self.alloc(partitions, free, dtype, name)
        except CompileError:
            for buf in again.values():  # none of them is left placed: the caller may try others
                self.free(buf)
            raise
        self.stats["reordered_allocations"] = self.stats.get("reordered_allocations", 0) + 1
        return [again[i] for i in range(len(requests))]

    def free(self, buf: Buffer) -> None:
        nodes = self.em.forget(("buf", buf.id))
        self.pinned.discard(buf.id)
        if buf.memory is Memory.PSUM:
            self.psum.release(buf.address // (self.spec.psum_bank_bytes_per_partition), nodes)
            return
        try:
            self.sbuf.release(buf.address, buf.bytes_per_partition, nodes)
        except DoubleFree:
            raise CompileError(f"internal: {buf.name} freed twice (SBUF "
                               f"[{buf.address}, {buf.address + buf.bytes_per_partition}) is already "
                               f"free)", self.current_op) from None

    def alloc_psum(self, partitions: int, free: int, name: str) -> Buffer:
        bank, hazards = self.psum.allocate()
        buf = _on_chip(self._next_buffer, Memory.PSUM, partitions, free, DType.FP32,
                       bank * self.spec.psum_bank_bytes_per_partition, name)
        self._next_buffer += 1
        self.buffers[buf.id] = buf
        self.em.psum_keys.add(("buf", buf.id))
        # a bank's hazards are its previous occupant's ``forget``: already compact
        self.em.inherit(("buf", buf.id), WHOLE_BUFFER, hazards, compacted=True)
        return buf

    def unpin_all(self) -> None:
        self.pinned.clear()

    @property
    def current_op(self) -> Op | None:
        idx = self.em.current_op
        return self.graph.ops[idx] if idx >= 0 else None

    # -- HBM -------------------------------------------------------------------------------
    def hbm_tensor(self, name: str, op: Op, kind: HbmTensorKind, *, shape: tuple[int, ...] | None = None,
                   pretransposed: bool = False, dtype: DType | None = None) -> str:
        """Declare an HBM tensor holding ``op``'s value; ``dtype`` when it is stored in another type
        than the value's (an int8 weight read as bf16).

        Tensors are keyed by name (made from op names), so a name already declared for another op
        would make two values share one buffer and overwrite each other: that is refused, except
        for weights, which share the buffer of their label on purpose (a tied or re-read weight)
        when they agree in shape, type and layout (else each gets ``<name>@<op>``)."""
        existing = self.hbm_tensors.get(name)
        stored = shape if shape is not None else op.shape
        if existing is None:
            self.hbm_tensors[name] = HbmTensor(name, stored, dtype or op.dtype, kind, op.index,
                                               pretransposed)
        elif existing.op_index != op.index and not (
                existing.kind is HbmTensorKind.WEIGHT and kind is HbmTensorKind.WEIGHT):
            self._refuse_shared_name(name, self.graph.ops[existing.op_index], op)
        elif existing.op_index != op.index and (tuple(existing.shape), existing.dtype,
                                                existing.pretransposed) != (tuple(stored), dtype or op.dtype,
                                                                            pretransposed):
            # a weight of the label in another shape, type or layout is not the same tensor: one
            # of its own (reading the other's buffer was silently wrong, or a runtime error)
            return self.hbm_tensor(f"{name}@{op.name}", op, kind, shape=shape,
                                   pretransposed=pretransposed, dtype=dtype)
        return name

    def declare_view(self, view: HbmView, op: Op) -> str:
        """Declare ``view`` (named after ``op``) once; the same name declared again must describe
        the same relayout, else two ops of one name would read each other's view."""
        existing = self.hbm_views.get(view.name)
        if existing is None:
            self.hbm_views[view.name] = view
        elif existing != view:
            other = next((o for o in self.graph.ops if o.name == op.name and o is not op), op)
            self._refuse_shared_name(view.name, other, op)
        return view.name

    @staticmethod
    def _refuse_shared_name(name: str, first: Op, second: Op) -> None:
        raise CompileError(f"two values would share the HBM buffer {name!r} (op names must be unique): "
                           f"{first.describe()} and {second.describe()}")

    def view_sources(self, name: str) -> list[str]:
        """The stored HBM tensors a (possibly nested) view reads."""
        if name in self.hbm_tensors:
            return [name]
        out: list[str] = []
        for src in self.hbm_views[name].sources:
            out.extend(self.view_sources(src))
        return out

    def hbm_rects(self, access: HbmAccess, rows_per_batch: int) -> list:
        if access.tensor in self.hbm_views or access.view is not None or access.layout != Layout.ROW:
            names = self._concat_sources_read(access)
            if names is None:
                names = self.view_sources(access.tensor)
            return [(("hbm", n), WHOLE_TENSOR) for n in names]
        return [hbm_key(access, rows_per_batch)]

    def _concat_sources_read(self, access: HbmAccess) -> list[str] | None:
        """The stored tensors a row-layout load from a concatenate's HBM view reads: only the
        operands its rows and columns fall in (each whole), not all of them. A decode step's K and
        V are the cache concatenated with the new token's row; a load of cached rows does not wait
        for the new row's store (transformers-neuronx's decode attention reads the past cache and
        the new token's K/V as separate operands, "to remove the data dependency on an updated KV
        cache": docs/execution-core.md, "Long softmax rows and decode attention"). None: not
        such a load (every source, whole)."""
        view = self.hbm_views.get(access.tensor)
        if view is None or access.view is not None or access.layout != Layout.ROW or len(view.steps) != 1 \
                or not isinstance(view.steps[0], ApplyOp):
            return None
        op = self.graph.ops[view.steps[0].op_index]
        if op.opcode != "concatenate" or len(op.shape) < 2:
            return None
        dim, n = op.attrs["dimension"], len(op.shape)
        rows = op.shape[-2]
        f0, f1 = access.batch * rows + access.r0, access.batch * rows + access.r1  # flat rows
        if f1 <= f0:
            return None
        if dim == n - 1:
            lo, hi = access.c0, access.c1
        elif dim == n - 2:
            if f0 // rows != (f1 - 1) // rows:
                return None  # rows of more than one batch
            lo, hi = f0 % rows, (f1 - 1) % rows + 1
        else:
            if f0 // rows != (f1 - 1) // rows:
                return None
            lead = op.shape[:-2]
            b, index = f0 // rows, [0] * len(lead)
            for d in range(len(lead) - 1, -1, -1):
                b, index[d] = divmod(b, lead[d])
            lo, hi = index[dim], index[dim] + 1
        names: list[str] = []
        start = 0
        for operand, source in zip(op.operands, view.sources):
            end = start + operand.shape[dim]
            if start < hi and lo < end:
                names.extend(self.view_sources(source))
            start = end
        return names or None

    def dma_load(self, queue: QueueName, src: HbmAccess, dst: Ref, dtype: DType, *, rows_per_batch: int,
                 run_bytes: int | None = None, spill_reload: bool = False, text: str = "",
                 ktiles: int = 1) -> int:
        """HBM -> SBUF transfer of ``dst``'s rows; ``run_bytes`` is the contiguous run per descriptor.

        ``ktiles > 1`` loads rows [r0, r1) of a k-tiled weight: 128-row tiles side by side along
        the free dim, one contiguous run per partition (the layout the compiler stores weights in).
        """
        row_bytes = dst.cols * dtype.itemsize
        run = min(run_bytes or row_bytes, row_bytes)
        descriptors = dst.rows * max(1, row_bytes // max(run, 1))
        nbytes = (src.r1 - src.r0) * (src.c1 - src.c0) * dtype.itemsize if ktiles > 1 \
            else dst.rows * row_bytes
        # (raw, adjusted, transpose FLOPs, HBM read, write, SBUF read, write, PSUM read, write,
        # spill save, reload, DMA bytes): one record per size, shared (``shared_counters``)
        counters = shared_counters(0, 0, 0, nbytes, 0, 0, nbytes, 0, 0, 0,
                                   nbytes if spill_reload else 0, nbytes)
        if spill_reload:
            self.stats["spill_reload_bytes"] += nbytes
        q = self.queue[ACTIVATION_LOAD_QUEUE.get(queue, queue)]
        return self.em.dma(
            q,
            reads=self.hbm_rects(src, rows_per_batch),
            writes=[sbuf_key(dst)],
            engines=costs.dma_engines_used(self.spec, descriptors),
            engine_ns=costs.dma_engine_ns(self.spec, descriptors, nbytes // max(descriptors, 1)),
            trigger_cost_ns=self._trigger_ns(q),
            # in pieces, joined when read (operand_texts.Text)
            text=text or (src, " -> ", dst, f" {nbytes}B" if ktiles == 1 else f" {nbytes}B ktiles={ktiles}"),
            semantics=Load(dst, src) if ktiles == 1 else LoadKTiled(dst, src, ktiles),
            counters=counters,
        )

    def dma_store(self, queue: QueueName, src: Ref, dst: HbmAccess, dtype: DType, *, rows_per_batch: int,
                  spill_save: bool = False) -> int:
        row_bytes = src.cols * dtype.itemsize
        nbytes = src.rows * row_bytes
        if dst.layout == Layout.COL:
            descriptors = src.rows  # one element per partition row
        else:
            descriptors = src.rows
        counters = shared_counters(0, 0, 0, 0, nbytes, nbytes, 0, 0, 0,
                                   nbytes if spill_save else 0, 0, nbytes)
        if spill_save:
            self.stats["spill_save_bytes"] += nbytes
        q = self._store_queue(queue, src)
        return self.em.dma(
            q,
            reads=[sbuf_key(src)],
            writes=[self._store_rect(dst, rows_per_batch)],
            engines=costs.dma_engines_used(self.spec, descriptors),
            engine_ns=costs.dma_engine_ns(self.spec, descriptors, nbytes // max(descriptors, 1)),
            trigger_cost_ns=self._trigger_ns(q),
            text=(src, " -> ", dst, f" {nbytes}B"),  # joined when read (operand_texts.Text)
            semantics=Store(dst, src),
            counters=counters,
        )

    def _store_rect(self, dst: HbmAccess, rows_per_batch: int) -> tuple[Any, Any]:
        """The HBM region a store writes, for hazard tracking. A column-layout tile (``[rows, 1]``:
        a reduction's result, e.g. attention's row statistic per head) writes a run of the
        tensor's last dim: the same rectangle a row-layout access of those elements names, when
        the run lies in one row. Before, every such store claimed the whole tensor, so each
        waited for the previous one to land and stalled the engine that triggered it (a
        flash-attention forward's 256 per-head statistics in a row)."""
        tensor = self.hbm_tensors.get(dst.tensor)
        if dst.layout == Layout.ROW or dst.view is not None or tensor is None:
            return hbm_key(dst, rows_per_batch, whole=dst.layout != Layout.ROW)
        width = tensor.shape[-1] if tensor.shape else 1
        grid_rows = tile_grid(tensor.shape, Layout.COL)[1]
        first, end = dst.batch * grid_rows + dst.r0, dst.batch * grid_rows + dst.r1
        row = first // width
        if end <= first or (end - 1) // width != row:
            return hbm_key(dst, rows_per_batch, whole=True)
        return ("hbm", dst.tensor), (row, row + 1, first - row * width, end - row * width)

    def _store_queue(self, name: QueueName, src: Ref) -> DmaQueue:
        """Stores are triggered by the engine that produced the data, on that engine's queue.

        Triggering from Sync would make the in-order Sync stream wait for each result and hold up
        the loads queued behind it; compilers trigger write-backs from the producing engine.
        """
        writer = self.em.last_writer_engine(("buf", src.buf))
        if writer is None or writer in (Engine.SYNC, Engine.TENSOR):
            return self.queue[name]
        base = self.queue[name]
        derived = base.name.replace("Sync", writer.label, 1)
        if derived not in self.queue:
            queue = DmaQueue(len(self.queues), derived, base.queue_type, writer,
                             QUEUE_SEMAPHORE_BASE + len(self.queues))
            self.queues.append(queue)
            self.queue[derived] = queue
        return self.queue[derived]

    def _trigger_ns(self, queue: DmaQueue) -> float:
        return costs.cycles_to_ns(self.spec, queue.trigger_engine, self.spec.sync_instruction_cycles)

    # -- values ----------------------------------------------------------------------------
    def define(self, op: Op, *, layout: Layout = Layout.ROW, home: Memory | None = None,
               hbm: str | None = None) -> Value:
        """Create the placement of ``op``'s result (before its tiles are produced)."""
        layout = Layout(layout)  # a closed set: "row" from a caller not yet converted is Layout.ROW
        transposed = op.index in self.orientation.members
        shape = stored_shape(op.shape) if transposed else op.shape
        tiles = tiles_of(shape, layout)
        _, rows, cols = tile_grid(shape, layout)
        home = Memory(home) if home is not None else self.home_of(op, layout)
        value = Value(op, layout, home, tiles, cols, rows, [None] * len(tiles), hbm,
                      [hbm is not None] * len(tiles), transposed=transposed)
        if home is Memory.HBM and value.hbm is None:
            kind = HbmTensorKind.OUTPUT if op.index in self.outputs else HbmTensorKind.SCRATCH
            value.hbm = self.hbm_tensor(self.tensor_name(op), op, kind, shape=shape)
        self.values[op.index] = value
        self._value_order.setdefault(op.index, len(self._value_order))
        return value

    def home_of(self, op: Op, layout: Layout = Layout.ROW) -> Memory:
        """Where :meth:`define` places ``op``'s value when not told: HBM for a graph output read by
        nothing else and for a value over ``hbm_home_bytes`` per partition (unless the live set keeps
        it, ``compiler.residency``), else SBUF."""
        if op.index in self.force_sbuf:
            return Memory.SBUF  # read only inside its fusion group, one batch at a time
        shape = stored_shape(op.shape) if op.index in self.orientation.members else op.shape
        tiles = tiles_of(shape, layout)
        _, _, cols = tile_grid(shape, layout)
        per_partition = math.ceil(len(tiles)) * cols * op.dtype.itemsize
        only_output = op.index in self.outputs and not self.uses[op.index]
        large = per_partition > self.hbm_home_bytes and op.index not in self.kept_large
        return Memory.HBM if (only_output or large) else Memory.SBUF

    def tensor_name(self, op: Op) -> str:
        if op.index in self.outputs:
            return f"output{[o.index for o in self.graph.outputs].index(op.index)}.{op.name}"
        return f"{op.name}"

    def value(self, op: Op) -> Value:
        return self.values[op.index]

    def produce(self, op: Op, t: int, c0: int = 0, c1: int | None = None,
                rows: tuple[int, int] | None = None) -> Ref:
        """Where the producer writes columns [c0, c1) of partitions ``rows`` (default all) of tile
        ``t``. Staging buffers of HBM-home values keep the partitions, so copies stay aligned."""
        value = self.values[op.index]
        tile = value.tiles[t]
        c1 = value.cols if c1 is None else c1
        p0, p1 = rows if rows is not None else (0, tile.rows)
        if value.home is Memory.HBM:
            buf = self.alloc(p1, c1 - c0, op.dtype, f"{op.name}.stage{t}")
            return Ref(buf.id, p0, p1, 0, c1 - c0)
        resident = value.bufs[t]
        if resident is None and value.staged and value.staged[t]:
            return self._stage(value, t, c0, c1, p0, p1)
        if resident is None and value.in_hbm[t]:
            # spilled between its producer's column blocks (a producer unpins its tiles after each
            # block): the columns written so far come back before more are written, and the HBM
            # copy is stale from the first new write on (a later spill must store it again); with
            # no room to bring it back, the rest is written to that HBM copy as it is produced
            try:
                self.tile(op, t)
            except CompileError:
                return self._stage_from_now(value, t, c0, c1, p0, p1)
            resident = value.bufs[t]
            assert resident is not None
            value.in_hbm[t] = False
        if resident is None:
            try:
                resident = self.alloc(tile.rows, value.cols, op.dtype, f"{op.name}.t{t}")
            except CompileError:
                # every tile that could be spilled was, and the producer's own buffers (its blocks,
                # partial sums, the tiles it wrote already) leave no free range as wide as the
                # tile: the tile goes to HBM as it is written, a column range at a time
                return self._stage_from_now(value, t, c0, c1, p0, p1)
            value.bufs[t] = resident
            self._holding[op.index] = self._value_order[op.index]
        self.pinned.add(resident.id)
        return Ref(resident.id, p0, p1, c0, c1)

    def _stage_from_now(self, value: Value, t: int, c0: int, c1: int, p0: int, p1: int) -> Ref:
        """Tile ``t`` has no room in SBUF: it is staged (``Value.staged``) from this write on."""
        if not value.staged:
            value.staged = [False] * len(value.tiles)
        value.staged[t] = True
        self.stats["staged_tiles"] = self.stats.get("staged_tiles", 0) + 1
        return self._stage(value, t, c0, c1, p0, p1)

    def _stage(self, value: Value, t: int, c0: int, c1: int, p0: int, p1: int) -> Ref:
        """A staging buffer for columns [c0, c1) of tile ``t`` of a staged value (``Value.staged``):
        :meth:`produced` stores it to the value's HBM copy, a scratch tensor as a spill's. The tile
        is marked as in HBM from its first store on; nothing reads it before its producer ends."""
        op = value.op
        if value.hbm is None:
            value.hbm = self.hbm_tensor(f"spill.{op.name}", op, HbmTensorKind.SCRATCH,
                                        shape=value.stored_shape)
        buf = self.alloc(p1, c1 - c0, op.dtype, f"{op.name}.stage{t}")
        return Ref(buf.id, p0, p1, 0, c1 - c0)

    def produced(self, op: Op, t: int, ref: Ref, c0: int = 0, c1: int | None = None) -> None:
        """The producer finished writing ``ref``; HBM-home values store it and free the stage."""
        value = self.values[op.index]
        if value.home is not Memory.HBM and not (value.staged and value.staged[t]):
            return
        c1 = value.cols if c1 is None else c1
        queue = QueueName.OUT if op.index in self.outputs else QueueName.SPILL_RELOAD
        tile = value.tiles[t]
        access = HbmAccess(value.hbm or "", tile.batch, tile.r0 + ref.p0, tile.r0 + ref.p1, c0, c1,
                           value.layout)
        self.dma_store(queue, ref, access, op.dtype, rows_per_batch=value.rows_per_batch)
        value.in_hbm[t] = True
        self.free(self.buffers[ref.buf])

    def tile(self, op: Op, t: int, layout: Layout | None = None,
             cols: tuple[int, int] | None = None) -> Ref:
        """A readable SBUF ref to tile ``t`` of ``op``'s value, loading or reloading it if needed.

        Asking for a layout other than the value's own goes through HBM (store, then a strided load),
        which is what a relayout costs on the device. ``cols`` reads only a column range; a value
        that lives in HBM then loads just those columns. Temporary tiles are freed by ``release``.
        """
        value = self.values[op.index]
        if value.alias is not None and (layout is None or layout == value.layout):
            return self.tile(value.alias, t, cols=cols)
        if value.slices is not None and (layout is None or layout == value.layout):
            assert value.slice_root is not None
            st, p0, p1, c0, c1 = value.slices[t]
            ref = self.tile(value.slice_root, st)
            return _narrow(Ref(ref.buf, ref.p0 + p0, ref.p0 + p1, ref.f0 + c0, ref.f0 + c1), cols)
        self.prepare(value)
        if layout is not None and layout != value.layout:
            return _narrow(self._relayout_tile(value, t, layout), cols)
        buf = value.bufs[t]
        if buf is not None:
            self.pinned.add(buf.id)
            return _narrow(Ref(buf.id, 0, value.tiles[t].rows, 0, value.cols), cols)
        if value.immediate is not None:
            return self._splat_tile(value, t, cols)
        if not value.in_hbm[t]:
            raise CompileError(f"internal: tile {t} of {op.name} was never produced", self.current_op)
        tile = value.tiles[t]
        c0, c1 = cols if cols is not None and value.home is Memory.HBM else (0, value.cols)
        queue = self.load_queue(value)
        buf = self.alloc(tile.rows, c1 - c0, op.dtype, f"{op.name}.t{t}", stream=queue is QueueName.WEIGHT)
        ref = Ref(buf.id, 0, tile.rows, 0, c1 - c0)
        tensor = self.hbm_tensors.get(value.hbm or "")
        reload = tensor is not None and tensor.kind is HbmTensorKind.SCRATCH and value.home is Memory.SBUF
        self.dma_load(queue, value.access(t, c0, c1), ref, op.dtype,
                      rows_per_batch=value.rows_per_batch, run_bytes=self.run_bytes(value),
                      spill_reload=reload)
        if value.home is Memory.SBUF:
            value.bufs[t] = buf  # resident again; stays until its last use or a spill
            self._holding[op.index] = self._value_order[op.index]
            return _narrow(ref, cols)
        return ref

    def release(self, op: Op, ref: Ref) -> None:
        """Done reading a tile; temporaries (HBM-home values, relayouts) are freed.

        Only for a ref read since the last ``unpin_all``: an unpinned resident tile may be spilled
        (its buffer freed) and would then look like a temporary. A reader that keeps a ref longer
        asks :meth:`holds` when it takes the ref (``lower_matmul._Operand``)."""
        if not self.holds(op, ref):
            self.free(self.buffers[ref.buf])

    def holds(self, op: Op, ref: Ref) -> bool:
        """Whether ``ref`` (from :meth:`tile`) is a resident tile of ``op``'s value (or of the value
        it aliases or views), not a temporary its reader must free."""
        value = self.values[op.index]
        while value.alias is not None or value.slice_root is not None:
            source = value.alias if value.alias is not None else value.slice_root
            assert source is not None
            value = self.values[source.index]
        # the scan runs in C (a value may have thousands of tiles and an output copy asks once per
        # tile): the same test as ``any(b is not None and b.id == ref.buf for b in value.bufs)``
        return ref.buf in map(_BUFFER_ID, filter(None, value.bufs))

    def load_queue(self, value: Value) -> QueueName:
        """The queue that loads ``value``: by what its HBM tensor holds."""
        tensor = self.hbm_tensors.get(value.hbm or "")
        if tensor is None:
            return QueueName.DATA
        return {HbmTensorKind.INPUT: QueueName.IO, HbmTensorKind.WEIGHT: QueueName.WEIGHT,
                HbmTensorKind.SCRATCH: QueueName.SPILL_RELOAD}.get(tensor.kind, QueueName.DATA)

    def run_bytes(self, value: Value) -> int | None:
        """Contiguous bytes per descriptor when loading ``value`` (views may be strided)."""
        if value.hbm in self.hbm_views:
            return self.hbm_views[value.hbm].run_elements * value.op.dtype.itemsize
        if value.layout == Layout.COL:
            return value.op.dtype.itemsize
        return None

    def _splat_tile(self, value: Value, t: int, cols: tuple[int, int] | None = None) -> Ref:
        assert value.immediate is not None, "only scalar constants are splatted"
        tile = value.tiles[t]
        n = value.cols if cols is None else cols[1] - cols[0]
        buf = self.alloc(tile.rows, n, value.op.dtype, f"{value.op.name}.splat{t}")
        ref = Ref(buf.id, 0, tile.rows, 0, n)
        self.em.instruction(
            Engine.VECTOR, "MEMSET",
            costs.cycles_to_ns(self.spec, Engine.VECTOR, costs.vector_cycles(self.spec, "memset", n)),
            reads=[], writes=[sbuf_key(ref)],
            text=f"value={value.immediate:g} dst={self.ref_text(ref)}",
            semantics=Memset(ref, float(value.immediate)),
            counters=NodeCounters(sbuf_write_bytes=tile.rows * n * value.op.dtype.itemsize),
        )
        return ref

    def ensure_hbm(self, op: Op) -> str:
        """Make sure every tile of ``op``'s value has a copy in HBM; returns the tensor name."""
        value = self.values[op.index]
        if value.alias is not None:
            return self._alias_hbm(value)
        if value.slices is not None:  # an on-chip view: its HBM copy is the view of its sources
            fallback, value.hbm_fallback = value.hbm_fallback, None
            if fallback is not None:
                fallback(self)
            assert value.hbm is not None
            return value.hbm
        self.prepare(value)
        if value.immediate is not None and value.hbm is None:
            # materialise the splat once so views of it can be loaded
            value.hbm = self.hbm_tensor(f"{op.name}.splat", op, HbmTensorKind.SCRATCH)
            for t in range(len(value.tiles)):
                ref = self._splat_tile(value, t)
                self.dma_store(QueueName.DATA, ref, value.access(t), op.dtype,
                               rows_per_batch=value.rows_per_batch)
                self.free(self.buffers[ref.buf])
                value.in_hbm[t] = True
            return value.hbm
        if value.home is Memory.HBM and value.hbm is not None:
            return value.hbm  # produced into HBM tile by tile (maybe not all yet: a fusion group)
        if value.hbm is None:
            value.hbm = self.hbm_tensor(f"{op.name}.hbm", op, HbmTensorKind.SCRATCH,
                                        shape=value.stored_shape)
        for t, done in enumerate(value.in_hbm):
            if not done:
                buf = value.bufs[t]
                assert buf is not None, f"tile {t} of {op.name} is nowhere"
                ref = Ref(buf.id, 0, value.tiles[t].rows, 0, value.cols)
                self.dma_store(QueueName.DATA, ref, value.access(t), op.dtype,
                               rows_per_batch=value.rows_per_batch)
                value.in_hbm[t] = True
        return value.hbm

    def _alias_hbm(self, value: Value) -> str:
        """An alias's HBM copy is its source's copy read through a reshape view."""
        assert value.alias is not None
        source = self.ensure_hbm(value.alias)
        return self.declare_view(HbmView(f"{value.op.name}.view", (Reshape(value.op.shape),), (source,),
                                         value.op.shape, value.op.dtype, value.cols), value.op)

    def extend_uses(self, source: Op, alias: Op) -> None:
        """Keep ``source`` alive for as long as ``alias`` (which reads its tiles) is used.

        If ``source`` itself only reads its own sources when first loaded (an alias, or a view not
        yet materialised), those must stay alive as long too: the extension is transitive.
        """
        merged = sorted(set(self.uses[source.index]) | set(self.uses[alias.index]))
        self.uses[source.index] = merged
        self.kept_alive.setdefault(alias.index, set()).add(source.index)
        value = self.values.get(source.index)
        if value is not None and value.alias is not None:
            self.extend_uses(value.alias, alias)
        elif value is not None and value.slice_root is not None:
            self.extend_uses(value.slice_root, alias)
        elif value is not None and value.lazy is not None:
            for upstream in source.operands:
                self.extend_uses(upstream, alias)

    def prepare(self, value: Value) -> None:
        if value.lazy is not None:
            lazy, value.lazy = value.lazy, None
            lazy(self)

    def _relayout_tile(self, value: Value, t: int, layout: Layout) -> Ref:
        name = self.ensure_hbm(value.op)
        op = value.op
        tiles = tiles_of(op.shape, layout)
        _, rows, cols = tile_grid(op.shape, layout)
        tile = tiles[t]
        buf = self.alloc(tile.rows, cols, op.dtype, f"{op.name}.{layout}{t}")
        ref = Ref(buf.id, 0, tile.rows, 0, cols)
        src = HbmAccess(name, tile.batch, tile.r0, tile.r1, 0, cols, layout)
        run = op.dtype.itemsize if layout == Layout.COL else None
        self.dma_load(QueueName.DATA, src, ref, op.dtype, rows_per_batch=rows, run_bytes=run)
        return ref

    def finish(self, op: Op) -> None:
        """Free the tiles of values whose last use was ``op``."""
        candidates = {o.index: o for o in op.operands}
        pending = list(candidates.values())
        while pending:  # and every value an operand keeps alive (alias sources, view sources)
            operand = pending.pop()
            for index in self.kept_alive.get(operand.index, ()):
                if index not in candidates:
                    candidates[index] = self.graph.ops[index]
                    pending.append(self.graph.ops[index])
            value = self.values.get(operand.index)
            if value is not None and value.alias is not None and value.alias.index not in candidates:
                candidates[value.alias.index] = value.alias
                pending.append(value.alias)
            root = value.slice_root if value is not None else None
            if root is not None and root.index not in candidates:
                candidates[root.index] = root
                pending.append(root)
        for operand in candidates.values():
            if self.uses[operand.index] and self.uses[operand.index][-1] <= op.index:
                self.drop(operand)
        if not self.uses[op.index] and op.index not in self.outputs:
            self.drop(op)

    def drop(self, op: Op) -> None:
        value = self.values.get(op.index)
        if value is None or value.alias is not None or value.slices is not None:
            return
        for t, buf in enumerate(value.bufs):
            if buf is not None:
                self.free(buf)
                value.bufs[t] = None
        self._holding.pop(op.index, None)  # holds nothing now: no spill search looks at it

    # -- spilling --------------------------------------------------------------------------
    def _next_use(self, op_index: int) -> int:
        for use in self.uses[op_index]:
            if use > self.position:
                return use
        return NEVER_USED_AGAIN

    def _spill_one(self, needed: int) -> bool:
        """Spill the resident tile used furthest in the future (Belady); False if none can go.

        The victim is the unpinned tile with the greatest (next use, bytes), the first in value
        order (``_holding``) and tile order on ties. Every tile of a value has the value's next use,
        so values are ranked by it first and only the tiles of the furthest-used values are looked
        at: a spill no longer walks every resident tile (thousands in a long-sequence layer)."""
        by_use: dict[int, list[int]] = {}
        for index in sorted(self._holding, key=self._holding.__getitem__):
            by_use.setdefault(self._next_use(index), []).append(index)
        best: tuple[int, int, Value, int] | None = None
        pinned = self.pinned
        for next_use in sorted(by_use, reverse=True):
            for index in by_use[next_use]:
                value = self.values[index]
                resident = False
                last: tuple[int, DType, int] | None = None  # (free, dtype, bytes) of the tile before
                for t, buf in enumerate(value.bufs):
                    if buf is None:
                        continue
                    resident = True
                    if buf.id in pinned:
                        continue
                    if last is None or buf.free != last[0] or buf.dtype is not last[1]:
                        last = (buf.free, buf.dtype, buf.bytes_per_partition)
                    if best is None or last[2] > best[1]:
                        best = (next_use, last[2], value, t)
                if not resident:
                    del self._holding[index]
            if best is not None:
                break
        if best is None:
            return False
        _, _, value, t = best
        self._spill_tile(value, t)
        return True

    def spill_victims(self, keep: set[int]) -> list[SpillVictim]:
        """The resident tiles that could be spilled now, in the order :meth:`_spill_one` takes
        them (furthest next use first, then larger, then value and tile order), leaving out pinned
        tiles and the values in ``keep`` (op indices: what the caller is about to read)."""
        order = self._holding
        victims: list[tuple[tuple[int, int, int, int], SpillVictim]] = []
        for index in list(order):
            if index in keep:
                continue
            value = self.values[index]
            next_use = self._next_use(index)
            for t, buf in enumerate(value.bufs):
                if buf is None or buf.id in self.pinned:
                    continue
                nbytes = value.tiles[t].rows * value.cols * value.op.dtype.itemsize
                victim = SpillVictim(value, t, buf, 0 if value.in_hbm[t] else nbytes,
                                     nbytes if next_use != NEVER_USED_AGAIN else 0)
                victims.append(((-next_use, -buf.bytes_per_partition, order[index], t), victim))
        victims.sort(key=lambda item: item[0])
        return [victim for _, victim in victims]

    def make_room(self, sizes: list[int], victims: list[SpillVictim]) -> int:
        """Spill ``victims`` (from :meth:`spill_victims`) in order until buffers of ``sizes`` fit
        in SBUF at once; returns how many were spilled. A dot lowering uses it when its planner
        found a bigger block worth the spill traffic (``lower_matmul.plan_blocks``)."""
        spilled = 0
        for victim in victims:
            if self.sbuf.fits(sizes):
                break
            if victim.value.bufs[victim.t] is not victim.buf or victim.buf.id in self.pinned:
                continue  # spilled or pinned since the list was made
            self._spill_tile(victim.value, victim.t)
            spilled += 1
        self.stats["plan_spilled_tiles"] = self.stats.get("plan_spilled_tiles", 0) + spilled
        return spilled

    def _spill_tile(self, value: Value, t: int) -> None:
        """Free tile ``t`` of ``value``, storing it to HBM first unless a copy is there already."""
        buf = value.bufs[t]
        assert buf is not None
        if not value.in_hbm[t]:
            if value.hbm is None:
                value.hbm = self.hbm_tensor(f"spill.{value.op.name}", value.op, HbmTensorKind.SCRATCH,
                                            shape=value.stored_shape)
            ref = Ref(buf.id, 0, value.tiles[t].rows, 0, value.cols)
            self.dma_store(QueueName.SPILL_RELOAD, ref, value.access(t), value.op.dtype,
                           rows_per_batch=value.rows_per_batch, spill_save=True)
            value.in_hbm[t] = True
            self.stats["spilled_tiles"] += 1
        value.bufs[t] = None
        self.free(buf)

    # -- shared constants ------------------------------------------------------------------
    def _remake_identity_elsewhere(self, nbytes: int) -> bool:
        """Free the identity (not in use now) when that makes room for ``nbytes``; it is made again
        (one ``IOTA``) where there is room when a transpose next needs it. It is made once, at the
        rotating cursor of the first transpose, and kept: a 256-byte range that no spill could
        free. Mistral-7B's b4 decode step in bucket 16,384 (inf2 tp24): its softmax's 64 KiB
        ``exp`` row found 65,792 bytes in use and no free range over 54,464, the identity sitting
        between two free ranges that together held it. A constant the compiler can regenerate is
        made again rather than kept in the way (rematerialised, not spilled)."""
        ident = self._identity
        if ident is None or ident.id in self.pinned or not self.sbuf.fits_freeing(
                [nbytes], [(ident.address, ident.bytes_per_partition)]):
            return False
        self._identity = None
        self.free(ident)
        self.stats["identity_remade"] = self.stats.get("identity_remade", 0) + 1
        return True

    def identity(self, dtype: DType) -> Ref:
        """A 128x128 identity in SBUF for PE transposes, made once by GpSimd (iota + compare)."""
        if self._identity is None:
            buf = self.alloc(P, P, DType.BF16, "identity", pin=False)
            ref = Ref(buf.id, 0, P, 0, P)
            self.em.instruction(
                Engine.GPSIMD, "IOTA",
                costs.cycles_to_ns(self.spec, Engine.GPSIMD, costs.gpsimd_cycles(self.spec, P)),
                reads=[], writes=[sbuf_key(ref)], text=f"identity dst={self.ref_text(ref)}",
                semantics=Identity(ref), counters=NodeCounters(sbuf_write_bytes=P * P * 2),
            )
            self._identity = buf
        self.pinned.add(self._identity.id)
        return Ref(self._identity.id, 0, P, 0, P)

    # -- text ------------------------------------------------------------------------------
    def ref_text(self, ref: Ref | ApRef) -> str:
        """``ref``'s operand text now (a lowering that gives its text in pieces leaves it to
        ``operand_texts.RefTexts`` when the text is read)."""
        return ref_text(ref, self.buffers, self._text_of, self.spec.psum_bank_bytes_per_partition)


# ``Buffer(*values)`` for the allocator's own buffers (``memory`` a Memory member, SBUF or PSUM):
# the slots set directly, without the constructor's check and normalisation of a caller's
# ``memory`` (most of its cost, and made for every allocation)
_on_chip: Callable[..., Buffer] = raw_buffer


def _narrow(ref: Ref, cols: tuple[int, int] | None) -> Ref:
    if cols is None:
        return ref
    return Ref(ref.buf, ref.p0, ref.p1, ref.f0 + cols[0], ref.f0 + cols[1])
