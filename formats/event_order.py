"""The orders every causal analysis walks a profile's events in, built without a global sort.

    order = event_order(graph)      # cached on the graph: computed once per load
    order.by_start                  # every event, by (start, index)
    order.by_end                    # every event, by (end, index)
    order.prev_in_lane              # per instruction: the one before it on its timeline row

Why not ``np.argsort``: a stable sort of ten million int64 keys takes ~1.6 s on this project's
machines, and the analyses need three of them (the rows' order by start, the as-of order by end, the
temporal unions' order by start). But a profile's events arrive almost sorted: an engine runs its
instruction stream in order, so each timeline row, read in id order, is already sorted by start and
(when its instructions do not overlap) by end; a DMA queue or a collective stream is nearly so. So:

1. the events are grouped by (kind, lane) with a counting sort (stable, O(n)): each group in index
   order, checked on the way for order by start and by end;
2. a group out of order (a DMA queue whose transfers overlap, a row whose instructions overlap) is
   sorted on its own;
3. the sorted groups are merged with a heap keyed (key, index): O(n log k) for k groups, and a
   stretch of one group that comes before every other group's head is copied in one go.

When the events in index order are already a few time-ordered stretches (at most ``NATURAL_RUNS``:
a profile written in time order), those stretches are merged instead of the rows: mostly copies.

The result is exactly a stable argsort by start (by end): ties go by index, as ``kind="stable"``
gives them. ``tests/formats/test_event_order.py`` checks it against ``np.argsort`` on random and
hand-built inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numba import njit

if TYPE_CHECKING:
    from formats.depgraph import DepGraph

__all__ = ["EventOrder", "event_order", "group_runs", "merge_runs", "sort_runs"]


@dataclass(frozen=True)
class EventOrder:
    """The orders of one graph's events (module docstring)."""

    by_start: np.ndarray  # int64: every event, by (start, index)
    by_end: np.ndarray  # int64: every event, by (end, index)
    prev_in_lane: np.ndarray  # int64 per event: previous instruction on its row by (start, id), or -1


@njit(cache=True, nogil=True)
def group_runs(kind: np.ndarray, lane: np.ndarray, n_lanes: int, start: np.ndarray,
               end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Indices grouped by (kind, lane) -- group ``kind * n_lanes + lane`` -- each group in index order:
    ``ptr`` (group g is ``idx[ptr[g]:ptr[g + 1]]``) and ``idx``; and per group whether it is already
    ordered by start and by end. A counting sort: two passes, no comparisons between events."""
    n_keys = 3 * n_lanes
    ptr = np.zeros(n_keys + 1, np.int64)
    for i in range(kind.size):
        ptr[kind[i] * n_lanes + lane[i] + 1] += 1
    for g in range(n_keys):
        ptr[g + 1] += ptr[g]
    fill = ptr[:-1].copy()
    idx = np.empty(kind.size, np.int64)
    by_start = np.ones(n_keys, np.bool_)
    by_end = np.ones(n_keys, np.bool_)
    for i in range(kind.size):
        g = kind[i] * n_lanes + lane[i]
        k = fill[g]
        if k > ptr[g]:
            before = idx[k - 1]
            if start[i] < start[before]:
                by_start[g] = False
            if end[i] < end[before]:
                by_end[g] = False
        idx[k] = i
        fill[g] = k + 1
    return ptr, idx, by_start, by_end


@njit(cache=True, nogil=True)
def sort_runs(idx: np.ndarray, ptr: np.ndarray, value: np.ndarray, ordered: np.ndarray) -> np.ndarray:
    """``idx`` with each group ordered by (value, index), in place (and returned): the groups
    ``ordered`` says are (the common case) stay as they are; the others get a stable sort of their
    own. Each group's entries must be in index order or sorted by (another key, index): they are put
    back in index order first, so ties go by index."""
    for g in range(ptr.size - 1):
        if ordered[g]:
            continue
        a, b = ptr[g], ptr[g + 1]
        run = np.sort(idx[a:b])  # index order: a stable sort keeps ties by index
        keys = np.empty(b - a, value.dtype)
        for k in range(b - a):
            keys[k] = value[run[k]]
        perm = np.argsort(keys, kind="mergesort")
        for k in range(b - a):
            idx[a + k] = run[perm[k]]
    return idx


@njit(cache=True, nogil=True)
def natural_runs(value: np.ndarray, most: int) -> np.ndarray:
    """Boundaries (``ptr``) of the maximal non-decreasing stretches of ``value`` in index order, or an
    empty array when there are more than ``most`` of them. A profile written in time order (a
    writer's chunks, a recorder that emits by start) is a few such stretches."""
    ptr = np.empty(most + 1, np.int64)
    ptr[0] = 0
    runs = 0
    for i in range(1, value.size):
        if value[i] < value[i - 1]:
            runs += 1
            if runs >= most:
                return np.zeros(0, np.int64)
            ptr[runs] = i
    runs += 1
    ptr[runs] = value.size
    return ptr[:runs + 1].copy()


@njit(cache=True, nogil=True, inline="always")
def _at(idx: np.ndarray, p: int) -> int:
    return idx[p] if idx.size else p


@njit(cache=True, nogil=True)
def merge_runs(idx: np.ndarray, ptr: np.ndarray, value: np.ndarray) -> np.ndarray:
    """Merge groups each ordered by (value, index) into one order by (value, index). An empty ``idx``
    means the groups are index ranges (``natural_runs``). A binary heap of the groups' heads, each
    head's (value, index) kept in the heap itself; the group on top keeps handing out events while
    they come before the runner-up's head (one comparison each: long stretches cost a copy)."""
    n_groups = ptr.size - 1
    total = ptr[-1]
    out = np.empty(total, np.int64)
    pos = ptr[:-1].copy()
    h_group = np.empty(n_groups, np.int64)
    h_value = np.empty(n_groups, value.dtype)
    h_index = np.empty(n_groups, np.int64)
    size = 0
    for g in range(n_groups):
        if ptr[g] < ptr[g + 1]:
            h_group[size] = g
            h_index[size] = _at(idx, ptr[g])
            h_value[size] = value[h_index[size]]
            size += 1
    for top in range(size // 2 - 1, -1, -1):
        _sift(h_group, h_value, h_index, top, size)
    t = 0
    while size > 0:
        g = h_group[0]
        p, stop = pos[g], ptr[g + 1]
        out[t] = h_index[0]
        t += 1
        p += 1
        if size == 1:
            while p < stop:
                out[t] = _at(idx, p)
                t += 1
                p += 1
        else:
            c = 2 if size > 2 and (h_value[2] < h_value[1]
                                   or (h_value[2] == h_value[1] and h_index[2] < h_index[1])) else 1
            bound_v, bound_i = h_value[c], h_index[c]
            while p < stop:
                i = _at(idx, p)
                v = value[i]
                if v < bound_v or (v == bound_v and i < bound_i):
                    out[t] = i
                    t += 1
                    p += 1
                else:
                    break
        pos[g] = p
        if p < stop:
            h_index[0] = _at(idx, p)
            h_value[0] = value[h_index[0]]
        else:
            size -= 1
            if size == 0:
                break
            h_group[0], h_value[0], h_index[0] = h_group[size], h_value[size], h_index[size]
        _sift(h_group, h_value, h_index, 0, size)
    return out


@njit(cache=True, nogil=True, inline="always")
def _sift(h_group: np.ndarray, h_value: np.ndarray, h_index: np.ndarray, k: int, size: int) -> None:
    """Move heap entry ``k`` down to its place (ordered by (value, index))."""
    g, v, i = h_group[k], h_value[k], h_index[k]
    while True:
        c = 2 * k + 1
        if c >= size:
            break
        if c + 1 < size and (h_value[c + 1] < h_value[c]
                             or (h_value[c + 1] == h_value[c] and h_index[c + 1] < h_index[c])):
            c += 1
        if h_value[c] < v or (h_value[c] == v and h_index[c] < i):
            h_group[k], h_value[k], h_index[k] = h_group[c], h_value[c], h_index[c]
            k = c
        else:
            break
    h_group[k], h_value[k], h_index[k] = g, v, i


@njit(cache=True, nogil=True)
def _previous(runs: np.ndarray, ptr: np.ndarray, n_groups: int, n: int) -> np.ndarray:
    """Per event, the one before it in its group (groups ``0 .. n_groups - 1`` only), else -1."""
    prev = np.full(n, -1, np.int64)
    for g in range(n_groups):
        for k in range(ptr[g] + 1, ptr[g + 1]):
            prev[runs[k]] = runs[k - 1]
    return prev


NATURAL_RUNS = 64  # at most this many time-ordered stretches: merge those instead of the rows


def _orders(graph: DepGraph) -> EventOrder:
    n_lanes = max(len(graph.lanes), 1)
    # groups: (kind, lane); instructions (kind 0) first, so their rows are groups 0 .. n_lanes - 1
    ptr, runs, start_ordered, end_ordered = group_runs(graph.kind, graph.lane, n_lanes, graph.start,
                                                       graph.end)
    sort_runs(runs, ptr, graph.start, start_ordered)
    prev = _previous(runs, ptr, n_lanes, graph.n)
    none = np.zeros(0, np.int64)
    natural = natural_runs(graph.start, NATURAL_RUNS)
    by_start = merge_runs(none, natural, graph.start) if natural.size else merge_runs(runs, ptr, graph.start)
    natural = natural_runs(graph.end, NATURAL_RUNS)
    if natural.size:
        by_end = merge_runs(none, natural, graph.end)
    else:  # the same groups, now by end (in place: the by-start ones are no longer needed); a group
        # re-sorted by start is re-sorted by end too, even if it was in end order as read
        by_end = merge_runs(sort_runs(runs, ptr, graph.end, end_ordered & start_ordered), ptr, graph.end)
    return EventOrder(by_start, by_end, prev)


def event_order(graph: DepGraph) -> EventOrder:
    """The graph's event orders, computed on first use and kept with the graph (module docstring)."""
    cached = graph.cache.get("order")
    if cached is None:
        cached = graph.cache["order"] = _orders(graph)
    assert isinstance(cached, EventOrder)
    return cached
