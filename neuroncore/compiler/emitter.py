"""Emits nodes (instructions and DMA transfers) and derives their dependencies from memory accesses.

Lowering code says *what* an instruction reads and writes; the emitter works out *who it must wait
for* (read-after-write, write-after-read, write-after-write on overlapping SBUF/PSUM/HBM ranges) and,
when the program is finished, turns every cross-engine wait into a semaphore: the producer's engine
(or DMA queue) semaphore is incremented on completion and the consumer waits for ``$S[n]>=v``.
Same-engine order needs no semaphore: each engine runs its stream in order.
"""

from __future__ import annotations

import bisect
import itertools
from array import array
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from operator import itemgetter
from typing import Any

import numpy as np

from neuroncore.compiler.counters import COUNTER_NAMES, NO_COUNTERS, NodeCounters, counter_values
from neuroncore.compiler.lazy_semantics import RelocatedSemantics
from neuroncore.compiler.node_semantics import NOP, SEMANTIC_KINDS, NodeSemantics, check_semantics
from neuroncore.compiler.operand_texts import OperandTexts, RefTexts, RenderedTexts, Text
from neuroncore.compiler.program import (
    PORT_PSUM,
    PORT_SBUF,
    RES_CC,
    RES_DMA,
    RES_TENSOR_LS,
    RES_TENSOR_MM,
    ApRef,
    CodedColumn,
    CounterColumns,
    DmaQueue,
    HbmAccess,
    Ref,
)
from neuroncore.compiler.stream_counts import semaphore_values
from neuroncore.compiler.tiling import P
from neuroncore.hardware import CoreSpec, Engine

# One semaphore per engine (ids 0-4), then one per DMA queue from QUEUE_SEMAPHORE_BASE.
QUEUE_SEMAPHORE_BASE = 8
CC_SEMAPHORE = 5  # the CC-core signals collective completion on its own semaphore
DMA_COMPLETION_INCREMENT = 16  # every DMA engine signals completion of its share (§5.2)

# In-order lanes: nodes of one lane run one after another, so a node never waits for an earlier
# node of its own lane through a semaphore. A lane is also a stream whose nodes are numbered by
# ``Program.pc``. Engines (and the Tensor engine's MultiplyMoving track) are lanes 0-5, by resource id.
CC_LANE = 50  # collectives: the CC-core runs them one after another
QUEUE_LANE_BASE = 100  # DMA queue q is lane QUEUE_LANE_BASE + q (transfers of a queue complete in order)


def queue_lane(queue: DmaQueue) -> int:
    """The in-order lane of a DMA queue's transfers."""
    return QUEUE_LANE_BASE + queue.index


# One recorded access: (a0, a1, b0, b1, node, lane, write) -- a plain tuple, because the emitter makes
# and scans one per operand of every node and a tuple is the cheapest record Python has. The rectangle
# is partitions (or rows) [a0, a1) x free elements (or cols) [b0, b1); ``lane`` is the accessing
# node's in-order lane (engine, CC_LANE, or queue_lane(queue)).
_Access = tuple[int, int, int, int, int, int, bool]
_NODE, _LANE, _WRITE = 4, 5, 6


_NO_AREA = 1 << 200  # larger than any rectangle's area (HBM whole-tensor ranges are 2^62 wide)


class _Accesses:
    """One memory key's recorded accesses: its writes (``w``, in the order recorded) and its reads
    (``r``, by rectangle and lane, in the order recorded).

    A read's hazards are writes only (three in four recorded accesses are reads), so a read scans
    ``w`` alone. A read hides the reads of its lane it covers: nearly always the same rectangle
    read again (a LoadStationary of the same tile for the next bank group), found in ``r`` by its
    key. ``small`` is at most the smallest area in ``r``: a read no larger than that can cover only
    reads of its own rectangle, so only one lookup is needed; a larger read scans its lane's reads.
    ``small`` is -1 when two reads share a key (lists relocated or aged by ``layer_state`` and
    ``layer_boundary`` can hold such pairs): then every read scans. Hazards are sets, so how the
    two kinds interleave never mattered.

    ``ix`` is an :class:`_Index` of the entries by area, kept for HBM keys with many entries (an
    output tensor stored tile by tile, a view read by thousands of loads), so that a node looks at
    the entries near its rectangle instead of all of them; None until such a key grows, and again
    whenever a list is rebuilt (made anew from the lists when next needed).

    ``b`` holds the nodes of the writes a new buffer inherits from its range's earlier users
    (``inherit``: ``WHOLE_BUFFER`` writes recorded before any other access of the key), ``bl``
    their lanes (the same order); the entries themselves are made only when the key is iterated
    (a new buffer's ~10 inherited tuples were made per allocation and rarely read). Only a
    whole-buffer write covers them, and every access of the buffer overlaps them, so they are not
    scanned: an access on lane L waits for all of them but L's, which ``Emitter._hazards`` takes
    as each lane's latest (``bn``: per lane L, made on first use, ``base_map``). That is the set
    of nodes a scan finds (~40 % of the entries a decode's scans visited). ``bs``: ``b`` is
    ascending (as ``compact`` leaves it), so the latest node per lane is the last one
    (``Emitter._latest``).

    Iterating gives the inherited writes, the other writes, then the reads: the lists other modules
    see and put back as plain lists in that order (the emitter adopts such a list on first use,
    ``Emitter._adopt``)."""

    __slots__ = ("b", "bl", "bn", "bs", "cx", "ix", "r", "small", "w")

    def __init__(self, w: list[_Access], r: dict[tuple[int, ...], _Access], small: int,
                 b: tuple[int, ...] = (), bl: tuple[int, ...] = (), bs: bool = True) -> None:
        self.w = w
        self.r = r
        self.small = small
        self.ix: _Index | None = None
        self.cx: _Columns | None = None
        self.b = b
        self.bl = bl
        self.bs = bs
        self.bn: dict[int, dict[int, int]] | None = None

    def inherited(self) -> Iterator[_Access]:
        """The inherited writes as recorded accesses."""
        return ((0, _WB_ROWS, 0, _WB_COLS, node, lane, True) for node, lane in zip(self.b, self.bl))

    def __iter__(self) -> Iterator[_Access]:
        if self.b:
            return itertools.chain(self.inherited(), self.w, self.r.values())
        return itertools.chain(self.w, self.r.values())

    def __len__(self) -> int:
        return len(self.b) + len(self.w) + len(self.r)

    def base(self, lane: int) -> list[int]:
        """The inherited writes' nodes a node on ``lane`` waits for (all but its own lane's)."""
        return [node for node, other in zip(self.b, self.bl) if other != lane]

    def base_map(self, lane: int, after: dict[int, int], pending: list[int],
                 lanes: Sequence[int]) -> dict[int, int] | None:
        """``base(lane)`` as the node's dependencies take it: each node, or the MultiplyMoving
        after it if it is a LoadStationary (``after``), the latest per lane (``lanes``). Kept per
        lane (``bn``): once made it never changes (a node leaves ``pending`` only to be mapped, and
        new nodes are never in ``b``). None, and not kept, while one of them is in ``pending`` (a
        LoadStationary with no MultiplyMoving yet: mapped later)."""
        latest: dict[int, int] = {}
        get = latest.get
        for node, other in zip(self.b, self.bl):
            if other == lane:
                continue
            moved = after.get(node)
            if moved is not None:
                node = moved
            elif pending and node in pending:
                return None
            other = lanes[node]
            if get(other, -1) < node:
                latest[other] = node
        bn = self.bn
        if bn is None:
            bn = self.bn = {}
        bn[lane] = latest
        return latest

    def columns(self) -> _Columns:
        """The column index of the writes (made now if there is none)."""
        cx = self.cx
        if cx is None:
            cx = self.cx = _Columns(self.w)
        return cx

    def index(self) -> _Index:
        """The area index of the current lists (made now if there is none)."""
        ix = self.ix
        if ix is None:
            ix = self.ix = _Index(self)
        return ix

    def live_read(self, x: _Access) -> bool:
        """Whether read entry ``x`` is still in ``r`` (an index keeps a read its rectangle's next
        read replaced: ``Emitter._record``)."""
        r = self.r
        return r.get(x[:4] + x[5:6]) is x or r.get(x[:6]) is x


COLUMNS_MIN = 24  # an on-chip key's writes get a column index once it holds this many


class _Columns:
    """An on-chip key's writes in order of their first column (``y0``; ties in the order
    recorded), with the widest one's width: a write overlapping columns ``[b0, b1)`` starts in
    ``(b0 - widest, b1)``, a write inside them in ``[b0, b1]``, each found by two bisections.

    A long prompt's transposed operands are written as one 128-column block per PE transpose and
    read block by block (a LoadStationary or MultiplyMoving of one 128- or 512-column slice), so a
    read scanned all ~128-256 writes of its buffer to find the one or four it overlaps. Kept in
    step with ``_Accesses.w``: a new write is inserted, a list rebuilt (a covering write) drops
    the index (made again when next needed). Only which entries are looked at changes: each is
    tested as in a scan, so the hazards found are the same set."""

    __slots__ = ("entries", "starts", "widest")

    def __init__(self, writes: list[_Access]) -> None:
        self.entries = sorted(writes, key=_FIRST_COLUMN)
        self.starts = [x[2] for x in self.entries]
        self.widest = max((x[3] - x[2] for x in writes), default=0)

    def add(self, x: _Access) -> None:
        i = bisect.bisect_right(self.starts, x[2])
        self.starts.insert(i, x[2])
        self.entries.insert(i, x)
        if x[3] - x[2] > self.widest:
            self.widest = x[3] - x[2]

    def overlapping(self, b0: int, b1: int) -> list[_Access]:
        """The writes that may overlap columns ``[b0, b1)`` (a superset: rows and lanes untested)."""
        starts = self.starts
        return self.entries[bisect.bisect_right(starts, b0 - self.widest):bisect.bisect_left(starts, b1)]

    def inside(self, b0: int, b1: int) -> list[_Access]:
        """The writes that may lie inside columns ``[b0, b1]`` (a superset)."""
        starts = self.starts
        return self.entries[bisect.bisect_left(starts, b0):bisect.bisect_right(starts, b1)]


_FIRST_COLUMN = itemgetter(2)


INDEX_MIN = 48  # an HBM key gets an area index once it holds this many entries
_CELL_ROWS, _CELL_COLS = 128, 512  # an index cell: rows (partitions) x columns (elements)
_MAX_CELLS = 16  # an entry (or a query) over more cells than this is "wide": scanned, not indexed


def _cells(a0: int, a1: int, b0: int, b1: int) -> list[tuple[int, int]] | None:
    """The index cells a rectangle touches, or None if it is wide (or empty)."""
    if a1 <= a0 or b1 <= b0:
        return None
    r0, r1 = a0 // _CELL_ROWS, (a1 - 1) // _CELL_ROWS + 1
    c0, c1 = b0 // _CELL_COLS, (b1 - 1) // _CELL_COLS + 1
    if (r1 - r0) * (c1 - c0) > _MAX_CELLS:
        return None
    return [(i, j) for i in range(r0, r1) for j in range(c0, c1)]


class _Index:
    """A key's entries by the cells of a grid they touch (writes and reads apart; an entry over
    more than ``_MAX_CELLS`` cells in a list of wide ones), and the latest node per lane of each
    kind: a whole-tensor access overlaps every entry, and of those only each lane's latest
    survives ``Emitter.compact``.

    Entries leave ``w`` and ``r`` only when a list is rebuilt (an access covering them) or, for a
    read, when the same rectangle is read again on its lane; the index keeps them in their cells, so
    candidates are checked: a write against ``dead`` (the ids of removed writes: the index holds
    them, so no id is reused meanwhile), a read against ``r`` itself (``_Accesses.live_read``).
    The lane summaries are remade from the lists after a removal. When the removed entries
    outnumber the live ones the index is dropped and made anew when next needed."""

    __slots__ = ("dead", "odd", "rc", "rlast", "rw", "stale", "wc", "wlast", "ww")

    def __init__(self, accesses: _Accesses) -> None:
        self.wc: dict[tuple[int, int], list[_Access]] = {}
        self.ww: list[_Access] = []
        self.rc: dict[tuple[int, int], list[_Access]] = {}
        self.rw: list[_Access] = []
        self.wlast: dict[int, int] | None = {}
        self.rlast: dict[int, int] | None = {}
        self.dead: set[int] = set()
        self.stale = 0
        self.odd = False  # an entry a whole-tensor access might not overlap (empty, or at 2^62)
        for x in accesses.w:
            self.add_write(x)
        for x in accesses.r.values():
            self.add_read(x)

    def _place(self, x: _Access, table: dict[tuple[int, int], list[_Access]], wide: list[_Access]) -> None:
        x0, x1, y0, y1 = x[0], x[1], x[2], x[3]
        if not (x0 < _WHOLE_END and x1 > 0 and y0 < _WHOLE_END and y1 > 0):
            self.odd = True
        cells = _cells(x0, x1, y0, y1)
        if cells is None:
            wide.append(x)
            return
        for c in cells:
            bucket = table.get(c)
            if bucket is None:
                table[c] = [x]
            else:
                bucket.append(x)

    def add_write(self, x: _Access) -> None:
        self._place(x, self.wc, self.ww)
        last = self.wlast
        if last is not None and last.get(x[_LANE], -1) < x[_NODE]:
            last[x[_LANE]] = x[_NODE]

    def add_read(self, x: _Access) -> None:
        self._place(x, self.rc, self.rw)
        last = self.rlast
        if last is not None and last.get(x[_LANE], -1) < x[_NODE]:
            last[x[_LANE]] = x[_NODE]

    @staticmethod
    def near(cells: list[tuple[int, int]], table: dict[tuple[int, int], list[_Access]],
             wide: list[_Access]) -> Iterator[_Access]:
        """Entries of ``table`` in ``cells``, then the wide ones (an entry may come more than once)."""
        get = table.get
        for c in cells:
            bucket = get(c)
            if bucket:
                yield from bucket
        yield from wide

    @staticmethod
    def latest(entries: Iterable[_Access]) -> dict[int, int]:
        last: dict[int, int] = {}
        for x in entries:
            if last.get(x[_LANE], -1) < x[_NODE]:
                last[x[_LANE]] = x[_NODE]
        return last


_WHOLE_END = 1 << 62


def _near_hazards(accesses: _Accesses, ix: _Index, lane: int, rect: Rect, add: Callable[[int], None],
                  with_reads: bool) -> bool:
    """``Emitter._hazards`` for one indexed key: the writes (and with ``with_reads`` the reads)
    near ``rect`` that overlap it, on other lanes. False if the index cannot answer (a wide
    rectangle that is not the whole tensor): the caller scans the lists."""
    a0, a1, b0, b1 = rect
    cells = _cells(a0, a1, b0, b1)
    if cells is None:
        if rect != WHOLE_TENSOR or ix.odd:
            return False
        wlast = ix.wlast
        if wlast is None:
            wlast = ix.wlast = _Index.latest(accesses.w)
        rlast = None
        if with_reads:
            rlast = ix.rlast
            if rlast is None:
                rlast = ix.rlast = _Index.latest(accesses.r.values())
        if _LS_LANE in wlast or (rlast is not None and _LS_LANE in rlast):
            return False
        for other, node in wlast.items():
            if other != lane:
                add(node)
        if rlast is not None:
            for other, node in rlast.items():
                if other != lane:
                    add(node)
        return True
    dead = ix.dead
    if dead:
        for x in ix.near(cells, ix.wc, ix.ww):
            x0, x1, y0, y1, node, other, _ = x
            if other != lane and x0 < a1 and a0 < x1 and y0 < b1 and b0 < y1 and id(x) not in dead:
                add(node)
    else:
        for x0, x1, y0, y1, node, other, _ in ix.near(cells, ix.wc, ix.ww):
            if other != lane and x0 < a1 and a0 < x1 and y0 < b1 and b0 < y1:
                add(node)
    if with_reads:
        live = accesses.live_read
        for x in ix.near(cells, ix.rc, ix.rw):
            x0, x1, y0, y1, node, other, _ = x
            if other != lane and x0 < a1 and a0 < x1 and y0 < b1 and b0 < y1 and live(x):
                add(node)
    return True


_LS_LANE = RES_TENSOR_LS


def _reads_of(entries: Iterable[_Access]) -> tuple[dict[tuple[int, ...], _Access], int]:
    """Read entries by (rectangle, lane), and their smallest area (-1 if two share a key)."""
    reads: dict[tuple[int, ...], _Access] = {}
    small = _NO_AREA
    twins = 0
    for x in entries:
        k: tuple[int, ...] = x[:4] + x[5:6]
        if k in reads:
            twins += 1
            k = x[:6]  # kept under its node too; scans find it, lookups do not
        reads[k] = x
        small = min(small, (x[1] - x[0]) * (x[3] - x[2]) if x[1] > x[0] and x[3] > x[2] else -1)
    return reads, (-1 if twins else small)


def _drop_covered_reads(accesses: _Accesses, candidates: Iterable[_Access], lane: int | None,
                        a0: int, a1: int, b0: int, b1: int) -> dict[tuple[int, ...], _Access]:
    """Removes ``lane``'s reads (every lane's if None: a write covers them all) inside
    ``[a0, a1) x [b0, b1)`` from ``accesses`` and returns its read dict: a key with twins (two reads
    of one rectangle, ``small < 0``) is rebuilt, since their keys may change; otherwise the covered
    reads leave in place and the others keep their order (``_drop_covered``)."""
    r = accesses.r
    if accesses.small < 0:
        r, accesses.small = _reads_of(
            [x for x in r.values()
             if (lane is not None and x[5] != lane)
             or not (a0 <= x[0] and x[1] <= a1 and b0 <= x[2] and x[3] <= b1)])
        accesses.r = r
    else:
        _drop_covered(r, candidates, lane, a0, a1, b0, b1)
    return r


def _drop_covered(r: dict[tuple[int, ...], _Access], candidates: Iterable[_Access], lane: int | None,
                  a0: int, a1: int, b0: int, b1: int) -> None:
    """Remove from ``r`` (no twins: every read under its (rectangle, lane) key) the reads inside
    ``[a0, a1) x [b0, b1)``, of ``lane`` only unless it is None, found among ``candidates`` (an area
    index's entries near the rectangle, or a copy of all of ``r``'s: every read inside it is among
    them, maybe more than once, maybe with reads already removed). The others keep their order, so
    ``r`` is what rebuilding it from the reads left (``_reads_of``) makes; the smallest area is left
    as it was, a lower bound of the new one, as ``_Accesses.small`` may be. Rebuilding cost the
    whole dict per covering read: a long prompt's normalised activations, read row tile by row tile
    by the q, k and v projections, hold thousands of reads (quadratic in the prompt); and an
    unindexed key read block by block in blocks of several sizes (a dot's stationary blocks and
    partial sums: a read larger than the smallest cannot take the one-lookup path) rebuilt its
    ~30-60 reads at every read of a block read before."""
    for x in candidates:
        if (lane is None or x[5] == lane) and a0 <= x[0] and x[1] <= a1 and b0 <= x[2] and x[3] <= b1:
            k = x[:4] + x[5:6]
            if r.get(k) is x:
                del r[k]


def _accesses_of(entries: Iterable[_Access]) -> _Accesses:
    """``entries`` as an :class:`_Accesses` (each kind in its order; whole-buffer writes before any
    other entry are the inherited ones, ``b``)."""
    base: list[_Access] = []
    writes: list[_Access] = []
    reads: list[_Access] = []
    for a in entries:
        if not a[_WRITE]:
            reads.append(a)
        elif writes or reads or a[:4] != WHOLE_BUFFER:
            writes.append(a)
        else:
            base.append(a)
    nodes = tuple([a[_NODE] for a in base])
    return _Accesses(writes, *_reads_of(reads), nodes, tuple([a[_LANE] for a in base]),
                     all(x < y for x, y in itertools.pairwise(nodes)))


MemoryKey = tuple[str, Any]  # ("buf", buffer id) for SBUF/PSUM buffers, ("hbm", tensor name)
Rect = tuple[int, int, int, int]  # partitions (or rows) [a0, a1) x free elements (or cols) [b0, b1)

WHOLE_TENSOR: Rect = (0, 1 << 62, 0, 1 << 62)
"""An access that may touch any element of an HBM tensor (through a view or a strided relayout):
it overlaps every other access to that tensor, so it orders against all of them."""

WHOLE_BUFFER: Rect = (0, P, 0, 1 << 40)
"""Every partition and element of an on-chip buffer (a new buffer inherits its range's hazards)."""
_WB_ROWS, _WB_COLS = WHOLE_BUFFER[1], WHOLE_BUFFER[3]


# ``Program.dep_idx``: node ids, int32 (a program of 2^31 nodes would need ~1 TiB to build)
DEP_IDX_DTYPE = np.int32

# The typecodes of the emitter's numeric per-node columns (``array.array``), wide enough for the
# Program column each becomes (int8 resource/engine/dma_engines/ports, int16 queue, int32 op_index,
# int64 trigger; lanes reach QUEUE_LANE_BASE + the queue count)
COLUMN_TYPES = {"resource": "b", "engine": "b", "cost_ns": "d", "queue": "h", "dma_engines": "b",
                "op_index": "i", "trigger": "q", "ports": "b", "_lane": "i"}


class Emitter:
    """Accumulates nodes column by column; ``columns()`` hands them to :class:`Program`."""

    def __init__(self, spec: CoreSpec | None = None) -> None:
        self.spec = spec
        self._last_writes: dict[int, list[tuple[MemoryKey, Rect]]] = {}
        self.psum_keys: set[MemoryKey] = set()  # buffers that live in PSUM
        # the numeric columns are typed arrays (COLUMN_TYPES): 1-8 bytes a node instead of a list's
        # 8-byte pointer and, for values outside the small-int cache, a 32-byte int object
        self.ports: array[int] = array(COLUMN_TYPES["ports"])
        self.resource: array[int] = array(COLUMN_TYPES["resource"])
        self.engine: array[int] = array(COLUMN_TYPES["engine"])
        self.cost_ns: array[float] = array(COLUMN_TYPES["cost_ns"])
        self.queue: array[int] = array(COLUMN_TYPES["queue"])
        self.dma_engines: array[int] = array(COLUMN_TYPES["dma_engines"])
        self.deps: list[list[int]] = []
        self.op_index: array[int] = array(COLUMN_TYPES["op_index"])
        self.opcode: list[str] = []
        self.text: list[Text] = []  # a string, or its pieces (``operand_texts.Text``)
        self.activation_fn: list[str | None] = []
        self.tensor_instruction_type: list[str | None] = []
        self.performance_mode: list[str | None] = []
        self.semantics: list[NodeSemantics] = []
        # (start, stop, move): nodes [start, stop) carry template records that ``move`` relocates
        # (layers relocated by ``layer_replay``; ``assemble`` makes them on first access)
        self.semantic_moves: list[tuple[int, int, Any]] = []
        # the same for operand texts (``text``: the template's; ``move`` renames them)
        self.text_moves: list[tuple[int, int, Any]] = []
        # (start, stop, lo, dn, source): nodes [start, stop) hold the dependency lists (and trigger
        # nodes) of the template nodes from ``source`` on, in which nodes >= lo move by dn
        # (``dep_columns`` applies it, in bulk)
        self.dep_moves: list[tuple[int, int, int, int, int]] = []
        self.trigger: array[int] = array(COLUMN_TYPES["trigger"])
        self.counters: list[NodeCounters] = []
        self.current_op = -1
        self._accesses: dict[MemoryKey, _Accesses | list[_Access]] = {}
        self._lane: array[int] = array(COLUMN_TYPES["_lane"])
        # LDWEIGHTS -> the first MATMUL after it. The Tensor engine's two tracks share semaphore 0,
        # and a background LoadStationary can finish before the previous MultiplyMoving does, so an
        # LS must never increment it (the count would pass an earlier MM's value too soon). A wait
        # for an LS waits for its MM instead, which starts only after the LS ended.
        self._mm_after_ls: dict[int, int] = {}
        self._pending_ls: list[int] = []

    @property
    def n_nodes(self) -> int:
        return len(self.resource)

    def release_lowering_state(self) -> None:
        """Drop what only lowering reads (recorded accesses, pending LoadStationary aliases, PSUM
        keys), once every op is lowered: the per-node columns are all ``assemble`` needs, and a
        big prefill's hazard tables and alias map cost ~50 bytes per node until the program is
        assembled (docs/execution-core.md "Program memory")."""
        self._accesses = {}
        self._last_writes = {}
        self._mm_after_ls = {}
        self._pending_ls = []
        self.psum_keys = set()

    # -- hazards ---------------------------------------------------------------------------
    def compact(self, nodes: set[int] | list[int]) -> list[int]:
        """Keep the latest node of each in-order lane: waiting for it implies the earlier ones."""
        if len(nodes) < 2:
            return list(nodes)
        # each lane's highest node in one pass (no sort first: ~30 % less than sorting the nodes
        # and keeping the last per lane), then those in order
        lanes = self._lane
        latest: dict[int, int] = {}
        get = latest.get
        for node in nodes:
            lane = lanes[node]
            if get(lane, -1) < node:
                latest[lane] = node
        return sorted(latest.values())

    def _adopt(self, key: MemoryKey) -> _Accesses:
        """``key``'s access lists (made, or adopted from the plain list layer relocation put there)."""
        entries = self._accesses.get(key)
        if entries.__class__ is _Accesses:
            return entries
        adopted = self._accesses[key] = _accesses_of(entries or ())
        return adopted

    def inherit(self, key: MemoryKey, rect: Rect, nodes: list[int], compacted: bool = False) -> None:
        """Earlier users of a reused address range become hazards of the new buffer there.
        ``compacted``: ``nodes`` is already what ``compact`` makes of it (ascending, one per lane:
        a PSUM bank's previous occupant's ``forget``)."""
        table = self._accesses
        if not compacted:
            nodes = self.compact(nodes)
        if rect == WHOLE_BUFFER and key not in table:  # a new buffer (every allocation): made here
            table[key] = _Accesses([], {}, _NO_AREA, tuple(nodes), tuple(map(self._lane.__getitem__, nodes)))
            return
        accesses = self._adopt(key)
        if rect == WHOLE_BUFFER and not accesses.w and not accesses.r:
            b = (*accesses.b, *nodes)
            accesses.b = b
            accesses.bl = (*accesses.bl, *map(self._lane.__getitem__, nodes))
            accesses.bs = all(x < y for x, y in itertools.pairwise(b))
            accesses.bn = None
        else:
            a0, a1, b0, b1 = rect
            lanes = self._lane
            accesses.w.extend([(a0, a1, b0, b1, node, lanes[node], True) for node in nodes])
            accesses.cx = None

    def last_writer_engine(self, key: MemoryKey) -> Engine | None:
        """The engine of the latest write to a buffer (None if a DMA wrote it or nobody did)."""
        writers = [a[_NODE] for a in self._accesses.get(key, ()) if a[_WRITE]]
        if not writers:
            return None
        node = max(writers)
        if self.resource[node] == RES_DMA:
            return None
        return Engine(self.engine[node])

    def forget(self, key: MemoryKey) -> list[int]:
        """Drop a buffer's access list; returns the nodes a later user of its range must wait for."""
        accesses = self._accesses.pop(key, None)
        return self._latest(accesses) if accesses else []

    def users(self, key: MemoryKey) -> list[int]:
        """The latest node per lane that touched ``key`` (what a new occupant of its range waits for),
        leaving the key's history in place."""
        accesses = self._accesses.get(key)
        return self._latest(accesses) if accesses else []

    def _latest(self, entries: _Accesses | list[_Access]) -> list[int]:
        """``compact`` of the entries' nodes (each lane's latest, in order), without a set first;
        an ascending ``b`` (every new buffer's) gives its lanes' latest in one C call."""
        lanes = self._lane
        if entries.__class__ is _Accesses:
            assert isinstance(entries, _Accesses)
            if entries.bs:
                latest = dict(zip(entries.bl, entries.b))
                rest: Iterable[_Access] = itertools.chain(entries.w, entries.r.values())
            else:
                latest = {}
                rest = entries
        else:
            latest = {}
            rest = entries
        get = latest.get
        for a in rest:
            node = a[_NODE]
            lane = lanes[node]
            if get(lane, -1) < node:
                latest[lane] = node
        return sorted(latest.values())

    def rename(self, old: MemoryKey, new: MemoryKey) -> None:
        """Accesses recorded under ``old`` now belong to ``new``, as whole-range accesses (an NKI
        kernel's output tensor becomes the compiled model's HBM tensor of that value)."""
        moved = [(*WHOLE_TENSOR, *a[4:]) for a in self._accesses.pop(old, [])]
        self._accesses[new] = _accesses_of([*self._accesses.get(new, []), *moved])

    def lane_of(self, node: int) -> int:
        return self._lane[node]

    def ls_alias(self, node: int) -> int:
        """A wait for a LoadStationary is a wait for the MultiplyMoving after it (see __init__)."""
        return self._mm_after_ls.get(node, node)

    def hazards_for(self, lane: int, reads: list[tuple[MemoryKey, Rect]],
                    writes: list[tuple[MemoryKey, Rect]]) -> set[int]:
        """Nodes a node on ``lane`` reading ``reads`` and writing ``writes`` must wait for (every
        one: ``_hazards`` may leave out what ``compact`` would drop)."""
        deps: set[int] = set()
        for whole_lists, pairs in ((False, reads), (True, writes)):  # a read waits for writes only
            for key, (a0, a1, b0, b1) in pairs:
                for x0, x1, y0, y1, node, other, write in self._accesses.get(key, ()):
                    if ((write or whole_lists) and other != lane and x0 < a1 and a0 < x1 and y0 < b1
                            and b0 < y1):
                        deps.add(node)
        return deps

    def record_access(self, node: int, lane: int, reads: list[tuple[MemoryKey, Rect]],
                      writes: list[tuple[MemoryKey, Rect]]) -> None:
        """Note that an already emitted ``node`` also reads/writes these ranges (NKI kernels
        retarget a fresh tile's producer to the tensor the tile is assigned to)."""
        self._record(node, lane, reads, writes)

    def _hazards(self, lane: int, reads: list[tuple[MemoryKey, Rect]],
                 writes: list[tuple[MemoryKey, Rect]], extra: Collection[int] = ()) -> list[int]:
        """The dependencies of a node on ``lane`` with these accesses: read-after-write on every
        read, any earlier access on every write (other lanes only), and the ``extra`` nodes; each
        a node, or the MultiplyMoving after it if it is a LoadStationary (see ``__init__``), of
        which each lane's latest is kept, in order (``compact``: waiting for it implies the
        earlier ones).

        The inherited writes of a key come as their lanes' latest (``_Accesses.base_map``, made
        once per key and lane), merged with the other hazards' instead of being put in a set and
        compacted again at every node (a new buffer inherits ~10 nodes, and every access of it
        waits for them until a whole-buffer write covers them): the same list as compacting the
        whole set.

        On an HBM key with an area index (``_Index``) a whole-tensor access gets each other lane's
        latest entry only: the nodes it leaves out are earlier nodes of those lanes, which
        compaction drops anyway (no HBM access is a LoadStationary, the one node a dependency is
        mapped from)."""
        deps: set[int] = set()
        add = deps.add
        bases: list[dict[int, int]] = []
        get = self._accesses.get
        after = self._mm_after_ls
        pending = self._pending_ls
        lanes = self._lane
        # the two loops below repeat their first steps (the key's accesses, its inherited base)
        # rather than call a helper: this is the compile's hottest loop, once per operand of
        # every node
        for key, rect in reads:  # a read waits for writes
            accesses = get(key)
            if accesses is None:
                continue
            if accesses.__class__ is not _Accesses:
                accesses = self._adopt(key)
            a0, a1, b0, b1 = rect
            if accesses.b and a1 > 0 and a0 < _WB_ROWS and b1 > 0 and b0 < _WB_COLS:
                bn = accesses.bn
                base = bn.get(lane) if bn is not None else None
                if base is None:
                    base = accesses.base_map(lane, after, pending, lanes)
                if base is None:
                    deps.update(accesses.base(lane))
                else:
                    bases.append(base)
            ix = accesses.ix
            if ix is None and key[0] == "hbm" and len(accesses.w) + len(accesses.r) >= INDEX_MIN:
                ix = accesses.index()
            if ix is not None and _near_hazards(accesses, ix, lane, rect, add, False):
                continue
            w = accesses.w
            if len(w) >= COLUMNS_MIN and key[0] == "buf":
                w = accesses.columns().overlapping(b0, b1)
            for x0, x1, y0, y1, node, other, _ in w:
                if y0 < b1 and b0 < y1 and x0 < a1 and a0 < x1 and other != lane:
                    add(node)
        for key, rect in writes:  # a write for every earlier access
            accesses = get(key)
            if accesses is None:
                continue
            if accesses.__class__ is not _Accesses:
                accesses = self._adopt(key)
            a0, a1, b0, b1 = rect
            if accesses.b and a1 > 0 and a0 < _WB_ROWS and b1 > 0 and b0 < _WB_COLS:
                bn = accesses.bn
                base = bn.get(lane) if bn is not None else None
                if base is None:
                    base = accesses.base_map(lane, after, pending, lanes)
                if base is None:
                    deps.update(accesses.base(lane))
                else:
                    bases.append(base)
            ix = accesses.ix
            if ix is None and key[0] == "hbm" and len(accesses.w) + len(accesses.r) >= INDEX_MIN:
                ix = accesses.index()
            if ix is not None and _near_hazards(accesses, ix, lane, rect, add, True):
                continue
            w = accesses.w
            if len(w) >= COLUMNS_MIN and key[0] == "buf":
                w = accesses.columns().overlapping(b0, b1)
            for x0, x1, y0, y1, node, other, _ in w:
                if y0 < b1 and b0 < y1 and x0 < a1 and a0 < x1 and other != lane:
                    add(node)
            for x0, x1, y0, y1, node, other, _ in accesses.r.values():
                if y0 < b1 and b0 < y1 and x0 < a1 and a0 < x1 and other != lane:
                    add(node)
        if extra:
            deps.update([d for d in extra if lanes[d] != lane])
        # each lane's latest: the largest base's as it is, the others' and the scanned nodes' merged
        if not bases:
            latest: dict[int, int] = {}
        elif len(bases) == 1:
            latest = bases[0].copy()
        else:
            bases.sort(key=len)
            latest = bases.pop().copy()
            latest_of = latest.get
            for base in bases:
                for other, node in base.items():
                    if latest_of(other, -1) < node:
                        latest[other] = node
        if deps:
            latest_of = latest.get
            for node in (deps if after.keys().isdisjoint(deps) else map(after.get, deps, deps)):
                other = lanes[node]
                if latest_of(other, -1) < node:
                    latest[other] = node
        return sorted(latest.values())

    def _record(self, node: int, lane: int, reads: list[tuple[MemoryKey, Rect]],
                writes: list[tuple[MemoryKey, Rect]]) -> None:
        """A write hides every access it covers; a read hides this lane's reads it covers."""
        table = self._accesses
        for key, (a0, a1, b0, b1) in writes:
            accesses = table.get(key)
            if accesses is None:
                table[key] = _Accesses([(a0, a1, b0, b1, node, lane, True)], {}, _NO_AREA)
                continue
            if accesses.__class__ is not _Accesses:
                accesses = self._adopt(key)
            if accesses.b and a0 <= 0 and a1 >= _WB_ROWS and b0 <= 0 and b1 >= _WB_COLS:
                accesses.b = accesses.bl = ()  # covered (inherited entries are whole-buffer writes)
                accesses.bs = True
                accesses.bn = None
            w = accesses.w
            r = accesses.r
            ix = accesses.ix
            cells = _cells(a0, a1, b0, b1) if ix is not None else None
            if cells is not None:  # covered entries lie in the cells of this rectangle
                assert ix is not None
                dead = ix.dead
                for x in ix.near(cells, ix.wc, ix.ww):
                    if a0 <= x[0] and x[1] <= a1 and b0 <= x[2] and x[3] <= b1 and id(x) not in dead:
                        kept = []
                        for y in w:
                            if a0 <= y[0] and y[1] <= a1 and b0 <= y[2] and y[3] <= b1:
                                dead.add(id(y))
                            else:
                                kept.append(y)
                        w[:] = kept
                        accesses.cx = None
                        ix.wlast = None
                        break
                live = accesses.live_read
                for x in ix.near(cells, ix.rc, ix.rw):
                    if a0 <= x[0] and x[1] <= a1 and b0 <= x[2] and x[3] <= b1 and live(x):
                        before = len(r)
                        if accesses.small < 0:  # twins: rebuilt (their keys may change)
                            accesses.r, accesses.small = _reads_of(
                                [y for y in r.values()
                                 if not (a0 <= y[0] and y[1] <= a1 and b0 <= y[2] and y[3] <= b1)])
                        else:
                            _drop_covered(r, ix.near(cells, ix.rc, ix.rw), None, a0, a1, b0, b1)
                        ix.stale += before - len(accesses.r)
                        ix.rlast = None
                        break
                if len(ix.dead) + ix.stale > len(w) + len(accesses.r) + INDEX_MIN:
                    accesses.ix = ix = None
            else:
                cx = accesses.cx
                for x0, x1, y0, y1, _n, _l, _w in (w if cx is None else cx.inside(b0, b1)):
                    if b0 <= y0 and y1 <= b1 and a0 <= x0 and x1 <= a1:
                        w[:] = [x for x in w if not (a0 <= x[0] and x[1] <= a1 and b0 <= x[2] and x[3] <= b1)]
                        accesses.ix = ix = accesses.cx = None
                        break
                for x0, x1, y0, y1, _n, _l, _w in r.values():
                    if b0 <= y0 and y1 <= b1 and a0 <= x0 and x1 <= a1:
                        _drop_covered_reads(accesses, list(r.values()), None, a0, a1, b0, b1)
                        accesses.ix = ix = None
                        break
            entry = (a0, a1, b0, b1, node, lane, True)
            w.append(entry)
            if ix is not None:
                ix.add_write(entry)
            if accesses.cx is not None:
                accesses.cx.add(entry)
        for key, (a0, a1, b0, b1) in reads:
            accesses = table.get(key)
            area = (a1 - a0) * (b1 - b0) if a1 > a0 and b1 > b0 else -1
            entry = (a0, a1, b0, b1, node, lane, False)
            at = (a0, a1, b0, b1, lane)  # the read's key in ``r``
            if accesses is None:
                table[key] = _Accesses([], {at: entry}, area)
                continue
            if accesses.__class__ is not _Accesses:
                accesses = self._adopt(key)
            r = accesses.r
            ix = accesses.ix
            if area > 0 and accesses.small >= area:
                if r.pop(at, None) is not None and ix is not None:
                    ix.stale += 1  # only its own rectangle can be covered
            elif ix is not None and (cells := _cells(a0, a1, b0, b1)) is not None:
                live = accesses.live_read
                for x in ix.near(cells, ix.rc, ix.rw):
                    if (x[5] == lane and a0 <= x[0] and x[1] <= a1 and b0 <= x[2] and x[3] <= b1
                            and live(x)):
                        before = len(r)
                        r = _drop_covered_reads(accesses, ix.near(cells, ix.rc, ix.rw),
                                                lane, a0, a1, b0, b1)
                        ix.stale += before - len(r)
                        ix.rlast = None
                        break
            else:
                for x0, x1, y0, y1, _n, x_lane, _w in r.values():
                    if b0 <= y0 and y1 <= b1 and a0 <= x0 and x1 <= a1 and x_lane == lane:
                        r = _drop_covered_reads(accesses, list(r.values()), lane, a0, a1, b0, b1)
                        accesses.ix = ix = None
                        break
            r[at] = entry
            if area < accesses.small:
                accesses.small = area
            if ix is not None:
                if len(ix.dead) + ix.stale > len(accesses.w) + len(r) + INDEX_MIN:
                    accesses.ix = None
                else:
                    ix.add_read(entry)

    # -- emission --------------------------------------------------------------------------
    def _append(self, resource: int, engine: Engine, cost_ns: float, queue: int, dma_engines: int,
                deps: list[int], opcode: str, text: Text, semantics: NodeSemantics,
                activation_fn: str | None, tensor_instruction_type: str | None,
                performance_mode: str | None, trigger: int, lane: int,
                counters: NodeCounters, ports: int = 0) -> int:
        """One node's columns (positional: called once per node, a keyword call costs more);
        ``deps`` as ``_hazards`` makes them."""
        if semantics.__class__ not in SEMANTIC_KINDS:
            check_semantics(semantics)
        node = len(self.resource)
        if resource == RES_TENSOR_MM:
            after = self._mm_after_ls
            for ls in self._pending_ls:
                after[ls] = node
            self._pending_ls.clear()
        elif resource == RES_TENSOR_LS:
            self._pending_ls.append(node)
        self.resource.append(resource)
        self.engine.append(engine)  # typed arrays: an Engine member is stored as its int,
        self.cost_ns.append(cost_ns)  # an int cost as a float
        self.queue.append(queue)
        self.dma_engines.append(dma_engines)
        self.deps.append(deps)
        self.op_index.append(self.current_op)
        self.opcode.append(opcode)
        self.text.append(text)
        self.semantics.append(semantics)
        self.activation_fn.append(activation_fn)
        self.tensor_instruction_type.append(tensor_instruction_type)
        self.performance_mode.append(performance_mode)
        self.trigger.append(trigger)
        self.ports.append(ports)
        self._lane.append(lane)
        self.counters.append(counters)
        return node

    def instruction(
        self,
        engine: Engine,
        opcode: str,
        cost_ns: float,
        *,
        reads: list[tuple[MemoryKey, Rect]],
        writes: list[tuple[MemoryKey, Rect]],
        text: Text,
        semantics: NodeSemantics,
        track: int | None = None,
        activation_fn: str | None = None,
        tensor_instruction_type: str | None = None,
        performance_mode: str | None = None,
        extra_deps: set[int] | None = None,
        counters: NodeCounters = NO_COUNTERS,
    ) -> int:
        lane = track if track is not None else int(engine)
        deps = self._hazards(lane, reads, writes, extra_deps or ())
        if engine is Engine.VECTOR or engine is Engine.SCALAR:
            cost_ns = self._dependent_cost(engine, lane, reads, cost_ns)
        self._last_writes[lane] = writes
        ports = 0
        psum_keys = self.psum_keys
        for key, _ in reads:
            if key[0] == "buf":
                ports |= PORT_PSUM if key in psum_keys else PORT_SBUF
        for key, _ in writes:
            if key[0] == "buf":
                ports |= PORT_PSUM if key in psum_keys else PORT_SBUF
        node = self._append(lane, engine, cost_ns, -1, 0, deps, opcode, text, semantics, activation_fn,
                            tensor_instruction_type, performance_mode, -1, lane, counters, ports)
        self._record(node, lane, reads, writes)
        return node

    def _dependent_cost(self, engine: Engine, lane: int, reads: list[tuple[MemoryKey, Rect]],
                        cost_ns: float) -> float:
        """Vector/Scalar instructions that read what the previous one on their engine just wrote
        cannot overlap it in the pipeline (neuroncore.md §4.1): Vector pays ~100 extra cycles,
        Scalar issues no faster than ~264 cycles."""
        if self.spec is None or engine not in (Engine.VECTOR, Engine.SCALAR):
            return cost_ns
        previous = self._last_writes.get(lane)
        if not previous:
            return cost_ns
        dependent = False
        for wkey, (w0, w1, x0, x1) in previous:
            for key, (a0, a1, b0, b1) in reads:
                if key == wkey and a0 < w1 and w0 < a1 and b0 < x1 and x0 < b1:
                    dependent = True
                    break
        if not dependent:
            return cost_ns
        ns_per_cycle = 1e9 / self.spec.clock_hz(engine)
        if engine is Engine.VECTOR:
            return cost_ns + self.spec.dependent_vector_penalty_cycles * ns_per_cycle
        return max(cost_ns, self.spec.dependent_scalar_ii_cycles * ns_per_cycle)

    def dma(
        self,
        queue: DmaQueue,
        *,
        reads: list[tuple[MemoryKey, Rect]],
        writes: list[tuple[MemoryKey, Rect]],
        engines: int,
        engine_ns: float,
        trigger_cost_ns: float,
        text: Text,
        semantics: NodeSemantics,
        trigger_opcode: str = "WRITE",
        trigger_text: str = "",
        trigger_semantics: NodeSemantics = NOP,
        counters: NodeCounters = NO_COUNTERS,
    ) -> int:
        """A transfer and the instruction on the queue's engine that triggers it; returns the transfer."""
        engine = queue.trigger_engine
        # dependencies are waited for by the trigger; the transfer starts after its trigger: the
        # trigger's engine skips its own lane's accesses, the transfer its queue's, so together
        # they wait for every overlapping access (lane -1 is no lane): one scan
        deps = self._hazards(-1, reads, writes)
        trig = self._append(int(engine), engine, trigger_cost_ns, -1, 0, deps, trigger_opcode,
                            trigger_text or f"{queue.name} block_id={len(self.resource)}",
                            trigger_semantics, None, None, None, -1, int(engine), counters.spill_part())
        node = self._append(RES_DMA, engine, engine_ns, queue.index, engines, [], "DMA_DIRECT2D", text,
                            semantics, None, None, None, trig, queue_lane(queue), counters.transfer_part())
        self._record(node, queue_lane(queue), reads, writes)
        return node

    def collective(self, opcode: str, *, reads: list[tuple[MemoryKey, Rect]],
                   writes: list[tuple[MemoryKey, Rect]], text: Text, semantics: NodeSemantics,
                   counters: NodeCounters = NO_COUNTERS) -> int:
        """A collective on the CC-core: reads and writes HBM, waits like any other node.

        Its duration depends on where the ranks sit in the instance, so it is left at 0 here and
        supplied by the runtime when the program runs in a tensor-parallel group."""
        deps = self._hazards(CC_LANE, reads, writes)
        node = self._append(RES_CC, Engine.SYNC, 0.0, -1, 0, deps, opcode, text, semantics, None, None, None,
                            -1, CC_LANE, counters)
        self._record(node, CC_LANE, reads, writes)
        return node

    def _pieces(self) -> list[tuple[int, int, int]]:
        """The node ranges in order as ``(start, stop, source)``: lowered nodes (source -1), or a
        relocated layer's, which holds the records of the template nodes from ``source`` on (the
        same list and counter objects: ``dep_moves``), lowered nodes read before it."""
        pieces: list[tuple[int, int, int]] = []
        pos = 0
        moves = self.dep_moves
        for start, stop, _lo, _dn, source in moves:
            if start > pos:
                pieces.append((pos, start, -1))
            end = source + stop - start
            copied = end <= start and not any(a < end and source < b for a, b, *_ in moves)
            pieces.append((start, stop, source if copied else -1))
            pos = stop
        if pos < len(self.deps):
            pieces.append((pos, len(self.deps), -1))
        return pieces

    def column(self, values: Sequence[Any], dtype: Any, lookup: dict[Any, int] | None = None) -> np.ndarray:
        """One of the per-node lists (``resource``, ``engine``, ``cost_ns``, ...) as an array, each
        entry through ``lookup`` if given: a relocated range copies its template's entries
        (``_pieces``), converted once."""
        out = np.empty(len(values), dtype)
        for start, stop, source in self._pieces():
            if source < 0 and lookup is not None:
                out[start:stop] = np.fromiter(map(lookup.__getitem__, values[start:stop]), dtype,
                                              count=stop - start)
            elif source < 0:
                out[start:stop] = values[start:stop]
            else:
                out[start:stop] = out[source:source + stop - start]
        return out

    def coded_column(self, values: list[str | None]) -> CodedColumn:
        """One of the per-node text lists (``activation_fn``, ...) as codes into its distinct
        values, in first-use order: the lowered ranges are read, a relocated range copies its
        template's codes (``_pieces``)."""
        pieces = self._pieces()
        distinct = list(dict.fromkeys(itertools.chain.from_iterable(
            values[start:stop] for start, stop, source in pieces if source < 0)))
        dtype = np.int8 if len(distinct) < 2**7 else np.int16 if len(distinct) < 2**15 else np.int32
        return CodedColumn(self.column(values, dtype, {v: i for i, v in enumerate(distinct)}), distinct)

    def dep_columns(self) -> tuple[np.ndarray, np.ndarray]:
        """``(dep_ptr, dep_idx)``: every node's dependencies as CSR (the ``Program`` columns), with
        relocated layers' moved by array arithmetic. A relocated range copies its template's
        columns (``_pieces``), read once, instead of reading every list again."""
        n = len(self.deps)
        deps = self.deps
        pieces = self._pieces()
        lengths = np.empty(n, np.int64)
        for start, stop, source in pieces:
            if source < 0:
                lengths[start:stop] = np.fromiter(map(len, deps[start:stop]), np.int64, count=stop - start)
            else:
                lengths[start:stop] = lengths[source:source + stop - start]
        dep_ptr = np.zeros(n + 1, np.int64)
        np.cumsum(lengths, out=dep_ptr[1:])
        if n >= 2**31:
            raise ValueError(f"a program of {n} nodes: node ids past int32")
        flat = np.empty(int(dep_ptr[-1]), DEP_IDX_DTYPE)
        for start, stop, source in pieces:
            a, b = int(dep_ptr[start]), int(dep_ptr[stop])
            if source < 0:
                flat[a:b] = np.fromiter(itertools.chain.from_iterable(deps[start:stop]), DEP_IDX_DTYPE,
                                        count=b - a)
            else:
                flat[a:b] = flat[int(dep_ptr[source]):int(dep_ptr[source + stop - start])]
        self._apply_moves(flat, dep_ptr, pieces)
        return dep_ptr, flat

    def _apply_moves(self, values: np.ndarray, ptr: np.ndarray | None,
                     pieces: list[tuple[int, int, int]]) -> None:
        """Each relocated range's node ids (``values[ptr[start]:ptr[stop]]``, or
        ``values[start:stop]`` without ``ptr``) at or past its ``lo`` moved by its ``dn``
        (``dep_moves``): ``segment[segment >= lo] += dn``, the plain definition.

        A range copied from its template (``_pieces``) holds the template's values, which are
        never moved (a template is lowered nodes), so which entries move is the template's mask,
        made once per template and ``lo`` and shared by every relocation of it (a run relocates
        one template tens of times); the entries are moved with a masked add (a boolean index
        gathers and scatters). Other ranges take their own mask."""
        copied = {start: source for start, _stop, source in pieces if source >= 0}
        masks: dict[tuple[int, int, int], np.ndarray] = {}
        for start, stop, lo, dn, _ in self.dep_moves:
            a, b = (int(ptr[start]), int(ptr[stop])) if ptr is not None else (start, stop)
            segment = values[a:b]
            source = copied.get(start)
            if source is None:
                mask = segment >= lo
            else:
                key = (source, stop - start, lo)
                mask = masks.get(key)  # type: ignore[assignment]
                if mask is None:
                    sa, sb = ((int(ptr[source]), int(ptr[source + stop - start])) if ptr is not None
                              else (source, source + stop - start))
                    mask = masks[key] = values[sa:sb] >= lo
            np.add(segment, dn, out=segment, where=mask)

    def trigger_column(self) -> np.ndarray:
        """Each DMA transfer's trigger node (-1 for the others), relocated layers' moved."""
        trigger = np.asarray(self.trigger, np.int64)
        self._apply_moves(trigger, None, self._pieces())
        return trigger

    def settle_moves(self) -> None:
        """Apply the relocations kept for later (``dep_moves``) to the lists themselves, for a pass
        that reorders nodes (weight prefetch)."""
        if not self.dep_moves:
            return
        dep_ptr, flat = self.dep_columns()
        ptr: list[int] = dep_ptr.tolist()
        values: list[int] = flat.tolist()
        self.deps = [values[ptr[i]:ptr[i + 1]] for i in range(len(self.deps))]
        self.trigger = array(COLUMN_TYPES["trigger"], self.trigger_column().tobytes())
        self.dep_moves = []

    def counter_columns(self) -> CounterColumns:
        """The counters of every node (``Program.counters``): one table row per distinct record,
        int32 when every value fits (a program's, nearly always), else int64, and each node's row."""
        # most nodes share their records (NO_COUNTERS; relocated layers hold their template's), so
        # each distinct record is unpacked once and the nodes hold their record's row
        # (the records are alive in ``self.counters``, so their ids are distinct per record)
        width = len(COUNTER_NAMES)
        counters = self.counters
        n = len(counters)
        pieces = self._pieces()
        read = [np.arange(start, stop) for start, stop, source in pieces if source < 0]
        nodes = np.concatenate(read) if read else np.zeros(0, np.int64)
        ids = np.fromiter(map(id, map(counters.__getitem__, nodes.tolist())), np.int64, count=nodes.size)
        _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
        del ids
        codes = np.empty(n, np.int16 if len(first) < 2**15 else np.int32)
        codes[nodes] = inverse.reshape(-1)
        distinct = [counters[i] for i in nodes[first].tolist()]
        del nodes, inverse
        for start, stop, source in pieces:  # a relocated range holds its template's records
            if source >= 0:
                codes[start:stop] = codes[source:source + stop - start]
        table = np.fromiter(itertools.chain.from_iterable(map(counter_values, distinct)), np.int64,
                            count=len(distinct) * width).reshape(-1, width)
        # one row per distinct value (records are distinct objects, not always distinct values),
        # sorted: the same program has the same table and codes however its records were shared
        table, rows = np.unique(table, axis=0, return_inverse=True)
        codes = rows.reshape(-1).astype(np.int16 if len(table) < 2**15 else np.int32)[codes]
        if table.size and int(table.max()) < 2**31 and int(table.min()) >= -2**31:
            table = table.astype(np.int32)
        return CounterColumns(codes, table)

    # -- semaphores ------------------------------------------------------------------------
    def assign_semaphores(self, queues: list[DmaQueue],
                          dep_columns: tuple[np.ndarray, np.ndarray] | None = None,
                          render: RefTexts | None = None) -> tuple[np.ndarray, np.ndarray, OperandTexts]:
        """Decide which nodes increment which semaphore; operand strings prefixed with the waits
        (each made when first read: ``operand_texts``). ``dep_columns``: ``self.dep_columns()`` if
        the caller has it already; ``render`` joins the texts given in pieces (needed if any was)."""
        n = len(self.resource)
        # narrow columns and producer-only arrays: a big prefill assembles tens of millions of
        # nodes, and int64 temporaries per node were its compile's peak (docs/execution-core.md
        # "Program memory")
        resource = self.column(self.resource, np.int8)
        queue = self.column(self.queue, np.int16)
        queue_semaphores = np.asarray([q.semaphore for q in queues] or [0], np.int16)
        sem_of = self.column(self.engine, np.int16)
        dma = resource == RES_DMA
        sem_of[dma] = queue_semaphores[np.clip(queue[dma], 0, None)]
        sem_of[resource == RES_CC] = CC_SEMAPHORE
        del queue
        completes = {s: f"S[{s}] ({_owner(s, queues)})++@complete" for s in np.unique(sem_of).tolist()}
        producer = np.zeros(n, bool)
        dep_ptr, flat = dep_columns if dep_columns is not None else self.dep_columns()
        producer[flat] = True
        sem_increment = sem_of
        sem_increment[~producer] = -1
        del producer
        # each producer's running count on its semaphore (a DMA engine signals
        # DMA_COMPLETION_INCREMENT), in node order
        sem_value = semaphore_values(sem_increment, dma, DMA_COMPLETION_INCREMENT)
        del dma
        # the waits of each node are its dependencies' increments, every dependency being a
        # producer: the strings read them from the program's columns (``operand_texts``); the
        # texts are the emitter's own list, not a copy (nothing changes it in place once lowering
        # is done; a reordering pass replaces it)
        texts: Sequence[str] = (RenderedTexts(self.text, render) if render is not None  # type: ignore[assignment]
                                else self.text)
        own: Sequence[str] = RelocatedSemantics(texts, self.text_moves) if self.text_moves else texts
        texts = OperandTexts(own, dep_ptr, flat, sem_increment, sem_value, completes)
        return sem_increment, sem_value, texts


def _owner(semaphore: int, queues: list[DmaQueue]) -> str:
    if semaphore == CC_SEMAPHORE:
        return "CC"
    if semaphore < QUEUE_SEMAPHORE_BASE:
        return Engine(semaphore).label
    return queues[semaphore - QUEUE_SEMAPHORE_BASE].name


def sbuf_key(ref: Ref | ApRef) -> tuple[MemoryKey, Rect]:
    """The on-chip range an access covers (an access pattern: the range it spans)."""
    return ("buf", ref.buf), (ref.p0, ref.p1, ref.f0, ref.f1)


def hbm_key(access: HbmAccess, rows_per_batch: int, whole: bool = False) -> tuple[MemoryKey, Rect]:
    if whole or access.view is not None:
        return ("hbm", access.tensor), WHOLE_TENSOR
    base = access.batch * rows_per_batch
    return ("hbm", access.tensor), (base + access.r0, base + access.r1, access.c0, access.c1)


__all__ = ["CC_LANE", "CC_SEMAPHORE", "QUEUE_LANE_BASE", "QUEUE_SEMAPHORE_BASE", "RES_TENSOR_LS",
           "RES_TENSOR_MM", "WHOLE_BUFFER", "WHOLE_TENSOR", "Emitter", "hbm_key", "queue_lane",
           "sbuf_key"]
