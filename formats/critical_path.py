"""What released what: each event's releasing predecessor, the critical path, engine idle by cause.

    graph = depgraph.load_graph(profile)
    rel = release(graph)                  # per event: the predecessor that released it last
    path = critical_path(graph, rel)      # per execution: last event back to the start
    idle = idle_gaps(graph, rel)          # per engine: every idle interval and what it waited for

**The releasing predecessor** of an event n that started at s(n) is, among its candidates that
ended no later than s(n), the one that ended last (ties: the larger kind code -- collective, then
DMA transfer, then instruction -- then the larger id). Candidates:

* the previous instruction of the same timeline row (by start, then id): engines run in order;
* the sources of every ``Flow`` edge into n (semaphore waits, DMA triggers, collectives).

If no explicit candidate ended exactly at s(n) -- a wait the profile has no edge for (in-order DMA
queue completion, an SBUF/PSUM port shared with another engine, a profile without ``Flow``) --
an instruction or collective takes, if it ended later than the explicit choice, the event of the
same execution that ended last at or before s(n) among those that started before s(n) (marked
*implicit*). A DMA transfer is never given an implicit predecessor: its start after its trigger is
its queue's latency.

**The critical path** of an execution is the chain of releasing predecessors from its last event
(largest end; ties as above) back to an event with none. Each event on it contributes
``end(n) - end(pred(n))`` (the first one ``end(n) - window start``), so the contributions tile the
execution: the path length is exactly the execution's device time, and the part of a contribution
before the event's start (``wait``) is the latency or queueing between the release and the start
(a DMA queue's fixed latency, for example). The time from the last event's end to the window's end
is ``host``.

**Idle attribution.** An engine's idle intervals are the gaps in the union of its instructions
(both Tensor rows together) inside each execution window. A gap ending at the start of instruction
k is attributed to what k waited for: its releasing predecessor p, as ``dma:<queue>``,
``engine:<Engine>`` (another engine's instruction; its own other row for Tensor),
``collective:<operation>``; or ``host`` when the first instruction of an execution had nothing to
wait for; or ``starved`` when p had already ended before the gap began (nothing visible held it)
and for the time after the engine's last instruction (no work left). Σ over causes = idle time.

The loops are compiled (numba, as the core's scheduler) and walk the events in the orders of
``formats.event_order`` (by start, by end, per row: built from the rows' own order, no global sort):
one pass over the edges, one over the events by start for the as-of predecessors, one for every
engine's gaps, one walk along the path. ``tests/fixtures/analysis_reference.py`` is the same
definition written plainly (global sorts, a search per event); tests require identical results.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from formats.depgraph import CC, DMA, INSTRUCTION, DepGraph
from formats.event_order import event_order
from formats.schema import ENGINE_NAMES

__all__ = ["HOST", "STARVED", "IdleGaps", "Path", "Release", "cause_name", "critical_path", "idle_gaps",
           "release"]

HOST = "host"
STARVED = "starved"
IMPLICIT_SCAN = 64  # events examined below the as-of position for one implicit predecessor


@dataclass(frozen=True)
class Release:
    """Per event: its releasing predecessor (-1: none) and whether it was inferred from timing."""

    pred: np.ndarray  # int64
    implicit: np.ndarray  # bool


@njit(cache=True, nogil=True)
def _release(start: np.ndarray, end: np.ndarray, kind: np.ndarray, execution: np.ndarray,
             prev_same: np.ndarray, src: np.ndarray, dst: np.ndarray, by_start: np.ndarray,
             by_end: np.ndarray, pred: np.ndarray, implicit: np.ndarray) -> None:
    """Explicit candidates first: the previous instruction of the row, then every edge (one pass over
    the edges in file order; the choice -- largest (end, index) that ended by the start -- does not
    depend on their order). Then, for the events no explicit candidate released exactly at their
    start, the as-of scan, with the events visited by start so the position in the by-end order only
    moves forward (no binary search per event)."""
    n = start.size
    for i in range(n):
        p = prev_same[i]
        pred[i] = p if p >= 0 and end[p] <= start[i] else -1
        implicit[i] = False
    # the best so far is always pred[i]: its end is end[pred[i]] (no second array of ends)
    for k in range(src.size):
        q = src[k]
        i = dst[k]
        r = end[q]
        if r <= start[i]:
            p = pred[i]
            if p < 0 or r > end[p] or (r == end[p] and q > p):
                pred[i] = q
    lowest = np.int64(-(2 ** 62))
    j = -1  # the last position of by_end whose event ended at or before s
    m = by_end.size
    for t in range(by_start.size):
        i = by_start[t]
        s = start[i]
        while j + 1 < m and end[by_end[j + 1]] <= s:
            j += 1
        p = pred[i]
        best = end[p] if p >= 0 else lowest
        if kind[i] == DMA or (p >= 0 and best == s):
            continue
        # as-of: the last event (by end, then index) with end <= s that started before s
        jj = j
        steps = 0
        while jj >= 0 and steps < IMPLICIT_SCAN:
            q = by_end[jj]
            if end[q] <= best:
                break
            if execution[q] != execution[i]:
                break
            if start[q] < s and q != i:
                pred[i] = q
                implicit[i] = True
                break
            jj -= 1
            steps += 1


def release(graph: DepGraph) -> Release:
    """Every event's releasing predecessor (module docstring)."""
    order = event_order(graph)
    pred = np.empty(graph.n, np.int64)
    implicit = np.empty(graph.n, np.bool_)
    _release(graph.start, graph.end, graph.kind, graph.execution, order.prev_in_lane, graph.edge_src,
             graph.edge_dst, order.by_start, order.by_end, pred, implicit)
    return Release(pred, implicit)


# -- the critical path -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Path:
    """The critical path of every execution, last event first within each execution.

    ``events``: event indices on the path; ``contribution_ns``: what each adds to the path length
    (end minus the predecessor's end); ``wait_ns``: the part of it before the event started;
    ``host_ns``: per execution, window end minus the last event's end (and the whole window for an
    execution without events). Σ contribution + Σ host = Σ window lengths = device time."""

    events: np.ndarray
    contribution_ns: np.ndarray
    wait_ns: np.ndarray
    implicit: np.ndarray
    host_ns: np.ndarray  # per execution

    @property
    def length_ns(self) -> int:
        return int(self.contribution_ns.sum() + self.host_ns.sum())


@njit(cache=True, nogil=True)
def _last_events(end: np.ndarray, execution: np.ndarray, last: np.ndarray) -> None:
    """Per execution, the event of largest (end, index): one pass, no sort."""
    for i in range(end.size):
        w = execution[i]
        j = last[w]
        if j < 0 or end[i] >= end[j]:
            last[w] = i


@njit(cache=True, nogil=True)
def _walk(start: np.ndarray, end: np.ndarray, execution: np.ndarray, pred: np.ndarray,
          last: np.ndarray, window_start: np.ndarray, out: np.ndarray, contrib: np.ndarray,
          wait: np.ndarray) -> int:
    k = 0
    n = start.size
    for w in range(last.size):
        i = last[w]
        steps = 0
        while i >= 0 and steps <= n:
            p = pred[i]
            if p >= 0 and execution[p] != execution[i]:
                p = -1
            r = end[p] if p >= 0 else window_start[w]
            if r > start[i]:
                r = start[i]
            out[k] = i
            contrib[k] = end[i] - r
            wait[k] = start[i] - r
            k += 1
            i = p
            steps += 1
    return k


def critical_path(graph: DepGraph, rel: Release) -> Path:
    """The critical path of each execution window (module docstring)."""
    n_windows = graph.windows.shape[0]
    last = np.full(n_windows, -1, np.int64)
    host = np.zeros(n_windows, np.int64)
    if graph.n:
        _last_events(graph.end, graph.execution, last)
    for w in range(n_windows):
        a, b = graph.windows[w]
        host[w] = b - (graph.end[last[w]] if last[w] >= 0 else a)
    out = np.empty(graph.n, np.int64)
    contrib = np.empty(graph.n, np.int64)
    wait = np.empty(graph.n, np.int64)
    k = _walk(graph.start, graph.end, graph.execution, rel.pred, last,
              graph.windows[:, 0].copy() if n_windows else np.zeros(0, np.int64), out, contrib, wait)
    events = out[:k].copy()
    return Path(events, contrib[:k].copy(), wait[:k].copy(), rel.implicit[events], host)


# -- idle attribution ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class IdleGaps:
    """Every idle interval of every engine: ``engine`` (index into ENGINE_NAMES), ``start``/``end``
    (ns), ``waiter`` (the instruction that started at its end; -1 for the time after the engine's
    last instruction of an execution), ``cause`` (index into ``causes``). Listed engine by engine (in
    ENGINE_NAMES order), each engine's gaps in time order."""

    engine: np.ndarray
    start: np.ndarray
    end: np.ndarray
    waiter: np.ndarray
    cause: np.ndarray
    causes: list[str]
    engines: list[str]  # engines that ran anything (the ones idle is reported for)


@njit(cache=True, nogil=True, inline="always")
def _cause(g_start: int, w: int, pred: np.ndarray, end: np.ndarray, execution: np.ndarray,
           windows: np.ndarray, kind: np.ndarray, engine: np.ndarray, lane: np.ndarray, width: int,
           n_engines: int) -> int:
    """A gap's cause code: 0 host, 1 starved, or -(slot + 2) when its waiter ``w``'s predecessor held
    it; the slot is a small key of that predecessor, one per cause name (``cause_name``): its engine
    for an instruction, else its kind and lane."""
    if w < 0:
        return 1  # after the engine's last instruction: no work left
    p = pred[w]
    if p < 0:
        return 0 if g_start == windows[execution[w], 0] else 1
    if end[p] <= g_start:  # it ended before the gap began: nothing visible held the waiter
        return 1
    if kind[p] == INSTRUCTION and engine[p] >= 0:
        return -(engine[p] + 1 + 2)
    # a transfer, a collective, or an instruction of no known engine: named by its lane
    return -(kind[p] * width + lane[p] + n_engines + 1 + 2)


@njit(cache=True, nogil=True)
def _gaps(by_start: np.ndarray, n_instr: int, start: np.ndarray, end: np.ndarray, kind: np.ndarray,
          engine: np.ndarray, lane: np.ndarray, execution: np.ndarray, windows: np.ndarray,
          pred: np.ndarray, width: int, offset: np.ndarray, g_start: np.ndarray, g_end: np.ndarray,
          g_waiter: np.ndarray, g_cause: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Gaps in the union of each engine's instructions inside each window, and their causes, every
    engine in one pass over the events by start; engine e writes from ``offset[e]``. ``first[e, slot]``
    gets the predecessor behind engine e's first gap of each held-cause slot (the one that names it).
    Returns each engine's gap count."""
    n_engines = offset.size
    w_prev = np.full(n_engines, -1, np.int64)
    reach = np.zeros(n_engines, np.int64)
    k = offset.copy()
    for t in range(by_start.size + n_engines):
        if t < by_start.size:
            i = by_start[t]
            if i >= n_instr or engine[i] < 0:
                continue
            e = engine[i]
            w = execution[i]
        else:  # after the last event: each engine's tail and the windows it never ran in
            i = -1
            e = t - by_start.size
            if w_prev[e] < 0:
                continue
            w = windows.shape[0]
        if w != w_prev[e]:
            if w_prev[e] >= 0 and windows[w_prev[e], 1] > reach[e]:  # tail of the previous window
                g_start[k[e]], g_end[k[e]], g_waiter[k[e]], g_cause[k[e]] = (
                    reach[e], windows[w_prev[e], 1], -1, 1)
                k[e] += 1
            for v in range(w_prev[e] + 1, w):  # windows without any instruction of this engine
                g_start[k[e]], g_end[k[e]] = windows[v, 0], windows[v, 1]
                g_waiter[k[e]], g_cause[k[e]] = -1, 1
                k[e] += 1
            if i < 0:
                continue
            reach[e] = windows[w, 0]
            w_prev[e] = w
        if start[i] > reach[e]:
            c = _cause(reach[e], i, pred, end, execution, windows, kind, engine, lane, width, n_engines)
            g_start[k[e]], g_end[k[e]], g_waiter[k[e]], g_cause[k[e]] = reach[e], start[i], i, c
            if c < 0 and first[e, -c - 2] < 0:
                first[e, -c - 2] = pred[i]
            k[e] += 1
        if end[i] > reach[e]:
            reach[e] = end[i]
    return k - offset


@njit(cache=True, nogil=True)
def _pack(offset: np.ndarray, count: np.ndarray, arrays: tuple[np.ndarray, np.ndarray, np.ndarray],
          cause: np.ndarray, lut: np.ndarray) -> int:
    """Move each engine's gaps next to the previous engine's (in place: they only move left) and turn
    held-cause slots into cause indices (``lut``); returns the number of gaps."""
    to = 0
    for e in range(offset.size):
        for j in range(offset[e], offset[e] + count[e]):
            for a in arrays:
                a[to] = a[j]
            c = cause[j]
            cause[to] = lut[-c - 2] if c < 0 else c
            to += 1
    return to


def cause_name(graph: DepGraph, pred: int) -> str:
    """``dma:<queue>``, ``engine:<Engine>`` or ``collective:<operation>`` for a predecessor event."""
    kind = int(graph.kind[pred])
    if kind == DMA:
        return f"dma:{graph.lane_name(pred)}"
    if kind == CC:
        return f"collective:{graph.lane_name(pred)}"
    return f"engine:{graph.engine_name(pred) or graph.lane_name(pred)}"


@njit(cache=True, nogil=True)
def _engine_counts(engine: np.ndarray, n_engines: int) -> np.ndarray:
    """Instructions per engine code (code -1, no known engine, not counted)."""
    counts = np.zeros(n_engines, np.int64)
    for e in engine:
        if e >= 0:
            counts[e] += 1
    return counts


def idle_gaps(graph: DepGraph, rel: Release) -> IdleGaps:
    """Every idle interval of every engine that ran anything, with its cause (module docstring)."""
    n = graph.n_instr
    counts = _engine_counts(graph.engine[:n], len(ENGINE_NAMES))
    present = [int(e) for e in np.flatnonzero(counts)]
    windows = graph.windows if graph.windows.size else np.zeros((1, 2), np.int64)
    # engine e's gaps go to [offset[e], offset[e] + its instructions + 2 per window + 1), then packed
    capacity = counts + 2 * windows.shape[0] + 1
    offset = np.concatenate([[0], np.cumsum(capacity)[:-1]]).astype(np.int64)
    total = int(capacity.sum())
    gs, ge, gw = np.empty(total, np.int64), np.empty(total, np.int64), np.empty(total, np.int64)
    gc = np.empty(total, np.int32)
    # held causes: one slot per (kind, engine or lane) of the predecessor, named by the first gap
    # (in engine order) that has it
    width = len(graph.lanes) + len(ENGINE_NAMES) + 1
    first = np.full((len(ENGINE_NAMES), 3 * width), -1, np.int64)
    found = _gaps(event_order(graph).by_start, n, graph.start, graph.end, graph.kind, graph.engine,
                  graph.lane, graph.execution, windows, rel.pred, width, offset, gs, ge, gw, gc, first)
    causes = [HOST, STARVED]
    lut = np.zeros(3 * width, np.int32)
    for slot in range(3 * width):
        holders = [int(first[e, slot]) for e in present if first[e, slot] >= 0]
        if holders:
            name = cause_name(graph, holders[0])
            if name not in causes:
                causes.append(name)
            lut[slot] = causes.index(name)
    k = _pack(offset, found, (gs, ge, gw), gc, lut)
    engine = np.repeat(np.array(present, np.int8), [int(found[e]) for e in present])
    return IdleGaps(engine, gs[:k], ge[:k], gw[:k], gc[:k], causes, [ENGINE_NAMES[e] for e in present])
