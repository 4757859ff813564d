"""Turn a frame's windows into one RGBA image, in NumPy: the timeline draws a picture, not items.

A frame holds at most one event per row and pixel bucket (``frames.MAX_PRIMITIVES`` in all), and
painting them is a handful of vectorised passes per row; Qt then draws one image. That keeps a frame
a few milliseconds whatever the zoom, with no per-rectangle Python objects, and works on the raster
paint engine (no OpenGL). The image's columns are the frame's pixel buckets; the timeline places it
at the frame's time range, so while the next frame loads the last one simply moves with the view.

``Picture.owners`` remembers which event painted each pixel of each row -- a ``PixelOwners`` per
row: which layer (the row's window or the highlight's) and which event of it, read back through one
decoder, ``PixelOwners.at`` -- so a click is answered from the picture (what you see is what you
select) without another query.

Thread rules: ``render`` is a pure function of a ``FrameData`` (whose request carries its own
``RowSet`` snapshot) and may run on the fetch thread; it reads no widget state. A ``Picture`` is
built by one thread and then only read (by the UI thread, once handed over).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from explorer.gui import colors
from explorer.gui.frames import FrameData
from explorer.gui.rows import COUNTER, HEADER, Row
from formats.read_api import CounterWindow, SpanWindow

LABEL_MIN_PX = 48  # events at least this wide get their name written on them
MAX_LABELS = 400


@dataclass
class Label:
    slot: int
    x0: int
    x1: int
    text: str


class OwnerLayer(enum.IntEnum):
    """Which window the event painted at a column comes from."""

    NONE = 0  # nothing painted
    BASE = 1  # the row's window (``FrameData.spans``)
    HIGHLIGHT = 2  # the row's highlighted events (``FrameData.highlights``)


@dataclass(frozen=True)
class PixelOwner:
    """The event painted at one column: its layer and its index in that layer's window."""

    layer: OwnerLayer
    index: int


NEAREST = (0, -1, 1, -2, 2)  # columns tried for a click: a pixel of slack, thin events are hard to hit


@dataclass(frozen=True)
class PixelOwners:
    """Per column of one row: the layer (``OwnerLayer`` codes) and the event index in that layer's
    window (-1 where nothing is painted). Two arrays, one meaning each -- no sign-encoded indices."""

    layer: np.ndarray  # uint8, OwnerLayer values
    index: np.ndarray  # int64

    @classmethod
    def of(cls, owner: np.ndarray) -> PixelOwners:
        """From ``owners_of``'s per-column event index of the row's window (-1: none)."""
        layer = np.where(owner >= 0, OwnerLayer.BASE, OwnerLayer.NONE).astype(np.uint8)
        return cls(layer, owner.astype(np.int64))

    def with_highlight(self, lit: np.ndarray) -> PixelOwners:
        """Highlighted events (``owners_of`` over the highlight window) painted over the base."""
        on = lit >= 0
        return PixelOwners(np.where(on, np.uint8(OwnerLayer.HIGHLIGHT), self.layer).astype(np.uint8),
                           np.where(on, lit, self.index).astype(np.int64))

    @property
    def size(self) -> int:
        return int(self.index.size)

    def at(self, column: int, nearest: tuple[int, ...] = NEAREST) -> PixelOwner | None:
        """The one decoder: the event painted at ``column`` (or the nearest one within the slack)."""
        for dx in nearest:
            c = column + dx
            if 0 <= c < self.size and self.layer[c] != OwnerLayer.NONE:
                return PixelOwner(OwnerLayer(int(self.layer[c])), int(self.index[c]))
        return None


@dataclass
class Picture:
    """A rendered frame: ``image`` is (rows x row_px, width, 4) RGBA; ``owners[slot]`` which event
    of which window is painted at each column of that row (``PixelOwners``)."""

    image: np.ndarray
    t0: int
    t1: int
    rows: tuple[int, ...]
    row_px: int
    owners: dict[int, PixelOwners] = field(default_factory=dict)
    labels: list[Label] = field(default_factory=list)
    mode: str = "engine"
    busy: dict[int, np.ndarray] = field(default_factory=dict)  # slot -> busy fraction per column

    @property
    def width(self) -> int:
        return int(self.image.shape[1])


def pixel_spans(
    start: np.ndarray, end: np.ndarray, t0: int, t1: int, width: int
) -> tuple[np.ndarray, np.ndarray]:
    """Columns [x0, x1) of each event, at least one pixel wide, clipped to the image."""
    scale = width / max(1, t1 - t0)
    x0 = np.clip(np.floor((start - t0) * scale), 0, width - 1).astype(np.int64)
    x1 = np.clip(np.ceil((end - t0) * scale), 0, width).astype(np.int64)
    return x0, np.maximum(x1, x0 + 1)


def owners_of(x0: np.ndarray, x1: np.ndarray, width: int) -> np.ndarray:
    """Per column, the last event (highest index) covering it; -1 where none does. Events are in
    start order, so a short event inside a long one is drawn over it."""
    owner = np.full(width, -1, np.int64)
    lengths = x1 - x0
    total = int(lengths.sum())
    if total == 0:
        return owner
    index = np.repeat(np.arange(x0.size), lengths)
    offsets = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    pos = np.repeat(x0, lengths) + offsets
    order = np.lexsort((index, pos))
    pos, index = pos[order], index[order]
    last = np.r_[pos[1:] != pos[:-1], True]
    owner[pos[last]] = index[last]
    return owner


def event_colors(window: SpanWindow, row: Row, mode: str) -> np.ndarray:
    """RGBA per event of a row in the colour mode."""
    if mode == "engine" or mode not in colors.MODE_ATTR:
        base = np.array(colors.row_color(row.kind, row.track), np.uint8)
        return np.broadcast_to(base, (len(window), 4))
    names = window.attrs.get(colors.MODE_ATTR[mode])
    if names is None:
        if row.kind == "instruction":
            return np.broadcast_to(np.array(colors.UNKNOWN, np.uint8), (len(window), 4))
        base = np.array(colors.row_color(row.kind, row.track), np.uint8)
        return np.broadcast_to(base, (len(window), 4))
    return colors.name_colors(names)


def _label_attr(row: Row, mode: str) -> str:
    if row.kind == "dma":
        return "queue_type"
    if row.kind == "cc":
        return "operation"
    return colors.MODE_ATTR.get(mode, "opcode")


def render(frame: FrameData, mode: str | None = None, row_px: int | None = None) -> Picture:
    """The frame as an image: one band of ``row_px`` pixels per requested row, one column per bucket;
    ``mode`` and ``row_px`` default to the request's. The rows are the request's own snapshot.

    Each row is painted as one line of ``width`` pixels and copied down its band (a broadcast copy),
    so the per-pixel work is done once per row, not once per pixel row."""
    request = frame.request
    rows = request.row_set
    mode = request.mode if mode is None else mode
    row_px = request.row_px if row_px is None else row_px
    width = request.buckets
    picture = Picture(
        np.empty((len(request.rows) * row_px, width, 4), np.uint8),
        request.t0,
        request.t1,
        request.rows,
        row_px,
        mode=mode,
    )
    image = picture.image
    pad = 2 if row_px >= 10 else 0
    highlighting = request.highlight is not None
    for slot, index in enumerate(request.rows):
        row = rows[index]
        band = image[slot * row_px : (slot + 1) * row_px]
        if row.kind == HEADER:
            band[:] = colors.HEADER_FILL
            continue
        background = np.array(colors.ROW_STRIPE if slot % 2 else colors.BACKGROUND, np.uint8)
        band[:] = background
        band[-1:] = colors.GRID
        inner = band[pad : row_px - max(pad, 1)]
        if index in frame.pending:
            _hatch(inner)
        if row.kind == COUNTER:
            counter = frame.counters.get(index)
            if counter is not None:
                _paint_counter(inner, counter, row, width, request.t0, request.t1)
            continue
        window = frame.spans.get(index)
        if window is None or not len(window):
            continue
        x0, x1 = pixel_spans(window.start_ts, window.end_ts, request.t0, request.t1, width)
        owner = owners_of(x0, x1, width)
        picture.owners[slot] = PixelOwners.of(owner)
        palette = np.asarray(event_colors(window, row, mode))
        if highlighting:
            palette = colors.dim(palette)
        line = np.empty((width, 4), np.uint8)
        line[:] = background
        painted = owner >= 0
        line[painted] = palette[owner[painted]]
        _separators(line, owner)
        if highlighting and index in frame.highlights:
            lit = frame.highlights[index]
            hx0, hx1 = pixel_spans(lit.start_ts, lit.end_ts, request.t0, request.t1, width)
            lit_owner = owners_of(hx0, hx1, width)
            on = lit_owner >= 0
            line[on] = np.asarray(event_colors(lit, row, mode))[lit_owner[on]]
            picture.owners[slot] = picture.owners[slot].with_highlight(lit_owner)
        busy = _busy_columns(window, frame.highlights.get(index) if highlighting else None, owner)
        if busy is None:
            inner[:] = line
        else:  # a bar per column as high as the column is busy: a 30 %-busy engine is never solid
            height = inner.shape[0]
            bar = np.where(busy > 0, np.maximum(1, np.rint(busy * height)), 0).astype(np.int64)
            from_bottom = np.arange(height)[::-1, None]  # pixel row -> its height above the band's bottom
            pixels = inner.view(np.uint32)[..., 0]  # one RGBA pixel = one uint32: a 2-D select, no loops
            colours = np.ascontiguousarray(line).view(np.uint32)[:, 0]
            pixels[:] = np.where(from_bottom < bar[None, :], colours[None, :], background.view(np.uint32)[0])
            picture.busy[slot] = busy
        if len(picture.labels) < MAX_LABELS:
            _collect_labels(picture, slot, window, row, mode, x0, x1)
    return picture


def _busy_columns(window: SpanWindow, lit: SpanWindow | None, owner: np.ndarray) -> np.ndarray | None:
    """Per column the fraction of it the row is busy (None when the window's source has no busy
    time). A column an event is drawn in is at least one pixel high; a highlighted column as busy as
    its highlighted events or more."""
    if window.busy is None or window.busy.size != owner.size:
        return None
    busy = np.where(owner >= 0, np.maximum(window.busy, 1e-9), window.busy)
    if lit is not None and lit.busy is not None and lit.busy.size == busy.size:
        busy = np.maximum(busy, lit.busy)
    return busy


def _separators(line: np.ndarray, owner: np.ndarray) -> None:
    """A darker column where one event meets the next, so back-to-back events stay distinguishable."""
    if owner.size < 2:
        return
    change = np.flatnonzero((owner[1:] != owner[:-1]) & (owner[1:] >= 0) & (owner[:-1] >= 0)) + 1
    if change.size:
        line[change] = (line[change].astype(np.uint16) * 3 // 4).astype(np.uint8)


def _collect_labels(
    picture: Picture, slot: int, window: SpanWindow, row: Row, mode: str, x0: np.ndarray, x1: np.ndarray
) -> None:
    names = window.attrs.get(_label_attr(row, mode))
    if names is None:
        return
    wide = np.flatnonzero((x1 - x0) >= LABEL_MIN_PX)
    reach = -1
    for k in wide[: MAX_LABELS - len(picture.labels)].tolist():
        if names[k] is not None and x0[k] >= reach:  # no label over another one
            picture.labels.append(Label(slot, int(x0[k]), int(x1[k]), str(names[k])))
            reach = int(x1[k])


def _hatch(inner: np.ndarray) -> None:
    """Diagonal stripes: this row's data for the window is still being computed."""
    h, w = inner.shape[:2]
    if h == 0:
        return
    yy, xx = np.mgrid[0:h, 0:w]
    stripes = ((xx + yy) % 8) < 2
    inner[stripes] = (225, 225, 232, 255)


def counter_levels(
    window: CounterWindow, width: int, t0: int = 0, t1: int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(low, high, known) per column: each non-empty bucket's min and max; empty buckets hold the last
    value before them (a counter holds its value until the next sample, or -- for windowed samples
    such as NeuronLinkUsage -- until its window ends, then reads 0); unknown before any value."""
    low = np.full(width, np.nan)
    high = np.full(width, np.nan)
    last = np.full(width, np.nan)
    b = np.clip(window.bucket, 0, width - 1)
    low[b], high[b], last[b] = window.low, window.high, window.last
    has = ~np.isnan(high)
    carry_index = np.maximum.accumulate(np.where(has, np.arange(width), -1))
    prev = np.r_[-1, carry_index[:-1]]
    before = np.nan if window.before is None else window.before
    fill = np.where(prev >= 0, last[np.maximum(prev, 0)], before)
    if window.until is not None:
        until = np.full(width, np.nan)
        until[b] = window.until
        column_time = t0 + np.arange(width) * ((t1 - t0) / width)
        before_until = np.nan if window.before_until is None else window.before_until
        held_until = np.where(prev >= 0, until[np.maximum(prev, 0)], before_until)
        expired = ~np.isnan(fill) & (np.isnan(held_until) | (column_time >= held_until))
        fill = np.where(expired, 0.0, fill)
    low = np.where(has, low, fill)
    high = np.where(has, high, fill)
    return low, high, ~np.isnan(high)


def _paint_counter(inner: np.ndarray, window: CounterWindow, row: Row, width: int, t0: int, t1: int) -> None:
    h = inner.shape[0]
    if h == 0:
        return
    low, high, known = counter_levels(window, width, t0, t1)
    if row.ends_at is not None:  # a counter holds its last value until the profile ends, not beyond
        column_start = t0 + np.arange(width) * ((t1 - t0) / width)
        known = known & (column_start < row.ends_at)
    lo_scale, hi_scale = row.scale or (0.0, float(np.nanmax(high)) if known.any() else 1.0)
    lo_scale = min(0.0, lo_scale)
    span = (hi_scale - lo_scale) or 1.0
    top = np.where(known, np.clip((high - lo_scale) / span, 0, 1) * h, 0).round().astype(np.int64)
    bottom = np.where(known, np.clip((low - lo_scale) / span, 0, 1) * h, 0).round().astype(np.int64)
    top = np.where(known & (high > lo_scale), np.maximum(top, 1), top)
    level = np.arange(h)[::-1][:, None]  # 0 at the bottom row of the band
    color = np.array(colors.row_color(COUNTER, row.label), np.uint8)
    light = colors.dim(color[None, :], 0.45)[0]
    inner[level < top[None, :]] = light
    inner[level < bottom[None, :]] = color
