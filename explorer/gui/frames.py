"""One frame's data: every visible row's window reduced to pixel buckets, fetched off the UI thread.

    request = FrameRequest(generation=7, t0=0, t1=2_000_000, buckets=1800, rows=(1, 2, 3, 9),
                           row_set=RowSet(rows))
    frame = fetch_frame(session, request, lods_ready)
    frame.spans[2]          # SpanWindow of row 2, times relative to its profile's origin
    frame.pending           # rows not drawn yet (their level of detail is still being built)
    frame.status.text()     # 'window fetched in 12 ms (events, lod)': a FrameStatus, not parsed text

Thread rules: everything here is immutable or owned by one thread at a time. A ``FrameRequest`` is
frozen and carries the ``RowSet`` (an immutable snapshot of the timeline's rows) its row indices
refer to, so the fetch thread never reads the widget's rows; ``fetch_frame`` builds a new
``FrameData`` that no other thread sees until it is handed over (by a queued Qt signal) -- after
that only the UI thread touches it.

Per table and profile, one query answers every visible row (``formats.tracks`` groups by key), so a
frame costs one DuckDB call per table, not per row. Instruction rows are answered, in order of
preference, by the track level of detail (built in the background after opening), by the events
themselves when the window is narrow enough to read them quickly, or -- while the level of detail is
still building -- by the profile's stored ``InstructionLod`` (``TrackViewport.engine_window``, the
same level-of-detail rule) for engines that have a single row. A row none of these can answer yet
is ``pending``: the timeline keeps what it drew last for it.

Highlights (search results, a hierarchy node, source lines) are a SQL condition over the Instruction
table; matching events are fetched the same way with the condition applied (always from the events,
bounded by the highlight's time range when it has one).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, overload

import numpy as np

from explorer.gui.rows import CC, COUNTER, DMA, INSTRUCTION, Row
from explorer.gui.session import LoadedProfile, Session
from formats.read_api import CounterSpec, CounterWindow, SpanSpec, SpanWindow, merge_windows

RAW_ROWS_LIMIT = 3_000_000  # read the events directly when the window holds about this many at most
MAX_PRIMITIVES = 50_000  # events drawn per frame at most, whatever the zoom


@dataclass(frozen=True)
class Highlight:
    """Instructions to draw emphasised (everything else fades): a SQL condition over Instruction,
    optionally bounded in time (absolute ns per profile index) to spare the scan."""

    description: str
    where: str
    profile: int | None = None  # only this profile's rows; None = every profile
    bounds: tuple[int, int] | None = None  # relative ns


@dataclass(frozen=True, eq=False)
class RowSet:
    """An immutable snapshot of the timeline's rows. Requests and pictures index into the snapshot
    they were made from; the UI makes a new one whenever its rows change, so equality is identity
    (a frame of an older row set is recognised as stale, not drawn with the wrong rows)."""

    rows: tuple[Row, ...] = ()

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[Row]:
        return iter(self.rows)

    @overload
    def __getitem__(self, index: int) -> Row: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Row, ...]: ...
    def __getitem__(self, index: int | slice) -> Row | tuple[Row, ...]:
        return self.rows[index]


NO_ROWS = RowSet()


@dataclass(frozen=True)
class FrameRequest:
    generation: int
    t0: int  # relative ns (the view's coordinates)
    t1: int
    buckets: int
    rows: tuple[int, ...]  # indices into ``row_set``
    highlight: Highlight | None = None
    mode: str = "engine"  # colour mode and row height: the fetch thread also paints the picture
    row_px: int = 20
    row_set: RowSet = NO_ROWS  # the rows the indices refer to (the fetch thread reads only these)


class RowSource(enum.Enum):
    """What answered a row of a frame (the status line lists them)."""

    EVENTS = "events"  # the events themselves
    LOD = "lod"  # the track level of detail
    STORED_LOD = "InstructionLod lod"  # the profile's stored InstructionLod (while the LOD builds)
    EMPTY = "empty"  # nothing in the window

    @classmethod
    def of(cls, window: SpanWindow, stored: bool = False) -> RowSource:
        """The source of a window ``formats.tracks`` returned (its ``source`` is ``"events"`` or
        ``"lod level N"``); ``stored``: it came from the profile's InstructionLod."""
        if stored:
            return cls.STORED_LOD
        return cls.EVENTS if window.source == "events" else cls.LOD


@dataclass(frozen=True)
class FrameStatus:
    """What the status line says about a frame, as data: how long it took, what answered its rows,
    how many rows are still loading."""

    fetch_ms: float
    sources: tuple[RowSource, ...]  # distinct, in text order
    pending: int

    def text(self) -> str:
        loading = f", {self.pending} rows loading" if self.pending else ""
        names = ", ".join(s.value for s in self.sources) or "nothing"
        return f"window fetched in {self.fetch_ms:.0f} ms ({names}){loading}"


@dataclass
class FrameData:
    request: FrameRequest
    spans: dict[int, SpanWindow] = field(default_factory=dict)
    counters: dict[int, CounterWindow] = field(default_factory=dict)
    highlights: dict[int, SpanWindow] = field(default_factory=dict)
    pending: set[int] = field(default_factory=set)
    sources: dict[int, RowSource] = field(default_factory=dict)
    fetch_ms: float = 0.0
    picture: Any = None  # raster.Picture, painted on the fetch thread when a renderer is set

    @property
    def status(self) -> FrameStatus:
        names = sorted({s.value for s in self.sources.values()})
        return FrameStatus(self.fetch_ms, tuple(RowSource(n) for n in names), len(self.pending))


def buckets_for(width_px: int, rows: int) -> int:
    """One bucket per pixel, fewer when many rows would exceed the per-frame primitive budget."""
    return max(16, min(int(width_px), MAX_PRIMITIVES // max(1, rows)))


def _shift(window: SpanWindow, origin: int) -> SpanWindow:
    if origin == 0:
        return window
    return replace(window, start_ts=window.start_ts - origin, end_ts=window.end_ts - origin)


def _shift_counter(window: CounterWindow, origin: int) -> CounterWindow:
    if origin == 0 or (window.until is None and window.before_until is None):
        return window
    return replace(
        window,
        until=None if window.until is None else window.until - origin,
        before_until=None if window.before_until is None else window.before_until - origin,
    )


def _estimated_rows(loaded: LoadedProfile, spec: SpanSpec, t0: int, t1: int) -> float:
    meta = loaded.metadata
    first, last = meta.get("first_hw_timestamp"), meta.get("last_hw_timestamp")
    total = loaded.profile.num_rows(spec.table)
    if first is None or last is None or last <= first:
        return float(total)
    return total * min(1.0, (t1 - t0) / (int(last) - int(first)))


def _engine_lod_window(loaded: LoadedProfile, row: Row, t0: int, t1: int, buckets: int) -> SpanWindow | None:
    """The stored InstructionLod's window for a row that is a whole engine (interim path)."""
    if loaded.tracks is None or row.engine is None or not loaded.profile.num_rows("InstructionLod"):
        return None
    return loaded.tracks.engine_window(row.engine, t0, t1, buckets)


def _single_track_engines(rows: Sequence[Row]) -> set[tuple[int, str]]:
    """(profile, engine) pairs drawn as exactly one row on one physical core."""
    counts: dict[tuple[int, str], int] = {}
    pcores: dict[int, set[int]] = {}
    for r in rows:
        if r.kind == INSTRUCTION and r.engine:
            counts[(r.profile, r.engine)] = counts.get((r.profile, r.engine), 0) + 1
            pcores.setdefault(r.profile, set()).add(r.pcore or 0)
    return {k for k, n in counts.items() if n == 1 and len(pcores.get(k[0], ())) == 1}


def fetch_frame(
    session: Session,
    request: FrameRequest,
    lods_ready: frozenset[tuple[int, SpanSpec]] | None = None,
) -> FrameData:
    """Windows of the requested rows (of ``request.row_set``). ``lods_ready``: (profile, spec) pairs
    whose level of detail has been built (others are not waited for)."""
    rows = request.row_set.rows
    started = time.perf_counter()
    frame = FrameData(request)
    ready = lods_ready if lods_ready is not None else frozenset()
    single = _single_track_engines(rows)
    by_table: dict[tuple[int, Any], list[int]] = {}
    for index in request.rows:
        row = rows[index]
        if row.spec is None:
            continue
        by_table.setdefault((row.profile, row.spec), []).append(index)
    for (p, spec), indices in by_table.items():
        loaded = session.profiles[p]
        assert loaded.tracks is not None
        t0, t1 = request.t0 + loaded.origin, request.t1 + loaded.origin
        if isinstance(spec, CounterSpec):
            keys = [k for i in indices for k in rows[i].keys]
            windows = loaded.tracks.counter_windows(spec, t0, t1, request.buckets, keys)
            for i in indices:
                found = [windows[k] for k in rows[i].keys if k in windows]
                if found:
                    frame.counters[i] = _shift_counter(found[0], loaded.origin)
            continue
        _fetch_spans(frame, loaded, p, spec, indices, rows, t0, t1, request.buckets, ready, single)
        if request.highlight is not None and spec.table == "Instruction":
            _fetch_highlight(frame, loaded, p, spec, indices, rows, request)
    frame.fetch_ms = (time.perf_counter() - started) * 1e3
    return frame


def _fetch_spans(
    frame: FrameData,
    loaded: LoadedProfile,
    p: int,
    spec: SpanSpec,
    indices: list[int],
    rows: Sequence[Row],
    t0: int,
    t1: int,
    buckets: int,
    ready: frozenset[tuple[int, SpanSpec]],
    single: set[tuple[int, str]],
) -> None:
    assert loaded.tracks is not None
    lod_ok = (p, spec) in ready and loaded.tracks.lod_serves(spec, t0, t1, buckets)
    narrow = _estimated_rows(loaded, spec, t0, t1) <= RAW_ROWS_LIMIT
    if not lod_ok and not narrow and spec.table != "Instruction" and (p, spec) not in ready:
        narrow = True  # DMA and CC tables are an order smaller: read them while their LOD builds
    direct = [i for i in indices if lod_ok or narrow]
    if direct:
        keys = [k for i in direct for k in rows[i].keys]
        windows = loaded.tracks.span_windows(spec, t0, t1, buckets, keys)
        for i in direct:
            found = [windows[k] for k in rows[i].keys if k in windows]
            window = merge_windows(found) if found else None
            if window is not None:
                frame.spans[i] = _shift(window, loaded.origin)
                frame.sources[i] = RowSource.of(window)
            else:
                frame.sources[i] = RowSource.EMPTY
    for i in indices:
        if i in direct:
            continue
        row = rows[i]
        if row.kind == INSTRUCTION and row.engine and (p, row.engine) in single:
            window = _engine_lod_window(loaded, row, t0, t1, buckets)
            if window is not None:
                frame.spans[i] = _shift(window, loaded.origin)
                frame.sources[i] = RowSource.of(window, stored=True)
                continue
        frame.pending.add(i)


def _fetch_highlight(
    frame: FrameData,
    loaded: LoadedProfile,
    p: int,
    spec: SpanSpec,
    indices: list[int],
    rows: Sequence[Row],
    request: FrameRequest,
) -> None:
    highlight = request.highlight
    assert highlight is not None and loaded.tracks is not None
    if highlight.profile is not None and highlight.profile != p:
        return
    t0, t1 = request.t0, request.t1
    if highlight.bounds is not None:
        t0, t1 = max(t0, highlight.bounds[0]), min(t1, highlight.bounds[1])
        if t1 <= t0:
            return
    # the same pixel grid as the base frame, cut to the highlight's bounds
    pixel = (request.t1 - request.t0) / request.buckets
    first = int((t0 - request.t0) // pixel)
    last = int(np.ceil((t1 - request.t0) / pixel))
    a, b = request.t0 + int(first * pixel), request.t0 + int(last * pixel)
    if b <= a:
        return
    keys = [k for i in indices for k in rows[i].keys]
    windows = loaded.tracks.span_windows(
        spec, a + loaded.origin, b + loaded.origin, max(1, last - first), keys, where=highlight.where
    )
    for i in indices:
        found = [windows[k] for k in rows[i].keys if k in windows]
        if found:
            w = _shift(merge_windows(found), loaded.origin)
            busy = None
            if w.busy is not None:  # the highlight's pixel grid is a slice of the frame's
                busy = np.zeros(request.buckets)
                busy[first : first + w.busy.size] = w.busy[: max(0, request.buckets - first)]
            frame.highlights[i] = replace(w, bucket=w.bucket + first, busy=busy)


__all__ = [
    "CC",
    "COUNTER",
    "DMA",
    "MAX_PRIMITIVES",
    "FrameData",
    "FrameRequest",
    "FrameStatus",
    "Highlight",
    "RowSet",
    "RowSource",
    "buckets_for",
    "fetch_frame",
]
