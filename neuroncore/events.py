"""The event sink: the only door out of the execution core.

The core hands plain columnar batches (NumPy arrays and lists, never formatted text or files) to
whoever subscribed. With no subscriber, ``sink.active`` is False and the runtime skips building
records entirely, so an unobserved core pays nothing for being observable.

Every batch kind, its columns and its metadata record are declared once in
``neuroncore.record_kinds``; codes (engine, opcode, queue) are small integers whose names travel in
``batch.meta`` so a batch costs array slices, not strings. A sink made with ``check=True`` (and every
sink while ``EventSink.check_all`` is set, as the test suite does) checks each batch against its
declaration before handing it on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from neuroncore.record_kinds import RECORD_KINDS, Meta, RecordKind, check_batch

BATCH_ROWS = 65536
PROBE_PERIOD_S = 1.0  # how often an execution may run the sink's probes (EventSink.poll)

__all__ = ["BATCH_ROWS", "RECORD_KINDS", "EventBatch", "EventSink", "Listener", "RecordKind", "sink"]


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One batch of records of one ``kind``: equal-length columns as ``RECORD_KINDS[kind]`` declares
    them, and that kind's metadata record."""

    kind: RecordKind
    columns: Mapping[str, Any]
    meta: Meta

    def __len__(self) -> int:
        for column in self.columns.values():
            return len(column)
        return 0


Listener = Callable[[EventBatch], None]


class EventSink:
    """Fan-out of batches to listeners; thread-safe subscribe/unsubscribe."""

    check_all: ClassVar[bool] = False
    """Check every batch of every sink against its declaration (set by the test suite)."""

    def __init__(self, *, check: bool = False) -> None:
        self._listeners: tuple[Listener, ...] = ()
        self._lock = threading.Lock()
        self.check = check
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

    def emit(self, kind: RecordKind, columns: Mapping[str, Any], meta: Meta) -> None:
        """Hand one batch to every listener (nothing is built when nobody listens)."""
        listeners = self._listeners
        if not listeners:
            return
        batch = EventBatch(kind, columns, meta)
        if self.check or EventSink.check_all:
            check_batch(batch)
        for listener in listeners:
            listener(batch)


sink = EventSink()
"""The process-wide sink every runtime object reports to unless given another."""
