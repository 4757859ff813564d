"""The hierarchy pane: a tree drawn as a table (indent + expander in the name column, one column per
figure), so the figures line up under one header and the columns can be sorted.

The widget keeps no tree of its own: the app owns the state (expanded keys, loaded instruction pages,
sort, filter, marks) and ``flatten`` turns that plus the current ``Hierarchy`` snapshot into rows; the
table is redrawn from them. Rows are a few hundred at most (layers, ops, and the pages of the ops a
person opened), so a redraw is cheap and there is no incremental bookkeeping to get wrong.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import DataTable

from explorer.viewer.hierarchy import ordered
from explorer.viewer.model import ENGINE_SHORT, Hierarchy, Node
from explorer.viewer.text import ellipsize, fmt_bytes, fmt_count, fmt_ns, fmt_pct

# widths include one leading space (the table has no cell padding, to leave the name room)
FIGURE_COLUMNS = (
    ("time", "Time", 10),
    ("share", "Share", 8),
    ("mfu", "MFU", 7),
    ("hbm", "HBM", 9),
    *((s, s, 5) for s in ENGINE_SHORT),
)
FIXED_WIDTH = sum(w for _, _, w in FIGURE_COLUMNS) + 2


@dataclass(frozen=True)
class Row:
    node: Node
    depth: int
    expanded: bool
    marked: bool


def flatten(
    hierarchy: Hierarchy,
    pages: Mapping[str, tuple[Node, ...]],
    expanded: set[str],
    *,
    sort: str,
    reverse: bool,
    visible: set[str] | None,
    marked: set[str],
) -> list[Row]:
    """Rows in display order. ``visible`` (a filter's matches and their ancestors) limits layers and
    ops and opens the ancestors; ``pages`` are the loaded instruction rows of opened ops."""
    rows: list[Row] = []

    def walk(keys: Iterable[str], depth: int) -> None:
        for key in ordered(hierarchy, list(keys), sort, reverse):
            if visible is not None and key not in visible:
                continue
            node = hierarchy.nodes[key]
            kids = hierarchy.children.get(key, ())
            opened = key in expanded or (visible is not None and any(k in visible for k in kids))
            rows.append(Row(node, depth, opened, key in marked))
            if not opened:
                continue
            if node.kind == "hlo":
                rows.extend(
                    Row(child, depth + 1, False, False)
                    for child in pages.get(key, (Node(f"X:{key}", "info", "loading…", key),))
                )
            else:
                walk(kids, depth + 1)

    walk(hierarchy.children.get("", ()), 0)
    return rows


def name_cell(row: Row, width: int) -> Text:
    node = row.node
    expander = ("▾ " if row.expanded else "▸ ") if node.expandable else "  "
    mark = "● " if row.marked else ""
    label = node.name + (f"  {node.detail}" if node.detail and node.kind == "instr" else "")
    text = ellipsize(" " + "  " * row.depth + expander + mark + label, width)
    style = {"layer": "bold", "hlo": "", "instr": "dim", "more": "italic cyan", "info": "italic yellow"}[
        node.kind
    ]
    return Text(text, style=f"{style} bold yellow" if row.marked else style)


def figure_cells(node: Node, total_ns: int | None, summed_ns: int | None = None) -> list[Text | str]:
    """The figure columns of one row. A summed time (Σ: instruction durations added up, when the
    profile has no hierarchy tables) is shown as a share of all instructions' summed time, since
    against the run's wall time it could pass 100 %."""
    s = node.stats
    if node.kind in ("more", "info"):
        return [""] * len(FIGURE_COLUMNS)
    time = fmt_ns(s.time_ns) + ("Σ" if s.summed and s.time_ns is not None else "")
    base = summed_ns if s.summed else total_ns
    share = fmt_pct(s.time_ns / base) if s.time_ns is not None and base else "-"
    cells: list[Text | str] = [
        Text(time, justify="right"),
        Text(share, justify="right"),
        Text(fmt_pct(s.mfu), justify="right"),
        Text(fmt_bytes(s.hbm_bytes), justify="right"),
    ]
    cells += [Text(fmt_count(c) if c else ("-" if c is None else "·"), justify="right") for c in s.counts]
    return cells


class HierarchyTable(DataTable):
    """The hierarchy as a row-cursor table; posts ``Toggle``/``Expand``/``Collapse`` for the app."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("right", "expand", "Expand", show=False),
        Binding("left", "collapse", "Collapse", show=False),
        Binding("space", "toggle", "Open/close", show=False),
    ]

    class Toggle(Message):
        def __init__(self, key: str, want: bool | None) -> None:
            super().__init__()
            self.key, self.want = key, want  # want: True open, False close, None toggle

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=False, cell_padding=0, **kwargs)  # type: ignore[arg-type]
        self.rows_shown: list[Row] = []
        self._name_width = 0
        self._shown_with: tuple[int | None, str, bool] | None = None

    def on_resize(self) -> None:
        """Redraw for the new width (the name column takes what the figure columns leave)."""
        if self._shown_with is not None and self.name_width() != self._name_width:
            row = self.current()
            self.show(
                self.rows_shown, *self._shown_with[:1], row.node.key if row else None, *self._shown_with[1:]
            )

    def name_width(self) -> int:
        width = self.size.width or 80
        return max(16, min(72, width - FIXED_WIDTH))

    def show(
        self, rows: list[Row], total_ns: int | None, cursor_key: str | None, sort: str, reverse: bool
    ) -> None:
        """Redraw with ``rows``; the cursor stays on ``cursor_key`` when it is still shown."""
        self._shown_with = (total_ns, sort, reverse)
        width = self.name_width()
        if width != self._name_width or not self.columns:
            self.clear(columns=True)
            self._name_width = width
            self.add_column("Name", width=width, key="name")
            for key, label, w in FIGURE_COLUMNS:
                self.add_column(label, width=w, key=key)
        else:
            self.clear()
        arrow = "↑" if reverse else "↓"
        for key, label, _ in FIGURE_COLUMNS:
            column = self.columns.get(key)  # type: ignore[call-overload]
            if column is not None:
                column.label = Text(
                    label + (arrow if key == {"time": "time", "mfu": "mfu", "hbm": "hbm"}.get(sort) else ""),
                    justify="right",
                )
        name_column = self.columns.get("name")  # type: ignore[call-overload]
        if name_column is not None:
            name_column.label = Text("Name" + (arrow if sort == "name" else f"  (sort: {sort})"))
        self.rows_shown = rows
        summed = sum(r.node.stats.time_ns or 0 for r in rows if r.depth == 0 and r.node.stats.summed) or None
        self.add_rows([[name_cell(r, width), *figure_cells(r.node, total_ns, summed)] for r in rows])
        # keys by position: a node may show twice only as loading rows, so index by row
        index = next((i for i, r in enumerate(rows) if r.node.key == cursor_key), None)
        if index is not None:
            self.move_cursor(row=index, animate=False)

    def current(self) -> Row | None:
        if not self.rows_shown or not (0 <= self.cursor_row < len(self.rows_shown)):
            return None
        return self.rows_shown[self.cursor_row]

    def action_expand(self) -> None:
        row = self.current()
        if row is not None:
            self.post_message(self.Toggle(row.node.key, True))

    def action_collapse(self) -> None:
        row = self.current()
        if row is not None:
            self.post_message(self.Toggle(row.node.key, False))

    def action_toggle(self) -> None:
        row = self.current()
        if row is not None:
            self.post_message(self.Toggle(row.node.key, None))
