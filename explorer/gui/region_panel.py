"""The selection panel: what a box-selected region contains (``region.region_summary``)."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QSplitter, QVBoxLayout, QWidget

from explorer.gui.qt_tables import fill_table, make_table
from explorer.gui.region import RegionSummary, as_text
from formats.read_api import fmt_count, fmt_ns, fmt_pct


class RegionPanel(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.summary: RegionSummary | None = None
        self.title = QLabel("Shift+drag (or right-drag) over the timeline to summarise a region.")
        self.title.setWordWrap(True)
        self.lines = make_table(["metric", "value"])
        self.opcodes = make_table(["opcode", "instructions", "time in region", "share"])
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.lines)
        split.addWidget(self.opcodes)
        layout = QVBoxLayout(self)
        layout.addWidget(self.title)
        layout.addWidget(split, 1)

    def computing(self, text: str) -> None:
        self.title.setText(text)

    def show_summary(self, summary: RegionSummary, label: str, origin: int) -> None:
        self.summary = summary
        self.title.setText(
            f"<b>Region</b> of {label}: {fmt_ns(summary.t0 - origin)} → {fmt_ns(summary.t1 - origin)}"
        )
        fill_table(self.lines, as_text(summary, origin))
        total = sum(o.time_ns for o in summary.opcodes) or 1
        fill_table(
            self.opcodes,
            [
                (o.opcode, fmt_count(o.count), fmt_ns(o.time_ns), fmt_pct(o.time_ns / total))
                for o in summary.opcodes
            ],
            right_align=(1, 2, 3),
        )
