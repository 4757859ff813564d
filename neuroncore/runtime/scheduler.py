"""The timing model: one pass over the program's nodes in their global order.

Each engine runs its stream in order: an instruction starts when its engine is free and every node
it waits for (its semaphores) has completed, and occupies the engine for its cost. The Tensor engine
has two tracks: a LoadStationary may start once the previous MultiplyMoving has started (background
weight load into the shadow registers), and a MultiplyMoving starts after its LoadStationary ends.
A DMA transfer starts a fixed latency after its trigger instruction ends; its share on each of the
DMA engines it is spread over queues behind earlier transfers on that engine (FIFO), and transfers of
one queue complete in order (the queue's semaphore counts completions).

Because every dependency points backwards in the global order, one pass computes the exact
schedule. The loop is compiled with numba: it is the hot path of every simulated execution.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from neuroncore.compiler.program import RES_DMA, RES_TENSOR_LS, RES_TENSOR_MM, Program


@njit(cache=True, nogil=True)
def _schedule(resource, cost_ns, queue, dma_engines, dep_ptr, dep_idx, trigger, n_queues,
              n_dma_engines, dma_fixed_ns, t0, start, end, wait, pkt_start, pkt_end, pkt_engine):
    engine_free = np.full(7, t0)
    dma_free = np.full(n_dma_engines, t0)
    queue_done = np.full(n_queues, t0)
    last_mm_start = t0
    rotate = 0
    p = 0
    n = resource.shape[0]
    for i in range(n):
        r = resource[i]
        ready = t0
        for j in range(dep_ptr[i], dep_ptr[i + 1]):
            e = end[dep_idx[j]]
            if e > ready:
                ready = e
        if r == RES_DMA:
            s_min = end[trigger[i]] + dma_fixed_ns
            if ready > s_min:
                s_min = ready
            first = 1e300
            finish = s_min
            for k in range(dma_engines[i]):
                e_idx = (rotate + k) % n_dma_engines
                s = s_min if s_min > dma_free[e_idx] else dma_free[e_idx]
                f = s + cost_ns[i]
                dma_free[e_idx] = f
                pkt_start[p] = s
                pkt_end[p] = f
                pkt_engine[p] = e_idx
                p += 1
                if f > finish:
                    finish = f
                if s < first:
                    first = s
            rotate = (rotate + dma_engines[i]) % n_dma_engines
            q = queue[i]
            if queue_done[q] > finish:
                finish = queue_done[q]
            queue_done[q] = finish
            start[i] = first
            end[i] = finish
            wait[i] = first - s_min if first > s_min else 0.0
            continue
        avail = engine_free[r]
        if r == RES_TENSOR_LS:
            if last_mm_start > avail:
                avail = last_mm_start
        elif r == RES_TENSOR_MM:
            if engine_free[RES_TENSOR_LS] > avail:
                avail = engine_free[RES_TENSOR_LS]
        s = avail if avail > ready else ready
        wait[i] = ready - avail if ready > avail else 0.0
        start[i] = s
        end[i] = s + cost_ns[i]
        engine_free[r] = end[i]
        if r == RES_TENSOR_MM:
            last_mm_start = s
    return p


@dataclass
class Timeline:
    """Start/end of every node (ns on the core's clock) and of every DMA packet (one per engine share)."""

    start_ns: np.ndarray
    end_ns: np.ndarray
    wait_ns: np.ndarray  # instructions: time blocked on semaphores; DMA: queueing behind other transfers
    packet_node: np.ndarray  # int64: the transfer each packet belongs to
    packet_start_ns: np.ndarray
    packet_end_ns: np.ndarray
    packet_engine: np.ndarray  # int16: DMA engine index 0..15

    @property
    def begin_ns(self) -> float:
        return float(self.start_ns.min()) if self.start_ns.size else 0.0

    @property
    def finish_ns(self) -> float:
        return float(self.end_ns.max()) if self.end_ns.size else 0.0


def schedule(program: Program, t0_ns: float = 0.0) -> Timeline:
    """Simulate ``program`` starting at ``t0_ns``; pure function of the program's static costs."""
    n = program.n_nodes
    start = np.empty(n, np.float64)
    end = np.empty(n, np.float64)
    wait = np.empty(n, np.float64)
    is_dma = program.resource == RES_DMA
    n_packets = int(program.dma_engines[is_dma].astype(np.int64).sum())
    pkt_start = np.empty(n_packets, np.float64)
    pkt_end = np.empty(n_packets, np.float64)
    pkt_engine = np.empty(n_packets, np.int16)
    spec = program.spec
    _schedule(program.resource, program.cost_ns, program.queue, program.dma_engines,
              program.dep_ptr, program.dep_idx, program.trigger, len(program.queues),
              spec.dma_engines, spec.dma_fixed_latency_ns, float(t0_ns), start, end, wait,
              pkt_start, pkt_end, pkt_engine)
    dma_nodes = np.flatnonzero(is_dma)
    packet_node = np.repeat(dma_nodes, program.dma_engines[dma_nodes].astype(np.int64))
    return Timeline(start, end, wait, packet_node, pkt_start, pkt_end, pkt_engine)


assert RES_TENSOR_LS == 0 and RES_TENSOR_MM == 5 and RES_DMA == 6  # constants baked into the loop
