"""Small Qt helpers shared by the panels: read-only tables filled from plain rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableWidget, QTableWidgetItem, QWidget


def make_table(
    headers: Sequence[str], parent: QWidget | None = None, *, stretch_last: bool = True, multi: bool = False
) -> QTableWidget:
    """A read-only, row-selecting table with the given column headers."""
    table = QTableWidget(0, len(headers), parent)
    table.setHorizontalHeaderLabels(list(headers))
    table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    table.setSelectionMode(
        QAbstractItemView.SelectionMode.ExtendedSelection
        if multi
        else QAbstractItemView.SelectionMode.SingleSelection
    )
    table.verticalHeader().setVisible(False)
    table.verticalHeader().setDefaultSectionSize(20)
    table.setWordWrap(False)
    header = table.horizontalHeader()
    header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
    header.setStretchLastSection(stretch_last)
    return table


def fill_table(
    table: QTableWidget,
    rows: Sequence[Sequence[Any]],
    data: Sequence[Any] | None = None,
    right_align: Sequence[int] = (),
) -> None:
    """Replace the table's rows; ``data[i]`` is stored on row i's first cell (Qt.UserRole)."""
    table.setUpdatesEnabled(False)
    table.clearContents()
    table.setRowCount(len(rows))
    for r, values in enumerate(rows):
        for c, value in enumerate(values):
            item = QTableWidgetItem("" if value is None else str(value))
            if c in right_align:
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            if c == 0 and data is not None:
                item.setData(Qt.ItemDataRole.UserRole, data[r])
            table.setItem(r, c, item)
    table.setUpdatesEnabled(True)
    table.resizeColumnsToContents()


def row_data(table: QTableWidget, row: int) -> Any:
    item = table.item(row, 0)
    return None if item is None else item.data(Qt.ItemDataRole.UserRole)
