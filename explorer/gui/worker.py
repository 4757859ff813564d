"""Work off the UI thread: frame windows (latest request wins), levels of detail, one-off queries.

The UI thread never runs DuckDB. A pan or zoom posts a ``FrameRequest``; the fetch thread always
takes the newest one (requests posted while it was busy are dropped, not queued), so a fast drag costs
one query per fetch, not one per mouse event. Results come back as Qt signals, which Qt delivers on
the UI thread. Levels of detail are built on their own thread right after opening, one table at a
time (instructions first); each one finished is announced so the timeline can refetch.

Thread rules (three threads: UI, ``frame-fetch``, ``lod-build``; plus the ``TaskRunner`` pool):

* The fetch thread reads only what the request carries (``FrameRequest.row_set``, an immutable
  snapshot of the rows) and the session's thread-safe readers (``TrackViewport``: its own locks);
  it never reads a widget. The renderer it runs is a pure function of the frame (``raster.render``).
* Shared mutable state lives here and only under ``_cond``: the next request, the busy flag, the
  stop flag and the set of built levels of detail (``lods_ready`` hands out a frozen copy).
* Results cross to the UI thread only as Qt signals (queued: the receiver runs on the UI thread),
  carrying objects no other thread touches afterwards.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from PySide6.QtCore import QObject, Signal

from explorer.gui.frames import FrameData, FrameRequest, fetch_frame
from explorer.gui.rows import Row
from explorer.gui.session import Session
from formats.read_api import SpanSpec


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]


class FrameFetcher(QObject):
    """Fetches frames on a background thread; ``ready`` carries each ``FrameData``."""

    ready = Signal(object)
    failed = Signal(str)
    lod_ready = Signal(str)
    lods_done = Signal()

    def __init__(self, session: Session, rows: Sequence[Row]) -> None:
        super().__init__()
        self.session = session
        self.rows = tuple(rows)  # whose levels of detail to build (fixed: the tables do not change)
        self._lods_ready: set[tuple[int, SpanSpec]] = set()  # under _cond
        self._cond = threading.Condition()
        self._next: FrameRequest | None = None
        self._stopped = False
        self._busy = False
        self._thread = threading.Thread(target=self._loop, name="frame-fetch", daemon=True)
        self._thread.start()
        self._lod_thread: threading.Thread | None = None
        # paints the picture off the UI thread: must be a pure function of the frame (no widget state)
        self.renderer: Callable[[FrameData], Any] | None = None

    @property
    def lods_ready(self) -> frozenset[tuple[int, SpanSpec]]:
        """(profile, spec) pairs whose level of detail is built: a snapshot, safe on any thread."""
        with self._cond:
            return frozenset(self._lods_ready)

    @property
    def stopped(self) -> bool:
        with self._cond:
            return self._stopped

    def _lod_built(self, key: tuple[int, SpanSpec]) -> None:
        with self._cond:
            self._lods_ready.add(key)

    # -- frames ------------------------------------------------------------------------------
    def request(self, request: FrameRequest) -> None:
        with self._cond:
            self._next = request
            self._cond.notify()

    def fetch_now(self, request: FrameRequest) -> FrameData:
        """Synchronously (headless screenshots, tests): the same work on the calling thread."""
        return fetch_frame(self.session, request, self.lods_ready)

    @property
    def idle(self) -> bool:
        with self._cond:
            return self._next is None and not self._busy

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._next is None and not self._stopped:
                    self._cond.wait()
                request = self._next
                if self._stopped or request is None:
                    return
                self._next = None
                self._busy = True
            try:
                frame = fetch_frame(self.session, request, self.lods_ready)
                if self.renderer is not None:
                    frame.picture = self.renderer(frame)
            except Exception as exc:  # a query failure must not kill the thread; it is shown instead
                self._emit_failed(f"could not read the window: {_one_line(exc)}")
                traceback.print_exc()
            else:
                self._emit_ready(frame)
            finally:
                with self._cond:
                    self._busy = False

    def _emit_ready(self, frame: FrameData) -> None:
        with contextlib.suppress(RuntimeError):  # the receiver is gone (window closed while fetching)
            self.ready.emit(frame)

    def _emit_failed(self, message: str) -> None:
        with contextlib.suppress(RuntimeError):
            self.failed.emit(message)

    # -- levels of detail --------------------------------------------------------------------
    def build_lods(self, synchronous: bool = False) -> None:
        """Build every span table's level of detail (instructions first, then DMA, then CC)."""
        specs: list[tuple[int, SpanSpec]] = []
        for row in self.rows:
            if isinstance(row.spec, SpanSpec) and (row.profile, row.spec) not in specs:
                specs.append((row.profile, row.spec))
        specs.sort(key=lambda ps: (ps[1].table != "Instruction", ps[1].table != "DmaPacket", ps[0]))
        if synchronous:
            self._build(specs)
            return
        self._lod_thread = threading.Thread(target=self._build, args=(specs,), name="lod-build", daemon=True)
        self._lod_thread.start()

    def _build(self, specs: list[tuple[int, SpanSpec]]) -> None:
        """Quick instruction LODs first (from the profile's InstructionLod: the first frame waits on
        them), then every table's full LOD -- instructions last when a quick one stands in."""
        quick_done = []
        for p, spec in specs:
            loaded = self.session.profiles[p]
            if spec.table != "Instruction" or loaded.tracks is None or self.stopped:
                continue
            try:
                installed = loaded.tracks.install_quick_lod(spec)
            except Exception as exc:  # the full build below still runs
                self._emit_failed(f"quick level of detail not built: {_one_line(exc)}")
                continue
            if installed:
                quick_done.append((p, spec))
                self._lod_built((p, spec))
                with contextlib.suppress(RuntimeError):
                    self.lod_ready.emit(spec.table)
        ordered = [ps for ps in specs if ps not in quick_done] + quick_done
        for p, spec in ordered:
            if self.stopped:
                return
            loaded = self.session.profiles[p]
            try:
                assert loaded.tracks is not None
                loaded.tracks.lod(spec)
            except Exception as exc:
                self._emit_failed(f"level of detail for {spec.table} not built: {_one_line(exc)}")
                continue
            self._lod_built((p, spec))
            try:
                self.lod_ready.emit(spec.table)
            except RuntimeError:
                return
        with contextlib.suppress(RuntimeError):
            self.lods_done.emit()

    def lods_building(self) -> bool:
        return self._lod_thread is not None and self._lod_thread.is_alive()

    def stop(self, wait: float = 0.0) -> None:
        """End the fetch thread (after its current query; ``wait`` seconds at most for it)."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if wait:
            self._thread.join(wait)
            if self._lod_thread is not None:
                self._lod_thread.join(wait)


class TaskRunner(QObject):
    """Runs one-off queries (details, summaries, search, source, hierarchy) on a small pool; each
    result comes back with the token ``submit`` returned, so callers can drop stale answers."""

    done = Signal(int, object)
    failed = Signal(int, str)

    def __init__(self, workers: int = 2) -> None:
        super().__init__()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="gui-query")
        self._token = 0
        self._closed = False
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], *args: Any) -> int | None:
        """Run ``fn(*args)`` on the pool; None (and nothing run) once shut down -- a signal queued
        before the window was released may still ask for work after it."""
        with self._lock:
            if self._closed:
                return None
            self._token += 1
            token = self._token
            future = self._pool.submit(fn, *args)
        future.add_done_callback(functools.partial(self._finish, token))
        return token

    def _finish(self, token: int, future: Future[Any]) -> None:
        try:
            exc = future.exception()
            if exc is not None:
                self.failed.emit(token, _one_line(exc))
            else:
                self.done.emit(token, future.result())
        except RuntimeError:  # receiver deleted at shutdown
            pass

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            self._pool.shutdown(wait=False, cancel_futures=True)
