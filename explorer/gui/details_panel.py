"""The details panel: the clicked event's fields and its dependencies, each one a jump away."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QLabel, QPushButton, QSplitter, QVBoxLayout, QWidget

from explorer.gui.details import Dependency, Details
from explorer.gui.qt_tables import fill_table, make_table, row_data
from explorer.gui.timeaxis import format_ns


class DetailsPanel(QWidget):
    """Shows one ``Details``. ``jump(Dependency)`` when a dependency is activated, ``show_source(file,
    line)`` from the source button."""

    jump = Signal(object)
    show_source = Signal(str, int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.details: Details | None = None
        self.origin = 0
        self.title = QLabel("Click an instruction, a DMA transfer or a collective on the timeline.")
        self.title.setWordWrap(True)
        self.title.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.fields = make_table(["field", "value"])
        self.deps = make_table(["", "other end", "type", "when", "what"])
        self.deps.cellDoubleClicked.connect(lambda r, _c: self._activate(r))
        self.deps.cellActivated.connect(lambda r, _c: self._activate(r))
        self.source_button = QPushButton("Show source line")
        self.source_button.setEnabled(False)
        self.source_button.clicked.connect(self._source)
        deps_box = QWidget()
        deps_layout = QVBoxLayout(deps_box)
        deps_layout.setContentsMargins(0, 0, 0, 0)
        deps_layout.addWidget(QLabel("Dependencies (double-click to jump)"))
        deps_layout.addWidget(self.deps)
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.fields)
        split.addWidget(deps_box)
        split.setSizes([400, 160])
        layout = QVBoxLayout(self)
        layout.addWidget(self.title)
        layout.addWidget(split, 1)
        layout.addWidget(self.source_button)

    def show_details(self, details: Details | None, origin: int = 0) -> None:
        self.details = details
        self.origin = origin
        if details is None:
            self.title.setText("Nothing here: the click fell between events.")
            fill_table(self.fields, [])
            fill_table(self.deps, [])
            self.source_button.setEnabled(False)
            return
        self.title.setText(
            f"<b>{details.title}</b> &nbsp; id {details.id} &nbsp; "
            f"{format_ns(details.start_ts - origin)} + {format_ns(details.end_ts - details.start_ts)}"
        )
        fill_table(self.fields, details.fields)
        deps = details.dependencies
        fill_table(
            self.deps,
            [
                (
                    "←" if d.direction == "predecessor" else "→",
                    f"{d.table} {'' if d.id is None else d.id}",
                    d.kind,
                    "–" if d.start_ts is None else format_ns(d.start_ts - origin),
                    d.text,
                )
                for d in deps
            ],
            data=deps,
        )
        self.source_button.setEnabled(details.source is not None)

    def field(self, name: str) -> str | None:
        """A shown field's value (tests, clipboard)."""
        if self.details is None:
            return None
        for key, value in self.details.fields:
            if key == name:
                return value
        return None

    def _activate(self, row: int) -> None:
        dep = row_data(self.deps, row)
        if isinstance(dep, Dependency) and dep.start_ts is not None:
            self.jump.emit(dep)

    def _source(self) -> None:
        if self.details is not None and self.details.source is not None:
            self.show_source.emit(*self.details.source)
