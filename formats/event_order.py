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
   order;
2. each group is checked (one pass) and sorted on its own only when it is out of order (a DMA queue
   whose transfers overlap, a synthetic row whose instructions overlap);
3. the sorted groups are merged with a heap keyed (key, index): O(n log k) for k groups.

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
def group_runs(key: np.ndarray, n_keys: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices grouped by ``key`` (0 <= key < n_keys), each group in index order: ``ptr`` (group g is
    ``idx[ptr[g]:ptr[g + 1]]``) and ``idx``. A counting sort: two passes, no comparisons."""
    ptr = np.zeros(n_keys + 1, np.int64)
    for i in range(key.size):
        ptr[key[i] + 1] += 1
    for g in range(n_keys):
        ptr[g + 1] += ptr[g]
    fill = ptr[:-1].copy()
    idx = np.empty(key.size, np.int64)
    for i in range(key.size):
        g = key[i]
        idx[fill[g]] = i
        fill[g] += 1
    return ptr, idx


@njit(cache=True, nogil=True)
def sort_runs(idx: np.ndarray, ptr: np.ndarray, value: np.ndarray) -> np.ndarray:
    """A copy of ``idx`` with each group ordered by (value, index): groups already in that order (the
    common case) are only checked; the others get a stable sort of their own."""
    out = idx.copy()
    for g in range(ptr.size - 1):
        a, b = ptr[g], ptr[g + 1]
        ordered = True
        for k in range(a + 1, b):
            if value[out[k]] < value[out[k - 1]]:
                ordered = False
                break
        if ordered:
            continue
        run = out[a:b].copy()  # in index order: a stable sort keeps ties by index
        keys = np.empty(b - a, value.dtype)
        for k in range(b - a):
            keys[k] = value[run[k]]
        perm = np.argsort(keys, kind="mergesort")
        for k in range(b - a):
            out[a + k] = run[perm[k]]
    return out


@njit(cache=True, nogil=True)
def merge_runs(idx: np.ndarray, ptr: np.ndarray, value: np.ndarray) -> np.ndarray:
    """Merge groups each ordered by (value, index) into one order by (value, index): a binary heap of
    the groups' heads, each head's (value, index) kept in the heap itself so a comparison reads two
    small arrays, not the events."""
    n_groups = ptr.size - 1
    out = np.empty(idx.size, np.int64)
    pos = ptr[:-1].copy()
    h_group = np.empty(n_groups, np.int64)
    h_value = np.empty(n_groups, value.dtype)
    h_index = np.empty(n_groups, np.int64)
    size = 0
    for g in range(n_groups):
        if ptr[g] < ptr[g + 1]:
            h_group[size] = g
            h_index[size] = idx[ptr[g]]
            h_value[size] = value[h_index[size]]
            size += 1
    if size == 1:
        g = h_group[0]
        out[:] = idx[ptr[g]:ptr[g + 1]]
        return out
    for top in range(size // 2 - 1, -1, -1):
        _sift(h_group, h_value, h_index, top, size)
    for t in range(idx.size):
        out[t] = h_index[0]
        g = h_group[0]
        pos[g] += 1
        if pos[g] < ptr[g + 1]:
            h_index[0] = idx[pos[g]]
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


def _orders(graph: DepGraph) -> EventOrder:
    n_lanes = max(len(graph.lanes), 1)
    # groups: (kind, lane); instructions (kind 0) first, so their rows are groups 0 .. n_lanes - 1
    key = graph.kind.astype(np.int64) * n_lanes + graph.lane
    ptr, idx = group_runs(key, 3 * n_lanes)
    runs_start = sort_runs(idx, ptr, graph.start)
    prev = _previous(runs_start, ptr, n_lanes, graph.n)
    by_start = merge_runs(runs_start, ptr, graph.start)
    by_end = merge_runs(sort_runs(idx, ptr, graph.end), ptr, graph.end)
    return EventOrder(by_start, by_end, prev)


def event_order(graph: DepGraph) -> EventOrder:
    """The graph's event orders, computed on first use and kept with the graph (module docstring)."""
    cached = graph.cache.get("order")
    if cached is None:
        cached = graph.cache["order"] = _orders(graph)
    assert isinstance(cached, EventOrder)
    return cached
