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

The loops are compiled (numba, as the core's scheduler): one pass over the edges, one over the
events, one walk along the path.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from formats.depgraph import CC, DMA, INSTRUCTION, DepGraph
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
def _csr(dst: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Incoming-edge CSR: edges sorted by target with a counting sort (O(E), no argsort)."""
    ptr = np.zeros(n + 1, np.int64)
    for k in range(dst.size):
        ptr[dst[k] + 1] += 1
    for i in range(n):
        ptr[i + 1] += ptr[i]
    fill = ptr[:-1].copy()
    order = np.empty(dst.size, np.int64)
    for k in range(dst.size):
        d = dst[k]
        order[fill[d]] = k
        fill[d] += 1
    return ptr, order


@njit(cache=True, nogil=True)
def _release(start: np.ndarray, end: np.ndarray, kind: np.ndarray, execution: np.ndarray,
             prev_same: np.ndarray, ptr: np.ndarray, order: np.ndarray, src: np.ndarray,
             by_end: np.ndarray, sorted_end: np.ndarray, pred: np.ndarray, implicit: np.ndarray) -> None:
    n = start.size
    for i in range(n):
        s = start[i]
        best = -1
        best_r = np.int64(-(2 ** 62))
        p = prev_same[i]
        if p >= 0 and end[p] <= s:
            best = p
            best_r = end[p]
        for k in range(ptr[i], ptr[i + 1]):
            q = src[order[k]]
            r = end[q]
            if r <= s and (r > best_r or (r == best_r and q > best)):
                best = q
                best_r = r
        pred[i] = best
        implicit[i] = False
        if kind[i] == DMA or (best >= 0 and best_r == s):
            continue
        # as-of: the last event (by end, then index) with end <= s that started before s
        j = np.searchsorted(sorted_end, s, side="right") - 1
        steps = 0
        while j >= 0 and steps < IMPLICIT_SCAN:
            q = by_end[j]
            if end[q] <= best_r:
                break
            if execution[q] != execution[i]:
                break
            if start[q] < s and q != i:
                pred[i] = q
                implicit[i] = True
                break
            j -= 1
            steps += 1


def release(graph: DepGraph) -> Release:
    """Every event's releasing predecessor (module docstring)."""
    n = graph.n
    prev_same = _previous_in_lane(graph)
    ptr, order = _csr(graph.edge_dst, n)
    by_end = np.argsort(graph.end, kind="stable")
    sorted_end = graph.end[by_end]
    pred = np.empty(n, np.int64)
    implicit = np.empty(n, np.bool_)
    _release(graph.start, graph.end, graph.kind, graph.execution, prev_same, ptr, order,
             graph.edge_src, by_end, sorted_end, pred, implicit)
    return Release(pred, implicit)


def _previous_in_lane(graph: DepGraph) -> np.ndarray:
    """Per instruction, the one before it on its timeline row (by start, then id); -1 otherwise."""
    n = graph.n_instr
    prev = np.full(graph.n, -1, np.int64)
    if n < 2:
        return prev
    by_start = np.argsort(graph.start[:n], kind="stable")  # rows are in id order: ties go by id
    by_lane = by_start[np.argsort(graph.lane[:n][by_start], kind="stable")]
    same = graph.lane[by_lane[1:]] == graph.lane[by_lane[:-1]]
    prev[by_lane[1:][same]] = by_lane[:-1][same]
    return prev


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
    last instruction of an execution), ``cause`` (index into ``causes``)."""

    engine: np.ndarray
    start: np.ndarray
    end: np.ndarray
    waiter: np.ndarray
    cause: np.ndarray
    causes: list[str]
    engines: list[str]  # engines that ran anything (the ones idle is reported for)


@njit(cache=True, nogil=True)
def _gaps(order: np.ndarray, start: np.ndarray, end: np.ndarray, execution: np.ndarray,
          windows: np.ndarray, g_start: np.ndarray, g_end: np.ndarray, g_waiter: np.ndarray) -> int:
    """Gaps in the union of the instructions ``order`` (sorted by start) inside each window."""
    k = 0
    w_prev = -1
    reach = np.int64(0)
    for j in range(order.size):
        i = order[j]
        w = execution[i]
        if w != w_prev:
            if w_prev >= 0 and windows[w_prev, 1] > reach:  # tail of the previous window
                g_start[k], g_end[k], g_waiter[k] = reach, windows[w_prev, 1], -1
                k += 1
            for v in range(w_prev + 1, w):  # windows without any instruction of this engine
                g_start[k], g_end[k], g_waiter[k] = windows[v, 0], windows[v, 1], -1
                k += 1
            reach = windows[w, 0]
            w_prev = w
        if start[i] > reach:
            g_start[k], g_end[k], g_waiter[k] = reach, start[i], i
            k += 1
        if end[i] > reach:
            reach = end[i]
    if w_prev >= 0:
        if windows[w_prev, 1] > reach:
            g_start[k], g_end[k], g_waiter[k] = reach, windows[w_prev, 1], -1
            k += 1
        for v in range(w_prev + 1, windows.shape[0]):
            g_start[k], g_end[k], g_waiter[k] = windows[v, 0], windows[v, 1], -1
            k += 1
    return k


def cause_name(graph: DepGraph, pred: int) -> str:
    """``dma:<queue>``, ``engine:<Engine>`` or ``collective:<operation>`` for a predecessor event."""
    kind = int(graph.kind[pred])
    if kind == DMA:
        return f"dma:{graph.lane_name(pred)}"
    if kind == CC:
        return f"collective:{graph.lane_name(pred)}"
    return f"engine:{graph.engine_name(pred) or graph.lane_name(pred)}"


def idle_gaps(graph: DepGraph, rel: Release) -> IdleGaps:
    """Every idle interval of every engine that ran anything, with its cause (module docstring)."""
    n = graph.n_instr
    engines = graph.engine[:n]
    present = [int(e) for e in np.flatnonzero(np.bincount(engines.astype(np.int64) + 1,
                                                          minlength=len(ENGINE_NAMES) + 1)[1:])]
    parts: list[tuple[np.ndarray, ...]] = []
    by_start = np.argsort(graph.start[:n], kind="stable")
    eng_sorted = engines[by_start]
    windows = graph.windows if graph.windows.size else np.zeros((1, 2), np.int64)
    for e in present:
        order = by_start[eng_sorted == e]
        cap = order.size + 2 * windows.shape[0] + 1
        gs, ge, gw = np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64)
        k = _gaps(order, graph.start, graph.end, graph.execution, windows, gs, ge, gw)
        parts.append((np.full(k, e, np.int8), gs[:k], ge[:k], gw[:k]))
    if parts:
        engine = np.concatenate([p[0] for p in parts])
        g_start = np.concatenate([p[1] for p in parts])
        g_end = np.concatenate([p[2] for p in parts])
        waiter = np.concatenate([p[3] for p in parts])
    else:
        engine = np.zeros(0, np.int8)
        g_start = g_end = waiter = np.zeros(0, np.int64)
    # causes: vectorised over the gaps, named per distinct (kind, lane/engine) of the predecessor
    causes = [HOST, STARVED]
    cause = np.full(engine.size, 1, np.int32)  # starved unless something says otherwise
    has_waiter = waiter >= 0
    pred = np.where(has_waiter, rel.pred[np.maximum(waiter, 0)], -1)
    first_of_window = has_waiter & (g_start == windows[graph.execution[np.maximum(waiter, 0)], 0])
    cause[has_waiter & (pred < 0) & first_of_window] = 0
    held = has_waiter & (pred >= 0)
    held &= graph.end[np.maximum(pred, 0)] > g_start
    if held.any():
        p = pred[held]
        # a small key per (kind, engine or lane): a lookup table, not a sort of millions of keys
        width = len(graph.lanes) + len(ENGINE_NAMES) + 1
        key = graph.kind[p].astype(np.int64) * width + np.where(
            graph.kind[p] == INSTRUCTION, graph.engine[p].astype(np.int64) + 1,
            graph.lane[p].astype(np.int64) + len(ENGINE_NAMES) + 1)
        first = np.full(3 * width, -1, np.int64)
        first[key[::-1]] = np.arange(key.size)[::-1]  # one gap with each key (any one names it)
        lut = np.zeros(3 * width, np.int32)
        for slot in np.flatnonzero(first >= 0).tolist():
            name = cause_name(graph, int(p[first[slot]]))
            if name not in causes:
                causes.append(name)
            lut[slot] = causes.index(name)
        cause[held] = lut[key]
    return IdleGaps(engine, g_start, g_end, waiter, cause, causes, [ENGINE_NAMES[e] for e in present])
