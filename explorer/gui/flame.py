"""The hierarchy flame chart under the timeline: layers, then HLO ops, on the timeline's time axis.

Drawn like the timeline -- one image per view, one band per depth, each node at its busy intervals,
rasterised in NumPy (``raster.owners_of``) -- but from memory: a hierarchy has thousands of nodes,
not millions, so the view needs no query. Its x-axis is linked to the timeline's, so both always
show the same time. A click emits the node; the main window highlights the node's instructions and
zooms to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QColor, QFont, QPainter
from PySide6.QtWidgets import QGraphicsRectItem, QHBoxLayout, QLabel, QScrollBar, QVBoxLayout, QWidget

from explorer.gui import colors
from explorer.gui.flame_tree import FlameNode, FlameTree
from explorer.gui.raster import owners_of, pixel_spans

ROW_PX = 18


class _FlameView(pg.ViewBox):
    clicked = Signal(float, float)

    def __init__(self) -> None:
        super().__init__(enableMenu=False)
        self.setMouseEnabled(x=True, y=False)
        self.invertY(True)
        self.disableAutoRange()

    def mouseClickEvent(self, ev: Any) -> None:
        if ev.button() == Qt.MouseButton.LeftButton:
            ev.accept()
            p = self.mapSceneToView(ev.scenePos())
            self.clicked.emit(p.x(), p.y())
        else:
            ev.ignore()


class _Names(pg.GraphicsObject):
    """Node names over wide bars (device coordinates)."""

    def __init__(self) -> None:
        super().__init__()
        self.items: list[tuple[float, float, float, str]] = []
        self._bounds = QRectF()
        self.setZValue(5)

    def set_items(self, items: Sequence[tuple[float, float, float, str]], bounds: QRectF) -> None:
        self.prepareGeometryChange()
        self.items, self._bounds = list(items), bounds
        self.update()

    def boundingRect(self) -> QRectF:
        return self._bounds

    def paint(self, painter: QPainter, *args: Any) -> None:
        transform = painter.transform()
        painter.save()
        painter.resetTransform()
        painter.setPen(QColor(20, 20, 20))
        font = QFont()
        font.setPointSizeF(7.5)
        painter.setFont(font)
        metrics = painter.fontMetrics()
        for t0, t1, y, text in self.items:
            a, b = transform.map(QPointF(t0, y)), transform.map(QPointF(t1, y + 1))
            width = b.x() - a.x()
            if width < 30:
                continue
            painter.drawText(
                QRectF(a.x() + 2, a.y(), width - 4, b.y() - a.y()),
                Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft,
                metrics.elidedText(text, Qt.TextElideMode.ElideRight, int(width) - 4),
            )
        painter.restore()


class FlameWidget(QWidget):
    """``node_clicked(FlameNode)``."""

    node_clicked = Signal(object)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.tree: FlameTree | None = None
        self.origin = 0
        self._flat: list[dict[str, np.ndarray]] = []
        self.view = _FlameView()
        axis = pg.AxisItem(orientation="left")
        axis.setWidth(170)
        axis.setStyle(tickLength=0)
        self.plot = pg.PlotWidget(viewBox=self.view, axisItems={"left": axis})
        self.plot.setBackground("w")
        self.plot.hideAxis("bottom")
        self.plot.hideButtons()
        self.plot.getPlotItem().setMenuEnabled(False)
        self.axis = axis
        self.image = pg.ImageItem(axisOrder="row-major")
        self.view.addItem(self.image)
        self.names = _Names()
        self.view.addItem(self.names, ignoreBounds=True)
        self.outline = QGraphicsRectItem()
        self.outline.setPen(pg.mkPen((220, 20, 60), width=2, cosmetic=True))
        self.outline.setZValue(10)
        self.outline.hide()
        self.view.addItem(self.outline, ignoreBounds=True)
        self.note = QLabel("hierarchy: loading…")
        self.note.setStyleSheet("color: #555; padding: 2px 6px;")
        self.gutter = QWidget()  # as wide as the timeline's scrollbar, so both time axes line up
        self.gutter.setFixedWidth(QScrollBar(Qt.Orientation.Vertical).sizeHint().width())
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(0)
        row.addWidget(self.plot, 1)
        row.addWidget(self.gutter)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self.note)
        layout.addLayout(row, 1)
        self.view.sigXRangeChanged.connect(lambda *_: self.redraw())
        self.view.sigResized.connect(self.redraw)
        self.view.clicked.connect(self._on_click)

    def set_tree(self, tree: FlameTree, origin: int, label: str = "") -> None:
        self.tree, self.origin = tree, origin
        self._flat = []
        node_colors = colors.name_colors([n.name for n in tree.nodes])  # once: redraws only index it
        # (by full name: a layer's colour here is its colour on the timeline coloured by layer)
        for depth in range(tree.depth):
            nodes = [i for i, n in enumerate(tree.nodes) if n.depth == depth]
            parts = [(tree.nodes[i].intervals - origin, i) for i in nodes if len(tree.nodes[i].intervals)]
            if parts:
                spans = np.concatenate([p for p, _ in parts])
                owner = np.concatenate([np.full(len(p), i) for p, i in parts])
                order = np.argsort(spans[:, 0], kind="stable")
                self._flat.append(
                    {
                        "start": spans[order, 0],
                        "end": spans[order, 1],
                        "node": owner[order],
                        "color": node_colors[owner[order]],
                    }
                )
            else:
                self._flat.append(
                    {
                        "start": np.zeros(0, np.int64),
                        "end": np.zeros(0, np.int64),
                        "node": np.zeros(0, np.int64),
                        "color": np.zeros((0, 4), np.uint8),
                    }
                )
        ticks = [(d + 0.5, "layers" if d == 0 else f"depth {d}") for d in range(tree.depth)]
        self.axis.setTicks([ticks, []])
        self.view.setYRange(0, max(1, tree.depth), padding=0)
        where = f" of {label}" if label else ""
        self.note.setText(
            tree.note
            or f"hierarchy{where}: framework layers → HLO ops ({len(tree.nodes)} nodes, "
            f"from {tree.source}{'; ' + tree.malformed if tree.malformed else ''}); "
            "click a node to highlight and zoom to it"
        )
        self.setMinimumHeight(min(260, 40 + ROW_PX * max(1, tree.depth)))
        self.redraw()

    def redraw(self) -> None:
        if self.tree is None or not self._flat:
            self.image.clear()
            return
        (t0, t1), _ = self.view.viewRange()
        width = max(16, int(self.view.width() or 800))
        height = len(self._flat) * ROW_PX
        image = np.empty((height, width, 4), np.uint8)
        image[:] = colors.BACKGROUND
        names = []
        for depth, flat in enumerate(self._flat):
            band = image[depth * ROW_PX : (depth + 1) * ROW_PX]
            band[-1:] = colors.GRID
            keep = (flat["start"] < t1) & (flat["end"] > t0)
            if not keep.any():
                continue
            start, end, node = flat["start"][keep], flat["end"][keep], flat["node"][keep]
            x0, x1 = pixel_spans(start, end, int(t0), int(t1), width)
            owner = owners_of(x0, x1, width)
            painted = owner >= 0
            line = np.empty((width, 4), np.uint8)
            line[:] = colors.BACKGROUND
            line[painted] = flat["color"][keep][owner[painted]]
            band[1:-2] = line
            reach = -1
            for k in np.flatnonzero((x1 - x0) >= 40)[:300].tolist():
                if x0[k] >= reach:  # no name over another one
                    names.append((float(start[k]), float(end[k]), depth, self.tree.nodes[int(node[k])].label))
                    reach = int(x1[k])
        self.image.setImage(image, autoLevels=False, levels=None)
        self.image.setRect(QRectF(t0, 0, t1 - t0, len(self._flat)))
        self.names.set_items(names, QRectF(t0, 0, t1 - t0, len(self._flat)))

    def node_at(self, x: float, y: float) -> FlameNode | None:
        if self.tree is None:
            return None
        depth = int(np.floor(y))
        if not 0 <= depth < len(self._flat):
            return None
        flat = self._flat[depth]
        (t0, t1), _ = self.view.viewRange()
        slack = (t1 - t0) / max(1, self.view.width() or 800) * 2
        hit = np.flatnonzero((flat["start"] <= x + slack) & (flat["end"] >= x - slack))
        if not hit.size:
            return None
        return self.tree.nodes[int(flat["node"][hit[-1]])]

    def _on_click(self, x: float, y: float) -> None:
        node = self.node_at(x, y)
        self.mark(node)
        if node is not None:
            self.node_clicked.emit(node)

    def mark(self, node: FlameNode | None) -> None:
        if node is None:
            self.outline.hide()
            return
        self.outline.setRect(
            QRectF(node.start - self.origin, node.depth + 0.05, max(1, node.end - node.start), 0.9)
        )
        self.outline.show()
