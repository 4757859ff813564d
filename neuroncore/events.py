"""The event sink: the only door out of the execution core.

The core hands plain columnar batches (NumPy arrays and lists, never formatted text or files) to
whoever subscribed. With no subscriber, ``sink.active`` is False and the runtime skips building
records entirely, so an unobserved core pays nothing for being observable.

Batch kinds and their columns are listed in ``RECORD_KINDS``; codes (engine, opcode, queue) are
small integers whose names travel in ``batch.meta`` so a batch costs array slices, not strings.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

BATCH_ROWS = 65536
PROBE_PERIOD_S = 1.0  # how often an execution may run the sink's probes (EventSink.poll)

RECORD_KINDS: dict[str, str] = {
    "program_loaded": "a model was loaded: its ops (HLO name, layer, frames) and static instruction info",
    "execution_start": "an execution began on a core (meta only)",
    "instruction": "executed engine instructions with start/end, wait, bytes and FLOPs",
    "dma_packet": "DMA packets: one engine's share of one transfer, with queue and bytes",
    "semaphore_update": "semaphore increments at instruction/transfer completion",
    "hbm_usage": "HBM throughput samples over the execution",
    "cc_op": "collectives of a tensor-parallel execution, one row per collective as one rank saw it",
    "neuronlink_usage": "NeuronLink / EFA / on-chip channel traffic sampled over a tensor-parallel execution",
    "execution_end": "an execution finished (meta: device time, counts)",
}


@dataclass(frozen=True)
class EventBatch:
    """One batch of records of one ``kind``. Columns are equal-length arrays or lists."""

    kind: str
    columns: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        for column in self.columns.values():
            return len(column)
        return 0


Listener = Callable[[EventBatch], None]


class EventSink:
    """Fan-out of batches to listeners; thread-safe subscribe/unsubscribe."""

    def __init__(self) -> None:
        self._listeners: tuple[Listener, ...] = ()
        self._lock = threading.Lock()
        self.generation = 0  # bumped by every subscribe: loaded models re-announce themselves
        self._probes: tuple[Callable[[], None], ...] = ()
        self._next_poll = 0.0

    @property
    def active(self) -> bool:
        return bool(self._listeners)

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Start receiving batches; returns a function that stops it."""
        with self._lock:
            self._listeners = (*self._listeners, listener)
            self.generation += 1

        def unsubscribe() -> None:
            with self._lock:
                self._listeners = tuple(x for x in self._listeners if x is not listener)

        return unsubscribe

    def add_probe(self, probe: Callable[[], None]) -> None:
        """Run ``probe`` from :meth:`poll` (at most every ``PROBE_PERIOD_S``). A listener that should
        attach only on demand (live state: only while someone watches) registers a probe instead of
        subscribing, so until the probe subscribes, the core builds no records for it."""
        with self._lock:
            self._probes = (*self._probes, probe)

    def remove_probe(self, probe: Callable[[], None]) -> None:
        with self._lock:
            self._probes = tuple(p for p in self._probes if p is not probe)

    def poll(self, now: float | None = None) -> None:
        """Called by the runtime at every execution: runs the probes when one is due (``now``:
        ``time.monotonic()`` unless given, for tests). Without probes this is one attribute test;
        with them, one clock read per execution."""
        if not self._probes:
            return
        now = time.monotonic() if now is None else now
        if now < self._next_poll:
            return
        self._next_poll = now + PROBE_PERIOD_S
        for probe in self._probes:
            probe()

    def emit(self, kind: str, columns: dict[str, Any] | None = None, **meta: Any) -> None:
        listeners = self._listeners
        if not listeners:
            return
        batch = EventBatch(kind, columns or {}, meta)
        for listener in listeners:
            listener(batch)


sink = EventSink()
"""The process-wide sink every runtime object reports to unless given another."""
