"""The search panel: a field, a text (or regex), the matches listed; activating one jumps to it."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from explorer.gui.qt_tables import fill_table, make_table, row_data
from explorer.gui.search import FIELDS, SearchResult
from explorer.gui.timeaxis import format_ns


class SearchPanel(QWidget):
    """``requested(profile, field, text, regex)`` on Enter/Search; ``activated(profile, row dict)`` when
    a result is chosen; ``cleared()`` when the search is emptied."""

    requested = Signal(int, str, str, bool)
    activated = Signal(int, object)
    cleared = Signal()

    def __init__(self, profile_labels: Sequence[str], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.result: SearchResult | None = None
        self.profile = 0
        self.origin = 0
        self.text = QLineEdit()
        self.text.setPlaceholderText("opcode, HLO op, layer or operand text")
        self.text.returnPressed.connect(self.submit)
        self.field = QComboBox()
        for key, label in FIELDS.items():
            self.field.addItem(label, key)
        self.regex = QCheckBox("regex")
        self.profiles = QComboBox()
        for label in profile_labels:
            self.profiles.addItem(label)
        self.profiles.setVisible(len(profile_labels) > 1)
        go = QPushButton("Search")
        go.clicked.connect(self.submit)
        clear = QPushButton("Clear")
        clear.clicked.connect(self.clear)
        self.status = QLabel("")
        self.results = make_table(["start", "engine", "opcode", "HLO op", "layer", "operands"])
        self.results.cellActivated.connect(lambda r, _c: self._activate(r))
        self.results.cellDoubleClicked.connect(lambda r, _c: self._activate(r))
        self.results.cellClicked.connect(lambda r, _c: self._activate(r))
        top = QHBoxLayout()
        top.addWidget(self.field)
        top.addWidget(self.text, 1)
        top.addWidget(self.regex)
        second = QHBoxLayout()
        second.addWidget(self.profiles)
        second.addWidget(go)
        second.addWidget(clear)
        second.addStretch(1)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addLayout(second)
        layout.addWidget(self.status)
        layout.addWidget(self.results, 1)

    def submit(self) -> None:
        text = self.text.text().strip()
        if not text:
            self.clear()
            return
        self.profile = max(0, self.profiles.currentIndex())
        self.status.setText("searching…")
        self.requested.emit(self.profile, str(self.field.currentData()), text, self.regex.isChecked())

    def clear(self) -> None:
        self.text.clear()
        self.result = None
        fill_table(self.results, [])
        self.status.setText("")
        self.cleared.emit()

    def show_result(self, result: SearchResult, origin: int) -> None:
        self.result = result
        self.origin = origin
        shown = len(result.rows)
        more = f" (first {shown} listed)" if shown < result.total else ""
        self.status.setText(
            f"{result.total:,} instruction(s) match{more}; all are highlighted on the timeline"
        )
        fill_table(
            self.results,
            [
                (
                    format_ns(int(r["start_ts"]) - origin),
                    r.get("track") or r.get("engine"),
                    r.get("opcode"),
                    r.get("hlo_name"),
                    r.get("layer"),
                    r.get("operands"),
                )
                for r in result.rows
            ],
            data=result.rows,
        )

    def show_error(self, message: str) -> None:
        self.status.setText(message)

    def _activate(self, row: int) -> None:
        found = row_data(self.results, row)
        if found is not None:
            self.activated.emit(self.profile, found)
