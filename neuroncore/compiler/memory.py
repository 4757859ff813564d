"""On-chip memory allocation: SBUF byte ranges (same range on every partition) and PSUM banks.

Freed ranges keep a *tombstone* of the nodes that last touched them; whoever is allocated there
next inherits those nodes as hazards, so a new writer waits (via semaphores) for the old readers.
That is how buffer reuse stays correct when engines run ahead of each other.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter

ALIGN = 64

# bisection keys, C callables (a lambda is a Python call per probe): a free range's end, a
# tombstone's end and start
_END = itemgetter(1)
_TOMB_END = attrgetter("end")
_TOMB_START = attrgetter("start")


class OutOfMemory(Exception):
    """No free range is large enough; the caller spills something and retries."""


class DoubleFree(Exception):
    """A range released while (part of) it is already free: a buffer freed twice. Left alone it
    would fragment the free list with overlapping ranges and, once the range is handed out again,
    let two live buffers share bytes."""


def _aligned(size: int) -> int:
    """The bytes per partition a buffer of ``size`` takes: whole ``ALIGN`` units, at least one."""
    return max(ALIGN, -(-size // ALIGN) * ALIGN)


def _fits_in(free: list[int], sizes: list[int]) -> bool:
    """First fit, largest first, of ``sizes`` into free ranges of these lengths (consumed)."""
    for size in sorted(map(_aligned, sizes), reverse=True):
        for i, room in enumerate(free):
            if room >= size:
                free[i] -= size
                break
        else:
            return False
    return True


def _next_fit_in(ranges: list[tuple[int, int]], cursor: int, size: int) -> tuple[int, int] | None:
    """Next fit of ``size`` bytes in ``ranges`` (free ranges, sorted and disjoint) from ``cursor``:
    (the range's index, the place in it), or None if no range has room.

    The cursor itself if the range holding it has room past it; otherwise the first range after
    it wide enough, in address order, wrapping to the lowest; the range holding the cursor is tried
    from its start only last, after the wrap. Its bytes behind the cursor are the ones the cursor
    passed last, freed since by the buffers placed there a moment ago: going back to them would
    put a buffer where its predecessor just was, waiting for that one's readers (a batch of loads
    at one slot runs single-buffered), which is what a rotating cursor is for avoiding.
    """
    first = bisect.bisect_right(ranges, cursor, key=_END)  # the first range ending after the cursor
    order: Iterable[int]
    if first < len(ranges) and ranges[first][0] < cursor:  # the cursor is inside that range
        if ranges[first][1] - cursor >= size:
            return first, cursor
        order = itertools.chain(range(first + 1, len(ranges)), range(first + 1))
    else:
        order = itertools.chain(range(first, len(ranges)), range(first))
    for i in order:
        start, end = ranges[i]
        if end - start >= size:
            return i, start
    return None


@dataclass
class _Tombstone:
    start: int
    end: int
    nodes: list[int]


@dataclass
class RangeAllocator:
    """Byte ranges over [0, capacity) with coalescing free ranges: small buffers next-fit from a
    rotating cursor (``_next_fit_in``), large blocks by ``_allocate_top``."""

    capacity: int
    free: list[tuple[int, int]] = field(default_factory=list)
    tombstones: list[_Tombstone] = field(default_factory=list)
    in_use: int = 0
    peak: int = 0
    cursor: int = 0
    # the weight stream's region [stream_lo, capacity) and its own rotating cursor (``allocate``)
    stream_fraction: float = 0.0
    stream_lo: int = 0
    stream_cursor: int = 0

    def __post_init__(self) -> None:
        self.free = [(0, self.capacity)]
        self.stream_lo = self.capacity - int(self.capacity * self.stream_fraction) // ALIGN * ALIGN
        self.stream_cursor = self.stream_lo

    def allocate(self, size: int, *, stream: bool = False) -> tuple[int, list[int]]:
        """Returns (start, hazard nodes inherited from earlier users of that range).

        Next-fit from a rotating cursor: a range freed a moment ago is reused last, so a new buffer
        rarely has to wait for the readers of the one before it (the compiler's multi-buffering).

        ``stream``: a block of the weight stream (a weight loaded on the weight queue). With a
        stream region (``stream_fraction`` > 0, the top of SBUF), such blocks go round it in load
        order from their own cursor, a ring: a load lands where the weights of a ring's length
        earlier were, whose matmuls are long done, so it waits for nothing recent; other buffers
        use the rest of SBUF first and the region only when the rest is full (so nothing loses
        capacity). A block that does not fit the region goes where a large block would.

        The ring is what the activations leave: a buffer that finds no room below it ends the
        ring for the rest of the program (placement is the ringless one from then on), so a
        program whose activations need more than the bottom of SBUF does not make its weights wait
        for them at every lap, nor go round a ring too small to be ahead of the matmuls.
        """
        size = _aligned(size)
        if self.stream_lo < self.capacity:
            # a block over half the ring cannot be loaded while the one before it is read
            if stream and 2 * size <= self.capacity - self.stream_lo:
                at = self._next_fit(size, self.stream_cursor, self.stream_lo, self.capacity)
                if at is not None:
                    self.stream_cursor = at + size if at + size < self.capacity else self.stream_lo
                    return self._carve(at, size)
                return self._allocate_top(size)
            if stream:
                return self._allocate_top(size)
            at = self._next_fit(size, self.cursor, 0, self.stream_lo) if size < self.capacity // 16 \
                else self._best_oldest(size, 0, self.stream_lo)
            if at is not None:
                if size < self.capacity // 16:
                    self.cursor = at + size if at + size < self.stream_lo else 0
                return self._carve(at, size)
            self.end_ring()  # no room below the ring: the activations need it
        return self._allocate_anywhere(size)

    def end_ring(self) -> None:
        """Give the ring's room to every buffer for the rest of the program."""
        self.stream_lo = self.stream_cursor = self.capacity

    def _allocate_anywhere(self, size: int) -> tuple[int, list[int]]:
        """The ringless placement over the whole SBUF: large blocks by ``_allocate_top``, small
        ones next-fit from the rotating cursor."""
        if size >= self.capacity // 16:
            return self._allocate_top(size)
        found = _next_fit_in(self.free, self.cursor, size)
        if found is not None:
            i, at = found
            start, end = self.free[i]
            self.free[i:i + 1] = [(s, e) for s, e in ((start, at), (at + size, end)) if e > s]
            self.in_use += size
            self.peak = max(self.peak, self.in_use)
            self.cursor = at + size if at + size < self.capacity else 0
            return at, self._take_hazards(at, at + size)
        raise OutOfMemory(size)

    def _next_fit(self, size: int, cursor: int, lo: int, hi: int) -> int | None:
        """Where ``size`` bytes go in [lo, hi) next-fit from ``cursor`` (``_next_fit_in``: at the
        cursor, else the next range with room, wrapping to ``lo``, the range behind the cursor
        last); None if the free ranges there have no room."""
        clipped = [(max(s, lo), min(e, hi)) for s, e in self.free if min(e, hi) > max(s, lo)]
        found = _next_fit_in(clipped, cursor, size)
        return None if found is None else found[1]

    def _best_oldest(self, size: int, lo: int, hi: int) -> int | None:
        """Where a large block goes in [lo, hi) (``_allocate_top``'s rule); None if it does not fit."""
        best: tuple[int, int] | None = None
        for s, e in self.free:
            start, end = max(s, lo), min(e, hi)
            if end - start < size:
                continue
            for at in dict.fromkeys((end - size, start)):
                key = (self._last_user(at, at + size), -at)
                if best is None or key < best:
                    best = key
        return None if best is None else -best[1]

    def _carve(self, at: int, size: int) -> tuple[int, list[int]]:
        """Take [at, at + size) (inside one free range) and inherit its hazards."""
        for i, (start, end) in enumerate(self.free):
            if start <= at and at + size <= end:
                self.free[i:i + 1] = [(s, e) for s, e in ((start, at), (at + size, end)) if e > s]
                break
        else:
            raise AssertionError(f"[{at}, {at + size}) is not free")
        self.in_use += size
        self.peak = max(self.peak, self.in_use)
        return at, self._take_hazards(at, at + size)

    def _allocate_top(self, size: int) -> tuple[int, list[int]]:
        """Large blocks go to an end of a free range, away from the small next-fit buffers, to limit
        fragmentation: of the places that fit, the one whose previous users are oldest (least
        recently freed), the topmost on ties.

        Taking the range freed longest ago is what lets a weight load run ahead of the compute: the
        next layer's weights land in a range nobody has touched for a while, so their DMA waits for
        no recent reader and streams while this layer computes (neuronx-cc prefetches weights across
        layers as far as SBUF holds them). Always taking the topmost range would hand every large
        block the one its predecessor just left, and each load would wait for the matmul before it.
        """
        at = self._best_oldest(size, 0, self.capacity)
        if at is None:
            raise OutOfMemory(size)
        return self._carve(at, size)

    def _overlapping(self, start: int, end: int) -> range:
        """Positions in ``tombstones`` of those overlapping [start, end). Tombstones never overlap
        (a range is freed only after it was allocated, which took the tombstones there), so kept in
        order of start their ends are in order too, and two bisections find them."""
        tombs = self.tombstones
        lo = bisect.bisect_right(tombs, start, key=_TOMB_END)
        hi = bisect.bisect_left(tombs, end, lo=lo, key=_TOMB_START)
        return range(lo, hi)

    def _last_user(self, start: int, end: int) -> int:
        """The newest node that last touched [start, end) before it was freed (-1: none)."""
        newest = -1
        for i in self._overlapping(start, end):
            nodes = self.tombstones[i].nodes
            if nodes:
                newest = max(newest, max(nodes))
        return newest

    def release(self, start: int, size: int, nodes: list[int]) -> None:
        size = _aligned(size)
        # the free list stays sorted and coalesced: only the new range's neighbours can join it
        free = self.free
        i = bisect.bisect_left(free, (start, start + size))
        if (i < len(free) and free[i][0] < start + size) or (i > 0 and free[i - 1][1] > start):
            raise DoubleFree(f"[{start}, {start + size})")
        self.in_use -= size
        if nodes:
            bisect.insort(self.tombstones, _Tombstone(start, start + size, list(nodes)),
                          key=_TOMB_START)
        free.insert(i, (start, start + size))
        if i + 1 < len(free) and free[i][1] == free[i + 1][0]:
            free[i:i + 2] = [(free[i][0], free[i + 1][1])]
        if i > 0 and free[i - 1][1] == free[i][0]:
            free[i - 1:i + 1] = [(free[i - 1][0], free[i][1])]

    def fits(self, sizes: list[int]) -> bool:
        """Whether buffers of these sizes could all be allocated now (first fit, largest first)."""
        return _fits_in([e - s for s, e in self.free], sizes)

    def fits_freeing(self, sizes: list[int], ranges: list[tuple[int, int]]) -> bool:
        """Whether :meth:`fits` would hold once the buffers at ``ranges`` ((start, size), each in
        use now) were released: what spilling them would make room for (``Context.make_room``)."""
        freed = sorted((start, start + _aligned(size)) for start, size in ranges)
        merged: list[list[int]] = []
        for start, end in heapq.merge(self.free, freed):
            if merged and merged[-1][1] >= start:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        return _fits_in([e - s for s, e in merged], sizes)

    def largest_free(self) -> int:
        return max((e - s for s, e in self.free), default=0)

    def merge_tombstones(self, compact: Callable[[set[int]], list[int]]) -> None:
        """Each free range that holds tombstones gets one tombstone over the whole range, with the
        nodes of those under it (``compact`` keeps the latest of each lane): what was freed where
        is forgotten, not who must be waited for (``layer_boundary.merge_tombstones`` says why)."""
        tombs = self.tombstones
        if not tombs:
            return
        merged: list[_Tombstone] = []
        i = 0
        for start, end in self.free:
            nodes: set[int] = set()
            while i < len(tombs) and tombs[i].start < end:
                if tombs[i].end > start:
                    nodes.update(tombs[i].nodes)
                i += 1
            if nodes:
                merged.append(_Tombstone(start, end, compact(nodes)))
        self.tombstones = merged

    def _take_hazards(self, start: int, end: int) -> list[int]:
        """The nodes of the tombstones under [start, end) (at most the newest 64), which leave;
        the parts of them outside the range stay for later allocations there."""
        hazards: list[int] = []
        span = self._overlapping(start, end)
        if not span:
            return hazards
        kept: list[_Tombstone] = []
        for t in self.tombstones[span.start:span.stop]:
            hazards.extend(t.nodes)
            if len(hazards) > 64:
                hazards = sorted(set(hazards))[-64:]
            if t.start < start:
                kept.append(_Tombstone(t.start, start, t.nodes))
            if t.end > end:
                kept.append(_Tombstone(end, t.end, t.nodes))
        self.tombstones[span.start:span.stop] = kept
        return hazards


@dataclass
class BankAllocator:
    """PSUM: a fixed number of banks, handed out round-robin so evictions overlap new matmuls."""

    banks: int
    busy: list[bool] = field(default_factory=list)
    hazards: list[list[int]] = field(default_factory=list)
    cursor: int = 0

    def __post_init__(self) -> None:
        self.busy = [False] * self.banks
        self.hazards = [[] for _ in range(self.banks)]

    def allocate(self) -> tuple[int, list[int]]:
        for step in range(self.banks):
            bank = (self.cursor + step) % self.banks
            if not self.busy[bank]:
                self.busy[bank] = True
                self.cursor = (bank + 1) % self.banks
                hazards, self.hazards[bank] = self.hazards[bank], []
                return bank, hazards
        raise OutOfMemory("psum")

    def release(self, bank: int, nodes: list[int]) -> None:
        self.busy[bank] = False
        self.hazards[bank] = list(nodes)
