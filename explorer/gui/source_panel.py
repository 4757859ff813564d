"""The source panel: a framework file with the time spent per line; selecting lines highlights
their instructions on the timeline (``source.SourceTimes.where``)."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QAbstractItemView, QComboBox, QLabel, QVBoxLayout, QWidget

from explorer.gui.qt_tables import make_table
from explorer.gui.source_times import SourceTimes, read_source
from explorer.gui.timeaxis import format_ns


def hottest_line(per_line: dict[int, Any]) -> int | None:
    """The line with the most self time (ties and no self time anywhere: the most inclusive time)."""
    if not per_line:
        return None
    return max(per_line, key=lambda n: (per_line[n].self_ns, per_line[n].inclusive_ns, -n))


class SourcePanel(QWidget):
    """``lines_selected(list[(file, line)])`` whenever the selection of lines changes."""

    lines_selected = Signal(object)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.times: SourceTimes | None = None
        self.path: str | None = None
        self.files = QComboBox()
        self.files.currentIndexChanged.connect(self._file_chosen)
        self.note = QLabel("Source lines appear once the profile's stack frames are read.")
        self.note.setWordWrap(True)
        self.table = make_table(["line", "self", "incl.", "instr.", "code"], multi=True)
        self.table.itemSelectionChanged.connect(self._selection_changed)
        layout = QVBoxLayout(self)
        layout.addWidget(self.files)
        layout.addWidget(self.note)
        layout.addWidget(self.table, 1)
        self._filling = False
        self.hottest_line: int | None = None
        self._scroll_pending = False

    def set_times(self, times: SourceTimes) -> None:
        self.times = times
        self.files.blockSignals(True)
        self.files.clear()
        for f in times.files:
            self.files.addItem(f"{f.path}  (self {format_ns(f.self_ns)})", f.path)
        self.files.blockSignals(False)
        if times.note:
            self.note.setText(times.note)
        else:
            self.note.setText(
                "Select lines to highlight their instructions (self = innermost frame; "
                "incl. = everything called from the line)."
            )
        if times.files:
            self._file_chosen(0)

    def show_file(self, path: str, line: int | None = None) -> None:
        index = self.files.findData(path)
        if index < 0:
            return
        if index != self.files.currentIndex():
            self.files.setCurrentIndex(index)
        if line is not None:
            self._scroll_pending = False
            for r in range(self.table.rowCount()):
                item = self.table.item(r, 0)
                if item is not None and item.text() == str(line):
                    self.table.selectRow(r)
                    self.table.scrollToItem(item)
                    break

    def _file_chosen(self, index: int) -> None:
        if self.times is None or index < 0:
            return
        path = self.files.itemData(index)
        self.path = path
        per_line = self.times.lines_of(path)
        text = read_source(path, self.times.access)
        numbers = range(1, len(text) + 1) if text is not None else sorted(per_line)
        hottest = max((t.inclusive_ns for t in per_line.values()), default=0) or 1
        self._filling = True
        self.table.setUpdatesEnabled(False)
        self.table.clearContents()
        self.table.setRowCount(len(numbers))
        from PySide6.QtWidgets import QTableWidgetItem

        for r, number in enumerate(numbers):
            t = per_line.get(number)
            code = text[number - 1] if text is not None else "(source file not available on this machine)"
            values = (
                str(number),
                format_ns(t.self_ns) if t and t.self_ns else "",
                format_ns(t.inclusive_ns) if t else "",
                f"{t.instructions:,}" if t else "",
                code,
            )
            for c, value in enumerate(values):
                item = QTableWidgetItem(value)
                if c < 4:
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                if t is not None:
                    heat = int(255 - 90 * min(1.0, t.inclusive_ns / hottest))
                    item.setBackground(QColor(255, heat, heat))
                self.table.setItem(r, c, item)
        self.table.setUpdatesEnabled(True)
        self.table.resizeColumnsToContents()
        self._filling = False
        self.hottest_line = hottest_line(per_line)
        self._scroll_pending = self.hottest_line is not None  # open where the time is, not at line 1
        if self.isVisible():
            self._scroll_to_hottest()

    def _scroll_to_hottest(self) -> None:
        self._scroll_pending = False
        for r in range(self.table.rowCount()):
            item = self.table.item(r, 0)
            if item is not None and item.text() == str(self.hottest_line):
                self.table.scrollToItem(item, QAbstractItemView.ScrollHint.PositionAtCenter)
                return

    def showEvent(self, event: Any) -> None:
        """A table scrolls only once it has a size: the first time the tab is shown."""
        super().showEvent(event)
        if self._scroll_pending:
            self._scroll_to_hottest()

    def selected_lines(self) -> list[tuple[str, int]]:
        if self.path is None:
            return []
        rows = sorted({i.row() for i in self.table.selectedIndexes()})
        out = []
        for r in rows:
            item = self.table.item(r, 0)
            if item is not None:
                out.append((self.path, int(item.text())))
        return out

    def _selection_changed(self) -> None:
        if not self._filling:
            self.lines_selected.emit(self.selected_lines())
