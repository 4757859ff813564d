"""Emits nodes (instructions and DMA transfers) and derives their dependencies from memory accesses.

Lowering code says *what* an instruction reads and writes; the emitter works out *who it must wait
for* (read-after-write, write-after-read, write-after-write on overlapping SBUF/PSUM/HBM ranges) and,
when the program is finished, turns every cross-engine wait into a semaphore: the producer's engine
(or DMA queue) semaphore is incremented on completion and the consumer waits for ``$S[n]>=v``.
Same-engine order needs no semaphore: each engine runs its stream in order.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from neuroncore.compiler.counters import COUNTER_NAMES, NO_COUNTERS, NodeCounters, counter_values
from neuroncore.compiler.node_semantics import NOP, NodeSemantics, check_semantics
from neuroncore.compiler.program import (
    PORT_PSUM,
    PORT_SBUF,
    RES_CC,
    RES_DMA,
    RES_TENSOR_LS,
    RES_TENSOR_MM,
    DmaQueue,
    HbmAccess,
    Ref,
)
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


@dataclass(slots=True)
class _Access:
    a0: int
    a1: int
    b0: int
    b1: int
    node: int
    lane: int  # in-order lane of the accessing node (engine, CC_LANE, or queue_lane(queue))
    write: bool


def _overlaps(x: _Access, a0: int, a1: int, b0: int, b1: int) -> bool:
    return x.a0 < a1 and a0 < x.a1 and x.b0 < b1 and b0 < x.b1


def _covers(a0: int, a1: int, b0: int, b1: int, x: _Access) -> bool:
    return a0 <= x.a0 and x.a1 <= a1 and b0 <= x.b0 and x.b1 <= b1


MemoryKey = tuple[str, Any]  # ("buf", buffer id) for SBUF/PSUM buffers, ("hbm", tensor name)
Rect = tuple[int, int, int, int]  # partitions (or rows) [a0, a1) x free elements (or cols) [b0, b1)

WHOLE_TENSOR: Rect = (0, 1 << 62, 0, 1 << 62)
"""An access that may touch any element of an HBM tensor (through a view or a strided relayout):
it overlaps every other access to that tensor, so it orders against all of them."""

WHOLE_BUFFER: Rect = (0, P, 0, 1 << 40)
"""Every partition and element of an on-chip buffer (a new buffer inherits its range's hazards)."""


class Emitter:
    """Accumulates nodes column by column; ``columns()`` hands them to :class:`Program`."""

    def __init__(self, spec: CoreSpec | None = None) -> None:
        self.spec = spec
        self._last_writes: dict[int, list[tuple[MemoryKey, Rect]]] = {}
        self.psum_keys: set[MemoryKey] = set()  # buffers that live in PSUM
        self.ports: list[int] = []
        self.resource: list[int] = []
        self.engine: list[int] = []
        self.cost_ns: list[float] = []
        self.queue: list[int] = []
        self.dma_engines: list[int] = []
        self.deps: list[list[int]] = []
        self.op_index: list[int] = []
        self.opcode: list[str] = []
        self.text: list[str] = []
        self.activation_fn: list[str | None] = []
        self.tensor_instruction_type: list[str | None] = []
        self.performance_mode: list[str | None] = []
        self.semantics: list[NodeSemantics] = []
        self.trigger: list[int] = []
        self.counters: list[NodeCounters] = []
        self.current_op = -1
        self._accesses: dict[MemoryKey, list[_Access]] = defaultdict(list)
        self._lane: list[int] = []
        # LDWEIGHTS -> the first MATMUL after it. The Tensor engine's two tracks share semaphore 0,
        # and a background LoadStationary can finish before the previous MultiplyMoving does, so an
        # LS must never increment it (the count would pass an earlier MM's value too soon). A wait
        # for an LS waits for its MM instead, which starts only after the LS ended.
        self._mm_after_ls: dict[int, int] = {}
        self._pending_ls: list[int] = []

    @property
    def n_nodes(self) -> int:
        return len(self.resource)

    # -- hazards ---------------------------------------------------------------------------
    def compact(self, nodes: set[int] | list[int]) -> list[int]:
        """Keep the latest node of each in-order lane: waiting for it implies the earlier ones."""
        latest: dict[int, int] = {}
        lanes = self._lane
        for node in nodes:
            lane = lanes[node]
            if node > latest.get(lane, -1):
                latest[lane] = node
        return sorted(latest.values())

    def inherit(self, key: MemoryKey, rect: Rect, nodes: list[int]) -> None:
        """Earlier users of a reused address range become hazards of the new buffer there."""
        accesses = self._accesses[key]
        for node in self.compact(nodes):
            accesses.append(_Access(*rect, node, self._lane[node], True))

    def last_writer_engine(self, key: MemoryKey) -> Engine | None:
        """The engine of the latest write to a buffer (None if a DMA wrote it or nobody did)."""
        writers = [a.node for a in self._accesses.get(key, ()) if a.write]
        if not writers:
            return None
        node = max(writers)
        if self.resource[node] == RES_DMA:
            return None
        return Engine(self.engine[node])

    def forget(self, key: MemoryKey) -> list[int]:
        """Drop a buffer's access list; returns the nodes a later user of its range must wait for."""
        accesses = self._accesses.pop(key, [])
        return self.compact({a.node for a in accesses})

    def _hazards(self, lane: int, reads: list[tuple[MemoryKey, Rect]],
                 writes: list[tuple[MemoryKey, Rect]]) -> set[int]:
        deps: set[int] = set()
        for key, (a0, a1, b0, b1) in reads:
            for acc in self._accesses.get(key, ()):
                if acc.write and acc.lane != lane and _overlaps(acc, a0, a1, b0, b1):
                    deps.add(acc.node)
        for key, (a0, a1, b0, b1) in writes:
            for acc in self._accesses.get(key, ()):
                if acc.lane != lane and _overlaps(acc, a0, a1, b0, b1):
                    deps.add(acc.node)
        return deps

    def _record(self, node: int, lane: int, reads: list[tuple[MemoryKey, Rect]],
                writes: list[tuple[MemoryKey, Rect]]) -> None:
        for key, rect in writes:
            a0, a1, b0, b1 = rect
            kept = [x for x in self._accesses[key] if not _covers(a0, a1, b0, b1, x)]
            kept.append(_Access(a0, a1, b0, b1, node, lane, True))
            self._accesses[key] = kept
        for key, rect in reads:
            a0, a1, b0, b1 = rect
            accesses = self._accesses[key]
            accesses[:] = [
                x for x in accesses
                if x.write or x.lane != lane or not _covers(a0, a1, b0, b1, x)
            ]
            accesses.append(_Access(a0, a1, b0, b1, node, lane, False))

    # -- emission --------------------------------------------------------------------------
    def _append(self, *, resource: int, engine: Engine, cost_ns: float, queue: int, dma_engines: int,
                deps: set[int], opcode: str, text: str, semantics: NodeSemantics,
                activation_fn: str | None, tensor_instruction_type: str | None,
                performance_mode: str | None, trigger: int, lane: int,
                counters: NodeCounters) -> int:
        check_semantics(semantics)
        node = len(self.resource)
        if self._mm_after_ls:
            deps = {self._mm_after_ls.get(d, d) for d in deps}
        if resource == RES_TENSOR_MM:
            for ls in self._pending_ls:
                self._mm_after_ls[ls] = node
            self._pending_ls.clear()
        elif resource == RES_TENSOR_LS:
            self._pending_ls.append(node)
        self.resource.append(resource)
        self.engine.append(int(engine))
        self.cost_ns.append(float(cost_ns))
        self.queue.append(queue)
        self.dma_engines.append(dma_engines)
        self.deps.append(self.compact(deps))
        self.op_index.append(self.current_op)
        self.opcode.append(opcode)
        self.text.append(text)
        self.semantics.append(semantics)
        self.activation_fn.append(activation_fn)
        self.tensor_instruction_type.append(tensor_instruction_type)
        self.performance_mode.append(performance_mode)
        self.trigger.append(trigger)
        self.ports.append(0)
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
        text: str,
        semantics: NodeSemantics,
        track: int | None = None,
        activation_fn: str | None = None,
        tensor_instruction_type: str | None = None,
        performance_mode: str | None = None,
        extra_deps: set[int] | None = None,
        counters: NodeCounters = NO_COUNTERS,
    ) -> int:
        lane = track if track is not None else int(engine)
        deps = self._hazards(lane, reads, writes)
        cost_ns = self._dependent_cost(engine, lane, reads, cost_ns)
        self._last_writes[lane] = writes
        if extra_deps:
            deps |= {d for d in extra_deps if self._lane[d] != lane}
        resource = track if track is not None else int(engine)
        node = self._append(
            resource=resource, engine=engine, cost_ns=cost_ns, queue=-1, dma_engines=0, deps=deps,
            opcode=opcode, text=text, semantics=semantics, activation_fn=activation_fn,
            tensor_instruction_type=tensor_instruction_type, performance_mode=performance_mode,
            trigger=-1, lane=lane, counters=counters,
        )
        self._record(node, lane, reads, writes)
        ports = 0
        for key, _ in (*reads, *writes):
            if key[0] == "buf":
                ports |= PORT_PSUM if key in self.psum_keys else PORT_SBUF
        self.ports[node] = ports
        return node

    def _dependent_cost(self, engine: Engine, lane: int, reads: list[tuple[MemoryKey, Rect]],
                        cost_ns: float) -> float:
        """Vector/Scalar instructions that read what the previous one on their engine just wrote
        cannot overlap it in the pipeline (neuroncore.md §4.1): Vector pays ~100 extra cycles,
        Scalar issues no faster than ~264 cycles."""
        if self.spec is None or engine not in (Engine.VECTOR, Engine.SCALAR):
            return cost_ns
        previous = self._last_writes.get(lane, ())
        dependent = any(
            key == wkey and a0 < w1 and w0 < a1 and b0 < x1 and x0 < b1
            for key, (a0, a1, b0, b1) in reads
            for wkey, (w0, w1, x0, x1) in previous
        )
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
        text: str,
        semantics: NodeSemantics,
        trigger_opcode: str = "WRITE",
        trigger_text: str = "",
        trigger_semantics: NodeSemantics = NOP,
        counters: NodeCounters = NO_COUNTERS,
    ) -> int:
        """A transfer and the instruction on the queue's engine that triggers it; returns the transfer."""
        engine = queue.trigger_engine
        deps = self._hazards(int(engine), reads, writes)
        # dependencies are waited for by the trigger; the transfer starts after its trigger
        dma_deps = self._hazards(queue_lane(queue), reads, writes)
        trig = self._append(
            resource=int(engine), engine=engine, cost_ns=trigger_cost_ns, queue=-1, dma_engines=0,
            deps=deps | dma_deps, opcode=trigger_opcode,
            text=trigger_text or f"{queue.name} block_id={len(self.resource)}",
            semantics=trigger_semantics, activation_fn=None, tensor_instruction_type=None,
            performance_mode=None, trigger=-1, lane=int(engine), counters=counters.spill_part(),
        )
        node = self._append(
            resource=RES_DMA, engine=engine, cost_ns=engine_ns, queue=queue.index,
            dma_engines=engines, deps=set(), opcode="DMA_DIRECT2D", text=text, semantics=semantics,
            activation_fn=None, tensor_instruction_type=None, performance_mode=None, trigger=trig,
            lane=queue_lane(queue), counters=counters.transfer_part(),
        )
        self._record(node, queue_lane(queue), reads, writes)
        return node

    def collective(self, opcode: str, *, reads: list[tuple[MemoryKey, Rect]],
                   writes: list[tuple[MemoryKey, Rect]], text: str, semantics: NodeSemantics,
                   counters: NodeCounters = NO_COUNTERS) -> int:
        """A collective on the CC-core: reads and writes HBM, waits like any other node.

        Its duration depends on where the ranks sit in the instance, so it is left at 0 here and
        supplied by the runtime when the program runs in a tensor-parallel group."""
        deps = self._hazards(CC_LANE, reads, writes)
        node = self._append(
            resource=RES_CC, engine=Engine.SYNC, cost_ns=0.0, queue=-1, dma_engines=0, deps=deps,
            opcode=opcode, text=text, semantics=semantics, activation_fn=None,
            tensor_instruction_type=None, performance_mode=None, trigger=-1, lane=CC_LANE,
            counters=counters,
        )
        self._record(node, CC_LANE, reads, writes)
        return node

    def counter_columns(self) -> dict[str, np.ndarray]:
        """One int64 column per counter (``Program`` fields of the same names), in node order."""
        table = np.array(list(map(counter_values, self.counters)), np.int64).reshape(-1, len(COUNTER_NAMES))
        return {name: np.ascontiguousarray(table[:, i]) for i, name in enumerate(COUNTER_NAMES)}

    # -- semaphores ------------------------------------------------------------------------
    def assign_semaphores(self, queues: list[DmaQueue]) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """Decide which nodes increment which semaphore, and prefix operand strings with the waits."""
        n = len(self.resource)
        sem_of = np.empty(n, np.int16)
        for i in range(n):
            if self.resource[i] == RES_DMA:
                sem_of[i] = queues[self.queue[i]].semaphore
            elif self.resource[i] == RES_CC:
                sem_of[i] = CC_SEMAPHORE
            else:
                sem_of[i] = self.engine[i]
        producer = np.zeros(n, bool)
        for i in range(n):
            for d in self.deps[i]:
                producer[d] = True
        sem_increment = np.where(producer, sem_of, -1).astype(np.int16)
        sem_value = np.zeros(n, np.int32)
        running: dict[int, int] = defaultdict(int)
        for node in np.flatnonzero(producer).tolist():
            step = DMA_COMPLETION_INCREMENT if self.resource[node] == RES_DMA else 1
            running[int(sem_of[node])] += step
            sem_value[node] = running[int(sem_of[node])]
        texts: list[str] = []
        for i in range(n):
            parts: list[str] = []
            waits: dict[int, int] = {}
            for d in self.deps[i]:
                s = int(sem_of[d])
                waits[s] = max(waits.get(s, 0), int(sem_value[d]))
            parts.extend(f"$S[{s}]>={v}" for s, v in sorted(waits.items()))
            if producer[i]:
                parts.append(f"S[{int(sem_of[i])}] ({_owner(int(sem_of[i]), queues)})++@complete")
            parts.append(self.text[i])
            texts.append(" ".join(parts))
        return sem_increment, sem_value, texts


def _owner(semaphore: int, queues: list[DmaQueue]) -> str:
    if semaphore == CC_SEMAPHORE:
        return "CC"
    if semaphore < QUEUE_SEMAPHORE_BASE:
        return Engine(semaphore).label
    return queues[semaphore - QUEUE_SEMAPHORE_BASE].name


def sbuf_key(ref: Ref) -> tuple[MemoryKey, Rect]:
    return ("buf", ref.buf), (ref.p0, ref.p1, ref.f0, ref.f1)


def hbm_key(access: HbmAccess, rows_per_batch: int, whole: bool = False) -> tuple[MemoryKey, Rect]:
    if whole or access.view is not None:
        return ("hbm", access.tensor), WHOLE_TENSOR
    base = access.batch * rows_per_batch
    return ("hbm", access.tensor), (base + access.r0, base + access.r1, access.c0, access.c1)


__all__ = ["CC_LANE", "CC_SEMAPHORE", "QUEUE_LANE_BASE", "QUEUE_SEMAPHORE_BASE", "RES_TENSOR_LS",
           "RES_TENSOR_MM", "WHOLE_BUFFER", "WHOLE_TENSOR", "Emitter", "hbm_key", "queue_lane",
           "sbuf_key"]
