"""The timing model: one pass over the program's nodes in their global order.

Each engine runs its stream in order: an instruction starts when its engine is free and every node
it waits for (its semaphores) has completed, and occupies the engine for its cost. The Tensor engine
has two tracks: a LoadStationary may start once the previous MultiplyMoving has started (background
weight load into the shadow registers), and a MultiplyMoving starts after its LoadStationary ends.
A DMA transfer starts a fixed latency after its trigger instruction ends; its share on each of the
DMA engines it is spread over queues behind earlier transfers on that engine (FIFO), and transfers of
one queue complete in order (the queue's semaphore counts completions).

Power throttling (NC-v3, ``CoreSpec.power_throttling``) is a state machine over the Tensor engine's
MATMUL stream as the pass builds it, not a rewrite afterwards: when a MATMUL is about to start and the
stream was busy less than ``throttle_utilisation`` (50 %) of the trailing ``throttle_window_ns``
(3 us), the throttle engages: from that start, MATMULs run at ``throttle_rate`` (half) of full speed
until ``throttle_ramp_ns`` later (the ramp; an instruction straddling its end runs its remaining work
at full speed), and everything waiting on them shifts with them. A window is judged only when it
lies wholly after the execution's first MATMUL (the first burst of an execution is never throttled)
and after the end of the previous ramp (the controller measures afresh once it has ramped up). Each
period is one ``Throttle`` row.

Because every dependency points backwards in the global order, one pass computes the exact
schedule. The loop is compiled with numba: it is the hot path of every simulated execution. It writes
each node's start, end and wait and each DMA packet's; the integer-nanosecond record columns the
event sink hands out (per instruction, per semaphore update) are array operations on those, made
when a profile first reads them (``Timeline.i_start`` ...): a timing-only run never holds them
(~40 bytes per node of a big prefill; docs/execution-core.md "Program memory").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from numba import njit

from neuroncore.compiler.program import (
    N_RESOURCES,
    PORT_PSUM,
    PORT_SBUF,
    RES_CC,
    RES_DMA,
    RES_GPSIMD,
    RES_SCALAR,
    RES_TENSOR_LS,
    RES_TENSOR_MM,
    RES_VECTOR,
    Program,
)

# NC-v2 port sharing (neuroncore.md §2.5): Vector and GpSimd share SBUF's port, Vector and Scalar
# PSUM's. The other engine of a pair is ``PAIR - r`` (a sum, so the numba loop needs no table).
SBUF_PORT_PAIR = RES_VECTOR + RES_GPSIMD
PSUM_PORT_PAIR = RES_VECTOR + RES_SCALAR


@njit(cache=True, nogil=True)
def _schedule(resource: np.ndarray, cost_ns: np.ndarray, queue: np.ndarray, dma_engines: np.ndarray,
              dep_ptr: np.ndarray, dep_idx: np.ndarray, trigger: np.ndarray, n_queues: int,
              n_dma_engines: int, dma_fixed_ns: float, t0: float, start: np.ndarray, end: np.ndarray,
              wait: np.ndarray, pkt_start: np.ndarray, pkt_end: np.ndarray, pkt_engine: np.ndarray,
              counters: np.ndarray, hbm_bytes: np.ndarray, hbm_width: float, hbm_bins: np.ndarray,
              fluid: bool, bucket_ns: float,
              used: np.ndarray, ports: np.ndarray, port_rules: bool, queue_serial: bool,
              throttle: bool, thr_window: float, thr_util: float, thr_rate: float, thr_ramp: float,
              mm_s: np.ndarray, mm_e: np.ndarray, mm_cum: np.ndarray, thr_start: np.ndarray,
              thr_end: np.ndarray, thr_extra: np.ndarray, thr_n: np.ndarray) -> int:
    # (annotations are for the checker: numba types the arguments from the first call's values)
    engine_free = np.full(N_RESOURCES, t0)  # 0-5 engine tracks, RES_DMA unused, RES_CC the CC-core
    dma_free = np.full(n_dma_engines, t0)
    queue_free = np.full((n_dma_engines, n_queues), t0)
    queue_done = np.full(n_queues, t0)
    queue_issue = np.full(n_queues, t0)  # when each queue's descriptor processing is free (queue_serial)
    n_buckets = used.shape[1]
    sbuf_port_end = np.full(N_RESOURCES, t0)  # last SBUF access, by resource (Vector / GpSimd read it)
    psum_port_end = np.full(N_RESOURCES, t0)  # last PSUM access, by resource (Vector / Scalar read it)
    last_mm_start = t0
    # power throttling (NC-v3): the MATMUL stream's busy intervals so far, the first one still
    # inside the trailing window, and until when the current throttle holds (module docstring)
    n_mm = 0
    mm_lo = 0
    thr_until = t0
    judged_from = t0  # a window is judged only after this: the first MATMUL, then each ramp's end
    n_thr = 0
    extra = 0.0
    mm_cum[0] = 0.0
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
            if queue_serial:
                # the queue spends the fixed cost on one transfer at a time (descriptor processing)
                issue = end[trigger[i]] if end[trigger[i]] > queue_issue[queue[i]] else queue_issue[queue[i]]
                s_min = issue + dma_fixed_ns
                queue_issue[queue[i]] = s_min
            else:
                s_min = end[trigger[i]] + dma_fixed_ns
            if ready > s_min:
                s_min = ready
            first = 1e300
            finish = s_min
            q = queue[i]
            for k in range(dma_engines[i]):
                e_idx = (rotate + k) % n_dma_engines
                if fluid:
                    s, f = _fluid_place(used, e_idx, max(s_min, queue_free[e_idx, q]), cost_ns[i],
                                        t0, bucket_ns, n_buckets)
                    queue_free[e_idx, q] = f
                else:
                    s = s_min if s_min > dma_free[e_idx] else dma_free[e_idx]
                    f = s + cost_ns[i]
                    dma_free[e_idx] = f
                pkt_start[p] = np.int64(s + 0.5)
                pkt_end[p] = np.int64(f + 0.5)
                pkt_engine[p] = e_idx
                p += 1
                if f > finish:
                    finish = f
                if s < first:
                    first = s
            rotate = (rotate + dma_engines[i]) % n_dma_engines
            if queue_done[q] > finish:
                finish = queue_done[q]
            queue_done[q] = finish
            start[i] = first
            end[i] = finish
            wait[i] = first - s_min if first > s_min else 0.0
            moved = hbm_bytes[counters[i]]
            if moved > 0:
                _spread_one(first, finish, moved, t0, hbm_width, hbm_bins)
        else:
            avail = engine_free[r]
            if r == RES_TENSOR_LS:
                if last_mm_start > avail:
                    avail = last_mm_start
            elif r == RES_TENSOR_MM and engine_free[RES_TENSOR_LS] > avail:
                avail = engine_free[RES_TENSOR_LS]
            if port_rules:
                # NC-v2: Vector and GpSimd cannot use SBUF at once, Vector and Scalar not PSUM;
                # the compiler serialises such pairs in program order (neuroncore.md §2.5)
                if r in (RES_VECTOR, RES_GPSIMD) and ports[i] & PORT_SBUF:
                    other = sbuf_port_end[SBUF_PORT_PAIR - r]
                    if other > ready:
                        ready = other
                if r in (RES_VECTOR, RES_SCALAR) and ports[i] & PORT_PSUM:
                    other = psum_port_end[PSUM_PORT_PAIR - r]
                    if other > ready:
                        ready = other
            s = avail if avail > ready else ready
            wait[i] = ready - avail if ready > avail else 0.0
            start[i] = s
            cost = cost_ns[i]
            if r == RES_TENSOR_MM and throttle:
                if n_mm == 0:
                    judged_from = s
                elif s >= thr_until and s - thr_window >= judged_from:
                    # Tensor-engine utilisation over the trailing window [s - W, s]
                    edge = s - thr_window
                    while mm_lo < n_mm and mm_e[mm_lo] <= edge:
                        mm_lo += 1
                    busy = mm_cum[n_mm] - mm_cum[mm_lo]
                    if mm_lo < n_mm and mm_s[mm_lo] < edge:
                        busy -= edge - mm_s[mm_lo]
                    if busy < thr_util * thr_window:
                        thr_until = s + thr_ramp
                        judged_from = thr_until
                        thr_start[n_thr] = s
                        thr_end[n_thr] = thr_until
                        n_thr += 1
                if s < thr_until:
                    # at ``thr_rate`` of full speed until the ramp ends, at full speed after it
                    slow = cost / thr_rate
                    if s + slow > thr_until:
                        slow = (thr_until - s) + (cost - (thr_until - s) * thr_rate)
                    extra += slow - cost
                    cost = slow
                mm_s[n_mm] = s
                mm_e[n_mm] = s + cost
                mm_cum[n_mm + 1] = mm_cum[n_mm] + cost
                n_mm += 1
            end[i] = s + cost
            engine_free[r] = end[i]
            if ports[i] & PORT_SBUF:
                sbuf_port_end[r] = end[i]
            if ports[i] & PORT_PSUM:
                psum_port_end[r] = end[i]
            if r == RES_TENSOR_MM:
                last_mm_start = s
    thr_n[0] = n_thr
    thr_extra[0] = extra
    return p


@njit(cache=True, nogil=True)
def _fluid_place(used: np.ndarray, e: int, s: float, work: float, t0: float, width: float,
                 n_buckets: int) -> tuple[float, float]:
    """Serve ``work`` ns on DMA engine ``e`` from time ``s``, sharing it with work placed before.

    Each engine's time is divided into buckets of ``width`` ns; a bucket serves at most ``width``
    ns of work whatever the queue. This is the round-robin across queues of a real DMA engine,
    as a fluid: a transfer triggered early is not held behind one that the compiler emitted earlier
    but that only becomes ready later. Returns (start, end).
    """
    t = s
    remaining = work
    first = -1.0
    b = int((t - t0) / width)
    while remaining > 1e-9:
        if b >= n_buckets:  # past the horizon: the engine is otherwise idle
            if first < 0:
                first = t
            t += remaining
            break
        lo = t0 + b * width
        hi = lo + width
        if t < lo:
            t = lo
        avail = min(hi - t, width - used[e, b])
        if avail > 1e-9:
            if first < 0:
                first = t
            c = avail if avail < remaining else remaining
            used[e, b] += c
            remaining -= c
            t += c
        if remaining > 1e-9:
            b += 1
    if first < 0:
        first = s
    return first, t


@njit(cache=True, nogil=True)
def _spread_one(s: float, e: float, a: float, t0: float, width: float, out: np.ndarray) -> None:
    """Add ``a`` over [s, e) to the fixed-width bins it overlaps, pro rata (clipped to ``out``)."""
    nbins = out.shape[0]
    if e <= s:
        b = int((s - t0) / width)
        if 0 <= b < nbins:
            out[b] += a
        return
    rate = a / (e - s)
    b = int((s - t0) / width)
    while 0 <= b < nbins:
        lo = t0 + b * width
        hi = lo + width
        left = s if s > lo else lo
        right = e if e < hi else hi
        if right > left:
            out[b] += rate * (right - left)
        if e <= hi:
            break
        b += 1


class RecordLayout:
    """Per-program index arrays the timing pass and the records use, each made when first read and
    kept (a program executed many times pays for them once): a timing-only execution reads only
    ``packet_node``. It holds the program's columns it needs, never the program (no cycle through
    ``Program.derived``)."""

    def __init__(self, resource: np.ndarray, sem_increment: np.ndarray, dma_engines: np.ndarray,
                 trigger: np.ndarray) -> None:
        self._resource = resource
        self._sem_increment = sem_increment
        self._dma_engines = dma_engines
        self._trigger = trigger

    @cached_property
    def instr_nodes(self) -> np.ndarray:
        """Node id of each instruction record, in program order."""
        return np.flatnonzero(self._resource < RES_DMA)

    @cached_property
    def producers(self) -> np.ndarray:
        """Nodes that increment a semaphore, in program order."""
        return np.flatnonzero(self._sem_increment >= 0)

    @cached_property
    def packet_node(self) -> np.ndarray:
        """The transfer of each DMA packet (int64)."""
        dma_nodes = np.flatnonzero(self._resource == RES_DMA)
        return np.repeat(dma_nodes, self._dma_engines[dma_nodes].astype(np.int64))

    @cached_property
    def collective_nodes(self) -> np.ndarray:
        """CC-core nodes, in program order."""
        return np.flatnonzero(self._resource == RES_CC)

    @cached_property
    def triggered(self) -> tuple[np.ndarray, np.ndarray]:
        """``(slots, transfers)``: the instruction record of each DMA transfer's trigger, and the
        transfer."""
        transfers = np.flatnonzero(self._resource == RES_DMA)
        return np.searchsorted(self.instr_nodes, self._trigger[transfers]), transfers


HBM_MAX_SAMPLES = 4096
DMA_BUCKETS = 16384  # time resolution of DMA engine sharing: horizon / buckets, at least ...
DMA_BUCKET_MIN_NS = 100.0
HBM_MIN_PERIOD_NS = 1000.0


def record_layout(program: Program) -> RecordLayout:
    cached = program.derived.record_layout
    if cached is None:
        cached = RecordLayout(program.resource, program.sem_increment, program.dma_engines, program.trigger)
        program.derived.record_layout = cached
    return cached


def _ns(times: np.ndarray) -> np.ndarray:
    """Times as the records' integer nanoseconds: rounded half up (the times are never negative)."""
    return (times + 0.5).astype(np.int64)


@dataclass
class Timeline:
    """When everything ran, on the core's clock (ns).

    Float arrays cover every node (instructions and DMA transfers); packets are DMA engine shares.
    The ``i_*`` integer arrays (the instruction records in program order, ``layout.instr_nodes``)
    and ``sem_ts`` are made from them when first read (a profile reads them; a timing-only run
    never does).
    """

    start_ns: np.ndarray
    end_ns: np.ndarray
    wait_ns: np.ndarray  # instructions: time blocked on semaphores; DMA: queueing behind other transfers
    packet_node: np.ndarray  # int64: the transfer each packet belongs to
    packet_start_ns: np.ndarray  # int64
    packet_end_ns: np.ndarray  # int64
    packet_engine: np.ndarray  # int16: DMA engine index 0..15
    hbm_bins: np.ndarray  # HBM bytes moved in each sampling period from the start
    hbm_width_ns: float  # HBM counter sampling period
    layout: RecordLayout
    # power throttling (NC-v3): each period's [start, end) on the core's clock (int64 ns, the end
    # clipped to the execution's last event) and the Tensor time it added, Σ (throttled - full cost)
    throttle_start_ns: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    throttle_end_ns: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    throttle_extra_ns: float = 0.0
    _made: dict[str, np.ndarray] = field(default_factory=dict, init=False, repr=False, compare=False)

    def _column(self, name: str) -> np.ndarray:
        made = self._made.get(name)
        if made is None:
            layout = self.layout
            if name in ("i_start", "i_end", "i_wait"):
                times = {"i_start": self.start_ns, "i_end": self.end_ns, "i_wait": self.wait_ns}[name]
                made = _ns(times[layout.instr_nodes])
            elif name == "sem_ts":
                made = _ns(self.end_ns[layout.producers])
            else:  # the start / end of the transfer an instruction triggered (-1: none)
                made = np.full(layout.instr_nodes.size, -1, np.int64)
                slots, transfers = layout.triggered
                made[slots] = _ns((self.start_ns if name == "i_dma_start" else self.end_ns)[transfers])
            self._made[name] = made
        return made

    @property
    def i_start(self) -> np.ndarray:
        return self._column("i_start")

    @property
    def i_end(self) -> np.ndarray:
        return self._column("i_end")

    @property
    def i_wait(self) -> np.ndarray:
        return self._column("i_wait")

    @property
    def i_dma_start(self) -> np.ndarray:
        """Start of the transfer an instruction triggered (-1: none)."""
        return self._column("i_dma_start")

    @property
    def i_dma_end(self) -> np.ndarray:
        return self._column("i_dma_end")

    @property
    def sem_ts(self) -> np.ndarray:
        """Completion time of each semaphore-incrementing node (``layout.producers``)."""
        return self._column("sem_ts")

    @property
    def begin_ns(self) -> float:
        return float(self.start_ns.min()) if self.start_ns.size else 0.0

    @property
    def finish_ns(self) -> float:
        return float(self.end_ns.max()) if self.end_ns.size else 0.0


def schedule(program: Program, t0_ns: float = 0.0, cost_ns: np.ndarray | None = None, *,
             power_throttling: bool | None = None) -> Timeline:
    """Simulate ``program`` starting at ``t0_ns``; a pure function of the node costs: the program's
    static ones, or ``cost_ns`` (the same with collective durations filled in by the runtime).

    ``power_throttling``: model Trainium2's power throttling (None: as the program's core spec says,
    ``CoreSpec.power_throttling``; False turns it off for a what-if comparison)."""
    n = program.n_nodes
    layout = record_layout(program)
    costs = program.cost_ns if cost_ns is None else np.asarray(cost_ns, np.float64)
    # no schedule can take longer than running every node back to back
    bound = float(costs.sum()) + layout.packet_node.size * program.spec.dma_fixed_latency_ns
    width = max(HBM_MIN_PERIOD_NS, bound / HBM_MAX_SAMPLES)
    n_bins = int(bound / width) + 2
    n_packets = layout.packet_node.size
    start = np.empty(n, np.float64)
    end = np.empty(n, np.float64)
    wait = np.empty(n, np.float64)
    pkt_start = np.empty(n_packets, np.int64)
    pkt_end = np.empty(n_packets, np.int64)
    pkt_engine = np.empty(n_packets, np.int16)
    spec = program.spec
    # HBM bytes a transfer reads or writes, per counter record (``program.counters.codes``)
    hbm_bytes = (program.counters.per_record("hbm_read_bytes").astype(np.float64)
                 + program.counters.per_record("hbm_write_bytes"))
    throttle = spec.power_throttling if power_throttling is None else bool(power_throttling)
    n_mm = int(np.count_nonzero(program.resource == RES_TENSOR_MM)) if throttle else 0
    mm_s = np.empty(n_mm + 1, np.float64)
    mm_e = np.empty(n_mm + 1, np.float64)
    mm_cum = np.empty(n_mm + 2, np.float64)
    thr_start = np.empty(n_mm + 1, np.float64)
    thr_end = np.empty(n_mm + 1, np.float64)
    thr_extra = np.zeros(1, np.float64)
    thr_n = np.zeros(1, np.int64)

    def run(fluid: bool, bucket_ns: float, used: np.ndarray) -> np.ndarray:
        hbm_bins = np.zeros(n_bins, np.float64)
        _schedule(program.resource, costs, program.queue, program.dma_engines,
                  program.dep_ptr, program.dep_idx, program.trigger, len(program.queues),
                  spec.dma_engines, spec.dma_fixed_latency_ns, float(t0_ns), start, end, wait,
                  pkt_start, pkt_end, pkt_engine, program.counters.codes, hbm_bytes, width, hbm_bins,
                  fluid, bucket_ns, used, program.ports, spec.generation == 2,
                  program.dma_queue_serial, throttle, float(spec.throttle_window_ns),
                  float(spec.throttle_utilisation), float(spec.throttle_rate), float(spec.throttle_ramp_ns),
                  mm_s, mm_e, mm_cum, thr_start, thr_end, thr_extra, thr_n)
        return hbm_bins

    # pass 1 (DMA engines FIFO in program order) bounds the horizon; pass 2 shares the engines
    # across queues in time order within that horizon
    hbm_bins = run(False, 1.0, np.zeros((1, 1)))
    if layout.packet_node.size:
        horizon = max(end.max() - t0_ns, 1.0) * 1.25
        bucket_ns = max(DMA_BUCKET_MIN_NS, horizon / DMA_BUCKETS)
        used = np.zeros((spec.dma_engines, int(horizon / bucket_ns) + 1), np.float64)
        hbm_bins = run(True, bucket_ns, used)
    k = int(thr_n[0])
    finish = float(end.max()) if n else t0_ns
    t_start = np.rint(thr_start[:k]).astype(np.int64)
    t_end = np.rint(np.minimum(thr_end[:k], finish)).astype(np.int64)
    return Timeline(start, end, wait, layout.packet_node, pkt_start, pkt_end, pkt_engine, hbm_bins,
                    width, layout, t_start, t_end, float(thr_extra[0]))


# constants baked into the loop
assert RES_TENSOR_LS == 0 and RES_TENSOR_MM == 5 and RES_DMA == 6 and RES_CC == 7
