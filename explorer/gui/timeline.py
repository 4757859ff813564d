"""The timeline widget: rows of engines, DMA queues, CC streams and counters over time.

Drawing: a pyqtgraph ViewBox (mouse pan/zoom on the time axis, raster paint engine) shows one image
per frame (``raster.render``), placed at the frame's time range. Every view change posts a frame
request (``worker.FrameFetcher``): the visible rows, the visible time plus a quarter screen either
side (so short pans are drawn at once), one bucket per pixel. Until the answer comes, the last image
stays and moves with the view.

Input (as in the real tool): wheel zooms around the cursor, Shift+wheel pans, Ctrl+wheel scrolls rows;
drag pans; Shift+drag (or right-drag) selects a box; click selects an event; W/S zoom, A/D pan (arrows
too), F fits the whole profile, Esc clears the selection and the highlight.

Thread rules: the widget lives on the UI thread and only the UI thread reads or changes it. Its rows
are an immutable ``RowSet`` snapshot; ``set_rows`` replaces the snapshot (never edits it), and every
request carries the snapshot it was made from, so the fetch thread (``worker.FrameFetcher``) and its
renderer (``raster.render``, a pure function of the frame) never look at the widget. A frame made
for an older snapshot or generation is dropped when it arrives. Status comes back as data
(``FrameData.status``), written out by ``FrameStatus.text``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, QObject, QPointF, QRectF, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QFont, QKeyEvent, QPainter, QPen, QPolygonF
from PySide6.QtWidgets import QGraphicsRectItem, QHBoxLayout, QScrollBar, QWidget

from explorer.gui.frames import FrameData, FrameRequest, Highlight, RowSet, buckets_for
from explorer.gui.raster import OwnerLayer, Picture, render
from explorer.gui.rows import HEADER, Row
from explorer.gui.session import Session
from explorer.gui.timeaxis import TimeAxis, format_ns
from explorer.gui.worker import FrameFetcher

ROW_PX = 20
MARGIN = 0.25  # fetched beyond each side of the view, as a fraction of its width
ZOOM_STEP = 0.7
PAN_STEP = 0.2


@dataclass(frozen=True)
class EventRef:
    """An event the user clicked: which row, which profile, which table row (times absolute)."""

    row: int
    profile: int
    kind: str
    id: int
    start_ts: int
    end_ts: int
    attrs: dict[str, Any] = field(default_factory=dict)


class _LabelLayer(pg.GraphicsObject):
    """Event names written over wide events, painted in device coordinates (crisp at any zoom)."""

    def __init__(self) -> None:
        super().__init__()
        self.labels: list[tuple[float, float, float, str]] = []  # (t0, t1, row y, text)
        self._bounds = QRectF()
        self.setZValue(5)

    def set_labels(self, labels: list[tuple[float, float, float, str]], bounds: QRectF) -> None:
        self.prepareGeometryChange()
        self.labels = labels
        self._bounds = bounds
        self.update()

    def boundingRect(self) -> QRectF:
        return self._bounds

    def paint(self, painter: QPainter, *args: Any) -> None:
        if not self.labels:
            return
        transform = painter.transform()
        painter.save()
        painter.resetTransform()
        painter.setPen(QColor(255, 255, 255))
        font = QFont()
        font.setPointSizeF(7.5)
        painter.setFont(font)
        metrics = painter.fontMetrics()
        for t0, t1, y, text in self.labels:
            left = transform.map(QPointF(t0, y))
            right = transform.map(QPointF(t1, y + 1))
            width = right.x() - left.x()
            if width < 30:
                continue
            shown = metrics.elidedText(text, Qt.TextElideMode.ElideRight, int(width) - 4)
            painter.drawText(
                QRectF(left.x() + 2, left.y(), width - 4, right.y() - left.y()),
                Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft,
                shown,
            )
        painter.restore()


HEADER_CHARS = 20  # a longer tick label than the row axis is wide is not drawn at all (pyqtgraph)


def header_label(label: str) -> str:
    """A profile group's row-axis label, cut at its start when long: what tells two programs of a
    capture apart is at the end (``model Gemma2ForCausalLM.context_encoding.64`` vs
    ``...token_generation.64``), and a label wider than the axis vanished entirely."""
    return f"▾ {label if len(label) <= HEADER_CHARS else '…' + label[-(HEADER_CHARS - 1):]}"


@dataclass(frozen=True)
class Arrow:
    """A dependency drawn on the timeline: from (time, row) to (time, row), relative ns."""

    t0: float
    row0: int
    t1: float
    row1: int
    kind: str  # Flow dependency_type (DMA_TRIGGER, SEMAPHORE, ...)


ARROW_COLORS = {"SEMAPHORE": QColor(200, 30, 30), "DMA_TRIGGER": QColor(120, 60, 160)}


class _ArrowLayer(pg.GraphicsObject):
    """The selected event's dependencies as arrows (predecessor end -> its start -> successor start),
    painted in device coordinates so the heads keep their size at any zoom."""

    def __init__(self) -> None:
        super().__init__()
        self.arrows: list[Arrow] = []
        self._bounds = QRectF()
        self.setZValue(12)

    def set_arrows(self, arrows: list[Arrow]) -> None:
        self.prepareGeometryChange()
        self.arrows = list(arrows)
        if arrows:
            xs = [a.t0 for a in arrows] + [a.t1 for a in arrows]
            ys = [a.row0 for a in arrows] + [a.row1 for a in arrows]
            self._bounds = QRectF(min(xs), min(ys), max(1.0, max(xs) - min(xs)), max(ys) - min(ys) + 1)
        else:
            self._bounds = QRectF()
        self.update()

    def boundingRect(self) -> QRectF:
        return self._bounds

    def paint(self, painter: QPainter, *args: Any) -> None:
        if not self.arrows:
            return
        transform = painter.transform()
        painter.save()
        painter.resetTransform()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        for arrow in self.arrows:
            a = transform.map(QPointF(arrow.t0, arrow.row0 + 0.5))
            b = transform.map(QPointF(arrow.t1, arrow.row1 + 0.5))
            color = ARROW_COLORS.get(arrow.kind, QColor(30, 30, 30))
            pen = QPen(color, 1.6)
            painter.setPen(pen)
            painter.setBrush(color)
            painter.drawLine(a, b)
            dx, dy = b.x() - a.x(), b.y() - a.y()
            length = max(1e-6, (dx * dx + dy * dy) ** 0.5)
            ux, uy = dx / length, dy / length
            head = 7.0
            left = QPointF(b.x() - head * ux + head * 0.45 * uy, b.y() - head * uy - head * 0.45 * ux)
            right = QPointF(b.x() - head * ux - head * 0.45 * uy, b.y() - head * uy + head * 0.45 * ux)
            painter.drawPolygon(QPolygonF([b, left, right]))
            painter.drawEllipse(a, 2.5, 2.5)
        painter.restore()


class TimelineViewBox(pg.ViewBox):
    """Time-only pan/zoom, box selection with Shift+drag or right-drag, clicks reported upward."""

    clicked = Signal(float, float)
    boxed = Signal(float, float, float, float)
    scroll_rows = Signal(int)

    def __init__(self) -> None:
        super().__init__(enableMenu=False)
        self.setMouseEnabled(x=True, y=False)
        self.invertY(True)
        self.disableAutoRange()
        self._band = QGraphicsRectItem()
        self._band.setPen(pg.mkPen((40, 90, 200), width=1, cosmetic=True))
        self._band.setBrush(pg.mkBrush(40, 90, 200, 40))
        self._band.setZValue(20)
        self._band.hide()
        self.addItem(self._band, ignoreBounds=True)

    def mouseClickEvent(self, ev: Any) -> None:
        if ev.button() == Qt.MouseButton.LeftButton:
            ev.accept()
            point = self.mapSceneToView(ev.scenePos())
            self.clicked.emit(point.x(), point.y())
        else:
            ev.ignore()

    def mouseDragEvent(self, ev: Any, axis: int | None = None) -> None:
        boxing = ev.button() == Qt.MouseButton.RightButton or (
            ev.button() == Qt.MouseButton.LeftButton and ev.modifiers() & Qt.KeyboardModifier.ShiftModifier
        )
        if not boxing:
            super().mouseDragEvent(ev, axis)
            return
        ev.accept()
        a = self.mapSceneToView(ev.buttonDownScenePos())
        b = self.mapSceneToView(ev.scenePos())
        rect = QRectF(a, b).normalized()
        if ev.isFinish():
            self._band.hide()
            if rect.width() > 0:
                self.boxed.emit(rect.left(), rect.right(), rect.top(), rect.bottom())
        else:
            self._band.setRect(rect)
            self._band.show()

    def wheelEvent(self, ev: Any, axis: int | None = None) -> None:
        modifiers = ev.modifiers()
        delta = ev.delta() if hasattr(ev, "delta") else ev.angleDelta().y()
        if modifiers & Qt.KeyboardModifier.ControlModifier:
            ev.accept()
            self.scroll_rows.emit(-1 if delta > 0 else 1)
            return
        if modifiers & Qt.KeyboardModifier.ShiftModifier:
            ev.accept()
            (x0, x1), _ = self.viewRange()
            shift = (x1 - x0) * 0.1 * (-1 if delta > 0 else 1)
            self.setXRange(x0 + shift, x1 + shift, padding=0)
            return
        super().wheelEvent(ev, axis)


def link_time(a: pg.ViewBox, b: pg.ViewBox) -> None:
    """Keep two views on the same time range, exactly (pyqtgraph's ``setXLink`` maps by screen
    position, which differs before a window is laid out and between views of different widths)."""
    busy = [False]

    def follow(source: pg.ViewBox, target: pg.ViewBox) -> None:
        if busy[0]:
            return
        busy[0] = True
        try:
            (x0, x1), _ = source.viewRange()
            target.setXRange(x0, x1, padding=0)
        finally:
            busy[0] = False

    a.sigXRangeChanged.connect(lambda *_: follow(a, b))
    b.sigXRangeChanged.connect(lambda *_: follow(b, a))
    follow(a, b)


class TimelineWidget(QWidget):
    """Rows of one session over time. Signals: ``event_clicked(EventRef | None)``,
    ``region_selected(t0, t1, rows)`` (relative ns, row indices), ``status(text)``,
    ``frame_shown(FrameData)``."""

    event_clicked = Signal(object)
    region_selected = Signal(int, int, object)
    status = Signal(str)
    frame_shown = Signal(object)

    def __init__(
        self, session: Session, rows: Sequence[Row], fetcher: FrameFetcher, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.session = session
        self.row_set = RowSet(tuple(rows))
        self.fetcher = fetcher
        self.mode = "engine"
        self.highlight: Highlight | None = None
        self.picture: Picture | None = None
        self.frame: FrameData | None = None
        self._generation = 0
        self._shown_generation = -1
        self._requested: FrameRequest | None = None
        self._request_times: dict[int, float] = {}
        self.latencies_ms: list[float] = []
        self.span = self._session_span()

        self.view = TimelineViewBox()
        self.axis = TimeAxis(orientation="bottom")
        self.row_axis = pg.AxisItem(orientation="left")
        self.row_axis.setWidth(170)
        self.row_axis.setStyle(tickLength=0)
        self.plot = pg.PlotWidget(viewBox=self.view, axisItems={"bottom": self.axis, "left": self.row_axis})
        self.plot.setBackground("w")
        self.plot.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.plot.installEventFilter(self)
        self.plot.hideButtons()
        self.plot.getPlotItem().setMenuEnabled(False)
        self.image = pg.ImageItem(axisOrder="row-major")
        self.image.setZValue(0)
        self.view.addItem(self.image)
        self.labels = _LabelLayer()
        self.view.addItem(self.labels, ignoreBounds=True)
        self.selection = QGraphicsRectItem()
        self.selection.setPen(pg.mkPen((220, 20, 60), width=2, cosmetic=True))
        self.selection.setZValue(10)
        self.selection.hide()
        self.view.addItem(self.selection, ignoreBounds=True)
        self.arrow_layer = _ArrowLayer()
        self.view.addItem(self.arrow_layer, ignoreBounds=True)
        self.region = QGraphicsRectItem()
        self.region.setPen(pg.mkPen((40, 90, 200), width=1, cosmetic=True))
        self.region.setBrush(pg.mkBrush(40, 90, 200, 30))
        self.region.setZValue(9)
        self.region.hide()
        self.view.addItem(self.region, ignoreBounds=True)

        self.scrollbar = QScrollBar(Qt.Orientation.Vertical)
        self.scrollbar.valueChanged.connect(self._apply_rows)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self.plot)
        layout.addWidget(self.scrollbar)

        self._debounce = QTimer(self)
        self._debounce.setSingleShot(True)
        self._debounce.setInterval(120)
        self._debounce.timeout.connect(lambda: self.request_frame(force=True))
        self.view.sigXRangeChanged.connect(self._on_x_changed)
        self.view.sigResized.connect(self._on_resized)
        self.view.clicked.connect(self._on_click)
        self.view.boxed.connect(self._on_box)
        self.view.scroll_rows.connect(lambda step: self.scrollbar.setValue(self.scrollbar.value() + 3 * step))
        fetcher.renderer = render  # a pure function of the frame: reads no widget state
        fetcher.ready.connect(self.show_frame)
        fetcher.lod_ready.connect(lambda _table: self.request_frame(force=True))
        fetcher.failed.connect(self.status.emit)
        self.set_span(self.span)
        self.view.setXRange(*self.span, padding=0)
        self._apply_rows()

    # -- rows --------------------------------------------------------------------------------
    @property
    def rows(self) -> tuple[Row, ...]:
        return self.row_set.rows

    def set_rows(self, rows: Sequence[Row]) -> None:
        """Show other rows: a new snapshot; frames fetched for the old one are dropped on arrival."""
        self.row_set = RowSet(tuple(rows))
        self.frame = self.picture = None
        self.image.clear()
        self.labels.set_labels([], QRectF())
        self.clear_selection()
        self._apply_rows()  # requests a frame: the request's row set differs from the last one

    # -- geometry ----------------------------------------------------------------------------
    def _session_span(self) -> tuple[int, int]:
        lo, hi = None, None
        for loaded in self.session.profiles:
            meta = loaded.metadata
            first, last = meta.get("first_hw_timestamp"), meta.get("last_hw_timestamp")
            if first is None or last is None:
                continue
            a, b = int(first) - loaded.origin, int(last) - loaded.origin
            lo = a if lo is None else min(lo, a)
            hi = b if hi is None else max(hi, b)
        if lo is None or hi is None or hi <= lo:
            return 0, 1000
        return lo, hi

    def set_span(self, span: tuple[int, int]) -> None:
        """The time the view may show: the profiles' span, with one span of slack either side."""
        self.span = span
        width = span[1] - span[0]
        self.view.setLimits(xMin=span[0] - width, xMax=span[1] + width, minXRange=10)

    def visible_row_count(self) -> int:
        height = max(1, int(self.view.height() or self.plot.height() - 40))
        return max(1, height // ROW_PX)

    def visible_rows(self) -> tuple[int, ...]:
        first = self.scrollbar.value()
        return tuple(range(first, min(len(self.rows), first + self.visible_row_count())))

    def _apply_rows(self) -> None:
        count = self.visible_row_count()
        self.scrollbar.setRange(0, max(0, len(self.rows) - count))
        self.scrollbar.setPageStep(count)
        self.scrollbar.setEnabled(len(self.rows) > count)  # always shown: the flame chart lines up with it
        first = self.scrollbar.value()
        self.view.setYRange(first, first + count, padding=0)
        ticks = [(i + 0.5, self._row_label(self.rows[i])) for i in self.visible_rows()]
        self.row_axis.setTicks([ticks, []])
        self.request_frame()

    def _row_label(self, row: Row) -> str:
        if row.kind == HEADER:
            return header_label(row.label)
        return row.shown[:30]

    def _on_resized(self) -> None:
        self._apply_rows()

    def row_band(self, index: int) -> tuple[int, int] | None:
        """Pixel rows [top, bottom) of a row inside this widget (for tests and screenshots)."""
        if index not in self.visible_rows():
            return None
        top = self.view.mapViewToScene(QPointF(self.view.viewRange()[0][0], index))
        bottom = self.view.mapViewToScene(QPointF(self.view.viewRange()[0][0], index + 1))
        a = self.plot.mapFromScene(top)
        b = self.plot.mapFromScene(bottom)
        offset = self.plot.mapTo(self, a)
        return offset.y(), offset.y() + (b.y() - a.y())

    def plot_columns(self) -> tuple[int, int]:
        """Pixel columns [left, right) of the data area inside this widget."""
        rect = self.view.sceneBoundingRect()
        left = self.plot.mapTo(self, self.plot.mapFromScene(rect.topLeft()))
        right = self.plot.mapTo(self, self.plot.mapFromScene(rect.topRight()))
        return left.x(), right.x()

    # -- range -------------------------------------------------------------------------------
    def time_range(self) -> tuple[float, float]:
        (x0, x1), _ = self.view.viewRange()
        return x0, x1

    def set_range(self, t0: float, t1: float) -> None:
        if t1 <= t0:
            t1 = t0 + 10
        self.view.setXRange(t0, t1, padding=0)

    def clamp_to_span(self, t0: float, t1: float) -> tuple[float, float, str | None]:
        """(t0, t1) cut to the profiles' span, and a one-line warning when that changed it (a
        ``--range`` past the end would otherwise show empty rows and counters held past the end)."""
        lo, hi = self.span
        a, b = max(float(lo), t0), min(float(hi), t1)
        if b <= a:  # wholly outside: show the whole profile
            a, b = float(lo), float(hi)
        if (a, b) == (t0, t1):
            return t0, t1, None
        return a, b, (
            f"range {format_ns(t0)}–{format_ns(t1)} is outside the profile "
            f"({format_ns(lo)}–{format_ns(hi)}): showing {format_ns(a)}–{format_ns(b)}"
        )

    def fit(self) -> None:
        self.set_range(*self.span)

    def zoom(self, factor: float, center: float | None = None) -> None:
        x0, x1 = self.time_range()
        c = (x0 + x1) / 2 if center is None else center
        self.set_range(c - (c - x0) * factor, c + (x1 - c) * factor)

    def pan(self, fraction: float) -> None:
        x0, x1 = self.time_range()
        shift = (x1 - x0) * fraction
        self.set_range(x0 + shift, x1 + shift)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self.plot and isinstance(event, QKeyEvent) and event.type() == QEvent.Type.KeyPress:
            return self.handle_key(event.key())
        return False

    def handle_key(self, key: int) -> bool:
        """W/S zoom, A/D pan (arrows too), F fit, Esc clear. True if handled."""
        k = Qt.Key
        if key in (k.Key_W, k.Key_Up, k.Key_Plus, k.Key_Equal):
            self.zoom(ZOOM_STEP)
        elif key in (k.Key_S, k.Key_Down, k.Key_Minus):
            self.zoom(1 / ZOOM_STEP)
        elif key in (k.Key_A, k.Key_Left):
            self.pan(-PAN_STEP)
        elif key in (k.Key_D, k.Key_Right):
            self.pan(PAN_STEP)
        elif key == k.Key_F:
            self.fit()
        elif key == k.Key_Escape:
            self.clear_selection()
            self.set_highlight(None)
        else:
            return False
        return True

    # -- frames ------------------------------------------------------------------------------
    def _on_x_changed(self) -> None:
        self.request_frame()
        self._debounce.start()

    def current_request(self) -> FrameRequest:
        x0, x1 = self.time_range()
        width = max(1.0, x1 - x0)
        rows = self.visible_rows()
        pixels = max(16, int(self.view.width() or self.plot.width()))
        span = int(pixels * (1 + 2 * MARGIN))
        t0 = int(np.floor(x0 - MARGIN * width))
        t1 = int(np.ceil(x1 + MARGIN * width))
        buckets = buckets_for(span, len(rows))
        return FrameRequest(
            self._generation + 1, t0, max(t1, t0 + 1), buckets, rows, self.highlight, self.mode, ROW_PX,
            self.row_set,
        )

    def _needs_fetch(self, request: FrameRequest) -> bool:
        last = self._requested
        if (
            last is None
            or last.row_set is not request.row_set
            or last.rows != request.rows
            or last.highlight != request.highlight
        ):
            return True
        x0, x1 = self.time_range()
        inside = last.t0 <= x0 and x1 <= last.t1
        scale_then = (last.t1 - last.t0) / last.buckets
        scale_now = (request.t1 - request.t0) / request.buckets
        return not inside or abs(scale_now / scale_then - 1) > 0.15

    def request_frame(self, force: bool = False) -> None:
        request = self.current_request()
        if not force and not self._needs_fetch(request):
            return
        self._generation = request.generation
        self._requested = request
        self._request_times[request.generation] = time.perf_counter()
        self.fetcher.request(request)

    def fetch_now(self) -> FrameData:
        """Fetch and show the current view synchronously (headless use and tests)."""
        request = self.current_request()
        self._generation = request.generation
        self._requested = request
        frame = self.fetcher.fetch_now(request)
        self.show_frame(frame)
        return frame

    def show_frame(self, frame: FrameData) -> None:
        if frame.request.generation < self._shown_generation or frame.request.row_set is not self.row_set:
            return  # an older view's frame, or one of rows no longer shown
        self._shown_generation = frame.request.generation
        asked = self._request_times.pop(frame.request.generation, None)
        if asked is not None:
            self.latencies_ms.append((time.perf_counter() - asked) * 1e3)
        for old in [g for g in self._request_times if g < frame.request.generation]:
            del self._request_times[old]
        self.frame = frame
        self._draw()
        self.status.emit(frame.status.text())
        self.frame_shown.emit(frame)

    def _draw(self) -> None:
        frame = self.frame
        if frame is None:
            return
        request = frame.request
        picture = frame.picture
        if picture is None or picture.mode != self.mode or picture.row_px != ROW_PX:
            picture = frame.picture = render(frame, self.mode, ROW_PX)
        self.picture = picture
        first = request.rows[0] if request.rows else 0
        self.image.setImage(picture.image, autoLevels=False, levels=None)
        self.image.setRect(QRectF(request.t0, first, request.t1 - request.t0, max(1, len(request.rows))))
        scale = (request.t1 - request.t0) / max(1, request.buckets)
        labels = [
            (request.t0 + lab.x0 * scale, request.t0 + lab.x1 * scale, first + lab.slot, lab.text)
            for lab in picture.labels
        ]
        self.labels.set_labels(labels, QRectF(request.t0, first, request.t1 - request.t0, len(request.rows)))

    def set_mode(self, mode: str) -> None:
        self.mode = mode
        self._draw()

    def set_highlight(self, highlight: Highlight | None) -> None:
        self.highlight = highlight
        self.request_frame(force=True)

    # -- selection ---------------------------------------------------------------------------
    def event_at(self, x: float, y: float) -> EventRef | None:
        """The event drawn at view coordinates (time, row) in the current picture."""
        frame, picture = self.frame, self.picture
        if frame is None or picture is None or not picture.rows:
            return None
        index = int(np.floor(y))
        if index not in picture.rows:
            return None
        slot = picture.rows.index(index)
        owner = picture.owners.get(slot)
        if owner is None:
            return None
        column = int((x - picture.t0) * picture.width / max(1, picture.t1 - picture.t0))
        if not 0 <= column < owner.size:
            return None
        hit = owner.at(column)
        if hit is None:
            return None
        window = frame.highlights[index] if hit.layer is OwnerLayer.HIGHLIGHT else frame.spans[index]
        k = hit.index
        row = frame.request.row_set[index]
        origin = self.session.profiles[row.profile].origin
        attrs = {name: values[k] for name, values in window.attrs.items()}
        return EventRef(
            index,
            row.profile,
            row.kind,
            int(window.id[k]),
            int(window.start_ts[k]) + origin,
            int(window.end_ts[k]) + origin,
            attrs,
        )

    def _on_click(self, x: float, y: float) -> None:
        self.plot.setFocus()
        ref = self.event_at(x, y)
        self.select(ref)
        self.event_clicked.emit(ref)

    def select(self, ref: EventRef | None) -> None:
        """Outline an event (or clear the outline and its arrows)."""
        if ref is None:
            self.selection.hide()
            self.set_arrows([])
            return
        origin = self.session.profiles[ref.profile].origin
        self.selection.setRect(
            QRectF(ref.start_ts - origin, ref.row + 0.05, max(1, ref.end_ts - ref.start_ts), 0.9)
        )
        self.selection.show()

    def clear_selection(self) -> None:
        self.selection.hide()
        self.region.hide()
        self.set_arrows([])

    @property
    def arrows(self) -> list[Arrow]:
        return self.arrow_layer.arrows

    def set_arrows(self, arrows: list[Arrow]) -> None:
        """Draw the selected event's dependencies (replacing any drawn before)."""
        self.arrow_layer.set_arrows(arrows)

    def _on_box(self, t0: float, t1: float, y0: float, y1: float) -> None:
        first = max(0, int(np.floor(y0)))
        last = min(len(self.rows) - 1, int(np.floor(y1)))
        rows = [i for i in range(first, last + 1) if self.rows[i].kind != HEADER]
        self.show_region(int(t0), int(np.ceil(t1)), rows)
        self.region_selected.emit(int(t0), int(np.ceil(t1)), rows)

    def show_region(self, t0: int, t1: int, rows: Sequence[int]) -> None:
        if not rows:
            self.region.hide()
            return
        self.region.setRect(QRectF(t0, min(rows), max(1, t1 - t0), max(rows) - min(rows) + 1))
        self.region.show()

    def row_of(self, profile: int, kind: str, predicate: Any = None) -> int | None:
        """The first row of ``profile`` of ``kind`` for which ``predicate(row)`` holds."""
        for i, row in enumerate(self.rows):
            if row.profile == profile and row.kind == kind and (predicate is None or predicate(row)):
                return i
        return None

    def ensure_row_visible(self, index: int) -> None:
        rows = self.visible_rows()
        if rows and rows[0] <= index <= rows[-1]:
            return
        self.scrollbar.setValue(max(0, index - 2))

    def close_fetcher(self) -> None:
        self.fetcher.stop()
