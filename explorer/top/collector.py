"""The collection thread: polls a source at the refresh interval and hands frames over.

Reading files, parsing JSON and asking psutil all happen here, never on the UI thread, so keys stay
responsive however slow a read is. The thread sleeps on an Event between polls (no busy loop) and a
frame is delivered only when the source says something changed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from explorer.top.snapshots import Frame


class Source(Protocol):
    """What neuron-top reads frames from: live state (``LiveSource``) or a neuron-monitor stream."""

    @property
    def kind(self) -> str: ...

    def poll(self) -> Frame | None: ...

    def close(self) -> None: ...


class Collector:
    """Runs ``source.poll()`` every ``interval`` seconds in a daemon thread, first poll at once."""

    def __init__(self, source: Source, interval: float, deliver: Callable[[Frame], object],
                 on_error: Callable[[BaseException], object] | None = None) -> None:
        self.source = source
        self.interval = interval
        self.deliver = deliver
        self.on_error = on_error
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="neuron-top-collector", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                frame = self.source.poll()
            except Exception as exc:  # a source bug must show up on screen, not kill the thread silently
                if self.on_error is not None:
                    self.on_error(exc)
                frame = None
            if frame is not None and not self._stop.is_set():
                self.deliver(frame)
            self._stop.wait(max(self.interval - (time.monotonic() - started), 0.01))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)
        self.source.close()


__all__ = ["Collector", "Source"]
